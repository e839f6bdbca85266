//! Leases judged by the host's boot clock: a wall-clock step, or one process's clock set wrong,
//! ends no live call's lease and keeps no dead call's lease alive.

use super::*;

const START: i64 = 1_800_000_000_000;
const LEASE: Duration = Duration::from_secs(30);
const TEN_MINUTES: i64 = 10 * 60 * 1000;

fn on(clock: &ManualClock) -> SqliteOptions {
    SqliteOptions {
        clock: Arc::new(clock.clone()),
        ..SqliteOptions::default()
    }
}

fn leased(key: &Key) -> Reservation {
    Reservation::new(key.clone(), Fingerprint::of_bytes(b"args"), LEASE)
}

async fn take(store: &SqliteStore, key: &Key) -> Lease {
    match store.reserve(&leased(key)).await.unwrap() {
        Claim::Acquired(lease) => lease,
        Claim::Existing(rec) => panic!("expected to acquire {key}, found {rec:?}"),
    }
}

async fn state_of(store: &SqliteStore, key: &Key) -> State {
    store.get(key).await.unwrap().unwrap().state_name()
}

/// The keys listed in `state`, through the SQL filter.
async fn listed(store: &SqliteStore, state: State) -> Vec<String> {
    let filter = ListFilter {
        state: Some(state),
        ..ListFilter::default()
    };
    let records = store.list(&filter).await.unwrap();
    records.iter().map(|r| r.key.key.to_string()).collect()
}

/// What a duplicate meets: a reservation, then a takeover of the fence it saw; both must find
/// the call still in flight.
async fn duplicate_meets(store: &SqliteStore, key: &Key, fence: Fence) -> State {
    let seen = match store.reserve(&leased(key)).await.unwrap() {
        Claim::Existing(rec) => rec.state_name(),
        Claim::Acquired(lease) => panic!("a duplicate acquired {key}: {lease:?}"),
    };
    match store.takeover(&leased(key), fence).await.unwrap() {
        Claim::Existing(rec) => assert_eq!(rec.state_name(), seen),
        Claim::Acquired(lease) => panic!("a duplicate took {key} over: {lease:?}"),
    }
    seen
}

#[tokio::test]
async fn a_wall_clock_step_forward_ends_no_lease() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Timestamp::from_millis(START));
    let store = SqliteStore::open(dir.path().join("db"), on(&clock)).unwrap();
    let k = key("running");
    let lease = take(&store, &k).await;

    // An NTP step (or a VM resumed) moves the wall clock 10 minutes on; 1 s has passed.
    clock.step_wall(TEN_MINUTES);
    clock.advance(Duration::from_secs(1));
    assert_eq!(
        duplicate_meets(&store, &k, lease.fence).await,
        State::InFlight
    );
    assert_eq!(listed(&store, State::InFlight).await, ["running"]);
    assert!(listed(&store, State::Unknown).await.is_empty());
    // What is left of the lease is read on the wall clock as it now stands.
    let rec = store.get(&k).await.unwrap().unwrap();
    let RecordState::InFlight { lease_until } = rec.state else {
        panic!("{rec:?}")
    };
    assert_eq!(clock.now().until(lease_until), Duration::from_secs(29));

    // The holder heartbeats and completes as if nothing had happened.
    let until = store.heartbeat(&k, lease, LEASE).await.unwrap();
    assert_eq!(until, clock.now().plus(LEASE));
    store
        .complete(&k, lease, &Outcome::success(b"done".to_vec()), LEASE)
        .await
        .unwrap();
    assert_eq!(state_of(&store, &k).await, State::Completed);
}

#[tokio::test]
async fn a_wall_clock_step_back_keeps_no_dead_lease_alive() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Timestamp::from_millis(START));
    let store = SqliteStore::open(dir.path().join("db"), on(&clock)).unwrap();
    let k = key("crashed");
    let lease = take(&store, &k).await;

    clock.step_wall(-TEN_MINUTES);
    clock.advance(LEASE - Duration::from_millis(1));
    assert_eq!(
        duplicate_meets(&store, &k, lease.fence).await,
        State::InFlight
    );
    // Its holder died: the lease ends when 30 s have passed, not 10 minutes and 30 s later.
    clock.advance(Duration::from_millis(1));
    assert_eq!(state_of(&store, &k).await, State::Unknown);
    assert_eq!(listed(&store, State::Unknown).await, ["crashed"]);
    assert!(listed(&store, State::InFlight).await.is_empty());
    match store.takeover(&leased(&k), lease.fence).await.unwrap() {
        Claim::Acquired(next) => assert_eq!(next.fence, lease.fence + 1),
        Claim::Existing(rec) => panic!("the unknown record was not taken over: {rec:?}"),
    }
}

/// Two processes on one file, one of them with its clock 10 minutes ahead (or behind): they
/// share the host's boot clock, which judges both.
#[tokio::test]
async fn processes_whose_clocks_disagree_agree_on_every_lease() {
    for skew in [TEN_MINUTES, -TEN_MINUTES, 30_000, -30_000] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let right = ManualClock::new(Timestamp::from_millis(START));
        let wrong = ManualClock::new(Timestamp::from_millis(START + skew));
        let a = SqliteStore::open(&path, on(&right)).unwrap();
        let b = SqliteStore::open(&path, on(&wrong)).unwrap();
        let (by_a, by_b) = (key("by-right"), key("by-wrong"));
        let lease_a = take(&a, &by_a).await;
        let lease_b = take(&b, &by_b).await;
        for store in [&a, &b] {
            assert_eq!(
                duplicate_meets(store, &by_a, lease_a.fence).await,
                State::InFlight
            );
            assert_eq!(
                duplicate_meets(store, &by_b, lease_b.fence).await,
                State::InFlight
            );
        }
        for clock in [&right, &wrong] {
            clock.advance(LEASE);
        }
        for store in [&a, &b] {
            assert_eq!(state_of(store, &by_a).await, State::Unknown, "skew {skew}");
            assert_eq!(state_of(store, &by_b).await, State::Unknown, "skew {skew}");
        }
    }
}

/// After a reboot every process that held a lease is gone, and the boot clock started again:
/// a lease written on another boot (or by a version that wrote no boot clock) is judged by the
/// wall-clock time kept beside it.
#[tokio::test]
async fn a_lease_from_another_boot_or_an_older_version_is_judged_by_the_wall_clock() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let clock = ManualClock::new(Timestamp::from_millis(START));
    let store = SqliteStore::open(&path, on(&clock)).unwrap();
    let (rebooted, older) = (key("rebooted"), key("older"));
    take(&store, &rebooted).await;
    take(&store, &older).await;
    let conn = raw(&path);
    let (boot, steady): (Vec<u8>, i64) = conn
        .query_row(
            "SELECT lease_boot, lease_steady FROM idemgate_record WHERE key = 'rebooted'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!((boot, steady), (vec![0; 16], 30_000));
    conn.execute(
        "UPDATE idemgate_record SET lease_boot = NULL, lease_steady = NULL WHERE key = 'older'",
        [],
    )
    .unwrap();

    clock.reboot();
    assert_eq!(state_of(&store, &rebooted).await, State::InFlight);
    assert_eq!(state_of(&store, &older).await, State::InFlight);
    clock.step_wall(LEASE.as_millis() as i64);
    assert_eq!(state_of(&store, &rebooted).await, State::Unknown);
    assert_eq!(state_of(&store, &older).await, State::Unknown);
    assert_eq!(listed(&store, State::Unknown).await.len(), 2);
}

#[tokio::test]
async fn only_an_in_flight_row_keeps_a_boot_clock_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let store = SqliteStore::open(&path, manual()).unwrap();
    let k = key("done");
    let lease = take(&store, &k).await;
    store
        .complete(&k, lease, &Outcome::success(b"ok".to_vec()), LEASE)
        .await
        .unwrap();
    let kept: (Option<Vec<u8>>, Option<i64>) = raw(&path)
        .query_row(
            "SELECT lease_boot, lease_steady FROM idemgate_record WHERE key = 'done'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(kept, (None, None));
    // The schema refuses a deadline on a completed row, and half of one.
    let conn = raw(&path);
    for set in [
        "lease_boot = zeroblob(16), lease_steady = 1",
        "lease_steady = 1",
    ] {
        let refused = conn.execute(
            &format!("UPDATE idemgate_record SET {set} WHERE key = 'done'"),
            [],
        );
        assert!(refused.is_err(), "{set} was accepted");
    }
}

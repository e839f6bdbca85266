#![doc = include_str!("../README.md")]

pub mod model;
pub mod servers;
pub mod tmpfs;

#[doc(hidden)]
pub use proptest;

use std::sync::Arc;
use std::time::Duration;

use idemgate_core::{
    Claim, Clock, Fingerprint, IdempotencyKey, Keep, Key, Lease, ListFilter, ManualClock, Outcome,
    Record, RecordState, Reopened, Reservation, State, Store, StoreError, TenantId, Timestamp,
    ToolName,
};

/// A store under test and a way to move its clock.
#[derive(Debug)]
pub struct Fixture<S> {
    /// The store.
    pub store: S,
    /// How time passes for it.
    pub time: TimeTravel,
    /// How the store lists a record reserved under a key: as that key, unless the store keeps
    /// keys in another form (a sealed store lists their HMACs).
    pub listed_as: ListedAs,
}

/// How a store lists the key of a record ([`Fixture::listing_keys_as`]).
#[derive(Clone)]
pub struct ListedAs(Arc<dyn Fn(&Key) -> Key + Send + Sync>);

impl Default for ListedAs {
    fn default() -> Self {
        ListedAs(Arc::new(Key::clone))
    }
}

impl std::fmt::Debug for ListedAs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ListedAs(…)")
    }
}

/// How the suite makes time pass.
#[derive(Clone, Debug)]
pub enum TimeTravel {
    /// The store judges time by this clock; the suite moves it by hand.
    Manual(ManualClock),
    /// The store judges time by a server's clock; the suite sleeps (briefly: leases in the suite
    /// are a few hundred milliseconds).
    Real,
}

impl<S: Store> Fixture<S> {
    /// A store on a manual clock: `build` gets the clock to judge time by.
    pub fn manual(build: impl FnOnce(Arc<dyn Clock>) -> S) -> Self {
        let clock = ManualClock::new(Timestamp::from_millis(1_800_000_000_000));
        let store = build(Arc::new(clock.clone()));
        Fixture {
            store,
            time: TimeTravel::Manual(clock),
            listed_as: ListedAs::default(),
        }
    }

    /// A store that judges time by a server's clock.
    pub fn real(store: S) -> Self {
        Fixture {
            store,
            time: TimeTravel::Real,
            listed_as: ListedAs::default(),
        }
    }

    /// The same store under another wrapper (a sealed store over it), keeping the clock.
    pub fn map<T: Store>(self, wrap: impl FnOnce(S) -> T) -> Fixture<T> {
        Fixture {
            store: wrap(self.store),
            time: self.time,
            listed_as: self.listed_as,
        }
    }

    /// The same fixture, for a store that lists the record of `key` as `listed(key)`.
    pub fn listing_keys_as(mut self, listed: impl Fn(&Key) -> Key + Send + Sync + 'static) -> Self {
        self.listed_as = ListedAs(Arc::new(listed));
        self
    }

    /// How the store lists the record reserved under `key`.
    pub fn listed(&self, key: &Key) -> Key {
        (self.listed_as.0)(key)
    }

    /// Lets `d` pass for the store.
    pub async fn pass(&self, d: Duration) {
        match &self.time {
            TimeTravel::Manual(clock) => clock.advance(d),
            TimeTravel::Real => tokio::time::sleep(d).await,
        }
    }
}

/// The lease used by behaviours that let it run out.
pub const SHORT_LEASE: Duration = Duration::from_millis(300);
/// Longer than [`SHORT_LEASE`], with margin for server clocks and scheduling.
pub const PAST_SHORT_LEASE: Duration = Duration::from_millis(700);
/// A lease no behaviour outlives.
pub const LONG_LEASE: Duration = Duration::from_secs(600);
/// A TTL no behaviour outlives.
pub const LONG_TTL: Duration = Duration::from_secs(3600);

/// A key under a fresh random tenant, so behaviours never see each other's records.
pub fn fresh_key(tool: &str) -> Key {
    let tenant = IdempotencyKey::mint();
    Key::new(
        TenantId::new(&tenant.as_str()[4..20]).expect("valid tenant"),
        ToolName::new(tool).expect("valid tool"),
        IdempotencyKey::new("order-42").expect("valid key"),
    )
}

fn fp(s: &str) -> Fingerprint {
    Fingerprint::of_bytes(s.as_bytes())
}

fn reservation(key: &Key, args: &str, lease_for: Duration) -> Reservation {
    Reservation::new(key.clone(), fp(args), lease_for)
}

async fn acquire<S: Store>(s: &S, r: &Reservation) -> Lease {
    match s.reserve(r).await.expect("reserve") {
        Claim::Acquired(lease) => lease,
        Claim::Existing(rec) => panic!("expected to acquire {}, found {rec:?}", r.key),
    }
}

fn existing(claim: Result<Claim, StoreError>) -> Record {
    match claim.expect("store operation") {
        Claim::Existing(rec) => rec,
        Claim::Acquired(lease) => panic!("expected an existing record, acquired {lease:?}"),
    }
}

fn assert_lease_lost<T: std::fmt::Debug>(r: Result<T, StoreError>, what: &str) {
    match r {
        Err(StoreError::LeaseLost) => {}
        other => panic!("{what}: expected LeaseLost, got {other:?}"),
    }
}

/// 32 tasks race to reserve one key: exactly one acquires, and the others all see its record.
pub async fn race_32_way_one_acquires<S: Store + Clone>(fx: &Fixture<S>) {
    let key = fresh_key("race");
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let store = fx.store.clone();
        let r = reservation(&key, "same", LONG_LEASE);
        tasks.push(tokio::spawn(async move { store.reserve(&r).await }));
    }
    let mut acquired = Vec::new();
    let mut seen = 0;
    for t in tasks {
        match t.await.expect("task").expect("reserve") {
            Claim::Acquired(lease) => acquired.push(lease),
            Claim::Existing(rec) => {
                assert_eq!(rec.state_name(), State::InFlight);
                seen += 1;
            }
        }
    }
    assert_eq!(acquired.len(), 1, "exactly one reservation must win");
    assert_eq!(seen, 31);
    let rec = fx.store.get(&key).await.expect("get").expect("record");
    assert_eq!(rec.fence, acquired[0].fence);
}

/// A reservation retried with the same token (its first answer was lost) acquires its own record.
pub async fn reserve_retry_with_same_token_acquires<S: Store>(fx: &Fixture<S>) {
    let key = fresh_key("retry");
    let r = reservation(&key, "a", LONG_LEASE);
    let first = acquire(&fx.store, &r).await;
    let again = acquire(&fx.store, &r).await;
    assert_eq!(first, again);
    let other = reservation(&key, "a", LONG_LEASE);
    let rec = existing(fx.store.reserve(&other).await);
    assert_eq!(rec.state_name(), State::InFlight);
}

/// A completed record is returned with its outcome to every later reservation, until it expires.
pub async fn completed_record_replays<S: Store>(fx: &Fixture<S>) {
    let key = fresh_key("replay");
    let r = reservation(&key, "a", LONG_LEASE);
    let lease = acquire(&fx.store, &r).await;
    let done = fx
        .store
        .complete(&key, lease, &Outcome::success(b"paid".to_vec()), LONG_TTL)
        .await
        .expect("complete");
    assert!(done.expires_at > done.completed_at);
    for _ in 0..3 {
        let rec = existing(fx.store.reserve(&reservation(&key, "a", LONG_LEASE)).await);
        match rec.state {
            RecordState::Completed {
                outcome,
                completed_at,
                expires_at,
                ..
            } => {
                assert_eq!(outcome, Outcome::success(b"paid".to_vec()));
                assert_eq!(
                    (completed_at, expires_at),
                    (done.completed_at, done.expires_at)
                );
            }
            other => panic!("expected completed, found {other:?}"),
        }
    }
}

/// A failed outcome is stored and returned like a success, with its kind.
pub async fn failed_outcome_is_stored<S: Store>(fx: &Fixture<S>) {
    let key = fresh_key("failed");
    let lease = acquire(&fx.store, &reservation(&key, "a", LONG_LEASE)).await;
    let outcome = Outcome::failed(vec![0, 159, 255, 10]);
    fx.store
        .complete(&key, lease, &outcome, LONG_TTL)
        .await
        .expect("complete");
    let rec = fx.store.get(&key).await.expect("get").expect("record");
    assert!(matches!(rec.state, RecordState::Completed { outcome: o, .. } if o == outcome));
}

/// The record keeps the first call's fingerprint, so the engine can report a key reused with other
/// arguments.
pub async fn fingerprint_mismatch_is_visible<S: Store>(fx: &Fixture<S>) {
    let key = fresh_key("mismatch");
    let lease = acquire(&fx.store, &reservation(&key, "first", LONG_LEASE)).await;
    let rec = existing(
        fx.store
            .reserve(&reservation(&key, "second", LONG_LEASE))
            .await,
    );
    assert_eq!(rec.fingerprint, fp("first"));
    fx.store
        .complete(&key, lease, &Outcome::success(b"x".to_vec()), LONG_TTL)
        .await
        .expect("complete");
    let rec = existing(
        fx.store
            .reserve(&reservation(&key, "second", LONG_LEASE))
            .await,
    );
    assert_eq!(rec.fingerprint, fp("first"));
}

/// An expired lease reads as unknown, is never overwritten by a reservation, and can be taken over
/// (by the right fence and fingerprint only), which raises the fence.
pub async fn expired_lease_becomes_unknown_and_can_be_taken_over<S: Store>(fx: &Fixture<S>) {
    let key = fresh_key("expiry");
    let lease = acquire(&fx.store, &reservation(&key, "a", SHORT_LEASE)).await;
    fx.pass(PAST_SHORT_LEASE).await;
    let rec = fx.store.get(&key).await.expect("get").expect("record");
    assert_eq!(rec.state_name(), State::Unknown);
    assert_eq!(rec.fence, lease.fence);
    let rec = existing(fx.store.reserve(&reservation(&key, "a", LONG_LEASE)).await);
    assert_eq!(
        rec.state_name(),
        State::Unknown,
        "unknown is never overwritten"
    );
    // Wrong fence or other arguments: no takeover.
    let wrong = existing(
        fx.store
            .takeover(&reservation(&key, "a", LONG_LEASE), lease.fence + 5)
            .await,
    );
    assert_eq!(wrong.state_name(), State::Unknown);
    let other = existing(
        fx.store
            .takeover(&reservation(&key, "b", LONG_LEASE), lease.fence)
            .await,
    );
    assert_eq!(other.state_name(), State::Unknown);
    let r = reservation(&key, "a", LONG_LEASE);
    let new = match fx.store.takeover(&r, lease.fence).await.expect("takeover") {
        Claim::Acquired(l) => l,
        Claim::Existing(rec) => panic!("takeover refused: {rec:?}"),
    };
    assert!(new.fence > lease.fence, "takeover raises the fence");
    // A second taker with the old fence loses.
    let late = existing(
        fx.store
            .takeover(&reservation(&key, "a", LONG_LEASE), lease.fence)
            .await,
    );
    assert_eq!(late.state_name(), State::InFlight);
}

/// After a takeover, every write under the old lease fails with LeaseLost and changes nothing.
pub async fn stale_fence_is_rejected<S: Store>(fx: &Fixture<S>) {
    let key = fresh_key("zombie");
    let old = acquire(&fx.store, &reservation(&key, "a", SHORT_LEASE)).await;
    fx.pass(PAST_SHORT_LEASE).await;
    let new = match fx
        .store
        .takeover(&reservation(&key, "a", LONG_LEASE), old.fence)
        .await
        .expect("takeover")
    {
        Claim::Acquired(l) => l,
        Claim::Existing(rec) => panic!("takeover refused: {rec:?}"),
    };
    let zombie = Outcome::success(b"zombie".to_vec());
    assert_lease_lost(
        fx.store.complete(&key, old, &zombie, LONG_TTL).await,
        "complete",
    );
    assert_lease_lost(fx.store.release(&key, old).await, "release");
    assert_lease_lost(fx.store.mark_unknown(&key, old).await, "mark_unknown");
    assert_lease_lost(fx.store.heartbeat(&key, old, LONG_LEASE).await, "heartbeat");
    let rec = fx.store.get(&key).await.expect("get").expect("record");
    assert_eq!(rec.state_name(), State::InFlight);
    assert_eq!(rec.fence, new.fence);
    fx.store
        .complete(&key, new, &Outcome::success(b"real".to_vec()), LONG_TTL)
        .await
        .expect("the current holder completes");
}

/// A lease token from a removed record never completes a new record under the same key, even when
/// the new record's fence happens to be the same number.
pub async fn released_lease_cannot_complete_new_record<S: Store>(fx: &Fixture<S>) {
    let key = fresh_key("aba");
    let old = acquire(&fx.store, &reservation(&key, "a", LONG_LEASE)).await;
    fx.store.release(&key, old).await.expect("release");
    let new = acquire(&fx.store, &reservation(&key, "a", LONG_LEASE)).await;
    assert_lease_lost(
        fx.store
            .complete(&key, old, &Outcome::success(b"old".to_vec()), LONG_TTL)
            .await,
        "complete with a released lease",
    );
    fx.store
        .complete(&key, new, &Outcome::success(b"new".to_vec()), LONG_TTL)
        .await
        .expect("complete");
}

/// The current holder may still complete after its lease ran out, as long as nobody took over: the
/// late truth replaces "unknown".
pub async fn late_completion_by_current_holder_is_kept<S: Store>(fx: &Fixture<S>) {
    let key = fresh_key("late");
    let lease = acquire(&fx.store, &reservation(&key, "a", SHORT_LEASE)).await;
    fx.pass(PAST_SHORT_LEASE).await;
    fx.store
        .complete(&key, lease, &Outcome::success(b"late".to_vec()), LONG_TTL)
        .await
        .expect("complete");
    let rec = fx.store.get(&key).await.expect("get").expect("record");
    assert_eq!(rec.state_name(), State::Completed);
}

/// Completing twice with the same lease (a retry after a lost answer) returns the first completion
/// and keeps the first outcome.
pub async fn complete_is_idempotent_for_its_lease<S: Store>(fx: &Fixture<S>) {
    let key = fresh_key("complete-twice");
    let lease = acquire(&fx.store, &reservation(&key, "a", LONG_LEASE)).await;
    let first = fx
        .store
        .complete(&key, lease, &Outcome::success(b"one".to_vec()), LONG_TTL)
        .await
        .expect("complete");
    fx.pass(Duration::from_millis(20)).await;
    let second = fx
        .store
        .complete(&key, lease, &Outcome::success(b"two".to_vec()), LONG_TTL)
        .await
        .expect("complete again");
    assert_eq!(first, second);
    let rec = fx.store.get(&key).await.expect("get").expect("record");
    assert!(
        matches!(rec.state, RecordState::Completed { ref outcome, .. } if outcome.body == b"one")
    );
}

/// A completion stored later than its side effect ran (a journal flush) keeps the time it ran, never
/// one later than the store's now, and is kept for its whole TTL from when it is stored.
pub async fn late_completion_keeps_its_execution_time<S: Store>(fx: &Fixture<S>) {
    let now_key = fresh_key("complete-at-now");
    let lease = acquire(&fx.store, &reservation(&now_key, "a", LONG_LEASE)).await;
    let now = fx
        .store
        .complete(&now_key, lease, &Outcome::success(b"x".to_vec()), LONG_TTL)
        .await
        .expect("complete")
        .completed_at;

    let key = fresh_key("complete-at");
    let lease = acquire(&fx.store, &reservation(&key, "a", LONG_LEASE)).await;
    let ran = Timestamp::from_millis(now.as_millis() - 5_000);
    let done = fx
        .store
        .complete_at(
            &key,
            lease,
            &Outcome::success(b"y".to_vec()),
            Keep::replay(LONG_TTL),
            Some(ran),
        )
        .await
        .expect("complete at");
    assert_eq!(done.completed_at, ran);
    assert!(done.expires_at >= now.plus(LONG_TTL), "{done:?} from {now}");
    let rec = fx.store.get(&key).await.expect("get").expect("record");
    assert!(
        matches!(rec.state, RecordState::Completed { completed_at, .. } if completed_at == ran),
        "{rec:?}"
    );

    // A time from the future (a clock ahead of the store's) is never believed.
    let future = fresh_key("complete-at-future");
    let lease = acquire(&fx.store, &reservation(&future, "a", LONG_LEASE)).await;
    let ahead = now.plus(Duration::from_secs(3600));
    let done = fx
        .store
        .complete_at(
            &future,
            lease,
            &Outcome::success(b"z".to_vec()),
            Keep::replay(LONG_TTL),
            Some(ahead),
        )
        .await
        .expect("complete at");
    assert!(
        done.completed_at < ahead && done.completed_at >= now,
        "{done:?}"
    );
}

/// Releasing removes the record so the next call runs; releasing again succeeds.
pub async fn release_removes_the_record<S: Store>(fx: &Fixture<S>) {
    let key = fresh_key("release");
    let lease = acquire(&fx.store, &reservation(&key, "a", LONG_LEASE)).await;
    fx.store.release(&key, lease).await.expect("release");
    assert!(fx.store.get(&key).await.expect("get").is_none());
    fx.store.release(&key, lease).await.expect("release again");
    acquire(&fx.store, &reservation(&key, "a", LONG_LEASE)).await;
}

/// A completed record cannot be released by its holder.
pub async fn completed_record_cannot_be_released<S: Store>(fx: &Fixture<S>) {
    let key = fresh_key("release-done");
    let lease = acquire(&fx.store, &reservation(&key, "a", LONG_LEASE)).await;
    fx.store
        .complete(&key, lease, &Outcome::success(b"x".to_vec()), LONG_TTL)
        .await
        .expect("complete");
    assert_lease_lost(
        fx.store.release(&key, lease).await,
        "release after complete",
    );
    assert!(fx.store.get(&key).await.expect("get").is_some());
}

/// An ambiguous outcome marks the record unknown at once; reservations then see it, not overwrite it.
pub async fn mark_unknown_blocks_the_key<S: Store>(fx: &Fixture<S>) {
    let key = fresh_key("ambiguous");
    let lease = acquire(&fx.store, &reservation(&key, "a", LONG_LEASE)).await;
    fx.store
        .mark_unknown(&key, lease)
        .await
        .expect("mark unknown");
    fx.store.mark_unknown(&key, lease).await.expect("again");
    let rec = existing(fx.store.reserve(&reservation(&key, "a", LONG_LEASE)).await);
    assert_eq!(rec.state_name(), State::Unknown);
    assert_lease_lost(
        fx.store.heartbeat(&key, lease, LONG_LEASE).await,
        "heartbeat",
    );
}

/// A heartbeat keeps a long call's record in flight past its original lease.
pub async fn heartbeat_extends_the_lease<S: Store>(fx: &Fixture<S>) {
    let key = fresh_key("heartbeat");
    let lease = acquire(&fx.store, &reservation(&key, "a", SHORT_LEASE)).await;
    fx.store
        .heartbeat(&key, lease, LONG_LEASE)
        .await
        .expect("heartbeat");
    fx.pass(PAST_SHORT_LEASE).await;
    let rec = fx.store.get(&key).await.expect("get").expect("record");
    assert_eq!(rec.state_name(), State::InFlight);
}

/// A completed record past its TTL counts as absent: the key can be reserved again, with a fence
/// that never goes down.
pub async fn expired_record_counts_as_absent<S: Store>(fx: &Fixture<S>) {
    let key = fresh_key("ttl");
    let lease = acquire(&fx.store, &reservation(&key, "a", LONG_LEASE)).await;
    fx.store
        .complete(&key, lease, &Outcome::success(b"x".to_vec()), SHORT_LEASE)
        .await
        .expect("complete");
    fx.pass(PAST_SHORT_LEASE).await;
    assert!(fx.store.get(&key).await.expect("get").is_none());
    let again = acquire(&fx.store, &reservation(&key, "other args", LONG_LEASE)).await;
    assert!(again.fence >= lease.fence);
}

/// How long the tombstone behaviours keep one: past [`PAST_SHORT_LEASE`] with margin for
/// server clocks and scheduling, so that the dozen operations a behaviour makes on the tombstone
/// after [`PAST_SHORT_LEASE`] fit before it goes on a loaded machine.
pub const TOMBSTONE: Duration = Duration::from_secs(3);

/// A completed record past its ttl and within its tombstone is reported expired: it says when the
/// action ran and when its outcome expired, and gives no outcome. It counts: a reservation (with
/// the same arguments or others) meets it and acquires nothing; it is listed as expired; purging
/// keeps it; the old lease can no longer release or mark it. Past the tombstone it counts as
/// absent, and the next reservation takes a higher fence.
pub async fn tombstone_answers_after_the_ttl_until_it_goes<S: Store>(fx: &Fixture<S>) {
    let key = fresh_key("tombstone");
    let lease = acquire(&fx.store, &reservation(&key, "a", LONG_LEASE)).await;
    let keep = Keep {
        ttl: SHORT_LEASE,
        tombstone: TOMBSTONE,
    };
    let done = fx
        .store
        .complete_at(&key, lease, &Outcome::success(b"x".to_vec()), keep, None)
        .await
        .expect("complete");
    fx.pass(PAST_SHORT_LEASE).await;

    let expired_state = RecordState::Expired {
        completed_at: done.completed_at,
        expired_at: done.expires_at,
        retain_until: done.completed_at.plus(TOMBSTONE),
    };
    let rec = fx.store.get(&key).await.expect("get").expect("a tombstone");
    assert_eq!((&rec.state, rec.fence), (&expired_state, lease.fence));
    assert_eq!(
        existing(fx.store.reserve(&reservation(&key, "a", LONG_LEASE)).await).state,
        expired_state,
        "a retry meets the tombstone"
    );
    let other = existing(fx.store.reserve(&reservation(&key, "b", LONG_LEASE)).await);
    assert_eq!(
        (other.state_name(), other.fingerprint),
        (State::Expired, fp("a")),
        "other arguments meet it too, and see whose arguments it was"
    );
    assert_eq!(
        existing(
            fx.store
                .takeover(&reservation(&key, "a", LONG_LEASE), lease.fence)
                .await
        )
        .state_name(),
        State::Expired,
        "a tombstone is never taken over"
    );
    assert_lease_lost(fx.store.release(&key, lease).await, "release a tombstone");
    assert_lease_lost(
        fx.store.mark_unknown(&key, lease).await,
        "mark a tombstone unknown",
    );
    let again = fx
        .store
        .complete_at(&key, lease, &Outcome::success(b"y".to_vec()), keep, None)
        .await
        .expect("completing again under the same lease");
    assert_eq!(again, done, "completing again returns the first completion");

    let by_state = |state| ListFilter {
        tenant: Some(key.tenant.clone()),
        state,
        ..ListFilter::default()
    };
    let keys = |v: Vec<Record>| v.into_iter().map(|r| r.key).collect::<Vec<_>>();
    assert_eq!(
        keys(fx.store.list(&by_state(None)).await.expect("list")),
        vec![fx.listed(&key)]
    );
    assert_eq!(
        keys(
            fx.store
                .list(&by_state(Some(State::Expired)))
                .await
                .expect("list")
        ),
        vec![fx.listed(&key)]
    );
    assert!(fx
        .store
        .list(&by_state(Some(State::Completed)))
        .await
        .expect("list")
        .is_empty());

    fx.store.purge_expired().await.expect("purge");
    assert_eq!(
        fx.store.get(&key).await.expect("get").map(|r| r.state),
        Some(expired_state),
        "purging keeps a tombstone (and may drop its outcome)"
    );

    fx.pass(TOMBSTONE).await;
    assert!(fx.store.get(&key).await.expect("get").is_none());
    assert!(fx
        .store
        .list(&by_state(None))
        .await
        .expect("list")
        .is_empty());
    // Not `>`: on a store the suite shares with behaviours running at once, another one's purge
    // may delete the record once its tombstone is past, and a deleted record's fence starts over.
    let next = acquire(&fx.store, &reservation(&key, "b", LONG_LEASE)).await;
    assert!(next.fence >= lease.fence, "{next:?} after {lease:?}");
}

/// Reopening a tombstone at its fence clears it: the key counts as absent at once and the next
/// reservation acquires it at a higher fence; a wrong fence changes nothing.
pub async fn reopen_clears_a_tombstone<S: Store>(fx: &Fixture<S>) {
    let key = fresh_key("tombstone-reopen");
    let lease = acquire(&fx.store, &reservation(&key, "a", LONG_LEASE)).await;
    let keep = Keep {
        ttl: SHORT_LEASE,
        tombstone: LONG_TTL,
    };
    fx.store
        .complete_at(&key, lease, &Outcome::success(b"x".to_vec()), keep, None)
        .await
        .expect("complete");
    fx.pass(PAST_SHORT_LEASE).await;
    let wrong = kept(fx.store.reopen(&key, lease.fence + 1).await).expect("record");
    assert_eq!(wrong.state_name(), State::Expired);
    assert_eq!(
        fx.store.reopen(&key, lease.fence).await.expect("reopen"),
        Reopened::Expired
    );
    assert!(fx.store.get(&key).await.expect("get").is_none());
    assert_eq!(kept(fx.store.reopen(&key, lease.fence).await), None);
    let next = acquire(&fx.store, &reservation(&key, "a", LONG_LEASE)).await;
    assert!(next.fence > lease.fence, "{next:?} after {lease:?}");
}

/// Purging removes expired completed records only; unknown and live records stay.
pub async fn purge_removes_only_expired<S: Store>(fx: &Fixture<S>) {
    let expired = fresh_key("purge");
    let live = Key::new(
        expired.tenant.clone(),
        expired.tool.clone(),
        IdempotencyKey::new("live").unwrap(),
    );
    let unknown = Key::new(
        expired.tenant.clone(),
        expired.tool.clone(),
        IdempotencyKey::new("unknown").unwrap(),
    );
    let l = acquire(&fx.store, &reservation(&expired, "a", LONG_LEASE)).await;
    fx.store
        .complete(&expired, l, &Outcome::success(b"x".to_vec()), SHORT_LEASE)
        .await
        .expect("complete");
    let l = acquire(&fx.store, &reservation(&live, "a", LONG_LEASE)).await;
    fx.store
        .complete(&live, l, &Outcome::success(b"x".to_vec()), LONG_TTL)
        .await
        .expect("complete");
    let l = acquire(&fx.store, &reservation(&unknown, "a", LONG_LEASE)).await;
    fx.store.mark_unknown(&unknown, l).await.expect("unknown");
    fx.pass(PAST_SHORT_LEASE).await;
    let purged = fx.store.purge_expired().await.expect("purge");
    assert!(purged >= 1, "the expired record is purged");
    assert!(fx.store.get(&live).await.expect("get").is_some());
    assert!(fx.store.get(&unknown).await.expect("get").is_some());
    let filter = ListFilter {
        tenant: Some(expired.tenant.clone()),
        ..ListFilter::default()
    };
    assert_eq!(fx.store.list(&filter).await.expect("list").len(), 2);
}

/// Listing filters by tenant, tool and state, expired leases counting as unknown.
pub async fn list_filters_by_tenant_tool_and_state<S: Store>(fx: &Fixture<S>) {
    let a = fresh_key("tool-a");
    let b = Key::new(
        a.tenant.clone(),
        ToolName::new("tool-b").unwrap(),
        a.key.clone(),
    );
    let c = Key::new(
        a.tenant.clone(),
        a.tool.clone(),
        IdempotencyKey::new("c").unwrap(),
    );
    let l = acquire(&fx.store, &reservation(&a, "x", LONG_LEASE)).await;
    fx.store
        .complete(&a, l, &Outcome::success(b"x".to_vec()), LONG_TTL)
        .await
        .expect("complete");
    acquire(&fx.store, &reservation(&b, "x", LONG_LEASE)).await;
    acquire(&fx.store, &reservation(&c, "x", SHORT_LEASE)).await;
    fx.pass(PAST_SHORT_LEASE).await;
    let by = |tool: Option<&str>, state: Option<State>| ListFilter {
        tenant: Some(a.tenant.clone()),
        tool: tool.map(|t| ToolName::new(t).unwrap()),
        state,
        ..ListFilter::default()
    };
    let keys = |v: Vec<Record>| v.into_iter().map(|r| r.key).collect::<Vec<_>>();
    assert_eq!(fx.store.list(&by(None, None)).await.unwrap().len(), 3);
    assert_eq!(
        keys(fx.store.list(&by(Some("tool-a"), None)).await.unwrap()).len(),
        2
    );
    assert_eq!(
        keys(
            fx.store
                .list(&by(None, Some(State::Unknown)))
                .await
                .unwrap()
        ),
        vec![fx.listed(&c)]
    );
    assert_eq!(
        keys(
            fx.store
                .list(&by(None, Some(State::InFlight)))
                .await
                .unwrap()
        ),
        vec![fx.listed(&b)]
    );
    assert_eq!(
        keys(
            fx.store
                .list(&by(None, Some(State::Completed)))
                .await
                .unwrap()
        ),
        vec![fx.listed(&a)]
    );
    let limited = ListFilter {
        limit: 1,
        ..by(None, None)
    };
    assert_eq!(fx.store.list(&limited).await.unwrap().len(), 1);
}

/// What a reopening answered, when it left the record as it was.
fn kept(r: Result<Reopened, StoreError>) -> Option<Record> {
    match r.expect("reopen") {
        Reopened::Kept(rec) => rec,
        Reopened::Expired => panic!("expected the record to be kept"),
    }
}

/// Reopening a completed record at its fence makes it count as absent at once: the next
/// reservation acquires it at a higher fence (the record expired, as after its TTL), a holder of
/// the old lease cannot complete the new record, and a reopening retried at the old fence leaves
/// the new record alone. A wrong fence changes nothing.
pub async fn reopen_expires_a_completed_record_at_its_fence<S: Store>(fx: &Fixture<S>) {
    let key = fresh_key("reopen");
    let old = acquire(&fx.store, &reservation(&key, "a", LONG_LEASE)).await;
    fx.store
        .complete(&key, old, &Outcome::success(b"first".to_vec()), LONG_TTL)
        .await
        .expect("complete");
    let wrong = kept(fx.store.reopen(&key, old.fence + 1).await).expect("record");
    assert_eq!(
        (wrong.state_name(), wrong.fence),
        (State::Completed, old.fence)
    );
    assert_eq!(
        fx.store.get(&key).await.expect("get").map(|r| r.fence),
        Some(old.fence),
        "a wrong fence changes nothing"
    );

    assert_eq!(
        fx.store.reopen(&key, old.fence).await.expect("reopen"),
        Reopened::Expired
    );
    assert!(fx.store.get(&key).await.expect("get").is_none());
    let filter = ListFilter {
        tenant: Some(key.tenant.clone()),
        ..ListFilter::default()
    };
    assert!(fx.store.list(&filter).await.expect("list").is_empty());
    assert_eq!(
        kept(fx.store.reopen(&key, old.fence).await),
        None,
        "reopened already: nothing counts"
    );

    let new = acquire(&fx.store, &reservation(&key, "b", LONG_LEASE)).await;
    assert!(
        new.fence > old.fence,
        "the next reservation continues the fence, as after an expiry: {new:?} after {old:?}"
    );
    let in_flight = kept(fx.store.reopen(&key, old.fence).await).expect("record");
    assert_eq!(
        (in_flight.state_name(), in_flight.fence),
        (State::InFlight, new.fence)
    );
    assert_lease_lost(
        fx.store
            .complete(&key, old, &Outcome::success(b"zombie".to_vec()), LONG_TTL)
            .await,
        "a late completion under the reopened record's lease",
    );
    fx.store
        .complete(&key, new, &Outcome::success(b"second".to_vec()), LONG_TTL)
        .await
        .expect("the new holder completes");
    let retried = kept(fx.store.reopen(&key, old.fence).await).expect("record");
    assert_eq!(
        (retried.state_name(), retried.fence),
        (State::Completed, new.fence),
        "a reopening retried at the old fence never meets the new record"
    );
    let rec = existing(fx.store.reserve(&reservation(&key, "b", LONG_LEASE)).await);
    assert!(
        matches!(rec.state, RecordState::Completed { ref outcome, .. } if outcome.body == b"second")
    );
}

/// Only completed records are reopened by the store: a record in flight (its call may be running
/// the action) or unknown (the engine takes it over first), an expired or an absent one is left
/// as it is, and returned as it stands.
pub async fn reopen_leaves_other_records_alone<S: Store>(fx: &Fixture<S>) {
    let key = fresh_key("reopen-other");
    assert_eq!(kept(fx.store.reopen(&key, 1).await), None, "absent");
    let lease = acquire(&fx.store, &reservation(&key, "a", LONG_LEASE)).await;
    let rec = kept(fx.store.reopen(&key, lease.fence).await).expect("record");
    assert_eq!(rec.state_name(), State::InFlight);
    fx.store
        .heartbeat(&key, lease, LONG_LEASE)
        .await
        .expect("the holder keeps its lease");
    fx.store
        .mark_unknown(&key, lease)
        .await
        .expect("mark unknown");
    let rec = kept(fx.store.reopen(&key, lease.fence).await).expect("record");
    assert_eq!(rec.state_name(), State::Unknown);

    let expired = Key::new(
        key.tenant.clone(),
        key.tool.clone(),
        IdempotencyKey::new("expired").unwrap(),
    );
    let lease = acquire(&fx.store, &reservation(&expired, "a", LONG_LEASE)).await;
    fx.store
        .complete(
            &expired,
            lease,
            &Outcome::success(b"x".to_vec()),
            SHORT_LEASE,
        )
        .await
        .expect("complete");
    fx.pass(PAST_SHORT_LEASE).await;
    assert_eq!(kept(fx.store.reopen(&expired, lease.fence).await), None);
}

/// A record keeps the scope of the reservation that made it, through completion and takeover (a
/// takeover is the same action, run again), and listing filters by it.
pub async fn records_keep_their_scope_and_list_by_it<S: Store>(fx: &Fixture<S>) {
    let a = fresh_key("scoped");
    let name = |k: &str| {
        Key::new(
            a.tenant.clone(),
            a.tool.clone(),
            IdempotencyKey::new(k).unwrap(),
        )
    };
    let (b, none) = (name("b"), name("none"));
    let scoped = |key: &Key, scope: &str, lease_for| {
        reservation(key, "x", lease_for).with_scope(Some(scope.into()))
    };
    let la = acquire(&fx.store, &scoped(&a, "conversation:1", SHORT_LEASE)).await;
    let lb = acquire(&fx.store, &scoped(&b, "conversation:2", LONG_LEASE)).await;
    acquire(&fx.store, &reservation(&none, "x", LONG_LEASE)).await;
    let scope_of = |rec: Option<Record>| rec.expect("record").scope.map(|s| s.to_string());
    assert_eq!(
        scope_of(fx.store.get(&a).await.expect("get")),
        Some("conversation:1".to_owned())
    );
    assert_eq!(scope_of(fx.store.get(&none).await.expect("get")), None);
    fx.store
        .complete(&b, lb, &Outcome::success(b"x".to_vec()), LONG_TTL)
        .await
        .expect("complete");
    assert_eq!(
        scope_of(fx.store.get(&b).await.expect("get")),
        Some("conversation:2".to_owned())
    );
    // Taken over from another conversation: still the first one's record.
    fx.pass(PAST_SHORT_LEASE).await;
    match fx
        .store
        .takeover(&scoped(&a, "conversation:9", LONG_LEASE), la.fence)
        .await
        .expect("takeover")
    {
        Claim::Acquired(_) => {}
        Claim::Existing(rec) => panic!("takeover refused: {rec:?}"),
    }
    assert_eq!(
        scope_of(fx.store.get(&a).await.expect("get")),
        Some("conversation:1".to_owned())
    );
    let listed = |scope: &str| {
        let filter = ListFilter {
            tenant: Some(a.tenant.clone()),
            scope: Some(scope.into()),
            ..ListFilter::default()
        };
        async move {
            fx.store
                .list(&filter)
                .await
                .expect("list")
                .into_iter()
                .map(|r| r.key)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(listed("conversation:1").await, vec![fx.listed(&a)]);
    assert_eq!(listed("conversation:2").await, vec![fx.listed(&b)]);
    assert!(listed("conversation:9").await.is_empty());
    let completed_in_2 = ListFilter {
        tenant: Some(a.tenant.clone()),
        state: Some(State::Completed),
        scope: Some("conversation:2".into()),
        ..ListFilter::default()
    };
    assert_eq!(fx.store.list(&completed_in_2).await.expect("list").len(), 1);
}

/// The same key and arguments under two tenants are two records: neither sees the other's outcome.
pub async fn tenants_are_isolated<S: Store>(fx: &Fixture<S>) {
    let a = fresh_key("shared-tool");
    let b = Key::new(
        TenantId::new(format!("{}x", a.tenant)).unwrap(),
        a.tool.clone(),
        a.key.clone(),
    );
    let la = acquire(&fx.store, &reservation(&a, "same", LONG_LEASE)).await;
    fx.store
        .complete(
            &a,
            la,
            &Outcome::success(b"tenant a's secret".to_vec()),
            LONG_TTL,
        )
        .await
        .expect("complete");
    let lb = acquire(&fx.store, &reservation(&b, "same", LONG_LEASE)).await;
    assert!(matches!(
        fx.store.get(&b).await.unwrap().unwrap().state,
        RecordState::InFlight { .. }
    ));
    fx.store.release(&b, lb).await.expect("release");
    assert!(fx.store.get(&a).await.unwrap().is_some());
}

/// Reservation futures dropped at every point of their life leave the store consistent: the key is
/// either free or held by exactly one reservation, and a completion by a surviving holder works.
pub async fn dropped_reservations_leave_consistent_state<S: Store + Clone>(fx: &Fixture<S>) {
    let key = fresh_key("cancel");
    for round in 0..16u64 {
        let mut tasks = Vec::new();
        for i in 0..8u64 {
            let store = fx.store.clone();
            let r = reservation(&key, "a", LONG_LEASE);
            // Cancel most reservations after a few microseconds, at whatever point they reached.
            let budget = Duration::from_micros((round * 8 + i) % 5 * 50);
            tasks.push(tokio::spawn(async move {
                let res = tokio::time::timeout(budget, store.reserve(&r)).await;
                (r, res)
            }));
        }
        let mut holders = Vec::new();
        for t in tasks {
            let (r, res) = t.await.expect("task");
            match res {
                Ok(Ok(Claim::Acquired(lease))) => holders.push(lease),
                // Cancelled: if it did land, a retry with its token finds it.
                Err(_) => {
                    if let Ok(Claim::Acquired(lease)) = fx.store.reserve(&r).await {
                        holders.push(lease);
                    }
                }
                Ok(Ok(Claim::Existing(_))) | Ok(Err(_)) => {}
            }
        }
        assert!(holders.len() <= 1, "round {round}: two holders {holders:?}");
        match fx.store.get(&key).await.expect("get") {
            None => assert!(holders.is_empty()),
            Some(rec) => {
                assert_eq!(rec.state_name(), State::InFlight);
                let lease = holders.first().copied().unwrap_or_else(|| {
                    panic!("round {round}: a record stands that no reservation holds")
                });
                fx.store.release(&key, lease).await.expect("release");
            }
        }
    }
}

/// Stamps out every behaviour as a named `#[tokio::test]` for one store.
///
/// `$setup` is an expression evaluating to a future of a [`Fixture`] (whose store is `Clone`):
///
/// ```ignore
/// idemgate_conformance::store_conformance!(async {
///     idemgate_conformance::Fixture::manual(|clock| idemgate_core::MemoryStore::with_clock(clock))
/// });
/// ```
#[macro_export]
macro_rules! store_conformance {
    ($setup:expr) => {
        $crate::store_conformance!(@each $setup;
            race_32_way_one_acquires,
            reserve_retry_with_same_token_acquires,
            completed_record_replays,
            failed_outcome_is_stored,
            fingerprint_mismatch_is_visible,
            expired_lease_becomes_unknown_and_can_be_taken_over,
            stale_fence_is_rejected,
            released_lease_cannot_complete_new_record,
            late_completion_by_current_holder_is_kept,
            complete_is_idempotent_for_its_lease,
            late_completion_keeps_its_execution_time,
            release_removes_the_record,
            completed_record_cannot_be_released,
            mark_unknown_blocks_the_key,
            heartbeat_extends_the_lease,
            expired_record_counts_as_absent,
            purge_removes_only_expired,
            list_filters_by_tenant_tool_and_state,
            tenants_are_isolated,
            dropped_reservations_leave_consistent_state,
            reopen_expires_a_completed_record_at_its_fence,
            reopen_leaves_other_records_alone,
            records_keep_their_scope_and_list_by_it,
            tombstone_answers_after_the_ttl_until_it_goes,
            reopen_clears_a_tombstone,
        );
    };
    (@each $setup:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                let fx = $setup.await;
                $crate::$name(&fx).await;
            }
        )*
    };
}

//! Migrations, durability, notifications, the reaper, error mapping, and the edges of the state
//! machine that the conformance suite does not reach.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use idemgate_core::engine::Settings;
use idemgate_core::key::hex;
use idemgate_core::{
    Call, Claim, Decision, Effect, Engine, Fingerprint, Keep, ListFilter, Outcome, Policies,
    RecordState, Reopened, Reservation, State, Store, StoreError, Timestamp, ToolPolicy,
};
use idemgate_postgres::{PgOptions, PgStore, SyncCommit, SCHEMA_VERSION};

use crate::support::{self, connect, fresh_key, fresh_schema};

fn fp(s: &str) -> Fingerprint {
    Fingerprint::of_bytes(s.as_bytes())
}

async fn acquire(store: &PgStore, r: &Reservation) -> idemgate_core::Lease {
    match store.reserve(r).await.expect("reserve") {
        Claim::Acquired(l) => l,
        Claim::Existing(rec) => panic!("expected to acquire, found {rec:?}"),
    }
}

/// A schema of the test's own on the shared server, and options that name it.
fn private_schema() -> (String, PgOptions) {
    let schema = fresh_schema("idemgate_mig");
    let opts = PgOptions {
        schema: schema.clone(),
        pool_size: 2,
        ..PgOptions::default()
    };
    (schema, opts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_rerun_idempotently_and_concurrently() {
    let (schema, opts) = private_schema();
    let url = support::url();
    // Four gateways starting at once migrate once, under the advisory lock.
    let stores = join_all((0..4).map(|_| PgStore::connect_with(&url, opts.clone()))).await;
    for s in &stores {
        assert!(s.is_ok(), "{s:?}");
    }
    drop(stores);
    let again = support::connect_with(&url, opts).await;
    let key = fresh_key("mig", "k");
    acquire(
        &again,
        &Reservation::new(key, fp("a"), Duration::from_secs(60)),
    )
    .await;
    let client = support::raw_client(&url).await;
    let rows = client
        .query(
            &format!("SELECT version FROM \"{schema}\".idemgate_schema_version ORDER BY version"),
            &[],
        )
        .await
        .unwrap();
    let versions: Vec<i32> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(versions, (1..=SCHEMA_VERSION).collect::<Vec<_>>());
    support::drop_schema(&schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn newer_schema_is_refused() {
    let (schema, opts) = private_schema();
    let url = support::url();
    drop(support::connect_with(&url, opts.clone()).await);
    let client = support::raw_client(&url).await;
    client
        .execute(
            &format!(
                "INSERT INTO \"{schema}\".idemgate_schema_version (version, name) VALUES ($1, 'future')"
            ),
            &[&(SCHEMA_VERSION + 1)],
        )
        .await
        .unwrap();
    let res = PgStore::connect_with(&url, opts).await;
    support::drop_schema(&schema).await;
    match res {
        Err(StoreError::Misconfigured(msg)) => assert!(msg.contains("newer"), "{msg}"),
        other => panic!("expected Misconfigured, got {other:?}"),
    }
}

/// A schema at version 4 (before records kept their scope) opens upgraded: its records read
/// without a scope, and new ones keep theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_4_schema_opens_upgraded_with_its_records() {
    let (schema, opts) = private_schema();
    let url = support::url();
    drop(support::connect_with(&url, opts.clone()).await);
    // Back to version 4's table, with a record in it.
    let client = support::raw_client(&url).await;
    client
        .batch_execute(&format!(
            "DROP INDEX \"{schema}\".idemgate_records_unsettled, \"{schema}\".idemgate_records_purge_due;
             ALTER TABLE \"{schema}\".idemgate_records DROP COLUMN scope, DROP COLUMN retain_until, DROP COLUMN history;
             DELETE FROM \"{schema}\".idemgate_schema_version WHERE version > 4;
             INSERT INTO \"{schema}\".idemgate_records
                 (tenant, tool, key, fingerprint, fence, token, created_at, state, completed_at,
                  expires_at, outcome_kind, outcome_body)
             VALUES ('acme', 'send', 'old', decode(repeat('00', 32), 'hex'), 3,
                     decode(repeat('00', 16), 'hex'), 1000, 1, 2000, 9000000000000000, 0, 'ok');"
        ))
        .await
        .unwrap();

    let store = support::connect_with(&url, opts).await;
    let old = idemgate_core::Key::new(
        idemgate_core::TenantId::new("acme").unwrap(),
        idemgate_core::ToolName::new("send").unwrap(),
        idemgate_core::IdempotencyKey::new("old").unwrap(),
    );
    let rec = store.get(&old).await.unwrap().expect("the old record");
    assert_eq!((rec.fence, rec.scope), (3, None));
    let new = fresh_key("mig", "new");
    let r = Reservation::new(new.clone(), fp("a"), Duration::from_secs(60))
        .with_scope(Some("conversation:7".into()));
    acquire(&store, &r).await;
    let rec = store.get(&new).await.unwrap().unwrap();
    assert_eq!(rec.scope.as_deref(), Some("conversation:7"));
    let versions: Vec<i32> = client
        .query(
            &format!("SELECT version FROM \"{schema}\".idemgate_schema_version ORDER BY version"),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    drop(store);
    support::drop_schema(&schema).await;
    assert_eq!(versions, (1..=SCHEMA_VERSION).collect::<Vec<_>>());
}

/// A schema at version 5 (before tombstones) opens upgraded: its completed rows, without a
/// `retain_until`, keep no tombstone (replayed until their expiry, absent after), and new
/// completions keep theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_5_schema_opens_upgraded_with_its_records() {
    let (schema, opts) = private_schema();
    let url = support::url();
    drop(support::connect_with(&url, opts.clone()).await);
    // Back to version 5's table, with a live and an expired completed record in it.
    let client = support::raw_client(&url).await;
    client
        .batch_execute(&format!(
            "DROP INDEX \"{schema}\".idemgate_records_unsettled, \"{schema}\".idemgate_records_purge_due;
             ALTER TABLE \"{schema}\".idemgate_records DROP COLUMN retain_until, DROP COLUMN history;
             DELETE FROM \"{schema}\".idemgate_schema_version WHERE version > 5;
             INSERT INTO \"{schema}\".idemgate_records
                 (tenant, tool, key, fingerprint, fence, token, created_at, state, completed_at,
                  expires_at, outcome_kind, outcome_body)
             VALUES ('acme', 'send', 'live', decode(repeat('00', 32), 'hex'), 3,
                     decode(repeat('00', 16), 'hex'), 1000, 1, 2000, 9000000000000000, 0, 'ok'),
                    ('acme', 'send', 'gone', decode(repeat('00', 32), 'hex'), 4,
                     decode(repeat('00', 16), 'hex'), 1000, 1, 2000, 3000, 0, 'ok');"
        ))
        .await
        .unwrap();

    let store = support::connect_with(&url, opts).await;
    let name = |key: &str| {
        idemgate_core::Key::new(
            idemgate_core::TenantId::new("acme").unwrap(),
            idemgate_core::ToolName::new("send").unwrap(),
            idemgate_core::IdempotencyKey::new(key).unwrap(),
        )
    };
    let live = store
        .get(&name("live"))
        .await
        .unwrap()
        .expect("the live record");
    let expires = Timestamp::from_millis(9_000_000_000_000_000);
    assert_eq!(
        live.state,
        RecordState::Completed {
            outcome: Outcome::success(b"ok".to_vec()),
            completed_at: Timestamp::from_millis(2_000),
            expires_at: expires,
            retain_until: expires,
        }
    );
    // The expired one counts as absent: not listed, reserved again at the next fence.
    assert!(store.get(&name("gone")).await.unwrap().is_none());
    let listed = store.list(&ListFilter::default()).await.unwrap();
    assert_eq!(
        listed
            .iter()
            .map(|r| r.key.key.as_str())
            .collect::<Vec<_>>(),
        ["live"]
    );
    let r = Reservation::new(name("gone"), fp("a"), Duration::from_secs(60));
    assert_eq!(acquire(&store, &r).await.fence, 5);
    // A reopening of an old row expires it for good.
    assert_eq!(
        store.reopen(&name("live"), 3).await.unwrap(),
        Reopened::Expired
    );
    assert!(store.get(&name("live")).await.unwrap().is_none());
    drop(store);
    support::drop_schema(&schema).await;
}

/// The `retain_until` of `key`'s row as stored, and whether its outcome body is empty.
async fn stored_retain(
    client: &tokio_postgres::Client,
    schema: &str,
    key: &idemgate_core::Key,
) -> (Option<i64>, bool) {
    let row = client
        .query_one(
            &format!(
                "SELECT retain_until, octet_length(outcome_body) = 0 AS emptied \
                 FROM \"{schema}\".idemgate_records WHERE tenant = $1 AND tool = $2 AND key = $3"
            ),
            &[&key.tenant.as_str(), &key.tool.as_str(), &key.key.as_str()],
        )
        .await
        .unwrap();
    (row.get(0), row.get::<_, Option<bool>>(1).unwrap_or(false))
}

/// A purge counts the rows it deleted (past their tombstone, or their expiry without one), and
/// drops the outcome of a tombstone, which stays; a renewal clears the tombstone's time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_deletes_past_the_tombstone_and_empties_tombstones() {
    // A schema of its own: a purge of the shared one counts other tests' rows.
    let (schema, opts) = private_schema();
    let url = support::url();
    let store = support::connect_with(&url, opts).await;
    let client = support::raw_client(&url).await;
    let short = Duration::from_millis(100);
    let complete = |key: idemgate_core::Key, keep: Keep| {
        let store = store.clone();
        async move {
            let lease = acquire(
                &store,
                &Reservation::new(key.clone(), fp("a"), Duration::from_secs(60)),
            )
            .await;
            let done = store
                .complete_at(&key, lease, &Outcome::success(b"body".to_vec()), keep, None)
                .await
                .unwrap();
            (key, lease, done)
        }
    };
    let (tomb, tomb_lease, tomb_done) = complete(
        fresh_key("purge", "tombstone"),
        Keep {
            ttl: short,
            tombstone: Duration::from_secs(600),
        },
    )
    .await;
    let (gone, _, _) = complete(fresh_key("purge", "gone"), Keep::replay(short)).await;
    let (live, _, _) = complete(
        fresh_key("purge", "live"),
        Keep::replay(Duration::from_secs(600)),
    )
    .await;
    let unknown = fresh_key("purge", "unknown");
    let lease = acquire(
        &store,
        &Reservation::new(unknown.clone(), fp("a"), Duration::from_secs(60)),
    )
    .await;
    store.mark_unknown(&unknown, lease).await.unwrap();
    // The completion wrote when the record goes: completed_at + max(ttl, tombstone).
    let retain = tomb_done.completed_at.plus(Duration::from_secs(600));
    assert_eq!(
        stored_retain(&client, &schema, &tomb).await,
        (Some(retain.as_millis()), false)
    );
    tokio::time::sleep(Duration::from_millis(400)).await;

    assert_eq!(store.purge_expired().await.unwrap(), 1, "the expired row");
    assert!(store.get(&gone).await.unwrap().is_none());
    assert_eq!(
        stored_retain(&client, &schema, &tomb).await,
        (Some(retain.as_millis()), true),
        "the tombstone stays, its outcome dropped"
    );
    assert!(
        !stored_retain(&client, &schema, &live).await.1,
        "a replayed outcome is kept"
    );
    let expired = RecordState::Expired {
        completed_at: tomb_done.completed_at,
        expired_at: tomb_done.expires_at,
        retain_until: retain,
    };
    assert_eq!(store.get(&tomb).await.unwrap().unwrap().state, expired);
    assert!(store.get(&unknown).await.unwrap().is_some());
    // Completing again still answers the first completion.
    assert_eq!(
        store
            .complete(
                &tomb,
                tomb_lease,
                &Outcome::success(b"again".to_vec()),
                short
            )
            .await
            .unwrap(),
        tomb_done
    );
    let listed = |state| {
        let store = store.clone();
        async move {
            let filter = ListFilter {
                state: Some(state),
                ..ListFilter::default()
            };
            let keys: Vec<_> = store
                .list(&filter)
                .await
                .unwrap()
                .into_iter()
                .map(|r| r.key)
                .collect();
            keys
        }
    };
    assert_eq!(listed(State::Expired).await, std::slice::from_ref(&tomb));
    assert_eq!(listed(State::Completed).await, std::slice::from_ref(&live));
    assert_eq!(listed(State::Unknown).await, std::slice::from_ref(&unknown));
    assert_eq!(
        store.purge_expired().await.unwrap(),
        0,
        "nothing more is due"
    );

    // Reopened, the tombstone goes at once; the renewal at the next fence clears its time.
    assert_eq!(
        store.reopen(&tomb, tomb_lease.fence).await.unwrap(),
        Reopened::Expired
    );
    let again = acquire(
        &store,
        &Reservation::new(tomb.clone(), fp("b"), Duration::from_secs(60)),
    )
    .await;
    assert_eq!(again.fence, tomb_lease.fence + 1);
    assert_eq!(stored_retain(&client, &schema, &tomb).await, (None, false));
    drop(store);
    support::drop_schema(&schema).await;
}

fn lossy_url() -> String {
    support::with_params(&support::url(), "options=-c%20synchronous_commit%3Doff")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synchronous_commit_off_is_set_on_by_default() {
    // The session starts with synchronous_commit = off (as a server or role default would set it).
    let store = support::connect_with(&lossy_url(), support::options()).await;
    assert_eq!(store.synchronous_commit().await.unwrap(), "on");
    // Every pooled session, not just the first.
    let all = join_all((0..4).map(|_| store.synchronous_commit())).await;
    assert!(
        all.iter().all(|s| matches!(s.as_deref(), Ok("on"))),
        "{all:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synchronous_commit_off_is_refused_or_allowed_when_asked() {
    let refuse = PgOptions {
        synchronous_commit: SyncCommit::Refuse,
        ..support::options()
    };
    match PgStore::connect_with(&lossy_url(), refuse.clone()).await {
        Err(StoreError::Misconfigured(msg)) => assert!(msg.contains("synchronous_commit"), "{msg}"),
        other => panic!("expected Misconfigured, got {other:?}"),
    }
    // A durable server passes the same check.
    let ok = support::connect_with(&support::url(), refuse).await;
    assert_eq!(ok.synchronous_commit().await.unwrap(), "on");
    let allow = PgOptions {
        synchronous_commit: SyncCommit::AllowLoss,
        ..support::options()
    };
    let lossy = support::connect_with(&lossy_url(), allow).await;
    assert_eq!(lossy.synchronous_commit().await.unwrap(), "off");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_wakes_on_completion_from_another_store() {
    let a = connect().await;
    let b = connect().await;
    let key = fresh_key("notify", "k");
    let lease = acquire(
        &a,
        &Reservation::new(key.clone(), fp("x"), Duration::from_secs(60)),
    )
    .await;
    assert!(
        b.wait_listening(Duration::from_secs(10)).await,
        "b's listener never listened"
    );

    // Store level: wait_changed returns soon after the other store's completion. Both run in
    // this task: the first poll of `join!` subscribes the waiter before the completion can be
    // sent, however late the machine schedules anything. The 300 ms pause is what the waiter
    // must sleep through, not a wait for it to be ready.
    let start = Instant::now();
    let (waited, latency) = tokio::join!(
        async {
            b.wait_changed(&key, Default::default(), Duration::from_secs(10))
                .await;
            start.elapsed()
        },
        async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let done_at = Instant::now();
            a.complete(
                &key,
                lease,
                &idemgate_core::Outcome::success(b"ok".to_vec()),
                Duration::from_secs(60),
            )
            .await
            .unwrap();
            done_at
        }
    );
    let latency = latency.elapsed();
    assert!(
        waited >= Duration::from_millis(250),
        "woke before the change: {waited:?}"
    );
    assert!(
        waited < Duration::from_secs(2),
        "not woken by NOTIFY: waited {waited:?}"
    );
    eprintln!("wait_changed woke {latency:?} after the completion was sent");

    // A waiter on another record in flight sleeps through it.
    let other = fresh_key("notify", "other");
    acquire(
        &a,
        &Reservation::new(other.clone(), fp("x"), Duration::from_secs(60)),
    )
    .await;
    let start = Instant::now();
    b.wait_changed(&other, Default::default(), Duration::from_millis(300))
        .await;
    assert!(start.elapsed() >= Duration::from_millis(290));

    // A waiter on a record that settled already (or never was) does not wait at all.
    let start = Instant::now();
    b.wait_changed(&key, Default::default(), Duration::from_secs(10))
        .await;
    b.wait_changed(
        &fresh_key("notify", "absent"),
        Default::default(),
        Duration::from_secs(10),
    )
    .await;
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}

/// A NOTIFY serializes commits on the server's notification queue: only the write that settles a
/// record somebody waits for sends one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_writes_somebody_waits_for_notify() {
    let store = connect().await;
    let (_listener, mut payloads) = support::listen_payloads().await;

    let settle = |key: idemgate_core::Key, flag: bool| {
        let store = store.clone();
        async move {
            let lease = acquire(
                &store,
                &Reservation::new(key.clone(), fp("x"), Duration::from_secs(60)),
            )
            .await;
            if flag {
                // What a waiter does before it waits (a short timeout ends the wait itself).
                store
                    .wait_changed(&key, Default::default(), Duration::from_millis(1))
                    .await;
            }
            store
                .complete(
                    &key,
                    lease,
                    &idemgate_core::Outcome::success(b"ok".to_vec()),
                    Duration::from_secs(60),
                )
                .await
                .unwrap();
            hex(&key.digest())
        }
    };
    let unwaited = settle(fresh_key("notify-economy", "alone"), false).await;
    let waited = settle(fresh_key("notify-economy", "waited"), true).await;
    // The waited-for completion's notification arrives; the one before it sent none (both were
    // committed by one connection in order, and the server delivers notifications in commit order).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let payload = tokio::time::timeout_at(deadline.into(), payloads.recv())
            .await
            .expect("the waited-for completion notified")
            .expect("listener open");
        assert_ne!(payload, unwaited, "a completion nobody waited for notified");
        if payload == waited {
            break;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_reports_when_it_listens() {
    let name = format!("idemgate-listen-{}", &fresh_schema("x")[2..]);
    let url = support::with_params(&support::url(), &format!("application_name={name}"));
    let store = support::connect_with(&url, support::options()).await;
    assert!(store.wait_listening(Duration::from_secs(10)).await);
    assert!(store.is_listening());
    // The server agrees: the store's listener session has run LISTEN.
    let client = support::raw_client(&support::url()).await;
    let listeners: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 \
             AND query = 'LISTEN idemgate'",
            &[&name],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(listeners, 1, "the listener session");

    let polling = support::connect_with(
        &support::url(),
        PgOptions {
            listen: false,
            ..support::options()
        },
    )
    .await;
    let start = Instant::now();
    assert!(!polling.wait_listening(Duration::from_secs(10)).await);
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "no listener to wait for"
    );
    assert!(!polling.is_listening());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_duplicate_replays_without_polling() {
    let a = connect().await;
    let b = connect().await;
    assert!(
        b.wait_listening(Duration::from_secs(10)).await,
        "b's listener never listened"
    );
    let key = fresh_key("notify-engine", "k");
    let policy = ToolPolicy {
        wait: Duration::from_secs(20),
        ..ToolPolicy::default()
    };
    // max_poll as long as the wait: only a notification can wake the duplicate early.
    let settings = Settings {
        max_poll: Duration::from_secs(20),
        ..Settings::default()
    };
    let engine_a =
        Arc::new(Engine::new(a).with_policies(Policies::new().with_default(policy.clone())));
    let engine_b = Engine::new(b)
        .with_policies(Policies::new().with_default(policy))
        .with_settings(settings);
    let call = Call::new(key.tenant.clone(), key.tool.clone()).key(key.key.clone());
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let first = {
        let (engine_a, call) = (engine_a.clone(), call.clone());
        tokio::spawn(async move {
            engine_a
                .call(call, || async move {
                    let _ = started_tx.send(());
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    Effect::Success(b"once".to_vec())
                })
                .await
        })
    };
    started_rx.await.unwrap();
    let start = Instant::now();
    let dup = engine_b
        .call(call, || async { panic!("the duplicate must not run") })
        .await
        .unwrap();
    let waited = start.elapsed();
    assert!(matches!(dup.decision, Decision::Replayed { .. }), "{dup:?}");
    assert!(waited < Duration::from_secs(3), "woken late: {waited:?}");
    eprintln!("duplicate replayed after {waited:?} (first call took about 500 ms)");
    assert!(first.await.unwrap().unwrap().executed_here());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_carry_the_digest_never_the_key() {
    let store = connect().await;
    let (_listener, mut rx) = support::listen_payloads().await;
    let key = fresh_key("digest", "secret-key-123");
    let lease = acquire(
        &store,
        &Reservation::new(key.clone(), fp("x"), Duration::from_secs(60)),
    )
    .await;
    // Somebody waits for it (only then does its completion notify).
    store
        .wait_changed(&key, Default::default(), Duration::from_millis(1))
        .await;
    store
        .complete(
            &key,
            lease,
            &idemgate_core::Outcome::success(b"x".to_vec()),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    let want = hex(&key.digest());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let got = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .expect("notification")
            .unwrap();
        assert!(!got.contains("secret-key"), "raw key leaked: {got}");
        if got == want {
            break;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserve_over_expired_completed_record_raises_the_fence() {
    let store = connect().await;
    let key = fresh_key("ttl-fence", "k");
    let first = acquire(
        &store,
        &Reservation::new(key.clone(), fp("a"), Duration::from_secs(60)),
    )
    .await;
    store
        .complete(
            &key,
            first,
            &idemgate_core::Outcome::success(b"x".to_vec()),
            Duration::from_millis(200),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let second = acquire(
        &store,
        &Reservation::new(key.clone(), fp("b"), Duration::from_secs(60)),
    )
    .await;
    assert_eq!(second.fence, first.fence + 1);
    let rec = store.get(&key).await.unwrap().unwrap();
    assert_eq!(rec.fingerprint, fp("b"));
    assert!(matches!(rec.state, RecordState::InFlight { .. }));
    assert!(matches!(
        store
            .complete(
                &key,
                first,
                &idemgate_core::Outcome::success(b"old".to_vec()),
                Duration::from_secs(60)
            )
            .await,
        Err(StoreError::LeaseLost)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takeover_retried_with_its_token_acquires_its_own_record() {
    let store = connect().await;
    let key = fresh_key("takeover-retry", "k");
    let old = acquire(
        &store,
        &Reservation::new(key.clone(), fp("a"), Duration::from_millis(200)),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let r = Reservation::new(key.clone(), fp("a"), Duration::from_millis(200));
    let Claim::Acquired(new) = store.takeover(&r, old.fence).await.unwrap() else {
        panic!("takeover refused")
    };
    assert_eq!(new.fence, old.fence + 1);
    let created = store.get(&key).await.unwrap().unwrap().created_at;
    // Even after its own lease ran out, the retried takeover finds its own record as it stands.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        store.takeover(&r, old.fence).await.unwrap(),
        Claim::Acquired(new)
    );
    assert_eq!(store.reserve(&r).await.unwrap(), Claim::Acquired(new));
    assert_eq!(store.get(&key).await.unwrap().unwrap().created_at, created);
    // Takeover of an absent record reserves it.
    store.release(&key, new).await.unwrap();
    let r2 = Reservation::new(key.clone(), fp("a"), Duration::from_secs(60));
    assert!(matches!(
        store.takeover(&r2, 99).await.unwrap(),
        Claim::Acquired(_)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_record_completes_under_its_lease_once() {
    let store = connect().await;
    let key = fresh_key("unknown-complete", "k");
    let lease = acquire(
        &store,
        &Reservation::new(key.clone(), fp("a"), Duration::from_secs(60)),
    )
    .await;
    store.mark_unknown(&key, lease).await.unwrap();
    let outcome = idemgate_core::Outcome::failed(b"declined".to_vec());
    let first = store
        .complete(&key, lease, &outcome, Duration::from_secs(60))
        .await
        .unwrap();
    let again = store
        .complete(
            &key,
            lease,
            &idemgate_core::Outcome::success(b"other".to_vec()),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    assert_eq!(first, again);
    assert!(matches!(
        store.mark_unknown(&key, lease).await,
        Err(StoreError::LeaseLost)
    ));
    assert!(matches!(
        store.heartbeat(&key, lease, Duration::from_secs(1)).await,
        Err(StoreError::LeaseLost)
    ));
    let rec = store.get(&key).await.unwrap().unwrap();
    assert!(
        matches!(rec.state, RecordState::Completed { ref outcome, .. } if outcome.body == b"declined")
    );
    // Release of a record that never existed succeeds.
    store
        .release(&fresh_key("nothing", "k"), lease)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reaper_deletes_expired_rows() {
    // A schema of its own: the reaper purges every expired row of its schema, and in the shared
    // one it would delete the rows other tests wait on to expire (their keys' fences would then
    // start again at 1).
    let (schema, opts) = private_schema();
    let store = support::connect_with(&support::url(), opts).await;
    let key = fresh_key("reaper", "k");
    let lease = acquire(
        &store,
        &Reservation::new(key.clone(), fp("a"), Duration::from_secs(60)),
    )
    .await;
    store
        .complete(
            &key,
            lease,
            &idemgate_core::Outcome::success(b"x".to_vec()),
            Duration::from_millis(100),
        )
        .await
        .unwrap();
    let reaper = store.spawn_reaper(Duration::from_millis(50));
    let client = support::raw_client(&support::url()).await;
    let count = || async {
        client
            .query_one(
                &format!("SELECT count(*) FROM \"{schema}\".idemgate_records WHERE tenant = $1"),
                &[&key.tenant.as_str()],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while count().await > 0 {
        assert!(
            Instant::now() < deadline,
            "the reaper did not delete the expired row"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    reaper.abort();
    drop(store);
    support::drop_schema(&schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_server_is_unavailable_and_bad_urls_misconfigured() {
    let opts = PgOptions {
        connect_timeout: Duration::from_secs(2),
        ..support::options()
    };
    // Nothing listens on port 1 of loopback.
    match PgStore::connect_with("postgres://postgres@127.0.0.1:1/test", opts.clone()).await {
        Err(StoreError::Unavailable(_)) => {}
        other => panic!("expected Unavailable, got {other:?}"),
    }
    for bad in ["redis://127.0.0.1", "postgres://127.0.0.1:notaport/x"] {
        match PgStore::connect_with(bad, opts.clone()).await {
            Err(StoreError::Misconfigured(_)) => {}
            other => panic!("{bad}: expected Misconfigured, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_url_options_are_refused_by_name() {
    // Refused before any connection is tried: nothing listens on port 1.
    for (url, bad) in [
        (
            "postgres://postgres@127.0.0.1:1/test?sslmod=disable",
            "sslmod",
        ),
        (
            "postgresql://postgres@127.0.0.1:1/test?application_name=a&schema=x",
            "schema",
        ),
        // libpq knows it, tokio-postgres does not: it would never take effect.
        (
            "postgres://postgres@127.0.0.1:1/test?sslrootcert=ca.pem",
            "sslrootcert",
        ),
    ] {
        match PgStore::connect_with(url, support::options()).await {
            Err(StoreError::Misconfigured(m)) => {
                assert!(m.contains(&format!("unknown option {bad:?}")), "{url}: {m}");
                assert!(m.contains("sslmode"), "the valid options are listed: {m}");
            }
            other => panic!("{url}: expected Misconfigured, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn driver_url_options_still_take_effect() {
    let name = format!("idemgate-url-{}", &fresh_schema("x")[2..]);
    let url = support::with_params(
        &support::url(),
        &format!("application_name={name}&connect_timeout=5&sslmode=disable&keepalives=1"),
    );
    let store = support::connect_with(&url, support::options()).await;
    let client = store.pool().get().await.expect("a pooled connection");
    let row = client
        .query_one("SHOW application_name", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), name);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_rows_are_corrupt_and_only_for_their_key() {
    let store = connect().await;
    let bad = fresh_key("corrupt", "bad");
    // A completed row whose outcome kind this version does not know (the table allows it).
    let client = support::raw_client(&support::url()).await;
    client
        .execute(
            &format!(
                "INSERT INTO {}.idemgate_records (tenant, tool, key, fingerprint, fence, token, \
                 created_at, state, completed_at, expires_at, outcome_kind, outcome_body) \
                 VALUES ($1, $2, $3, $4, 1, $5, 0, 1, 0, 9000000000000, 5, '')",
                support::schema()
            ),
            &[
                &bad.tenant.as_str(),
                &bad.tool.as_str(),
                &bad.key.as_str(),
                &fp("x").as_bytes().as_slice(),
                &[0u8; 16].as_slice(),
            ],
        )
        .await
        .unwrap();
    match store.get(&bad).await {
        Err(StoreError::Corrupt(m)) => assert!(m.contains("unknown outcome kind 5"), "{m}"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    let r = Reservation::new(bad.clone(), fp("x"), Duration::from_secs(60));
    assert!(matches!(
        store.reserve(&r).await,
        Err(StoreError::Corrupt(_))
    ));
    let filter = idemgate_core::ListFilter {
        tenant: Some(bad.tenant.clone()),
        ..idemgate_core::ListFilter::default()
    };
    assert!(matches!(
        store.list(&filter).await,
        Err(StoreError::Corrupt(_))
    ));
    neighbour_still_reserves(&store, &bad).await;
}

/// Another record under the tenant and tool of the unreadable row `bad` is reserved as usual:
/// a corrupt row is corrupt for its key alone.
async fn neighbour_still_reserves(store: &PgStore, bad: &idemgate_core::Key) {
    let good = idemgate_core::Key::new(
        bad.tenant.clone(),
        bad.tool.clone(),
        "good".parse().unwrap(),
    );
    acquire(
        store,
        &Reservation::new(good, fp("y"), Duration::from_secs(60)),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_breaking_the_record_rules_are_corrupt_on_read_and_only_for_their_key() {
    // The table checks none of these rules (a CHECK cost every write a twentieth of a call):
    // the decoder is where each is enforced.
    let store = connect().await;
    let client = support::raw_client(&support::url()).await;
    // (name, state and its columns, fingerprint length, token length, the column to blame)
    let cases = [
        (
            "in-flight",
            "0, NULL, NULL, NULL, NULL",
            32,
            16,
            "lease_until",
        ),
        (
            "completed",
            "1, 0, 9000000000000, 0, NULL",
            32,
            16,
            "outcome_body",
        ),
        ("short-token", "0, NULL, NULL, NULL, NULL", 32, 15, "token"),
        (
            "short-fp",
            "2, NULL, NULL, NULL, NULL",
            31,
            16,
            "fingerprint",
        ),
    ];
    for (name, state, fingerprint_len, token_len, named) in cases {
        let (fingerprint, token) = (vec![0u8; fingerprint_len], vec![0u8; token_len]);
        let bad = fresh_key("rules", name);
        client
            .execute(
                &format!(
                    "INSERT INTO {}.idemgate_records (tenant, tool, key, fingerprint, fence, \
                     token, created_at, state, completed_at, expires_at, outcome_kind, \
                     outcome_body, lease_until, since) \
                     VALUES ($1, $2, $3, $4, 1, $5, 0, {state}, NULL, NULL)",
                    support::schema()
                ),
                &[
                    &bad.tenant.as_str(),
                    &bad.tool.as_str(),
                    &bad.key.as_str(),
                    &fingerprint.as_slice(),
                    &token.as_slice(),
                ],
            )
            .await
            .unwrap_or_else(|e| panic!("{name}: the table took no such row: {e:?}"));
        match store.get(&bad).await {
            Err(StoreError::Corrupt(m)) => assert!(m.contains(named), "{name}: {m}"),
            other => panic!("{name}: expected Corrupt, got {other:?}"),
        }
        let r = Reservation::new(bad.clone(), fp("x"), Duration::from_secs(60));
        assert!(
            matches!(store.reserve(&r).await, Err(StoreError::Corrupt(_))),
            "{name}"
        );
        neighbour_still_reserves(&store, &bad).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_records_carry_only_the_key_and_the_operators_partial_indexes() {
    // Every other index made reservations or completions write more (migrations 3 and 4); the
    // two of migration 7 hold only the rows not completed, and the completed ones by when a
    // purge has work on them.
    connect().await;
    let client = support::raw_client(&support::url()).await;
    let rows = client
        .query(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = $1 \
             AND tablename = 'idemgate_records' ORDER BY indexname",
            &[&support::schema()],
        )
        .await
        .unwrap();
    let names: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(
        names,
        [
            "idemgate_records_pkey",
            "idemgate_records_purge_due",
            "idemgate_records_unsettled"
        ]
    );
    for row in &rows[1..] {
        let def: String = row.get(1);
        assert!(def.contains("WHERE (state "), "partial: {def}");
    }
}

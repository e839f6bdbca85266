//! Waiting duplicates are woken by the subscription, not by their polls: a settling that lands
//! while a duplicate waits, or between its look and its wait, ends the wait at once.

use std::time::{Duration, Instant};

use idemgate_core::{
    Claim, Fingerprint, IdempotencyKey, Key, Lease, Outcome, RecordState, Reservation, Store,
    TenantId, ToolName,
};
use redis::AsyncCommands;

use crate::common::{delete_prefix, random_hex, raw, run_prefix, shared_store, test_url};

/// Far longer than the test may take: a wait that ran out instead of being woken fails it.
const LONG: Duration = Duration::from_secs(30);

/// A store on the shared Redis under a fresh prefix, its subscription in effect.
async fn listening_store() -> (idemgate_redis::RedisStore, String) {
    let prefix = format!("{}wake-{}:", run_prefix(), random_hex(4));
    let store = shared_store(&prefix).await;
    assert!(
        store.wait_listening(LONG).await,
        "the subscription took effect"
    );
    (store, prefix)
}

async fn in_flight(store: &idemgate_redis::RedisStore, name: &str) -> (Key, Lease) {
    let key = Key::new(
        TenantId::new("acme").unwrap(),
        ToolName::new("charge").unwrap(),
        IdempotencyKey::new(name).unwrap(),
    );
    let r = Reservation::new(key.clone(), Fingerprint::of_bytes(b"a"), LONG);
    let Claim::Acquired(lease) = store.reserve(&r).await.unwrap() else {
        panic!("a fresh key is acquired");
    };
    (key, lease)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_during_the_wait_wakes_the_waiter() {
    let (store, prefix) = listening_store().await;
    let (key, lease) = in_flight(&store, "during").await;
    let mark = store.change_mark(&key);
    let waiter = tokio::spawn({
        let (store, key) = (store.clone(), key.clone());
        async move {
            store.wait_changed(&key, mark, LONG).await;
            Instant::now()
        }
    });
    // The waiter has flagged the record: its wait is under way.
    let mut conn = raw(&test_url()).await;
    let name = store.record_key(&key);
    let deadline = Instant::now() + LONG;
    while conn
        .hget::<_, _, Option<String>>(&name, "waiters")
        .await
        .unwrap()
        .is_none()
    {
        assert!(
            Instant::now() < deadline,
            "the waiter never flagged the record"
        );
        tokio::task::yield_now().await;
    }
    let completed = Instant::now();
    store
        .complete(&key, lease, &Outcome::success(b"done".to_vec()), LONG)
        .await
        .unwrap();
    let woken = waiter.await.unwrap();
    assert!(
        woken.duration_since(completed) < Duration::from_secs(10),
        "woken {:?} after the completion",
        woken.duration_since(completed)
    );
    // The flag went with the settling.
    let flag: Option<String> = conn.hget(&name, "waiters").await.unwrap();
    assert_eq!(flag, None);
    delete_prefix(&test_url(), &prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_between_the_look_and_the_wait_ends_the_wait_at_once() {
    let (store, prefix) = listening_store().await;
    let (key, lease) = in_flight(&store, "between").await;
    let mark = store.change_mark(&key);
    let seen = store.get(&key).await.unwrap().unwrap();
    assert!(matches!(seen.state, RecordState::InFlight { .. }));
    store
        .complete(&key, lease, &Outcome::success(b"done".to_vec()), LONG)
        .await
        .unwrap();
    let started = Instant::now();
    store.wait_changed(&key, mark, LONG).await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "waited {:?}",
        started.elapsed()
    );
    delete_prefix(&test_url(), &prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_without_a_settling_lasts_its_timeout() {
    let (store, prefix) = listening_store().await;
    let (key, _lease) = in_flight(&store, "quiet").await;
    // Every store on the server hears every settling, and records share the slots of their
    // waiters (see `Changes`): a settling by a test running beside this one may end a wait
    // early. Such a wait must have seen its mark move; a wait that returns early without a
    // change is the failure. Waits go on until one lasts its timeout, within a deadline shorter
    // than the record's lease (`LONG`): past it the record is no longer in flight, and a wait
    // rightly returns at once.
    let deadline = Instant::now() + LONG / 2;
    loop {
        let mark = store.change_mark(&key);
        let started = Instant::now();
        store
            .wait_changed(&key, mark, Duration::from_millis(300))
            .await;
        if started.elapsed() >= Duration::from_millis(300) {
            break;
        }
        assert_ne!(
            store.change_mark(&key),
            mark,
            "the wait ended after {:?} with no change heard",
            started.elapsed()
        );
        assert!(
            Instant::now() < deadline,
            "no quiet 300 ms in {:?} of waits",
            LONG / 2
        );
    }
    delete_prefix(&test_url(), &prefix).await;
}

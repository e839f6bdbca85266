//! Replicated mode: every write waits for replicas, and too few acknowledgements make it
//! indeterminate (a failover could lose it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use idemgate_core::{
    Answer, Call, Claim, Decision, Effect, Engine, Fingerprint, Key, Recording, Reservation, Store,
    StoreError,
};
use idemgate_redis::{RedisOptions, RedisStore};

use crate::common::{raw, PrivateRedis};

/// A replica of `primary`, attached and in sync.
async fn attached_replica(primary: &PrivateRedis) -> PrivateRedis {
    let port = primary.port().to_string();
    let replica = PrivateRedis::start_with(true, &["--replicaof", "127.0.0.1", &port]);
    let mut conn = raw(&primary.url()).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut conn)
            .await
            .expect("info");
        if info.contains("connected_slaves:1") && info.contains("state=online") {
            return replica;
        }
        assert!(Instant::now() < deadline, "replica did not attach: {info}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One call through the engine; whether its side effect ran, and the answer.
async fn call_once(
    store: RedisStore,
    key: &str,
) -> (bool, Result<Answer, idemgate_core::EngineError>) {
    let engine = Engine::new(store);
    let call =
        Call::new("tenant".parse().unwrap(), "tool".parse().unwrap()).key(key.parse().unwrap());
    let ran = AtomicBool::new(false);
    let answer = engine
        .call(call, || async {
            ran.store(true, Ordering::SeqCst);
            Effect::Success(b"done".to_vec())
        })
        .await;
    (ran.load(Ordering::SeqCst), answer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_replicas_in_the_url_fails_closed_without_a_replica() {
    let primary = PrivateRedis::start(true);
    let url = format!("{}?wait_replicas=1&wait_timeout=200ms", primary.url());
    let store = RedisStore::connect(&url).await.expect("connect");
    assert_eq!(
        store.options().wait_replicas,
        Some((1, Duration::from_millis(200)))
    );
    // Before, the option was ignored and the call ran, its record on the primary alone.
    let (ran, answer) = call_once(store, "k").await;
    assert!(
        !ran,
        "nothing may run when no replica holds the reservation"
    );
    match answer {
        Err(idemgate_core::EngineError::ReserveFailed(e)) => {
            assert!(e.to_string().contains("0 of 1 replicas"), "{e}");
            assert!(e.to_string().contains("taken back"), "{e}");
        }
        other => panic!("expected a refused reservation, got {other:?}"),
    }
    // The refused reservation is not left standing (it would turn unknown when its lease ends
    // and hold every retry for an operator, though nothing ran): the key is free, and a retry
    // runs the side effect once.
    let plain = RedisStore::connect(&primary.url()).await.expect("connect");
    let key = Key::new(
        "tenant".parse().unwrap(),
        "tool".parse().unwrap(),
        "k".parse().unwrap(),
    );
    assert_eq!(plain.get(&key).await.expect("get"), None);
    let (ran, answer) = call_once(plain, "k").await;
    assert!(ran, "{answer:?}");
    assert!(matches!(
        answer.map(|a| a.decision),
        Ok(Decision::Executed {
            recording: Recording::Stored,
            ..
        })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_replicas_in_the_url_succeeds_with_a_replica() {
    let primary = PrivateRedis::start(true);
    let _replica = attached_replica(&primary).await;
    let url = format!("{}?wait_replicas=1&wait_timeout=2s", primary.url());
    let store = RedisStore::connect(&url).await.expect("connect");
    let (ran, answer) = call_once(store, "k").await;
    assert!(ran);
    match answer.expect("answered").decision {
        Decision::Executed { recording, .. } => assert_eq!(recording, Recording::Stored),
        other => panic!("expected executed, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_wait_for_replicas() {
    let primary = PrivateRedis::start(true);
    let _replica = attached_replica(&primary).await;
    let key = Key::new(
        "tenant".parse().unwrap(),
        "tool".parse().unwrap(),
        "k".parse().unwrap(),
    );
    let one = RedisStore::connect_with(
        &primary.url(),
        RedisOptions {
            wait_replicas: Some((1, Duration::from_secs(2))),
            ..RedisOptions::default()
        },
    )
    .await
    .expect("connect");
    let r = Reservation::new(
        key.clone(),
        Fingerprint::of_bytes(b"a"),
        Duration::from_secs(60),
    );
    assert!(matches!(one.reserve(&r).await, Ok(Claim::Acquired(_))));

    let two = RedisStore::connect_with(
        &primary.url(),
        RedisOptions {
            wait_replicas: Some((2, Duration::from_millis(200))),
            ..RedisOptions::default()
        },
    )
    .await
    .expect("connect");
    let other = Key::new(key.tenant.clone(), key.tool.clone(), "k2".parse().unwrap());
    let r = Reservation::new(
        other.clone(),
        Fingerprint::of_bytes(b"a"),
        Duration::from_secs(60),
    );
    match two.reserve(&r).await {
        Err(StoreError::Unavailable(msg)) => {
            assert!(
                msg.contains("1 of 2 replicas") && msg.contains("taken back"),
                "{msg}"
            )
        }
        got => panic!("expected a reservation taken back, got {got:?}"),
    }
    // The write landed on the primary and was taken back there: nothing is held.
    assert_eq!(one.get(&other).await.expect("get"), None);
}

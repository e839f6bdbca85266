//! Replicated mode: every write waits for replicas, and too few acknowledgements make it
//! indeterminate (a failover could lose it).

use std::time::{Duration, Instant};

use idemgate_core::{Claim, Fingerprint, Key, Reservation, Store, StoreError};
use idemgate_redis::{RedisOptions, RedisStore};

use crate::common::{raw, PrivateRedis};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_wait_for_replicas() {
    let primary = PrivateRedis::start(true);
    let port = primary.port().to_string();
    let _replica = PrivateRedis::start_with(true, &["--replicaof", "127.0.0.1", &port]);
    // Wait until the replica is attached.
    let mut conn = raw(&primary.url()).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut conn)
            .await
            .expect("info");
        if info.contains("connected_slaves:1") && info.contains("state=online") {
            break;
        }
        assert!(Instant::now() < deadline, "replica did not attach: {info}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
        Err(StoreError::Indeterminate(msg)) => assert!(msg.contains("1 of 2 replicas"), "{msg}"),
        got => panic!("expected indeterminate, got {got:?}"),
    }
    // The write did land on the primary: a retry with the same token finds it.
    assert!(matches!(one.reserve(&r).await, Ok(Claim::Acquired(_))));
}

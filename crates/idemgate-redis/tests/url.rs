//! Query options of the URL: this crate's own and redis-rs's reach their readers; any other is
//! refused by name before a connection is tried.

use std::time::Duration;

use idemgate_core::{Claim, Fingerprint, Key, Reservation, Store, StoreError};
use idemgate_redis::RedisStore;

use crate::common::{delete_prefix, random_hex, raw, run_prefix, test_url};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documented_url_options_reach_the_store_and_the_driver() {
    let prefix = format!("{}url-{}:", run_prefix(), random_hex(4));
    // Database 3 (the path) and RESP3 (`protocol`) are read by redis-rs, the rest by the store.
    let db3 = format!("{}/3", test_url().trim_end_matches('/'));
    let url = format!("{db3}?protocol=resp3&allow_volatile=true&key_prefix={prefix}");
    let store = RedisStore::connect(&url)
        .await
        .expect("every option in the url is documented");
    assert!(store.options().allow_volatile);
    assert_eq!(store.options().key_prefix, prefix);

    let key = Key::new(
        "tenant".parse().unwrap(),
        "tool".parse().unwrap(),
        "k".parse().unwrap(),
    );
    let r = Reservation::new(
        key.clone(),
        Fingerprint::of_bytes(b"a"),
        Duration::from_secs(60),
    );
    assert!(matches!(store.reserve(&r).await, Ok(Claim::Acquired(_))));
    let mut conn = raw(&db3).await;
    let exists: u64 = redis::cmd("EXISTS")
        .arg(store.record_key(&key))
        .query_async(&mut conn)
        .await
        .expect("exists");
    assert_eq!(exists, 1, "the record is in database 3 under the prefix");
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut conn)
        .await
        .expect("client list");
    assert!(
        clients
            .lines()
            .any(|c| c.contains(" db=3 ") && c.contains(" resp=3")),
        "the store's connection speaks RESP3: {clients}"
    );
    delete_prefix(&db3, &prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_url_options_are_refused_before_connecting() {
    // Nothing listens on port 1: a refusal here comes from reading the URL.
    match RedisStore::connect("redis://127.0.0.1:1/0?allow_volatile=true&prefx=t:").await {
        Err(StoreError::Misconfigured(m)) => {
            assert!(m.contains("unknown option \"prefx\""), "{m}");
            assert!(
                m.contains("key_prefix"),
                "the valid options are listed: {m}"
            );
        }
        other => panic!("expected Misconfigured, got {other:?}"),
    }
    // `protocol` goes to redis-rs, which checks its value.
    match RedisStore::connect("redis://127.0.0.1:1/0?protocol=resp4").await {
        Err(StoreError::Misconfigured(m)) => assert!(m.contains("protocol"), "{m}"),
        other => panic!("expected Misconfigured, got {other:?}"),
    }
}

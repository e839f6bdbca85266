//! A Redis that would forget records on a restart is refused unless the operator allows it.

use idemgate_core::StoreError;
use idemgate_redis::{RedisOptions, RedisStore};

use crate::common::{raw, run_prefix, test_url, PrivateRedis};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_without_aof_is_refused() {
    let url = test_url();
    let mut conn = raw(&url).await;
    let aof: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("appendonly")
        .query_async(&mut conn)
        .await
        .expect("config get");
    assert_eq!(
        aof[1], "no",
        "the shared test redis is expected to run without persistence"
    );
    let msg = match RedisStore::connect(&url).await {
        Err(StoreError::Misconfigured(msg)) => msg,
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert!(msg.contains("appendonly no"), "{msg}");
    // Told in the words of what the operator sets (the store URL, wherever it is given), not as
    // a Rust struct.
    for words in [
        "adding allow_volatile=true to the store URL",
        "--store",
        "IDEMGATE_STORE",
        "store = \"...\"",
    ] {
        assert!(msg.contains(words), "{words:?} missing from: {msg}");
    }
    assert!(!msg.contains("RedisOptions {"), "{msg}");
    // And the URL it suggests is accepted.
    let suggested = msg
        .split_once("to the store URL: ")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no URL suggested in: {msg}"));
    assert!(suggested.ends_with("?allow_volatile=true"), "{msg}");
    if !url.contains('@') {
        let store = RedisStore::connect(&format!("{suggested}&key_prefix={}", run_prefix()))
            .await
            .unwrap_or_else(|e| panic!("the suggested {suggested} is refused: {e}"));
        assert!(store.options().allow_volatile);
    }
    let strict = RedisOptions {
        key_prefix: run_prefix().to_owned(),
        ..RedisOptions::default()
    };
    assert!(matches!(
        RedisStore::connect_with(&url, strict).await,
        Err(StoreError::Misconfigured(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_volatile_in_options_or_url_is_accepted() {
    let url = test_url();
    let options = RedisOptions {
        allow_volatile: true,
        key_prefix: run_prefix().to_owned(),
        ..RedisOptions::default()
    };
    RedisStore::connect_with(&url, options)
        .await
        .expect("allowed by options");
    let with_query = format!("{url}?allow_volatile=true&key_prefix={}", run_prefix());
    let store = RedisStore::connect(&with_query)
        .await
        .expect("allowed by the url");
    assert!(store.options().allow_volatile);
    assert_eq!(store.options().key_prefix, run_prefix());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_with_appendfsync_no_is_refused() {
    // Later settings on the command line win over the helper's `appendfsync always`.
    let server = PrivateRedis::start_with(true, &["--appendfsync", "no"]);
    match RedisStore::connect(&server.url()).await {
        Err(StoreError::Misconfigured(msg)) => {
            assert!(msg.contains("appendfsync no"), "{msg}");
            assert!(msg.contains("allow_volatile"), "{msg}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let url = format!("{}?allow_volatile=true", server.url());
    RedisStore::connect(&url)
        .await
        .expect("accepted when the operator allows it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_with_aof_is_accepted() {
    let server = PrivateRedis::start(true);
    RedisStore::connect(&server.url())
        .await
        .expect("a redis with appendonly yes is accepted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_redis_is_unavailable() {
    let server = PrivateRedis::start(false);
    let url = server.url();
    drop(server);
    match RedisStore::connect_with(
        &url,
        RedisOptions {
            allow_volatile: true,
            ..RedisOptions::default()
        },
    )
    .await
    {
        Err(StoreError::Unavailable(msg)) => assert!(msg.contains("failed to connect"), "{msg}"),
        other => panic!("expected unavailable, got {other:?}"),
    }
}

//! Scripts flushed from the server (a restart without persistence of the script cache, a failover,
//! `SCRIPT FLUSH`) are loaded again on the next call.

use std::time::Duration;

use idemgate_core::{Claim, Fingerprint, Key, Outcome, RecordState, Reservation, Store};
use idemgate_redis::RedisStore;

use crate::common::{raw, PrivateRedis};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_survive_script_flush() {
    // SCRIPT FLUSH only ever runs on a private server.
    let server = PrivateRedis::start(true);
    let store = RedisStore::connect(&server.url()).await.expect("connect");
    let key: Key = Key::new(
        "tenant".parse().unwrap(),
        "tool".parse().unwrap(),
        "k-1".parse().unwrap(),
    );
    let r = Reservation::new(
        key.clone(),
        Fingerprint::of_bytes(b"a"),
        Duration::from_secs(60),
    );
    let Claim::Acquired(lease) = store.reserve(&r).await.expect("reserve") else {
        panic!("expected to acquire");
    };
    let mut conn = raw(&server.url()).await;
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .expect("script flush");
    let n: Vec<bool> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg("0000000000000000000000000000000000000000")
        .query_async(&mut conn)
        .await
        .expect("script exists");
    assert_eq!(n, vec![false]);
    store
        .heartbeat(&key, lease, Duration::from_secs(60))
        .await
        .expect("heartbeat after flush");
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .expect("script flush");
    store
        .complete(
            &key,
            lease,
            &Outcome::success(b"ok".to_vec()),
            Duration::from_secs(60),
        )
        .await
        .expect("complete after flush");
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .expect("script flush");
    let rec = store
        .get(&key)
        .await
        .expect("get after flush")
        .expect("record");
    assert!(matches!(rec.state, RecordState::Completed { .. }));
}

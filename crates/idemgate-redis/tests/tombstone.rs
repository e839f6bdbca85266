//! Tombstones as Redis holds them: the key's Redis expiry follows the tombstone, purging drops a
//! tombstone's body without deleting it, and records written before tombstones (no
//! `retain_until`) go at their expiry.

use std::time::Duration;

use idemgate_core::{
    Claim, Fingerprint, IdempotencyKey, Keep, Key, Lease, LeaseToken, Outcome, RecordState,
    Reopened, Reservation, State, Store, TenantId, Timestamp, ToolName,
};
use idemgate_redis::RedisStore;
use redis::AsyncCommands;

use crate::common::{delete_prefix, random_hex, raw, run_prefix, shared_store, test_url};

const LONG: Duration = Duration::from_secs(600);
const TTL: Duration = Duration::from_millis(200);
/// Past [`TTL`], with margin for scheduling.
const PAST_TTL: Duration = Duration::from_millis(400);

async fn store() -> (RedisStore, String) {
    let prefix = format!("{}tombstone-{}:", run_prefix(), random_hex(4));
    (shared_store(&prefix).await, prefix)
}

fn key(name: &str) -> Key {
    Key::new(
        TenantId::new("acme").unwrap(),
        ToolName::new("charge").unwrap(),
        IdempotencyKey::new(name).unwrap(),
    )
}

async fn completed(store: &RedisStore, key: &Key, keep: Keep) -> Lease {
    let r = Reservation::new(key.clone(), Fingerprint::of_bytes(b"a"), LONG);
    let Claim::Acquired(lease) = store.reserve(&r).await.unwrap() else {
        panic!("a fresh key is acquired");
    };
    store
        .complete_at(
            key,
            lease,
            &Outcome::success(b"result".to_vec()),
            keep,
            None,
        )
        .await
        .unwrap();
    lease
}

/// The key's remaining Redis lifetime.
async fn pttl(conn: &mut redis::aio::MultiplexedConnection, name: &str) -> Duration {
    let ms: i64 = conn.pttl(name).await.unwrap();
    Duration::from_millis(u64::try_from(ms).expect("the key has an expiry"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_keeps_the_key_until_the_tombstone_goes() {
    let (store, prefix) = store().await;
    let grace = store.options().expiry_grace;
    let mut conn = raw(&test_url()).await;
    let k = key("kept");
    let keep = Keep {
        ttl: TTL,
        tombstone: Duration::from_secs(300),
    };
    let lease = completed(&store, &k, keep).await;
    let name = store.record_key(&k);
    let left = pttl(&mut conn, &name).await;
    assert!(
        left > Duration::from_secs(290) + grace && left <= keep.tombstone + grace,
        "{left:?}: the tombstone and the grace, not the ttl"
    );

    // Without a tombstone, the ttl.
    let plain = key("plain");
    completed(&store, &plain, Keep::replay(Duration::from_secs(300))).await;
    let left = pttl(&mut conn, &store.record_key(&plain)).await;
    assert!(left > Duration::from_secs(290) + grace, "{left:?}");

    // Reopening a tombstone ends it now: the key goes a grace later.
    tokio::time::sleep(PAST_TTL).await;
    assert_eq!(
        store.reopen(&k, lease.fence).await.unwrap(),
        Reopened::Expired
    );
    assert!(pttl(&mut conn, &name).await <= grace);
    let expires_at: i64 = conn.hget(&name, "expires_at").await.unwrap();
    let retain_until: i64 = conn.hget(&name, "retain_until").await.unwrap();
    assert!(
        expires_at < retain_until,
        "a reopened tombstone keeps when its outcome expired"
    );
    delete_prefix(&test_url(), &prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purging_drops_the_body_of_a_tombstone_and_keeps_it() {
    let (store, prefix) = store().await;
    let mut conn = raw(&test_url()).await;
    let k = key("compacted");
    let keep = Keep {
        ttl: TTL,
        tombstone: LONG,
    };
    let lease = completed(&store, &k, keep).await;
    let live = key("live");
    completed(&store, &live, Keep::replay(LONG)).await;
    tokio::time::sleep(PAST_TTL).await;
    let before = store.get(&k).await.unwrap().expect("a tombstone");
    assert_eq!(before.state_name(), State::Expired);

    assert_eq!(store.purge_expired().await.unwrap(), 0, "nothing deleted");
    let name = store.record_key(&k);
    assert!(!conn.hexists::<_, _, bool>(&name, "body").await.unwrap());
    assert!(
        conn.hexists::<_, _, bool>(store.record_key(&live), "body")
            .await
            .unwrap(),
        "a live outcome keeps its body"
    );
    assert_eq!(store.get(&k).await.unwrap(), Some(before.clone()));
    let Claim::Existing(met) = store
        .reserve(&Reservation::new(
            k.clone(),
            Fingerprint::of_bytes(b"a"),
            LONG,
        ))
        .await
        .unwrap()
    else {
        panic!("a compacted tombstone still counts");
    };
    assert_eq!(met, before);
    // Completing again under the old lease still answers the first completion.
    let again = store
        .complete_at(&k, lease, &Outcome::success(b"other".to_vec()), keep, None)
        .await
        .unwrap();
    let RecordState::Expired {
        completed_at,
        expired_at,
        ..
    } = before.state
    else {
        panic!("expired");
    };
    assert_eq!(
        (again.completed_at, again.expires_at),
        (completed_at, expired_at)
    );
    // A second purge finds nothing left to drop.
    assert_eq!(store.purge_expired().await.unwrap(), 0);
    delete_prefix(&test_url(), &prefix).await;
}

/// Writes a completed record as the scripts wrote it before tombstones (no `retain_until`),
/// completed at `completed_at`.
async fn write_legacy(
    store: &RedisStore,
    key: &Key,
    fence: u64,
    completed_at: Timestamp,
    expires_at: Timestamp,
) {
    let mut conn = raw(&test_url()).await;
    let name = store.record_key(key);
    let _: () = redis::cmd("HSET")
        .arg(&name)
        .arg(&[
            ("tenant", key.tenant.as_str().to_owned()),
            ("tool", key.tool.as_str().to_owned()),
            ("key", key.key.as_str().to_owned()),
            ("fp", Fingerprint::of_bytes(b"a").to_hex()),
            ("fence", fence.to_string()),
            ("token", LeaseToken::mint().to_hex()),
            ("created", completed_at.as_millis().to_string()),
            ("state", "c".to_owned()),
            ("kind", "success".to_owned()),
            ("body", "old".to_owned()),
            ("completed_at", completed_at.as_millis().to_string()),
            ("expires_at", expires_at.as_millis().to_string()),
        ])
        .query_async(&mut conn)
        .await
        .unwrap();
}

async fn server_now() -> Timestamp {
    let mut conn = raw(&test_url()).await;
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    Timestamp::from_millis(secs * 1000 + micros / 1000)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_written_before_tombstones_go_at_their_expiry() {
    let (store, prefix) = store().await;
    let now = server_now().await;
    let completed_at = Timestamp::from_millis(now.as_millis() - 1000);
    let past = Timestamp::from_millis(now.as_millis() - 1);

    // Live: replayed, and kept no longer than its expiry.
    let live = key("legacy-live");
    let expires_at = now.plus(LONG);
    write_legacy(&store, &live, 3, completed_at, expires_at).await;
    let rec = store.get(&live).await.unwrap().expect("a live record");
    assert_eq!(
        rec.state,
        RecordState::Completed {
            outcome: Outcome::success(b"old".to_vec()),
            completed_at,
            expires_at,
            retain_until: expires_at,
        }
    );

    // Past its expiry: absent (it kept no tombstone), and the next reservation continues the
    // fence.
    let gone = key("legacy-gone");
    write_legacy(&store, &gone, 3, completed_at, past).await;
    assert_eq!(store.get(&gone).await.unwrap(), None);
    assert!(store
        .list(&idemgate_core::ListFilter::default())
        .await
        .unwrap()
        .iter()
        .all(|r| r.key != gone));
    let r = Reservation::new(gone.clone(), Fingerprint::of_bytes(b"b"), LONG);
    let Claim::Acquired(lease) = store.reserve(&r).await.unwrap() else {
        panic!("an expired legacy record counts as absent");
    };
    assert_eq!(lease.fence, 4);
    store.release(&gone, lease).await.unwrap();

    // Purging deletes one past its expiry.
    let purged = key("legacy-purged");
    write_legacy(&store, &purged, 1, completed_at, past).await;
    assert_eq!(store.purge_expired().await.unwrap(), 1);
    let mut conn = raw(&test_url()).await;
    assert!(!conn
        .exists::<_, bool>(store.record_key(&purged))
        .await
        .unwrap());
    assert!(
        store.get(&live).await.unwrap().is_some(),
        "the live one stays"
    );
    delete_prefix(&test_url(), &prefix).await;
}

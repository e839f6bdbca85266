//! The store on a Redis Cluster: the whole conformance suite and the model test run against a
//! private three-master cluster that this test binary starts on free loopback ports (one per
//! process, shared by the tests, stopped by pid when the process ends), plus what is particular
//! to a cluster: records spread over every master, listing and purging see them all, writes wait
//! for the replicas of their own slot's master, and every node's persistence is checked.

mod cluster_support;

use std::sync::OnceLock;
use std::time::Duration;

use cluster_support::PrivateCluster;
use idemgate_core::{Claim, Fingerprint, Key, ListFilter, Outcome, Reservation, Store, StoreError};
use idemgate_redis::{RedisOptions, RedisStore, ReservePath};

/// The cluster of this test process.
fn cluster() -> &'static PrivateCluster {
    static CLUSTER: OnceLock<PrivateCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| PrivateCluster::start(&[]))
}

fn random_hex(n: usize) -> String {
    let mut b = vec![0u8; n];
    getrandom::fill(&mut b).expect("randomness");
    idemgate_core::key::hex(&b)
}

/// A store on the cluster under a fresh prefix; the nodes persist, so the strict check runs.
async fn cluster_store() -> RedisStore {
    cluster_store_on(ReservePath::Adaptive).await
}

/// As [`cluster_store`], reserving by `reserve_path`.
async fn cluster_store_on(reserve_path: ReservePath) -> RedisStore {
    let url = cluster().url();
    let options = RedisOptions {
        key_prefix: format!("c-{}:", random_hex(6)),
        reserve_path,
        ..RedisOptions::default()
    };
    RedisStore::connect_with(&url, options)
        .await
        .unwrap_or_else(|e| panic!("failed to open the store on the private cluster {url}: {e}"))
}

mod conformance {
    idemgate_conformance::store_conformance!(async {
        idemgate_conformance::Fixture::real(super::cluster_store().await)
    });

    // As on a single server: server clocks cannot be moved, so no clock moves and long leases.
    idemgate_conformance::store_model_test!(
        async { idemgate_conformance::Fixture::real(super::cluster_store().await) },
        cases = 64
    );
}

/// Reading first on a cluster: `TIME` and `HGETALL` go together to the master of the record's
/// slot.
mod conformance_read_first {
    use idemgate_redis::ReservePath::ReadFirst;
    idemgate_conformance::store_conformance!(async {
        idemgate_conformance::Fixture::real(super::cluster_store_on(ReadFirst).await)
    });
}

fn key(i: usize) -> Key {
    Key::new(
        "tenant".parse().unwrap(),
        "tool".parse().unwrap(),
        format!("k{i}").parse().unwrap(),
    )
}

/// How many keys a node holds under `prefix` (looked at behind the store's back).
async fn keys_on(node_url: &str, prefix: &str) -> usize {
    let mut conn = redis::Client::open(node_url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("reach the node");
    let names: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut conn)
        .await
        .expect("keys");
    names.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_spread_over_every_master_and_list_and_purge_see_them_all() {
    let store = cluster_store().await;
    let prefix = store.options().key_prefix.clone();
    let n = 60;
    for i in 0..n {
        let r = Reservation::new(key(i), Fingerprint::of_bytes(b"x"), Duration::from_secs(60));
        let Claim::Acquired(lease) = store.reserve(&r).await.expect("reserve") else {
            panic!("fresh key {i} was not acquired");
        };
        // Half complete with a TTL that is over at once, so purge has something to remove.
        let ttl = if i % 2 == 0 {
            Duration::from_millis(1)
        } else {
            Duration::from_secs(600)
        };
        store
            .complete(&key(i), lease, &Outcome::success(b"ok".to_vec()), ttl)
            .await
            .expect("complete");
    }
    let mut total = 0;
    for node in cluster().node_urls() {
        let here = keys_on(&node, &prefix).await;
        // 60 random slots all on one or two of three masters: about 3 * (2/3)^60, never.
        assert!(here > 0, "no record landed on {node}");
        total += here;
    }
    assert_eq!(total, n, "every record is one key on one master");
    let listed = store.list(&ListFilter::default()).await.expect("list");
    assert_eq!(listed.len(), n / 2, "the expired half counts as absent");
    // Let the 1 ms TTLs run out by the server clock, with a generous deadline.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut purged = 0;
    while purged < (n / 2) as u64 {
        purged += store.purge_expired().await.expect("purge");
        assert!(
            std::time::Instant::now() < deadline,
            "purged {purged} of {} expired records",
            n / 2
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(purged, (n / 2) as u64);
    let left: usize = {
        let mut t = 0;
        for node in cluster().node_urls() {
            t += keys_on(&node, &prefix).await;
        }
        t
    };
    assert_eq!(left, n / 2, "purge removed exactly the expired records");
    assert_eq!(
        store
            .list(&ListFilter::default())
            .await
            .expect("list")
            .len(),
        n / 2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_a_replica_the_masters_do_not_have_fails_closed() {
    // The masters of this cluster have no replicas: a write that must reach one is never a
    // success; a fresh reservation that happened on its master is taken back there, so the
    // refusal holds nothing.
    let url = format!("{}?wait_replicas=1&wait_timeout=100ms", cluster().url());
    let store = RedisStore::connect_with(
        &url,
        RedisOptions {
            key_prefix: format!("c-{}:", random_hex(6)),
            ..RedisOptions::default()
        },
    )
    .await
    .expect("connect");
    for i in 0..6 {
        let r = Reservation::new(key(i), Fingerprint::of_bytes(b"x"), Duration::from_secs(60));
        match store.reserve(&r).await {
            Err(StoreError::Unavailable(m)) => {
                assert!(
                    m.contains("0 of 1 replicas acknowledged") && m.contains("taken back"),
                    "{m}"
                );
            }
            other => panic!("expected a reservation taken back, got {other:?}"),
        }
        assert_eq!(store.get(&key(i)).await.expect("get"), None);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_node_without_aof_is_refused_by_name() {
    let volatile = PrivateCluster::start(&["--appendonly", "no"]);
    match RedisStore::connect(&volatile.url()).await {
        Err(StoreError::Misconfigured(m)) => {
            assert!(m.contains("appendonly no"), "{m}");
            assert!(
                volatile
                    .ports()
                    .iter()
                    .any(|p| m.contains(&format!("node 127.0.0.1:{p}"))),
                "the message names the node: {m}"
            );
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    RedisStore::connect(&format!("{}?allow_volatile=true", volatile.url()))
        .await
        .expect("accepted when allowed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_urls_are_read_and_refused_clearly() {
    // One node is enough to find the others.
    let one = format!("redis+cluster://127.0.0.1:{}", cluster().ports()[1]);
    let store = RedisStore::connect(&format!("{one}?key_prefix=c-one:"))
        .await
        .expect("connect through one node");
    assert_eq!(store.options().key_prefix, "c-one:");
    store.list(&ListFilter::default()).await.expect("list");
    for (bad, says) in [
        ("redis+cluster://127.0.0.1:1/3", "only database 0"),
        (
            "redis+cluster://127.0.0.1:1,,127.0.0.1:2",
            "empty node address",
        ),
        (
            "redis+cluster://127.0.0.1:1?prefx=a",
            "unknown option \"prefx\"",
        ),
    ] {
        match RedisStore::connect(bad).await {
            Err(StoreError::Misconfigured(m)) => assert!(m.contains(says), "{bad}: {m}"),
            other => panic!("{bad}: expected Misconfigured, got {other:?}"),
        }
    }
    match RedisStore::connect("redis+cluster://127.0.0.1:1").await {
        Err(StoreError::Unavailable(_)) => {}
        other => panic!("expected Unavailable with nothing listening, got {other:?}"),
    }
}

/// A duplicate waiting on any master is woken by the settling of its record: the store's one
/// subscription (on the first node) hears what every master publishes, across the cluster bus.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_on_any_master_is_woken_by_the_settling() {
    const LONG: Duration = Duration::from_secs(30);
    let store = cluster_store().await;
    assert!(
        store.wait_listening(LONG).await,
        "the subscription took effect"
    );
    let raw = redis::cluster::ClusterClient::new(cluster().node_urls()).unwrap();
    let mut raw = raw.get_async_connection().await.expect("reach the cluster");
    // Nine keys land on every master (records_spread_over_every_master shows the spread).
    for i in 0..9 {
        let k = key(1000 + i);
        let r = Reservation::new(k.clone(), Fingerprint::of_bytes(b"x"), LONG);
        let Claim::Acquired(lease) = store.reserve(&r).await.expect("reserve") else {
            panic!("fresh key {i} was not acquired");
        };
        let mark = store.change_mark(&k);
        let waiter = tokio::spawn({
            let (store, k) = (store.clone(), k.clone());
            async move {
                store.wait_changed(&k, mark, LONG).await;
                std::time::Instant::now()
            }
        });
        let name = store.record_key(&k);
        let deadline = std::time::Instant::now() + LONG;
        loop {
            let flag: Option<String> = redis::cmd("HGET")
                .arg(&name)
                .arg("waiters")
                .query_async(&mut raw)
                .await
                .expect("hget");
            if flag.is_some() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "key {i} was never waited for"
            );
            tokio::task::yield_now().await;
        }
        let completed = std::time::Instant::now();
        store
            .complete(&k, lease, &Outcome::success(b"done".to_vec()), LONG)
            .await
            .expect("complete");
        let woken = waiter.await.unwrap().duration_since(completed);
        assert!(
            woken < Duration::from_secs(10),
            "key {i} woken {woken:?} after"
        );
    }
}

//! A waiting caller (`idemgate_core::caller::waiting`: a Python thread in a call) does its round
//! trips on a connection of its own, on its own thread: one per thread, kept between calls,
//! replaced before use when the server closed it, closed with its thread; and nothing of it for
//! any other caller.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use idemgate_core::caller::waiting;
use idemgate_core::{
    Claim, Fingerprint, Key, Outcome, RecordState, Reservation, Store, StoreError,
};
use idemgate_redis::RedisStore;

use crate::common::{random_hex, raw, PrivateRedis};

fn reservation(key: &str) -> Reservation {
    let key = Key::new(
        "tenant".parse().unwrap(),
        "tool".parse().unwrap(),
        key.parse().unwrap(),
    );
    Reservation::new(key, Fingerprint::of_bytes(b"a"), Duration::from_secs(60))
}

/// The ids of the server's client connections, but `me`'s.
async fn clients(url: &str, me: &mut redis::aio::MultiplexedConnection) -> HashSet<u64> {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(me)
        .await
        .expect("client list");
    let mine: u64 = redis::cmd("CLIENT")
        .arg("ID")
        .query_async(me)
        .await
        .expect("client id");
    let ids: HashSet<u64> = list
        .lines()
        .filter_map(|l| l.strip_prefix("id=")?.split(' ').next()?.parse().ok())
        .collect();
    assert!(
        ids.contains(&mine),
        "CLIENT LIST of {url} lacks this connection: {list}"
    );
    ids.into_iter().filter(|id| *id != mine).collect()
}

/// Waits (up to 30 s) until `done` holds for the server's client ids.
async fn clients_until(
    url: &str,
    me: &mut redis::aio::MultiplexedConnection,
    what: &str,
    done: impl Fn(&HashSet<u64>) -> bool,
) -> HashSet<u64> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ids = clients(url, me).await;
        if done(&ids) {
            return ids;
        }
        assert!(Instant::now() < deadline, "{what}: clients {ids:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn a_waiting_caller_has_its_own_connection_kept_replaced_when_closed_and_gone_with_its_thread() {
    let server = PrivateRedis::start(true);
    let url = server.url();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let store = rt.block_on(RedisStore::connect(&url)).expect("connect");
    // The store's subscriber connects in the background: counted among the clients before, or
    // on a loaded machine it would show up later as the waiting caller's.
    assert!(
        rt.block_on(store.wait_listening(Duration::from_secs(30))),
        "the subscription took effect"
    );
    let mut me = rt.block_on(raw(&url));
    let before = rt.block_on(clients(&url, &mut me));

    // Not waiting: the shared connection, nothing new.
    let claim = rt
        .block_on(store.reserve(&reservation("k-shared")))
        .expect("reserve");
    assert!(matches!(claim, Claim::Acquired(_)), "{claim:?}");
    assert_eq!(rt.block_on(clients(&url, &mut me)), before);

    // Waiting: one connection more, and the same one for the next call.
    let r = reservation(&format!("k-{}", random_hex(4)));
    let Claim::Acquired(lease) = waiting(|| rt.block_on(store.reserve(&r))).expect("reserve")
    else {
        panic!("expected to acquire");
    };
    let with_mine = rt.block_on(clients(&url, &mut me));
    let added: Vec<u64> = with_mine.difference(&before).copied().collect();
    assert_eq!(
        added.len(),
        1,
        "one connection for the waiting caller: {added:?}"
    );
    let first = added[0];
    waiting(|| rt.block_on(store.get(&r.key))).expect("get");
    assert_eq!(
        rt.block_on(clients(&url, &mut me)),
        with_mine,
        "kept between calls"
    );

    // The server closes it while idle: the next call opens another before sending anything,
    // and answers as if nothing happened.
    let _: () = rt
        .block_on(
            redis::cmd("CLIENT")
                .arg("KILL")
                .arg("ID")
                .arg(first)
                .query_async(&mut me),
        )
        .expect("client kill");
    rt.block_on(clients_until(
        &url,
        &mut me,
        "the killed connection goes",
        |ids| !ids.contains(&first),
    ));
    let outcome = Outcome::success(b"ok".to_vec());
    waiting(|| rt.block_on(store.complete(&r.key, lease, &outcome, Duration::from_secs(60))))
        .expect("complete on a replaced connection");
    let record = rt
        .block_on(store.get(&r.key))
        .expect("get")
        .expect("record");
    assert!(
        matches!(record.state, RecordState::Completed { .. }),
        "{record:?}"
    );
    let replaced = rt.block_on(clients(&url, &mut me));
    let added: Vec<u64> = replaced.difference(&before).copied().collect();
    assert_eq!(added.len(), 1, "one connection again: {added:?}");

    // Another thread's calls get another connection, closed when that thread ends.
    let other = std::thread::scope(|s| {
        s.spawn(|| {
            waiting(|| rt.block_on(store.get(&r.key))).expect("get on another thread");
            rt.block_on(async {
                let mut me = raw(&url).await;
                clients(&url, &mut me).await
            })
        })
        .join()
        .unwrap()
    });
    assert_eq!(
        other.difference(&replaced).count(),
        2,
        "its own, and its probe's"
    );
    rt.block_on(clients_until(
        &url,
        &mut me,
        "the thread's connection goes with it",
        |ids| *ids == replaced,
    ));
}

#[test]
fn a_waiting_caller_whose_server_is_gone_is_told_nothing_was_sent() {
    let mut server = PrivateRedis::start(true);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let store = rt
        .block_on(RedisStore::connect(&server.url()))
        .expect("connect");
    let r = reservation("k-gone");
    waiting(|| rt.block_on(store.get(&r.key))).expect("get while it serves");
    server.kill9();
    let err = waiting(|| rt.block_on(store.reserve(&r))).expect_err("no server");
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    assert!(
        err.to_string().contains("failed to connect to redis"),
        "{err}"
    );
    server.restart();
    let claim = waiting(|| rt.block_on(store.reserve(&r))).expect("reserve after the restart");
    assert!(matches!(claim, Claim::Acquired(_)), "{claim:?}");
}

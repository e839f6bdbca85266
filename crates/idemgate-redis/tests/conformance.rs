//! The store conformance suite against the Redis at `IDEMGATE_TEST_REDIS_URL` (default
//! `redis://127.0.0.1:6379`), under a random key prefix per run and fixture. Leases expire by the
//! server clock, so the suite sleeps briefly. The suite and the model run on every reservation path
//! (each gives the same answers), and reading first also over RESP3, whose `HGETALL` answers a map.

use idemgate_redis::{RedisOptions, RedisStore, ReservePath};

async fn shared_store(reserve_path: ReservePath, query: &str) -> RedisStore {
    let random = |n: usize| {
        let mut b = vec![0u8; n];
        getrandom::fill(&mut b).expect("randomness");
        idemgate_core::key::hex(&b)
    };
    static RUN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let run = RUN.get_or_init(|| random(6));
    // A prefix of its own per fixture, so that the behaviours running at once never purge each
    // other's records: a record purged past its tombstone starts its fence again at 1, which a
    // behaviour waiting for that tombstone to go would take for a fence that failed to grow.
    let prefix = format!("idemgate-conformance-{run}:{}:", random(4));
    let url = std::env::var("IDEMGATE_TEST_REDIS_URL")
        .unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let url = format!("{url}{query}");
    let options = RedisOptions {
        allow_volatile: true,
        key_prefix: prefix,
        reserve_path,
        ..RedisOptions::default()
    };
    RedisStore::connect_with(&url, options)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "failed to reach the test redis at {url} ({e}); start one with \
             `redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save \"\" \
             --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log` \
             or point IDEMGATE_TEST_REDIS_URL at one"
            )
        })
}

/// The suite and the model on `$path`, with `$query` added to the URL. Server clocks cannot be
/// moved, so the model runs without clock moves and with long leases.
macro_rules! on_path {
    ($module:ident, $path:expr, $query:expr) => {
        mod $module {
            use super::*;
            idemgate_conformance::store_conformance!(async {
                idemgate_conformance::Fixture::real(shared_store($path, $query).await)
            });
            idemgate_conformance::store_model_test!(
                async { idemgate_conformance::Fixture::real(shared_store($path, $query).await) },
                cases = 64
            );
        }
    };
}

on_path!(adaptive, ReservePath::Adaptive, "");
on_path!(insert_first, ReservePath::InsertFirst, "");
on_path!(read_first, ReservePath::ReadFirst, "");
on_path!(read_first_resp3, ReservePath::ReadFirst, "?protocol=resp3");

// A waiting caller (a Python thread in a call) does its round trips on a connection of its own,
// on its own thread (the store's direct.rs); the behaviours' spawned tasks keep the shared one.
mod waiting_caller {
    use super::*;
    idemgate_conformance::store_conformance!(waiting: async {
        idemgate_conformance::Fixture::real(shared_store(ReservePath::Adaptive, "").await)
    });
}

// Sealed (keys stored as HMACs, outcomes encrypted), the store answers the same.
mod sealed {
    use super::*;
    use idemgate_seal::testing;
    idemgate_conformance::store_conformance!(async {
        idemgate_conformance::Fixture::real(shared_store(ReservePath::Adaptive, "").await)
            .map(testing::sealed)
            .listing_keys_as(testing::stored_name)
    });
}

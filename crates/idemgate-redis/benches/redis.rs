//! Throughput of `Engine<RedisStore>` beside two baselines measured in the same rounds:
//! - `raw`: the store's own operations (`reserve`, `complete`) through the same store and
//!   connection, without the engine (what the engine adds; the targets are stated against it);
//!   like the engine's, its reservations read first once they mostly find a record;
//! - `floor`: plain commands on a connection of the same kind, what any idempotency layer on Redis
//!   must at least pay: a fresh call is `SET NX PX` then `SET PX` (two round trips, as the
//!   store's two scripts), a replay one `GET` (what the store's scripts and hash cost over it).
//!
//! `cargo bench -p idemgate-redis --bench redis` against `IDEMGATE_TEST_REDIS_URL` (default
//! `redis://127.0.0.1:6379`, volatile allowed), under a random key prefix deleted at the end.
//! Each figure is the median of `BENCH_ROUNDS` rounds (default 3) of `RUN` each, with the minimum
//! and maximum, raw and engine alternating; each ratio is the median of the rounds' paired
//! engine/raw ratios, which a noisy machine disturbs far less than either rate. `BENCH_CALLERS`
//! (1 or 16) runs only that many callers' rows, for a profiler.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idemgate_core::{
    Call, Claim, Decision, Effect, Engine, Fingerprint, IdempotencyKey, Key, Outcome, Reservation,
    Settings, Store, TenantId, ToolName,
};
use idemgate_redis::{RedisOptions, RedisStore};

const RUN: Duration = Duration::from_millis(1500);
const LEASE: Duration = Duration::from_secs(30);
const TTL: Duration = Duration::from_secs(600);
/// Completed keys per caller that the replay runs cycle through.
const REPLAY_KEYS: usize = 100;

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(bench());
}

async fn bench() {
    let url = std::env::var("IDEMGATE_TEST_REDIS_URL")
        .unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let mut b = [0u8; 6];
    getrandom::fill(&mut b).expect("randomness");
    let prefix = format!("idemgate-bench-{}:", idemgate_core::key::hex(&b));
    let options = RedisOptions {
        allow_volatile: true,
        key_prefix: prefix.clone(),
        ..RedisOptions::default()
    };
    let store = RedisStore::connect_with(&url, options)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "failed to reach redis at {url} ({e}); start one with `redis-server --daemonize yes \
                 --bind 127.0.0.1 -::1 --port 6379 --save \"\" --appendonly no --dir \
                 /var/lib/redis --logfile /var/log/redis/ci.log`"
            )
        });
    let engine = Arc::new(Engine::new(store.clone()));
    // The same engine without its replay cache: every replay asks the store.
    let uncached = Arc::new(Engine::new(store.clone()).with_settings(Settings {
        replay_cache: 0,
        ..Settings::default()
    }));
    // The floor's keys live under the bench's prefix too, so the cleanup deletes them.
    let prefix_floor: Arc<str> = format!("{prefix}floor:").into();
    let floor_conn = redis::Client::open(url.as_str())
        .expect("url")
        .get_connection_manager()
        .await
        .expect("the floor's connection");
    let tenant = TenantId::new("bench").unwrap();
    let tool = ToolName::new("charge").unwrap();
    let seq = Arc::new(AtomicU64::new(0));
    let fresh_key = {
        let (tenant, tool, seq) = (tenant.clone(), tool.clone(), seq.clone());
        move || {
            let n = seq.fetch_add(1, Ordering::Relaxed);
            Key::new(
                tenant.clone(),
                tool.clone(),
                IdempotencyKey::new(format!("k{n}")).unwrap(),
            )
        }
    };

    let rounds = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .unwrap_or(3)
        .max(1);
    println!(
        "idemgate-redis bench against {url} ({RUN:?} per run, median of {rounds} rounds, min-max)"
    );
    // `BENCH_CALLERS=1` (or `16`) runs that row alone, for a profiler.
    let only = std::env::var("BENCH_CALLERS").ok().map(|s| {
        s.parse::<usize>()
            .unwrap_or_else(|_| panic!("BENCH_CALLERS is a number of callers, not {s:?}"))
    });
    let mut misses = Vec::new();
    for callers in [1usize, 16] {
        if only.is_some_and(|n| n != callers) {
            continue;
        }
        // Completed keys for the replay runs, one set per caller.
        let mut replay_sets = Vec::new();
        for _ in 0..callers {
            let mut set = Vec::new();
            for _ in 0..REPLAY_KEYS {
                let key = fresh_key();
                let fp = Fingerprint::of_bytes(key.key.as_str().as_bytes());
                let r = Reservation::new(key.clone(), fp, LEASE);
                let Claim::Acquired(lease) = store.reserve(&r).await.expect("reserve") else {
                    panic!("fresh key taken");
                };
                store
                    .complete(&key, lease, &Outcome::success(b"ok".to_vec()), TTL)
                    .await
                    .expect("complete");
                let _: () = redis::cmd("SET")
                    .arg(format!("{prefix_floor}{}", key.key.as_str()))
                    .arg("ok")
                    .arg("PX")
                    .arg(TTL.as_millis() as u64)
                    .query_async(&mut floor_conn.clone())
                    .await
                    .expect("floor SET");
                set.push(key);
            }
            replay_sets.push(Arc::new(set));
        }

        let raw_fresh = {
            let (store, fresh_key) = (store.clone(), fresh_key.clone());
            move |_: usize, _: u64| {
                let (store, key) = (store.clone(), fresh_key());
                async move {
                    let fp = Fingerprint::of_bytes(key.key.as_str().as_bytes());
                    let r = Reservation::new(key.clone(), fp, LEASE);
                    let Claim::Acquired(lease) = store.reserve(&r).await.expect("reserve") else {
                        panic!("fresh key taken");
                    };
                    store
                        .complete(&key, lease, &Outcome::success(b"ok".to_vec()), TTL)
                        .await
                        .expect("complete");
                }
            }
        };
        let engine_fresh = {
            let (engine, fresh_key) = (engine.clone(), fresh_key.clone());
            move |_: usize, _: u64| {
                let (engine, key) = (engine.clone(), fresh_key());
                async move {
                    let fp = Fingerprint::of_bytes(key.key.as_str().as_bytes());
                    let call = Call::new(key.tenant, key.tool).key(key.key).fingerprint(fp);
                    let answer = engine
                        .call(call, || async { Effect::Success(b"ok".to_vec()) })
                        .await
                        .expect("call");
                    assert!(matches!(answer.decision, Decision::Executed { .. }));
                }
            }
        };
        // The floor: plain commands, each on the floor's own multiplexed connection.
        let floor_fresh = {
            let (conn, fresh_key, prefix) =
                (floor_conn.clone(), fresh_key.clone(), prefix_floor.clone());
            move |_: usize, _: u64| {
                let (mut conn, key, prefix_floor) = (conn.clone(), fresh_key(), prefix.clone());
                async move {
                    let name = format!("{prefix_floor}{}", key.key.as_str());
                    let set: Option<String> = redis::cmd("SET")
                        .arg(&name)
                        .arg("in-flight")
                        .arg("NX")
                        .arg("PX")
                        .arg(LEASE.as_millis() as u64)
                        .query_async(&mut conn)
                        .await
                        .expect("floor SET NX");
                    assert!(set.is_some(), "fresh floor key taken");
                    let _: () = redis::cmd("SET")
                        .arg(&name)
                        .arg("ok")
                        .arg("PX")
                        .arg(TTL.as_millis() as u64)
                        .query_async(&mut conn)
                        .await
                        .expect("floor SET");
                }
            }
        };
        let floor_replay = {
            let (conn, sets, prefix) = (
                floor_conn.clone(),
                replay_sets.clone(),
                prefix_floor.clone(),
            );
            move |caller: usize, i: u64| {
                let (mut conn, prefix_floor) = (conn.clone(), prefix.clone());
                let key = sets[caller][i as usize % REPLAY_KEYS].clone();
                async move {
                    let name = format!("{prefix_floor}{}", key.key.as_str());
                    let got: Option<String> = redis::cmd("GET")
                        .arg(&name)
                        .query_async(&mut conn)
                        .await
                        .expect("floor GET");
                    assert!(got.is_some(), "replay floor key missing");
                }
            }
        };
        let raw_replay = {
            let (store, sets) = (store.clone(), replay_sets.clone());
            move |caller: usize, i: u64| {
                let store = store.clone();
                let key = sets[caller][i as usize % REPLAY_KEYS].clone();
                async move {
                    let fp = Fingerprint::of_bytes(key.key.as_str().as_bytes());
                    let r = Reservation::new(key, fp, LEASE);
                    let claim = store.reserve(&r).await.expect("reserve");
                    assert!(matches!(claim, Claim::Existing(_)));
                }
            }
        };
        let engine_replay = |engine: Arc<Engine<RedisStore>>| {
            let sets = replay_sets.clone();
            move |caller: usize, i: u64| {
                let engine = engine.clone();
                let key = sets[caller][i as usize % REPLAY_KEYS].clone();
                async move {
                    let fp = Fingerprint::of_bytes(key.key.as_str().as_bytes());
                    let call = Call::new(key.tenant, key.tool).key(key.key).fingerprint(fp);
                    let answer = engine
                        .call(call, || async { Effect::Success(b"never".to_vec()) })
                        .await
                        .expect("call");
                    assert!(matches!(answer.decision, Decision::Replayed { .. }));
                }
            }
        };
        let (cached_replay, store_replay) = (
            engine_replay(engine.clone()),
            engine_replay(uncached.clone()),
        );

        // Per round: raw, engine and floor rates of each work, in the order measured.
        let (mut fresh, mut replay, mut replay_store) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            let floor = measure(callers, floor_fresh.clone()).await;
            let raw = measure(callers, raw_fresh.clone()).await;
            fresh.push([raw, measure(callers, engine_fresh.clone()).await, floor]);
            let floor = measure(callers, floor_replay.clone()).await;
            let raw = measure(callers, raw_replay.clone()).await;
            replay.push([raw, measure(callers, cached_replay.clone()).await, floor]);
            replay_store.push([raw, measure(callers, store_replay.clone()).await, floor]);
        }
        let target = if callers == 1 { 0.9 } else { 1.0 };
        for (what, runs) in [
            ("fresh calls", fresh),
            ("replays", replay),
            ("replays*", replay_store),
        ] {
            let raw = spread(runs.iter().map(|r| r[0]).collect());
            let eng = spread(runs.iter().map(|r| r[1]).collect());
            let ratio = spread(runs.iter().map(|r| r[1] / r[0]).collect());
            let floor = spread(runs.iter().map(|r| r[2]).collect());
            let of_floor = spread(runs.iter().map(|r| r[1] / r[2]).collect());
            let reached = ratio.median >= target;
            if !reached {
                misses.push(format!(
                    "{what} at {callers} caller(s): {:.2}x",
                    ratio.median
                ));
            }
            println!(
                "{callers:>2} caller(s) {what:<11}: engine {:>8.0}/s ({:.0}-{:.0})  raw {:>8.0}/s \
                 ({:.0}-{:.0})  engine/raw {:.2}x ({:.2}-{:.2}) (target >= {target:.1}x: {})  \
                 floor {:>8.0}/s ({:.0}-{:.0})  engine/floor {:.2}x ({:.2}-{:.2})",
                eng.median,
                eng.min,
                eng.max,
                raw.median,
                raw.min,
                raw.max,
                ratio.median,
                ratio.min,
                ratio.max,
                if reached { "reached" } else { "missed" },
                floor.median,
                floor.min,
                floor.max,
                of_floor.median,
                of_floor.min,
                of_floor.max,
            );
        }
    }
    println!(
        "replays: the engine as configured by default, its replay cache answering; \
         replays*: the replay cache off, every replay asks the store"
    );
    if misses.is_empty() {
        println!("all targets reached");
    } else {
        println!("targets missed: {}", misses.join(", "));
    }
    cleanup(&url, &prefix).await;
}

/// Operations per second of `op` run back to back by `callers` tasks for [`RUN`].
async fn measure<F, Fut>(callers: usize, op: F) -> f64
where
    F: Fn(usize, u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let start = Instant::now();
    let deadline = start + RUN;
    let tasks: Vec<_> = (0..callers)
        .map(|caller| {
            let op = op.clone();
            tokio::spawn(async move {
                let mut n = 0u64;
                while Instant::now() < deadline {
                    op(caller, n).await;
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.expect("caller");
    }
    total as f64 / start.elapsed().as_secs_f64()
}

/// Deletes the bench's own keys (never a flush of the shared server).
async fn cleanup(url: &str, prefix: &str) {
    let client = redis::Client::open(url).expect("url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let mut cursor: u64 = 0;
    loop {
        let (next, names): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .expect("scan");
        if !names.is_empty() {
            let _: i64 = redis::cmd("UNLINK")
                .arg(&names)
                .query_async(&mut conn)
                .await
                .expect("unlink");
        }
        if next == 0 {
            return;
        }
        cursor = next;
    }
}

/// The median, minimum and maximum of some figures.
struct Spread {
    median: f64,
    min: f64,
    max: f64,
}

fn spread(mut v: Vec<f64>) -> Spread {
    v.sort_by(f64::total_cmp);
    Spread {
        median: v[v.len() / 2],
        min: v[0],
        max: v[v.len() - 1],
    }
}

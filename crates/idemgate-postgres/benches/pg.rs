//! Engine calls per second through `Engine<PgStore>` beside two baselines measured in the same
//! run, through the same driver and pool:
//! - `floor`: what any idempotency layer must at least pay, the plain statements on a table of the
//!   same shape: a fresh call is `INSERT … ON CONFLICT DO NOTHING RETURNING` then `UPDATE`, each
//!   its own commit; a replay is one `SELECT` by primary key. The goals are stated against it.
//! - `raw`: the store's own statements without the engine (what the engine adds on top of them).
//!
//! `cargo bench -p idemgate-postgres --bench pg` (server: `IDEMGATE_TEST_POSTGRES_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`; schema `idemgate_bench`, dropped at the end).
//! `BENCH_ROUNDS` sets the rounds (default 3); `BENCH_CALLERS` (1 or 16) and `BENCH_WORK`
//! (`fresh`, `replay`, `replay*`) run only those rows, for a profiler.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idemgate_core::{
    Call, Effect, Engine, Fingerprint, IdempotencyKey, LeaseToken, Settings, TenantId, ToolName,
};
use idemgate_postgres::{PgOptions, PgStore};

const CELL: Duration = Duration::from_millis(1500);
/// Rounds per cell by default, the three sides rotating; the median is reported (the machine is
/// shared).
const ROUNDS: usize = 3;
const SCHEMA: &str = "idemgate_bench";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Work {
    Fresh,
    /// Replays through the engine as configured by default (its replay cache answers them).
    Replay,
    /// Replays through an engine without the replay cache: every replay asks the store.
    ReplayFromStore,
}

fn call(tenant: &TenantId, key: &str) -> Call {
    Call::new(tenant.clone(), ToolName::new("bench").unwrap())
        .key(IdempotencyKey::new(key).unwrap())
        .fingerprint(Fingerprint::of_bytes(b"{}"))
}

/// Calls per second of `callers` tasks running `one(caller, i)` for [`CELL`].
async fn measure<F, Fut>(callers: usize, one: F) -> f64
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let one = Arc::new(one);
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|c| {
            let (one, done) = (one.clone(), done.clone());
            tokio::spawn(async move {
                let mut i = 0;
                while start.elapsed() < CELL {
                    one(c, i).await;
                    i += 1;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

async fn engine_cell(engine: Arc<Engine<PgStore>>, run: u64, callers: usize, work: Work) -> f64 {
    let tenant = TenantId::new(format!("e{run}")).unwrap();
    measure(callers, move |c, i| {
        let (engine, tenant) = (engine.clone(), tenant.clone());
        async move {
            let key = match work {
                Work::Fresh => format!("f{callers}-{c}-{i}"),
                Work::Replay | Work::ReplayFromStore => format!("r{c}"),
            };
            let a = engine
                .call(call(&tenant, &key), || async {
                    Effect::Success(b"result".to_vec())
                })
                .await
                .expect("engine call");
            assert_eq!(a.executed_here(), work == Work::Fresh);
        }
    })
    .await
}

async fn raw_cell(store: PgStore, run: u64, callers: usize, work: Work) -> f64 {
    let quoted = format!("\"{SCHEMA}\"");
    let lookup = Arc::new(include_str!("../src/sql/get.sql").replace("{schema}", &quoted));
    let reserve = Arc::new(include_str!("../src/sql/insert.sql").replace("{schema}", &quoted));
    let complete = Arc::new(include_str!("../src/sql/complete.sql").replace("{schema}", &quoted));
    let tenant = format!("r{run}");
    measure(callers, move |c, i| {
        let (store, lookup, reserve, complete, tenant) = (
            store.clone(),
            lookup.clone(),
            reserve.clone(),
            complete.clone(),
            tenant.clone(),
        );
        async move {
            let key = match work {
                Work::Fresh => format!("f{callers}-{c}-{i}"),
                Work::Replay | Work::ReplayFromStore => format!("r{c}"),
            };
            let fp = Fingerprint::of_bytes(b"{}");
            let token = LeaseToken::mint().0.to_be_bytes();
            let lease_ms: i64 = 30_000;
            let client = store.pool().get().await.expect("pool");
            // The statements the store settles on for each kind of work: a replay is a plain
            // read, a fresh call the insert, then the completion.
            let written = if work == Work::Fresh {
                let stmt = client.prepare_cached(&reserve).await.expect("prepare");
                let rows = client
                    .query(
                        &stmt,
                        &[
                            &tenant.as_str(),
                            &"bench",
                            &key.as_str(),
                            &fp.as_bytes().as_slice(),
                            &token.as_slice(),
                            &lease_ms,
                            &None::<&str>,
                        ],
                    )
                    .await
                    .expect("reserve");
                Some(rows)
            } else {
                let stmt = client.prepare_cached(&lookup).await.expect("prepare");
                let name: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
                    [&tenant.as_str(), &"bench", &key.as_str()];
                let found = client.query(&stmt, &name).await.expect("lookup");
                assert_eq!(found.len(), 1, "the replayed record");
                None
            };
            if let Some(rows) = &written {
                let row = rows.first().expect("a fresh key was taken");
                let fence: i64 = row.get("fence");
                let stmt = client.prepare_cached(&complete).await.expect("prepare");
                let digest = idemgate_core::key::hex(&[0; 32]);
                let ttl_ms: i64 = 3_600_000;
                let tombstone_ms: i64 = 0;
                client
                    .query(
                        &stmt,
                        &[
                            &tenant.as_str(),
                            &"bench",
                            &key.as_str(),
                            &fence,
                            &token.as_slice(),
                            &ttl_ms,
                            &0i16,
                            &b"result".as_slice(),
                            &digest,
                            &None::<i64>,
                            &tombstone_ms,
                        ],
                    )
                    .await
                    .expect("complete");
            }
        }
    })
    .await
}

/// The floor table: the records table's columns, none of its statements' extras.
const FLOOR_TABLE: &str = "CREATE TABLE IF NOT EXISTS \"idemgate_bench\".floor_records (
    tenant text NOT NULL, tool text NOT NULL, key text NOT NULL, fingerprint bytea NOT NULL,
    token bytea NOT NULL, state smallint NOT NULL, lease_until bigint, completed_at bigint,
    expires_at bigint, outcome_body bytea, PRIMARY KEY (tenant, tool, key))";
const FLOOR_INSERT: &str = "INSERT INTO \"idemgate_bench\".floor_records
    (tenant, tool, key, fingerprint, token, state, lease_until) VALUES ($1, 'bench', $2, $3, $4, 0,
    floor(extract(epoch FROM now()) * 1000)::bigint + 30000) ON CONFLICT DO NOTHING RETURNING 1";
const FLOOR_UPDATE: &str = "UPDATE \"idemgate_bench\".floor_records SET state = 1,
    completed_at = floor(extract(epoch FROM now()) * 1000)::bigint,
    expires_at = floor(extract(epoch FROM now()) * 1000)::bigint + 3600000, outcome_body = $4,
    lease_until = NULL WHERE tenant = $1 AND tool = 'bench' AND key = $2 AND token = $3";
const FLOOR_SELECT: &str = "SELECT state, outcome_body FROM \"idemgate_bench\".floor_records
    WHERE tenant = $1 AND tool = 'bench' AND key = $2";

async fn floor_cell(store: PgStore, run: u64, callers: usize, work: Work) -> f64 {
    let tenant = format!("p{run}");
    if work != Work::Fresh {
        // The records the replays read, one per caller.
        let client = store.pool().get().await.expect("pool");
        for c in 0..callers {
            let key = format!("r{c}");
            client
                .execute(
                    FLOOR_INSERT,
                    &[
                        &tenant.as_str(),
                        &key.as_str(),
                        &&[0u8; 32][..],
                        &&[0u8; 16][..],
                    ],
                )
                .await
                .expect("floor insert");
            client
                .execute(
                    FLOOR_UPDATE,
                    &[
                        &tenant.as_str(),
                        &key.as_str(),
                        &&[0u8; 16][..],
                        &&b"result"[..],
                    ],
                )
                .await
                .expect("floor update");
        }
    }
    measure(callers, move |c, i| {
        let (store, tenant) = (store.clone(), tenant.clone());
        async move {
            let client = store.pool().get().await.expect("pool");
            let fp = Fingerprint::of_bytes(b"{}");
            if work == Work::Fresh {
                let key = format!("f{callers}-{c}-{i}");
                let token = LeaseToken::mint().0.to_be_bytes();
                let insert = client.prepare_cached(FLOOR_INSERT).await.expect("prepare");
                let rows = client
                    .query(
                        &insert,
                        &[
                            &tenant.as_str(),
                            &key.as_str(),
                            &fp.as_bytes().as_slice(),
                            &token.as_slice(),
                        ],
                    )
                    .await
                    .expect("floor insert");
                assert_eq!(rows.len(), 1, "a fresh key");
                let update = client.prepare_cached(FLOOR_UPDATE).await.expect("prepare");
                client
                    .execute(
                        &update,
                        &[
                            &tenant.as_str(),
                            &key.as_str(),
                            &token.as_slice(),
                            &b"result".as_slice(),
                        ],
                    )
                    .await
                    .expect("floor update");
            } else {
                let key = format!("r{c}");
                let select = client.prepare_cached(FLOOR_SELECT).await.expect("prepare");
                let row = client
                    .query_one(&select, &[&tenant.as_str(), &key.as_str()])
                    .await
                    .expect("floor select");
                assert_eq!(row.get::<_, i16>("state"), 1);
            }
        }
    })
    .await
}

/// The value of the environment variable `name`, parsed, if set.
fn env_knob<T: std::str::FromStr>(name: &str, what: &str) -> Option<T> {
    let v = std::env::var(name).ok()?;
    Some(
        v.parse()
            .unwrap_or_else(|_| panic!("{name} is {what}, not {v:?}")),
    )
}

fn work_name(work: Work) -> &'static str {
    match work {
        Work::Fresh => "fresh",
        Work::Replay => "replay",
        Work::ReplayFromStore => "replay*",
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let rounds: usize = env_knob("BENCH_ROUNDS", "a number of rounds").unwrap_or(ROUNDS);
    let only_callers: Option<usize> = env_knob("BENCH_CALLERS", "a number of callers (1 or 16)");
    let only_work: Option<String> = env_knob("BENCH_WORK", "fresh, replay or replay*");
    rt.block_on(async {
        let url = std::env::var("IDEMGATE_TEST_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
        let store = PgStore::connect_with(
            &url,
            PgOptions {
                schema: SCHEMA.to_owned(),
                pool_size: 16,
                ..PgOptions::default()
            },
        )
        .await
        .unwrap_or_else(|e| {
            panic!(
                "failed to connect to {url}: {e}; start it with: pg_ctlcluster \
                 --skip-systemctl-redirect $(ls /etc/postgresql) main start"
            )
        });
        let engine = Arc::new(Engine::new(store.clone()));
        let uncached = Arc::new(Engine::new(store.clone()).with_settings(Settings {
            replay_cache: 0,
            ..Settings::default()
        }));
        let run = u64::from(LeaseToken::mint().0 as u16);
        // Replays need completed records: one per caller, for both sides, in every round.
        for (c, round) in (0..16).flat_map(|c| (0..rounds as u64).map(move |r| (c, r))) {
            let run = run * 10 + round;
            let t = TenantId::new(format!("e{run}")).unwrap();
            engine
                .call(call(&t, &format!("r{c}")), || async {
                    Effect::Success(b"result".to_vec())
                })
                .await
                .unwrap();
            let t = TenantId::new(format!("r{run}")).unwrap();
            engine
                .call(call(&t, &format!("r{c}")), || async {
                    Effect::Success(b"result".to_vec())
                })
                .await
                .unwrap();
        }
        store
            .pool()
            .get()
            .await
            .unwrap()
            .batch_execute(FLOOR_TABLE)
            .await
            .expect("create the floor table");
        println!(
            "idemgate-postgres bench: {CELL:?} per cell, median of {rounds} rounds (min-max), \
             server {url}"
        );
        println!(
            "{:>7}  {:<8}  {:>20}  {:>20}  {:>20}  {:>11}  {:>9}  goal",
            "callers", "work", "engine/s", "raw/s", "floor/s", "engine/floor", "raw/floor"
        );
        for callers in [1usize, 16] {
            for work in [Work::Fresh, Work::Replay, Work::ReplayFromStore] {
                if only_callers.is_some_and(|n| n != callers)
                    || only_work.as_ref().is_some_and(|w| w != work_name(work))
                {
                    continue;
                }
                let engine = if work == Work::ReplayFromStore { &uncached } else { &engine };
                // Rotate the order so that no side always runs on a warmer server.
                let (mut engs, mut raws, mut floors) = (Vec::new(), Vec::new(), Vec::new());
                for round in 0..rounds as u64 {
                    let tag = run * 10 + round;
                    for side in 0..3 {
                        match (side + round) % 3 {
                            0 => raws.push(raw_cell(store.clone(), tag, callers, work).await),
                            1 => engs.push(engine_cell(engine.clone(), tag, callers, work).await),
                            _ => floors.push(floor_cell(store.clone(), tag, callers, work).await),
                        }
                    }
                }
                let cell = |v: &[f64]| {
                    format!(
                        "{:.0} ({:.0}-{:.0})",
                        median(v.to_vec()),
                        v.iter().copied().fold(f64::INFINITY, f64::min),
                        v.iter().copied().fold(0.0, f64::max)
                    )
                };
                let (eng, raw1, floor) =
                    (median(engs.clone()), median(raws.clone()), median(floors.clone()));
                let goal = if callers == 1 { 0.9 } else { 0.8 };
                let ratio = eng / floor;
                println!(
                    "{callers:>7}  {:<8}  {:>20}  {:>20}  {:>20}  {ratio:>11.2}  {:>9.2}  >= {goal:.1}: {}",
                    work_name(work),
                    cell(&engs),
                    cell(&raws),
                    cell(&floors),
                    raw1 / floor,
                    if ratio >= goal { "reached" } else { "missed" }
                );
            }
        }
        println!(
            "replay: the engine as configured by default, its replay cache answering; \
             replay*: the replay cache off, every replay asks the store. floor: plain statements \
             on a table of the same shape (fresh: INSERT ON CONFLICT DO NOTHING, then UPDATE; \
             replay: SELECT)"
        );
        let client = store.pool().get().await.unwrap();
        client
            .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{SCHEMA}\" CASCADE"))
            .await
            .unwrap();
    });
}

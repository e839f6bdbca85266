//! Fresh engine calls per second on the SQLite store at 1 and 16 concurrent callers, beside a raw
//! SQLite baseline measured in the same run: per call an `INSERT OR IGNORE` (the reservation) and an
//! `UPDATE` (the completion), each its own commit, with the store's own pragmas (WAL,
//! `synchronous=FULL`, busy timeout) applied by the same function.
//!
//! `cargo bench -p idemgate-sqlite --bench sqlite`; `BENCH_SECONDS` sets the time per cell
//! (default 3), `BENCH_ROUNDS` the rounds (default 3), `BENCH_CALLERS` runs only the row of that
//! many callers (1 or 16), and `BENCH_DURABILITY=normal` runs both
//! sides at `synchronous=NORMAL`, which leaves out the fsyncs and so shows the engine's own cost.
//! The ratio is the median of each round's engine/raw ratio: the two run back to back, so a
//! round's ratio is far steadier on a noisy disk than either rate. The database files live in a
//! temporary directory under the system's temp dir, so fsync cost is that of the disk behind it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idemgate_core::{Call, Effect, Engine, Fingerprint, IdempotencyKey, TenantId, ToolName};
use idemgate_sqlite::rusqlite::{params, Connection};
use idemgate_sqlite::{apply_pragmas, Durability, SqliteOptions, SqliteStore};

fn options() -> SqliteOptions {
    let durability = match std::env::var("BENCH_DURABILITY").as_deref() {
        Ok("normal") => Durability::Normal,
        Ok("full") | Err(_) => Durability::Full,
        Ok(other) => panic!("BENCH_DURABILITY is full or normal, not {other:?}"),
    };
    SqliteOptions {
        durability,
        ..SqliteOptions::default()
    }
}

/// `round` goes into every key, so that each round's calls are fresh on the file it shares with
/// the earlier rounds.
fn raw(path: &std::path::Path, callers: usize, budget: Duration, round: usize) -> f64 {
    let opts = options();
    {
        let conn = Connection::open(path).unwrap();
        apply_pragmas(&conn, &opts).unwrap();
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS raw_calls (
                 tenant TEXT NOT NULL, tool TEXT NOT NULL, key TEXT NOT NULL,
                 fingerprint BLOB NOT NULL, state INTEGER NOT NULL, body BLOB,
                 PRIMARY KEY (tenant, tool, key))",
        )
        .unwrap();
    }
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let threads: Vec<_> = (0..callers)
        .map(|t| {
            let (done, stop, opts) = (done.clone(), stop.clone(), opts.clone());
            let path = path.to_owned();
            std::thread::spawn(move || {
                let conn = Connection::open(&path).unwrap();
                apply_pragmas(&conn, &opts).unwrap();
                let fp = [7u8; 32];
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("raw-{round}-{t}-{i}");
                    i += 1;
                    let inserted = conn
                        .prepare_cached(
                            "INSERT OR IGNORE INTO raw_calls (tenant, tool, key, fingerprint, state)
                             VALUES ('bench', 'charge', ?1, ?2, 0)",
                        )
                        .unwrap()
                        .execute(params![key, fp])
                        .unwrap();
                    if inserted == 1 {
                        conn.prepare_cached(
                            "UPDATE raw_calls SET state = 1, body = ?2
                             WHERE tenant = 'bench' AND tool = 'charge' AND key = ?1",
                        )
                        .unwrap()
                        .execute(params![key, b"ok".as_slice()])
                        .unwrap();
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    std::thread::sleep(budget);
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

/// What one engine cell measured.
struct EngineRun {
    calls_per_second: f64,
    writes_per_commit: f64,
    writes_per_call: f64,
}

/// Keys carry `round`, as in [`raw`].
fn engine(path: &std::path::Path, callers: usize, budget: Duration, round: usize) -> EngineRun {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = SqliteStore::open(path, options()).unwrap();
        let engine = Arc::new(Engine::new(store.clone()));
        let before = store.writer_stats();
        let done = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let start = Instant::now();
        let tasks: Vec<_> = (0..callers)
            .map(|t| {
                let (engine, done, stop) = (engine.clone(), done.clone(), stop.clone());
                tokio::spawn(async move {
                    let tenant = TenantId::new("bench").unwrap();
                    let tool = ToolName::new("charge").unwrap();
                    let fp = Fingerprint::of_bytes(b"args");
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let key = IdempotencyKey::new(format!("eng-{round}-{t}-{i}")).unwrap();
                        i += 1;
                        let call = Call::new(tenant.clone(), tool.clone())
                            .key(key)
                            .fingerprint(fp);
                        engine
                            .call(call, || async { Effect::Success(b"ok".to_vec()) })
                            .await
                            .unwrap();
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        tokio::time::sleep(budget).await;
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            t.await.unwrap();
        }
        let calls = done.load(Ordering::Relaxed);
        let after = store.writer_stats();
        let writes = (after.operations - before.operations) as f64;
        EngineRun {
            calls_per_second: calls as f64 / start.elapsed().as_secs_f64(),
            writes_per_commit: writes / (after.batches - before.batches).max(1) as f64,
            writes_per_call: writes / calls.max(1) as f64,
        }
    })
}

/// The median of `v`, and its minimum and maximum, formatted.
fn spread(v: &[f64]) -> (f64, String) {
    let mut sorted = v.to_vec();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    (
        median,
        format!(
            "{median:.0} ({:.0}-{:.0})",
            sorted[0],
            sorted[sorted.len() - 1]
        ),
    )
}

/// The median of per-round ratios, and their minimum and maximum, formatted.
fn ratio_spread(v: &[f64]) -> String {
    let mut sorted = v.to_vec();
    sorted.sort_by(f64::total_cmp);
    format!(
        "{:.2}x ({:.2}-{:.2})",
        sorted[sorted.len() / 2],
        sorted[0],
        sorted[sorted.len() - 1]
    )
}

fn main() {
    let env = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(default)
    };
    let budget = Duration::from_secs(env("BENCH_SECONDS", 3));
    let rounds = env("BENCH_ROUNDS", 3).max(1) as usize;
    let dir = tempfile::tempdir().unwrap();
    println!(
        "# SQLite fresh calls: engine (grouped commits) vs raw per-call commits, {:?}, \
         {}s per cell, median of {rounds} rounds (min-max), engine and raw alternating",
        options().durability,
        budget.as_secs()
    );
    println!(
        "{:>8} {:>20} {:>20} {:>20} {:>14} {:>12}",
        "callers", "engine/s", "raw/s", "ratio", "writes/commit", "writes/call"
    );
    // `BENCH_CALLERS=1` (or `16`) runs one row alone, for a profiler.
    let only = std::env::var("BENCH_CALLERS").ok().map(|s| {
        s.parse::<usize>()
            .unwrap_or_else(|_| panic!("BENCH_CALLERS is a number of callers, not {s:?}"))
    });
    let mut raw_single = 0.0;
    for callers in [1usize, 16] {
        if only.is_some_and(|n| n != callers) {
            continue;
        }
        let (mut raws, mut engines, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        let (mut per_commit, mut per_call) = (0.0, 0.0);
        let raw_db = dir.path().join(format!("raw-{callers}.db"));
        let engine_db = dir.path().join(format!("engine-{callers}.db"));
        for round in 0..rounds {
            // Alternate which side runs first, so that neither always meets a warmer disk.
            if round % 2 == 0 {
                raws.push(raw(&raw_db, callers, budget, round));
            }
            let run = engine(&engine_db, callers, budget, round);
            engines.push(run.calls_per_second);
            per_commit = run.writes_per_commit;
            per_call = run.writes_per_call;
            if round % 2 == 1 {
                raws.push(raw(&raw_db, callers, budget, round));
            }
            ratios.push(run.calls_per_second / raws[round]);
        }
        let (raw_rate, raw_cell) = spread(&raws);
        let (engine_rate, engine_cell) = spread(&engines);
        let ratio_cell = ratio_spread(&ratios);
        if callers == 1 {
            raw_single = raw_rate;
        }
        println!(
            "{callers:>8} {engine_cell:>20} {raw_cell:>20} {ratio_cell:>20} {per_commit:>14.1} \
             {per_call:>12.2}"
        );
        if callers == 16 && raw_single > 0.0 {
            println!(
                "engine at 16 callers vs raw per-call baseline at 1 caller: {:.2}x",
                engine_rate / raw_single
            );
        }
    }
}

//! Throughput of the engine's own work on the memory store: fingerprinting, fresh calls and
//! replays, beside the raw store (reserve + complete without the engine) measured in the same run.
//!
//! A plain bench binary: `cargo bench -p idemgate-core --bench engine [-- SECTION...]`, sections
//! `fingerprint`, `raw`, `fresh`, `replay` (default: all). `BENCH_SECONDS` sets the time per row
//! (default 3) for fingerprints; `BENCH_CALLS` the calls per run (default: runs of 100,000 and of
//! 1,000,000). Calls run on a current-thread runtime: one core.

use std::hint::black_box;
use std::time::{Duration, Instant};

use idemgate_core::{
    Call, Claim, Effect, Engine, Fingerprint, IdempotencyKey, Key, MemoryStore, Outcome,
    Reservation, Store, TenantId, ToolName,
};

/// Runs `batch` (which does 1,000 operations) until `budget` is spent; returns operations/s.
fn rate(budget: Duration, mut batch: impl FnMut()) -> f64 {
    let start = Instant::now();
    let mut done = 0u64;
    while start.elapsed() < budget {
        batch();
        done += 1000;
    }
    done as f64 / start.elapsed().as_secs_f64()
}

fn args_1kib() -> serde_json::Value {
    let items: Vec<_> = (0..12)
        .map(|i| {
            serde_json::json!({
                "sku": format!("SKU-{i:05}"),
                "quantity": i * 3 + 1,
                "unit_price_cents": 1999 + i * 7,
                "note": "gift wrap, deliver after 5pm",
            })
        })
        .collect();
    serde_json::json!({ "customer_id": 981_273_645_u64, "currency": "EUR", "items": items })
}

struct Bench {
    rt: tokio::runtime::Runtime,
    tenant: TenantId,
    tool: ToolName,
    fp: Fingerprint,
    keys: Vec<IdempotencyKey>,
}

impl Bench {
    fn key(&self, i: usize) -> IdempotencyKey {
        self.keys[i % self.keys.len()].clone()
    }

    /// `calls` reserve + complete pairs on a new store, without the engine; operations/s.
    fn raw(&self, calls: usize) -> f64 {
        let store = MemoryStore::new();
        let start = Instant::now();
        for i in 0..calls {
            let key = Key::new(self.tenant.clone(), self.tool.clone(), self.key(i));
            let r = Reservation::new(key, self.fp, Duration::from_secs(30));
            run_ready(async {
                if let Claim::Acquired(lease) = store.reserve(&r).await.unwrap() {
                    let outcome = Outcome::success(b"ok".to_vec());
                    let ttl = Duration::from_secs(3600);
                    black_box(store.complete(&r.key, lease, &outcome, ttl).await.unwrap());
                }
            });
        }
        let rate = calls as f64 / start.elapsed().as_secs_f64();
        drop(store);
        rate
    }

    /// `calls` engine calls cycling over `distinct` keys; operations/s.
    fn engine(&self, engine: &Engine<MemoryStore>, calls: usize, distinct: usize) -> f64 {
        self.rt.block_on(async {
            let start = Instant::now();
            for i in 0..calls {
                let call = Call::new(self.tenant.clone(), self.tool.clone())
                    .key(self.key(i % distinct))
                    .fingerprint(self.fp);
                let answer = engine
                    .call(call, || async { Effect::Success(b"ok".to_vec()) })
                    .await;
                black_box(answer.unwrap());
            }
            calls as f64 / start.elapsed().as_secs_f64()
        })
    }
}

fn main() {
    let sections: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let want = |s: &str| sections.is_empty() || sections.iter().any(|x| x == s);
    let budget = Duration::from_secs(
        std::env::var("BENCH_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(3),
    );
    let args = args_1kib();
    let text = serde_json::to_vec(&args).unwrap();
    println!(
        "# idemgate-core engine benchmark: {}s per row, one core",
        budget.as_secs()
    );
    if want("fingerprint") {
        let by_value = rate(budget, || {
            for _ in 0..1000 {
                black_box(Fingerprint::of_json(black_box(&args)));
            }
        });
        let by_text = rate(budget, || {
            for _ in 0..1000 {
                black_box(Fingerprint::of_json_text(black_box(&text)).unwrap());
            }
        });
        println!(
            "fingerprint, {} B object (value)   {by_value:>12.0} /s",
            text.len()
        );
        println!(
            "fingerprint, {} B object (text)    {by_text:>12.0} /s",
            text.len()
        );
    }
    // Every fresh call leaves a record, so the store grows by a record per call: at a million
    // records the map no longer fits in cache and growing it dominates (raw and engine alike).
    // Both sizes are reported, each run on a new store; BENCH_CALLS picks one size instead.
    let sizes: Vec<usize> = match std::env::var("BENCH_CALLS")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        Some(n) => vec![n],
        None => vec![100_000, 1_000_000],
    };
    let bench = Bench {
        rt: tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap(),
        tenant: TenantId::new("bench").unwrap(),
        tool: ToolName::new("charge").unwrap(),
        fp: Fingerprint::of_json(&args),
        keys: (0..*sizes.iter().max().unwrap() as u64)
            .map(|i| IdempotencyKey::new(format!("k{i}")).unwrap())
            .collect(),
    };
    for &calls in &sizes {
        // Raw and engine runs alternate, best of three: the machine is shared and noisy.
        if want("raw") || want("fresh") {
            let (mut raw, mut fresh) = (0f64, 0f64);
            for _ in 0..3 {
                if want("raw") {
                    raw = raw.max(bench.raw(calls));
                }
                if want("fresh") {
                    let engine = Engine::new(MemoryStore::new());
                    fresh = fresh.max(bench.engine(&engine, calls, usize::MAX));
                }
            }
            println!(
                "runs of {calls} fresh calls (the store grows to {calls} records), best of 3:"
            );
            if want("raw") {
                println!("  raw memory store reserve+complete   {raw:>12.0} /s");
            }
            if want("fresh") {
                let ratio = if raw > 0.0 {
                    format!("   {:.2}x raw", fresh / raw)
                } else {
                    String::new()
                };
                println!("  engine fresh calls                  {fresh:>12.0} /s{ratio}");
            }
        }
    }
    if want("replay") {
        let engine = Engine::new(MemoryStore::new());
        bench.engine(&engine, 10_000, 10_000); // fills the 10,000 records
        let calls = sizes[0];
        let replays = (0..3)
            .map(|_| bench.engine(&engine, calls, 10_000))
            .fold(0f64, f64::max);
        println!(
            "engine replays over 10,000 records (replay cache on), best of 3: {replays:>12.0} /s"
        );
    }
}

/// Drives a future that never waits (the memory store never does) to completion in place.
fn run_ready(fut: impl std::future::Future<Output = ()>) {
    let mut fut = std::pin::pin!(fut);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    while fut.as_mut().poll(&mut cx).is_pending() {}
}

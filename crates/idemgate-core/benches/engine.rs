//! Throughput of the engine's own work, on the memory store: fingerprinting, fresh calls and
//! replays. A plain bench binary (no harness): `cargo bench -p idemgate-core --bench engine`.
//!
//! Fresh calls and replays run on a current-thread runtime, i.e. on one core. The raw baseline is
//! the memory store's reserve + complete without the engine, measured in the same run.

use std::hint::black_box;
use std::time::{Duration, Instant};

use idemgate_core::{
    Call, Claim, Effect, Engine, Fingerprint, IdempotencyKey, Key, MemoryStore, Outcome,
    Reservation, Store, TenantId, ToolName,
};

/// Runs `f` in batches until `budget` is spent; returns operations per second.
fn rate(budget: Duration, mut f: impl FnMut(u64) -> u64) -> f64 {
    let start = Instant::now();
    let mut done = 0u64;
    while start.elapsed() < budget {
        done += f(done);
    }
    done as f64 / start.elapsed().as_secs_f64()
}

fn args_1kib() -> serde_json::Value {
    let mut items = Vec::new();
    for i in 0..12 {
        items.push(serde_json::json!({
            "sku": format!("SKU-{i:05}"),
            "quantity": i * 3 + 1,
            "unit_price_cents": 1999 + i * 7,
            "note": "gift wrap, deliver after 5pm",
        }));
    }
    serde_json::json!({ "customer_id": 981_273_645_u64, "currency": "EUR", "items": items })
}

fn main() {
    let budget = Duration::from_secs(
        std::env::var("BENCH_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(3),
    );
    let args = args_1kib();
    let text = serde_json::to_vec(&args).unwrap();
    println!(
        "# idemgate-core engine benchmark ({}s per row, 1 core)",
        budget.as_secs()
    );
    println!("argument object: {} bytes of JSON", text.len());

    let fp_value = rate(budget, |_| {
        for _ in 0..1000 {
            black_box(Fingerprint::of_json(black_box(&args)));
        }
        1000
    });
    let fp_text = rate(budget, |_| {
        for _ in 0..1000 {
            black_box(Fingerprint::of_json_text(black_box(&text)).unwrap());
        }
        1000
    });
    println!("fingerprint 1 KiB (JSON value)   {:>12.0} /s", fp_value);
    println!("fingerprint 1 KiB (raw text)     {:>12.0} /s", fp_text);

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let tenant = TenantId::new("bench").unwrap();
    let tool = ToolName::new("charge").unwrap();
    let fp = Fingerprint::of_json(&args);
    let keys: Vec<IdempotencyKey> = (0..4_000_000u64)
        .map(|i| IdempotencyKey::new(format!("k{i}")).unwrap())
        .collect();

    // Raw store baseline: reserve + complete, no engine.
    let raw_store = MemoryStore::new();
    let mut next = 0usize;
    let raw = rt.block_on(async {
        rate(budget, |_| {
            for _ in 0..1000 {
                let key = Key::new(
                    tenant.clone(),
                    tool.clone(),
                    keys[next % keys.len()].clone(),
                );
                next += 1;
                let r = Reservation::new(key, fp, Duration::from_secs(30));
                let fut = async {
                    if let Claim::Acquired(lease) = raw_store.reserve(&r).await.unwrap() {
                        raw_store
                            .complete(
                                &r.key,
                                lease,
                                &Outcome::success(b"ok".to_vec()),
                                Duration::from_secs(3600),
                            )
                            .await
                            .unwrap();
                    }
                };
                futures_lite_block(fut);
            }
            1000
        })
    });

    let engine = Engine::new(MemoryStore::new());
    let mut next = 0usize;
    let fresh = rt.block_on(async {
        let mut total = 0u64;
        let start = Instant::now();
        while start.elapsed() < budget {
            for _ in 0..1000 {
                let call = Call::new(tenant.clone(), tool.clone())
                    .key(keys[next % keys.len()].clone())
                    .fingerprint(fp);
                next += 1;
                black_box(
                    engine
                        .call(call, || async { Effect::Success(b"ok".to_vec()) })
                        .await
                        .unwrap(),
                );
            }
            total += 1000;
        }
        total as f64 / start.elapsed().as_secs_f64()
    });
    let replay_keys = 10_000usize;
    let replays = rt.block_on(async {
        let mut total = 0u64;
        let start = Instant::now();
        let mut i = 0usize;
        while start.elapsed() < budget {
            for _ in 0..1000 {
                let call = Call::new(tenant.clone(), tool.clone())
                    .key(keys[i % replay_keys].clone())
                    .fingerprint(fp);
                i += 1;
                black_box(
                    engine
                        .call(call, || async { Effect::Success(b"ok".to_vec()) })
                        .await
                        .unwrap(),
                );
            }
            total += 1000;
        }
        total as f64 / start.elapsed().as_secs_f64()
    });
    println!("memory store raw reserve+complete {:>12.0} /s", raw);
    println!(
        "engine fresh calls (memory)      {:>12.0} /s   {:.2}x raw",
        fresh,
        fresh / raw
    );
    println!("engine replays (memory)          {:>12.0} /s", replays);
}

/// Polls a future that never waits (the memory store never does) to completion in place.
fn futures_lite_block(fut: impl std::future::Future<Output = ()>) {
    let mut fut = std::pin::pin!(fut);
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    loop {
        if fut.as_mut().poll(&mut cx).is_ready() {
            return;
        }
    }
}

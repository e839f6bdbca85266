//! What a call's spans cost on its path: memory-store calls (fresh, and replays) made as a door
//! makes them (the call's span, the engine inside it, the answer recorded), first with traces off
//! (no endpoint: what every deployment gets by default), then exported over OTLP HTTP/protobuf
//! to a sink on loopback that answers every export at once; the same calls without any door span
//! are the baseline, measured in the same run.
//!
//! `cargo bench -p idemgate-trace --bench spans`; `BENCH_CALLS` per round (default 50,000),
//! `BENCH_ROUNDS` (default 5). One core's runtime (current-thread); the exporter's thread runs
//! beside it, as it does in a door. Prints medians with min and max, and the ratios.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpListener;
use std::time::Instant;

use idemgate_core::{Call, Effect, Engine, IdempotencyKey, MemoryStore, TenantId, ToolName};
use tracing::Instrument as _;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// An OTLP/HTTP endpoint that reads each export and answers 200 with an empty response.
fn sink() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let port = listener.local_addr().expect("its address").port();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut reader = BufReader::new(conn.try_clone().expect("a second handle"));
                let mut out = conn;
                loop {
                    let mut length = 0usize;
                    let mut line = String::new();
                    loop {
                        line.clear();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        let l = line.trim_end().to_ascii_lowercase();
                        if l.is_empty() {
                            break;
                        }
                        if let Some(v) = l.strip_prefix("content-length:") {
                            length = v.trim().parse().unwrap_or(0);
                        }
                    }
                    let mut body = vec![0; length];
                    if reader.read_exact(&mut body).is_err() {
                        return;
                    }
                    let reply = b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
                    if out.write_all(reply).is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

struct Bench {
    rt: tokio::runtime::Runtime,
    tenant: TenantId,
    tool: ToolName,
}

impl Bench {
    /// Calls per second of `calls` calls (fresh: a new key each; else one key, replayed).
    fn run(&self, calls: usize, fresh: bool, door_spans: bool) -> f64 {
        let engine = Engine::new(MemoryStore::new());
        let keys: Vec<IdempotencyKey> = (0..if fresh { calls } else { 1 })
            .map(|i| IdempotencyKey::explicit(format!("order-{i}")).unwrap())
            .collect();
        self.rt.block_on(async {
            let start = Instant::now();
            for i in 0..calls {
                let call = Call::new(self.tenant.clone(), self.tool.clone())
                    .key(keys[i % keys.len()].clone());
                let work = engine.call(call, || async { Effect::Success(b"{}".to_vec()) });
                if door_spans {
                    let span = idemgate_trace::call_span(
                        idemgate_trace::Door::Python,
                        "acme",
                        "charge",
                        None,
                        None,
                    );
                    let result = work.instrument(span.clone()).await;
                    idemgate_trace::record(&span, &result);
                    std::hint::black_box(result).unwrap();
                } else {
                    std::hint::black_box(work.await).unwrap();
                }
            }
            calls as f64 / start.elapsed().as_secs_f64()
        })
    }
}

fn stats(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn main() {
    let calls = env_or("BENCH_CALLS", 50_000);
    let rounds = env_or("BENCH_ROUNDS", 5);
    let bench = Bench {
        rt: tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap(),
        tenant: TenantId::new("acme").unwrap(),
        tool: ToolName::new("charge").unwrap(),
    };
    println!("{calls} calls per round, {rounds} rounds; calls/s, medians (min–max)");
    let mut off: Vec<[Vec<f64>; 2]> = vec![[vec![], vec![]], [vec![], vec![]]];
    for _ in 0..rounds {
        for (m, fresh) in [true, false].into_iter().enumerate() {
            off[m][0].push(bench.run(calls, fresh, false));
            off[m][1].push(bench.run(calls, fresh, true));
        }
    }
    let port = sink();
    std::env::set_var(
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        format!("http://127.0.0.1:{port}"),
    );
    std::env::set_var("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf");
    // Room for every span of a round, so that none is dropped instead of exported.
    std::env::set_var("OTEL_BSP_MAX_QUEUE_SIZE", "1000000");
    let pipeline = idemgate_trace::install("bench")
        .expect("the pipeline")
        .expect("an endpoint is set");
    let mut on: Vec<Vec<f64>> = vec![vec![], vec![]];
    for _ in 0..rounds {
        for (m, fresh) in [true, false].into_iter().enumerate() {
            on[m].push(bench.run(calls, fresh, true));
            // Each round's spans leave before the next starts: exporting competes for the CPU.
            pipeline.flush();
        }
    }
    drop(pipeline);
    let show = |v: &[f64]| {
        let (m, lo, hi) = stats(v.to_vec());
        format!("{m:>9.0} ({lo:.0}–{hi:.0})")
    };
    let ratio = |a: &[f64], b: &[f64]| {
        let r: Vec<f64> = a.iter().zip(b).map(|(x, y)| x / y).collect();
        let (m, lo, hi) = stats(r);
        format!("{m:.2} ({lo:.2}–{hi:.2})")
    };
    for (m, what) in ["fresh", "replay"].into_iter().enumerate() {
        let [base, door] = &off[m];
        println!("{what:<6} engine alone, traces off      {}", show(base));
        println!(
            "{what:<6} door spans, traces off        {}  ÷ engine alone {}",
            show(door),
            ratio(door, base)
        );
        println!(
            "{what:<6} door spans, exported (OTLP)   {}  ÷ engine alone {}",
            show(&on[m]),
            ratio(&on[m], base)
        );
    }
}

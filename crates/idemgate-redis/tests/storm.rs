//! 3 processes × 16 callers fire the same key at once, for 2,000 keys, on the shared Redis: exactly
//! one execution per key, and every other caller gets the stored result or an in-flight answer.
//!
//! The processes are this test binary itself, run again with `--ignored --exact
//! storm::storm_worker` and the worker's parameters in [`WORKER_ENV`]; run any other way, the
//! ignored worker fails rather than passing without doing anything.

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idemgate_core::{
    Call, Decision, Effect, Engine, Fingerprint, IdempotencyKey, TenantId, ToolName,
};

use crate::common::{delete_prefix, random_hex, raw, run_prefix, shared_store, test_url};

const WORKER_ENV: &str = "IDEMGATE_REDIS_STORM_WORKER";
const PROCESSES: usize = 3;
const CALLERS: usize = 16;
const KEYS: usize = 2000;
/// Keys in flight at once in each process (each with all its callers).
const KEYS_AT_ONCE: usize = 12;

#[test]
fn storm_three_processes_one_execution_per_key() {
    let url = test_url();
    let prefix = format!("{}storm-{}:", run_prefix(), random_hex(4));
    let start_at = unix_millis() + 1500;
    let exe = std::env::current_exe().expect("test binary");
    let started = Instant::now();
    let children: Vec<_> = (0..PROCESSES)
        .map(|_| {
            Command::new(&exe)
                .args([
                    "--ignored",
                    "--exact",
                    "storm::storm_worker",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(WORKER_ENV, format!("{url} {prefix} {start_at}"))
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("spawn worker")
        })
        .collect();
    let mut totals = [0u64; 4];
    for child in children {
        let out = child.wait_with_output().expect("worker");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "worker failed: {stdout}");
        let line = stdout
            .lines()
            .find_map(|l| l.split_once("STORM-RESULT ").map(|(_, r)| r.trim()))
            .unwrap_or_else(|| panic!("worker printed no result: {stdout}"));
        for (total, n) in totals.iter_mut().zip(line.split(' ')) {
            *total += n.parse::<u64>().expect("count");
        }
    }
    let [executed, replayed, in_flight, other] = totals;
    let elapsed = started.elapsed();
    eprintln!(
        "storm: {executed} executed, {replayed} replayed, {in_flight} in flight, {other} other, \
         in {elapsed:?}"
    );
    assert_eq!(
        other, 0,
        "every loser gets the stored result or an in-flight answer"
    );
    assert_eq!(executed, KEYS as u64, "exactly one execution per key");
    assert_eq!(
        executed + replayed + in_flight,
        (PROCESSES * CALLERS * KEYS) as u64
    );

    // The executions as Redis counted them, across processes.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut conn = raw(&url).await;
        let counts: Vec<u64> = redis::cmd("HVALS")
            .arg(format!("{prefix}executions"))
            .query_async(&mut conn)
            .await
            .expect("hvals");
        assert_eq!(counts.len(), KEYS, "every key executed");
        assert!(counts.iter().all(|&n| n == 1), "a key executed twice");
        delete_prefix(&url, &prefix).await;
    });
}

/// One storm process, started only by the test above.
#[test]
#[ignore = "run as a child process by the storm test"]
fn storm_worker() {
    let params = std::env::var(WORKER_ENV).unwrap_or_else(|_| {
        panic!("storm_worker is a child process of the storm test, which sets {WORKER_ENV}")
    });
    let mut parts = params.split(' ');
    let (url, prefix, start_at) = (
        parts.next().unwrap().to_owned(),
        parts.next().unwrap().to_owned(),
        parts.next().unwrap().parse::<u64>().unwrap(),
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let counts = runtime.block_on(async move {
        let store = shared_store(&prefix).await;
        let engine = Arc::new(Engine::new(store));
        let counter = format!("{prefix}executions");
        let effects = raw(&url).await;
        let tenant = TenantId::new("storm").unwrap();
        let tool = ToolName::new("charge").unwrap();
        let counts = Arc::new([
            AtomicU64::new(0),
            AtomicU64::new(0),
            AtomicU64::new(0),
            AtomicU64::new(0),
        ]);
        let wait = start_at.saturating_sub(unix_millis());
        tokio::time::sleep(Duration::from_millis(wait)).await;
        for chunk in (0..KEYS).collect::<Vec<_>>().chunks(KEYS_AT_ONCE) {
            let mut tasks = Vec::with_capacity(chunk.len() * CALLERS);
            for &k in chunk {
                let name = format!("k{k}");
                let call = Call::new(tenant.clone(), tool.clone())
                    .key(IdempotencyKey::new(name.clone()).unwrap())
                    .fingerprint(Fingerprint::of_bytes(name.as_bytes()));
                for _ in 0..CALLERS {
                    let (engine, call, counts) = (engine.clone(), call.clone(), counts.clone());
                    let (mut effects, counter, name) =
                        (effects.clone(), counter.clone(), name.clone());
                    tasks.push(tokio::spawn(async move {
                        let answer = engine
                            .call(call, || async move {
                                let _: i64 = redis::cmd("HINCRBY")
                                    .arg(&counter)
                                    .arg(&name)
                                    .arg(1)
                                    .query_async(&mut effects)
                                    .await
                                    .expect("count the execution");
                                Effect::Success(format!("done {name}").into_bytes())
                            })
                            .await;
                        let slot = match answer.map(|a| a.decision) {
                            Ok(Decision::Executed { .. }) => 0,
                            Ok(Decision::Replayed { outcome, .. })
                                if outcome.body.starts_with(b"done k") =>
                            {
                                1
                            }
                            Ok(Decision::InFlight { .. }) => 2,
                            other => {
                                println!("unexpected answer: {other:?}");
                                3
                            }
                        };
                        counts[slot].fetch_add(1, Ordering::Relaxed);
                    }));
                }
            }
            for t in tasks {
                t.await.expect("caller");
            }
        }
        counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect::<Vec<_>>()
    });
    println!(
        "STORM-RESULT {}",
        counts
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(" ")
    );
}

fn unix_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

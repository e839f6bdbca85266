//! A storm: 3 processes × 16 callers fire the same key at once, for 2,000 keys. Each key's side
//! effect runs exactly once across all processes (every execution inserts a row into an
//! `executions` table), and every other caller gets the stored result or an in-flight answer.
//!
//! The parent test re-executes this test binary three times, running only the ignored
//! [`storm_worker`] (`--ignored --exact`) with its parameters in [`WORKER_ENV`]; run any other
//! way, the worker fails rather than passing without doing anything.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idemgate_core::engine::Settings;
use idemgate_core::{
    Call, Decision, Effect, Engine, IdempotencyKey, Policies, TenantId, ToolName, ToolPolicy,
};
use idemgate_postgres::PgOptions;

use crate::support;

const WORKER_ENV: &str = "IDEMGATE_STORM_WORKER";
const PROCESSES: usize = 3;
const CALLERS: usize = 16;
const KEYS: usize = 2000;

#[derive(Default)]
struct Counts {
    executed: AtomicU64,
    replayed: AtomicU64,
    in_flight: AtomicU64,
    other: AtomicU64,
}

/// One process of the storm, started only by the storm test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run as a child process by the storm test"]
async fn storm_worker() {
    let spec = std::env::var(WORKER_ENV).unwrap_or_else(|_| {
        panic!("storm_worker is a child process of the storm test, which sets {WORKER_ENV}")
    });
    let parts: Vec<&str> = spec.split(',').collect();
    let (schema, keys, callers, proc_id) = (
        parts[0].to_owned(),
        parts[1].parse::<usize>().unwrap(),
        parts[2].parse::<usize>().unwrap(),
        parts[3].parse::<i32>().unwrap(),
    );
    let store = support::connect_with(
        &support::url(),
        PgOptions {
            schema: schema.clone(),
            pool_size: 8,
            ..PgOptions::default()
        },
    )
    .await;
    let exec = Arc::new(support::raw_client(&support::url()).await);
    let insert = Arc::new(
        exec.prepare(&format!(
            "INSERT INTO \"{schema}\".executions (key, proc) VALUES ($1, $2)"
        ))
        .await
        .unwrap(),
    );
    let policy = ToolPolicy {
        wait: Duration::from_secs(20),
        ..ToolPolicy::default()
    };
    let engine = Arc::new(
        Engine::new(store)
            .with_policies(Policies::new().with_default(policy))
            .with_settings(Settings {
                max_poll: Duration::from_millis(200),
                ..Settings::default()
            }),
    );
    let tenant = TenantId::new("storm").unwrap();
    let counts = Arc::new(Counts::default());
    let barrier = Arc::new(tokio::sync::Barrier::new(callers));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..callers {
        let (engine, exec, insert, tenant, counts, barrier) = (
            engine.clone(),
            exec.clone(),
            insert.clone(),
            tenant.clone(),
            counts.clone(),
            barrier.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for k in 0..keys {
                let name = format!("k{k}");
                barrier.wait().await;
                let call = Call::new(tenant.clone(), ToolName::new("storm").unwrap())
                    .key(IdempotencyKey::new(&name).unwrap())
                    .args(&serde_json::json!({ "k": k }));
                let (exec, insert, n) = (exec.clone(), insert.clone(), name.clone());
                let answer = engine
                    .call(call, move || async move {
                        match exec.execute(&*insert, &[&n, &proc_id]).await {
                            Ok(_) => Effect::Success(n.into_bytes()),
                            Err(e) => Effect::Failed(e.to_string().into_bytes()),
                        }
                    })
                    .await;
                let slot = match answer.map(|a| a.decision) {
                    Ok(Decision::Executed { outcome, .. }) if outcome.body == name.as_bytes() => {
                        &counts.executed
                    }
                    Ok(Decision::Replayed { outcome, .. }) if outcome.body == name.as_bytes() => {
                        &counts.replayed
                    }
                    Ok(Decision::InFlight { .. }) => &counts.in_flight,
                    other => {
                        eprintln!("storm: key {name}: unexpected answer {other:?}");
                        &counts.other
                    }
                };
                slot.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    println!(
        "STORM-RESULT executed={} replayed={} in_flight={} other={} secs={:.2}",
        counts.executed.load(Ordering::Relaxed),
        counts.replayed.load(Ordering::Relaxed),
        counts.in_flight.load(Ordering::Relaxed),
        counts.other.load(Ordering::Relaxed),
        start.elapsed().as_secs_f64()
    );
}

fn field(line: &str, name: &str) -> u64 {
    line.split_whitespace()
        .find_map(|f| f.strip_prefix(&format!("{name}=")))
        .and_then(|v| v.split('.').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {line:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storm_three_processes_execute_each_key_once() {
    let schema = support::fresh_schema("idemgate_storm");
    // Migrate once before the workers race, and make the executions table.
    drop(
        support::connect_with(
            &support::url(),
            PgOptions {
                schema: schema.clone(),
                pool_size: 1,
                ..PgOptions::default()
            },
        )
        .await,
    );
    let client = support::raw_client(&support::url()).await;
    client
        .batch_execute(&format!(
            "CREATE TABLE \"{schema}\".executions (key text NOT NULL, proc int NOT NULL, \
             at timestamptz NOT NULL DEFAULT clock_timestamp())"
        ))
        .await
        .unwrap();

    let exe = std::env::current_exe().unwrap();
    let start = Instant::now();
    let children: Vec<_> = (0..PROCESSES)
        .map(|p| {
            std::process::Command::new(&exe)
                .args(["--ignored", "--exact", "storm::storm_worker", "--nocapture"])
                .env(WORKER_ENV, format!("{schema},{KEYS},{CALLERS},{p}"))
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("start a storm worker")
        })
        .collect();
    let outputs = tokio::task::spawn_blocking(move || {
        children
            .into_iter()
            .map(|c| c.wait_with_output().expect("storm worker"))
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    let elapsed = start.elapsed();

    let (mut executed, mut replayed, mut in_flight, mut other) = (0, 0, 0, 0);
    for out in &outputs {
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "storm worker failed:\n{text}");
        let line = text
            .lines()
            .find(|l| l.starts_with("STORM-RESULT"))
            .unwrap_or_else(|| panic!("no result from a storm worker:\n{text}"));
        eprintln!("{line}");
        executed += field(line, "executed");
        replayed += field(line, "replayed");
        in_flight += field(line, "in_flight");
        other += field(line, "other");
    }
    let row = client
        .query_one(
            &format!(
                "SELECT count(*), count(DISTINCT key), coalesce(max(n), 0) FROM \
                 (SELECT key, count(*) AS n FROM \"{schema}\".executions GROUP BY key) per_key"
            ),
            &[],
        )
        .await
        .unwrap();
    let (keys_run, distinct, max_per_key): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    let total_rows: i64 = client
        .query_one(
            &format!("SELECT count(*) FROM \"{schema}\".executions"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    support::drop_schema(&schema).await;
    eprintln!(
        "storm: {PROCESSES} processes x {CALLERS} callers x {KEYS} keys in {elapsed:?}: \
         {total_rows} executions, {executed} executed answers, {replayed} replayed, \
         {in_flight} in flight, {other} other"
    );
    let calls = (PROCESSES * CALLERS * KEYS) as u64;
    assert_eq!(max_per_key, 1, "a key ran more than once");
    assert_eq!(total_rows, KEYS as i64, "executions");
    assert_eq!((keys_run, distinct), (KEYS as i64, KEYS as i64));
    assert_eq!(executed, KEYS as u64);
    assert_eq!(
        other, 0,
        "callers got answers other than the stored result or in flight"
    );
    assert_eq!(executed + replayed + in_flight, calls);
}

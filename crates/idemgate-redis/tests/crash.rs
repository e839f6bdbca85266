//! SIGKILL of a Redis with `appendfsync always` in the middle of a stream of engine calls loses no
//! acknowledged completion, runs no side effect twice, and the store serves again soon after the
//! restart.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idemgate_core::{
    Call, Decision, Effect, Engine, EngineError, Fingerprint, IdempotencyKey, Key, Policies,
    RecordState, Recording, Settings, Store, TenantId, ToolName, ToolPolicy,
};
use idemgate_redis::RedisStore;

use crate::common::PrivateRedis;

const WORKERS: usize = 8;

#[derive(Default)]
struct Tally {
    /// Side-effect runs per key.
    executions: HashMap<String, u32>,
    /// Keys whose execution the store confirmed, with when the confirmation came.
    acknowledged: Vec<(String, Instant)>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_loses_no_acknowledged_completion() {
    let mut server = PrivateRedis::start(true);
    let store = RedisStore::connect(&server.url()).await.expect("connect");
    let policy = ToolPolicy {
        lease: Duration::from_secs(2),
        wait: Duration::from_millis(200),
        ..ToolPolicy::write()
    };
    let engine = Arc::new(
        Engine::new(store.clone())
            .with_policies(Policies::new().with_default(policy))
            .with_settings(Settings {
                finish_attempts: 3,
                finish_backoff: Duration::from_millis(10),
                max_poll: Duration::from_millis(50),
                ..Settings::default()
            }),
    );
    let tenant = TenantId::new("crash").unwrap();
    let tool = ToolName::new("charge").unwrap();
    let tally = Arc::new(Mutex::new(Tally::default()));
    let stop = Arc::new(AtomicBool::new(false));

    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let (engine, tally, stop) = (engine.clone(), tally.clone(), stop.clone());
        let (tenant, tool) = (tenant.clone(), tool.clone());
        workers.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let name = format!("w{w}-{i}");
                i += 1;
                let call = Call::new(tenant.clone(), tool.clone())
                    .key(IdempotencyKey::new(name.clone()).unwrap())
                    .fingerprint(Fingerprint::of_bytes(name.as_bytes()));
                // Each key is called until it gets a final answer (as a retrying agent would),
                // and once more after that, as a duplicate.
                for attempt in 0..4 {
                    let effect_tally = tally.clone();
                    let effect_name = name.clone();
                    let answer = engine
                        .call(call.clone(), || async move {
                            *effect_tally
                                .lock()
                                .unwrap()
                                .executions
                                .entry(effect_name.clone())
                                .or_default() += 1;
                            Effect::Success(format!("done {effect_name}").into_bytes())
                        })
                        .await;
                    match answer {
                        Ok(a) => match a.decision {
                            Decision::Executed {
                                recording: Recording::Stored,
                                ..
                            } => {
                                tally
                                    .lock()
                                    .unwrap()
                                    .acknowledged
                                    .push((name.clone(), Instant::now()));
                                if attempt > 0 {
                                    break;
                                }
                            }
                            Decision::Replayed { .. } | Decision::Unknown { .. } => break,
                            Decision::Executed { .. } => {}
                            Decision::InFlight { .. } => {
                                tokio::time::sleep(Duration::from_millis(50)).await;
                            }
                            other => panic!("unexpected decision for {name}: {other:?}"),
                        },
                        Err(EngineError::ReserveFailed(_)) | Err(EngineError::Store(_)) => {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        Err(e) => panic!("unexpected error for {name}: {e}"),
                    }
                }
            }
        }));
    }

    // Let the stream run, then crash the server in the middle of it.
    let started = Instant::now();
    while tally.lock().unwrap().acknowledged.len() < 300
        && started.elapsed() < Duration::from_secs(20)
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let acked_before = tally.lock().unwrap().acknowledged.len();
    assert!(acked_before > 0, "no call completed before the crash");
    server.kill9();
    tokio::time::sleep(Duration::from_millis(700)).await;
    server.restart();
    let restarted = Instant::now();

    // The same store (and engine) serves again within a few seconds.
    let probe = Key::new(
        tenant.clone(),
        tool.clone(),
        IdempotencyKey::new("probe").unwrap(),
    );
    loop {
        if store.get(&probe).await.is_ok() {
            break;
        }
        assert!(
            restarted.elapsed() < Duration::from_secs(5),
            "the store did not serve again within 5 s of the restart"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let serving_after = restarted.elapsed();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.expect("worker");
    }

    let tally = Arc::try_unwrap(tally).ok().unwrap().into_inner().unwrap();
    let twice: Vec<_> = tally.executions.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "side effects ran twice: {twice:?}");
    let after_restart = tally
        .acknowledged
        .iter()
        .filter(|(_, at)| *at > restarted)
        .count();
    assert!(after_restart > 0, "no call completed after the restart");
    let mut lost = Vec::new();
    for (name, _) in &tally.acknowledged {
        let key = Key::new(
            tenant.clone(),
            tool.clone(),
            IdempotencyKey::new(name.clone()).unwrap(),
        );
        match store.get(&key).await.expect("get") {
            Some(rec) => match rec.state {
                RecordState::Completed { outcome, .. } => {
                    assert_eq!(outcome.body, format!("done {name}").into_bytes());
                }
                other => lost.push((name.clone(), format!("{other:?}"))),
            },
            None => lost.push((name.clone(), "absent".to_owned())),
        }
    }
    assert!(lost.is_empty(), "acknowledged completions lost: {lost:?}");
    eprintln!(
        "crash test: {} acknowledged ({acked_before} before the kill, {after_restart} after the \
         restart), {} keys executed, serving again {serving_after:?} after the restart",
        tally.acknowledged.len(),
        tally.executions.len()
    );
}

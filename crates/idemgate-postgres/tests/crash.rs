//! A private Postgres instance is killed with SIGKILL in the middle of a stream of engine calls
//! and restarted on the same data directory: no acknowledged completion is lost, no key runs twice,
//! and the store serves again within seconds.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idemgate_conformance::servers::PrivatePostgres;
use idemgate_core::engine::Settings;
use idemgate_core::{
    Call, Decision, Effect, Engine, EngineError, IdempotencyKey, Key, Policies, RecordState,
    Recording, Store, TenantId, ToolName, ToolPolicy,
};
use idemgate_postgres::{PgOptions, PgStore};

#[derive(Default)]
struct Tally {
    /// Executions of each key's side effect (in this process).
    executions: HashMap<String, u32>,
    /// Keys whose call executed and whose completion the store acknowledged.
    stored: Vec<String>,
    /// Keys whose call executed but whose completion went to the journal.
    journaled: Vec<String>,
    /// Every key called.
    called: Vec<String>,
    /// Calls refused because the store failed at reservation.
    refused: usize,
    /// Stored acknowledgements before and after the restart.
    stored_before: usize,
    stored_after: usize,
}

fn key_of(tenant: &TenantId, name: &str) -> Key {
    Key::new(
        tenant.clone(),
        ToolName::new("crash").unwrap(),
        IdempotencyKey::new(name).unwrap(),
    )
}

async fn call_once(
    engine: &Engine<PgStore>,
    tenant: &TenantId,
    name: &str,
    tally: &Arc<Mutex<Tally>>,
) -> Result<Decision, EngineError> {
    let call = Call::new(tenant.clone(), ToolName::new("crash").unwrap())
        .key(IdempotencyKey::new(name).unwrap())
        .args(&serde_json::json!({ "key": name }));
    let t = tally.clone();
    let n = name.to_owned();
    engine
        .call(call, move || async move {
            *t.lock().unwrap().executions.entry(n.clone()).or_default() += 1;
            Effect::Success(n.into_bytes())
        })
        .await
        .map(|a| a.decision)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_stream_loses_no_acknowledged_completion() {
    let mut pg = PrivatePostgres::init();
    pg.start();
    let store = PgStore::connect_with(
        &pg.url(),
        PgOptions {
            schema: "idemgate".to_owned(),
            pool_size: 8,
            connect_timeout: Duration::from_secs(1),
            statement_timeout: Duration::from_secs(2),
            answer_margin: Duration::from_secs(1),
            ..PgOptions::default()
        },
    )
    .await
    .expect("connect to the private postgres");
    let policy = ToolPolicy {
        lease: Duration::from_secs(2),
        wait: Duration::from_millis(300),
        ..ToolPolicy::default()
    };
    let engine = Arc::new(
        Engine::new(store)
            .with_policies(Policies::new().with_default(policy))
            .with_settings(Settings {
                finish_attempts: 3,
                finish_backoff: Duration::from_millis(20),
                max_poll: Duration::from_millis(50),
                ..Settings::default()
            }),
    );
    let tenant = TenantId::new("crash-test").unwrap();
    let tally = Arc::new(Mutex::new(Tally::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let restarted = Arc::new(AtomicBool::new(false));

    let mut workers = Vec::new();
    for w in 0..8 {
        let (engine, tenant, tally, stop, restarted) = (
            engine.clone(),
            tenant.clone(),
            tally.clone(),
            stop.clone(),
            restarted.clone(),
        );
        workers.push(tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                let name = format!("w{w}-{i}");
                i += 1;
                tally.lock().unwrap().called.push(name.clone());
                let after = restarted.load(Ordering::SeqCst);
                match call_once(&engine, &tenant, &name, &tally).await {
                    Ok(Decision::Executed { recording, .. }) => {
                        let mut t = tally.lock().unwrap();
                        match recording {
                            Recording::Stored => {
                                t.stored.push(name);
                                if after {
                                    t.stored_after += 1;
                                } else {
                                    t.stored_before += 1;
                                }
                            }
                            Recording::Journaled => t.journaled.push(name),
                            other => panic!("unexpected recording {other:?}"),
                        }
                    }
                    Ok(other) => panic!("a fresh key got {other:?}"),
                    Err(EngineError::ReserveFailed(_)) => {
                        tally.lock().unwrap().refused += 1;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    Err(e) => panic!("unexpected error {e}"),
                }
            }
        }));
    }

    tokio::time::sleep(Duration::from_millis(700)).await;
    pg.kill9();
    let killed_at = Instant::now();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Blocking (it polls pg_isready); the workers go on on the other worker thread.
    tokio::task::block_in_place(|| pg.start());
    // The server answers again (after its crash recovery, which a loaded machine slows): from
    // here on, how long the store takes to serve is its own reconnecting.
    let ready_at = Instant::now();
    restarted.store(true, Ordering::SeqCst);
    // The store serves again: a fresh call gets through.
    let probe_tally = Arc::new(Mutex::new(Tally::default()));
    let mut n = 0;
    let served_after = loop {
        n += 1;
        if let Ok(Decision::Executed {
            recording: Recording::Stored,
            ..
        }) = call_once(&engine, &tenant, &format!("probe-{n}"), &probe_tally).await
        {
            break ready_at.elapsed();
        }
        assert!(
            ready_at.elapsed() < Duration::from_secs(10),
            "the store did not serve again within 10 s of the server's answering"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.await.expect("worker");
    }

    // Journaled completions reach the store now that it is back.
    let report = engine.flush_journal().await.expect("flush");
    // Every key once more: nothing executed runs again.
    let called = tally.lock().unwrap().called.clone();
    for name in &called {
        let _ = call_once(&engine, &tenant, name, &tally).await;
    }

    let (over, executed): (Vec<_>, Vec<_>) = {
        let t = tally.lock().unwrap();
        let over = t
            .executions
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(k, n)| (k.clone(), *n))
            .collect();
        (over, t.stored.iter().chain(&t.journaled).cloned().collect())
    };
    assert!(over.is_empty(), "keys executed more than once: {over:?}");
    let mut lost = Vec::new();
    for name in &executed {
        match engine
            .store()
            .get(&key_of(&tenant, name))
            .await
            .expect("get")
        {
            Some(rec) => match rec.state {
                RecordState::Completed { outcome, .. } => {
                    assert_eq!(outcome.body, name.as_bytes());
                }
                other => lost.push((name.clone(), format!("{other:?}"))),
            },
            None => lost.push((name.clone(), "absent".to_owned())),
        }
    }
    let t = tally.lock().unwrap();
    eprintln!(
        "crash test: {} calls, {} acknowledged before the kill and {} after the restart, {} \
         journaled, {} refused while down; served again {served_after:?} after the server \
         answered ({:?} after the kill); journal flush {report:?}",
        called.len(),
        t.stored_before,
        t.stored_after,
        t.journaled.len(),
        t.refused,
        ready_at.duration_since(killed_at) + served_after,
    );
    assert!(lost.is_empty(), "acknowledged completions lost: {lost:?}");
    assert!(t.stored_before > 0, "no completion before the kill");
    assert!(t.stored_after > 0, "no completion after the restart");
    assert!(
        served_after < Duration::from_secs(5),
        "served again only {served_after:?} after the server answered"
    );
    assert_eq!(report.pending, 0, "journal entries left: {report:?}");
}

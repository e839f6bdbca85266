//! A PostgreSQL primary SIGKILLed under load and its streaming standby promoted, with real
//! processes: a private primary (`initdb`) and a standby made by `pg_basebackup -R`, each on its
//! own loopback port (`idemgate_conformance::servers::PrivatePostgres`; Debian's server binaries
//! under `/usr/lib/postgresql/<major>/bin`, and the test fails when they are missing).
//!
//! A round: eight callers send calls through the engine, each with a fresh key, on the primary.
//! Once `IDEMGATE_PG_FAILOVER_CALLS` of them (default 300) were acknowledged, the primary is
//! SIGKILLed (postmaster and every backend at once) while calls are running; in every other round
//! its walsender is first stopped (SIGSTOP) for `IDEMGATE_PG_FAILOVER_STALL_MS` (default 1000),
//! a stalled standby, so that the kill finds commits the standby has not received. Then the
//! standby is promoted, the callers are pointed at it (a new store on its port, the callers'
//! journal kept, and flushed there as a gateway's flusher would), and every key is sent again,
//! acknowledged or not, until it is answered for good.
//!
//! Counted, per key (each side effect records its runs in a map the test owns):
//!
//! - `calls`: the first calls, one per key, on the old primary.
//! - `acknowledged`: first calls answered executed with the outcome stored (the store confirmed
//!   the completion's commit to its caller).
//! - `lost`: acknowledged keys whose completed record (with that outcome) the new primary lacks
//!   when it takes over, or whose side effect runs again when re-sent.
//! - `doubles`: keys whose side effect ran more than once (first calls and re-sends together).
//! - `false_unknown`: keys answered "outcome unknown" (on any send) whose side effect never ran,
//!   not even started: the caller is told the action may have happened when it surely did not,
//!   and an operator must resolve it. This happens when a reservation reached the standby but its
//!   answer never reached the engine (the primary died first, or, with the standby stalled, the
//!   answer took longer than `statement_timeout` plus `answer_margin`), so the engine could not
//!   take it back at once. The engine journals such a reservation as a take-back, and the flush
//!   on the new primary releases it, so its re-send runs once: asserted 0 with a synchronous
//!   standby.
//! - `honest_unknown`: keys answered unknown whose side effect did run, but whose completion the
//!   new primary lacks: unknown is the truth there (an acknowledged one counts as lost as well).
//!
//! With a synchronous standby (named in `synchronous_standby_names`, `synchronous_commit = on`)
//! the test asserts 0 lost, 0 doubles and 0 false unknowns, and prints `PG-FAILOVER sync ...`. The control, with an
//! asynchronous standby accepted by `allow_async_replication=true`, prints `PG-FAILOVER async ...`
//! and asserts only that it ran: what a failover to an asynchronous standby loses is chance (the
//! risk docs/STORES.md describes), so it cannot pass or fail. `IDEMGATE_PG_FAILOVER_ROUNDS` sets
//! the rounds (default 2); scripts/chaos-postgres-failover runs the long tier and the control.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idemgate_conformance::servers::PrivatePostgres;
use idemgate_core::engine::Settings;
use idemgate_core::{
    Call, Decision, Effect, Engine, EngineError, IdempotencyKey, Key, MemoryJournal, Policies,
    RecordState, Recording, Store, TenantId, ToolName, ToolPolicy,
};
use idemgate_postgres::{PgOptions, PgStore};

const WORKERS: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Replication {
    Sync,
    Async,
}

impl Replication {
    fn name(self) -> &'static str {
        match self {
            Replication::Sync => "sync",
            Replication::Async => "async",
        }
    }
}

/// The size of the run, from the environment (the long tier sets it).
struct Config {
    rounds: u32,
    /// Acknowledged first calls before the kill, per round.
    calls: u64,
    /// How long the walsender is stopped before the kill, in the rounds that stall it.
    stall: Duration,
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().map_or(default, |v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name} must be a number, not {v:?}"))
    })
}

fn config() -> Config {
    Config {
        rounds: u32::try_from(env_number("IDEMGATE_PG_FAILOVER_ROUNDS", 2))
            .expect("IDEMGATE_PG_FAILOVER_ROUNDS fits in 32 bits"),
        calls: env_number("IDEMGATE_PG_FAILOVER_CALLS", 300),
        stall: Duration::from_millis(env_number("IDEMGATE_PG_FAILOVER_STALL_MS", 1000)),
    }
}

/// What one round (or all of them) came to.
#[derive(Debug, Default)]
struct Tally {
    calls: u64,
    acknowledged: u64,
    /// First calls that executed with the completion in the callers' journal.
    journaled: u64,
    /// First calls refused because the reservation failed (nothing ran).
    refused: u64,
    lost: u64,
    doubles: u64,
    false_unknown: u64,
    honest_unknown: u64,
    /// Re-sends answered with the stored outcome, and re-sends that ran the side effect.
    replayed: u64,
    ran_on_resend: u64,
    /// First answers other than the above, by the start of their description.
    other: BTreeMap<String, u64>,
}

impl Tally {
    fn add(&mut self, t: &Tally) {
        self.calls += t.calls;
        self.acknowledged += t.acknowledged;
        self.journaled += t.journaled;
        self.refused += t.refused;
        self.lost += t.lost;
        self.doubles += t.doubles;
        self.false_unknown += t.false_unknown;
        self.honest_unknown += t.honest_unknown;
        self.replayed += t.replayed;
        self.ran_on_resend += t.ran_on_resend;
        for (why, n) in &t.other {
            *self.other.entry(why.clone()).or_default() += n;
        }
    }

    fn line(&self, replication: Replication, rounds: u32) -> String {
        format!(
            "PG-FAILOVER {} rounds={rounds} calls={} acknowledged={} lost={} doubles={} \
             false_unknown={} honest_unknown={} journaled={} refused={} replayed={} \
             ran_on_resend={}",
            replication.name(),
            self.calls,
            self.acknowledged,
            self.lost,
            self.doubles,
            self.false_unknown,
            self.honest_unknown,
            self.journaled,
            self.refused,
            self.replayed,
            self.ran_on_resend
        )
    }
}

/// What the callers saw, shared by them.
#[derive(Default)]
struct Book {
    /// Runs of each key's side effect.
    executions: HashMap<String, u32>,
    /// Every key sent, in order.
    keys: Vec<String>,
    /// Keys whose first call was acknowledged.
    acknowledged: Vec<String>,
    /// Keys answered unknown, on any send.
    unknown: HashSet<String>,
    /// The first answer of each key that was not acknowledged, in words.
    first: HashMap<String, String>,
    tally: Tally,
}

fn tenant() -> TenantId {
    TenantId::new("failover").unwrap()
}

fn tool() -> ToolName {
    ToolName::new("charge").unwrap()
}

fn key_of(name: &str) -> Key {
    Key::new(tenant(), tool(), IdempotencyKey::new(name).unwrap())
}

fn options() -> PgOptions {
    PgOptions {
        schema: "idemgate".to_owned(),
        pool_size: WORKERS,
        connect_timeout: Duration::from_secs(2),
        ..PgOptions::default()
    }
}

/// The callers' engine on `store`, with their journal (kept across the failover).
fn engine(store: PgStore, journal: &Arc<MemoryJournal>) -> Engine<PgStore> {
    let policy = ToolPolicy {
        // The side effect is instant; a short lease lets a reservation stranded by the kill read
        // unknown soon on the new primary, and a re-send waits for that.
        lease: Duration::from_secs(3),
        wait: Duration::from_secs(20),
        ..ToolPolicy::default()
    };
    Engine::new(store)
        .with_policies(Policies::new().with_default(policy))
        .with_journal(journal.clone())
        .with_settings(Settings {
            finish_attempts: 3,
            finish_backoff: Duration::from_millis(20),
            max_poll: Duration::from_millis(50),
            ..Settings::default()
        })
}

/// Sends the call of key `name` (same arguments every time); its side effect counts its runs.
async fn send(
    engine: &Engine<PgStore>,
    name: &str,
    book: &Arc<Mutex<Book>>,
) -> Result<Decision, EngineError> {
    let call = Call::new(tenant(), tool())
        .key(IdempotencyKey::new(name).unwrap())
        .args(&serde_json::json!({ "key": name }));
    let book = book.clone();
    let n = name.to_owned();
    engine
        .call(call, move || async move {
            *book
                .lock()
                .unwrap()
                .executions
                .entry(n.clone())
                .or_default() += 1;
            Effect::Success(n.into_bytes())
        })
        .await
        .map(|a| a.decision)
}

/// Records the answer to the first call of key `name`.
fn note_first(
    book: &Mutex<Book>,
    acked: &AtomicU64,
    name: String,
    answer: Result<Decision, EngineError>,
) {
    let mut b = book.lock().unwrap();
    b.tally.calls += 1;
    if !matches!(
        answer,
        Ok(Decision::Executed {
            recording: Recording::Stored,
            ..
        })
    ) {
        let said = match &answer {
            Ok(d) => format!("{d:?}"),
            Err(e) => e.to_string(),
        };
        b.first
            .insert(name.clone(), said.chars().take(300).collect());
    }
    match answer {
        Ok(Decision::Executed {
            recording: Recording::Stored,
            ..
        }) => {
            b.tally.acknowledged += 1;
            b.acknowledged.push(name);
            acked.fetch_add(1, Ordering::SeqCst);
        }
        Ok(Decision::Executed {
            recording: Recording::Journaled,
            ..
        }) => b.tally.journaled += 1,
        Err(EngineError::ReserveFailed(_)) => b.tally.refused += 1,
        other => {
            if matches!(other, Ok(Decision::Unknown { .. })) {
                b.unknown.insert(name);
            }
            let why: String = format!("{other:?}").chars().take(80).collect();
            *b.tally.other.entry(why).or_default() += 1;
        }
    }
}

/// Waits for `what` with a generous deadline, looking every 20 ms.
fn wait_until(what: &str, deadline: Duration, mut ok: impl FnMut() -> bool) {
    let until = Instant::now() + deadline;
    while !ok() {
        assert!(
            Instant::now() < until,
            "timed out after {deadline:?} waiting until {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A primary with one streaming standby, replicating as `replication` says; the standby is
/// streaming, and shown in the primary's `pg_stat_replication` with the matching `sync_state`.
fn primary_and_standby(replication: Replication) -> (PrivatePostgres, PrivatePostgres) {
    let mut primary = PrivatePostgres::init();
    primary.start();
    let standby = primary.start_standby();
    let name = standby.standby_name();
    if replication == Replication::Sync {
        // Set after the base backup, so that the standby, once promoted, does not wait for a
        // standby of its own.
        let _ = primary.psql(&format!(
            "ALTER SYSTEM SET synchronous_standby_names = '\"{name}\"'"
        ));
        let _ = primary.psql("SELECT pg_reload_conf()");
    }
    let want = replication.name();
    let state =
        format!("SELECT sync_state FROM pg_stat_replication WHERE application_name = '{name}'");
    wait_until(
        &format!("the standby {name} streams as {want}"),
        Duration::from_secs(30),
        || primary.psql(&state) == want,
    );
    (primary, standby)
}

/// One round on a new primary and standby; prints what it came to.
fn round(rt: &tokio::runtime::Runtime, n: u32, replication: Replication, cfg: &Config) -> Tally {
    let stall = (n.is_multiple_of(2) && !cfg.stall.is_zero()).then_some(cfg.stall);
    let setup = Instant::now();
    let (mut primary, standby) = primary_and_standby(replication);
    let standby_name = standby.standby_name();
    let url = match replication {
        Replication::Sync => primary.url(),
        Replication::Async => format!("{}?allow_async_replication=true", primary.url()),
    };
    let journal = Arc::new(MemoryJournal::new());
    let book: Arc<Mutex<Book>> = Arc::default();
    let acked = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let killed = Arc::new(AtomicBool::new(false));

    let old = rt.block_on(async {
        let store = PgStore::connect_with(&url, options())
            .await
            .unwrap_or_else(|e| panic!("failed to open the store on the primary {url}: {e}"));
        Arc::new(engine(store, &journal))
    });
    let setup = setup.elapsed();

    // The first calls: each worker sends fresh keys until told to stop.
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let (engine, book, acked, stop, killed) = (
                old.clone(),
                book.clone(),
                acked.clone(),
                stop.clone(),
                killed.clone(),
            );
            rt.spawn(async move {
                let mut i = 0;
                while !stop.load(Ordering::SeqCst) {
                    i += 1;
                    let name = format!("w{w}-{i}");
                    book.lock().unwrap().keys.push(name.clone());
                    let answer = send(&engine, &name, &book).await;
                    let refused = matches!(answer, Err(EngineError::ReserveFailed(_)));
                    note_first(&book, &acked, name, answer);
                    if refused && killed.load(Ordering::SeqCst) {
                        // Its store is gone: this caller is done until the failover.
                        return;
                    }
                    if refused {
                        // Not expected before the kill (the round reports it); pace the caller.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            })
        })
        .collect();

    let target = cfg.calls;
    let loaded = Instant::now();
    wait_until(
        &format!("{target} calls were acknowledged on the primary"),
        Duration::from_secs(120),
        || acked.load(Ordering::SeqCst) >= target,
    );
    let load = loaded.elapsed();
    if stall.is_some() {
        primary.signal_walsender(&standby_name, "STOP");
    }
    let acked_at_stall = acked.load(Ordering::SeqCst);
    if let Some(stall) = stall {
        // The fault's length, not a wait for a condition: the callers go on meanwhile.
        std::thread::sleep(stall);
    }
    let acked_in_stall = acked.load(Ordering::SeqCst) - acked_at_stall;
    // Each caller goes on until the dead primary refuses it once: calls are running at the kill.
    killed.store(true, Ordering::SeqCst);
    primary.kill9();
    stop.store(true, Ordering::SeqCst);
    rt.block_on(async {
        for w in workers {
            w.await.expect("a caller panicked");
        }
    });
    drop(old);

    let promoting = Instant::now();
    standby.promote();
    let promoted_in = promoting.elapsed();

    // The callers, pointed at the new primary.
    let resending = Instant::now();
    let (lost_keys, flush) = rt.block_on(async {
        let store = PgStore::connect_with(&standby.url(), options())
            .await
            .unwrap_or_else(|e| panic!("failed to open the store on the promoted standby: {e}"));
        let new = Arc::new(engine(store.clone(), &journal));
        // What the new primary has of the acknowledged completions, before anything is written.
        let acknowledged = book.lock().unwrap().acknowledged.clone();
        let mut lost = HashSet::new();
        for name in &acknowledged {
            let record = store
                .get(&key_of(name))
                .await
                .unwrap_or_else(|e| panic!("failed to read {name} on the new primary: {e}"));
            let kept = record.is_some_and(|r| {
                matches!(&r.state, RecordState::Completed { outcome, .. }
                    if outcome.body == name.as_bytes())
            });
            if !kept {
                lost.insert(name.clone());
            }
        }
        let flush = new
            .flush_journal()
            .await
            .expect("flush the callers' journal");
        // Every key once more, by as many callers, until each is answered for good.
        let keys = book.lock().unwrap().keys.clone();
        let next = Arc::new(AtomicU64::new(0));
        let keys = Arc::new(keys);
        let resenders: Vec<_> = (0..WORKERS)
            .map(|_| {
                let (engine, book, keys, next) =
                    (new.clone(), book.clone(), keys.clone(), next.clone());
                tokio::spawn(async move {
                    loop {
                        let i = usize::try_from(next.fetch_add(1, Ordering::SeqCst)).unwrap();
                        let Some(name) = keys.get(i) else { return };
                        resend(&engine, name, &book).await;
                    }
                })
            })
            .collect();
        for r in resenders {
            r.await.expect("a re-sending caller panicked");
        }
        (lost, flush)
    });
    let resent_in = resending.elapsed();

    let mut b = std::mem::take(&mut *book.lock().unwrap());
    let mut lost = lost_keys;
    for name in &b.acknowledged {
        if b.executions.get(name).copied().unwrap_or(0) > 1 {
            lost.insert(name.clone());
        }
    }
    let mut t = std::mem::take(&mut b.tally);
    t.lost = lost.len() as u64;
    t.doubles = b.executions.values().filter(|n| **n > 1).count() as u64;
    for name in &b.unknown {
        if b.executions.get(name).copied().unwrap_or(0) == 0 {
            t.false_unknown += 1;
        } else {
            t.honest_unknown += 1;
        }
    }
    println!(
        "round {n} ({}{}): set up in {setup:.1?}; {target} acknowledged in {load:.1?}, {} by \
         the {}{}; promoted in {promoted_in:.1?}; journal flush on the new primary {flush:?}; \
         re-sent in {resent_in:.1?}",
        replication.name(),
        stall.map_or(String::new(), |s| format!(
            ", walsender stopped {s:?} before the kill"
        )),
        acked_at_stall,
        if stall.is_some() { "stall" } else { "kill" },
        stall.map_or(String::new(), |_| format!(
            ", {acked_in_stall} more during the stall"
        )),
    );
    println!("  {}", t.line(replication, 1));
    let mut shown: Vec<_> = lost.iter().collect();
    shown.sort();
    for name in shown.iter().take(5) {
        println!(
            "  LOST acknowledged completion {name} (ran {} times)",
            b.executions.get(*name).copied().unwrap_or(0)
        );
    }
    let mut false_unknown: Vec<_> = b
        .unknown
        .iter()
        .filter(|name| !b.executions.contains_key(*name))
        .collect();
    false_unknown.sort();
    for name in false_unknown.iter().take(5) {
        println!(
            "  FALSE UNKNOWN {name}: never ran; its first call was answered: {}",
            b.first.get(*name).map_or("?", String::as_str)
        );
    }
    for (why, count) in &t.other {
        println!("  first answer {count}x: {why}");
    }
    drop(standby);
    drop(primary);
    t
}

/// Sends `name` again until it is answered for good: replayed, executed, or unknown.
async fn resend(engine: &Engine<PgStore>, name: &str, book: &Arc<Mutex<Book>>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let answer = send(engine, name, book).await;
        match answer {
            Ok(Decision::Replayed { .. }) => {
                book.lock().unwrap().tally.replayed += 1;
                return;
            }
            Ok(Decision::Executed {
                recording: Recording::Stored,
                ..
            }) => {
                book.lock().unwrap().tally.ran_on_resend += 1;
                return;
            }
            Ok(Decision::Unknown { .. }) => {
                book.lock().unwrap().unknown.insert(name.to_owned());
                return;
            }
            Ok(Decision::InFlight { .. }) | Err(EngineError::ReserveFailed(_)) => {
                assert!(
                    Instant::now() < deadline,
                    "{name} was not answered for good on the new primary within 60 s: {answer:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => panic!("re-sending {name} on the new primary: unexpected answer {other:?}"),
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

fn rounds(replication: Replication) -> Tally {
    let cfg = config();
    assert!(
        cfg.rounds > 0,
        "IDEMGATE_PG_FAILOVER_ROUNDS must be at least 1"
    );
    let rt = runtime();
    let mut total = Tally::default();
    for n in 1..=cfg.rounds {
        let t = round(&rt, n, replication, &cfg);
        assert!(
            t.acknowledged >= cfg.calls,
            "round {n}: only {} calls were acknowledged",
            t.acknowledged
        );
        total.add(&t);
    }
    println!("{}", total.line(replication, cfg.rounds));
    total
}

#[test]
fn a_synchronous_standby_promoted_after_a_sigkill_loses_no_acknowledged_outcome() {
    let t = rounds(Replication::Sync);
    assert_eq!(
        t.lost, 0,
        "acknowledged completions were lost in the failover (see the output above)"
    );
    assert_eq!(
        t.doubles, 0,
        "side effects ran twice after the failover (see the output above)"
    );
    assert_eq!(
        t.false_unknown, 0,
        "calls that never ran were answered unknown (see the output above)"
    );
}

/// The control of scripts/chaos-postgres-failover: the same failover to an asynchronous standby,
/// accepted with `allow_async_replication=true`. It reports what the failover lost and asserts
/// only that calls were made and acknowledged: the loss is the documented risk, and its size is
/// chance.
#[test]
#[ignore = "the control of scripts/chaos-postgres-failover: reports what a failover to an asynchronous standby loses, checks no guarantee"]
fn control_an_asynchronous_standby_promoted_after_a_sigkill_reports_what_it_loses() {
    let t = rounds(Replication::Async);
    assert!(
        t.calls > 0 && t.acknowledged > 0,
        "the control made no calls"
    );
}

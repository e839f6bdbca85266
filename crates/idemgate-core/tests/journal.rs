//! Journaled outcomes and takeovers by other processes (issue 8, recipes V1 and V2): gateway A
//! executes, its "done" write fails, it journals the outcome and acknowledges it; its lease runs
//! out while the store is out of reach; gateway B then gets a duplicate. B must not supersede (or
//! report unknown) an outcome A acknowledged: it watches the record for the settle window, within
//! which A's flusher lands the outcome.

use std::sync::Arc;
use std::time::Duration;

use idemgate_core::faulty::{Fault, FaultyStore, Op};
use idemgate_core::{
    Decision, Effect, Engine, Journal as _, ManualClock, MemoryJournal, MemoryStore, Policies,
    Recording, Settings, Store as _, Timestamp, ToolPolicy, UnknownPolicy,
};

use crate::support::{call, Counter, LEASE};

struct TwoGateways {
    clock: ManualClock,
    /// A's view of the store: its "done" writes can be made to fail.
    a_store: FaultyStore<MemoryStore>,
    a: Arc<Engine<FaultyStore<MemoryStore>>>,
    a_journal: Arc<MemoryJournal>,
    b: Engine<MemoryStore>,
}

fn two_gateways(on_unknown: UnknownPolicy) -> TwoGateways {
    let clock = ManualClock::new(Timestamp::from_millis(1_800_000_000_000));
    let store = MemoryStore::with_clock(Arc::new(clock.clone()));
    let a_store = FaultyStore::new(store.clone());
    let policies = Policies::new().with_default(ToolPolicy {
        lease: LEASE,
        on_unknown,
        ..ToolPolicy::default()
    });
    let settings = Settings {
        finish_attempts: 3,
        finish_backoff: Duration::from_millis(5),
        max_poll: Duration::from_millis(50),
        ..Settings::default()
    };
    let a_journal = Arc::new(MemoryJournal::new());
    let a = Engine::new(a_store.clone())
        .with_policies(policies.clone())
        .with_journal(a_journal.clone())
        .with_clock(Arc::new(clock.clone()))
        .with_settings(settings.clone());
    let b = Engine::new(store)
        .with_policies(policies)
        .with_clock(Arc::new(clock.clone()))
        .with_settings(settings);
    TwoGateways {
        clock,
        a_store,
        a: Arc::new(a),
        a_journal,
        b,
    }
}

fn success(body: &str) -> Effect {
    Effect::Success(body.as_bytes().to_vec())
}

/// A executes and acknowledges a journaled outcome; then its lease runs out in the outage.
async fn acknowledged_then_lease_ends(g: &TwoGateways, runs: &Counter) {
    g.a_store.always(Op::Complete, Fault::Refuse);
    let acked =
        g.a.call(
            call("acme", "charge", Some("k"), serde_json::json!(1)),
            || runs.effect(success("from A")),
        )
        .await
        .unwrap();
    assert!(
        matches!(
            acked.decision,
            Decision::Executed {
                recording: Recording::Journaled,
                ..
            }
        ),
        "{acked:?}"
    );
    g.clock.advance(LEASE + Duration::from_secs(7));
}

/// The store is back: A's flusher lands the journaled outcome a moment later.
async fn a_flushes_after(g: &TwoGateways, delay: Duration) {
    tokio::time::sleep(delay).await;
    g.a_store.heal();
    let report = g.a.flush_journal().await.unwrap();
    assert_eq!((report.applied, report.superseded), (1, 0), "{report:?}");
}

#[tokio::test(start_paused = true)]
async fn a_takeover_defers_to_a_pending_flush_under_retry() {
    let g = two_gateways(UnknownPolicy::Retry);
    let runs = Counter::default();
    acknowledged_then_lease_ends(&g, &runs).await;
    let (b, ()) = tokio::join!(
        g.b.call(
            call("acme", "charge", Some("k"), serde_json::json!(1)),
            || { runs.effect(success("from B")) }
        ),
        a_flushes_after(&g, Duration::from_millis(500)),
    );
    let b = b.unwrap();
    assert!(
        matches!(b.decision, Decision::Replayed { ref outcome, .. } if outcome.body == b"from A"),
        "B superseded A's acknowledged outcome: {b:?}"
    );
    assert_eq!(runs.get(), 1, "never a second execution");
}

#[tokio::test(start_paused = true)]
async fn an_acknowledged_success_is_not_reported_unknown_under_block() {
    let g = two_gateways(UnknownPolicy::Block);
    let runs = Counter::default();
    acknowledged_then_lease_ends(&g, &runs).await;
    let (b, ()) = tokio::join!(
        g.b.call(
            call("acme", "charge", Some("k"), serde_json::json!(1)),
            || { runs.effect(success("from B")) }
        ),
        a_flushes_after(&g, Duration::from_millis(500)),
    );
    let b = b.unwrap();
    assert!(
        matches!(b.decision, Decision::Replayed { ref outcome, .. } if outcome.body == b"from A"),
        "{b:?}"
    );
}

/// The limit of the guarantee, stated in docs/ARCHITECTURE.md: a holder that stays cut off from
/// a store others reach for longer than its lease and the settle window is taken over; its flush
/// then reports the outcome superseded.
#[tokio::test(start_paused = true)]
async fn a_holder_cut_off_past_the_settle_window_is_superseded() {
    let g = two_gateways(UnknownPolicy::Retry);
    let runs = Counter::default();
    acknowledged_then_lease_ends(&g, &runs).await;
    let started = tokio::time::Instant::now();
    let b =
        g.b.call(
            call("acme", "charge", Some("k"), serde_json::json!(1)),
            || runs.effect(success("from B")),
        )
        .await
        .unwrap();
    assert!(matches!(b.decision, Decision::Executed { .. }), "{b:?}");
    assert!(
        started.elapsed() >= Settings::default().unknown_settle,
        "B watched the record for the settle window first"
    );
    g.a_store.heal();
    let report = g.a.flush_journal().await.unwrap();
    assert_eq!(report.superseded, 1);
    assert_eq!(runs.get(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_flusher_retries_soon_while_entries_are_pending() {
    let g = two_gateways(UnknownPolicy::Block);
    let runs = Counter::default();
    let _flusher = g.a.spawn_journal_flusher(Duration::from_secs(3600));
    acknowledged_then_lease_ends(&g, &runs).await;
    g.a_store.heal();
    tokio::time::sleep(idemgate_core::FLUSH_RETRY * 2).await;
    assert!(
        g.a_journal.pending().unwrap().is_empty(),
        "flushed within two retries"
    );
    let b =
        g.b.call(
            call("acme", "charge", Some("k"), serde_json::json!(1)),
            || runs.effect(success("from B")),
        )
        .await
        .unwrap();
    assert!(matches!(b.decision, Decision::Replayed { .. }), "{b:?}");
}

/// A clock that moves on a millisecond every time it is read, as real time passes while a "done"
/// write is retried and journaled.
#[derive(Debug)]
struct Ticking(ManualClock);

impl idemgate_core::Clock for Ticking {
    fn now(&self) -> Timestamp {
        self.0.advance(Duration::from_millis(1));
        self.0.now()
    }
}

/// An engine on `store` whose "done" writes the store refuses go to `journal` after one quick
/// retry, judged by `clock`, with no replay cache (every answer comes from the store).
fn journaling(
    store: &FaultyStore<MemoryStore>,
    journal: &Arc<MemoryJournal>,
    clock: Arc<dyn idemgate_core::Clock>,
) -> Engine<FaultyStore<MemoryStore>> {
    Engine::new(store.clone())
        .with_journal(journal.clone())
        .with_clock(clock)
        .with_settings(Settings {
            finish_attempts: 2,
            finish_backoff: Duration::from_millis(5),
            replay_cache: 0,
            ..Settings::default()
        })
}

/// A journaled outcome's first answer and every later replay say one execution time: the time the
/// side effect reported, which the flush stores, not the time the retries and the journal took.
#[tokio::test(start_paused = true)]
async fn a_journaled_answer_and_its_later_replays_say_one_execution_time() {
    let clock = ManualClock::new(Timestamp::from_millis(1_800_000_000_000));
    let store = FaultyStore::new(MemoryStore::with_clock(Arc::new(clock.clone())));
    let journal = Arc::new(MemoryJournal::new());
    let engine = journaling(&store, &journal, Arc::new(Ticking(clock.clone())));
    store.always(Op::Complete, Fault::Refuse);
    let c = call("acme", "charge", Some("j-1"), serde_json::json!(1));
    let first = engine
        .call(c.clone(), || async { success("paid") })
        .await
        .unwrap();
    let Decision::Executed {
        executed_at: answered,
        recording: Recording::Journaled,
        ..
    } = first.decision
    else {
        panic!("expected a journaled execution: {first:?}")
    };
    store.heal();
    engine.flush_journal().await.unwrap();
    assert!(journal.pending().unwrap().is_empty(), "flushed");
    let replay = engine.call(c, || async { success("again") }).await.unwrap();
    let Decision::Replayed { executed_at, .. } = replay.decision else {
        panic!("expected a replay: {replay:?}")
    };
    assert_eq!(executed_at, answered, "one execution time");
}

/// A journaled outcome whose record the store lost (an asynchronous standby promoted, a backup
/// restored) is written back by the flush, with its execution time, and replayed: the next call
/// does not run the action again, and nothing is reported as a takeover. A record that another
/// call holds at a fence not above the entry's is not overwritten: the entry is displaced.
#[tokio::test(start_paused = true)]
async fn a_journaled_outcome_whose_record_the_store_lost_is_written_back() {
    let clock = ManualClock::new(Timestamp::from_millis(1_800_000_000_000));
    let memory = MemoryStore::with_clock(Arc::new(clock.clone()));
    let store = FaultyStore::new(memory.clone());
    let journal = Arc::new(MemoryJournal::new());
    let engine = journaling(&store, &journal, Arc::new(clock.clone()));
    let policy = ToolPolicy::default();
    let runs = Counter::default();
    let lost_one = |k: &str| call("acme", "charge", Some(k), serde_json::json!(1));

    for (k, retry_first) in [("lost-1", false), ("lost-2", true)] {
        let idemgate_core::Begun::Execute(ticket) =
            engine.begin(lost_one(k), &policy).await.unwrap()
        else {
            panic!("expected to run")
        };
        store.always(Op::Complete, Fault::Refuse);
        let first = engine
            .finish(&ticket, runs.effect(success("paid")).await)
            .await;
        let Decision::Executed {
            executed_at: answered,
            recording: Recording::Journaled,
            ..
        } = first.decision
        else {
            panic!("expected a journaled execution: {first:?}")
        };
        store.heal();
        // The store loses the record (its in-flight row is gone).
        memory.release(&ticket.key, ticket.lease).await.unwrap();
        if retry_first {
            // A retry reached the store before the flush: it ran again, and its record stands.
            engine
                .call(lost_one(k), || runs.effect(success("paid again")))
                .await
                .unwrap();
            let report = engine.flush_journal().await.unwrap();
            assert_eq!((report.displaced, report.superseded), (1, 0), "{report:?}");
            continue;
        }
        let report = engine.flush_journal().await.unwrap();
        assert_eq!(
            (report.applied, report.restored, report.superseded),
            (1, 1, 0),
            "{report:?}"
        );
        let again = engine
            .call(lost_one(k), || runs.effect(success("paid again")))
            .await
            .unwrap();
        let Decision::Replayed {
            executed_at,
            outcome,
            ..
        } = again.decision
        else {
            panic!("expected a replay of the written-back outcome: {again:?}")
        };
        assert_eq!(outcome.body, b"paid");
        assert_eq!(
            executed_at, answered,
            "the time it ran, not the time of the flush"
        );
    }
    assert_eq!(
        runs.get(),
        3,
        "lost-1 once; lost-2 ran again before the flush"
    );
    assert!(journal.pending().unwrap().is_empty());
}

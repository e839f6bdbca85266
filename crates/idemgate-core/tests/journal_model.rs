//! The journal and takeovers against the argument of docs/ARCHITECTURE.md ("Journaled outcomes
//! and takeovers"), over random interleavings: gateway A executes while the store is out of reach
//! for everybody, journals and acknowledges the outcome; the store comes back for B first, and for
//! A only `alone` later; B's duplicates arrive at random moments after that, under `retry` or
//! `block`; A's flusher runs as in production.
//!
//! Always: at most one execution per outcome the callers were told of, every answer agrees with
//! the record at the end, nothing stays in the journal. When A rejoins within the settle window
//! less one flush retry (the assumption of the argument), B never runs the call again and never
//! answers unknown: every duplicate replays A's acknowledged outcome.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idemgate_core::faulty::{Fault, FaultyStore, Op};
use idemgate_core::observe::{Event, Observer};
use idemgate_core::{
    Decision, Effect, Engine, EngineError, Journal as _, ManualClock, MemoryJournal, MemoryStore,
    Policies, RecordState, Recording, Settings, Timestamp, ToolPolicy, UnknownPolicy, FLUSH_RETRY,
};
use proptest::prelude::*;

use crate::support::{call, key, Counter};

const LEASE: Duration = Duration::from_secs(5);
const SETTLE: Duration = Duration::from_secs(2);
const ALL_OPS: [Op; 7] = [
    Op::Reserve,
    Op::Takeover,
    Op::Heartbeat,
    Op::Complete,
    Op::Release,
    Op::MarkUnknown,
    Op::Get,
];

/// Counts the journal entries A's flushes reported superseded.
#[derive(Default)]
struct Superseded(AtomicUsize);

impl Observer for Superseded {
    fn observe(&self, event: &Event<'_>) {
        if let Event::Flushed(Ok(report)) = event {
            self.0.fetch_add(report.superseded, Ordering::SeqCst);
        }
    }
}

#[derive(Clone, Debug)]
struct Case {
    on_unknown: UnknownPolicy,
    /// How long the store stays out of reach for everybody after A's effect, past A's lease.
    outage_past_lease_ms: u64,
    /// How much longer A stays cut off after the store is back for B.
    alone_ms: u64,
    /// When B's duplicates arrive, after the store is back for B.
    duplicates_ms: Vec<u64>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop_oneof![Just(UnknownPolicy::Retry), Just(UnknownPolicy::Block)],
        0u64..4_000,
        prop_oneof![3 => 0u64..1_500, 1 => 1_500u64..6_000],
        prop::collection::vec(0u64..5_000, 1..5),
    )
        .prop_map(
            |(on_unknown, outage_past_lease_ms, alone_ms, duplicates_ms)| Case {
                on_unknown,
                outage_past_lease_ms,
                alone_ms,
                duplicates_ms,
            },
        )
}

#[derive(Clone, Debug, PartialEq)]
enum Got {
    Executed(Vec<u8>),
    Replayed(Vec<u8>),
    Unknown,
}

fn got(res: Result<idemgate_core::Answer, EngineError>) -> Got {
    match res
        .expect("no engine error once the store is back")
        .decision
    {
        Decision::Executed { outcome, .. } => Got::Executed(outcome.body),
        Decision::Replayed { outcome, .. } => Got::Replayed(outcome.body),
        Decision::Unknown { .. } => Got::Unknown,
        other => panic!("unexpected decision {other:?}"),
    }
}

fn run(case: Case) -> Result<(), TestCaseError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async move {
        let clock = ManualClock::new(Timestamp::from_millis(1_800_000_000_000));
        // The store's clock follows tokio's (paused, auto-advancing) time in 10 ms steps.
        let ticker = {
            let clock = clock.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    clock.advance(Duration::from_millis(10));
                }
            })
        };
        let store = MemoryStore::with_clock(Arc::new(clock.clone()));
        let a_store = FaultyStore::new(store.clone());
        let b_store = FaultyStore::new(store.clone());
        let policies = Policies::new().with_default(ToolPolicy {
            lease: LEASE,
            wait: Duration::from_secs(1),
            on_unknown: case.on_unknown,
            ..ToolPolicy::default()
        });
        let settings = Settings {
            finish_attempts: 3,
            finish_backoff: Duration::from_millis(5),
            max_poll: Duration::from_millis(50),
            unknown_settle: SETTLE,
            ..Settings::default()
        };
        let superseded = Arc::new(Superseded::default());
        let a_journal = Arc::new(MemoryJournal::new());
        let a = Arc::new(
            Engine::new(a_store.clone())
                .with_policies(policies.clone())
                .with_journal(a_journal.clone())
                .with_clock(Arc::new(clock.clone()))
                .with_settings(settings.clone())
                .with_observer(superseded.clone()),
        );
        let b = Arc::new(
            Engine::new(b_store.clone())
                .with_policies(policies)
                .with_clock(Arc::new(clock.clone()))
                .with_settings(settings),
        );
        let _flusher = a.spawn_journal_flusher(Duration::from_secs(3600));
        let runs = Counter::default();

        // A executes; the store goes out of reach for everybody before the "done" write.
        let acked = {
            let (a_store, b_store) = (a_store.clone(), b_store.clone());
            a.call(
                call("acme", "charge", Some("k"), serde_json::json!(1)),
                || {
                    for op in ALL_OPS {
                        a_store.always(op, Fault::Refuse);
                        b_store.always(op, Fault::Refuse);
                    }
                    runs.effect(Effect::Success(b"from A".to_vec()))
                },
            )
            .await
        };
        let acked = acked.expect("A acknowledges");
        prop_assert!(
            matches!(
                acked.decision,
                Decision::Executed {
                    recording: Recording::Journaled,
                    ..
                }
            ),
            "{:?}",
            acked
        );

        // The outage outlasts A's lease; then the store is back for B, and `alone` later for A.
        tokio::time::sleep(LEASE + Duration::from_millis(case.outage_past_lease_ms)).await;
        b_store.heal();
        let back = tokio::time::Instant::now();
        let rejoin = {
            let a_store = a_store.clone();
            let alone = Duration::from_millis(case.alone_ms);
            tokio::spawn(async move {
                tokio::time::sleep(alone).await;
                a_store.heal();
            })
        };
        let mut duplicates = Vec::new();
        for &at in &case.duplicates_ms {
            let (b, runs) = (b.clone(), runs.clone());
            duplicates.push(tokio::spawn(async move {
                tokio::time::sleep_until(back + Duration::from_millis(at)).await;
                got(b
                    .call(
                        call("acme", "charge", Some("k"), serde_json::json!(1)),
                        || runs.effect(Effect::Success(b"from B".to_vec())),
                    )
                    .await)
            }));
        }
        let mut answers = Vec::new();
        for d in duplicates {
            answers.push(d.await.unwrap());
        }
        rejoin.await.unwrap();
        // Let A's flusher finish whatever it can.
        tokio::time::sleep(FLUSH_RETRY * 4).await;
        ticker.abort();

        let record = b
            .get(&key("acme", "charge", "k"))
            .await
            .unwrap()
            .expect("a record");
        let RecordState::Completed { outcome, .. } = record.state else {
            return Err(TestCaseError::fail(format!(
                "the record is not completed at the end: {record:?}"
            )));
        };
        let stored = outcome.body;
        let runs = runs.get();
        let superseded = superseded.0.load(Ordering::SeqCst);
        prop_assert!(
            a_journal.pending().unwrap().is_empty(),
            "the journal still holds entries"
        );
        // Safety, always: one execution, or two where A's flush reports its entry superseded.
        prop_assert!(
            runs == 1 || (runs == 2 && superseded == 1),
            "runs {} superseded {}",
            runs,
            superseded
        );
        if runs == 1 {
            prop_assert_eq!(&stored, b"from A");
        }
        for g in &answers {
            match g {
                Got::Executed(body) | Got::Replayed(body) => prop_assert_eq!(body, &stored),
                Got::Unknown => prop_assert_eq!(case.on_unknown, UnknownPolicy::Block),
            }
        }
        // The guarantee, within its assumption: A rejoins while B still watches the record (B
        // judges no earlier than SETTLE after its first duplicate found it; A's flusher lands
        // within one FLUSH_RETRY of rejoining; 100 ms of slack for the 10 ms clock steps).
        let first_sight = *case.duplicates_ms.iter().min().unwrap();
        let flushed_by = case.alone_ms + FLUSH_RETRY.as_millis() as u64 + 100;
        if flushed_by < first_sight + SETTLE.as_millis() as u64 {
            prop_assert_eq!(runs, 1);
            prop_assert_eq!(superseded, 0);
            for g in &answers {
                prop_assert_eq!(g, &Got::Replayed(b"from A".to_vec()));
            }
        }
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn journaled_outcomes_survive_takeovers_within_the_settle_window(c in case()) {
        run(c)?;
    }
}

//! Shadow mode (`mode = "observe"`): every call runs, and what enforce mode would have answered
//! is written into the history of the record the call duplicates and told to the observers.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idemgate_core::faulty::{Fault, Op};
use idemgate_core::{
    Decision, Effect, Event, Happening, HistoryEntry, KeyRule, Mode, Observer, Policies,
    RecordState, Store, ToolPolicy, UnknownPolicy, Verdict,
};
use serde_json::json;
use tokio::sync::Notify;

use crate::support::{call, key, rig, Counter, Rig, LEASE};

fn success(body: &str) -> Effect {
    Effect::Success(body.as_bytes().to_vec())
}

pub(crate) fn observing() -> ToolPolicy {
    ToolPolicy {
        lease: LEASE,
        mode: Mode::Observe,
        ..ToolPolicy::default()
    }
}

/// One observation as the observers were told: (tool, would, rule, whether a record was named).
pub(crate) type Told = (String, Verdict, Option<KeyRule>, bool);

/// What the observers were told of observations.
#[derive(Default)]
pub(crate) struct Seen(pub(crate) Mutex<Vec<Told>>);

impl Observer for Seen {
    fn observe(&self, event: &Event<'_>) {
        if let Event::Observed {
            tool,
            key,
            would,
            rule,
            ..
        } = event
        {
            self.0
                .lock()
                .unwrap()
                .push((tool.to_string(), *would, *rule, key.is_some()));
        }
    }
}

pub(crate) fn observed_rig(policy: ToolPolicy) -> (Rig, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let mut r = rig(Policies::new().with_default(policy));
    let engine = Arc::try_unwrap(r.engine).unwrap_or_else(|_| unreachable!("just built"));
    r.engine = Arc::new(engine.with_observer(seen.clone()));
    (r, seen)
}

async fn observations(r: &Rig, tool: &str, k: &str) -> Vec<HistoryEntry> {
    r.engine
        .history(&key("acme", tool, k))
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.what == Happening::Observed)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_duplicate_runs_and_its_record_says_it_would_have_been_replayed() {
    let (r, seen) = observed_rig(observing());
    let runs = Counter::default();
    let c = call("acme", "charge", Some("k1"), json!({"amount": 5}));
    let first = r
        .engine
        .call(c.clone(), || runs.effect(success("first")))
        .await
        .unwrap();
    assert!(
        matches!(first.decision, Decision::Executed { .. }),
        "{first:?}"
    );
    r.clock.advance(Duration::from_secs(3));
    for n in 0..2 {
        let again = r
            .engine
            .call(c.clone(), || runs.effect(success("again")))
            .await
            .unwrap();
        match again.decision {
            Decision::PassedThrough {
                effect: Effect::Success(body),
            } => assert_eq!(body, b"again", "call {n} ran and got its own result"),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(runs.get(), 3, "nothing is suppressed in observe mode");
    // The record is the first call's, untouched: switching to enforce replays it.
    let record = r.engine.get(&key("acme", "charge", "k1")).await.unwrap();
    let record = record.expect("the fresh call's record");
    let RecordState::Completed { outcome, .. } = &record.state else {
        panic!("{record:?}")
    };
    assert_eq!(outcome.body, b"first");
    assert_eq!(record.fence, 1);
    let entries = observations(&r, "charge", "k1").await;
    assert_eq!(entries.len(), 2, "{entries:?}");
    for e in &entries {
        assert_eq!(e.would.as_deref(), Some("replayed"));
        assert_eq!(e.rule.as_deref(), Some("key"));
        let reason = e.reason.as_deref().unwrap();
        assert!(reason.contains("would have replayed"), "{reason}");
    }
    assert_eq!(
        *seen.0.lock().unwrap(),
        vec![
            (
                "charge".to_owned(),
                Verdict::Replayed,
                Some(KeyRule::Explicit),
                true
            ),
            (
                "charge".to_owned(),
                Verdict::Replayed,
                Some(KeyRule::Explicit),
                true
            ),
        ]
    );

    // One line to enforce: the same records, now acted on.
    let enforcing = ToolPolicy {
        mode: Mode::Enforce,
        ..observing()
    };
    let replayed = r
        .engine
        .call_with_policy(c, &enforcing, || runs.effect(success("never")))
        .await
        .unwrap();
    match replayed.decision {
        Decision::Replayed { outcome, .. } => assert_eq!(outcome.body, b"first"),
        other => panic!("{other:?}"),
    }
    assert_eq!(runs.get(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_duplicate_of_a_call_in_flight_runs_at_once_instead_of_waiting() {
    let (r, seen) = observed_rig(ToolPolicy {
        wait: Duration::from_secs(3600),
        ..observing()
    });
    let (started, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let (s, g) = (started.clone(), release.clone());
    let engine = r.engine.clone();
    let first = tokio::spawn(async move {
        engine
            .call(
                call("acme", "mail", Some("m"), json!({"to": "a"})),
                || async move {
                    s.notify_one();
                    g.notified().await;
                    success("sent")
                },
            )
            .await
            .unwrap()
    });
    started.notified().await;
    // The first call still runs: enforce mode would wait up to an hour. Observe mode does not
    // wait at all (the paused clock would show any wait as an advance).
    let before = tokio::time::Instant::now();
    let second = r
        .engine
        .call(
            call("acme", "mail", Some("m"), json!({"to": "a"})),
            || async { success("sent again") },
        )
        .await
        .unwrap();
    assert_eq!(tokio::time::Instant::now(), before, "no wait");
    assert!(
        matches!(second.decision, Decision::PassedThrough { .. }),
        "{second:?}"
    );
    release.notify_one();
    let first = first.await.unwrap();
    assert!(
        matches!(first.decision, Decision::Executed { .. }),
        "{first:?}"
    );
    let entries = observations(&r, "mail", "m").await;
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0].would.as_deref(), Some("in_flight"));
    assert!(
        entries[0]
            .reason
            .as_deref()
            .unwrap()
            .contains("waited up to 1h"),
        "{entries:?}"
    );
    assert_eq!(seen.0.lock().unwrap()[0].1, Verdict::InFlight);
}

#[tokio::test(start_paused = true)]
async fn refusals_run_and_are_recorded_with_what_enforce_would_have_said() {
    let (r, seen) = observed_rig(observing());
    let runs = Counter::default();
    // Key reuse: the same key with other arguments.
    r.engine
        .call(call("acme", "charge", Some("k"), json!(1)), || {
            runs.effect(success("one"))
        })
        .await
        .unwrap();
    let reused = r
        .engine
        .call(call("acme", "charge", Some("k"), json!(2)), || {
            runs.effect(success("two"))
        })
        .await
        .unwrap();
    assert!(matches!(reused.decision, Decision::PassedThrough { .. }));
    let entries = observations(&r, "charge", "k").await;
    assert_eq!(entries[0].would.as_deref(), Some("key_reused"));
    // A write without a key or window: no record names it, the observers hear of it.
    let keyless = r
        .engine
        .call(call("acme", "charge", None, json!(3)), || {
            runs.effect(success("three"))
        })
        .await
        .unwrap();
    assert!(matches!(keyless.decision, Decision::PassedThrough { .. }));
    assert_eq!(runs.get(), 3);
    assert_eq!(
        seen.0.lock().unwrap()[1],
        ("charge".to_owned(), Verdict::KeyRequired, None, false)
    );
}

#[tokio::test(start_paused = true)]
async fn an_unknown_record_is_left_as_it_is_and_the_duplicate_runs() {
    for (on_unknown, would) in [
        (UnknownPolicy::Block, "unknown"),
        (UnknownPolicy::Retry, "execute"),
        (UnknownPolicy::Verify, "unknown"),
    ] {
        let (r, _) = observed_rig(ToolPolicy {
            on_unknown,
            ..observing()
        });
        let c = call("acme", "charge", Some("k"), json!(1));
        let first = r
            .engine
            .call(c.clone(), || async {
                Effect::Ambiguous("the bank timed out".into())
            })
            .await
            .unwrap();
        assert!(matches!(first.decision, Decision::Unknown { .. }));
        let again = r.engine.call(c, || async { success("ran") }).await.unwrap();
        assert!(
            matches!(again.decision, Decision::PassedThrough { .. }),
            "{on_unknown}: {again:?}"
        );
        let record = r.engine.get(&key("acme", "charge", "k")).await.unwrap();
        let record = record.unwrap();
        assert!(
            matches!(record.state, RecordState::Unknown { .. }),
            "observe mode neither takes over nor verifies: {record:?}"
        );
        assert_eq!(record.fence, 1);
        let entries = observations(&r, "charge", "k").await;
        assert_eq!(entries[0].would.as_deref(), Some(would), "{on_unknown}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_reworded_call_within_the_window_is_observed_under_the_window_rule() {
    let (r, seen) = observed_rig(ToolPolicy {
        fallback_window: Some(Duration::from_secs(60)),
        identity: vec!["to".into()],
        ..observing()
    });
    let runs = Counter::default();
    let mail = |body: &str| {
        let args = json!({"to": "ann@example.com", "body": body}).to_string();
        call("acme", "mail", None, json!(null))
            .args_text(args.as_bytes())
            .unwrap()
            .identity(args.as_bytes(), &["to".to_owned()])
    };
    for body in ["hello", "Hello again, reworded"] {
        r.engine
            .call(mail(body), || runs.effect(success("sent")))
            .await
            .unwrap();
    }
    assert_eq!(runs.get(), 2);
    assert_eq!(
        seen.0.lock().unwrap()[0],
        (
            "mail".to_owned(),
            Verdict::Replayed,
            Some(KeyRule::Fallback),
            true
        )
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_reservation_runs_the_call_without_a_record() {
    let (r, seen) = observed_rig(observing());
    r.store.once(Op::Reserve, Fault::Refuse);
    let runs = Counter::default();
    let answer = r
        .engine
        .call(call("acme", "charge", Some("k"), json!(1)), || {
            runs.effect(success("ran"))
        })
        .await
        .unwrap();
    assert!(matches!(answer.decision, Decision::PassedThrough { .. }));
    assert_eq!(runs.get(), 1);
    assert!(r
        .store
        .get(&key("acme", "charge", "k"))
        .await
        .unwrap()
        .is_none());
    assert_eq!(
        seen.0.lock().unwrap()[0],
        (
            "charge".to_owned(),
            Verdict::StoreUnavailable,
            Some(KeyRule::Explicit),
            false
        )
    );
}

#[tokio::test(start_paused = true)]
async fn an_expired_record_is_observed_as_the_refusal_enforce_would_give() {
    let (r, _) = observed_rig(ToolPolicy {
        ttl: Duration::from_secs(60),
        ..observing()
    });
    let c = call("acme", "charge", Some("k"), json!(1));
    r.engine
        .call(c.clone(), || async { success("one") })
        .await
        .unwrap();
    r.clock.advance(Duration::from_secs(120));
    let again = r.engine.call(c, || async { success("two") }).await.unwrap();
    assert!(matches!(again.decision, Decision::PassedThrough { .. }));
    let entries = observations(&r, "charge", "k").await;
    assert_eq!(entries[0].would.as_deref(), Some("expired"));
}

#[tokio::test(start_paused = true)]
async fn a_call_nested_in_an_observed_one_is_observed_once_unless_it_is_another_tools() {
    let (r, seen) = observed_rig(ToolPolicy {
        fallback_window: Some(Duration::from_secs(60)),
        ..observing()
    });
    // A door's shape: the call id's record, and inside its side effect the window's record of
    // the same tool; the side effect also calls another tool, whose duplicate is its own.
    let nested = |engine: Arc<idemgate_core::Engine<crate::support::TestStore>>| async move {
        let outer = call("acme", "mail", Some("call-1"), json!({"to": "ann"}));
        let e = engine.clone();
        engine
            .call(outer, move || async move {
                let window = call("acme", "mail", None, json!({"to": "ann"}));
                let inner = e.call(window, || async { success("sent") }).await.unwrap();
                let other = call("acme", "audit", Some("audit-1"), json!(1));
                e.call(other, || async { success("noted") }).await.unwrap();
                match inner.decision {
                    Decision::Executed { outcome, .. } | Decision::Replayed { outcome, .. } => {
                        Effect::Success(outcome.body)
                    }
                    Decision::PassedThrough { effect } => effect,
                    other => panic!("{other:?}"),
                }
            })
            .await
            .unwrap()
    };
    nested(r.engine.clone()).await;
    assert!(seen.0.lock().unwrap().is_empty(), "the first call is fresh");
    nested(r.engine.clone()).await;
    let told: Vec<(String, Option<KeyRule>)> = seen
        .0
        .lock()
        .unwrap()
        .iter()
        .map(|(tool, _, rule, _)| (tool.clone(), *rule))
        .collect();
    assert_eq!(
        told,
        [
            ("mail".to_owned(), Some(KeyRule::Explicit)),
            ("audit".to_owned(), Some(KeyRule::Explicit)),
        ],
        "the window inside the call id's record is not observed again; the other tool is"
    );
    // A door that runs the side effect itself says so on the nested call.
    let window = call("acme", "mail", None, json!({"to": "ann"})).within_observed(true);
    let policy = ToolPolicy {
        fallback_window: Some(Duration::from_secs(60)),
        ..observing()
    };
    let begun = r.engine.begin(window, &policy).await.unwrap();
    assert_eq!(begun, idemgate_core::Begun::PassThrough);
    assert_eq!(seen.0.lock().unwrap().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_record_keeps_at_most_its_cap_of_observations_and_the_observers_hear_every_one() {
    let (r, seen) = observed_rig(observing());
    let c = call("acme", "charge", Some("loop"), json!(1));
    let extra = 5;
    for _ in 0..=idemgate_core::MAX_OBSERVATIONS + extra {
        let answer = r
            .engine
            .call(c.clone(), || async { success("ran") })
            .await
            .unwrap();
        assert!(!matches!(answer.decision, Decision::Replayed { .. }));
    }
    assert_eq!(
        observations(&r, "charge", "loop").await.len(),
        idemgate_core::MAX_OBSERVATIONS
    );
    assert_eq!(
        seen.0.lock().unwrap().len(),
        idemgate_core::MAX_OBSERVATIONS + extra
    );
}

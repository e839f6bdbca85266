//! The history the engine leaves on a record (`idemgate_core::history`): why its outcome became
//! unknown, a late outcome the store refused, a retry after unknown, and who resolved or reopened
//! it and why. A call that reserves and completes leaves none.

use std::time::Duration;

use idemgate_core::faulty::{Fault, Op};
use idemgate_core::{
    Decision, Effect, Happening, HistoryEntry, Keep, Outcome, Policies, Recording, Resolution,
    State, ToolPolicy, UnknownPolicy,
};
use serde_json::json;

use crate::support::{a_zombie_outlived_by_its_taker, call, default_rig, key, rig, LEASE};

fn success(body: &str) -> Effect {
    Effect::Success(body.as_bytes().to_vec())
}

fn whats(history: &[HistoryEntry]) -> Vec<Happening> {
    history.iter().map(|e| e.what).collect()
}

#[tokio::test]
async fn a_fresh_call_leaves_no_history_and_an_ambiguous_one_its_reason() {
    let r = default_rig();
    r.engine
        .call(call("acme", "mail", Some("fresh"), json!(1)), || async {
            success("sent")
        })
        .await
        .unwrap();
    let fresh = key("acme", "mail", "fresh");
    assert!(r.engine.history(&fresh).await.unwrap().is_empty());

    r.engine
        .call(call("acme", "mail", Some("m-1"), json!(1)), || async {
            Effect::Ambiguous("smtp timeout after DATA".into())
        })
        .await
        .unwrap();
    let k = key("acme", "mail", "m-1");
    let history = r.engine.history(&k).await.unwrap();
    assert_eq!(whats(&history), [Happening::BecameUnknown]);
    assert_eq!(
        history[0].reason.as_deref(),
        Some("smtp timeout after DATA")
    );
    assert_eq!(history[0].fence, 1);
    assert_eq!(history[0].by, None);
}

#[tokio::test]
async fn operators_are_named_on_the_trail_and_a_released_record_keeps_it() {
    let r = default_rig();
    for k in ["done", "undo"] {
        r.engine
            .call(call("acme", "charge", Some(k), json!(1)), || async {
                Effect::Ambiguous("gateway 504".into())
            })
            .await
            .unwrap();
    }
    let done = key("acme", "charge", "done");
    let fence = r.engine.get(&done).await.unwrap().unwrap().fence;
    r.engine
        .resolve(
            &done,
            fence,
            Resolution::Completed {
                outcome: Outcome::success(b"{}".to_vec()),
                keep: Keep::replay(Duration::from_secs(60)),
            },
            Some("alice"),
            Some("found in the ledger"),
        )
        .await
        .unwrap();
    let history = r.engine.history(&done).await.unwrap();
    assert_eq!(
        whats(&history),
        [Happening::BecameUnknown, Happening::ResolvedCompleted]
    );
    assert_eq!(history[1].by.as_deref(), Some("alice"));
    assert_eq!(history[1].reason.as_deref(), Some("found in the ledger"));
    assert_eq!(history[1].fence, fence, "the fence the operator acted on");

    // Released: the record counts as absent but keeps its trail and its fence; the next call
    // runs at a higher fence and continues the trail.
    let undo = key("acme", "charge", "undo");
    let fence = r.engine.get(&undo).await.unwrap().unwrap().fence;
    r.engine
        .resolve(
            &undo,
            fence,
            Resolution::Release,
            Some("bob"),
            Some("never sent"),
        )
        .await
        .unwrap();
    assert!(r.engine.get(&undo).await.unwrap().is_none());
    let history = r.engine.history(&undo).await.unwrap();
    assert_eq!(
        whats(&history),
        [Happening::BecameUnknown, Happening::ResolvedReleased]
    );
    let again = r
        .engine
        .call(call("acme", "charge", Some("undo"), json!(1)), || async {
            success("ran")
        })
        .await
        .unwrap();
    assert!(matches!(again.decision, Decision::Executed { .. }));
    let rec = r.engine.get(&undo).await.unwrap().unwrap();
    assert!(
        rec.fence > fence + 1,
        "a released record's fence goes on: {} after {fence}",
        rec.fence
    );
    assert_eq!(r.engine.history(&undo).await.unwrap().len(), 2);

    // Reopened, with the state it had.
    r.engine
        .reopen(&undo, rec.fence, Some("carol"), Some("the charge bounced"))
        .await
        .unwrap();
    let history = r.engine.history(&undo).await.unwrap();
    let last = history.last().unwrap();
    assert_eq!(
        (last.what, last.was, last.by.as_deref()),
        (Happening::Reopened, Some(State::Completed), Some("carol"))
    );
}

#[tokio::test(start_paused = true)]
async fn a_late_outcome_says_what_the_refused_holder_reported() {
    let r = rig(Policies::new().with_default(ToolPolicy {
        on_unknown: UnknownPolicy::Retry,
        lease: LEASE,
        ..ToolPolicy::default()
    }));
    let (_, z) = a_zombie_outlived_by_its_taker(&r).await;
    assert!(matches!(
        z.decision,
        Decision::Executed {
            recording: Recording::LeaseLost,
            ..
        }
    ));
    let history = r.engine.history(&key("acme", "charge", "k")).await.unwrap();
    assert_eq!(
        whats(&history),
        [
            Happening::RetriedAfterUnknown,
            Happening::LateOutcomeRefused
        ],
        "{history:?}"
    );
    assert_eq!(history[0].fence, 1);
    let late = &history[1];
    assert_eq!(late.fence, 1, "the stale fence");
    let reason = late.reason.as_deref().unwrap();
    assert!(reason.contains("reported success"), "{reason}");
}

#[tokio::test]
async fn a_history_that_cannot_be_written_never_fails_the_call() {
    let r = default_rig();
    r.store.always(Op::AppendHistory, Fault::Refuse);
    let a = r
        .engine
        .call(call("acme", "mail", Some("m"), json!(1)), || async {
            Effect::Ambiguous("timeout".into())
        })
        .await
        .unwrap();
    assert!(
        matches!(
            a.decision,
            Decision::Unknown {
                recording: Some(Recording::Stored),
                ..
            }
        ),
        "{a:?}"
    );
    let k = key("acme", "mail", "m");
    assert_eq!(
        r.engine.get(&k).await.unwrap().unwrap().state_name(),
        State::Unknown
    );
    assert!(r.engine.history(&k).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_duplicate_of_an_unknown_outcome_is_told_the_reason_its_call_gave() {
    let r = default_rig();
    let c = || call("acme", "mail", Some("m-2"), json!(1));
    r.engine
        .call(c(), || async { Effect::Ambiguous("smtp timeout".into()) })
        .await
        .unwrap();
    let dup = r
        .engine
        .call(c(), || async {
            unreachable!("an unknown outcome never runs again")
        })
        .await
        .unwrap();
    match dup.decision {
        Decision::Unknown {
            ran_here: false,
            message: Some(m),
            ..
        } => assert_eq!(m, "the call that ran it reported: smtp timeout"),
        other => panic!("{other:?}"),
    }
}

//! Reopening records (`Engine::reopen`), the replay cache's freshness across engines, and the
//! scope kept on records.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idemgate_core::{
    Begun, Call, Decision, Effect, Engine, EngineError, Event, Keep, ListFilter, Observer, Outcome,
    Resolution, Settings, State, ToolPolicy,
};
use serde_json::json;

use crate::support::{call, default_rig, key, Counter, Rig, TestStore};

fn success(body: &str) -> Effect {
    Effect::Success(body.as_bytes().to_vec())
}

/// The operator events an engine told, as text.
#[derive(Default)]
struct Told(Mutex<Vec<String>>);

impl Observer for Told {
    fn observe(&self, event: &Event<'_>) {
        let line = match event {
            Event::Reopened {
                key,
                fence,
                was,
                by,
                reason,
            } => format!(
                "reopened {} at {fence} was {was} by {by:?} for {reason:?}",
                key.key
            ),
            Event::Resolved {
                key,
                fence,
                released,
                by,
                reason,
            } => format!(
                "resolved {} at {fence} released {released} by {by:?} for {reason:?}",
                key.key
            ),
            _ => return,
        };
        self.0.lock().unwrap().push(line);
    }
}

impl Told {
    fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

/// An engine on the rig's store, and what it tells its observers of operators.
fn told_engine(r: &Rig) -> (Engine<TestStore>, Arc<Told>) {
    let told = Arc::new(Told::default());
    let engine = Engine::new(r.store.clone())
        .with_clock(Arc::new(r.clock.clone()))
        .with_observer(told.clone());
    (engine, told)
}

/// Runs `c` (its outcome "one"), then replays it from the store, which `engine` then keeps.
async fn run_then_cache<S: idemgate_core::Store>(engine: &Engine<S>, c: &Call, runs: &Counter) {
    engine
        .call(c.clone(), || runs.effect(success("one")))
        .await
        .unwrap();
    let replay = engine
        .call(c.clone(), || runs.effect(success("never")))
        .await
        .unwrap();
    assert!(matches!(replay.decision, Decision::Replayed { .. }));
}

#[tokio::test(start_paused = true)]
async fn a_reopened_completed_record_runs_again_at_once_on_the_engine_that_reopened_it() {
    let r = default_rig();
    let (engine, told) = told_engine(&r);
    let runs = Counter::default();
    let c = call("acme", "charge", Some("k1"), json!(1));
    run_then_cache(&engine, &c, &runs).await;
    let k = key("acme", "charge", "k1");
    let fence = engine.get(&k).await.unwrap().unwrap().fence;

    let err = engine
        .reopen(&k, fence + 1, Some("alice"), Some("wrong fence"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, EngineError::NotReopenable { state: State::Completed, fence: f, .. } if f == fence),
        "{err}"
    );
    assert!(engine.get(&k).await.unwrap().is_some(), "nothing changed");

    let was = engine
        .reopen(&k, fence, Some("alice"), Some("the charge bounced"))
        .await
        .unwrap();
    assert_eq!(was, State::Completed);
    assert!(engine.get(&k).await.unwrap().is_none());
    assert_eq!(
        told.lines(),
        [format!(
            "reopened k1 at {fence} was completed by Some(\"alice\") for Some(\"the charge bounced\")"
        )]
    );
    // No time passes: the engine's own copy went with the record.
    let again = engine
        .call(c, || runs.effect(success("two")))
        .await
        .unwrap();
    assert!(
        matches!(again.decision, Decision::Executed { ref outcome, .. } if outcome.body == b"two"),
        "{again:?}"
    );
    assert_eq!(runs.get(), 2);
    // The call that ran again holds a higher fence: a reopening retried at the old one (a lost
    // answer, a second click) is refused instead of reopening the new outcome.
    let now = engine.get(&k).await.unwrap().unwrap();
    assert!(now.fence > fence, "{now:?}");
    let err = engine.reopen(&k, fence, None, None).await.unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::NotReopenable {
                state: State::Completed,
                ..
            }
        ),
        "{err}"
    );
    let replay = engine
        .call(call("acme", "charge", Some("k1"), json!(1)), || {
            runs.effect(success("three"))
        })
        .await
        .unwrap();
    assert!(
        matches!(replay.decision, Decision::Replayed { ref outcome, .. } if outcome.body == b"two")
    );
    assert_eq!(runs.get(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_reopened_unknown_record_runs_again_and_resolutions_are_audited() {
    let r = default_rig();
    let (engine, told) = told_engine(&r);
    let runs = Counter::default();
    let ck = |k| call("acme", "charge", Some(k), json!(1));
    for k in ["lost", "checked"] {
        engine
            .call(ck(k), || runs.effect(Effect::Ambiguous("timeout".into())))
            .await
            .unwrap();
    }
    let lost = key("acme", "charge", "lost");
    let fence = engine.get(&lost).await.unwrap().unwrap().fence;
    let was = engine
        .reopen(&lost, fence, Some("bob"), Some("the provider never got it"))
        .await
        .unwrap();
    assert_eq!(was, State::Unknown);
    assert!(engine.get(&lost).await.unwrap().is_none());
    let again = engine
        .call(ck("lost"), || runs.effect(success("ran")))
        .await
        .unwrap();
    assert!(matches!(again.decision, Decision::Executed { .. }));
    let now = engine.get(&lost).await.unwrap().unwrap();
    assert!(now.fence > fence, "fences keep growing: {now:?}");
    assert!(matches!(
        engine.reopen(&lost, fence, None, None).await,
        Err(EngineError::NotReopenable { .. })
    ));

    let checked = key("acme", "charge", "checked");
    let fence = engine.get(&checked).await.unwrap().unwrap().fence;
    engine
        .resolve(
            &checked,
            fence,
            Resolution::Completed {
                outcome: Outcome::success(b"by hand".to_vec()),
                keep: Keep::replay(Duration::from_secs(60)),
            },
            Some("bob"),
            Some("seen in the ledger"),
        )
        .await
        .unwrap();
    assert_eq!(
        told.lines()[1],
        format!(
            "resolved checked at {fence} released false by Some(\"bob\") for Some(\"seen in the ledger\")"
        )
    );
}

#[tokio::test(start_paused = true)]
async fn a_record_in_flight_is_never_reopened() {
    let r = default_rig();
    let c = call("acme", "charge", Some("busy"), json!(1));
    let policy = ToolPolicy::default();
    let Begun::Execute(ticket) = r.engine.begin(c.clone(), &policy).await.unwrap() else {
        panic!("the first call executes")
    };
    let k = key("acme", "charge", "busy");
    let err = r
        .engine
        .reopen(&k, ticket.lease.fence, Some("alice"), Some("stuck?"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::NotReopenable {
                state: State::InFlight,
                ..
            }
        ),
        "{err}"
    );
    let said = err.to_string();
    assert!(
        said.contains("run the action twice") && said.contains("wait until it finishes"),
        "{said}"
    );
    // The holder is unharmed.
    let done = r.engine.finish(&ticket, success("done")).await;
    assert!(matches!(done.decision, Decision::Executed { .. }));
}

#[tokio::test(start_paused = true)]
async fn a_record_past_its_tombstone_is_not_found_for_reopening() {
    let r = default_rig();
    let c = call("acme", "charge", Some("old"), json!(1));
    r.engine.call(c, || async { success("x") }).await.unwrap();
    let k = key("acme", "charge", "old");
    let fence = r.engine.get(&k).await.unwrap().unwrap().fence;
    r.clock
        .advance(idemgate_core::DEFAULT_TOMBSTONE + Duration::from_secs(1));
    let err = r.engine.reopen(&k, fence, None, None).await.unwrap_err();
    assert!(matches!(err, EngineError::NotFound { .. }), "{err}");
}

/// A retry after the ttl meets the tombstone: it is told the action ran and when, and nothing
/// runs; reopening the tombstone (an operator who wants the action again) lets the next call run.
#[tokio::test(start_paused = true)]
async fn a_retry_after_the_ttl_is_told_expired_until_the_tombstone_is_reopened() {
    let r = default_rig();
    let runs = Counter::default();
    let c = call("acme", "charge", Some("late"), json!(1));
    let first = r
        .engine
        .call(c.clone(), || runs.effect(success("x")))
        .await
        .unwrap();
    let Decision::Executed { executed_at, .. } = first.decision else {
        panic!("{first:?}")
    };
    r.clock
        .advance(ToolPolicy::default().ttl + Duration::from_secs(1));
    let retry = r
        .engine
        .call(c.clone(), || runs.effect(success("again")))
        .await
        .unwrap();
    let k = key("acme", "charge", "late");
    let fence = match retry.decision {
        Decision::Expired {
            executed_at: ran,
            fence,
            ..
        } => {
            assert_eq!(ran, executed_at, "it says when the action ran");
            fence
        }
        other => panic!("expected expired, got {other:?}"),
    };
    assert_eq!(runs.get(), 1, "nothing ran");
    assert_eq!(
        r.engine.get(&k).await.unwrap().unwrap().state_name(),
        State::Expired
    );
    assert_eq!(
        r.engine
            .reopen(&k, fence, Some("alice"), None)
            .await
            .unwrap(),
        State::Expired
    );
    let again = r
        .engine
        .call(c, || runs.effect(success("again")))
        .await
        .unwrap();
    assert!(
        matches!(again.decision, Decision::Executed { .. }),
        "{again:?}"
    );
    assert_eq!(runs.get(), 2);
}

/// A tool whose policy keeps no tombstone runs a retry after its ttl again, as before tombstones.
#[tokio::test(start_paused = true)]
async fn a_tool_without_a_tombstone_runs_a_retry_after_its_ttl() {
    let r = crate::support::rig(idemgate_core::Policies::new().with_default(ToolPolicy {
        tombstone: Duration::ZERO,
        ..ToolPolicy::default()
    }));
    let runs = Counter::default();
    let c = call("acme", "charge", Some("late"), json!(1));
    r.engine
        .call(c.clone(), || runs.effect(success("x")))
        .await
        .unwrap();
    r.clock
        .advance(ToolPolicy::default().ttl + Duration::from_secs(1));
    let again = r
        .engine
        .call(c, || runs.effect(success("y")))
        .await
        .unwrap();
    assert!(
        matches!(again.decision, Decision::Executed { .. }),
        "{again:?}"
    );
    assert_eq!(runs.get(), 2);
}

/// Two engines on one store, as two proxies or workers on one SQLite file: what one reopens,
/// the other's cached copy replays for at most `replay_cache_fresh`, then the action runs again.
#[tokio::test(start_paused = true)]
async fn another_engines_copy_replays_a_reopened_record_only_until_the_freshness_bound() {
    let r = default_rig();
    let engine = |fresh| {
        Engine::new(r.store.clone())
            .with_clock(Arc::new(r.clock.clone()))
            .with_settings(Settings {
                replay_cache_fresh: fresh,
                ..Settings::default()
            })
    };
    let a = engine(Duration::from_secs(2));
    let b = engine(Duration::from_secs(2));
    let runs = Counter::default();
    let c = call("acme", "charge", Some("shared"), json!(1));
    run_then_cache(&a, &c, &runs).await;

    let k = key("acme", "charge", "shared");
    let fence = b.get(&k).await.unwrap().unwrap().fence;
    b.reopen(&k, fence, Some("carol"), Some("redo"))
        .await
        .unwrap();

    tokio::time::advance(Duration::from_millis(1_900)).await;
    let within = a
        .call(c.clone(), || runs.effect(success("too early")))
        .await
        .unwrap();
    assert!(
        matches!(within.decision, Decision::Replayed { ref outcome, .. } if outcome.body == b"one"),
        "within the bound the copy still answers: {within:?}"
    );
    assert_eq!(runs.get(), 1);

    tokio::time::advance(Duration::from_millis(200)).await;
    let after = a.call(c, || runs.effect(success("two"))).await.unwrap();
    assert!(
        matches!(after.decision, Decision::Executed { ref outcome, .. } if outcome.body == b"two"),
        "past the bound the store decides: {after:?}"
    );
    assert_eq!(runs.get(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_record_keeps_the_scope_of_its_call_and_lists_by_it() {
    let r = default_rig();
    for (k, scope) in [
        ("a", Some("conversation:1")),
        ("b", Some("conversation:2")),
        ("c", None),
    ] {
        let mut c = call("acme", "send", Some(k), json!(1));
        if let Some(s) = scope {
            c = c.scope(s);
        }
        r.engine.call(c, || async { success("x") }).await.unwrap();
    }
    let a = r
        .engine
        .get(&key("acme", "send", "a"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(a.scope.as_deref(), Some("conversation:1"));
    let c = r
        .engine
        .get(&key("acme", "send", "c"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(c.scope, None);
    let listed = r
        .engine
        .list(&ListFilter {
            scope: Some("conversation:2".into()),
            ..ListFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(
        listed
            .iter()
            .map(|r| r.key.key.as_str())
            .collect::<Vec<_>>(),
        ["b"]
    );
    let json = serde_json::to_value(&a).unwrap();
    assert_eq!(json["scope"], "conversation:1");
    assert!(serde_json::to_value(&c).unwrap().get("scope").is_none());
}

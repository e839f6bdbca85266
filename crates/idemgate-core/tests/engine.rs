//! Engine behaviours and failpoint tests: one test per decision of the contract.

use std::sync::Arc;
use std::time::Duration;

use idemgate_core::faulty::{Fault, Op};
use idemgate_core::{
    Decision, Effect, Engine, EngineError, Fingerprint, Keep, KeyRule, ManualClock, MemoryStore,
    Outcome, OutcomeKind, Policies, Probe, ProbeFuture, RecordState, Recording, Resolution, State,
    Store, Timestamp, ToolKind, ToolPolicy, UnknownPolicy, Verifier,
};
use serde_json::json;
use tokio::sync::Notify;

use crate::support::{a_zombie_outlived_by_its_taker, call, default_rig, key, rig, Counter, LEASE};

fn success(body: &str) -> Effect {
    Effect::Success(body.as_bytes().to_vec())
}

#[tokio::test(start_paused = true)]
async fn executes_once_then_replays_with_time_and_rule() {
    let r = default_rig();
    let runs = Counter::default();
    let c = call("acme", "charge", Some("k1"), json!({"amount": 5}));
    let first = r
        .engine
        .call(c.clone(), || runs.effect(success("ok")))
        .await
        .unwrap();
    let Decision::Executed {
        executed_at,
        expires_at,
        recording,
        ..
    } = first.decision.clone()
    else {
        panic!("{first:?}")
    };
    assert_eq!(recording, Recording::Stored);
    assert_eq!(first.rule, Some(KeyRule::Explicit));
    assert_eq!(expires_at, executed_at.plus(Duration::from_secs(24 * 3600)));
    r.clock.advance(Duration::from_secs(60));
    for _ in 0..3 {
        let again = r
            .engine
            .call(c.clone(), || runs.effect(success("twice")))
            .await
            .unwrap();
        match again.decision {
            Decision::Replayed {
                outcome,
                executed_at: at,
                verified,
                ..
            } => {
                assert_eq!(outcome.body, b"ok");
                assert_eq!(
                    at, executed_at,
                    "a replay carries the original execution time"
                );
                assert!(!verified);
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(runs.get(), 1);
}

#[tokio::test(start_paused = true)]
async fn equal_arguments_in_another_order_replay() {
    let r = default_rig();
    let runs = Counter::default();
    let a = call("acme", "charge", Some("k"), json!({"a": 1, "b": [1, 2]}));
    let b = call("acme", "charge", Some("k"), json!({"b": [1, 2], "a": 1}));
    r.engine
        .call(a, || runs.effect(success("x")))
        .await
        .unwrap();
    let again = r
        .engine
        .call(b, || runs.effect(success("y")))
        .await
        .unwrap();
    assert!(matches!(again.decision, Decision::Replayed { .. }));
    assert_eq!(runs.get(), 1);
}

#[tokio::test(start_paused = true)]
async fn key_reused_with_other_arguments_is_refused() {
    let r = default_rig();
    let runs = Counter::default();
    r.engine
        .call(
            call("acme", "charge", Some("k"), json!({"amount": 5})),
            || runs.effect(success("x")),
        )
        .await
        .unwrap();
    let err = r
        .engine
        .call(
            call("acme", "charge", Some("k"), json!({"amount": 500})),
            || runs.effect(success("y")),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::KeyReuse {
                rule: KeyRule::Explicit,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("different arguments"));
    assert_eq!(runs.get(), 1);
}

#[tokio::test(start_paused = true)]
async fn writes_need_a_key_reads_and_natural_writes_pass_through() {
    let policies = Policies::new()
        .with_tool("search", ToolPolicy::read())
        .with_tool("set_status", ToolPolicy::natural_idempotent());
    let r = rig(policies);
    let runs = Counter::default();
    let err = r
        .engine
        .call(call("acme", "never_configured", None, json!({})), || {
            runs.effect(success("x"))
        })
        .await
        .unwrap_err();
    assert!(
        matches!(err, EngineError::KeyRequired { .. }),
        "unknown tools are writes"
    );
    assert_eq!(runs.get(), 0);
    // Reads do not touch the store: a store that refuses everything does not matter.
    r.store.always(Op::Reserve, Fault::Refuse);
    for tool in ["search", "set_status"] {
        for _ in 0..2 {
            let a = r
                .engine
                .call(call("acme", tool, None, json!({"q": 1})), || {
                    runs.effect(success("r"))
                })
                .await
                .unwrap();
            assert!(matches!(a.decision, Decision::PassedThrough { .. }));
            assert_eq!(a.key, None);
        }
    }
    assert_eq!(runs.get(), 4);
    assert!(r.store.inner().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_fallback_window_joins_identical_calls_of_one_scope_only() {
    let r = rig(Policies::new().with_tool(
        "send_mail",
        ToolPolicy {
            fallback_window: Some(Duration::from_secs(60)),
            ..ToolPolicy::default()
        },
    ));
    let runs = Counter::default();
    let args = json!({"to": "a@b.c"});
    let in_scope = |scope: &str| call("acme", "send_mail", None, args.clone()).scope(scope);
    for c in [in_scope("conversation-1"), in_scope("conversation-1")] {
        r.engine
            .call(c, || runs.effect(success("sent")))
            .await
            .unwrap();
    }
    assert_eq!(
        runs.get(),
        1,
        "a re-emission in its conversation is the same action"
    );
    let other = r
        .engine
        .call(in_scope("conversation-2"), || runs.effect(success("sent")))
        .await
        .unwrap();
    assert_eq!(
        runs.get(),
        2,
        "another conversation's identical call is another action"
    );
    assert_eq!(other.rule, Some(KeyRule::Fallback));
    // Without a scope the window is the tenant's, named as it always was.
    let policy = ToolPolicy {
        fallback_window: Some(Duration::from_secs(60)),
        ..ToolPolicy::default()
    };
    let unscoped = r
        .engine
        .key_for(&call("acme", "send_mail", None, args.clone()), &policy);
    let scoped = r.engine.key_for(&in_scope("conversation-1"), &policy);
    let (unscoped, scoped) = (unscoped.unwrap().unwrap().key, scoped.unwrap().unwrap().key);
    assert_ne!(unscoped, scoped);
    assert_eq!(
        unscoped.key.as_str(),
        format!("fallback-{}", Fingerprint::of_json(&args).to_hex())
    );
    // A key names the action in every scope.
    let keyed = |scope: &str| call("acme", "send_mail", Some("k-1"), args.clone()).scope(scope);
    let (a, b) = (
        r.engine
            .key_for(&keyed("conversation-1"), &policy)
            .unwrap()
            .unwrap()
            .key,
        r.engine
            .key_for(&keyed("conversation-2"), &policy)
            .unwrap()
            .unwrap()
            .key,
    );
    assert_eq!(a, b);
}

#[tokio::test(start_paused = true)]
async fn identity_fields_name_the_windows_action_and_a_reworded_replan_replays() {
    let fields = vec!["to".to_owned(), "/subject".to_owned()];
    let policy = ToolPolicy {
        fallback_window: Some(Duration::from_secs(60)),
        identity: fields.clone(),
        ..ToolPolicy::default()
    };
    let r = rig(Policies::new().with_tool("send_mail", policy.clone()));
    let runs = Counter::default();
    let mail = |to: &str, body: &str| json!({"to": to, "subject": "Your refund", "body": body});
    let send = |args: serde_json::Value| {
        call("acme", "send_mail", None, args.clone())
            .scope("conversation-1")
            .identity(args.to_string().as_bytes(), &fields)
    };
    let first = r
        .engine
        .call(send(mail("ann@x", "Hello Ann, it is on its way.")), || {
            runs.effect(success("sent"))
        })
        .await
        .unwrap();
    assert!(matches!(first.decision, Decision::Executed { .. }));
    // The body reworded, the recipient and subject the same: the same action, replayed.
    let replan = r
        .engine
        .call(send(mail("ann@x", "Dear Ann, we refunded you.")), || {
            runs.effect(success("sent"))
        })
        .await
        .unwrap();
    assert!(
        matches!(replan.decision, Decision::Replayed { .. }),
        "{replan:?}"
    );
    assert_eq!(replan.rule, Some(KeyRule::Fallback));
    assert_eq!(runs.get(), 1);
    // Another recipient is another action.
    r.engine
        .call(send(mail("bob@x", "Dear Ann, we refunded you.")), || {
            runs.effect(success("sent"))
        })
        .await
        .unwrap();
    assert_eq!(runs.get(), 2);
    // A call without a subject is named by all its arguments: not the first one's record.
    let partial = json!({"to": "ann@x", "body": "Hello Ann, it is on its way."});
    r.engine
        .call(send(partial), || runs.effect(success("sent")))
        .await
        .unwrap();
    assert_eq!(runs.get(), 3);
    // A key names the action by itself: identity fields change nothing for it.
    let keyed = call("acme", "send_mail", Some("k-1"), mail("ann@x", "a"))
        .identity(mail("ann@x", "a").to_string().as_bytes(), &fields);
    let again = call("acme", "send_mail", Some("k-1"), mail("ann@x", "b"))
        .identity(mail("ann@x", "b").to_string().as_bytes(), &fields);
    r.engine
        .call(keyed, || runs.effect(success("sent")))
        .await
        .unwrap();
    let reused = r.engine.call(again, || runs.effect(success("sent"))).await;
    assert!(
        matches!(reused, Err(EngineError::KeyReuse { .. })),
        "{reused:?}"
    );
    assert_eq!(runs.get(), 4);
}

#[test]
fn an_identity_fingerprint_is_of_the_fields_alone_and_needs_them_all() {
    let of = |text: &str, fields: &[&str]| {
        let fields: Vec<String> = fields.iter().map(|f| (*f).to_owned()).collect();
        Fingerprint::of_identity(text.as_bytes(), &fields)
    };
    let fields = ["to", "/order/id"];
    let a = r#"{"to": "x", "order": {"id": 7, "note": "a"}, "body": "one"}"#;
    let b = r#"{"body": "two", "order": {"note": "b", "id": 7.0}, "to": "x"}"#;
    assert_eq!(of(a, &fields), of(b, &fields));
    assert!(of(a, &fields).is_some());
    assert_ne!(
        of(a, &fields),
        Some(Fingerprint::of_json_text(a.as_bytes()).unwrap())
    );
    assert_ne!(
        of(a, &fields),
        of(r#"{"to": "y", "order": {"id": 7}}"#, &fields)
    );
    // A field missing, or null (a strict schema's absent optional argument): all arguments.
    assert_eq!(of(r#"{"to": "x"}"#, &fields), None);
    assert_eq!(of(r#"{"to": "x", "order": {"id": null}}"#, &fields), None);
    // Integers beyond 64 bits stay exact: two amounts that a double would merge differ.
    let wei = |n: &str| format!(r#"{{"to": "x", "amount": {n}}}"#);
    assert_ne!(
        of(&wei("1500000000000000000000"), &["to", "amount"]),
        of(&wei("1500000000000000000001"), &["to", "amount"])
    );
    // One field however it is written, in any order.
    assert_eq!(of(a, &["to", "/order/id"]), of(a, &["/order/id", "/to"]));
    // A name with a slash is one member, not a path; array items by index.
    assert!(of(r#"{"a/b": 1}"#, &["a/b"]).is_some());
    assert_eq!(
        of(r#"{"to": ["x", "y"]}"#, &["/to/1"]),
        of(r#"{"to": ["z", "y"]}"#, &["/to/1"])
    );
    assert_eq!(of("not json", &["to"]), None);
}

#[tokio::test(start_paused = true)]
async fn fallback_window_deduplicates_visibly_and_expires() {
    let window = Duration::from_secs(10);
    let r = rig(Policies::new().with_tool(
        "send_mail",
        ToolPolicy {
            fallback_window: Some(window),
            ..ToolPolicy::default()
        },
    ));
    let runs = Counter::default();
    let c = call("acme", "send_mail", None, json!({"to": "a@b.c"}));
    let first = r
        .engine
        .call(c.clone(), || runs.effect(success("sent")))
        .await
        .unwrap();
    assert_eq!(first.rule, Some(KeyRule::Fallback));
    let dup = r
        .engine
        .call(c.clone(), || runs.effect(success("again")))
        .await
        .unwrap();
    assert!(matches!(dup.decision, Decision::Replayed { .. }));
    assert_eq!(
        dup.rule,
        Some(KeyRule::Fallback),
        "the answer says the fallback matched"
    );
    let other = call("acme", "send_mail", None, json!({"to": "x@y.z"}));
    r.engine
        .call(other, || runs.effect(success("other")))
        .await
        .unwrap();
    assert_eq!(runs.get(), 2);
    r.clock.advance(window + Duration::from_millis(1));
    let later = r
        .engine
        .call(c, || runs.effect(success("later")))
        .await
        .unwrap();
    assert!(
        matches!(later.decision, Decision::Executed { .. }),
        "the window is short"
    );
    assert_eq!(runs.get(), 3);
}

#[tokio::test(start_paused = true)]
async fn racing_duplicates_execute_once_and_replay() {
    let r = default_rig();
    let runs = Counter::default();
    let gate = Arc::new(Notify::new());
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let engine = r.engine.clone();
        let runs = runs.clone();
        let gate = gate.clone();
        tasks.push(tokio::spawn(async move {
            engine
                .call(
                    call("acme", "charge", Some("race"), json!(1)),
                    || async move {
                        runs.bump();
                        gate.notified().await;
                        success("charged")
                    },
                )
                .await
                .unwrap()
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    gate.notify_waiters();
    let mut executed = 0;
    for t in tasks {
        let a = t.await.unwrap();
        match a.decision {
            Decision::Executed { .. } => executed += 1,
            Decision::Replayed { outcome, .. } => assert_eq!(outcome.body, b"charged"),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!((executed, runs.get()), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn duplicate_gets_in_flight_answer_after_the_wait_bound() {
    let r = rig(Policies::new().with_default(ToolPolicy {
        wait: Duration::from_secs(2),
        ..ToolPolicy::default()
    }));
    let gate = Arc::new(Notify::new());
    let g = gate.clone();
    let engine = r.engine.clone();
    let first = tokio::spawn(async move {
        engine
            .call(
                call("acme", "charge", Some("slow"), json!(1)),
                || async move {
                    g.notified().await;
                    success("done")
                },
            )
            .await
            .unwrap()
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    let started = tokio::time::Instant::now();
    let dup = r
        .engine
        .call(call("acme", "charge", Some("slow"), json!(1)), || async {
            unreachable!()
        })
        .await
        .unwrap();
    assert!(started.elapsed() >= Duration::from_secs(2));
    match dup.decision {
        Decision::InFlight { retry_after, .. } => assert!(retry_after >= Duration::from_secs(1)),
        other => panic!("{other:?}"),
    }
    gate.notify_one();
    assert!(matches!(
        first.await.unwrap().decision,
        Decision::Executed { .. }
    ));
}

#[tokio::test(start_paused = true)]
async fn not_applied_releases_the_key_so_a_retry_runs() {
    let r = default_rig();
    let runs = Counter::default();
    let c = call("acme", "charge", Some("k"), json!(1));
    let a = r
        .engine
        .call(c.clone(), || {
            runs.effect(Effect::not_applied("card declined before charge"))
        })
        .await
        .unwrap();
    assert!(matches!(
        a.decision,
        Decision::NotApplied {
            recording: Recording::Stored,
            ..
        }
    ));
    assert!(r.store.inner().is_empty());
    let b = r
        .engine
        .call(c, || runs.effect(success("charged")))
        .await
        .unwrap();
    assert!(matches!(b.decision, Decision::Executed { .. }));
    assert_eq!(runs.get(), 2);
}

#[tokio::test(start_paused = true)]
async fn waiting_duplicate_runs_after_the_first_call_released() {
    let r = default_rig();
    let gate = Arc::new(Notify::new());
    let g = gate.clone();
    let engine = r.engine.clone();
    let first = tokio::spawn(async move {
        engine
            .call(call("acme", "charge", Some("k"), json!(1)), || async move {
                g.notified().await;
                Effect::not_applied("nothing happened")
            })
            .await
            .unwrap()
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    let engine = r.engine.clone();
    let second = tokio::spawn(async move {
        engine
            .call(call("acme", "charge", Some("k"), json!(1)), || async {
                success("second")
            })
            .await
            .unwrap()
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    gate.notify_one();
    assert!(matches!(
        first.await.unwrap().decision,
        Decision::NotApplied { .. }
    ));
    assert!(matches!(
        second.await.unwrap().decision,
        Decision::Executed { .. }
    ));
}

#[tokio::test(start_paused = true)]
async fn terminal_failure_is_stored_and_replayed_as_failure() {
    let r = default_rig();
    let runs = Counter::default();
    let c = call("acme", "charge", Some("k"), json!(1));
    r.engine
        .call(c.clone(), || {
            runs.effect(Effect::Failed(b"insufficient funds".to_vec()))
        })
        .await
        .unwrap();
    let again = r
        .engine
        .call(c, || runs.effect(success("x")))
        .await
        .unwrap();
    assert_eq!(again.outcome().unwrap().kind, OutcomeKind::Failed);
    assert_eq!(runs.get(), 1);
}

#[tokio::test(start_paused = true)]
async fn ambiguous_outcome_blocks_duplicates() {
    let r = default_rig();
    let runs = Counter::default();
    let c = call("acme", "charge", Some("k"), json!(1));
    let a = r
        .engine
        .call(c.clone(), || {
            runs.effect(Effect::Ambiguous("timeout after send".into()))
        })
        .await
        .unwrap();
    assert!(matches!(
        a.decision,
        Decision::Unknown { ran_here: true, .. }
    ));
    let b = r
        .engine
        .call(c, || runs.effect(success("x")))
        .await
        .unwrap();
    assert!(
        matches!(
            b.decision,
            Decision::Unknown {
                ran_here: false,
                ..
            }
        ),
        "{b:?}"
    );
    assert_eq!(runs.get(), 1);
}

#[tokio::test(start_paused = true)]
async fn crash_mid_effect_becomes_unknown_never_a_second_run() {
    let r = default_rig();
    let runs = Counter::default();
    let c = call("acme", "charge", Some("k"), json!(1));
    let r2 = runs.clone();
    // The caller dies while the side effect runs: its future is dropped.
    let crashed = tokio::time::timeout(
        Duration::from_millis(50),
        r.engine.call(c.clone(), || async move {
            r2.bump();
            std::future::pending::<Effect>().await
        }),
    )
    .await;
    assert!(crashed.is_err());
    r.clock.advance(LEASE + Duration::from_secs(1));
    let dup = r
        .engine
        .call(c, || runs.effect(success("twice")))
        .await
        .unwrap();
    assert!(
        matches!(
            dup.decision,
            Decision::Unknown {
                ran_here: false,
                ..
            }
        ),
        "{dup:?}"
    );
    assert_eq!(runs.get(), 1);
    let listed = r
        .engine
        .list(&idemgate_core::ListFilter {
            state: Some(State::Unknown),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(listed.len(), 1, "unknown records are visible to operators");
}

#[tokio::test(start_paused = true)]
async fn retry_policy_takes_over_with_a_higher_fence() {
    let r = rig(Policies::new().with_default(ToolPolicy {
        on_unknown: UnknownPolicy::Retry,
        lease: LEASE,
        ..ToolPolicy::default()
    }));
    let runs = Counter::default();
    let c = call("acme", "charge", Some("k"), json!(1));
    r.engine
        .call(c.clone(), || runs.effect(Effect::Ambiguous("?".into())))
        .await
        .unwrap();
    let before = r
        .engine
        .get(&key("acme", "charge", "k"))
        .await
        .unwrap()
        .unwrap();
    let again = r
        .engine
        .call(c, || runs.effect(success("second try")))
        .await
        .unwrap();
    assert!(matches!(again.decision, Decision::Executed { .. }));
    let after = r
        .engine
        .get(&key("acme", "charge", "k"))
        .await
        .unwrap()
        .unwrap();
    assert!(after.fence > before.fence);
    assert_eq!(runs.get(), 2);
}

struct FixedProbe(Probe);

impl Verifier for FixedProbe {
    fn verify<'a>(&'a self, _key: &'a idemgate_core::Key) -> ProbeFuture<'a> {
        let p = self.0.clone();
        Box::pin(async move { Ok(p) })
    }
}

#[tokio::test(start_paused = true)]
async fn verify_policy_asks_the_verifier() {
    let verify = ToolPolicy {
        on_unknown: UnknownPolicy::Verify,
        ..ToolPolicy::default()
    };
    let mut r = rig(Policies::new()
        .with_tool("applied", verify.clone())
        .with_tool("not_applied", verify.clone())
        .with_tool("unsure", verify.clone())
        .with_tool("unverified", verify));
    let engine = Arc::try_unwrap(r.engine).ok().unwrap();
    r.engine = Arc::new(
        engine
            .with_verifier(
                "applied",
                Arc::new(FixedProbe(Probe::Applied(Outcome::success(
                    b"found".to_vec(),
                )))),
            )
            .with_verifier("not_applied", Arc::new(FixedProbe(Probe::NotApplied)))
            .with_verifier("unsure", Arc::new(FixedProbe(Probe::Unknown))),
    );
    let runs = Counter::default();
    for tool in ["applied", "not_applied", "unsure", "unverified"] {
        let c = call("acme", tool, Some("k"), json!(1));
        r.engine
            .call(c, || runs.effect(Effect::Ambiguous("?".into())))
            .await
            .unwrap();
    }
    let a = r
        .engine
        .call(call("acme", "applied", Some("k"), json!(1)), || {
            runs.effect(success("x"))
        })
        .await
        .unwrap();
    assert!(
        matches!(a.decision, Decision::Replayed { verified: true, ref outcome, .. } if outcome.body == b"found"),
        "{a:?}"
    );
    let b = r
        .engine
        .call(call("acme", "not_applied", Some("k"), json!(1)), || {
            runs.effect(success("ran"))
        })
        .await
        .unwrap();
    assert!(matches!(b.decision, Decision::Executed { .. }), "{b:?}");
    let c = r
        .engine
        .call(call("acme", "unsure", Some("k"), json!(1)), || {
            runs.effect(success("x"))
        })
        .await
        .unwrap();
    assert!(
        matches!(
            c.decision,
            Decision::Unknown {
                message: Some(_),
                ..
            }
        ),
        "{c:?}"
    );
    let d = r
        .engine
        .call(call("acme", "unverified", Some("k"), json!(1)), || {
            runs.effect(success("x"))
        })
        .await
        .unwrap();
    assert!(
        matches!(d.decision, Decision::Unknown { message: Some(ref m), .. } if m.contains("no verifier")),
        "{d:?}"
    );
    // Four ambiguous first runs and the one the verifier cleared.
    assert_eq!(runs.get(), 5);
    // The verifier found it applied: now a plain replay.
    let e = r
        .engine
        .call(call("acme", "applied", Some("k"), json!(1)), || {
            runs.effect(success("x"))
        })
        .await
        .unwrap();
    assert!(matches!(e.decision, Decision::Replayed { .. }));
}

/// An unknown answer says since when the record is unknown, as the record says it (the store's
/// clock set it) and as every later answer and `keys list` do: the first answer of a call that
/// marked the record said the engine's own time, a write later (issue 17).
#[tokio::test(start_paused = true)]
async fn unknown_answers_say_the_records_since() {
    // The store keeps its own time, a little behind the engine's, as a server store does.
    let store_clock = ManualClock::new(Timestamp::from_millis(1_800_000_000_000));
    let engine_clock = ManualClock::new(Timestamp::from_millis(1_800_000_000_017));
    let verify = ToolPolicy {
        on_unknown: UnknownPolicy::Verify,
        ..ToolPolicy::default()
    };
    let engine = Engine::new(MemoryStore::with_clock(Arc::new(store_clock.clone())))
        .with_clock(Arc::new(engine_clock.clone()))
        .with_policies(Policies::new().with_tool("unsure", verify))
        .with_verifier("unsure", Arc::new(FixedProbe(Probe::Unknown)));
    let since_of = |d: &Decision| match d {
        Decision::Unknown { since, .. } => *since,
        other => panic!("{other:?}"),
    };
    let recorded = |k| {
        let engine = &engine;
        async move {
            match engine.get(&k).await.unwrap().unwrap().state {
                RecordState::Unknown { since } => since,
                other => panic!("{other:?}"),
            }
        }
    };
    for tool in ["charge", "unsure"] {
        let c = call("acme", tool, Some("k"), json!(1));
        let first = engine
            .call(c.clone(), || async {
                Effect::Ambiguous("timeout after send".into())
            })
            .await
            .unwrap();
        let record = recorded(key("acme", tool, "k")).await;
        assert_eq!(
            since_of(&first.decision),
            record,
            "{tool}: the first answer"
        );
        store_clock.advance(Duration::from_secs(60));
        engine_clock.advance(Duration::from_secs(60));
        // "charge" blocks; "unsure" is taken over, and the verifier cannot tell, so this call
        // marks the record unknown anew.
        let later = engine.call(c, || async { success("never") }).await.unwrap();
        let record = recorded(key("acme", tool, "k")).await;
        assert_eq!(since_of(&later.decision), record, "{tool}: a later answer");
    }
}

#[tokio::test(start_paused = true)]
async fn failpoint_reservation_refused_runs_nothing() {
    let r = default_rig();
    let runs = Counter::default();
    r.store.once(Op::Reserve, Fault::Refuse);
    let err = r
        .engine
        .call(call("acme", "charge", Some("k"), json!(1)), || {
            runs.effect(success("x"))
        })
        .await
        .unwrap_err();
    assert!(matches!(err, EngineError::ReserveFailed(_)), "{err}");
    assert_eq!(runs.get(), 0);
    assert!(r.store.inner().is_empty());
}

#[tokio::test(start_paused = true)]
async fn failpoint_reservation_answer_lost_runs_nothing_and_leaves_no_orphan() {
    let r = default_rig();
    let runs = Counter::default();
    let c = call("acme", "charge", Some("k"), json!(1));
    r.store.once(Op::Reserve, Fault::LoseAnswer);
    let err = r
        .engine
        .call(c.clone(), || runs.effect(success("x")))
        .await
        .unwrap_err();
    assert!(matches!(err, EngineError::ReserveFailed(_)));
    assert_eq!(runs.get(), 0);
    assert!(
        r.store.inner().is_empty(),
        "our own orphaned reservation was released"
    );
    let ok = r
        .engine
        .call(c, || runs.effect(success("x")))
        .await
        .unwrap();
    assert!(matches!(ok.decision, Decision::Executed { .. }));
}

/// The reservation lands but its answer is lost, and the store goes away before the engine can
/// take it back (a primary killed mid-call): the refused call ran nothing, so its record must not
/// turn into an "outcome unknown" for an operator. The journal takes it back once the store is
/// back, and the retry runs the call once.
#[tokio::test(start_paused = true)]
async fn failpoint_a_lost_reservation_that_cannot_be_taken_back_at_once_is_taken_back_by_the_journal(
) {
    use idemgate_core::Journal;
    let r = default_rig();
    let runs = Counter::default();
    let c = call("acme", "charge", Some("k"), json!(1));
    r.store.once(Op::Reserve, Fault::LoseAnswer);
    r.store.always(Op::Reserve, Fault::Refuse);
    let err = r
        .engine
        .call(c.clone(), || runs.effect(success("x")))
        .await
        .unwrap_err();
    assert!(matches!(err, EngineError::ReserveFailed(_)), "{err}");
    assert_eq!(runs.get(), 0);
    assert_eq!(r.store.inner().len(), 1, "the reservation landed");
    let pending = r.journal.pending().unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].op, idemgate_core::JournalOp::TakeBack);

    // The store is back after the lease ended: without the journal the record reads unknown.
    r.store.heal();
    r.clock.advance(LEASE + Duration::from_secs(1));
    let report = r.engine.flush_journal().await.unwrap();
    assert_eq!((report.applied, report.pending), (1, 0));
    assert!(r.store.inner().is_empty(), "taken back");
    assert!(r.journal.pending().unwrap().is_empty());
    let ok = r
        .engine
        .call(c, || runs.effect(success("x")))
        .await
        .unwrap();
    assert!(matches!(ok.decision, Decision::Executed { .. }), "{ok:?}");
    assert_eq!(runs.get(), 1);
}

/// A take-back never removes another call's record: a retry that took the key over (or ran)
/// before the flush keeps it.
#[tokio::test(start_paused = true)]
async fn a_journaled_take_back_leaves_another_calls_record() {
    use idemgate_core::Journal;
    let r = default_rig();
    let runs = Counter::default();
    let c = call("acme", "charge", Some("k"), json!(1));
    r.store.once(Op::Reserve, Fault::LoseAnswer);
    r.store.always(Op::Reserve, Fault::Refuse);
    r.engine
        .call(c.clone(), || runs.effect(success("x")))
        .await
        .unwrap_err();
    r.store.heal();
    // Our orphan ends unknown; an operator releases it and a retry runs and completes.
    r.clock.advance(LEASE + Duration::from_secs(1));
    let k = key("acme", "charge", "k");
    let rec = r.store.inner().get(&k).await.unwrap().unwrap();
    r.engine
        .resolve(&k, rec.fence, Resolution::Release, None, None)
        .await
        .unwrap();
    let done = r
        .engine
        .call(c.clone(), || runs.effect(success("ran")))
        .await
        .unwrap();
    assert!(matches!(done.decision, Decision::Executed { .. }));
    let report = r.engine.flush_journal().await.unwrap();
    assert_eq!((report.applied, report.pending), (1, 0));
    assert!(r.journal.pending().unwrap().is_empty());
    let replay = r
        .engine
        .call(c, || runs.effect(success("again")))
        .await
        .unwrap();
    assert!(
        matches!(replay.decision, Decision::Replayed { ref outcome, .. } if outcome.body == b"ran"),
        "{replay:?}"
    );
    assert_eq!(runs.get(), 1);
}

#[tokio::test(start_paused = true)]
async fn failpoint_store_down_at_reservation_fails_closed() {
    let r = default_rig();
    let runs = Counter::default();
    r.store.always(Op::Reserve, Fault::LoseAnswer);
    for _ in 0..3 {
        let err = r
            .engine
            .call(call("acme", "charge", Some("k"), json!(1)), || {
                runs.effect(success("x"))
            })
            .await
            .unwrap_err();
        assert!(matches!(err, EngineError::ReserveFailed(_)));
    }
    assert_eq!(
        runs.get(),
        0,
        "a failed reservation never runs the side effect"
    );
}

#[tokio::test(start_paused = true)]
async fn failpoint_done_write_lost_once_is_retried() {
    let r = default_rig();
    let runs = Counter::default();
    let c = call("acme", "charge", Some("k"), json!(1));
    r.store.once(Op::Complete, Fault::LoseAnswer);
    r.store.once(Op::Complete, Fault::Refuse);
    let a = r
        .engine
        .call(c.clone(), || runs.effect(success("x")))
        .await
        .unwrap();
    assert!(
        matches!(
            a.decision,
            Decision::Executed {
                recording: Recording::Stored,
                ..
            }
        ),
        "{a:?}"
    );
    let b = r
        .engine
        .call(c, || runs.effect(success("y")))
        .await
        .unwrap();
    assert!(matches!(b.decision, Decision::Replayed { .. }));
    assert_eq!(runs.get(), 1);
}

#[tokio::test(start_paused = true)]
async fn failpoint_done_write_lost_for_good_is_journaled_then_flushed() {
    let r = default_rig();
    let runs = Counter::default();
    let c = call("acme", "charge", Some("k"), json!(1));
    r.store.always(Op::Complete, Fault::Refuse);
    let a = r
        .engine
        .call(c.clone(), || runs.effect(success("paid")))
        .await
        .unwrap();
    assert!(
        matches!(
            a.decision,
            Decision::Executed {
                recording: Recording::Journaled,
                ..
            }
        ),
        "{a:?}"
    );
    assert_eq!(
        a.outcome().unwrap().body,
        b"paid",
        "the caller still gets its result"
    );
    // Until the journal is flushed, duplicates never run it again: they wait, then see unknown.
    r.clock.advance(LEASE + Duration::from_secs(1));
    let dup = r
        .engine
        .call(c.clone(), || runs.effect(success("twice")))
        .await
        .unwrap();
    assert!(matches!(dup.decision, Decision::Unknown { .. }), "{dup:?}");
    let report = r.engine.flush_journal().await.unwrap();
    assert_eq!((report.applied, report.pending), (0, 1), "store still down");
    r.store.heal();
    let report = r.engine.flush_journal().await.unwrap();
    assert_eq!((report.applied, report.pending), (1, 0));
    let replay = r
        .engine
        .call(c, || runs.effect(success("twice")))
        .await
        .unwrap();
    assert!(
        matches!(replay.decision, Decision::Replayed { ref outcome, .. } if outcome.body == b"paid")
    );
    // Issue 7: the replay says when the side effect ran, not when the journal was flushed.
    let (
        Decision::Executed {
            executed_at: ran, ..
        },
        Decision::Replayed { executed_at, .. },
    ) = (&a.decision, &replay.decision)
    else {
        unreachable!("matched above")
    };
    assert_eq!(executed_at, ran, "flushed {:?} later", LEASE);
    assert_eq!(runs.get(), 1);
    use idemgate_core::Journal;
    assert!(r.journal.pending().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn failpoint_zombie_completion_is_rejected() {
    let r = rig(Policies::new().with_default(ToolPolicy {
        on_unknown: UnknownPolicy::Retry,
        lease: LEASE,
        ..ToolPolicy::default()
    }));
    let (taker, z) = a_zombie_outlived_by_its_taker(&r).await;
    assert!(matches!(
        taker.decision,
        Decision::Executed {
            recording: Recording::Stored,
            ..
        }
    ));
    assert!(
        matches!(
            z.decision,
            Decision::Executed {
                recording: Recording::LeaseLost,
                ..
            }
        ),
        "{z:?}"
    );
    let rec = r
        .engine
        .get(&key("acme", "charge", "k"))
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(rec.state, RecordState::Completed { ref outcome, .. } if outcome.body == b"taker")
    );
}

#[tokio::test(start_paused = true)]
async fn heartbeat_keeps_a_long_call_in_flight() {
    let r = default_rig();
    let clock = r.clock.clone();
    let engine = r.engine.clone();
    let long = tokio::spawn(async move {
        engine
            .call(call("acme", "export", Some("k"), json!(1)), || async move {
                // Ten quarter-leases: two and a half leases of store time.
                for _ in 0..10 {
                    tokio::time::sleep(LEASE / 4).await;
                    clock.advance(LEASE / 4);
                }
                success("exported")
            })
            .await
            .unwrap()
    });
    for _ in 0..9 {
        tokio::time::sleep(LEASE / 4).await;
        let rec = r
            .engine
            .get(&key("acme", "export", "k"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(rec.state_name(), State::InFlight);
    }
    let a = long.await.unwrap();
    assert!(matches!(
        a.decision,
        Decision::Executed {
            recording: Recording::Stored,
            ..
        }
    ));
}

#[tokio::test(start_paused = true)]
async fn tenants_never_see_each_others_results() {
    let r = default_rig();
    let a = r
        .engine
        .call(
            call("tenant-a", "charge", Some("same"), json!(1)),
            || async { success("a's secret") },
        )
        .await
        .unwrap();
    let b = r
        .engine
        .call(
            call("tenant-b", "charge", Some("same"), json!(1)),
            || async { success("b's") },
        )
        .await
        .unwrap();
    assert!(matches!(a.decision, Decision::Executed { .. }));
    assert!(matches!(b.decision, Decision::Executed { ref outcome, .. } if outcome.body == b"b's"));
}

#[tokio::test(start_paused = true)]
async fn operator_resolves_unknown_records() {
    let r = default_rig();
    let runs = Counter::default();
    let ck = |k| call("acme", "charge", Some(k), json!(1));
    for k in ["done", "undo"] {
        r.engine
            .call(ck(k), || runs.effect(Effect::Ambiguous("?".into())))
            .await
            .unwrap();
    }
    let done = key("acme", "charge", "done");
    let rec = r.engine.get(&done).await.unwrap().unwrap();
    let err = r
        .engine
        .resolve(&done, rec.fence + 1, Resolution::Release, None, None)
        .await
        .unwrap_err();
    assert!(
        matches!(err, EngineError::NotResolvable { .. }),
        "a moved fence refuses"
    );
    let resolved = r
        .engine
        .resolve(
            &done,
            rec.fence,
            Resolution::Completed {
                outcome: Outcome::success(b"checked by hand".to_vec()),
                keep: Keep::replay(Duration::from_secs(60)),
            },
            Some("alice"),
            Some("the charge is in the ledger"),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(resolved.state_name(), State::Completed);
    let a = r
        .engine
        .call(ck("done"), || runs.effect(success("x")))
        .await
        .unwrap();
    assert!(
        matches!(a.decision, Decision::Replayed { ref outcome, .. } if outcome.body == b"checked by hand")
    );
    let undo = key("acme", "charge", "undo");
    let fence = r.engine.get(&undo).await.unwrap().unwrap().fence;
    assert!(r
        .engine
        .resolve(&undo, fence, Resolution::Release, None, None)
        .await
        .unwrap()
        .is_none());
    let b = r
        .engine
        .call(ck("undo"), || runs.effect(success("ran")))
        .await
        .unwrap();
    assert!(matches!(b.decision, Decision::Executed { .. }));
    assert_eq!(runs.get(), 3);
    let err = r
        .engine
        .resolve(&done, 1, Resolution::Release, None, None)
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        EngineError::NotResolvable {
            state: State::Completed,
            ..
        }
    ));
    let _ = ToolKind::Write;
    let _ = r.store.inner().get(&done).await;
}

#[tokio::test(start_paused = true)]
async fn replays_come_from_the_engine_cache_until_shortly_before_expiry() {
    let r = default_rig();
    let runs = Counter::default();
    let c = call("acme", "charge", Some("k"), json!(1));
    r.engine
        .call(c.clone(), || runs.effect(success("paid")))
        .await
        .unwrap();
    // The first replay comes from the store and fills the cache.
    let first = r
        .engine
        .call(c.clone(), || runs.effect(success("x")))
        .await
        .unwrap();
    assert!(matches!(first.decision, Decision::Replayed { .. }));
    // Now the store is down, yet replays (and key-reuse refusals) are still answered.
    r.store.always(Op::Reserve, Fault::Refuse);
    let cached = r
        .engine
        .call(c.clone(), || runs.effect(success("x")))
        .await
        .unwrap();
    assert!(
        matches!(cached.decision, Decision::Replayed { ref outcome, .. } if outcome.body == b"paid")
    );
    let other = call("acme", "charge", Some("k"), json!(2));
    let err = r
        .engine
        .call(other, || runs.effect(success("x")))
        .await
        .unwrap_err();
    assert!(matches!(err, EngineError::KeyReuse { .. }), "{err}");
    // Close to expiry the copy stops answering and the store decides again.
    r.clock
        .advance(Duration::from_secs(24 * 3600) - Duration::from_secs(1));
    let err = r
        .engine
        .call(c, || runs.effect(success("x")))
        .await
        .unwrap_err();
    assert!(matches!(err, EngineError::ReserveFailed(_)), "{err}");
    assert_eq!(runs.get(), 1);
}

type StoreResult<T> = Result<T, idemgate_core::StoreError>;

/// A memory store that, once armed, holds the answer of the next reservation that finds a record
/// in flight until the test lets it go, so the test can act between a duplicate's look and its
/// wait.
struct HoldInFlightAnswer {
    inner: idemgate_core::MemoryStore,
    armed: Armed,
    /// Holds the answer of the next `get` that finds the record in flight instead: the look a
    /// waiting duplicate takes before each wait.
    armed_get: Armed,
    /// Reservations made.
    reserves: std::sync::atomic::AtomicUsize,
}

type Armed = std::sync::Mutex<Option<(tokio::sync::oneshot::Sender<()>, Arc<Notify>)>>;

/// Holds the caller that found a record in flight until the test lets it go, if `armed`.
async fn hold_if_armed(armed: &Armed, rec: Option<&idemgate_core::Record>) {
    if rec.is_some_and(|rec| matches!(rec.state, RecordState::InFlight { .. })) {
        let armed = armed.lock().unwrap().take();
        if let Some((held, go)) = armed {
            let go = go.notified();
            let _ = held.send(());
            go.await;
        }
    }
}

impl Store for HoldInFlightAnswer {
    async fn reserve(&self, r: &idemgate_core::Reservation) -> StoreResult<idemgate_core::Claim> {
        self.reserves
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let claim = self.inner.reserve(r).await?;
        if let idemgate_core::Claim::Existing(rec) = &claim {
            hold_if_armed(&self.armed, Some(rec)).await;
        }
        Ok(claim)
    }
    async fn takeover(
        &self,
        r: &idemgate_core::Reservation,
        stale: idemgate_core::Fence,
    ) -> StoreResult<idemgate_core::Claim> {
        self.inner.takeover(r, stale).await
    }
    async fn heartbeat(
        &self,
        key: &idemgate_core::Key,
        lease: idemgate_core::Lease,
        lease_for: Duration,
    ) -> StoreResult<idemgate_core::Timestamp> {
        self.inner.heartbeat(key, lease, lease_for).await
    }
    async fn complete_at(
        &self,
        key: &idemgate_core::Key,
        lease: idemgate_core::Lease,
        outcome: &Outcome,
        keep: Keep,
        executed_at: Option<idemgate_core::Timestamp>,
    ) -> StoreResult<idemgate_core::Completion> {
        self.inner
            .complete_at(key, lease, outcome, keep, executed_at)
            .await
    }
    async fn release(
        &self,
        key: &idemgate_core::Key,
        lease: idemgate_core::Lease,
    ) -> StoreResult<()> {
        self.inner.release(key, lease).await
    }
    async fn mark_unknown(
        &self,
        key: &idemgate_core::Key,
        lease: idemgate_core::Lease,
    ) -> StoreResult<()> {
        self.inner.mark_unknown(key, lease).await
    }
    async fn reopen(
        &self,
        key: &idemgate_core::Key,
        fence: idemgate_core::Fence,
    ) -> StoreResult<idemgate_core::Reopened> {
        self.inner.reopen(key, fence).await
    }
    async fn get(&self, key: &idemgate_core::Key) -> StoreResult<Option<idemgate_core::Record>> {
        let rec = self.inner.get(key).await?;
        hold_if_armed(&self.armed_get, rec.as_ref()).await;
        Ok(rec)
    }
    async fn append_history(
        &self,
        key: &idemgate_core::Key,
        entry: &idemgate_core::HistoryEntry,
    ) -> StoreResult<bool> {
        self.inner.append_history(key, entry).await
    }
    async fn history(
        &self,
        key: &idemgate_core::Key,
    ) -> StoreResult<Vec<idemgate_core::HistoryEntry>> {
        self.inner.history(key).await
    }
    async fn list(
        &self,
        filter: &idemgate_core::ListFilter,
    ) -> StoreResult<Vec<idemgate_core::Record>> {
        self.inner.list(filter).await
    }
    async fn purge_expired(&self) -> StoreResult<u64> {
        self.inner.purge_expired().await
    }
    fn change_mark(&self, key: &idemgate_core::Key) -> idemgate_core::ChangeMark {
        self.inner.change_mark(key)
    }
    async fn wait_changed(
        &self,
        key: &idemgate_core::Key,
        since: idemgate_core::ChangeMark,
        timeout: Duration,
    ) {
        self.inner.wait_changed(key, since, timeout).await
    }
}

#[tokio::test]
async fn a_duplicate_that_finds_the_call_done_before_it_waits_does_not_sleep_past_it() {
    // The duplicate's reservation found the call in flight; it completes before the duplicate
    // waits.
    the_duplicate_answers_a_completion_while_it_is_held(|store| &store.armed).await;
}

#[tokio::test]
async fn a_completion_between_a_waiters_look_and_its_wait_wakes_it() {
    // The duplicate found the call in flight and waits; its next look (a `get`) also finds it in
    // flight, and the completion lands before the duplicate starts waiting again.
    the_duplicate_answers_a_completion_while_it_is_held(|store| &store.armed_get).await;
}

#[tokio::test]
async fn a_waiting_duplicate_replays_the_record_its_last_look_found_without_reserving_again() {
    // The look that ends the wait read the completed record: reserving again would only read it
    // anew (on Postgres an insert that conflicts and a read), once per waiting duplicate.
    let reserves =
        the_duplicate_answers_a_completion_while_it_is_held(|store| &store.armed_get).await;
    assert_eq!(
        reserves, 2,
        "the first call's reservation and the duplicate's"
    );
}

/// A duplicate of a call in flight is held where `hold` says, right after it found the call in
/// flight; the call completes; the duplicate, let go, must answer with the replay. Waits and
/// polls far longer than the test allows: a wake-up lost in between would cost a minute. Returns
/// how many reservations the two calls made.
async fn the_duplicate_answers_a_completion_while_it_is_held(
    hold: fn(&HoldInFlightAnswer) -> &Armed,
) -> usize {
    let store = Arc::new(HoldInFlightAnswer {
        inner: idemgate_core::MemoryStore::new(),
        armed: std::sync::Mutex::new(None),
        armed_get: std::sync::Mutex::new(None),
        reserves: std::sync::atomic::AtomicUsize::new(0),
    });
    let policy = ToolPolicy {
        lease: LEASE,
        wait: Duration::from_secs(60),
        ..ToolPolicy::default()
    };
    let engine = Arc::new(
        idemgate_core::Engine::new(store.clone())
            .with_policies(Policies::new().with_default(policy.clone()))
            .with_settings(idemgate_core::Settings {
                max_poll: Duration::from_secs(60),
                ..idemgate_core::Settings::default()
            }),
    );
    let c = call("acme", "charge", Some("k1"), json!({"amount": 5}));
    let idemgate_core::Begun::Execute(ticket) = engine.begin(c.clone(), &policy).await.unwrap()
    else {
        panic!("the first call executes");
    };
    let (held, held_rx) = tokio::sync::oneshot::channel();
    let go = Arc::new(Notify::new());
    *hold(&store).lock().unwrap() = Some((held, go.clone()));
    let duplicate = {
        let (engine, c) = (engine.clone(), c.clone());
        tokio::spawn(async move { engine.call(c, || async { success("second") }).await })
    };
    held_rx.await.unwrap();
    engine.finish(&ticket, success("first")).await;
    go.notify_one();
    let answer = tokio::time::timeout(Duration::from_secs(20), duplicate)
        .await
        .expect("the duplicate slept past the completion")
        .unwrap()
        .unwrap();
    assert!(
        matches!(answer.decision, Decision::Replayed { .. }),
        "{:?}",
        answer.decision
    );
    store.reserves.load(std::sync::atomic::Ordering::SeqCst)
}

#[test]
fn a_recordings_name_is_its_serialized_tag() {
    for r in [
        Recording::Stored,
        Recording::Journaled,
        Recording::LeaseLost,
        Recording::Unrecorded("disk full".into()),
    ] {
        let tagged = serde_json::to_value(&r).unwrap();
        assert_eq!(tagged["recording"], r.name(), "{r:?}");
    }
}

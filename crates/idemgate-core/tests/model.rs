//! The engine against a reference model: random sequences of calls, clock moves and store faults.
//!
//! The model is a few lines of obvious code per decision of DESIGN.md. Proptest drives the real
//! engine (over the fault-injecting memory store) and the model side by side and compares every
//! answer, every execution count and every record's state. A call is made in observe mode (shadow
//! mode) now and then, on the same records: it runs, changes no record, and is told as the
//! verdict enforce mode would have given.

use std::collections::HashMap;
use std::time::Duration;

use idemgate_core::faulty::{Fault, Op};
use idemgate_core::{
    Decision, Effect, EngineError, Mode, OutcomeKind, RecordState, Settings, State, ToolPolicy,
};
use proptest::prelude::*;
use serde_json::json;

use crate::observe::{observed_rig, Told};
use crate::support::{call, key, Counter};

const TTL: Duration = Duration::from_secs(60);
const LEASE: Duration = Duration::from_secs(30);
/// Longer than the ttl, and within reach of a few clock moves.
const TOMBSTONE: Duration = Duration::from_secs(180);

#[derive(Clone, Debug)]
enum Step {
    Call {
        key: u8,
        args: u8,
        effect: Eff,
        observe: bool,
    },
    Advance {
        secs: u64,
    },
    ArmReserve(Fault),
    ArmComplete(Fault),
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Eff {
    Success(u8),
    Failed(u8),
    NotApplied,
    Ambiguous,
}

#[derive(Clone, Debug, PartialEq)]
enum Expect {
    Executed(OutcomeKind, Vec<u8>),
    Replayed(OutcomeKind, Vec<u8>),
    NotApplied,
    UnknownHere,
    UnknownBlocked,
    Expired,
    KeyReuse,
    ReserveFailed,
    /// Observe mode ran it, where enforce mode would have given this verdict.
    Observed(&'static str),
}

#[derive(Clone, Debug)]
enum Rec {
    /// `cached`: when the engine saw the store replay it (tokio's clock), so it answers later
    /// replays itself (until shortly before expiry, and for `replay_cache_fresh` after that)
    /// without asking the store.
    Done {
        args: u8,
        kind: OutcomeKind,
        body: Vec<u8>,
        expires: u64,
        /// Until when its tombstone answers "expired" after `expires`.
        retain: u64,
        cached: Option<tokio::time::Instant>,
    },
    Unknown {
        args: u8,
    },
}

#[derive(Default)]
struct Model {
    now: u64,
    records: HashMap<u8, Rec>,
    reserve_faults: usize,
    complete_faults: usize,
    executions: usize,
}

impl Model {
    fn live(&self, k: u8) -> Option<&Rec> {
        match self.records.get(&k) {
            Some(Rec::Done { retain, .. }) if *retain <= self.now => None,
            other => other,
        }
    }

    fn call(&mut self, k: u8, args: u8, eff: Eff, observe: bool) -> Expect {
        if observe {
            // Observe mode asks the store, not the replay cache; it runs whatever it finds, and
            // changes only what a fresh call changes.
            if self.reserve_faults > 0 {
                self.reserve_faults -= 1;
                self.executions += 1;
                return Expect::Observed("store_unavailable");
            }
            let would = match self.live(k) {
                Some(Rec::Done { args: a, .. } | Rec::Unknown { args: a }) if *a != args => {
                    "key_reused"
                }
                Some(Rec::Done { expires, .. }) if *expires <= self.now => "expired",
                Some(Rec::Done { .. }) => "replayed",
                Some(Rec::Unknown { .. }) => "unknown",
                None => return self.fresh(k, args, eff),
            };
            self.executions += 1;
            return Expect::Observed(would);
        }
        if let Some(Rec::Done {
            args: a,
            kind,
            body,
            expires,
            cached: Some(cached_at),
            ..
        }) = self.live(k)
        {
            let fresh = Settings::default().replay_cache_fresh;
            if self.now + 2000 < *expires && cached_at.elapsed() < fresh {
                // Answered from the engine's replay cache: the store is not asked.
                return if *a == args {
                    Expect::Replayed(*kind, body.clone())
                } else {
                    Expect::KeyReuse
                };
            }
        }
        if self.reserve_faults > 0 {
            self.reserve_faults -= 1;
            return Expect::ReserveFailed;
        }
        match self.live(k).cloned() {
            Some(Rec::Done { args: a, .. }) | Some(Rec::Unknown { args: a }) if a != args => {
                Expect::KeyReuse
            }
            // Past its ttl, within its tombstone: told so, never run again.
            Some(Rec::Done { expires, .. }) if expires <= self.now => Expect::Expired,
            Some(Rec::Done { kind, body, .. }) => {
                if let Some(Rec::Done { cached, .. }) = self.records.get_mut(&k) {
                    *cached = Some(tokio::time::Instant::now());
                }
                Expect::Replayed(kind, body)
            }
            Some(Rec::Unknown { .. }) => Expect::UnknownBlocked,
            None => self.fresh(k, args, eff),
        }
    }

    /// A call that finds no record: it runs under a reservation, and its effect decides.
    fn fresh(&mut self, k: u8, args: u8, eff: Eff) -> Expect {
        self.executions += 1;
        let done = |kind, b: u8| Rec::Done {
            args,
            kind,
            body: vec![b],
            expires: self.now + TTL.as_millis() as u64,
            retain: self.now + TOMBSTONE.as_millis() as u64,
            cached: None,
        };
        if matches!(eff, Eff::Success(_) | Eff::Failed(_)) {
            // Up to two armed faults on the "done" write are absorbed by its retries.
            self.complete_faults = 0;
        }
        match eff {
            Eff::Success(b) => {
                self.records.insert(k, done(OutcomeKind::Success, b));
                Expect::Executed(OutcomeKind::Success, vec![b])
            }
            Eff::Failed(b) => {
                self.records.insert(k, done(OutcomeKind::Failed, b));
                Expect::Executed(OutcomeKind::Failed, vec![b])
            }
            Eff::NotApplied => {
                self.records.remove(&k);
                Expect::NotApplied
            }
            Eff::Ambiguous => {
                self.records.insert(k, Rec::Unknown { args });
                Expect::UnknownHere
            }
        }
    }
}

fn fault() -> impl Strategy<Value = Fault> {
    prop_oneof![Just(Fault::Refuse), Just(Fault::LoseAnswer)]
}

fn step() -> impl Strategy<Value = Step> {
    let eff = prop_oneof![
        4 => any::<u8>().prop_map(Eff::Success),
        1 => any::<u8>().prop_map(Eff::Failed),
        1 => Just(Eff::NotApplied),
        1 => Just(Eff::Ambiguous),
    ];
    prop_oneof![
        8 => (0u8..3, 0u8..2, eff, prop::bool::weighted(0.3)).prop_map(|(key, args, effect, observe)| {
            Step::Call { key, args, effect, observe }
        }),
        2 => prop_oneof![0u64..5, 55u64..65, 100u64..200].prop_map(|secs| Step::Advance { secs }),
        1 => fault().prop_map(Step::ArmReserve),
        1 => fault().prop_map(Step::ArmComplete),
    ]
}

/// What a call's answer says; a pass-through is the observe-mode call the observers were just
/// told of (`told`: what they were told since the call began).
fn answered(res: Result<idemgate_core::Answer, EngineError>, told: &[Told]) -> Expect {
    if let Ok(idemgate_core::Answer {
        decision: Decision::PassedThrough { .. },
        ..
    }) = &res
    {
        return match told {
            [(_, would, _, _)] => Expect::Observed(would.label()),
            other => panic!("a pass-through told the observers {other:?}"),
        };
    }
    match res {
        Err(EngineError::KeyReuse { .. }) => Expect::KeyReuse,
        Err(EngineError::ReserveFailed(_)) => Expect::ReserveFailed,
        Err(e) => panic!("unexpected error {e}"),
        Ok(a) => match a.decision {
            Decision::Executed { outcome, .. } => Expect::Executed(outcome.kind, outcome.body),
            Decision::Replayed { outcome, .. } => Expect::Replayed(outcome.kind, outcome.body),
            Decision::NotApplied { .. } => Expect::NotApplied,
            Decision::Expired { .. } => Expect::Expired,
            Decision::Unknown { ran_here: true, .. } => Expect::UnknownHere,
            Decision::Unknown {
                ran_here: false, ..
            } => Expect::UnknownBlocked,
            other => panic!("unexpected decision {other:?}"),
        },
    }
}

fn run_case(steps: Vec<Step>) -> Result<(), TestCaseError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async move {
        let enforce = ToolPolicy {
            ttl: TTL,
            tombstone: TOMBSTONE,
            lease: LEASE,
            ..ToolPolicy::default()
        };
        let observe = ToolPolicy {
            mode: Mode::Observe,
            ..enforce.clone()
        };
        let (r, seen) = observed_rig(enforce.clone());
        let mut m = Model::default();
        let runs = Counter::default();
        for (i, s) in steps.into_iter().enumerate() {
            match s {
                Step::Advance { secs } => {
                    r.clock.advance(Duration::from_secs(secs));
                    m.now += secs * 1000;
                }
                Step::ArmReserve(f) if m.reserve_faults == 0 => {
                    r.store.once(Op::Reserve, f);
                    m.reserve_faults += 1;
                }
                Step::ArmComplete(f) if m.complete_faults < 2 => {
                    r.store.once(Op::Complete, f);
                    m.complete_faults += 1;
                }
                Step::ArmReserve(_) | Step::ArmComplete(_) => {}
                Step::Call {
                    key: k,
                    args,
                    effect,
                    observe: observing,
                } => {
                    let want = m.call(k, args, effect, observing);
                    let policy = if observing { &observe } else { &enforce };
                    let told_before = seen.0.lock().unwrap().len();
                    let c = call(
                        "model",
                        "tool",
                        Some(&format!("k{k}")),
                        json!({ "args": args }),
                    );
                    let res = r
                        .engine
                        .call_with_policy(c, policy, || {
                            runs.effect(match effect {
                                Eff::Success(b) => Effect::Success(vec![b]),
                                Eff::Failed(b) => Effect::Failed(vec![b]),
                                Eff::NotApplied => Effect::not_applied("no"),
                                Eff::Ambiguous => Effect::Ambiguous("?".into()),
                            })
                        })
                        .await;
                    let got = answered(res, &seen.0.lock().unwrap()[told_before..]);
                    prop_assert_eq!(&got, &want, "step {} ({:?})", i, s);
                    prop_assert_eq!(runs.get(), m.executions, "executions after step {}", i);
                }
            }
            for k in 0..3u8 {
                let rec = r
                    .engine
                    .get(&key("model", "tool", &format!("k{k}")))
                    .await
                    .unwrap();
                let got = rec.as_ref().map(|r| r.state_name());
                let want = m.live(k).map(|r| match r {
                    Rec::Done { expires, .. } if *expires <= m.now => State::Expired,
                    Rec::Done { .. } => State::Completed,
                    Rec::Unknown { .. } => State::Unknown,
                });
                prop_assert_eq!(got, want, "record k{} after step {}", k, i);
                if let Some(idemgate_core::Record {
                    state: RecordState::Completed { outcome, .. },
                    ..
                }) = rec
                {
                    let Some(Rec::Done { body, kind, .. }) = m.live(k) else {
                        unreachable!()
                    };
                    prop_assert_eq!(&outcome.body, body);
                    prop_assert_eq!(outcome.kind, *kind);
                }
            }
        }
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn engine_matches_the_reference_model(steps in prop::collection::vec(step(), 1..40)) {
        run_case(steps)?;
    }
}

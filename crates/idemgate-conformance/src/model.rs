//! A reference model of one record, and a property test that holds a store to it.
//!
//! The model restates the contract in the plainest terms (one optional record, a list of leases
//! handed out) independently of `idemgate_core::transition`. Random operation sequences run against
//! the store under test and the model; every answer and every view must agree.

use std::time::Duration;

use idemgate_core::{
    Claim, Fence, Fingerprint, Keep, Lease, LeaseToken, Outcome, Record, RecordState, Reopened,
    Reservation, State, Store, StoreError,
};
use proptest::prelude::*;

use crate::fixture::{fresh_key, Fixture, TimeTravel};

/// One operation on the record under test.
#[derive(Clone, Debug)]
pub enum StoreOp {
    /// Reserve with arguments `args` (0 or 1) and token slot `token` (0 to 2); `short` picks a lease
    /// that a later `Advance` can outlive.
    Reserve {
        /// Which arguments.
        args: u8,
        /// Which token.
        token: u8,
        /// Short lease.
        short: bool,
    },
    /// Take over at the model's fence plus `delta` (so sometimes a wrong fence).
    Takeover {
        /// Which arguments.
        args: u8,
        /// Which token.
        token: u8,
        /// Offset from the current fence.
        delta: i8,
    },
    /// Heartbeat with the `lease`-th lease handed out (modulo; a forged lease when none).
    Heartbeat {
        /// Which lease.
        lease: u8,
    },
    /// Complete with that lease.
    Complete {
        /// Which lease.
        lease: u8,
        /// The outcome byte.
        body: u8,
        /// Whether the record keeps a tombstone after its ttl.
        tombstone: bool,
    },
    /// Release with that lease.
    Release {
        /// Which lease.
        lease: u8,
    },
    /// Mark unknown with that lease.
    MarkUnknown {
        /// Which lease.
        lease: u8,
    },
    /// Reopen at the model's fence plus `delta` (so sometimes a wrong fence).
    Reopen {
        /// Offset from the current fence.
        delta: i8,
    },
    /// Let time pass (manual clocks only).
    Advance {
        /// Milliseconds.
        ms: u64,
    },
    /// Purge expired records.
    Purge,
}

const SHORT: Duration = Duration::from_millis(300);
const LONG: Duration = Duration::from_secs(600);
/// How long completed records are replayed and kept, by the clock the fixture's time runs on.
#[derive(Clone, Copy)]
struct Kept {
    ttl: Duration,
    tombstone: Duration,
}

impl Kept {
    /// On a manual clock, short enough that `Advance` steps pass them. On a server's clock,
    /// which the model never moves, longer than any sequence runs: a slow server (fsyncing
    /// commits on a loaded disk) must not expire what the model holds completed.
    fn for_time(manual: bool) -> Self {
        if manual {
            Kept {
                ttl: Duration::from_millis(900),
                tombstone: Duration::from_millis(2_000),
            }
        } else {
            Kept {
                ttl: LONG,
                tombstone: 2 * LONG,
            }
        }
    }
}

/// Operation sequences; without manual time, no `Advance` and only long leases.
pub fn store_ops(manual_time: bool) -> impl Strategy<Value = Vec<StoreOp>> {
    let op = prop_oneof![
        4 => (0u8..2, 0u8..3, any::<bool>()).prop_map(move |(args, token, short)| StoreOp::Reserve {
            args, token, short: short && manual_time
        }),
        2 => (0u8..2, 0u8..3, -1i8..=1).prop_map(|(args, token, delta)| StoreOp::Takeover { args, token, delta }),
        1 => any::<u8>().prop_map(|lease| StoreOp::Heartbeat { lease }),
        3 => (any::<u8>(), any::<u8>(), any::<bool>()).prop_map(|(lease, body, tombstone)| StoreOp::Complete { lease, body, tombstone }),
        1 => any::<u8>().prop_map(|lease| StoreOp::Release { lease }),
        1 => any::<u8>().prop_map(|lease| StoreOp::MarkUnknown { lease }),
        1 => (-1i8..=1).prop_map(|delta| StoreOp::Reopen { delta }),
        2 => (0u64..1000).prop_map(|ms| StoreOp::Advance { ms }),
        1 => Just(StoreOp::Purge),
    ];
    prop::collection::vec(op, 1..30).prop_map(move |ops| {
        ops.into_iter()
            .filter(|o| manual_time || !matches!(o, StoreOp::Advance { .. }))
            .collect()
    })
}

#[derive(Clone, Debug)]
enum MState {
    InFlight { until: u64 },
    Done { body: u8, expires: u64, retain: u64 },
    Unknown,
}

#[derive(Clone, Debug)]
struct MRec {
    args: u8,
    fence: Fence,
    token: u8,
    state: MState,
}

/// What an operation answered, reduced to what the model can predict.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Seen {
    Acquired(Fence),
    Existing(State, Fence, u8),
    Ok,
    LeaseLost,
    /// A reopening that found no record counting.
    Absent,
}

struct Model {
    now: u64,
    rec: Option<MRec>,
    kept: Kept,
}

impl Model {
    /// The record as it counts now.
    fn live(&self) -> Option<&MRec> {
        self.rec
            .as_ref()
            .filter(|r| !matches!(r.state, MState::Done { retain, .. } if retain <= self.now))
    }

    fn view_state(&self, r: &MRec) -> State {
        match r.state {
            MState::InFlight { until } if until > self.now => State::InFlight,
            MState::InFlight { .. } | MState::Unknown => State::Unknown,
            MState::Done { expires, .. } if expires <= self.now => State::Expired,
            MState::Done { .. } => State::Completed,
        }
    }

    fn existing(&self) -> Seen {
        let r = self.live().expect("live record");
        Seen::Existing(self.view_state(r), r.fence, r.args)
    }

    fn reserve(&mut self, args: u8, token: u8, lease: Duration) -> Seen {
        if self.live().is_none() {
            let fence = self.rec.as_ref().map_or(1, |r| r.fence + 1);
            self.rec = Some(MRec {
                args,
                fence,
                token,
                state: MState::InFlight {
                    until: self.now + lease.as_millis() as u64,
                },
            });
            return Seen::Acquired(fence);
        }
        let r = self.live().unwrap();
        if r.token == token && matches!(r.state, MState::InFlight { .. }) {
            return Seen::Acquired(r.fence);
        }
        self.existing()
    }

    fn takeover(&mut self, args: u8, token: u8, stale: Fence) -> Seen {
        let Some(r) = self.live().cloned() else {
            return self.reserve(args, token, LONG);
        };
        if r.token == token && matches!(r.state, MState::InFlight { .. }) {
            return Seen::Acquired(r.fence);
        }
        if self.view_state(&r) == State::Unknown && r.fence == stale && r.args == args {
            self.rec = Some(MRec {
                args,
                fence: stale + 1,
                token,
                state: MState::InFlight {
                    until: self.now + LONG.as_millis() as u64,
                },
            });
            return Seen::Acquired(stale + 1);
        }
        self.existing()
    }

    fn holds(&self, lease: (Fence, u8)) -> bool {
        self.rec
            .as_ref()
            .is_some_and(|r| (r.fence, r.token) == lease)
    }

    fn heartbeat(&mut self, lease: (Fence, u8)) -> Seen {
        let now = self.now;
        match self.rec.as_mut() {
            Some(r)
                if (r.fence, r.token) == lease && matches!(r.state, MState::InFlight { .. }) =>
            {
                r.state = MState::InFlight {
                    until: now + LONG.as_millis() as u64,
                };
                Seen::Ok
            }
            _ => Seen::LeaseLost,
        }
    }

    fn complete(&mut self, lease: (Fence, u8), body: u8, tombstone: bool) -> Seen {
        if !self.holds(lease) {
            return Seen::LeaseLost;
        }
        let now = self.now;
        let r = self.rec.as_mut().unwrap();
        if !matches!(r.state, MState::Done { .. }) {
            let ttl = self.kept.ttl;
            let retained = if tombstone { self.kept.tombstone } else { ttl };
            r.state = MState::Done {
                body,
                expires: now + ttl.as_millis() as u64,
                retain: now + retained.as_millis() as u64,
            };
        }
        Seen::Ok
    }

    fn release(&mut self, lease: (Fence, u8)) -> Seen {
        match &self.rec {
            None => Seen::Ok,
            Some(r) if (r.fence, r.token) == lease && !matches!(r.state, MState::Done { .. }) => {
                self.rec = None;
                Seen::Ok
            }
            Some(_) => Seen::LeaseLost,
        }
    }

    fn mark_unknown(&mut self, lease: (Fence, u8)) -> Seen {
        match self.rec.as_mut() {
            Some(r) if (r.fence, r.token) == lease && !matches!(r.state, MState::Done { .. }) => {
                r.state = MState::Unknown;
                Seen::Ok
            }
            _ => Seen::LeaseLost,
        }
    }

    fn reopen(&mut self, fence: Fence) -> Seen {
        let now = self.now;
        match self.live() {
            None => Seen::Absent,
            Some(r) if r.fence == fence && matches!(r.state, MState::Done { .. }) => {
                if let Some(MRec {
                    state:
                        MState::Done {
                            expires, retain, ..
                        },
                    ..
                }) = self.rec.as_mut()
                {
                    *expires = (*expires).min(now);
                    *retain = now;
                }
                Seen::Ok
            }
            Some(_) => self.existing(),
        }
    }

    fn purge(&mut self) {
        if self.rec.is_some() && self.live().is_none() {
            self.rec = None;
        }
    }
}

fn token(slot: u8) -> LeaseToken {
    LeaseToken(0x1d3a_0000_0000_0000_0000_0000_0000_0000 + u128::from(slot))
}

fn fingerprint(args: u8) -> Fingerprint {
    Fingerprint::of_bytes(&[args])
}

fn seen_claim(
    c: Result<Claim, StoreError>,
    args_of: impl Fn(&Record) -> u8,
) -> Result<Seen, String> {
    match c.map_err(|e| format!("store error: {e}"))? {
        Claim::Acquired(l) => Ok(Seen::Acquired(l.fence)),
        Claim::Existing(r) => Ok(Seen::Existing(r.state_name(), r.fence, args_of(&r))),
    }
}

fn seen_unit<T>(r: Result<T, StoreError>) -> Result<Seen, String> {
    match r {
        Ok(_) => Ok(Seen::Ok),
        Err(StoreError::LeaseLost) => Ok(Seen::LeaseLost),
        Err(e) => Err(format!("store error: {e}")),
    }
}

/// Runs `ops` against the store and the model; the first disagreement is the error.
///
/// # Errors
/// A description of the first step where the store and the model disagree.
pub async fn check_against_model<S: Store>(fx: &Fixture<S>, ops: &[StoreOp]) -> Result<(), String> {
    let key = fresh_key("model");
    let store = &fx.store;
    let kept = Kept::for_time(matches!(fx.time, TimeTravel::Manual(_)));
    let mut m = Model {
        now: 0,
        rec: None,
        kept,
    };
    // Leases handed out so far, as (fence, token slot); a forged one stands in when there are none.
    let mut leases: Vec<(Fence, u8)> = Vec::new();
    let pick = |leases: &Vec<(Fence, u8)>, i: u8| -> (Fence, u8) {
        if leases.is_empty() {
            (7, 2)
        } else {
            leases[i as usize % leases.len()]
        }
    };
    let lease_of = |(fence, slot): (Fence, u8)| Lease {
        fence,
        token: token(slot),
    };
    let args_of = |r: &Record| {
        if r.fingerprint == fingerprint(0) {
            0
        } else {
            1
        }
    };
    for (i, op) in ops.iter().enumerate() {
        let (want, got) = match *op {
            StoreOp::Reserve {
                args,
                token: t,
                short,
            } => {
                let lease_for = if short { SHORT } else { LONG };
                let r = Reservation {
                    key: key.clone(),
                    fingerprint: fingerprint(args),
                    token: token(t),
                    lease_for,
                    scope: None,
                };
                let want = m.reserve(args, t, lease_for);
                let got = seen_claim(store.reserve(&r).await, args_of)?;
                if let Seen::Acquired(f) = got {
                    leases.push((f, t));
                }
                (want, got)
            }
            StoreOp::Takeover {
                args,
                token: t,
                delta,
            } => {
                let stale = m
                    .rec
                    .as_ref()
                    .map_or(1, |r| r.fence)
                    .saturating_add_signed(delta.into());
                let r = Reservation {
                    key: key.clone(),
                    fingerprint: fingerprint(args),
                    token: token(t),
                    lease_for: LONG,
                    scope: None,
                };
                let want = m.takeover(args, t, stale);
                let got = seen_claim(store.takeover(&r, stale).await, args_of)?;
                if let Seen::Acquired(f) = got {
                    leases.push((f, t));
                }
                (want, got)
            }
            StoreOp::Heartbeat { lease } => {
                let l = pick(&leases, lease);
                (
                    m.heartbeat(l),
                    seen_unit(store.heartbeat(&key, lease_of(l), LONG).await)?,
                )
            }
            StoreOp::Complete {
                lease,
                body,
                tombstone,
            } => {
                let l = pick(&leases, lease);
                let outcome = Outcome::success(vec![body]);
                let keep = Keep {
                    ttl: kept.ttl,
                    tombstone: if tombstone {
                        kept.tombstone
                    } else {
                        Duration::ZERO
                    },
                };
                (
                    m.complete(l, body, tombstone),
                    seen_unit(
                        store
                            .complete_at(&key, lease_of(l), &outcome, keep, None)
                            .await,
                    )?,
                )
            }
            StoreOp::Release { lease } => {
                let l = pick(&leases, lease);
                (
                    m.release(l),
                    seen_unit(store.release(&key, lease_of(l)).await)?,
                )
            }
            StoreOp::MarkUnknown { lease } => {
                let l = pick(&leases, lease);
                (
                    m.mark_unknown(l),
                    seen_unit(store.mark_unknown(&key, lease_of(l)).await)?,
                )
            }
            StoreOp::Reopen { delta } => {
                let fence = m
                    .rec
                    .as_ref()
                    .map_or(1, |r| r.fence)
                    .saturating_add_signed(delta.into());
                let got = match store
                    .reopen(&key, fence)
                    .await
                    .map_err(|e| format!("store error: {e}"))?
                {
                    Reopened::Expired => Seen::Ok,
                    Reopened::Kept(None) => Seen::Absent,
                    Reopened::Kept(Some(r)) => Seen::Existing(r.state_name(), r.fence, args_of(&r)),
                };
                (m.reopen(fence), got)
            }
            StoreOp::Advance { ms } => {
                match &fx.time {
                    TimeTravel::Manual(clock) => clock.advance(Duration::from_millis(ms)),
                    TimeTravel::Real => return Err("Advance needs a manual clock".into()),
                }
                m.now += ms;
                (Seen::Ok, Seen::Ok)
            }
            StoreOp::Purge => {
                m.purge();
                store
                    .purge_expired()
                    .await
                    .map_err(|e| format!("purge: {e}"))?;
                (Seen::Ok, Seen::Ok)
            }
        };
        if want != got {
            return Err(format!(
                "step {i} {op:?}: model says {want:?}, store says {got:?}"
            ));
        }
        let view = store.get(&key).await.map_err(|e| format!("get: {e}"))?;
        let got_view = view
            .as_ref()
            .map(|r| (r.state_name(), r.fence, args_of(r), done_body(r)));
        let want_view = m.live().map(|r| {
            let body = match r.state {
                MState::Done { body, expires, .. } if expires > m.now => Some(body),
                _ => None,
            };
            (m.view_state(r), r.fence, r.args, body)
        });
        if got_view != want_view {
            return Err(format!(
                "after step {i} {op:?}: model view {want_view:?}, store view {got_view:?}"
            ));
        }
    }
    Ok(())
}

fn done_body(r: &Record) -> Option<u8> {
    match &r.state {
        RecordState::Completed { outcome, .. } => outcome.body.first().copied(),
        _ => None,
    }
}

/// Stamps out a property test holding a store to the reference model.
///
/// `$setup` evaluates to a future of a [`Fixture`]; `cases` is how many random sequences to try.
#[macro_export]
macro_rules! store_model_test {
    ($setup:expr, cases = $cases:expr) => {
        #[test]
        fn store_matches_the_reference_model() {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            let fx = rt.block_on($setup);
            let manual = matches!(fx.time, $crate::TimeTravel::Manual(_));
            let config = $crate::proptest::test_runner::Config {
                cases: $cases,
                failure_persistence: None,
                ..Default::default()
            };
            let mut runner = $crate::proptest::test_runner::TestRunner::new(config);
            let result = runner.run(&$crate::model::store_ops(manual), |ops| {
                rt.block_on($crate::model::check_against_model(&fx, &ops))
                    .map_err($crate::proptest::test_runner::TestCaseError::fail)
            });
            if let Err(e) = result {
                panic!("{e}");
            }
        }
    };
}

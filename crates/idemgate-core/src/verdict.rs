//! How a call ended, in the words every front door shares: the one place where the engine's
//! decisions and errors become a verdict, with its metric label and whether it is a failure to the
//! caller.
//!
//! The matches below are exhaustive on purpose: a new [`Decision`] or [`EngineError`] variant is a
//! compile error here, and every front door (command line, HTTP gateway, MCP proxy, Python) takes
//! its answer from this table instead of inventing one. What a door sends for a verdict (an HTTP
//! status, a problem name, an exit code) is the door's business, in `idemgate-kit`: this crate
//! does no I/O and knows no wire.

use std::fmt;

use crate::answer::{Answer, Decision, Recording};
use crate::error::{EngineError, StoreError};

/// How one call ended (or how a `begin` answered), in the words every front door shares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Verdict {
    /// `begin` handed out a lease: the caller runs the side effect now.
    Execute,
    /// This call ran the side effect and its outcome is recorded (stored or journaled).
    Executed,
    /// This call ran the side effect, but its lease was lost meanwhile: the record holds another
    /// holder's outcome, not this one.
    LeaseLost,
    /// This call ran the side effect, and neither the store nor the journal took its outcome.
    Unrecorded,
    /// A duplicate: the stored outcome, without running the side effect.
    Replayed,
    /// A read or naturally idempotent tool: run without a record.
    PassedThrough,
    /// The side effect reported that nothing happened; the key was released.
    NotApplied,
    /// Another call holds the key and did not finish within the wait bound.
    InFlight,
    /// The outcome is unknown: the side effect may or may not have happened.
    Unknown,
    /// The action ran before and its outcome expired (its tombstone says so); nothing ran.
    Expired,
    /// A write without a key or fallback window; nothing ran.
    KeyRequired,
    /// The key was used with other arguments; nothing ran.
    KeyReused,
    /// A name or the arguments were invalid; nothing ran.
    BadRequest,
    /// The store failed before anything ran (the reservation or a lookup).
    StoreUnavailable,
    /// The tenant holds its limit of keys in flight; nothing ran (decided by a front door).
    QuotaExceeded,
    /// The tenant's request rate is exhausted; nothing ran (decided by a front door).
    RateLimited,
    /// No record under the key (operator lookups).
    NotFound,
    /// The record is not in a state an operator may resolve.
    NotResolvable,
    /// The journal of unconfirmed outcomes could not be used.
    JournalFailed,
}

impl Verdict {
    /// Every verdict, for tables and tests.
    pub const ALL: [Verdict; 19] = [
        Verdict::Execute,
        Verdict::Executed,
        Verdict::LeaseLost,
        Verdict::Unrecorded,
        Verdict::Replayed,
        Verdict::PassedThrough,
        Verdict::NotApplied,
        Verdict::InFlight,
        Verdict::Unknown,
        Verdict::Expired,
        Verdict::KeyRequired,
        Verdict::KeyReused,
        Verdict::BadRequest,
        Verdict::StoreUnavailable,
        Verdict::QuotaExceeded,
        Verdict::RateLimited,
        Verdict::NotFound,
        Verdict::NotResolvable,
        Verdict::JournalFailed,
    ];

    /// The verdict of an answer.
    pub fn of_answer(answer: &Answer) -> Self {
        Self::of_decision(&answer.decision)
    }

    /// The verdict of a decision.
    pub fn of_decision(decision: &Decision) -> Self {
        match decision {
            Decision::Executed { recording, .. } => match recording {
                Recording::Stored | Recording::Journaled => Verdict::Executed,
                Recording::LeaseLost => Verdict::LeaseLost,
                Recording::Unrecorded(_) => Verdict::Unrecorded,
            },
            Decision::Replayed { .. } => Verdict::Replayed,
            Decision::PassedThrough { .. } => Verdict::PassedThrough,
            Decision::NotApplied { .. } => Verdict::NotApplied,
            Decision::InFlight { .. } => Verdict::InFlight,
            Decision::Unknown { .. } => Verdict::Unknown,
            Decision::Expired { .. } => Verdict::Expired,
        }
    }

    /// The verdict of an engine error.
    pub fn of_error(e: &EngineError) -> Self {
        match e {
            EngineError::KeyRequired { .. } => Verdict::KeyRequired,
            EngineError::KeyReuse { .. } => Verdict::KeyReused,
            EngineError::InvalidKey(_) | EngineError::InvalidArguments(_) => Verdict::BadRequest,
            EngineError::ReserveFailed(_) => Verdict::StoreUnavailable,
            EngineError::Store(StoreError::LeaseLost) => Verdict::LeaseLost,
            EngineError::Store(_) => Verdict::StoreUnavailable,
            EngineError::NotFound { .. } => Verdict::NotFound,
            EngineError::NotResolvable { .. } | EngineError::NotReopenable { .. } => {
                Verdict::NotResolvable
            }
            EngineError::Journal(_) => Verdict::JournalFailed,
        }
    }

    /// The verdict of a call's result.
    pub fn of(result: &Result<Answer, EngineError>) -> Self {
        match result {
            Ok(a) => Self::of_answer(a),
            Err(e) => Self::of_error(e),
        }
    }

    /// The label of the `decision` dimension in metrics: a closed set, so a metric series can never
    /// be named by a caller.
    pub fn label(self) -> &'static str {
        match self {
            Verdict::Execute => "execute",
            Verdict::Executed => "executed",
            Verdict::LeaseLost => "lease_lost",
            Verdict::Unrecorded => "unrecorded",
            Verdict::Replayed => "replayed",
            Verdict::PassedThrough => "pass_through",
            Verdict::NotApplied => "not_applied",
            Verdict::InFlight => "in_flight",
            Verdict::Unknown => "unknown",
            Verdict::Expired => "expired",
            Verdict::KeyRequired => "key_required",
            Verdict::KeyReused => "key_reused",
            Verdict::BadRequest => "bad_request",
            Verdict::StoreUnavailable => "store_unavailable",
            Verdict::QuotaExceeded => "quota_exceeded",
            Verdict::RateLimited => "rate_limited",
            Verdict::NotFound => "not_found",
            Verdict::NotResolvable => "not_resolvable",
            Verdict::JournalFailed => "journal_failed",
        }
    }

    /// Whether the call's side effect ran in this call.
    pub fn ran_here(self) -> bool {
        matches!(
            self,
            Verdict::Executed
                | Verdict::LeaseLost
                | Verdict::Unrecorded
                | Verdict::PassedThrough
                | Verdict::NotApplied
        )
    }

    /// Whether the answer is a failure to the caller (HTTP 4xx/5xx, an MCP `isError` result, a
    /// non-zero exit of idemgate's own). Executions and replays carry the tool's own result, which
    /// may itself be a failure.
    pub fn is_error(self) -> bool {
        !matches!(
            self,
            Verdict::Execute | Verdict::Executed | Verdict::Replayed | Verdict::PassedThrough
        )
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_unique() {
        let mut labels: Vec<_> = Verdict::ALL.iter().map(|v| v.label()).collect();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), Verdict::ALL.len());
    }

    #[test]
    fn a_verdict_that_ran_here_is_an_error_only_when_its_outcome_is_not_a_result() {
        for v in Verdict::ALL {
            if v.ran_here() && v.is_error() {
                assert!(
                    matches!(
                        v,
                        Verdict::LeaseLost | Verdict::Unrecorded | Verdict::NotApplied
                    ),
                    "{v}"
                );
            }
        }
    }
}

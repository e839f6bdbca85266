//! How a call ended, as every front door shows it: the one place where the engine's decisions and
//! errors become a metric label, an HTTP status, a problem name, an exit code and whether a tool
//! result is an error.
//!
//! The matches below are exhaustive on purpose: a new [`Decision`] or [`EngineError`] variant is a
//! compile error here, and every front door (command line, HTTP gateway, MCP proxy, Python) takes
//! its answer from this table instead of inventing one.

use std::fmt;

use crate::engine::{Answer, Decision, Recording};
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
    pub const ALL: [Verdict; 18] = [
        Verdict::Execute,
        Verdict::Executed,
        Verdict::LeaseLost,
        Verdict::Unrecorded,
        Verdict::Replayed,
        Verdict::PassedThrough,
        Verdict::NotApplied,
        Verdict::InFlight,
        Verdict::Unknown,
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

    /// The HTTP status of the answer, for verdicts that are not the tool's own result.
    pub fn http_status(self) -> u16 {
        match self {
            Verdict::Execute => 201,
            Verdict::Executed
            | Verdict::Replayed
            | Verdict::PassedThrough
            | Verdict::NotApplied => 200,
            Verdict::KeyRequired | Verdict::BadRequest => 400,
            Verdict::NotFound => 404,
            Verdict::InFlight | Verdict::Unknown | Verdict::LeaseLost | Verdict::NotResolvable => {
                409
            }
            Verdict::KeyReused => 422,
            Verdict::QuotaExceeded | Verdict::RateLimited => 429,
            // The side effect ran and its outcome is in neither the store nor the journal: the
            // gateway failed the caller after the fact, which is a 500, not "try again later".
            Verdict::Unrecorded | Verdict::JournalFailed => 500,
            Verdict::StoreUnavailable => 503,
        }
    }

    /// The problem type name (`https://idemgate.dev/problems/<name>`) and its title.
    pub fn problem(self) -> (&'static str, &'static str) {
        match self {
            Verdict::Execute => ("execute", "Execute"),
            Verdict::Executed => ("executed", "Executed"),
            Verdict::LeaseLost => ("lease-lost", "Lease lost"),
            Verdict::Unrecorded => ("outcome-unrecorded", "Outcome not recorded"),
            Verdict::Replayed => ("replayed", "Replayed"),
            Verdict::PassedThrough => ("pass-through", "Passed through"),
            Verdict::NotApplied => ("not-applied", "Not applied"),
            Verdict::InFlight => ("in-flight", "Call in flight"),
            Verdict::Unknown => ("outcome-unknown", "Outcome unknown"),
            Verdict::KeyRequired => ("key-required", "Idempotency key required"),
            Verdict::KeyReused => ("key-reused", "Idempotency key reused"),
            Verdict::BadRequest => ("bad-request", "Bad request"),
            Verdict::StoreUnavailable => ("store-unavailable", "Store unavailable"),
            Verdict::QuotaExceeded => ("quota-exceeded", "Quota exceeded"),
            Verdict::RateLimited => ("rate-limited", "Rate limited"),
            Verdict::NotFound => ("not-found", "Not found"),
            Verdict::NotResolvable => ("not-resolvable", "Not resolvable"),
            Verdict::JournalFailed => ("journal-failed", "Journal failed"),
        }
    }

    /// The exit code of `idemgate exec` for this verdict; `None` where the command's own exit code
    /// passes through (executions and replays). One table, so docs, tests and code agree.
    pub fn exit_code(self) -> Option<u8> {
        match self {
            Verdict::Execute | Verdict::Executed | Verdict::Replayed | Verdict::PassedThrough => {
                None
            }
            Verdict::KeyReused => Some(exit::KEY_REUSE),
            Verdict::StoreUnavailable | Verdict::QuotaExceeded | Verdict::RateLimited => {
                Some(exit::STORE_UNAVAILABLE)
            }
            Verdict::InFlight => Some(exit::IN_FLIGHT),
            Verdict::Unknown => Some(exit::UNKNOWN),
            Verdict::LeaseLost => Some(exit::LEASE_LOST),
            Verdict::NotApplied => Some(exit::NOT_APPLIED),
            Verdict::Unrecorded | Verdict::JournalFailed => Some(exit::UNRECORDED),
            Verdict::KeyRequired
            | Verdict::BadRequest
            | Verdict::NotFound
            | Verdict::NotResolvable => Some(exit::FAILURE),
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// Exit codes of the `idemgate` command line (a command's own exit code passes through on
/// execution and replay). The numbers follow BSD `sysexits.h` where one fits.
pub mod exit {
    /// Something else went wrong (bad input, an I/O error, a record that is not there).
    pub const FAILURE: u8 = 1;
    /// The key was used before with other arguments; nothing ran.
    pub const KEY_REUSE: u8 = 65;
    /// The store could not be opened or could not reserve the key; nothing ran.
    pub const STORE_UNAVAILABLE: u8 = 69;
    /// The command ran but its outcome was recorded neither in the store nor in the journal.
    pub const UNRECORDED: u8 = 70;
    /// Another process holds the key and did not finish within --wait.
    pub const IN_FLIGHT: u8 = 75;
    /// The outcome is unknown (an earlier run died mid-command); resolve it with `keys resolve`.
    pub const UNKNOWN: u8 = 76;
    /// The command ran, but outlived its lease and another run took the key over: the record
    /// holds the other run's outcome.
    pub const LEASE_LOST: u8 = 77;
    /// The command ran and declared (by an exit code given to --not-applied-exit-code) that it did
    /// nothing; the key is free again.
    pub const NOT_APPLIED: u8 = 79;
    /// The command could not be started; nothing ran and the key is free again.
    pub const NOT_STARTED: u8 = 127;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_problem_names_are_unique() {
        let mut labels: Vec<_> = Verdict::ALL.iter().map(|v| v.label()).collect();
        let mut names: Vec<_> = Verdict::ALL.iter().map(|v| v.problem().0).collect();
        labels.sort_unstable();
        labels.dedup();
        names.sort_unstable();
        names.dedup();
        assert_eq!(labels.len(), Verdict::ALL.len());
        assert_eq!(names.len(), Verdict::ALL.len());
    }

    #[test]
    fn only_results_of_the_tool_are_not_errors() {
        for v in Verdict::ALL {
            assert_eq!(v.is_error(), v.exit_code().is_some(), "{v}");
            assert_eq!(
                v.is_error(),
                v.http_status() >= 300 || v == Verdict::NotApplied
            );
        }
    }
}

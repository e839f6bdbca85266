//! What each front door sends for a [`Verdict`]: the gateway's HTTP status and problem name, the
//! command line's exit code. One table per wire, exhaustive, so docs, tests and code agree, and a
//! new verdict is a compile error here rather than an invented status. The verdicts themselves
//! are the core's (`idemgate_core::Verdict`), which knows no wire.

use idemgate_core::Verdict;

/// The base of every problem type URI a door sends (RFC 9457 `type`): the one place it is written.
pub const PROBLEM_TYPE_BASE: &str = "https://idemgate.dev/problems/";

/// The problem type URI of the problem named `name` ([`VerdictCodes::problem`]'s first part).
pub fn problem_type(name: &str) -> String {
    format!("{PROBLEM_TYPE_BASE}{name}")
}

/// The wire codes of a verdict: `use idemgate_kit::VerdictCodes` and call them on a [`Verdict`].
pub trait VerdictCodes: Copy {
    /// The HTTP status of the answer, for verdicts that are not the tool's own result.
    fn http_status(self) -> u16;
    /// The problem type name (the last part of [`problem_type`]) and its title.
    fn problem(self) -> (&'static str, &'static str);
    /// The exit code of `idemgate exec` for this verdict; `None` where the command's own exit code
    /// passes through (executions and replays).
    fn exit_code(self) -> Option<u8>;
}

impl VerdictCodes for Verdict {
    fn http_status(self) -> u16 {
        match self {
            Verdict::Execute => 201,
            Verdict::Executed
            | Verdict::Replayed
            | Verdict::PassedThrough
            | Verdict::NotApplied => 200,
            Verdict::KeyRequired | Verdict::BadRequest => 400,
            Verdict::NotFound => 404,
            // The action's outcome is gone for good; a new key names a new action.
            Verdict::Expired => 410,
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

    fn problem(self) -> (&'static str, &'static str) {
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
            Verdict::Expired => ("outcome-expired", "Outcome expired"),
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

    fn exit_code(self) -> Option<u8> {
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
            Verdict::Expired => Some(exit::EXPIRED),
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

/// Exit codes of the `idemgate` command line (a command's own exit code passes through on
/// execution and replay). The numbers follow BSD `sysexits.h` where one fits.
pub mod exit {
    /// Something else went wrong (bad input, an I/O error, a record that is not there).
    pub const FAILURE: u8 = 1;
    /// The command line was not understood, or lacks what the command needs (an unknown option,
    /// a missing argument, a resolution without the result it must store): nothing ran. The
    /// argument parser's own code for usage errors.
    pub const USAGE: u8 = 2;
    /// `scan` found a duplicate side effect (a repeat that ran), for use in CI.
    pub const DUPLICATES_FOUND: u8 = 1;
    /// The key was used before with other arguments; nothing ran.
    pub const KEY_REUSE: u8 = 65;
    /// An input file could not be read, or holds nothing it should (`scan`: no trace).
    pub const NO_INPUT: u8 = 66;
    /// The store could not be opened or could not reserve the key; nothing ran.
    pub const STORE_UNAVAILABLE: u8 = 69;
    /// An output file could not be written (`scan --html`).
    pub const CANNOT_CREATE: u8 = 73;
    /// The MCP server could not be started, or did not answer (`mcp lint`).
    pub const SERVER_UNAVAILABLE: u8 = 69;
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
    /// The command ran before under this key and its outcome expired (the record's tombstone
    /// says so); it was not run again. A new key runs it again, or `keys reopen`.
    pub const EXPIRED: u8 = 80;
    /// The command could not be started; nothing ran and the key is free again.
    pub const NOT_STARTED: u8 = 127;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problem_names_are_unique() {
        let mut names: Vec<_> = Verdict::ALL.iter().map(|v| v.problem().0).collect();
        names.sort_unstable();
        names.dedup();
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

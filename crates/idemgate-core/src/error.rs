//! Errors of the core: key limits, canonical JSON, stores and the engine.

use std::time::Duration;

pub use crate::canonical::CanonicalError;
pub use crate::key::KeyError;
use crate::key::{Key, KeyRule};
use crate::time::Timestamp;

/// A store operation that did not succeed. What the engine does next depends on whether the write
/// may have happened, so stores must classify their driver errors carefully.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The caller's lease (fence and token) is no longer the record's current one: the lease expired
    /// and somebody took the record over, or the record was resolved, released or purged.
    #[error("lease lost: the record was taken over, resolved or removed")]
    LeaseLost,
    /// The store could not be reached or refused the operation: the write certainly did not happen.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The operation may or may not have taken effect (a timeout or a dropped connection after the
    /// request was sent).
    #[error("store answer lost, the write may have happened: {0}")]
    Indeterminate(String),
    /// The store holds something this version cannot read.
    #[error("store data is corrupt: {0}")]
    Corrupt(String),
    /// The store is set up in a way that breaks the contract (for example a Redis without
    /// persistence, or a schema from a newer version).
    #[error("store misconfigured: {0}")]
    Misconfigured(String),
}

impl StoreError {
    /// Whether retrying the same operation may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            StoreError::Unavailable(_) | StoreError::Indeterminate(_)
        )
    }
}

/// Why the engine refused or could not finish a call. Expected outcomes (replays, in-flight and
/// unknown answers) are not errors: they are [`crate::Answer`]s.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// A write tool was called without a key and has no fallback window.
    #[error("tool {tool} is treated as a write (it is not known to be read-only) and needs an idempotency key; pass one (derive it from the run id and step), configure a fallback window for the tool, or mark it read-only if it is")]
    KeyRequired {
        /// The tool.
        tool: String,
    },
    /// The key was used before with different arguments (IETF draft: 422).
    #[error("idempotency key {key} was already used with different arguments (first use at {first_seen}); use a new key for a new action")]
    KeyReuse {
        /// The record.
        key: Key,
        /// Which rule named it.
        rule: KeyRule,
        /// When the first call reserved the key.
        first_seen: Timestamp,
    },
    /// The reservation failed; the side effect was not run (fail closed).
    #[error("failed to reserve the key, so the call was not run: {0}")]
    ReserveFailed(#[source] StoreError),
    /// A name or the arguments were invalid.
    #[error(transparent)]
    InvalidKey(#[from] KeyError),
    /// The arguments were not valid JSON.
    #[error(transparent)]
    InvalidArguments(#[from] CanonicalError),
    /// A store operation other than the reservation failed (lookups by operators, journal
    /// flushing).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// No record counts under the key.
    #[error("no record for {key}")]
    NotFound {
        /// The key.
        key: Key,
    },
    /// The record is not in a state an operator may resolve.
    #[error("record {key} is {state} at fence {fence}; only an unknown record at the fence you looked at can be resolved (look again with `keys show`)")]
    NotResolvable {
        /// The key.
        key: Key,
        /// Its state now.
        state: crate::record::State,
        /// Its fence now.
        fence: crate::record::Fence,
    },
    /// The record is not in a state an operator may reopen (see [`crate::Engine::reopen`]).
    #[error("record {key} is {state} at fence {fence}; only a completed or unknown record at the fence you looked at can be reopened{}", reopen_hint(*state))]
    NotReopenable {
        /// The key.
        key: Key,
        /// Its state now.
        state: crate::record::State,
        /// Its fence now.
        fence: crate::record::Fence,
    },
    /// The local journal of unrecorded completions could not be written or read.
    #[error("failed to use the completion journal: {0}")]
    Journal(String),
}

/// What an operator can do about a record [`EngineError::NotReopenable`] refused.
pub(crate) fn reopen_hint(state: crate::record::State) -> &'static str {
    match state {
        crate::record::State::InFlight => {
            ": a call holds it and may be running the action now, so reopening it could run the \
             action twice; wait until it finishes or its lease ends (it then reads unknown)"
        }
        _ => " (look again with `keys show`)",
    }
}

/// How long to wait before asking again, for in-flight answers.
pub(crate) fn retry_after(lease_left: Duration) -> Duration {
    lease_left.clamp(Duration::from_secs(1), Duration::from_secs(60))
}

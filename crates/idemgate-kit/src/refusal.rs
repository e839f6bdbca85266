//! Why a call was refused, as facts: the engine's errors read once, so that a door words a
//! refusal through [`crate::Explanation`] as it words an answer, and none words one itself.

use idemgate_core::{EngineError, Fence, State, StoreError, Timestamp, Verdict};

/// What a refusal says. Nothing ran, except under [`Refusal::LeaseLost`]: what ran is not the
/// record's outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A write without a key, whose tool has no fallback window.
    KeyRequired {
        /// The tool, as the engine knows it.
        tool: String,
    },
    /// The key was used before with other arguments.
    KeyReused {
        /// When the first call reserved it.
        first_seen: Timestamp,
    },
    /// A name or the arguments are invalid.
    Invalid {
        /// Which, and why, in the engine's words.
        why: String,
    },
    /// The store failed.
    Store {
        /// At the reservation, so nothing ran (else in an operator's lookup or a journal flush).
        reserving: bool,
        /// How.
        failure: StoreFailure,
    },
    /// The caller's lease is no longer the record's: it was taken over, resolved or released.
    LeaseLost,
    /// No record counts under the key.
    NotFound,
    /// An operator's resolution or reopening of a record whose state (or fence) does not allow it.
    NotSettleable {
        /// Which the operator asked for.
        asked: Settle,
        /// The record's state now.
        state: State,
        /// Its fence now.
        fence: Fence,
    },
    /// The journal of outcomes the store has not confirmed could not be used.
    Journal {
        /// Why, in the engine's words.
        why: String,
    },
    /// An error of a newer engine than this kit knows: the engine's verdict and words.
    Other {
        /// Its verdict.
        verdict: Verdict,
        /// The engine's words.
        why: String,
    },
}

/// What an operator asked to do to a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settle {
    /// Say what happened to an unknown record.
    Resolve,
    /// Make a completed or unknown record absent, so its key runs the action again.
    Reopen,
}

/// How the store failed, each in the store's own words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreFailure {
    /// Not reached, refused, or its answer lost: retrying may succeed.
    Unreachable(String),
    /// The store holds a record this process cannot read (corrupt, or sealed under a key the
    /// keyring does not hold): the words name the record and, for a sealed one, the key id it
    /// needs. Retrying cannot help until an operator fixes the store or the keyring.
    Unreadable(String),
    /// Set up wrong: retrying cannot help.
    Misconfigured(String),
}

impl StoreFailure {
    fn of(e: &StoreError) -> Self {
        let why = e.to_string();
        match e {
            StoreError::Corrupt(_) => StoreFailure::Unreadable(why),
            StoreError::Misconfigured(_) => StoreFailure::Misconfigured(why),
            StoreError::Unavailable(_) | StoreError::Indeterminate(_) | StoreError::LeaseLost => {
                StoreFailure::Unreachable(why)
            }
            // `StoreError` may grow: a failure this kit does not know is taken for one that a
            // retry may get past, which is what the engine's verdict (store unavailable) says.
            _ => StoreFailure::Unreachable(why),
        }
    }

    /// The store's words.
    pub fn words(&self) -> &str {
        match self {
            StoreFailure::Unreachable(why)
            | StoreFailure::Unreadable(why)
            | StoreFailure::Misconfigured(why) => why,
        }
    }
}

impl Refusal {
    /// The facts of an engine error.
    pub fn of(e: &EngineError) -> Self {
        match e {
            EngineError::KeyRequired { tool } => Refusal::KeyRequired { tool: tool.clone() },
            EngineError::KeyReuse { first_seen, .. } => Refusal::KeyReused {
                first_seen: *first_seen,
            },
            EngineError::InvalidKey(_) | EngineError::InvalidArguments(_) => {
                Refusal::Invalid { why: e.to_string() }
            }
            EngineError::ReserveFailed(s) => Refusal::Store {
                reserving: true,
                failure: StoreFailure::of(s),
            },
            EngineError::Store(StoreError::LeaseLost) => Refusal::LeaseLost,
            EngineError::Store(s) => Refusal::Store {
                reserving: false,
                failure: StoreFailure::of(s),
            },
            EngineError::NotFound { .. } => Refusal::NotFound,
            EngineError::NotResolvable { state, fence, .. } => Refusal::NotSettleable {
                asked: Settle::Resolve,
                state: *state,
                fence: *fence,
            },
            EngineError::NotReopenable { state, fence, .. } => Refusal::NotSettleable {
                asked: Settle::Reopen,
                state: *state,
                fence: *fence,
            },
            EngineError::Journal(why) => Refusal::Journal {
                why: why.to_string(),
            },
            // `EngineError` may grow: a newer error is told in the engine's words, under its
            // verdict, until this kit gives it facts of its own.
            _ => Refusal::Other {
                verdict: Verdict::of_error(e),
                why: e.to_string(),
            },
        }
    }

    /// The verdict of the refusal (the engine's `Verdict::of_error` of its error).
    pub fn verdict(&self) -> Verdict {
        match self {
            Refusal::KeyRequired { .. } => Verdict::KeyRequired,
            Refusal::KeyReused { .. } => Verdict::KeyReused,
            Refusal::Invalid { .. } => Verdict::BadRequest,
            Refusal::Store { .. } => Verdict::StoreUnavailable,
            Refusal::LeaseLost => Verdict::LeaseLost,
            Refusal::NotFound => Verdict::NotFound,
            Refusal::NotSettleable { .. } => Verdict::NotResolvable,
            Refusal::Journal { .. } => Verdict::JournalFailed,
            Refusal::Other { verdict, .. } => *verdict,
        }
    }
}

//! What a call came to, as the engine answers it: what the side effect reported ([`Effect`]),
//! what happened to the call ([`Decision`], in an [`Answer`]) and whether its outcome was recorded
//! ([`Recording`]). In a module of their own, below the engine: the observers, the verdict table and
//! the replay cache read them without reaching into the engine, so no module of the core imports
//! one that imports it back.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::key::{Key, KeyRule};
use crate::record::{Fence, Outcome};
use crate::time::Timestamp;

/// What a side effect reports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "effect", content = "value", rename_all = "snake_case")]
pub enum Effect {
    /// It happened; this is its result. Stored and replayed.
    Success(Vec<u8>),
    /// It failed for good; this is the failure. Stored and replayed.
    Failed(Vec<u8>),
    /// Nothing happened (validation failed, the tool refused before acting): the key is released so
    /// a retry runs. `reply` is what the tool answered, for the caller (it is not stored).
    NotApplied {
        /// Why, in words.
        message: String,
        /// The tool's own answer, passed to this caller only (a front door may show it).
        reply: Option<Vec<u8>>,
    },
    /// It may or may not have happened (a timeout after sending, a dropped connection): the record
    /// becomes unknown and is never silently re-run.
    Ambiguous(String),
}

impl Effect {
    /// Nothing happened, for this reason; no reply to pass on.
    pub fn not_applied(message: impl Into<String>) -> Self {
        Effect::NotApplied {
            message: message.into(),
            reply: None,
        }
    }
}

/// Whether the store has the outcome of a call that executed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "recording", content = "detail", rename_all = "snake_case")]
pub enum Recording {
    /// The store confirmed it.
    Stored,
    /// The store did not answer in time; the write is in the local journal and will be flushed
    /// when the store is back. Until then duplicates wait, then see an unknown outcome.
    Journaled,
    /// The lease was lost while the side effect ran (it outlived its lease and somebody took the
    /// record over): the store kept the other holder's record, not this outcome.
    LeaseLost,
    /// Neither the store nor the journal took the write; the record will turn unknown when its
    /// lease ends, for an operator to resolve.
    Unrecorded(String),
}

impl Recording {
    /// Its name as every door says it (the `recording` member, header and log field), the same
    /// as its serialized tag.
    pub fn name(&self) -> &'static str {
        match self {
            Recording::Stored => "stored",
            Recording::Journaled => "journaled",
            Recording::LeaseLost => "lease_lost",
            Recording::Unrecorded(_) => "unrecorded",
        }
    }
}

/// The engine's answer to one call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    /// The record the call was judged by (none for reads and natural-idempotent writes).
    pub key: Option<Key>,
    /// Which rule named the record.
    pub rule: Option<KeyRule>,
    /// What happened.
    #[serde(flatten)]
    pub decision: Decision,
}

/// What happened to a call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
// Not `non_exhaustive`: every door explains it through `idemgate_kit::Explanation`, whose match
// is whole, so a new decision is a compile error there, once.
pub enum Decision {
    /// This call ran the side effect.
    Executed {
        /// The outcome.
        outcome: Outcome,
        /// When it was recorded (store clock; the local clock when only journaled).
        executed_at: Timestamp,
        /// Until when duplicates get it replayed.
        expires_at: Timestamp,
        /// Whether the store has it.
        recording: Recording,
    },
    /// A duplicate: the stored outcome, without running the side effect.
    Replayed {
        /// The stored outcome.
        outcome: Outcome,
        /// When the original call's outcome was recorded.
        executed_at: Timestamp,
        /// Until when it is kept.
        expires_at: Timestamp,
        /// True when a verifier established the outcome after it was unknown.
        verified: bool,
    },
    /// A read or naturally idempotent tool: run without a record.
    PassedThrough {
        /// What the tool reported.
        effect: Effect,
    },
    /// This call ran the side effect, which reported that nothing happened; the key was released.
    NotApplied {
        /// What the tool said.
        message: String,
        /// The tool's own answer, if it gave one (not stored).
        reply: Option<Vec<u8>>,
        /// Whether the store confirmed the release (else it is journaled or pending expiry).
        recording: Recording,
    },
    /// Another call holds the key and did not finish within the wait bound.
    InFlight {
        /// When the other call reserved the key.
        since: Timestamp,
        /// When to ask again.
        retry_after: Duration,
    },
    /// The outcome is unknown: the side effect may or may not have happened.
    Unknown {
        /// Since when, as the record says (its lease's end, or when it was marked unknown), so
        /// that every answer and the operator's view agree; the engine's clock only when the
        /// mark is not in the store yet.
        since: Timestamp,
        /// The record's fence (an operator resolves it with this).
        fence: Fence,
        /// True when this very call ran the side effect and the tool reported it ambiguous.
        ran_here: bool,
        /// What the tool or verifier said, if anything.
        message: Option<String>,
        /// When this call marked the record unknown (it ran the side effect, or took the record
        /// over to verify it): whether the store took the mark.
        recording: Option<Recording>,
    },
    /// The action ran and its outcome is no longer kept (past its ttl, within its tombstone):
    /// nothing ran now, and the caller is told so instead of the action running again.
    Expired {
        /// When the action's outcome was recorded.
        executed_at: Timestamp,
        /// When its outcome stopped being replayed.
        expired_at: Timestamp,
        /// When the tombstone goes (then the key names a new action).
        retain_until: Timestamp,
        /// The record's fence (an operator reopens it with this).
        fence: Fence,
    },
}

impl Answer {
    /// The outcome, when there is one (executed, replayed, or passed through with a result).
    pub fn outcome(&self) -> Option<Outcome> {
        match &self.decision {
            Decision::Executed { outcome, .. } | Decision::Replayed { outcome, .. } => {
                Some(outcome.clone())
            }
            Decision::PassedThrough {
                effect: Effect::Success(b),
            } => Some(Outcome::success(b.clone())),
            Decision::PassedThrough {
                effect: Effect::Failed(b),
            } => Some(Outcome::failed(b.clone())),
            _ => None,
        }
    }

    /// Whether this call ran the side effect.
    pub fn executed_here(&self) -> bool {
        matches!(
            self.decision,
            Decision::Executed { .. }
                | Decision::PassedThrough { .. }
                | Decision::NotApplied { .. }
                | Decision::Unknown { ran_here: true, .. }
        )
    }
}

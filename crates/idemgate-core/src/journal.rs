//! The local journal of completions the store has not confirmed yet.
//!
//! When the "done" write fails after the side effect ran, the engine retries it with bounded
//! backoff, then writes it here durably and answers the caller with its result. A reservation
//! whose answer was lost, and which could not be taken back at once, is written here too, to be
//! taken back later. Flushing replays
//! journaled writes into the store once it is back; each is a compare-and-set on its lease, so
//! replaying one twice, or after the record was taken over, is harmless.

use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::canonical::Fingerprint;
use crate::error::JournalError;
use crate::key::{hex, Key};
use crate::record::{Lease, Outcome};
use crate::store::Keep;
use crate::time::Timestamp;

/// The write a journal entry stands for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum JournalOp {
    /// Store this outcome, kept for `ttl_ms` from when it is stored, and remembered for
    /// `tombstone_ms` (see [`crate::Keep`]).
    Complete {
        /// The outcome.
        outcome: Outcome,
        /// How long to replay it, in milliseconds.
        ttl_ms: u64,
        /// How long to remember the record, in milliseconds (entries written before tombstones
        /// have none).
        #[serde(default)]
        tombstone_ms: u64,
    },
    /// Remove the record: the side effect did not happen.
    Release,
    /// Mark the record unknown: the tool said the outcome is ambiguous.
    MarkUnknown,
    /// Take back a reservation whose answer was lost and which the engine could not take back at
    /// once: the call was refused, so nothing ran. If the record is still the one the entry's
    /// token made, it is removed, so that a retry runs the call once instead of finding it
    /// unknown when its lease ends. The entry's fence is 0 (the engine never learnt it) and its
    /// fingerprint is set.
    TakeBack,
}

impl JournalOp {
    /// A completion kept as `keep` says.
    pub fn complete(outcome: Outcome, keep: Keep) -> Self {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        JournalOp::Complete {
            outcome,
            ttl_ms: ms(keep.ttl),
            tombstone_ms: ms(keep.tombstone),
        }
    }

    /// How a completion is kept.
    pub fn keep(ttl_ms: u64, tombstone_ms: u64) -> Keep {
        Keep {
            ttl: Duration::from_millis(ttl_ms),
            tombstone: Duration::from_millis(tombstone_ms),
        }
    }
}

/// One unconfirmed write.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalEntry {
    /// The record.
    pub key: Key,
    /// The lease it was held under.
    pub lease: Lease,
    /// The write.
    #[serde(flatten)]
    pub op: JournalOp,
    /// When it was journaled (local clock).
    pub journaled_at: Timestamp,
    /// The fingerprint of the call's arguments, when the engine knew it: a completion whose
    /// record the store lost is written back under it (entries without one cannot be).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<Fingerprint>,
}

impl JournalEntry {
    /// A name unique to this entry (one per record and lease), safe as a file name.
    pub fn id(&self) -> String {
        format!(
            "{}-{}",
            hex(&self.key.digest()[..16]),
            self.lease.token.to_hex()
        )
    }
}

/// Durable storage for unconfirmed writes.
///
/// `append` must be durable when it returns (the caller's side effect has already happened).
pub trait Journal: Send + Sync + std::fmt::Debug + 'static {
    /// Adds an entry durably.
    ///
    /// # Errors
    /// When the entry could not be made durable.
    fn append(&self, entry: &JournalEntry) -> Result<(), JournalError>;

    /// The entries not yet removed, oldest first.
    ///
    /// # Errors
    /// When the journal could not be read.
    fn pending(&self) -> Result<Vec<JournalEntry>, JournalError>;

    /// Removes an entry once the store has it (or it can never apply).
    ///
    /// # Errors
    /// When the entry could not be removed.
    fn remove(&self, entry: &JournalEntry) -> Result<(), JournalError>;
}

/// A journal in memory: as durable as the process, for the memory store and tests.
#[derive(Debug, Default)]
pub struct MemoryJournal {
    entries: Mutex<Vec<JournalEntry>>,
}

impl MemoryJournal {
    /// An empty journal.
    pub fn new() -> Self {
        Self::default()
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, Vec<JournalEntry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Journal for MemoryJournal {
    fn append(&self, entry: &JournalEntry) -> Result<(), JournalError> {
        self.entries().push(entry.clone());
        Ok(())
    }

    fn pending(&self) -> Result<Vec<JournalEntry>, JournalError> {
        Ok(self.entries().clone())
    }

    fn remove(&self, entry: &JournalEntry) -> Result<(), JournalError> {
        let id = entry.id();
        self.entries().retain(|e| e.id() != id);
        Ok(())
    }
}

/// The outcome of one journal flush.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlushReport {
    /// Entries the store took.
    pub applied: usize,
    /// Entries dropped because their record stands at a higher fence (another call took it
    /// over).
    pub superseded: usize,
    /// Of the applied entries, completions written back as a new record because the store no
    /// longer had theirs (an asynchronous standby promoted, a backup restored).
    pub restored: usize,
    /// Entries dropped because another call's record stands at a fence not above theirs (the
    /// store lost theirs and a retry ran meanwhile), or because they could not be written back.
    pub displaced: usize,
    /// Entries kept for a later flush (the store was still unavailable).
    pub pending: usize,
}

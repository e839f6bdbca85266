//! Errors of the core: key limits, canonical JSON, stores, the journal and the engine.

use std::error::Error;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

pub use crate::canonical::CanonicalError;
pub use crate::key::KeyError;
use crate::key::{Key, KeyRule};
use crate::time::Timestamp;

/// What went wrong, in words, and the error behind it when there was one (a driver's, an I/O
/// error). It displays as its message only, which already says what matters; the error behind it
/// is its [`Error::source`], for whoever walks the chain (logs, debuggers) to find the original.
#[derive(Clone, Debug)]
pub struct Cause {
    message: String,
    // Shared, so that the errors that carry a cause stay `Clone` though most sources are not.
    source: Option<Arc<dyn Error + Send + Sync>>,
}

impl Cause {
    /// A cause said by `message`, kept with the error `source` behind it.
    pub fn new(message: impl Into<String>, source: impl Error + Send + Sync + 'static) -> Self {
        Cause {
            message: message.into(),
            source: Some(Arc::new(source)),
        }
    }
}

/// Reads as its message, as the `String` it replaced did, so that code which looks into a store
/// error's text (`m.contains(..)`) reads the same.
impl std::ops::Deref for Cause {
    type Target = str;

    fn deref(&self) -> &str {
        &self.message
    }
}

impl From<String> for Cause {
    /// A cause with nothing behind it but its message.
    fn from(message: String) -> Self {
        Cause {
            message,
            source: None,
        }
    }
}

impl From<&str> for Cause {
    fn from(message: &str) -> Self {
        Cause::from(message.to_owned())
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl Error for Cause {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn Error + 'static))
    }
}

/// A store operation that did not succeed. What the engine does next depends on whether the write
/// may have happened, so stores must classify their driver errors carefully, and keep the driver's
/// error in the [`Cause`]: it is the error's [`Error::source`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum StoreError {
    /// The caller's lease (fence and token) is no longer the record's current one: the lease expired
    /// and somebody took the record over, or the record was resolved, released or purged.
    LeaseLost,
    /// The store could not be reached or refused the operation: the write certainly did not happen.
    Unavailable(Cause),
    /// The operation may or may not have taken effect (a timeout or a dropped connection after the
    /// request was sent).
    Indeterminate(Cause),
    /// The store holds something this version cannot read.
    Corrupt(Cause),
    /// The store is set up in a way that breaks the contract (for example a Redis without
    /// persistence, or a schema from a newer version).
    Misconfigured(Cause),
}

impl StoreError {
    /// Whether retrying the same operation may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            StoreError::Unavailable(_) | StoreError::Indeterminate(_)
        )
    }

    /// [`StoreError::Unavailable`], said by `cause`: a message, or a [`Cause`] that keeps the
    /// error behind it.
    pub fn unavailable(cause: impl Into<Cause>) -> Self {
        StoreError::Unavailable(cause.into())
    }

    /// [`StoreError::Indeterminate`], said by `cause`.
    pub fn indeterminate(cause: impl Into<Cause>) -> Self {
        StoreError::Indeterminate(cause.into())
    }

    /// [`StoreError::Corrupt`], said by `cause`.
    pub fn corrupt(cause: impl Into<Cause>) -> Self {
        StoreError::Corrupt(cause.into())
    }

    /// [`StoreError::Misconfigured`], said by `cause`.
    pub fn misconfigured(cause: impl Into<Cause>) -> Self {
        StoreError::Misconfigured(cause.into())
    }

    /// What went wrong, for the errors that say it.
    pub fn cause(&self) -> Option<&Cause> {
        match self {
            StoreError::LeaseLost => None,
            StoreError::Unavailable(c)
            | StoreError::Indeterminate(c)
            | StoreError::Corrupt(c)
            | StoreError::Misconfigured(c) => Some(c),
        }
    }
}

// By hand rather than derived: the source is the cause's own source (the driver's error), not the
// cause, whose message the error's text already holds.
impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::LeaseLost => {
                f.write_str("lease lost: the record was taken over, resolved or removed")
            }
            StoreError::Unavailable(c) => write!(f, "store unavailable: {c}"),
            StoreError::Indeterminate(c) => {
                write!(f, "store answer lost, the write may have happened: {c}")
            }
            StoreError::Corrupt(c) => write!(f, "store data is corrupt: {c}"),
            StoreError::Misconfigured(c) => write!(f, "store misconfigured: {c}"),
        }
    }
}

impl Error for StoreError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.cause().and_then(Error::source)
    }
}

/// A journal that could not be written, read or cleared. Its message names the operation and the
/// place; the I/O (or other) error behind it is its source.
#[derive(Clone, Debug, thiserror::Error)]
#[error(transparent)]
pub struct JournalError(Cause);

impl JournalError {
    /// An error said by `message`, kept with the error `source` behind it.
    pub fn new(message: impl Into<String>, source: impl Error + Send + Sync + 'static) -> Self {
        JournalError(Cause::new(message, source))
    }
}

impl From<String> for JournalError {
    /// An error with nothing behind it but its message.
    fn from(message: String) -> Self {
        JournalError(Cause::from(message))
    }
}

impl From<&str> for JournalError {
    fn from(message: &str) -> Self {
        JournalError(Cause::from(message))
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
    Journal(#[source] JournalError),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_say_the_message_and_sources_keep_the_cause() {
        let io = std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out");
        let e = StoreError::Indeterminate(Cause::new("failed to commit: timed out", io));
        assert_eq!(
            e.to_string(),
            "store answer lost, the write may have happened: failed to commit: timed out"
        );
        let source = e.source().and_then(|s| s.downcast_ref::<std::io::Error>());
        assert_eq!(
            source.map(std::io::Error::kind),
            Some(std::io::ErrorKind::TimedOut)
        );
        assert!(StoreError::unavailable("down").source().is_none());
        assert!(StoreError::LeaseLost.source().is_none());

        let io = std::io::Error::new(std::io::ErrorKind::StorageFull, "no space left");
        let e = EngineError::Journal(JournalError::new("failed to write journal entry", io));
        assert_eq!(
            e.to_string(),
            "failed to use the completion journal: failed to write journal entry"
        );
        let journal = e.source().expect("the journal's error");
        assert!(journal.is::<JournalError>());
        assert!(journal.source().is_some_and(|s| s.is::<std::io::Error>()));
    }
}

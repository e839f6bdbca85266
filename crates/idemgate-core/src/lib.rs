#![doc = include_str!("../README.md")]

pub mod answer;
pub mod caller;
pub mod canonical;
pub mod change;
pub mod engine;
pub mod error;
pub mod faulty;
pub mod history;
pub mod journal;
pub mod key;
pub mod memory;
pub mod observe;
pub mod policy;
pub mod record;
mod replay;
pub mod store;
pub mod time;
pub mod transition;
pub mod url;
pub mod verdict;

pub use canonical::Fingerprint;
pub use change::{ChangeMark, Changes};
pub use engine::traced;
pub use engine::{
    Answer, Begun, Call, Decision, Effect, Engine, FlushReport, JournalFlusher, Named, Probe,
    ProbeFuture, Recording, Resolution, Settings, Ticket, Verifier, FLUSH_RETRY, MAX_OBSERVATIONS,
};
pub use error::{CanonicalError, Cause, EngineError, JournalError, KeyError, StoreError};
pub use history::{Happening, HistoryEntry};
pub use journal::{Journal, JournalEntry, JournalOp, MemoryJournal};
pub use key::{IdempotencyKey, Key, KeyRule, TenantId, ToolName};
pub use memory::MemoryStore;
pub use observe::{Event, Observer, Observers};
pub use policy::{Mode, Policies, ToolKind, ToolPolicy, UnknownPolicy, DEFAULT_TOMBSTONE};
pub use record::{Fence, Lease, LeaseToken, Outcome, OutcomeKind, Record, RecordState, State};
pub use store::{
    Claim, Completion, Keep, ListCursor, ListFilter, Reopened, Reservation, ReserveHistory,
    ReservePath, Store,
};
pub use time::{Clock, HostInstant, ManualClock, Now, SystemClock, Timestamp};
pub use verdict::Verdict;

/// The `tracing` target of the spans that mark each phase of a call (`idemgate.reserve`,
/// `idemgate.wait`, `idemgate.replay`, `idemgate.effect`, `idemgate.complete`,
/// `idemgate.journal`, `idemgate.flush`): what `idemgate-trace` exports, and nothing else.
pub const TRACE_TARGET: &str = "idemgate.trace";

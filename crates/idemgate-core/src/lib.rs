//! The idempotency engine of idemgate, without I/O.
//!
//! A mutating tool call carries an idempotency key naming its logical action. The engine reserves
//! the key atomically in a [`Store`] before the side effect runs, stores the outcome under it, and
//! answers duplicates with the stored outcome instead of running the side effect again. Every
//! answer says whether it executed or replayed, from when, and by which rule.
//!
//! ```
//! use idemgate_core::{Call, Decision, Effect, Engine, IdempotencyKey, MemoryStore, TenantId, ToolName};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! let engine = Engine::new(MemoryStore::new());
//! let call = Call::new(TenantId::new("acme")?, ToolName::new("send_invoice")?)
//!     .key(IdempotencyKey::derive("run-17", "tool-call-3")?)
//!     .args(&serde_json::json!({"customer": 42, "amount_cents": 1999}));
//!
//! let first = engine.call(call.clone(), || async { Effect::Success(b"invoice 9".to_vec()) }).await?;
//! assert!(matches!(first.decision, Decision::Executed { .. }));
//!
//! // The runtime retries: the invoice is not sent twice.
//! let retry = engine.call(call, || async { unreachable!("never runs twice") }).await?;
//! assert!(matches!(retry.decision, Decision::Replayed { .. }));
//! assert_eq!(retry.outcome().unwrap().body, b"invoice 9");
//! # Ok::<_, Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

pub mod answer;
pub mod caller;
pub mod canonical;
pub mod change;
pub mod engine;
pub mod error;
pub mod faulty;
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
    ProbeFuture, Recording, Resolution, Settings, Ticket, Verifier, FLUSH_RETRY,
};
pub use error::{CanonicalError, EngineError, KeyError, StoreError};
pub use journal::{Journal, JournalEntry, JournalOp, MemoryJournal};
pub use key::{IdempotencyKey, Key, KeyRule, TenantId, ToolName};
pub use memory::MemoryStore;
pub use observe::{Event, Observer, Observers};
pub use policy::{Policies, ToolKind, ToolPolicy, UnknownPolicy, DEFAULT_TOMBSTONE};
pub use record::{Fence, Lease, LeaseToken, Outcome, OutcomeKind, Record, RecordState, State};
pub use store::{
    Claim, Completion, Keep, ListFilter, Reopened, Reservation, ReserveHistory, ReservePath, Store,
};
pub use time::{Clock, ManualClock, SystemClock, Timestamp};
pub use verdict::Verdict;

/// The `tracing` target of the spans that mark each phase of a call (`idemgate.reserve`,
/// `idemgate.wait`, `idemgate.replay`, `idemgate.effect`, `idemgate.complete`,
/// `idemgate.journal`, `idemgate.flush`): what `idemgate-trace` exports, and nothing else.
pub const TRACE_TARGET: &str = "idemgate.trace";

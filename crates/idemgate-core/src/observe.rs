//! What the engine tells observers (metrics, audit log, logs): every decision it makes, every
//! operator resolution and reopening, and every journal flush, so a front door gets all three
//! without writing a line of them.

use std::sync::Arc;

use crate::answer::Answer;
use crate::error::EngineError;
use crate::journal::FlushReport;
use crate::key::{Key, KeyRule, TenantId, ToolName};
use crate::record::{Fence, State};
use crate::verdict::Verdict;

/// One thing the engine (or a front door) did.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum Event<'a> {
    /// A call was decided: `begin` answered, a side effect's outcome was recorded, or the engine
    /// refused the call. A call that executes produces two: [`Verdict::Execute`] when its key is
    /// reserved and then the verdict of its outcome.
    Call {
        /// Whose call.
        tenant: &'a TenantId,
        /// Which tool.
        tool: &'a ToolName,
        /// The record, once it is named (not for reads or calls refused before).
        key: Option<&'a Key>,
        /// How it ended.
        verdict: Verdict,
        /// The fence of the lease this call holds or held, when it holds one.
        fence: Option<Fence>,
        /// The engine's answer, when there is one.
        answer: Option<&'a Answer>,
        /// The engine's error, when the call was refused.
        error: Option<&'a EngineError>,
    },
    /// An operator resolved an unknown record.
    Resolved {
        /// The record.
        key: &'a Key,
        /// The fence the operator resolved at.
        fence: Fence,
        /// True when it was released (nothing happened), false when completed.
        released: bool,
        /// Who resolved it (an OS user, a tenant's token), when the front door knows.
        by: Option<&'a str>,
        /// Why, in the operator's words.
        reason: Option<&'a str>,
    },
    /// An operator (or a program) reopened a completed or unknown record: it is gone, and the
    /// next call with its key runs the action again.
    Reopened {
        /// The record.
        key: &'a Key,
        /// The fence it was reopened at.
        fence: Fence,
        /// What it was: completed or unknown.
        was: State,
        /// Who reopened it (an OS user, a tenant's token), when the front door knows.
        by: Option<&'a str>,
        /// Why, in the operator's words.
        reason: Option<&'a str>,
    },
    /// Shadow mode ([`crate::Mode::Observe`]): a call ran that enforce mode would have answered
    /// without running (replayed, waited for, refused). Told once per such call, beside the
    /// [`Event::Call`] of the call itself (a pass-through).
    Observed {
        /// Whose call.
        tenant: &'a TenantId,
        /// Which tool.
        tool: &'a ToolName,
        /// The record it duplicates, when one names it (not for a call without a key, nor when
        /// the store could not be reached).
        key: Option<&'a Key>,
        /// The verdict enforce mode would have given.
        would: Verdict,
        /// The rule that named the record ([`KeyRule::duplicate_label`]), when one did.
        rule: Option<KeyRule>,
    },
    /// A journal flush that found entries, or failed.
    Flushed(&'a Result<FlushReport, EngineError>),
}

/// Receives the engine's events. Called inline on the call's path: keep it quick and never block
/// (count, format a line, hand it to a writer).
pub trait Observer: Send + Sync + 'static {
    /// One event.
    fn observe(&self, event: &Event<'_>);
}

/// Several observers, each told every event in order.
#[derive(Clone, Default)]
pub struct Observers(Vec<Arc<dyn Observer>>);

impl Observers {
    /// No observers.
    pub fn new() -> Self {
        Observers(Vec::new())
    }

    /// Adds one.
    pub fn push(&mut self, observer: Arc<dyn Observer>) {
        self.0.push(observer);
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Tells every observer.
    pub fn observe(&self, event: &Event<'_>) {
        for o in &self.0 {
            o.observe(event);
        }
    }
}

impl std::fmt::Debug for Observers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Observers({})", self.0.len())
    }
}

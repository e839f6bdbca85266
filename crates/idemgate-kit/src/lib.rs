//! The front-door kit: what every way into idemgate (the command line, the HTTP gateway, the MCP
//! proxy, the Python and Node packages) shares, so that none of them writes it again.
//!
//! - [`payload`]: the one stored-outcome format, tagged by content, so a record written by one
//!   door is replayed by another;
//! - [`Metrics`], [`Audit`] and [`Log`]: engine observers, attached in one call by
//!   [`Instruments::attach`];
//! - [`limits`]: per-tenant request rate and keys in flight;
//! - [`tenants`]: `[[tenants]]`, bearer tokens and who a request's token names;
//! - [`leases`] and [`records`]: what the in-process doors (the Python and Node packages) share:
//!   the lease keeper of functions running outside the runtime, and the operator's record view.
//!
//! - [`identity`]: what counts as the same action: the one function that names a call's record
//!   (key, scope, rule, window) from what its door knows;
//! - [`Explanation`]: what a call's answer means, as facts and as the sentences for a model and
//!   for a person, which every door renders;
//! - [`codes`]: what each door sends for a verdict (an HTTP status, a problem name, an exit
//!   code); the verdict itself, and whether it is a failure, is [`idemgate_core::Verdict`], next
//!   to the decisions themselves.

pub mod audit;
pub mod codes;
pub mod explain;
pub mod header;
pub mod identity;
pub mod leases;
pub mod limits;
pub mod log;
pub mod metrics;
pub mod payload;
pub mod records;
pub mod tenants;

use std::path::Path;
use std::sync::Arc;

use idemgate_core::{Engine, Store};

pub use audit::Audit;
pub use codes::{exit, problem_members, problem_type, VerdictCodes, PROBLEM_TYPE_BASE};
pub use explain::{Door, Explanation, Next, Resolve, What};
pub use limits::{LiveKeys, RateLimit};
pub use log::Log;
pub use metrics::Metrics;
pub use payload::{reported_effect, HttpAnswer, Payload, PayloadError};

/// Metrics, the audit log and logs of one front door.
#[derive(Clone, Debug)]
pub struct Instruments {
    /// The Prometheus counters.
    pub metrics: Arc<Metrics>,
    /// The audit log (a no-op when not configured).
    pub audit: Arc<Audit>,
}

impl Instruments {
    /// Metrics that label the `tools` by name (every other tool counts as `other`, so callers
    /// cannot grow the series without bound) and the audit log at `audit_log`, if given.
    ///
    /// # Errors
    /// When the audit log cannot be opened for appending.
    pub fn open<I, T>(audit_log: Option<&Path>, tools: I) -> std::io::Result<Self>
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        Ok(Instruments {
            metrics: Arc::new(Metrics::for_tools(tools)),
            audit: Arc::new(Audit::open(audit_log)?),
        })
    }

    /// The engine with metrics, audit log and logs observing it.
    pub fn attach<S: Store>(&self, engine: Engine<S>) -> Engine<S> {
        engine
            .with_observer(self.metrics.clone())
            .with_observer(self.audit.clone())
            .with_observer(Arc::new(Log))
    }
}

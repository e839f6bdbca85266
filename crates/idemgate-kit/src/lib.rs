#![doc = include_str!("../README.md")]

pub mod audit;
pub mod codes;
pub mod explain;
pub mod header;
pub mod html;
pub mod identity;
#[cfg(feature = "jose")]
pub mod jose;
pub mod leases;
pub mod limits;
pub mod log;
pub mod metrics;
pub mod payload;
pub mod problem;
pub mod records;
pub mod refusal;
pub mod story;
pub mod tenants;
pub mod tls;
pub mod x402;

use std::path::Path;
use std::sync::Arc;

use idemgate_core::{Engine, Store};

pub use audit::Audit;
pub use codes::{exit, problem_type, VerdictCodes, PROBLEM_TYPE_BASE};
pub use explain::{path_segment, Door, Explanation, Next, Resolve, What, MODEL_REPEAT};
pub use limits::{LiveKeys, RateLimit};
pub use log::Log;
pub use metrics::Metrics;
pub use payload::{reported_effect, HttpAnswer, Payload, PayloadError};
pub use problem::Problem;
pub use refusal::{Refusal, Settle, StoreFailure};

/// The tool `idemgate exec` records its commands under unless `--tool` names another. A record
/// of this tool is a command's, so an operator who says it completed without saying what it
/// returned gets a command's outcome (exit 0) stored; a record of any other tool is another
/// door's, whose callers get its result replayed, so `keys resolve` asks for that result.
pub const EXEC_TOOL: &str = "exec";

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

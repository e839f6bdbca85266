//! Structured JSON logs. Handlers log tenants, tools, decisions and a short digest of each key:
//! never raw keys, tokens or results.

use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

/// The environment variable with the log filter (`info` when unset), e.g. `IDEMGATE_LOG=debug`.
pub const LOG_ENV: &str = "IDEMGATE_LOG";

/// A JSON subscriber writing to `writer`, filtered by `IDEMGATE_LOG`.
pub fn subscriber<W>(writer: W) -> impl tracing::Subscriber + Send + Sync + 'static
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = EnvFilter::try_from_env(LOG_ENV).unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .with_current_span(false)
        .with_span_list(false)
        .with_writer(writer)
        .finish()
}

/// Installs the JSON subscriber on standard error for the whole process; a no-op when one is
/// installed already (tests, embedding programs).
pub fn init() {
    let _ = tracing::subscriber::set_global_default(subscriber(std::io::stderr));
}

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

/// Installs, for the whole process, the JSON logs on standard error and, when the standard
/// `OTEL_EXPORTER_OTLP_*` variables point at a collector, the export of idemgate's spans
/// (`idemgate-trace`). Keep the returned pipeline until the process ends: dropping it sends the
/// spans not sent yet. Logs are a no-op when a subscriber is installed already (tests, embedding
/// programs).
///
/// # Errors
/// When the OpenTelemetry variables ask for what idemgate cannot do (`http/json`, an exporter
/// other than OTLP) or name a malformed endpoint.
pub fn init() -> Result<Option<idemgate_trace::Tracing>, idemgate_trace::TraceError> {
    use tracing_subscriber::filter::FilterExt as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::Layer as _;
    let traces = idemgate_trace::Tracing::from_env("idemgate")?;
    let filter = EnvFilter::try_from_env(LOG_ENV).unwrap_or_else(|_| EnvFilter::new("info"));
    // The engine's phase spans are for the trace layer alone: logs neither show nor keep them,
    // so without traces an engine call makes no span at all.
    let not_phases =
        tracing_subscriber::filter::filter_fn(|m| m.target() != idemgate_trace::TARGET);
    let logs = tracing_subscriber::fmt::layer()
        .json()
        .with_current_span(false)
        .with_span_list(false)
        .with_writer(std::io::stderr)
        .with_filter(filter.and(not_phases));
    let subscriber = tracing_subscriber::registry()
        .with(logs)
        .with(traces.as_ref().map(|t| t.layer()));
    let _ = tracing::subscriber::set_global_default(subscriber);
    Ok(traces)
}

//! idemgate's traces: one OpenTelemetry span per call, exported over OTLP when the standard
//! `OTEL_EXPORTER_OTLP_*` variables say where, and nothing at all otherwise.
//!
//! The engine (`idemgate-core`, which does no I/O) marks its phases as `tracing` spans with the
//! target [`TARGET`]: `idemgate.reserve` (with `idemgate.wait` while a duplicate waits for the
//! call in flight, and `idemgate.replay` when a stored outcome answers), `idemgate.effect` (the
//! side effect), `idemgate.complete` (recording the outcome; `idemgate.journal` when it goes to
//! the local journal) and `idemgate.flush` (the journal's flusher). A door opens the call's own
//! span with [`call_span`] under the caller's [`TraceContext`] (an HTTP `traceparent` header, an
//! MCP request's `_meta`, the `TRACEPARENT` variable, the Python or Node current span), records
//! the answer on it with [`record`], and hands [`outgoing`] to whatever runs the side effect (the
//! upstream's headers, the MCP server's `_meta`, the command's environment), so the tool's own
//! spans are children of `idemgate.effect`.
//!
//! [`Tracing::from_env`] builds the exporter; [`Tracing::layer`] is the `tracing-subscriber`
//! layer that turns the engine's spans (and only those: the layer filters by target) into
//! OpenTelemetry spans. Without a layer the engine's spans cost one disabled-callsite check each.

mod context;
mod pipeline;
mod span;

pub use context::TraceContext;
pub use pipeline::{flush_process, install, install_for_process, Protocol, TraceError, Tracing};
pub use span::{call_span, outgoing, record, record_answer, Door, SplitCall};
/// For a door's own attributes on its call's span (`span.set_attribute(...)`).
pub use tracing_opentelemetry::OpenTelemetrySpanExt as SpanExt;

/// The `tracing` target of every span idemgate exports (the engine's and the doors'): the
/// exporting layer takes these and nothing else, so a door's request logs never become spans.
pub const TARGET: &str = idemgate_core::TRACE_TARGET;

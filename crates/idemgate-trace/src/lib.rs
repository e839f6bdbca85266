#![doc = include_str!("../README.md")]

mod context;
mod pipeline;
mod span;

pub use context::TraceContext;
pub use pipeline::{flush_process, install, install_for_process, Protocol, TraceError, Tracing};
pub use span::{
    call_span, outgoing, record, record_answer, record_begun, record_refusal, Door, SplitCall,
};
/// For a door's own attributes on its call's span (`span.set_attribute(...)`).
pub use tracing_opentelemetry::OpenTelemetrySpanExt as SpanExt;

/// The `tracing` target of every span idemgate exports (the engine's and the doors'): the
/// exporting layer takes these and nothing else, so a door's request logs never become spans.
pub const TARGET: &str = idemgate_core::TRACE_TARGET;

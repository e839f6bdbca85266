//! W3C Trace Context as it crosses a door: a checked `traceparent` and the `tracestate` beside it.

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::TraceContextExt as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;

/// A caller's (or our own) position in a trace, as the W3C `traceparent` and `tracestate` say it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceContext {
    traceparent: String,
    tracestate: Option<String>,
}

impl TraceContext {
    /// A context from the header values; `None` when `traceparent` is not a valid version-00
    /// (or later, read as 00) W3C `traceparent` with non-zero ids. A malformed header is
    /// ignored, as the W3C recommendation says: the call goes on in a new trace.
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<Self> {
        let parts: Vec<&str> = traceparent.trim().split('-').collect();
        let [version, trace_id, parent_id, flags, ..] = parts[..] else {
            return None;
        };
        let hex = |s: &str, len: usize| {
            s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        };
        let zero = |s: &str| s.bytes().all(|b| b == b'0');
        // Version ff is invalid; version 00 has exactly four parts; later versions may add more.
        let valid = hex(version, 2)
            && version != "ff"
            && (version != "00" || parts.len() == 4)
            && hex(trace_id, 32)
            && !zero(trace_id)
            && hex(parent_id, 16)
            && !zero(parent_id)
            && hex(flags, 2);
        valid.then(|| TraceContext {
            traceparent: format!("00-{trace_id}-{parent_id}-{flags}"),
            tracestate: tracestate
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned),
        })
    }

    /// The context a carrier holds under the W3C names `traceparent` and `tracestate` (HTTP
    /// headers, an MCP request's `_meta`, the environment's `TRACEPARENT`, each read by `get`).
    pub fn from_carrier<'a>(get: impl Fn(&str) -> Option<&'a str>) -> Option<Self> {
        TraceContext::parse(get("traceparent")?, get("tracestate"))
    }

    /// The `traceparent` value.
    pub fn traceparent(&self) -> &str {
        &self.traceparent
    }

    /// The `tracestate` value, when the caller sent one.
    pub fn tracestate(&self) -> Option<&str> {
        self.tracestate.as_deref()
    }

    /// The trace id (32 lowercase hex digits).
    pub fn trace_id(&self) -> &str {
        &self.traceparent[3..35]
    }

    /// The id of the span this context names as the parent (16 lowercase hex digits).
    pub fn span_id(&self) -> &str {
        &self.traceparent[36..52]
    }

    /// As an OpenTelemetry context (a remote parent).
    pub(crate) fn to_otel(&self) -> opentelemetry::Context {
        let mut carrier = HashMap::with_capacity(2);
        carrier.insert("traceparent".to_owned(), self.traceparent.clone());
        if let Some(state) = &self.tracestate {
            carrier.insert("tracestate".to_owned(), state.clone());
        }
        TraceContextPropagator::new().extract(&carrier)
    }

    /// The context of an OpenTelemetry span, when it names a valid one.
    pub(crate) fn of_otel(cx: &opentelemetry::Context) -> Option<Self> {
        if !cx.span().span_context().is_valid() {
            return None;
        }
        let mut carrier: HashMap<String, String> = HashMap::with_capacity(2);
        TraceContextPropagator::new().inject_context(cx, &mut carrier);
        let traceparent = carrier.remove("traceparent")?;
        TraceContext::parse(&traceparent, carrier.get("tracestate").map(String::as_str))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_is_kept_with_its_state() {
        let cx = TraceContext::parse(GOOD, Some(" vendor=1 ")).unwrap();
        assert_eq!(cx.traceparent(), GOOD);
        assert_eq!(cx.tracestate(), Some("vendor=1"));
        assert_eq!(cx.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(cx.span_id(), "00f067aa0ba902b7");
        let back = TraceContext::of_otel(&cx.to_otel()).unwrap();
        assert_eq!(back, cx);
    }

    #[test]
    fn malformed_traceparents_are_ignored() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceContext::parse(bad, None), None, "{bad:?}");
        }
        // A later version may carry more fields; its first four are read as version 00.
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what";
        assert_eq!(
            TraceContext::parse(later, None).unwrap().traceparent(),
            GOOD
        );
    }
}

//! The idempotency headers of the IETF draft and this gateway's additions.

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use idemgate::{KeyRule, Timestamp};

/// The caller's idempotency key.
pub(crate) const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// Whether the answer is a replay of a stored outcome.
pub(crate) const REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");
/// Which rule named the record: `explicit` or `fallback`.
pub(crate) const RULE: HeaderName = HeaderName::from_static("idempotency-rule");
/// When the original execution was recorded.
pub(crate) const EXECUTED_AT: HeaderName = HeaderName::from_static("idempotency-executed-at");
/// How the outcome of an execution was recorded: `stored` or `journaled` (in the gateway's local
/// journal until the store is back).
pub(crate) const RECORDING: HeaderName = HeaderName::from_static("idempotency-recording");
/// Until when the record is kept.
pub(crate) const EXPIRES_AT: HeaderName = HeaderName::from_static("idempotency-expires-at");
/// On a replay of an operator's resolution (`keys resolve`, the console, `POST …/resolve`):
/// `operator`. Its `Idempotency-Executed-At` is then when the operator resolved the record, not
/// when the action ran.
pub(crate) const RESOLVED_BY: HeaderName = HeaderName::from_static("idempotency-resolved-by");

/// Sets the headers every answer about a keyed record carries.
pub(crate) fn set_record_headers(
    h: &mut HeaderMap,
    replayed: bool,
    rule: KeyRule,
    executed_at: Option<Timestamp>,
    expires_at: Option<Timestamp>,
) {
    h.insert(
        REPLAYED,
        HeaderValue::from_static(if replayed { "true" } else { "false" }),
    );
    h.insert(RULE, HeaderValue::from_static(rule.as_str()));
    for (name, at) in [(EXECUTED_AT, executed_at), (EXPIRES_AT, expires_at)] {
        if let Some(at) = at {
            if let Ok(v) = HeaderValue::from_str(&at.to_string()) {
                h.insert(name, v);
            }
        }
    }
}

/// The caller's W3C trace context (`traceparent`, `tracestate`), when it sent a valid one, and
/// the span of its call of `tool` under it.
pub(crate) fn call_span(
    headers: &HeaderMap,
    tenant: &idemgate::TenantId,
    tool: &idemgate::ToolName,
) -> (Option<idemgate_trace::TraceContext>, tracing::Span) {
    let caller =
        idemgate_trace::TraceContext::from_carrier(|name| headers.get(name)?.to_str().ok());
    let span = idemgate_trace::call_span(
        idemgate_trace::Door::Http,
        tenant.as_str(),
        tool.as_str(),
        None,
        caller.as_ref(),
    );
    (caller, span)
}

//! `ucp`, the Universal Commerce Protocol's shopping service over REST (its checkout and cart
//! REST bindings, "Idempotency", and the signatures chapter's "Idempotency Key Requirements"):
//! - `Idempotency-Key` on every state-changing operation (the OpenAPI marks it required);
//!   without one, 400;
//! - a duplicate whose body matches gets the cached answer, compared by "the SHA-256 hash of the
//!   raw body bytes" (not as JSON: members in another order are another body);
//! - the same key with another body: 409 Conflict, nothing executed;
//! - kept at least 24 hours; a store that cannot answer fails closed with 503.
//!
//! UCP names no codes for these refusals and no status for a key still in flight; its protocol
//! errors are `{"code", "content"}`. The gateway's, in that shape: `idempotency_key_required`
//! (400), `idempotency_conflict` (409), and `idempotency_in_flight` as 503 with `Retry-After`,
//! the answer UCP's clients already retry (a 409 there means a body that will never match).

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::json;

use crate::error::Problem;

/// A UCP protocol error (`{"code", "content"}`) for a refusal.
pub(super) fn error(p: Problem) -> Response {
    let (status, code, content) = match p.name {
        "key-required" => (
            p.status,
            "idempotency_key_required",
            "Idempotency-Key header is required for this operation".to_owned(),
        ),
        "key-reused" => (
            StatusCode::CONFLICT,
            "idempotency_conflict",
            "Idempotency key reused with different payload".to_owned(),
        ),
        "in-flight" => (
            StatusCode::SERVICE_UNAVAILABLE,
            "idempotency_in_flight",
            "A request with this Idempotency-Key is still being processed; retry after the Retry-After delay".to_owned(),
        ),
        other => (p.status, other, p.detail),
    };
    super::json_error(
        status,
        &json!({ "code": code.replace('-', "_"), "content": content }),
        p.retry_after,
    )
}

//! `acp`, the Agentic Commerce Protocol's checkout API (its RFC "Agentic Checkout", section 6,
//! "Idempotency, Retries & Concurrency"):
//! - an `Idempotency-Key` on every POST; without one, 400 `idempotency_key_required`;
//! - the same key with another body, 422 `idempotency_conflict`; the same key while the first
//!   request runs, 409 `idempotency_in_flight` with `Retry-After`;
//! - a replay is the original answer with its status and `Idempotent-Replayed: true`;
//! - an upstream's 5xx is never stored: the caller gets it, and a retry with the key runs fresh;
//! - a key past its retention is a new request (no tombstone), retained at least 24 hours;
//! - errors are ACP's flat `{"type", "code", "message"}`, and every answer echoes the key.

use axum::response::Response;
use serde_json::json;

use crate::error::Problem;

/// An ACP error (`{"type", "code", "message"}`, section 3 and 6.4) for a refusal: the idempotency
/// refusals in the RFC's own codes and words, the rest by the gateway's problem name.
pub(super) fn error(p: Problem) -> Response {
    let (kind, code, message) = match p.name {
        "key-required" => (
            "invalid_request",
            "idempotency_key_required",
            "Idempotency-Key header is required".to_owned(),
        ),
        "key-reused" => (
            "invalid_request",
            "idempotency_conflict",
            "Idempotency-Key has already been used with a different request body".to_owned(),
        ),
        "in-flight" => (
            "invalid_request",
            "idempotency_in_flight",
            "A request with this Idempotency-Key is currently being processed".to_owned(),
        ),
        "bad-request" | "payload-too-large" | "not-found" => {
            ("invalid_request", "invalid", p.detail)
        }
        "store-unavailable" | "quota-exceeded" | "rate-limited" => {
            ("service_unavailable", p.name, p.detail)
        }
        // Outcome unknown or expired, and what else the gateway refuses: the gateway's name
        // for it, in ACP's shape.
        other => ("processing_error", other, p.detail),
    };
    let code = code.replace('-', "_");
    // An in-flight refusal always carries its Retry-After (`Problem::explained`).
    super::json_error(
        p.status,
        &json!({ "type": kind, "code": code, "message": message }),
        p.retry_after,
    )
}

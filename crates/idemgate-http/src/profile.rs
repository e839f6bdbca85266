//! Named idempotency contracts of the protocols agents pay with, for forwarded tools
//! (`[tools.NAME] profile`): the same engine and records, the protocol's own wire.
//!
//! `acp`, the Agentic Commerce Protocol's checkout API (its RFC "Agentic Checkout", section 6,
//! "Idempotency, Retries & Concurrency"):
//! - an `Idempotency-Key` on every POST; without one, 400 `idempotency_key_required`;
//! - the same key with another body, 422 `idempotency_conflict`; the same key while the first
//!   request runs, 409 `idempotency_in_flight` with `Retry-After`;
//! - a replay is the original answer with its status and `Idempotent-Replayed: true`;
//! - an upstream's 5xx is never stored: the caller gets it, and a retry with the key runs fresh;
//! - a key past its retention is a new request (no tombstone), retained at least 24 hours;
//! - errors are ACP's flat `{"type", "code", "message"}`, and every answer echoes the key.

use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use crate::error::{set_retry_after, Problem};
use crate::headers::IDEMPOTENCY_KEY;

/// The contract a forwarded tool answers by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Profile {
    /// idemgate's own: RFC 9457 problems, the IETF draft's headers (docs/HTTP.md).
    #[default]
    Idemgate,
    /// The Agentic Commerce Protocol's checkout API.
    Acp,
}

/// The shortest retention ACP allows (section 6.6: at least 24 hours).
pub const ACP_MIN_TTL: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

impl Profile {
    /// Whether an upstream's answer with `status` is kept as the call's outcome: under ACP a 5xx
    /// never is (section 6.5), so the retry runs fresh.
    pub(crate) fn stores_server_errors(self) -> bool {
        self == Profile::Idemgate
    }

    /// The answer to the caller in the profile's words: the response as it is, or a refusal
    /// (a problem) as the protocol writes errors; the request's key echoed (ACP).
    pub(crate) fn answer(
        self,
        result: Result<Response, Problem>,
        request: &HeaderMap,
    ) -> Result<Response, Problem> {
        match self {
            Profile::Idemgate => result,
            Profile::Acp => {
                let mut res = match result {
                    Ok(res) => res,
                    Err(problem) => acp_error(problem),
                };
                if let Some(key) = request.get(IDEMPOTENCY_KEY) {
                    res.headers_mut().insert(IDEMPOTENCY_KEY, key.clone());
                }
                Ok(res)
            }
        }
    }
}

/// An ACP error (`{"type", "code", "message"}`, section 3 and 6.4) for a refusal: the idempotency
/// refusals in the RFC's own codes and words, the rest by the gateway's problem name.
fn acp_error(p: Problem) -> Response {
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
    let body = json!({ "type": kind, "code": code, "message": message });
    let mut res = (p.status, body.to_string()).into_response();
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    // An in-flight refusal always carries one (`Problem::explained`).
    if let Some(after) = p.retry_after {
        set_retry_after(h, after);
    }
    res
}

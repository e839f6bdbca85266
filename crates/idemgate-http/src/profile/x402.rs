//! `x402`, a resource paid with x402 (version 2) whose payments carry the `payment-identifier`
//! extension (x402's `specs/extensions/payment_identifier.md`):
//! - the payment travels in the `PAYMENT-SIGNATURE` header, base64 of the `PaymentPayload` JSON;
//!   the action's key is its `extensions["payment-identifier"].info.id`, 16 to 128 letters,
//!   digits, `-` and `_`; the header goes on to the upstream, which verifies and settles it;
//! - a request without a payment is the client asking the price: the upstream answers 402 with
//!   its `PAYMENT-REQUIRED` and serves nothing, so it passes without a record;
//! - a payment without an identifier is refused with 400 (the gate requires one: the upstream
//!   should declare `"info": {"required": true}`), since nothing else could tell its retry apart;
//! - the same identifier with the same payment and body gets the cached answer, its
//!   `PAYMENT-RESPONSE` receipt included, and the upstream is not paid again; with another
//!   payment or body, 409 Conflict;
//! - an upstream's 402 without a settlement receipt (the payment was refused before the
//!   resource was served) is not kept, so the client's next payment under the same identifier
//!   runs; a 402 with a failed receipt (x402 settles after the work, so the resource may have
//!   been served) leaves the outcome unknown: never run again by a retry, resolved by an
//!   operator;
//! - a request without a payment asks the price: the upstream must answer it 402 (x402's
//!   contract for a paid resource), since it passes without a record; one served anyway is
//!   logged as a warning.
//!
//! The extension names no codes and no body for its refusals, nor a status for an identifier
//! still in flight. The gateway's: `{"error", "code"}` with `payment_identifier_required`
//! (400), `invalid_payload` (400), `payment_identifier_conflict` (409), and
//! `payment_identifier_in_flight` as 503 with `Retry-After`.

use axum::http::{HeaderMap, HeaderName, StatusCode};
use axum::response::Response;
use base64::Engine as _;
use idemgate::{Call, IdempotencyKey, TenantId, ToolName};
use serde_json::{json, Value};

use crate::error::Problem;
use crate::request;

/// x402 version 2's payment header (version 1's was `X-PAYMENT`).
const PAYMENT_SIGNATURE: HeaderName = HeaderName::from_static("payment-signature");
const V1_PAYMENT: HeaderName = HeaderName::from_static("x-payment");

/// The request headers the upstream needs: the payment it verifies and settles.
pub(super) static REQUEST_HEADERS: [HeaderName; 1] = [PAYMENT_SIGNATURE];

/// The settlement receipt's header.
pub(super) const RECEIPT: &str = "payment-response";

/// The answer headers kept and replayed: the settlement receipt, and a payment demand.
pub(super) static RESPONSE_HEADERS: [HeaderName; 2] = [
    HeaderName::from_static(RECEIPT),
    HeaderName::from_static("payment-required"),
];

/// The engine call of a request, and whether it carries a payment. Its key is the payment's
/// identifier (none when the payment has none: the engine then refuses it as a write without a
/// key); it is compared by the payment and the body together, so a retry that signs another
/// payment, or asks for another thing, is another request.
pub(super) fn call(
    tenant: &TenantId,
    tool: &ToolName,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(Call, bool), Problem> {
    // The body alone must be one JSON value, as for any call (a paid one is compared with its
    // payment as one JSON array below, which would take `1,2` for two members).
    let (call, body) = request::call_of_body(tenant, tool, body)?;
    let Some(header) = request::single_header(headers, &PAYMENT_SIGNATURE, "PAYMENT-SIGNATURE")?
    else {
        if headers.contains_key(V1_PAYMENT) {
            return Err(Problem::bad_request(
                "X-PAYMENT is x402 version 1, which has no payment identifier: send the payment in PAYMENT-SIGNATURE (x402 version 2) with the payment-identifier extension",
            ));
        }
        return Ok((call, false));
    };
    let payment = decode(header.as_bytes())?;
    let id = idemgate_kit::x402::payment_identifier(&payment).map_err(Problem::bad_request)?;
    let text = serde_json::to_string(&payment).expect("a JSON value always encodes");
    let mut compared = Vec::with_capacity(text.len() + body.len() + 3);
    compared.push(b'[');
    compared.extend_from_slice(text.as_bytes());
    compared.push(b',');
    compared.extend_from_slice(body);
    compared.push(b']');
    let call = call
        .args_text(&compared)
        .map_err(|e| Problem::bad_request(format!("the request body is not JSON: {e}")))?;
    // The client names the payment for the tenant, as an Idempotency-Key header would.
    let call = request::named_by_orchestration(call, id.as_ref().map(IdempotencyKey::as_str))?;
    Ok((call, true))
}

/// The `PaymentPayload` of a `PAYMENT-SIGNATURE` header (base64 of JSON, padded or not).
fn decode(header: &[u8]) -> Result<Value, Problem> {
    let bad = |why: String| Problem::bad_request(format!("PAYMENT-SIGNATURE {why}"));
    let trimmed = header.trim_ascii();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(trimmed)
        .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(trimmed))
        .map_err(|e| bad(format!("is not base64: {e}")))?;
    let payment: Value =
        serde_json::from_slice(&bytes).map_err(|e| bad(format!("is not base64 of JSON: {e}")))?;
    if !payment.is_object() {
        return Err(bad("is not a PaymentPayload object".to_owned()));
    }
    Ok(payment)
}

/// An x402 error (`{"error", "code"}`) for a refusal.
pub(super) fn error(p: Problem) -> Response {
    let (status, code, message) = match p.name {
        "key-required" => (
            p.status,
            "payment_identifier_required",
            "Server requires a payment identifier but none was provided: add the payment-identifier extension's info.id to the payment".to_owned(),
        ),
        "key-reused" => (
            StatusCode::CONFLICT,
            "payment_identifier_conflict",
            "payment identifier already used with different payload".to_owned(),
        ),
        "in-flight" => (
            StatusCode::SERVICE_UNAVAILABLE,
            "payment_identifier_in_flight",
            "a request with this payment identifier is still being processed; retry after the Retry-After delay".to_owned(),
        ),
        "bad-request" => (p.status, "invalid_payload", p.detail),
        other => (p.status, other, p.detail),
    };
    super::json_error(
        status,
        &json!({ "error": message, "code": code.replace('-', "_") }),
        p.retry_after,
    )
}

//! Named idempotency contracts of the protocols agents pay with, for forwarded tools
//! (`[tools.NAME] profile`): the same engine and records, the protocol's own wire. Each profile
//! says where the request's key lives, what counts as the same request, which upstream answers
//! are kept, and how refusals are written (docs/HTTP.md, "Commerce protocol profiles").

mod acp;
mod ucp;
mod x402;

use std::time::Duration;

use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use idemgate::{Call, Fingerprint, TenantId, ToolKind, ToolName, ToolPolicy};
use serde::Deserialize;

use crate::error::Problem;
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
    /// The Universal Commerce Protocol's shopping service (checkout, cart) over REST.
    Ucp,
    /// x402's `payment-identifier` extension: a paid resource whose payment names the action.
    X402,
}

impl Profile {
    /// The profile's name in configuration and errors.
    pub fn name(self) -> &'static str {
        match self {
            Profile::Idemgate => "idemgate",
            Profile::Acp => "acp",
            Profile::Ucp => "ucp",
            Profile::X402 => "x402",
        }
    }

    /// The shortest retention the protocol allows, if it sets one (ACP section 6.6 and UCP's
    /// checkout REST binding: at least 24 hours).
    pub fn min_ttl(self) -> Option<Duration> {
        match self {
            Profile::Acp | Profile::Ucp => Some(Duration::from_secs(24 * 3600)),
            Profile::Idemgate | Profile::X402 => None,
        }
    }

    /// Whether every request names its action itself, so that a fallback window has nothing
    /// to join (a request without a key is refused, or, under x402, unpaid).
    pub fn keys_every_request(self) -> bool {
        self != Profile::Idemgate
    }

    /// The tombstone a tool of this profile gets unless it sets one: under ACP a key past its
    /// retention is a new request (section 6.6); the others keep idemgate's.
    pub(crate) fn tombstone(self, default: Duration) -> Duration {
        match self {
            Profile::Acp => Duration::ZERO,
            Profile::Idemgate | Profile::Ucp | Profile::X402 => default,
        }
    }

    /// The engine call of a request under this profile: its key from where the protocol puts
    /// it, compared as the protocol compares requests. `policy` is the tool's; an x402 request
    /// without a payment makes it a read for this request (see [`x402`]).
    pub(crate) fn call(
        self,
        tenant: &TenantId,
        tool: &ToolName,
        headers: &HeaderMap,
        body: &[u8],
        policy: &mut ToolPolicy,
    ) -> Result<Call, Problem> {
        match self {
            Profile::Idemgate | Profile::Acp => {
                crate::request::call(tenant, tool, headers, body, &policy.identity)
            }
            // UCP compares "the SHA-256 hash of the raw body bytes": a body re-serialized with
            // its members in another order is another request.
            Profile::Ucp => {
                Ok(
                    crate::request::call(tenant, tool, headers, body, &policy.identity)?
                        .fingerprint(Fingerprint::of_bytes(body)),
                )
            }
            Profile::X402 => {
                let (call, paid) = x402::call(tenant, tool, headers, body)?;
                if !paid {
                    // Asking the price: the upstream demands a payment and serves nothing.
                    policy.kind = ToolKind::Read;
                }
                Ok(call)
            }
        }
    }

    /// The request headers the upstream needs besides the body (x402's payment).
    pub(crate) fn forwarded(
        self,
        request: &HeaderMap,
    ) -> impl Iterator<Item = (&'static HeaderName, &HeaderValue)> {
        let names: &'static [HeaderName] = match self {
            Profile::X402 => &x402::REQUEST_HEADERS,
            Profile::Idemgate | Profile::Acp | Profile::Ucp => &[],
        };
        names
            .iter()
            .flat_map(|name| request.get_all(name).iter().map(move |v| (name, v)))
    }

    /// The upstream's answer headers kept with its answer and replayed with it (x402's
    /// settlement receipt and payment demand).
    pub(crate) fn kept_headers(self) -> &'static [HeaderName] {
        match self {
            Profile::X402 => &x402::RESPONSE_HEADERS,
            Profile::Idemgate | Profile::Acp | Profile::Ucp => &[],
        }
    }

    /// Whether an upstream's answer with `status` is kept as the call's outcome. ACP never
    /// keeps a 5xx (section 6.5), so the retry runs fresh; under x402 a 402 means the payment
    /// was not taken and the resource not served, so the client's next payment under the same
    /// identifier runs (none of them is kept).
    pub(crate) fn keeps(self, status: StatusCode) -> bool {
        match self {
            Profile::Acp => !status.is_server_error(),
            Profile::X402 => status != StatusCode::PAYMENT_REQUIRED,
            Profile::Idemgate | Profile::Ucp => true,
        }
    }

    /// The answer to the caller in the profile's words: the response as it is, or a refusal
    /// (a problem) as the protocol writes errors.
    pub(crate) fn answer(
        self,
        result: Result<Response, Problem>,
        request: &HeaderMap,
    ) -> Result<Response, Problem> {
        match self {
            Profile::Idemgate => result,
            Profile::Acp => {
                let mut res = result.unwrap_or_else(acp::error);
                // ACP echoes the key on every answer.
                if let Some(key) = request.get(IDEMPOTENCY_KEY) {
                    res.headers_mut().insert(IDEMPOTENCY_KEY, key.clone());
                }
                Ok(res)
            }
            Profile::Ucp => Ok(result.unwrap_or_else(ucp::error)),
            Profile::X402 => Ok(result.unwrap_or_else(x402::error)),
        }
    }
}

/// A JSON error answer with `status`, and its `Retry-After` when the refusal has one.
fn json_error(
    status: StatusCode,
    body: &serde_json::Value,
    retry_after: Option<Duration>,
) -> Response {
    use axum::response::IntoResponse as _;
    let mut res = (status, body.to_string()).into_response();
    let h = res.headers_mut();
    h.insert(
        axum::http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Some(after) = retry_after {
        crate::error::set_retry_after(h, after);
    }
    res
}

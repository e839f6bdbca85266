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

    /// Whether a tool of this profile may be configured `kind`: a profile is the contract of a
    /// write (its key required, its answers kept), so a read or a natural-idempotent tool would
    /// silently drop it.
    pub fn allows_kind(self, kind: ToolKind) -> bool {
        self == Profile::Idemgate || kind == ToolKind::Write
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

    /// What an upstream's answer with `status` (and the `kept` headers) says of the call when
    /// the profile reads it otherwise than idemgate's own contract does; `None` when it does
    /// not. ACP never keeps a 5xx (section 6.5): released, so the retry runs fresh. Under x402
    /// a 402 without a settlement receipt is a payment refused before the resource was served
    /// (released: the client's next payment under the identifier runs); a 402 with a failed
    /// receipt is a settlement that failed after it may have been served (x402 settles after
    /// the work), which no retry may run again: unknown.
    pub(crate) fn reads(self, status: StatusCode, kept: &[(String, String)]) -> Option<Reading> {
        match self {
            Profile::Acp if status.is_server_error() => Some(Reading::Released),
            Profile::X402 if status == StatusCode::PAYMENT_REQUIRED => {
                Some(if kept.iter().any(|(name, _)| name == x402::RECEIPT) {
                    Reading::Unknown(
                        "the upstream answered 402 with a failed settlement: the resource may have been served before the payment failed",
                    )
                } else {
                    Reading::Released
                })
            }
            _ => None,
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

/// What a profile reads in an upstream's answer ([`Profile::reads`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reading {
    /// Nothing was done: the caller gets the answer, and the key is free.
    Released,
    /// The side effect may have run and its outcome is not known.
    Unknown(&'static str),
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

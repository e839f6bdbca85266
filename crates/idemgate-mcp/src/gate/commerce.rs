//! The MCP bindings of the commerce protocols (`profile = "acp" | "ucp" | "x402"` in the proxy's
//! configuration): where each puts a call's idempotency key, what counts as the same request,
//! which of its tools only read, how it writes the refusals it defines, and which server answers
//! say that nothing was done. The same gate and records; the protocol's own places and words
//! (docs/MCP.md, "Commerce protocol bindings").
//!
//! - `acp`, the Agentic Commerce Protocol's MCP binding (`docs/mcp-binding.md`): the key in the
//!   argument `meta.idempotency_key`; equivalence by the request body only (`payload` and the
//!   session `id`, not `meta`); errors as JSON-RPC errors `-32000` whose `data` is ACP's
//!   `{"type", "code", "message"}` (section 6.4's codes).
//! - `ucp`, the Universal Commerce Protocol's MCP binding (`checkout/mcp.md`, `cart/mcp.md`):
//!   the key in `meta["idempotency-key"]`; equivalence by the operation's arguments, not `meta`
//!   (its `ucp-agent` profile is what a header carries over REST); a reused key is the JSON-RPC
//!   error `-32000` its overview names, `data` UCP's `{"code", "content"}`.
//! - `x402`, x402 version 2 over MCP (`specs/transports-v2/mcp.md`) with the payment-identifier
//!   extension: the payment in `params._meta["x402/payment"]`, the key its
//!   `extensions["payment-identifier"].info.id`, compared with the arguments; a call without a
//!   payment asks the price (a read); a tool result that is a payment demand
//!   (`structuredContent` with `x402Version` and `accepts`) means the tool did not run, and is
//!   never kept. Its errors are tool results, as the proxy's own are.
//!
//! A key in `meta` is written in the tool's arguments, which a model fills: it is the model's
//! key (its conversation's, never another's); a program that names actions across sessions sends
//! its own in `_meta["dev.idemgate/idempotency-key"]`, which comes first. An x402 payment is signed by the
//! client's wallet, not written by the model: its identifier names the payment for the tenant.

use idemgate_core::{IdempotencyKey, Verdict};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::wire::frame::{self, Object};

/// A commerce protocol whose MCP binding the proxy speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Profile {
    /// The Agentic Commerce Protocol.
    Acp,
    /// The Universal Commerce Protocol.
    Ucp,
    /// x402 with the payment-identifier extension.
    X402,
}

/// The keys a call carries where its protocol puts them.
#[derive(Debug, Default)]
pub(crate) struct Found {
    /// The model's (in the arguments), and where.
    pub(crate) model: Option<(IdempotencyKey, String)>,
    /// The client's own (an x402 payment's identifier), and where.
    pub(crate) orchestration: Option<(IdempotencyKey, String)>,
    /// Whether an x402 call carries a payment (other protocols' calls always count as paid).
    pub(crate) paid: bool,
}

const X402_PAYMENT: &str = "x402/payment";

/// The tools of the ACP and UCP checkout bindings, by which a listing is recognised.
const ACP_TOOLS: [&str; 5] = [
    "create_checkout_session",
    "get_checkout_session",
    "update_checkout_session",
    "complete_checkout_session",
    "cancel_checkout_session",
];
const UCP_TOOLS: [&str; 9] = [
    "create_checkout",
    "get_checkout",
    "update_checkout",
    "complete_checkout",
    "cancel_checkout",
    "create_cart",
    "get_cart",
    "update_cart",
    "cancel_cart",
];

impl Profile {
    /// The binding a server's tools (`names`) are those of: at least two of its checkout (or
    /// cart) tools. x402 is not in a listing: it shows when a call is answered with a payment
    /// demand.
    pub fn recognise<'a>(names: impl IntoIterator<Item = &'a str> + Clone) -> Option<Profile> {
        let count = |tools: &[&str]| {
            names
                .clone()
                .into_iter()
                .filter(|n| tools.contains(n))
                .count()
        };
        if count(&ACP_TOOLS) >= 2 {
            Some(Profile::Acp)
        } else if count(&UCP_TOOLS) >= 2 {
            Some(Profile::Ucp)
        } else {
            None
        }
    }

    /// The protocol's name, as a person reads it.
    pub fn title(self) -> &'static str {
        match self {
            Profile::Acp => {
                "the Agentic Commerce Protocol's MCP binding (keys in meta.idempotency_key)"
            }
            Profile::Ucp => {
                "the Universal Commerce Protocol's MCP binding (keys in meta[\"idempotency-key\"])"
            }
            Profile::X402 => "x402 over MCP (the payment identifier in _meta[\"x402/payment\"])",
        }
    }

    /// The name `profile` takes in the configuration.
    pub fn name(self) -> &'static str {
        match self {
            Profile::Acp => "acp",
            Profile::Ucp => "ucp",
            Profile::X402 => "x402",
        }
    }

    /// The binding's tools that only read (a tool the configuration names keeps its policy).
    pub(crate) fn reads(self, tool: &str) -> bool {
        let reads: &[&str] = match self {
            Profile::Acp => &["get_checkout_session"],
            Profile::Ucp => &[
                "get_checkout",
                "get_cart",
                "get_order",
                "get_product",
                "search_catalog",
                "lookup_catalog",
            ],
            Profile::X402 => &[],
        };
        reads.contains(&tool)
    }

    /// The keys of a call with `params` and `arguments` where the protocol puts them; why not
    /// when one is there but is not a key.
    pub(crate) fn keys(self, params: &Object, arguments: &Object) -> Result<Found, String> {
        match self {
            Profile::Acp | Profile::Ucp => {
                let (name, from) = match self {
                    Profile::Acp => ("idempotency_key", "argument meta.idempotency_key"),
                    _ => ("idempotency-key", "argument meta[\"idempotency-key\"]"),
                };
                let model = match arguments.get("meta").and_then(|m| frame::object(m)) {
                    Some(meta) => match meta.get(name) {
                        Some(v) => key_in(v, from)?,
                        None => None,
                    },
                    None => None,
                };
                Ok(Found {
                    model,
                    orchestration: None,
                    paid: true,
                })
            }
            Profile::X402 => {
                let Some(payment) = payment(params)? else {
                    return Ok(Found::default());
                };
                let from = format!(
                    "params._meta[\"{X402_PAYMENT}\"].{}",
                    idemgate_kit::x402::IDENTIFIER_PATH
                );
                let orchestration = idemgate_kit::x402::payment_identifier(&payment)
                    .map_err(|e| format!("the payment identifier in {from} is invalid: {e}"))?
                    .map(|key| (key, from));
                Ok(Found {
                    model: None,
                    orchestration,
                    paid: true,
                })
            }
        }
    }

    /// What the call is compared by: the arguments without `meta` (ACP, UCP), the payment and
    /// the arguments together (x402: a retry that signs another payment is another request).
    pub(crate) fn compared(self, params: &Object, arguments: &Object) -> Box<RawValue> {
        match self {
            Profile::Acp | Profile::Ucp => {
                let mut body = arguments.clone();
                body.remove("meta");
                frame::raw(&body)
            }
            Profile::X402 => {
                let payment = payment(params).ok().flatten();
                frame::raw(&json!([payment, frame::raw(arguments)]))
            }
        }
    }

    /// The refusals the protocol defines, in its binding's words: a JSON-RPC error `-32000`
    /// with the protocol's error in `data`, and the proxy's explanation (`text`) as its
    /// message, which clients raise to the model. `None` for the rest, which the proxy answers
    /// in its own words.
    pub(crate) fn refusal(
        self,
        id: &RawValue,
        verdict: Verdict,
        text: &str,
        retry_after: Option<u64>,
    ) -> Option<String> {
        let data = match (self, verdict) {
            (Profile::Acp, Verdict::KeyRequired) => json!({
                "type": "invalid_request",
                "code": "idempotency_key_required",
                "message": "meta.idempotency_key is required",
                "param": "$.meta.idempotency_key",
            }),
            (Profile::Acp, Verdict::KeyReused) => json!({
                "type": "invalid_request",
                "code": "idempotency_conflict",
                "message": "Idempotency-Key has already been used with a different request body",
            }),
            (Profile::Acp, Verdict::InFlight) => json!({
                "type": "invalid_request",
                "code": "idempotency_in_flight",
                "message": "A request with this Idempotency-Key is currently being processed",
                "retry_after": retry_after,
            }),
            (Profile::Ucp, Verdict::KeyReused) => json!({
                "code": "idempotency_conflict",
                "content": "Idempotency key reused with different payload",
            }),
            (Profile::Ucp, Verdict::InFlight) => json!({
                "code": "idempotency_in_flight",
                "content": "A request with this idempotency key is still being processed",
                "retry_after": retry_after,
            }),
            _ => return None,
        };
        let error = json!({"code": -32000, "message": format!("idemgate: {text}"), "data": data});
        Some(format!(
            r#"{{"jsonrpc":"2.0","id":{},"error":{}}}"#,
            id.get(),
            error
        ))
    }

    /// Whether the server's answer says that it did nothing: ACP's `invalid_request` errors and
    /// UCP's protocol errors (refused before acting: the key stays free, as REST's 4xx under
    /// ACP is answered to its caller), and x402's payment demand (the tool did not run).
    pub(crate) fn did_nothing(self, result: Option<&RawValue>, error: Option<&RawValue>) -> bool {
        #[derive(Deserialize)]
        struct Error {
            code: i64,
            data: Option<Value>,
        }
        #[derive(Deserialize)]
        struct ToolResult {
            #[serde(rename = "isError", default)]
            is_error: bool,
            #[serde(rename = "structuredContent")]
            structured: Option<Value>,
        }
        match (self, result, error) {
            (Profile::Acp | Profile::Ucp, _, Some(e)) => {
                let Ok(e) = serde_json::from_str::<Error>(e.get()) else {
                    return false;
                };
                let data = e.data.unwrap_or(Value::Null);
                e.code == -32000
                    && match self {
                        Profile::Acp => data["type"] == "invalid_request",
                        _ => data["code"].is_string(),
                    }
            }
            (Profile::X402, Some(r), _) => {
                serde_json::from_str::<ToolResult>(r.get()).is_ok_and(|r| {
                    r.is_error
                        && r.structured.is_some_and(|s| {
                            s.get("x402Version").is_some() && s["accepts"].is_array()
                        })
                })
            }
            _ => false,
        }
    }
}

/// An x402 call's payment (`params._meta["x402/payment"]`), when it has one; why not when
/// what is there is not a payment (never taken for none: the call would pass as unpaid).
fn payment(params: &Object) -> Result<Option<Value>, String> {
    let Some(meta) = params.get("_meta").and_then(|m| frame::object(m)) else {
        return Ok(None);
    };
    let Some(raw) = meta.get(X402_PAYMENT) else {
        return Ok(None);
    };
    match serde_json::from_str::<Value>(raw.get()) {
        Ok(Value::Null) => Ok(None),
        Ok(payment @ Value::Object(_)) => Ok(Some(payment)),
        _ => Err(format!(
            "params._meta[\"{X402_PAYMENT}\"] must be an x402 PaymentPayload object"
        )),
    }
}

/// The key in `value` (JSON `null` is none), named `from` in the refusal when it is not one.
fn key_in(value: &RawValue, from: &str) -> Result<Option<(IdempotencyKey, String)>, String> {
    if value.get() == "null" {
        return Ok(None);
    }
    let text = serde_json::from_str::<String>(value.get())
        .map_err(|_| format!("the idempotency key in {from} must be a string"))?;
    IdempotencyKey::explicit(text)
        .map(|k| Some((k, from.to_owned())))
        .map_err(|e| format!("the idempotency key in {from} is invalid: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(v: Value) -> Object {
        frame::object(&frame::raw(&v)).unwrap()
    }

    #[test]
    fn an_in_flight_key_is_refused_with_its_retry_delay_in_the_protocols_words() {
        let id = frame::raw(&7);
        for (profile, code) in [
            (Profile::Acp, "idempotency_in_flight"),
            (Profile::Ucp, "idempotency_in_flight"),
        ] {
            let frame = profile
                .refusal(&id, Verdict::InFlight, "still running", Some(3))
                .unwrap();
            let v: Value = serde_json::from_str(&frame).unwrap();
            assert_eq!(v["id"], 7);
            assert_eq!(v["error"]["code"], -32000);
            assert_eq!(v["error"]["message"], "idemgate: still running");
            assert_eq!(v["error"]["data"]["code"], code);
            assert_eq!(v["error"]["data"]["retry_after"], 3);
        }
        // What the protocol does not define is the proxy's own answer.
        assert!(Profile::Ucp
            .refusal(&id, Verdict::KeyRequired, "no key", None)
            .is_none());
        assert!(Profile::X402
            .refusal(&id, Verdict::KeyReused, "reused", None)
            .is_none());
        assert!(Profile::Acp
            .refusal(&id, Verdict::Unknown, "unknown", None)
            .is_none());
    }

    #[test]
    fn only_what_the_protocol_says_did_nothing_frees_the_key() {
        let raw = |v: Value| frame::raw(&v);
        let acp_invalid = raw(
            json!({"code": -32000, "message": "m", "data": {"type": "invalid_request", "code": "missing"}}),
        );
        let acp_declined = raw(
            json!({"code": -32000, "message": "m", "data": {"type": "processing_error", "code": "payment_declined"}}),
        );
        let internal = raw(json!({"code": -32603, "message": "boom"}));
        assert!(Profile::Acp.did_nothing(None, Some(&acp_invalid)));
        assert!(!Profile::Acp.did_nothing(None, Some(&acp_declined)));
        assert!(!Profile::Acp.did_nothing(None, Some(&internal)));
        assert!(!Profile::Ucp.did_nothing(None, Some(&internal)));
        let demand =
            raw(json!({"isError": true, "structuredContent": {"x402Version": 2, "accepts": []}}));
        let failed = raw(json!({"isError": true, "structuredContent": {"error": "no"}}));
        let paid =
            raw(json!({"content": [], "structuredContent": {"x402Version": 2, "accepts": []}}));
        assert!(Profile::X402.did_nothing(Some(&demand), None));
        assert!(!Profile::X402.did_nothing(Some(&failed), None));
        assert!(!Profile::X402.did_nothing(Some(&paid), None));
    }

    #[test]
    fn keys_are_read_where_the_binding_puts_them() {
        let args = obj(
            json!({"meta": {"idempotency_key": "k-acp", "idempotency-key": "k-ucp"}, "payload": {}}),
        );
        let none = obj(json!({}));
        let acp = Profile::Acp.keys(&none, &args).unwrap();
        assert_eq!(acp.model.unwrap().0.as_str(), "k-acp");
        let ucp = Profile::Ucp.keys(&none, &args).unwrap();
        assert_eq!(ucp.model.unwrap().0.as_str(), "k-ucp");
        let bad = obj(json!({"meta": {"idempotency_key": 12}}));
        assert!(Profile::Acp
            .keys(&none, &bad)
            .unwrap_err()
            .contains("must be a string"));
        // x402: no payment, a payment, a payment that is not one.
        assert!(!Profile::X402.keys(&none, &none).unwrap().paid);
        let paid = obj(
            json!({"_meta": {"x402/payment": {"extensions": {"payment-identifier": {"info": {"id": "pay_0123456789abcdef"}}}}}}),
        );
        let found = Profile::X402.keys(&paid, &none).unwrap();
        assert!(found.paid);
        assert_eq!(
            found.orchestration.unwrap().0.as_str(),
            "pay_0123456789abcdef"
        );
        let garbled = obj(json!({"_meta": {"x402/payment": "eyJ4"}}));
        assert!(Profile::X402.keys(&garbled, &none).is_err());
        // The body without meta is what ACP compares.
        let compared = Profile::Acp.compared(&none, &args);
        assert_eq!(compared.get(), r#"{"payload":{}}"#);
    }
}

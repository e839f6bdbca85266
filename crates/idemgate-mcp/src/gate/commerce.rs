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
//!   `extensions["payment-identifier"].info.id`, compared with the arguments. A call without a
//!   payment asks the price (a tool not configured gets the re-emission window for it, released
//!   by a payment demand); a payment demand (`structuredContent` with `x402Version` and
//!   `accepts`) answering a paid call leaves the outcome unknown, since the binding answers a
//!   refused payment and a settlement that failed after the tool ran alike. Its errors are tool
//!   results, as the proxy's own are.
//!
//! A key in `meta` is written in the tool's arguments, which a model fills: it is the model's
//! key (its conversation's, never another's), and the server, which dedupes on it, gets the
//! record's downstream key in its place ([`Profile::put_downstream_key`]); a program that names
//! actions across sessions sends its own in `_meta["dev.idemgate/idempotency-key"]`, which comes
//! first. An x402 payment is signed by the client's wallet, not written by the model: its
//! identifier names the payment for the tenant.

use idemgate_core::{IdempotencyKey, Verdict};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::judge::key_in;
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

/// What a binding reads in a server's answer ([`Profile::reads_answer`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reading {
    /// Nothing was done: the caller gets the answer, and the key is free.
    Released,
    /// The side effect may have run and its outcome is not known.
    Unknown(&'static str),
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

    /// Where the binding puts a call's key in its arguments: the member of `meta`, and its
    /// path as a person reads it. `None` for x402, whose key is in the payment.
    pub(crate) fn key_in_arguments(self) -> Option<(&'static str, &'static str)> {
        match self {
            Profile::Acp => Some(("idempotency_key", "meta.idempotency_key")),
            Profile::Ucp => Some(("idempotency-key", "meta[\"idempotency-key\"]")),
            Profile::X402 => None,
        }
    }

    /// Whether `tool` is one of the binding's own checkout or cart tools, whose arguments carry
    /// its `meta`.
    pub(crate) fn binds(self, tool: &str) -> bool {
        match self {
            Profile::Acp => ACP_TOOLS.contains(&tool),
            Profile::Ucp => UCP_TOOLS.contains(&tool),
            Profile::X402 => false,
        }
    }

    /// Puts the call's downstream key (from its record's `digest`) in the binding's place in
    /// `arguments`, so that the server, which dedupes on that key itself, never sees a key the
    /// model chose (another conversation's or tenant's could be the same string) and one action
    /// sends it one key. A binding tool gets it whether the call carried one there or was named
    /// otherwise (a program's key, a call id, the window), `meta` made when it has none (`add`);
    /// another tool only has a key the model wrote there replaced. UCP's schema asks for a UUID:
    /// the digest's first 128 bits written as one (version 8, RFC 9562). Whether the arguments
    /// changed.
    pub(crate) fn put_downstream_key(
        self,
        arguments: &mut Object,
        digest: &[u8; 32],
        add: bool,
    ) -> bool {
        let Some((name, _)) = self.key_in_arguments() else {
            return false;
        };
        let mut meta = match arguments.get("meta") {
            None => Object::new(),
            Some(m) => match frame::object(m) {
                Some(meta) => meta,
                None => return false,
            },
        };
        if !add && !meta.contains_key(name) {
            return false;
        }
        let key = match self {
            Profile::Ucp => uuid_of(digest),
            _ => idemgate_core::key::hex(digest),
        };
        meta.insert(name.to_owned(), frame::raw(&key));
        arguments.insert("meta".to_owned(), frame::raw(&meta));
        true
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
                let (name, from) = self.key_in_arguments().expect("ACP and UCP key in meta");
                let model = match arguments.get("meta").and_then(|m| frame::object(m)) {
                    Some(meta) => match meta.get(name) {
                        Some(v) => key_in(v, from.to_owned())?,
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

    /// What the server's answer to a call (`paid`: whether it carried an x402 payment) says
    /// of the side effect when the binding reads it otherwise than the proxy does; `None` when
    /// it does not. Released (nothing was done: the key stays free, the caller gets the answer)
    /// only where the protocol says the request was refused before processing:
    /// - ACP: an `invalid_request` error (a 4xx over REST), but for its own idempotency codes;
    /// - UCP: the errors its registry lists before processing: negotiation (`-32001`),
    ///   signature and digest failures, and 429 and 503 (`-32000` with `retry_after`);
    /// - x402: the payment demand answering a call without a payment.
    ///
    /// A payment demand answering a paid call is unknown: the binding answers a payment refused
    /// at verification and a settlement that failed after the tool ran the same way.
    pub(crate) fn reads_answer(
        self,
        result: Option<&RawValue>,
        error: Option<&RawValue>,
        paid: bool,
    ) -> Option<Reading> {
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
                let e = serde_json::from_str::<Error>(e.get()).ok()?;
                let data = e.data.unwrap_or(Value::Null);
                let code = data["code"].as_str().unwrap_or("");
                let before = match self {
                    Profile::Acp => {
                        e.code == -32000
                            && data["type"] == "invalid_request"
                            && (!code.starts_with("idempotency_")
                                || code == "idempotency_key_required")
                    }
                    _ => match e.code {
                        -32001 => true,
                        -32000 => {
                            ["signature_missing", "signature_invalid", "key_not_found"]
                                .contains(&code)
                                || data.get("retry_after").is_some()
                        }
                        -32600 => ["digest_mismatch", "algorithm_unsupported"].contains(&code),
                        _ => false,
                    },
                };
                before.then_some(Reading::Released)
            }
            (Profile::X402, Some(r), _) => {
                let demand = serde_json::from_str::<ToolResult>(r.get()).is_ok_and(|r| {
                    r.is_error
                        && r.structured.is_some_and(|s| {
                            s.get("x402Version").is_some() && s["accepts"].is_array()
                        })
                });
                match (demand, paid) {
                    (false, _) => None,
                    (true, false) => Some(Reading::Released),
                    (true, true) => Some(Reading::Unknown(
                        "the server answered a paid call with a payment demand: the payment was refused, or its settlement failed after the tool ran",
                    )),
                }
            }
            _ => None,
        }
    }
}

/// The first 128 bits of `digest` as a UUID of version 8 (custom), variant RFC 9562.
fn uuid_of(digest: &[u8; 32]) -> String {
    let mut b = [0u8; 16];
    b.copy_from_slice(&digest[..16]);
    b[6] = (b[6] & 0x0f) | 0x80;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex = idemgate_core::key::hex(&b);
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
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
    fn only_what_the_protocol_says_was_refused_before_processing_frees_the_key() {
        let raw = |v: Value| frame::raw(&v);
        let released = Some(Reading::Released);
        let error =
            |code: i64, data: Value| raw(json!({"code": code, "message": "m", "data": data}));
        for (profile, e, read) in [
            (
                Profile::Acp,
                error(
                    -32000,
                    json!({"type": "invalid_request", "code": "missing_required_field"}),
                ),
                released,
            ),
            // The server's own idempotency refusals are not "nothing done" for this action.
            (
                Profile::Acp,
                error(
                    -32000,
                    json!({"type": "invalid_request", "code": "idempotency_in_flight"}),
                ),
                None,
            ),
            (
                Profile::Acp,
                error(
                    -32000,
                    json!({"type": "processing_error", "code": "payment_declined"}),
                ),
                None,
            ),
            (
                Profile::Acp,
                raw(json!({"code": -32603, "message": "boom"})),
                None,
            ),
            (
                Profile::Ucp,
                error(-32000, json!({"code": "signature_invalid", "content": "c"})),
                released,
            ),
            (
                Profile::Ucp,
                error(-32000, json!({"retry_after": 60})),
                released,
            ),
            (
                Profile::Ucp,
                error(-32001, json!({"code": "version_unsupported"})),
                released,
            ),
            (
                Profile::Ucp,
                error(-32600, json!({"code": "digest_mismatch"})),
                released,
            ),
            (
                Profile::Ucp,
                error(
                    -32000,
                    json!({"code": "idempotency_conflict", "content": "c"}),
                ),
                None,
            ),
            (
                Profile::Ucp,
                error(-32000, json!({"code": "anything_else"})),
                None,
            ),
            (
                Profile::Ucp,
                raw(json!({"code": -32603, "message": "boom"})),
                None,
            ),
        ] {
            assert_eq!(
                profile.reads_answer(None, Some(&e), true),
                read,
                "{profile:?} {}",
                e.get()
            );
        }
        let demand =
            raw(json!({"isError": true, "structuredContent": {"x402Version": 2, "accepts": []}}));
        let failed = raw(json!({"isError": true, "structuredContent": {"error": "no"}}));
        let served =
            raw(json!({"content": [], "structuredContent": {"x402Version": 2, "accepts": []}}));
        assert_eq!(
            Profile::X402.reads_answer(Some(&demand), None, false),
            released
        );
        assert!(matches!(
            Profile::X402.reads_answer(Some(&demand), None, true),
            Some(Reading::Unknown(_))
        ));
        assert_eq!(Profile::X402.reads_answer(Some(&failed), None, true), None);
        assert_eq!(Profile::X402.reads_answer(Some(&served), None, true), None);
    }

    #[test]
    fn the_server_gets_the_records_key_in_the_bindings_place() {
        let digest = [0xabu8; 32];
        let mut args =
            obj(json!({"meta": {"idempotency-key": "model-chosen", "ucp-agent": {}}, "id": "c"}));
        assert!(Profile::Ucp.put_downstream_key(&mut args, &digest, false));
        let meta = frame::object(&args["meta"]).unwrap();
        assert_eq!(
            meta["idempotency-key"].get(),
            r#""abababab-abab-8bab-abab-abababababab""#
        );
        assert!(meta.contains_key("ucp-agent"), "the rest of meta stays");
        let mut acp = obj(json!({"meta": {"idempotency_key": "k"}}));
        assert!(Profile::Acp.put_downstream_key(&mut acp, &digest, false));
        assert_eq!(
            frame::object(&acp["meta"]).unwrap()["idempotency_key"].get(),
            format!("\"{}\"", "ab".repeat(32))
        );
        // Another tool without the member keeps its arguments as they came; a binding tool
        // gets the key, and meta when it has none.
        let mut none = obj(json!({"meta": {"api_version": "1"}}));
        assert!(!Profile::Acp.put_downstream_key(&mut none, &digest, false));
        assert!(Profile::Acp.put_downstream_key(&mut none, &digest, true));
        let meta = frame::object(&none["meta"]).unwrap();
        assert_eq!(meta["api_version"].get(), r#""1""#);
        assert!(meta.contains_key("idempotency_key"));
        let mut bare = obj(json!({"id": "c"}));
        assert!(Profile::Ucp.put_downstream_key(&mut bare, &digest, true));
        assert!(frame::object(&bare["meta"])
            .unwrap()
            .contains_key("idempotency-key"));
        let mut not_object = obj(json!({"meta": "x"}));
        assert!(!Profile::Acp.put_downstream_key(&mut not_object, &digest, true));
        assert!(!Profile::X402.put_downstream_key(&mut acp, &digest, true));
        assert!(
            Profile::Acp.binds("complete_checkout_session") && !Profile::Acp.binds("send_mail")
        );
    }

    #[test]
    fn x402_refuses_to_retry_an_unknown_payment() {
        for text in [
            "profile = \"x402\"\n[default]\non_unknown = \"retry\"\n",
            "profile = \"x402\"\n[tools.pay]\non_unknown = \"retry\"\n",
        ] {
            let err = crate::Config::parse(text).unwrap_err().to_string();
            assert!(err.contains("would send the signed payment again"), "{err}");
        }
        crate::Config::parse("profile = \"acp\"\n[tools.pay]\non_unknown = \"retry\"\n").unwrap();
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

//! The HTTP headers that mirror a request of the modern era (MCP 2026-07-28, Streamable HTTP,
//! "Request Metadata" and "Custom Headers from Tool Parameters"), as the proxy sends them to an
//! upstream URL: a server of that era checks them against the body and refuses a request whose
//! headers are missing or disagree (HTTP 400, `-32020`).
//!
//! - `MCP-Protocol-Version` from the request's envelope, `Mcp-Method`, and `Mcp-Name` for
//!   `tools/call` and `prompts/get` (the name) and `resources/read` (the URI);
//! - `Mcp-Param-{Name}` for each argument of a `tools/call` whose property in the tool's input
//!   schema carries `"x-mcp-header": "Name"`, learned from the server's `tools/list` answers
//!   ([`ParamHeaders`]); an argument that is absent or null has no header.
//!
//! A value that is not printable ASCII without white space at its ends (or that looks like the
//! wrapper itself) goes as `=?base64?…?=` of its UTF-8 bytes ("Value Encoding").

use std::collections::HashMap;

use base64::Engine as _;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;

use super::era;
use super::frame::{self, Frame};
use super::headers::{METHOD_HEADER, NAME_HEADER, PARAM_PREFIX, VERSION_HEADER};

/// The schema member that names a parameter's header.
const X_MCP_HEADER: &str = "x-mcp-header";

/// One argument a tool's calls mirror: its header, and where it is in the arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Param {
    header: HeaderName,
    path: Vec<String>,
}

/// The parameters each tool's calls mirror in headers, by tool name, as the server's `tools/list`
/// answers declared them.
#[derive(Debug, Default)]
pub(crate) struct ParamHeaders {
    tools: HashMap<String, Vec<Param>>,
}

impl ParamHeaders {
    /// Learns the declarations of a `tools/list` result (one page: the tools it lists replace
    /// what was known of them).
    pub(crate) fn learn(&mut self, result: &Value) {
        let Some(tools) = result.get("tools").and_then(Value::as_array) else {
            return;
        };
        for tool in tools {
            let Some(name) = tool.get("name").and_then(Value::as_str) else {
                continue;
            };
            let mut params = Vec::new();
            if let Some(schema) = tool.get("inputSchema") {
                declared(schema, &mut Vec::new(), &mut params);
            }
            if params.is_empty() {
                self.tools.remove(name);
            } else {
                self.tools.insert(name.to_owned(), params);
            }
        }
    }

    /// The headers of `text` when it is a request of the modern era; none for anything else (a
    /// legacy request goes with the version its session agreed).
    pub(crate) fn headers_of(&self, text: &str) -> Vec<(HeaderName, HeaderValue)> {
        let Some(f) = Frame::parse(text) else {
            return Vec::new();
        };
        let (Some(method), Some(params)) = (f.method.as_deref(), f.params.as_deref()) else {
            return Vec::new();
        };
        let Some(params) = frame::object(params) else {
            return Vec::new();
        };
        let Some(version) = era::modern_version(&params) else {
            return Vec::new();
        };
        let mut headers = vec![
            (HeaderName::from_static(VERSION_HEADER), encoded(&version)),
            (HeaderName::from_static(METHOD_HEADER), encoded(method)),
        ];
        let Some(target) = target(method, &params) else {
            return headers;
        };
        headers.push((HeaderName::from_static(NAME_HEADER), encoded(&target)));
        let declared = match method {
            "tools/call" => self.tools.get(&target),
            _ => None,
        };
        if let Some(declared) = declared {
            let arguments: Value = params
                .get("arguments")
                .and_then(|a| serde_json::from_str(a.get()).ok())
                .unwrap_or(Value::Null);
            for p in declared {
                let value = p.path.iter().try_fold(&arguments, |v, k| v.get(k));
                let text = match value {
                    None | Some(Value::Null) => continue,
                    Some(Value::String(s)) => s.clone(),
                    // Numbers keep their JSON text; booleans are `true` / `false`.
                    Some(v @ (Value::Number(_) | Value::Bool(_))) => v.to_string(),
                    // Not a primitive: no header the server could compare; it judges the body.
                    Some(_) => continue,
                };
                headers.push((p.header.clone(), encoded(&text)));
            }
        }
        headers
    }
}

impl ParamHeaders {
    /// Why the `Mcp-Param-*` headers of a received request do not mirror it, when they do not:
    /// each parameter its tool declares (as far as a listing showed it) that the call gives a
    /// value must come in its header, equal once decoded (numbers compare as numbers).
    pub(crate) fn mismatch(&self, text: &str, received: &HeaderMap) -> Option<String> {
        for (name, value) in self.headers_of(text) {
            if !name.as_str().starts_with(PARAM_PREFIX) {
                continue;
            }
            let want = value.to_str().ok().and_then(decoded);
            let got = received
                .get(&name)
                .and_then(|v| v.to_str().ok())
                .and_then(decoded);
            let Some(got) = got else {
                return Some(format!("the {name} header is missing or unreadable"));
            };
            let same_number = || {
                let number = |s: &str| s.parse::<f64>().ok();
                want.as_deref()
                    .and_then(number)
                    .is_some_and(|w| number(&got) == Some(w))
            };
            if want.as_deref() != Some(got.as_str()) && !same_number() {
                return Some(format!("the {name} header does not match the argument"));
            }
        }
        None
    }
}

/// The `x-mcp-header` declarations of `schema` and of the properties it reaches through
/// `properties` (the only paths the specification lets a declaration stand on), each a header
/// name that is an HTTP token on a property of a primitive type. Others are ignored: the server
/// does not expect their headers either.
fn declared(schema: &Value, path: &mut Vec<String>, out: &mut Vec<Param>) {
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    for (name, property) in properties {
        path.push(name.clone());
        let primitive = matches!(
            property.get("type").and_then(Value::as_str),
            Some("string" | "integer" | "boolean" | "number")
        );
        if let Some(header) = property.get(X_MCP_HEADER).and_then(Value::as_str) {
            let header = HeaderName::from_bytes(format!("{PARAM_PREFIX}{header}").as_bytes());
            if let (Ok(header), true) = (header, primitive) {
                if !out.iter().any(|p| p.header == header) {
                    out.push(Param {
                        header,
                        path: path.clone(),
                    });
                }
            }
        }
        declared(property, path, out);
        path.pop();
    }
}

/// The target a request of the modern era names in its body, mirrored by `Mcp-Name`: the
/// tool's or prompt's name, or the resource's URI.
pub(crate) fn target(method: &str, params: &frame::Object) -> Option<String> {
    match method {
        "tools/call" | "prompts/get" => frame::string(params, "name"),
        "resources/read" => frame::string(params, "uri"),
        // The tasks extension's requests name their task (`Mcp-Name: <taskId>`).
        "tasks/get" | "tasks/update" | "tasks/cancel" => frame::string(params, "taskId"),
        _ => None,
    }
}

/// A header value as the sender meant it: `=?base64?…?=` decoded (`None` when its payload is not
/// base64 of UTF-8), anything else as it is.
pub(crate) fn decoded(value: &str) -> Option<String> {
    match value
        .strip_prefix("=?base64?")
        .and_then(|v| v.strip_suffix("?="))
    {
        Some(b64) => base64::engine::general_purpose::STANDARD
            .decode(b64)
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok()),
        None => Some(value.to_owned()),
    }
}

/// A header value as the modern era encodes one: printable ASCII with no white space at its
/// ends as it is, anything else as `=?base64?…?=` of its UTF-8 bytes.
fn encoded(value: &str) -> HeaderValue {
    let plain = value.bytes().all(|b| (0x20..=0x7e).contains(&b))
        && value.trim() == value
        && !(value.starts_with("=?base64?") && value.ends_with("?="));
    let text = if plain {
        value.to_owned()
    } else {
        let b64 = base64::engine::general_purpose::STANDARD.encode(value);
        format!("=?base64?{b64}?=")
    };
    HeaderValue::from_str(&text).expect("printable ASCII is a header value")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(headers: &[(HeaderName, HeaderValue)]) -> Vec<String> {
        headers
            .iter()
            .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap()))
            .collect()
    }

    const ENV: &str = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}"#;

    fn request(id: u64, method: &str, params: &str) -> String {
        format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{{{params}}}}}"#)
    }

    #[test]
    fn modern_requests_carry_the_headers_that_mirror_them_and_legacy_ones_none() {
        let none = ParamHeaders::default();
        let call = request(
            1,
            "tools/call",
            &format!(r#""name":"send","arguments":{{}},{ENV}"#),
        );
        assert_eq!(
            shown(&none.headers_of(&call)),
            [
                "mcp-protocol-version: 2026-07-28",
                "mcp-method: tools/call",
                "mcp-name: send"
            ]
        );
        let read = request(2, "resources/read", &format!(r#""uri":"file:///a",{ENV}"#));
        assert_eq!(shown(&none.headers_of(&read))[2], "mcp-name: file:///a");
        let prompt = request(3, "prompts/get", &format!(r#""name":"p",{ENV}"#));
        assert_eq!(shown(&none.headers_of(&prompt))[2], "mcp-name: p");
        let task = request(8, "tasks/get", &format!(r#""taskId":"t-1",{ENV}"#));
        assert_eq!(shown(&none.headers_of(&task))[2], "mcp-name: t-1");
        let discover = request(4, "server/discover", ENV);
        assert_eq!(
            shown(&none.headers_of(&discover)),
            [
                "mcp-protocol-version: 2026-07-28",
                "mcp-method: server/discover"
            ]
        );
        // The legacy era, a response, and what is not JSON-RPC: nothing.
        for text in [
            request(5, "tools/call", r#""name":"send""#),
            request(
                6,
                "tools/call",
                r#""name":"send","_meta":{"io.modelcontextprotocol/protocolVersion":"2025-11-25"}"#,
            ),
            r#"{"jsonrpc":"2.0","id":7,"result":{}}"#.to_owned(),
            "not json".to_owned(),
        ] {
            assert!(none.headers_of(&text).is_empty(), "{text}");
        }
    }

    #[test]
    fn declared_parameters_are_mirrored_and_values_encoded() {
        let mut known = ParamHeaders::default();
        known.learn(&serde_json::json!({"tools": [
            {"name": "deploy", "inputSchema": {"type": "object", "properties": {
                "region": {"type": "string", "x-mcp-header": "Region"},
                "count": {"type": "integer", "x-mcp-header": "Count"},
                "dry": {"type": "boolean", "x-mcp-header": "Dry"},
                "target": {"type": "object", "properties": {
                    "zone": {"type": "string", "x-mcp-header": "Zone"}}},
                "tags": {"type": "array", "x-mcp-header": "Tags"},
                "bad": {"type": "string", "x-mcp-header": "not a token"},
                "plain": {"type": "string"}}}},
            {"name": "other", "inputSchema": {"type": "object"}}]}));
        let args = r#""region":"eu-west-1","count":3,"dry":false,"target":{"zone":"b"},"tags":["x"],"bad":"y","plain":"z""#;
        let call = request(
            1,
            "tools/call",
            &format!(r#""name":"deploy","arguments":{{{args}}},{ENV}"#),
        );
        let mut got = shown(&known.headers_of(&call));
        got.sort();
        assert_eq!(
            got,
            [
                "mcp-method: tools/call",
                "mcp-name: deploy",
                "mcp-param-count: 3",
                "mcp-param-dry: false",
                "mcp-param-region: eu-west-1",
                "mcp-param-zone: b",
                "mcp-protocol-version: 2026-07-28",
            ]
        );
        // Absent and null arguments have no header; values that cannot go as they are, base64.
        let call = request(
            2,
            "tools/call",
            &format!(r#""name":"deploy","arguments":{{"region":"Zürich","count":null}},{ENV}"#),
        );
        let params: Vec<String> = shown(&known.headers_of(&call))
            .into_iter()
            .filter(|h| h.starts_with("mcp-param-"))
            .collect();
        assert_eq!(params, ["mcp-param-region: =?base64?WsO8cmljaA==?="]);
        for (value, sent) in [
            (" padded", "=?base64?IHBhZGRlZA==?="),
            ("=?base64?x?=", "=?base64?PT9iYXNlNjQ/eD89?="),
            ("line\nbreak", "=?base64?bGluZQpicmVhaw==?="),
            ("Zürich", "=?base64?WsO8cmljaA==?="),
            ("plain text", "plain text"),
        ] {
            assert_eq!(encoded(value).to_str().unwrap(), sent, "{value:?}");
            assert_eq!(decoded(sent).as_deref(), Some(value), "{sent:?}");
        }
        assert_eq!(decoded("=?base64?not base64!?="), None);
        // What a server checks: the declared headers, equal once decoded.
        let mut received: HeaderMap = known.headers_of(&call).into_iter().collect();
        assert_eq!(known.mismatch(&call, &received), None);
        received.insert("mcp-param-region", HeaderValue::from_static("Zurich"));
        assert!(known
            .mismatch(&call, &received)
            .unwrap()
            .contains("mcp-param-region"));
        received.remove("mcp-param-region");
        assert!(known
            .mismatch(&call, &received)
            .unwrap()
            .contains("missing"));
        let counted = request(
            3,
            "tools/call",
            &format!(r#""name":"deploy","arguments":{{"count":42}},{ENV}"#),
        );
        let mut received = HeaderMap::new();
        received.insert("mcp-param-count", HeaderValue::from_static("42.0"));
        assert_eq!(
            known.mismatch(&counted, &received),
            None,
            "numbers compare as numbers"
        );
        // A listing that no longer declares them forgets them.
        known.learn(&serde_json::json!({"tools": [{"name": "deploy", "inputSchema": {}}]}));
        assert!(!shown(&known.headers_of(&call))
            .iter()
            .any(|h| h.starts_with("mcp-param-")));
    }
}

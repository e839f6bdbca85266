//! The one stored-outcome format: every front door stores its outcomes as a [`Payload`], tagged
//! by what it holds, so that a record written by one door is replayed by another (or refused
//! with a clear error), and an operator's resolution is understood by all of them.
//!
//! Stored as a JSON object whose `content` member names the kind:
//!
//! | `content` | written by | other members |
//! |---|---|---|
//! | `command` | `idemgate exec` | `exit_code`, `stdout`, `stderr` (base64) |
//! | `http` | forwarded HTTP calls | `status`, `content_type`, `body` (base64) |
//! | `json` | the coordination API, operators, in-process callers | `result` (any JSON, kept as written) |
//! | `mcp_tool_result` | the MCP proxy | `result` (an MCP `CallToolResult`) |
//!
//! Records written before the tag existed are read by their shape: `exit_code`/`stdout`/`stderr`
//! is a command, `status`/`content_type`/`body` an HTTP answer, any other JSON a JSON result.
//!
//! An outcome an operator recorded to resolve an unknown record ([`Payload::into_resolution`])
//! also has `"resolved_by": "operator"`: its record's completion time is when it was resolved,
//! and a replay must not say that anything ran then ([`Payload::is_resolution`]). Readers that
//! do not know the member ignore it.

use std::collections::BTreeMap;

use base64::Engine as _;
use idemgate_core::{Effect, Outcome, OutcomeKind};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// A stored outcome's content.
#[derive(Clone, Debug)]
pub enum Payload {
    /// A command's exit code and output.
    Command {
        /// Its exit code.
        exit_code: i32,
        /// Its standard output.
        stdout: Vec<u8>,
        /// Its standard error.
        stderr: Vec<u8>,
    },
    /// An upstream's HTTP answer.
    Http {
        /// The status code.
        status: u16,
        /// The `Content-Type`, if it sent one.
        content_type: Option<String>,
        /// The `Retry-After` of a refusal passed on to the caller (answers that are stored are
        /// never refusals, so stored ones have none).
        retry_after: Option<String>,
        /// The other headers its protocol needs replayed with it (`name`, `value`), such as an
        /// x402 settlement's `PAYMENT-RESPONSE`; names in lower case.
        headers: Vec<(String, String)>,
        /// The body.
        body: Vec<u8>,
    },
    /// A JSON result, kept as written (integers of any size stay exact).
    Json(Box<RawValue>),
    /// An MCP `CallToolResult`, kept as the server wrote it.
    McpToolResult(Box<RawValue>),
}

/// A stored outcome that no front door can read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("failed to read the stored outcome: {0}")]
pub struct PayloadError(String);

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Who resolved an outcome, in its `resolved_by` member.
const OPERATOR: &str = "operator";

impl Payload {
    /// A JSON result from its text.
    ///
    /// # Errors
    /// When `text` is not one JSON value.
    pub fn json_text(text: &str) -> Result<Self, PayloadError> {
        RawValue::from_string(text.to_owned())
            .map(Payload::Json)
            .map_err(|e| PayloadError(format!("the result is not JSON: {e}")))
    }

    /// The name of its kind, as stored in `content`.
    pub fn content(&self) -> &'static str {
        match self {
            Payload::Command { .. } => "command",
            Payload::Http { .. } => "http",
            Payload::Json(_) => "json",
            Payload::McpToolResult(_) => "mcp_tool_result",
        }
    }

    /// The stored bytes.
    pub fn encode(&self) -> Vec<u8> {
        self.encode_by(None)
    }

    /// The stored bytes, with the resolution mark when `resolved_by` names who resolved it.
    fn encode_by(&self, resolved_by: Option<&'static str>) -> Vec<u8> {
        #[derive(Serialize)]
        struct Tagged<'a, T: Serialize> {
            content: &'static str,
            #[serde(skip_serializing_if = "Option::is_none")]
            resolved_by: Option<&'static str>,
            #[serde(flatten)]
            fields: &'a T,
        }
        #[derive(Serialize)]
        struct Command {
            exit_code: i32,
            stdout: String,
            stderr: String,
        }
        #[derive(Serialize)]
        struct Http<'a> {
            status: u16,
            content_type: Option<&'a str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            retry_after: Option<&'a str>,
            #[serde(skip_serializing_if = "<[_]>::is_empty")]
            headers: &'a [(String, String)],
            body: String,
        }
        #[derive(Serialize)]
        struct Result<'a> {
            result: &'a RawValue,
        }
        let content = self.content();
        let encoded = match self {
            Payload::Command {
                exit_code,
                stdout,
                stderr,
            } => serde_json::to_vec(&Tagged {
                content,
                resolved_by,
                fields: &Command {
                    exit_code: *exit_code,
                    stdout: B64.encode(stdout),
                    stderr: B64.encode(stderr),
                },
            }),
            Payload::Http {
                status,
                content_type,
                retry_after,
                headers,
                body,
            } => serde_json::to_vec(&Tagged {
                content,
                resolved_by,
                fields: &Http {
                    status: *status,
                    content_type: content_type.as_deref(),
                    retry_after: retry_after.as_deref(),
                    headers,
                    body: B64.encode(body),
                },
            }),
            Payload::Json(result) | Payload::McpToolResult(result) => serde_json::to_vec(&Tagged {
                content,
                resolved_by,
                fields: &Result { result },
            }),
        };
        encoded.expect("numbers, strings and JSON text always encode")
    }

    /// Reads stored bytes.
    ///
    /// # Errors
    /// [`PayloadError`] when the bytes are not JSON, or name a kind with members missing or of the
    /// wrong type.
    pub fn decode(body: &[u8]) -> Result<Self, PayloadError> {
        // A JSON result as `encode` writes it, the common case of every replay: its value is
        // the text between the tag and the closing brace, checked as one JSON value without
        // reading the object into a map (which costs more than the rest of a replay in memory).
        if let Some(value) = body
            .strip_prefix(JSON_RESULT_PREFIX)
            .and_then(|rest| rest.strip_suffix(b"}"))
        {
            if let Ok(raw) = serde_json::from_slice::<&RawValue>(value) {
                return Ok(Payload::Json(raw.to_owned()));
            }
        }
        let bad = |e: serde_json::Error| PayloadError(e.to_string());
        let Ok(fields) = serde_json::from_slice::<BTreeMap<String, Box<RawValue>>>(body) else {
            // Not an object: a JSON result from before the tag, or not JSON at all.
            let raw: Box<RawValue> = serde_json::from_slice(body)
                .map_err(|_| PayloadError("it is not JSON".to_owned()))?;
            return Ok(Payload::Json(raw));
        };
        let field = |name: &str| fields.get(name).map(|v| v.get());
        let tag = field("content").and_then(|t| serde_json::from_str::<String>(t).ok());
        let shape = |names: &[&str]| {
            let mut want: Vec<&str> = names.to_vec();
            want.sort_unstable();
            fields.keys().map(String::as_str).eq(want)
        };
        match tag.as_deref() {
            Some("command") => Self::command(&fields).map_err(bad),
            Some("http") => Self::http(&fields).map_err(bad),
            Some("json") => Ok(Payload::Json(result(&fields)?)),
            Some("mcp_tool_result") => Ok(Payload::McpToolResult(result(&fields)?)),
            // Untagged outcomes stored before the format had a tag.
            None if shape(&["exit_code", "stdout", "stderr"]) => {
                Self::command(&fields).map_err(bad)
            }
            None if shape(&["status", "content_type", "body"]) => Self::http(&fields).map_err(bad),
            _ => Ok(Payload::Json(serde_json::from_slice(body).map_err(bad)?)),
        }
    }

    fn command(f: &BTreeMap<String, Box<RawValue>>) -> Result<Self, serde_json::Error> {
        Ok(Payload::Command {
            exit_code: member(f, "exit_code")?,
            stdout: bytes(f, "stdout")?,
            stderr: bytes(f, "stderr")?,
        })
    }

    fn http(f: &BTreeMap<String, Box<RawValue>>) -> Result<Self, serde_json::Error> {
        Ok(Payload::Http {
            status: member(f, "status")?,
            content_type: member(f, "content_type")?,
            retry_after: member(f, "retry_after")?,
            // Absent from answers stored before it, and from those with none to keep.
            headers: member::<Option<_>>(f, "headers")?.unwrap_or_default(),
            body: bytes(f, "body")?,
        })
    }

    /// Reads a stored outcome.
    ///
    /// # Errors
    /// As [`Payload::decode`].
    pub fn of(outcome: &Outcome) -> Result<Self, PayloadError> {
        Self::decode(&outcome.body)
    }

    /// An outcome of `kind` holding this payload.
    pub fn into_outcome(self, kind: OutcomeKind) -> Outcome {
        Outcome {
            kind,
            body: self.encode(),
        }
    }

    /// An outcome of `kind` holding this payload, as an operator records it to resolve an
    /// unknown record: marked, so that every replay can say it was resolved at its time rather
    /// than run then ([`Payload::is_resolution`]).
    pub fn into_resolution(self, kind: OutcomeKind) -> Outcome {
        Outcome {
            kind,
            body: self.encode_by(Some(OPERATOR)),
        }
    }

    /// Whether `outcome` is an operator's resolution ([`Payload::into_resolution`]) rather than
    /// the outcome of a call that ran. Only a tagged payload carries the mark: a JSON result
    /// stored before the tag that happens to have the member is a result like any other.
    pub fn is_resolution(outcome: &Outcome) -> bool {
        #[derive(Deserialize)]
        struct Mark {
            content: Option<String>,
            resolved_by: Option<String>,
        }
        serde_json::from_slice::<Mark>(&outcome.body)
            .is_ok_and(|m| m.content.is_some() && m.resolved_by.as_deref() == Some(OPERATOR))
    }

    /// The payload as one JSON value, for front doors that answer in JSON (the coordination
    /// API's `result`, record views, MCP structured content). JSON results are their own text;
    /// bytes are text when they are UTF-8, else base64 under a `_base64` name.
    pub fn to_json(&self) -> Box<RawValue> {
        let mut object = serde_json::Map::new();
        match self {
            Payload::Json(raw) | Payload::McpToolResult(raw) => return raw.clone(),
            Payload::Command {
                exit_code,
                stdout,
                stderr,
            } => {
                object.insert("exit_code".into(), (*exit_code).into());
                bytes_field(&mut object, "stdout", stdout);
                bytes_field(&mut object, "stderr", stderr);
            }
            Payload::Http {
                status,
                content_type,
                body,
                ..
            } => {
                object.insert("status".into(), (*status).into());
                object.insert("content_type".into(), content_type.clone().into());
                // A JSON body goes in as JSON, so big integers in it keep their text.
                if let Ok(raw) = serde_json::from_slice::<Box<RawValue>>(body) {
                    return raw_object(object, Some(("body", raw)));
                }
                bytes_field(&mut object, "body", body);
            }
        }
        raw_object(object, None)
    }

    /// The payload as a command's exit code and output, for `idemgate exec`: a command is
    /// itself; an HTTP answer prints its body and exits 0 for a 2xx; a JSON result prints its
    /// text and a newline. Other content exits 0 for a success and 1 for a failure.
    pub fn to_command(&self, kind: OutcomeKind) -> (i32, Vec<u8>, Vec<u8>) {
        let code = match kind {
            OutcomeKind::Success => 0,
            OutcomeKind::Failed => 1,
        };
        match self {
            Payload::Command {
                exit_code,
                stdout,
                stderr,
            } => (*exit_code, stdout.clone(), stderr.clone()),
            Payload::Http { status, body, .. } => (
                if (200..300).contains(status) { 0 } else { 1 },
                body.clone(),
                Vec::new(),
            ),
            Payload::Json(raw) | Payload::McpToolResult(raw) => {
                let mut out = raw.get().as_bytes().to_vec();
                out.push(b'\n');
                (code, out, Vec::new())
            }
        }
    }

    /// The payload as an MCP `CallToolResult`, for the MCP proxy: a stored tool result is
    /// itself; other content becomes one text block (a JSON result's text, a command's standard
    /// output, an HTTP answer's body), a JSON object also as `structuredContent`, and `isError`
    /// says whether the outcome was a failure.
    pub fn to_mcp_tool_result(&self, kind: OutcomeKind) -> Box<RawValue> {
        #[derive(Serialize)]
        struct Text<'a> {
            #[serde(rename = "type")]
            kind: &'static str,
            text: &'a str,
        }
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct ToolResult<'a> {
            content: [Text<'a>; 1],
            #[serde(skip_serializing_if = "Option::is_none")]
            structured_content: Option<&'a RawValue>,
            is_error: bool,
        }
        let (text, structured) = match self {
            Payload::McpToolResult(raw) => return raw.clone(),
            Payload::Json(raw) => {
                let structured = raw.get().trim_start().starts_with('{').then_some(&**raw);
                (std::borrow::Cow::Borrowed(raw.get()), structured)
            }
            Payload::Command { stdout: b, .. } | Payload::Http { body: b, .. } => {
                (String::from_utf8_lossy(b), None)
            }
        };
        let result = ToolResult {
            content: [Text {
                kind: "text",
                text: &text,
            }],
            structured_content: structured,
            is_error: kind == OutcomeKind::Failed,
        };
        let text = serde_json::to_string(&result).expect("text and JSON always encode");
        RawValue::from_string(text).expect("serialized JSON is JSON")
    }

    /// The payload as an HTTP answer, for forwarded calls: an HTTP answer is itself; other
    /// content is its JSON view ([`Payload::to_json`]) with status 200 for a success and 422 for a
    /// failure.
    pub fn into_http(self, kind: OutcomeKind) -> HttpAnswer {
        match self {
            Payload::Http {
                status,
                content_type,
                retry_after,
                headers,
                body,
            } => HttpAnswer {
                status,
                content_type,
                retry_after,
                headers,
                body,
            },
            other => HttpAnswer {
                status: match kind {
                    OutcomeKind::Success => 200,
                    OutcomeKind::Failed => 422,
                },
                content_type: Some("application/json".to_owned()),
                retry_after: None,
                headers: Vec::new(),
                body: other.to_json().get().as_bytes().to_vec(),
            },
        }
    }
}

/// A payload as an HTTP answer (see [`Payload::into_http`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpAnswer {
    /// The status code.
    pub status: u16,
    /// The `Content-Type`.
    pub content_type: Option<String>,
    /// The `Retry-After`.
    pub retry_after: Option<String>,
    /// The other headers kept with it ([`Payload::Http`]).
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

/// How `Payload::encode` begins the bytes of a JSON result (no resolution mark): the tag, then
/// the value as the last member.
const JSON_RESULT_PREFIX: &[u8] = br#"{"content":"json","result":"#;

fn result(f: &BTreeMap<String, Box<RawValue>>) -> Result<Box<RawValue>, PayloadError> {
    f.get("result")
        .cloned()
        .ok_or_else(|| PayloadError("a JSON outcome without `result`".to_owned()))
}

fn member<T: serde::de::DeserializeOwned>(
    f: &BTreeMap<String, Box<RawValue>>,
    name: &str,
) -> Result<T, serde_json::Error> {
    let text = f.get(name).map_or("null", |v| v.get());
    serde_json::from_str(text)
        .map_err(|e| serde::de::Error::custom(format!("member `{name}`: {e}")))
}

fn bytes(f: &BTreeMap<String, Box<RawValue>>, name: &str) -> Result<Vec<u8>, serde_json::Error> {
    let text: String = member(f, name)?;
    B64.decode(text)
        .map_err(|e| serde::de::Error::custom(format!("member `{name}` is not base64: {e}")))
}

fn bytes_field(object: &mut serde_json::Map<String, serde_json::Value>, name: &str, b: &[u8]) {
    match std::str::from_utf8(b) {
        Ok(text) => object.insert(name.into(), text.into()),
        Err(_) => object.insert(format!("{name}_base64"), B64.encode(b).into()),
    };
}

/// `object` as raw JSON, with one more member given as raw JSON text.
fn raw_object(
    object: serde_json::Map<String, serde_json::Value>,
    raw_member: Option<(&str, Box<RawValue>)>,
) -> Box<RawValue> {
    #[derive(Serialize)]
    struct WithRaw<'a> {
        #[serde(flatten)]
        object: &'a serde_json::Map<String, serde_json::Value>,
        #[serde(flatten, skip_serializing_if = "Option::is_none")]
        extra: Option<BTreeMap<&'a str, &'a RawValue>>,
    }
    let extra = raw_member
        .as_ref()
        .map(|(name, raw)| BTreeMap::from([(*name, raw.as_ref())]));
    let text = serde_json::to_string(&WithRaw {
        object: &object,
        extra,
    })
    .expect("a map of JSON values always encodes");
    RawValue::from_string(text).expect("serialized JSON is JSON")
}

/// What a function run in-process reported, in the words of the in-process doors (the Python and
/// Node packages): `success`/`failed` with the JSON text of its value (stored as
/// [`Payload::Json`]), `not_applied`/`ambiguous` with a message. The error says what is wrong
/// with the words (a body that is not JSON, an unknown kind).
pub fn reported_effect(kind: &str, body: &str) -> Result<Effect, String> {
    let json = |body: &str| {
        Payload::json_text(body)
            .map(|p| p.encode())
            .map_err(|e| e.to_string())
    };
    Ok(match kind {
        "success" => Effect::Success(json(body)?),
        "failed" => Effect::Failed(json(body)?),
        "not_applied" => Effect::not_applied(body),
        "ambiguous" => Effect::Ambiguous(body.to_owned()),
        other => {
            return Err(format!(
                "unknown effect {other:?}: expected success, failed, not_applied or ambiguous"
            ))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_result_reads_back_as_written_by_the_short_way_or_the_long() {
        let json = |p: Payload| p.to_json().get().to_owned();
        for text in [
            r#"{"n":1}"#,
            "[1,2]",
            "\"s\"",
            "null",
            r#"{"result":{"content":"x"}}"#,
        ] {
            let bytes = Payload::json_text(text).unwrap().encode();
            assert!(
                bytes.starts_with(JSON_RESULT_PREFIX),
                "the short way applies"
            );
            assert_eq!(json(Payload::decode(&bytes).unwrap()), text);
        }
        // Bytes that only look like it take the long way and read as they always did.
        let extra = br#"{"content":"json","result":1,"other":2}"#;
        assert_eq!(json(Payload::decode(extra).unwrap()), "1");
        let twice = br#"{"content":"json","result":1,"result":2}"#;
        assert_eq!(
            json(Payload::decode(twice).unwrap()),
            "2",
            "the last member, as a map reads it"
        );
        let marked = Payload::json_text("7")
            .unwrap()
            .into_resolution(OutcomeKind::Success);
        assert!(Payload::is_resolution(&marked));
        assert_eq!(json(Payload::of(&marked).unwrap()), "7");
    }

    #[test]
    fn a_reported_success_or_failure_carries_json() {
        let body = Payload::json_text(r#"{"n":1}"#).unwrap().encode();
        assert_eq!(
            reported_effect("success", r#"{"n":1}"#),
            Ok(Effect::Success(body.clone()))
        );
        assert_eq!(
            reported_effect("failed", r#"{"n":1}"#),
            Ok(Effect::Failed(body))
        );
        for kind in ["success", "failed"] {
            let e = reported_effect(kind, "not json").unwrap_err();
            assert!(e.contains("not JSON"), "{kind}: {e}");
        }
    }

    #[test]
    fn a_reported_not_applied_or_ambiguous_carries_a_message() {
        assert_eq!(
            reported_effect("not_applied", "no such user"),
            Ok(Effect::not_applied("no such user"))
        );
        assert_eq!(
            reported_effect("ambiguous", "timed out"),
            Ok(Effect::Ambiguous("timed out".into()))
        );
    }

    #[test]
    fn an_unknown_reported_effect_is_refused() {
        assert_eq!(
            reported_effect("succeeded", "1").unwrap_err(),
            "unknown effect \"succeeded\": expected success, failed, not_applied or ambiguous"
        );
    }

    fn round_trip(p: &Payload) -> Payload {
        Payload::decode(&p.encode()).unwrap()
    }

    #[test]
    fn every_kind_round_trips() {
        let cmd = Payload::Command {
            exit_code: -1,
            stdout: vec![0, 255, 10],
            stderr: b"warn\n".to_vec(),
        };
        assert_eq!(round_trip(&cmd).encode(), cmd.encode());
        let http = Payload::Http {
            status: 201,
            content_type: Some("application/json".into()),
            retry_after: None,
            headers: Vec::new(),
            body: br#"{"id":12345678901234567890}"#.to_vec(),
        };
        assert_eq!(round_trip(&http).encode(), http.encode());
        assert!(
            !String::from_utf8(http.encode())
                .unwrap()
                .contains("headers"),
            "an answer without headers to keep is stored as before"
        );
        let receipt = Payload::Http {
            status: 200,
            content_type: None,
            retry_after: None,
            headers: vec![("payment-response".into(), "eyJzdWNjZXNzIjp0cnVlfQ==".into())],
            body: b"{}".to_vec(),
        };
        let back = round_trip(&receipt);
        assert_eq!(back.encode(), receipt.encode());
        assert_eq!(
            back.into_http(OutcomeKind::Success).headers,
            [(
                "payment-response".to_owned(),
                "eyJzdWNjZXNzIjp0cnVlfQ==".to_owned()
            )]
        );
        let json = Payload::json_text(r#"{"n":12345678901234567890123}"#).unwrap();
        let back = round_trip(&json);
        assert!(matches!(&back, Payload::Json(r) if r.get() == r#"{"n":12345678901234567890123}"#));
        let mcp = Payload::McpToolResult(
            RawValue::from_string(r#"{"content":[],"isError":true}"#.into()).unwrap(),
        );
        assert!(matches!(round_trip(&mcp), Payload::McpToolResult(_)));
    }

    #[test]
    fn an_operators_resolution_is_marked_and_reads_as_the_same_payload() {
        let kinds = [
            Payload::Command {
                exit_code: 0,
                stdout: b"paid by hand\n".to_vec(),
                stderr: Vec::new(),
            },
            Payload::json_text(r#"{"n":12345678901234567890123}"#).unwrap(),
            Payload::McpToolResult(RawValue::from_string(r#"{"content":[]}"#.into()).unwrap()),
        ];
        for p in kinds {
            let resolved = p.clone().into_resolution(OutcomeKind::Success);
            assert!(Payload::is_resolution(&resolved), "{p:?}");
            assert_eq!(Payload::of(&resolved).unwrap().encode(), p.encode());
            let ran = p.into_outcome(OutcomeKind::Success);
            assert!(!Payload::is_resolution(&ran));
        }
        // A JSON result from before the tag is a result, whatever members it has.
        let legacy = Outcome::success(br#"{"resolved_by":"operator"}"#.to_vec());
        assert!(!Payload::is_resolution(&legacy));
        assert!(!Payload::is_resolution(&Outcome::success(b"[1]".to_vec())));
    }

    #[test]
    fn every_kind_is_an_mcp_tool_result() {
        let json = Payload::json_text(r#"{"n":12345678901234567890}"#).unwrap();
        assert_eq!(
            json.to_mcp_tool_result(OutcomeKind::Success).get(),
            r#"{"content":[{"type":"text","text":"{\"n\":12345678901234567890}"}],"structuredContent":{"n":12345678901234567890},"isError":false}"#
        );
        let array = Payload::json_text("[1]").unwrap();
        assert_eq!(
            array.to_mcp_tool_result(OutcomeKind::Failed).get(),
            r#"{"content":[{"type":"text","text":"[1]"}],"isError":true}"#
        );
        let cmd = Payload::Command {
            exit_code: 0,
            stdout: b"done\n".to_vec(),
            stderr: b"noise".to_vec(),
        };
        assert_eq!(
            cmd.to_mcp_tool_result(OutcomeKind::Success).get(),
            r#"{"content":[{"type":"text","text":"done\n"}],"isError":false}"#
        );
        let mcp = Payload::McpToolResult(
            RawValue::from_string(r#"{"content":[],"isError":true,"x":1}"#.into()).unwrap(),
        );
        assert_eq!(
            mcp.to_mcp_tool_result(OutcomeKind::Failed).get(),
            r#"{"content":[],"isError":true,"x":1}"#
        );
    }

    #[test]
    fn outcomes_stored_before_the_tag_are_read_by_shape() {
        let legacy_cmd = br#"{"exit_code":3,"stdout":"aGk=","stderr":""}"#;
        assert!(matches!(
            Payload::decode(legacy_cmd).unwrap(),
            Payload::Command { exit_code: 3, ref stdout, .. } if stdout == b"hi"
        ));
        let legacy_http = br#"{"status":200,"content_type":null,"body":"e30="}"#;
        assert!(matches!(
            Payload::decode(legacy_http).unwrap(),
            Payload::Http { status: 200, ref body, .. } if body == b"{}"
        ));
        for legacy_json in [&b"42"[..], b"[1,2]", br#"{"ticket":1234}"#, b"null"] {
            let p = Payload::decode(legacy_json).unwrap();
            assert!(matches!(&p, Payload::Json(r) if r.get().as_bytes() == legacy_json));
        }
        assert!(Payload::decode(b"not json").is_err());
        assert!(Payload::decode(br#"{"content":"command","exit_code":"x"}"#).is_err());
    }

    #[test]
    fn every_door_can_show_every_kind() {
        let cmd = Payload::Command {
            exit_code: 0,
            stdout: b"done\n".to_vec(),
            stderr: vec![0xff],
        };
        assert_eq!(
            cmd.to_json().get(),
            r#"{"exit_code":0,"stderr_base64":"/w==","stdout":"done\n"}"#
        );
        let answer = cmd.clone().into_http(OutcomeKind::Success);
        assert_eq!(
            (answer.status, answer.content_type.as_deref()),
            (200, Some("application/json"))
        );
        assert!(answer.body.starts_with(b"{\"exit_code\":0"));
        let http = Payload::Http {
            status: 404,
            content_type: None,
            retry_after: None,
            headers: Vec::new(),
            body: br#"{"n":12345678901234567890}"#.to_vec(),
        };
        assert_eq!(
            http.to_json().get(),
            r#"{"content_type":null,"status":404,"body":{"n":12345678901234567890}}"#
        );
        assert_eq!(http.to_command(OutcomeKind::Failed).0, 1);
        let json = Payload::json_text("[1]").unwrap();
        assert_eq!(
            json.to_command(OutcomeKind::Failed),
            (1, b"[1]\n".to_vec(), Vec::new())
        );
        assert_eq!(json.into_http(OutcomeKind::Failed).status, 422);
    }
}

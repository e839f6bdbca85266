//! Spans out of OTLP files, in the three shapes traces are kept in:
//!
//! - **JSON lines**: one `TracesData` object a line, the OTLP file exporter's format (the
//!   collector's `file` exporter, `format: json`); a file holding a single object (pretty printed,
//!   as an OTLP/HTTP JSON body) is read as well;
//! - **protobuf, framed**: `TracesData` messages each preceded by its length as four big-endian
//!   bytes, the collector's `file` exporter with `format: proto`;
//! - **protobuf, one message**: an OTLP/HTTP request body (`ExportTraceServiceRequest`, which has
//!   `TracesData`'s wire format).
//!
//! Trace and span ids are read as the OTLP JSON encoding writes them (hex) and as protobuf's
//! generic JSON mapping writes bytes (base64), so a file converted by a general tool reads too.

use std::collections::BTreeMap;

use base64::Engine as _;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::{status::StatusCode, TracesData};
use prost::Message as _;
use serde_json::{Map, Value};

/// One span, with what the scan needs of it.
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    /// The trace id, lowercase hex.
    pub trace_id: String,
    /// The span id, lowercase hex.
    pub span_id: String,
    /// The parent's span id, lowercase hex; none for a root.
    pub parent_span_id: Option<String>,
    /// The span's name.
    pub name: String,
    /// Start, nanoseconds since the Unix epoch.
    pub start_ns: u64,
    /// End, nanoseconds since the Unix epoch (the start when the span has none).
    pub end_ns: u64,
    /// Why the span failed, when its status is an error: the status message and the types of
    /// the exceptions it recorded ("error" when it says nothing more).
    pub error: Option<String>,
    /// The span's attributes as JSON values (arrays and key-value lists as arrays and objects).
    pub attributes: BTreeMap<String, Value>,
    /// Where it was read: `FILE:LINE` or `FILE#MESSAGE`.
    pub origin: String,
}

impl Span {
    /// The attribute `name` as text: a string as is, any other value as its JSON.
    pub fn text(&self, name: &str) -> Option<String> {
        match self.attributes.get(name)? {
            Value::String(s) => Some(s.clone()),
            Value::Null => None,
            other => Some(other.to_string()),
        }
    }
}

/// What a file gave: its spans, and the parts of it that could not be read (each with where and
/// why), which the report lists rather than dropping silently.
#[derive(Debug, Default)]
pub struct Read {
    /// The spans read.
    pub spans: Vec<Span>,
    /// `(where, why)` of every part skipped.
    pub skipped: Vec<(String, String)>,
}

/// A file that holds no readable trace at all.
#[derive(Debug, thiserror::Error)]
#[error("{origin}: {why}")]
pub struct Unreadable {
    /// The file.
    pub origin: String,
    /// Why.
    pub why: String,
}

/// Reads the spans of one file's bytes; `name` names it in messages.
///
/// # Errors
/// When nothing in the file is a trace: not JSON, not protobuf, or a framing that does not add
/// up. A file of JSON lines with some unreadable lines is read, and those lines are listed in
/// [`Read::skipped`].
pub fn read(bytes: &[u8], name: &str) -> Result<Read, Unreadable> {
    let unreadable = |why: String| Unreadable {
        origin: name.to_owned(),
        why,
    };
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    match first {
        None => Ok(Read::default()),
        Some(b'{') => read_json(bytes, name).map_err(unreadable),
        // A frame's length: a TracesData message is under 16 MiB, so its first byte is zero; a
        // bare message starts with field 1's tag (0x0a) instead.
        Some(0) => read_framed(bytes, name).map_err(unreadable),
        Some(_) => {
            let data = TracesData::decode(bytes).map_err(|e| {
                unreadable(format!(
                    "neither OTLP JSON (it does not start with '{{') nor OTLP protobuf ({e})"
                ))
            })?;
            let mut read = Read::default();
            from_proto(&data, &format!("{name}#1"), &mut read.spans);
            Ok(read)
        }
    }
}

fn read_framed(bytes: &[u8], name: &str) -> Result<Read, String> {
    let mut read = Read::default();
    let mut rest = bytes;
    let mut n = 0;
    while !rest.is_empty() {
        n += 1;
        let Some((len, body)) = rest.split_first_chunk::<4>() else {
            return Err(format!(
                "message {n}: {} bytes left where a 4-byte length was expected",
                rest.len()
            ));
        };
        let len = u32::from_be_bytes(*len) as usize;
        if body.len() < len {
            if n == 1 {
                return Err(format!(
                    "not OTLP protobuf frames: {len} bytes announced, {} there",
                    body.len()
                ));
            }
            // A file cut short (a collector killed mid-write): what came before stands.
            read.skipped.push((
                format!("{name}#{n}"),
                format!(
                    "the message is cut short: {len} bytes announced, {} there",
                    body.len()
                ),
            ));
            break;
        }
        let (message, after) = body.split_at(len);
        match TracesData::decode(message) {
            Ok(data) => from_proto(&data, &format!("{name}#{n}"), &mut read.spans),
            Err(e) if n == 1 => return Err(format!("not OTLP protobuf frames: {e}")),
            Err(e) => read.skipped.push((format!("{name}#{n}"), e.to_string())),
        }
        rest = after;
    }
    Ok(read)
}

fn read_json(bytes: &[u8], name: &str) -> Result<Read, String> {
    let mut read = Read::default();
    // One document (pretty printed, or a file of one line).
    if let Ok(doc) = serde_json::from_slice::<Value>(bytes) {
        from_json(&doc, &format!("{name}:1"), &mut read.spans)
            .map_err(|why| format!("line 1: {why}"))?;
        return Ok(read);
    }
    let mut good = 0usize;
    for (i, line) in bytes.split(|&b| b == b'\n').enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let at = format!("{name}:{}", i + 1);
        let parsed = serde_json::from_slice::<Value>(line).map_err(|e| e.to_string());
        match parsed.and_then(|doc| from_json(&doc, &at, &mut read.spans)) {
            Ok(()) => good += 1,
            Err(why) => read.skipped.push((at, why)),
        }
    }
    if good == 0 {
        let (at, why) = read.skipped.first().cloned().unwrap_or_default();
        return Err(format!("no line is an OTLP JSON trace ({at}: {why})"));
    }
    Ok(read)
}

/// The spans of one `TracesData` JSON object.
fn from_json(doc: &Value, origin: &str, out: &mut Vec<Span>) -> Result<(), String> {
    let resources = doc
        .get("resourceSpans")
        .or_else(|| doc.get("resource_spans"))
        .and_then(Value::as_array)
        .ok_or("no \"resourceSpans\": not an OTLP JSON trace")?;
    for resource in resources {
        let scopes = resource
            .get("scopeSpans")
            .or_else(|| resource.get("scope_spans"))
            // The name before OTLP 0.15.
            .or_else(|| resource.get("instrumentationLibrarySpans"))
            .and_then(Value::as_array);
        for scope in scopes.into_iter().flatten() {
            let spans = scope.get("spans").and_then(Value::as_array);
            for span in spans.into_iter().flatten() {
                out.push(json_span(span, origin)?);
            }
        }
    }
    Ok(())
}

fn json_span(span: &Value, origin: &str) -> Result<Span, String> {
    let field = |camel: &str, snake: &str| span.get(camel).or_else(|| span.get(snake));
    let id = |camel: &str, snake: &str, len: usize| -> Result<Option<String>, String> {
        match field(camel, snake).and_then(Value::as_str) {
            None | Some("") => Ok(None),
            Some(text) => json_id(text, len)
                .map(Some)
                .ok_or_else(|| format!("{camel} {text:?} is neither {len} hex bytes nor base64")),
        }
    };
    let time = |camel: &str, snake: &str| -> u64 {
        match field(camel, snake) {
            Some(Value::String(s)) => s.parse().unwrap_or(0),
            Some(Value::Number(n)) => n.as_u64().unwrap_or(0),
            _ => 0,
        }
    };
    let trace_id = id("traceId", "trace_id", 16)?.ok_or("a span without a traceId")?;
    let span_id = id("spanId", "span_id", 8)?.ok_or("a span without a spanId")?;
    let start_ns = time("startTimeUnixNano", "start_time_unix_nano");
    let end_ns = time("endTimeUnixNano", "end_time_unix_nano").max(start_ns);
    let status = span.get("status");
    let code = status.and_then(|s| s.get("code"));
    let failed = matches!(code, Some(Value::Number(n)) if n.as_u64() == Some(StatusCode::Error as u64))
        || matches!(code, Some(Value::String(s)) if s == "STATUS_CODE_ERROR");
    let message = status
        .and_then(|s| s.get("message"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    let exceptions = span
        .get("events")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|e| e.get("name").and_then(Value::as_str) == Some("exception"))
        .filter_map(|e| json_attributes(e.get("attributes")).remove("exception.type"))
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    Ok(Span {
        trace_id,
        span_id,
        parent_span_id: id("parentSpanId", "parent_span_id", 8)?,
        name: field("name", "name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        start_ns,
        end_ns,
        error: failure(failed, message, exceptions),
        attributes: json_attributes(field("attributes", "attributes")),
        origin: origin.to_owned(),
    })
}

/// Why a span failed, in one line.
fn failure(failed: bool, message: &str, exceptions: Vec<String>) -> Option<String> {
    if !failed && exceptions.is_empty() {
        return None;
    }
    let mut parts: Vec<String> = exceptions;
    if !message.is_empty() && !parts.iter().any(|p| message.contains(p.as_str())) {
        parts.push(message.to_owned());
    }
    Some(if parts.is_empty() {
        "error".to_owned()
    } else {
        parts.join(": ")
    })
}

/// An id as the OTLP JSON encoding writes it (hex), or as protobuf's JSON mapping writes bytes
/// (base64); lowercase hex either way.
fn json_id(text: &str, len: usize) -> Option<String> {
    if text.len() == 2 * len && text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Some(text.to_ascii_lowercase());
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .ok()
        .filter(|b| b.len() == len)?;
    Some(hex(&bytes))
}

fn json_attributes(list: Option<&Value>) -> BTreeMap<String, Value> {
    list.and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|kv| {
            let key = kv.get("key")?.as_str()?.to_owned();
            Some((key, json_any(kv.get("value")?)))
        })
        .collect()
}

/// An OTLP JSON `AnyValue` as a plain JSON value.
fn json_any(value: &Value) -> Value {
    let Some(obj) = value.as_object() else {
        return Value::Null;
    };
    if let Some(v) = obj.get("stringValue") {
        return v.clone();
    }
    if let Some(v) = obj.get("boolValue") {
        return v.clone();
    }
    if let Some(v) = obj.get("intValue") {
        // int64 is a string in OTLP JSON, a number in some writers.
        return match v {
            Value::String(s) => s.parse::<i64>().map(Value::from).unwrap_or(v.clone()),
            _ => v.clone(),
        };
    }
    if let Some(v) = obj.get("doubleValue") {
        return v.clone();
    }
    if let Some(v) = obj.get("bytesValue") {
        return v.clone();
    }
    if let Some(v) = obj.get("arrayValue") {
        let values = v.get("values").and_then(Value::as_array);
        return Value::Array(values.into_iter().flatten().map(json_any).collect());
    }
    if let Some(v) = obj.get("kvlistValue") {
        return Value::Object(
            json_attributes(v.get("values"))
                .into_iter()
                .collect::<Map<_, _>>(),
        );
    }
    Value::Null
}

fn from_proto(data: &TracesData, origin: &str, out: &mut Vec<Span>) {
    for scope in data.resource_spans.iter().flat_map(|r| &r.scope_spans) {
        for span in &scope.spans {
            let failed = span
                .status
                .as_ref()
                .is_some_and(|s| s.code == StatusCode::Error as i32);
            let message = span.status.as_ref().map_or("", |s| s.message.as_str());
            let exceptions = span
                .events
                .iter()
                .filter(|e| e.name == "exception")
                .filter_map(|e| proto_attributes(&e.attributes).remove("exception.type"))
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect();
            out.push(Span {
                trace_id: hex(&span.trace_id),
                span_id: hex(&span.span_id),
                parent_span_id: (!span.parent_span_id.is_empty())
                    .then(|| hex(&span.parent_span_id)),
                name: span.name.clone(),
                start_ns: span.start_time_unix_nano,
                end_ns: span.end_time_unix_nano.max(span.start_time_unix_nano),
                error: failure(failed, message, exceptions),
                attributes: proto_attributes(&span.attributes),
                origin: origin.to_owned(),
            });
        }
    }
}

fn proto_attributes(list: &[KeyValue]) -> BTreeMap<String, Value> {
    list.iter()
        .map(|kv| {
            (
                kv.key.clone(),
                kv.value.as_ref().map_or(Value::Null, proto_any),
            )
        })
        .collect()
}

fn proto_any(value: &AnyValue) -> Value {
    match &value.value {
        None => Value::Null,
        Some(any_value::Value::StringValue(s)) => Value::from(s.as_str()),
        Some(any_value::Value::BoolValue(b)) => Value::from(*b),
        Some(any_value::Value::IntValue(i)) => Value::from(*i),
        Some(any_value::Value::DoubleValue(d)) => Value::from(*d),
        Some(any_value::Value::BytesValue(b)) => {
            Value::from(base64::engine::general_purpose::STANDARD.encode(b))
        }
        Some(any_value::Value::ArrayValue(a)) => {
            Value::Array(a.values.iter().map(proto_any).collect())
        }
        Some(any_value::Value::KvlistValue(kv)) => {
            Value::Object(proto_attributes(&kv.values).into_iter().collect())
        }
        // Newer value kinds (a reference into a dictionary) carry nothing the scan reads.
        #[allow(unreachable_patterns)]
        Some(_) => Value::Null,
    }
}

fn hex(bytes: &[u8]) -> String {
    idemgate_core::key::hex(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Status};

    fn proto_span(call_id: &str) -> opentelemetry_proto::tonic::trace::v1::Span {
        opentelemetry_proto::tonic::trace::v1::Span {
            trace_id: vec![0xab; 16],
            span_id: vec![0x01; 8],
            name: "execute_tool send_mail".into(),
            start_time_unix_nano: 1_000,
            end_time_unix_nano: 2_000,
            attributes: vec![KeyValue {
                key: "gen_ai.tool.call.id".into(),
                value: Some(AnyValue {
                    value: Some(any_value::Value::StringValue(call_id.into())),
                }),
                ..Default::default()
            }],
            status: Some(Status {
                message: "boom".into(),
                code: StatusCode::Error as i32,
            }),
            ..Default::default()
        }
    }

    fn traces(call_id: &str) -> TracesData {
        TracesData {
            resource_spans: vec![ResourceSpans {
                scope_spans: vec![ScopeSpans {
                    spans: vec![proto_span(call_id)],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    #[test]
    fn protobuf_one_message_and_frames() {
        let one = traces("c1").encode_to_vec();
        let read = read(&one, "t.pb").unwrap();
        assert_eq!(read.spans.len(), 1);
        let span = &read.spans[0];
        assert_eq!(span.trace_id, "ab".repeat(16));
        assert_eq!(span.parent_span_id, None);
        assert_eq!(span.text("gen_ai.tool.call.id").as_deref(), Some("c1"));
        assert_eq!(span.error.as_deref(), Some("boom"));

        let mut framed = Vec::new();
        for id in ["c1", "c2"] {
            let m = traces(id).encode_to_vec();
            framed.extend_from_slice(&(m.len() as u32).to_be_bytes());
            framed.extend_from_slice(&m);
        }
        // Cut short: the last frame is reported, the first ones stand.
        framed.extend_from_slice(&100u32.to_be_bytes());
        framed.extend_from_slice(b"xx");
        let read = super::read(&framed, "t.pb").unwrap();
        let ids: Vec<_> = read
            .spans
            .iter()
            .map(|s| s.text("gen_ai.tool.call.id"))
            .collect();
        assert_eq!(ids, [Some("c1".into()), Some("c2".into())]);
        assert_eq!(read.skipped.len(), 1);
        assert!(
            read.skipped[0].1.contains("cut short"),
            "{:?}",
            read.skipped
        );
    }

    #[test]
    fn json_lines_hex_and_base64_ids_and_bad_lines() {
        let line = |trace: &str, span: &str| {
            serde_json::json!({"resourceSpans": [{"scopeSpans": [{"spans": [{
                "traceId": trace, "spanId": span, "parentSpanId": "",
                "name": "execute_tool x",
                "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": 1700000001000000000u64,
                "attributes": [
                    {"key": "gen_ai.tool.name", "value": {"stringValue": "x"}},
                    {"key": "n", "value": {"intValue": "42"}},
                    {"key": "l", "value": {"arrayValue": {"values": [{"boolValue": true}]}}}
                ],
                "status": {"code": 2, "message": "timed out"},
                "events": [{"name": "exception", "attributes": [
                    {"key": "exception.type", "value": {"stringValue": "TimeoutError"}}]}]
            }]}]}]})
            .to_string()
        };
        let text = format!(
            "{}\n{{\"resourceSpans\": [\n{}\n",
            line(&"0A".repeat(16), &"0b".repeat(8)),
            line("q83vEjRWeJCrze8SNFZ4kA==", "ASNFZ4mrze8="),
        );
        let read = read(text.as_bytes(), "t.jsonl").unwrap();
        assert_eq!(read.spans.len(), 2);
        assert_eq!(read.spans[0].trace_id, "0a".repeat(16));
        assert_eq!(read.spans[1].trace_id, "abcdef1234567890abcdef1234567890");
        assert_eq!(read.spans[1].span_id, "0123456789abcdef");
        assert_eq!(read.spans[0].attributes["n"], Value::from(42));
        assert_eq!(read.spans[0].text("l").as_deref(), Some("[true]"));
        assert_eq!(read.spans[0].end_ns - read.spans[0].start_ns, 1_000_000_000);
        assert_eq!(
            read.spans[0].error.as_deref(),
            Some("TimeoutError: timed out")
        );
        assert_eq!(read.skipped.len(), 1);
        assert_eq!(read.skipped[0].0, "t.jsonl:2");
        assert_eq!(read.spans[0].origin, "t.jsonl:1");
        assert_eq!(read.spans[1].origin, "t.jsonl:3");
    }

    #[test]
    fn files_that_hold_no_trace_are_refused() {
        assert!(read(b"{\"hello\": 1}\n{\"x\": 2}\n", "a").is_err());
        assert!(read(b"hello world", "b").is_err());
        assert!(read(&[0, 0, 0, 5, 1, 2], "c").is_err());
        assert!(read(b"  \n", "d").unwrap().spans.is_empty());
    }
}

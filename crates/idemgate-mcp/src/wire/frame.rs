//! JSON-RPC frames, read only as far as the proxy needs: a frame is relayed as the text it came
//! in, and rebuilt only when the proxy changes a tool call's arguments.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::value::RawValue;

/// A JSON object whose members stay raw text (big integers and unknown fields survive).
pub(crate) type Object = BTreeMap<String, Box<RawValue>>;

/// The members of a frame the proxy reads; everything else stays in the raw text.
#[derive(Debug, Deserialize)]
pub(crate) struct Frame {
    pub(crate) method: Option<String>,
    pub(crate) id: Option<Box<RawValue>>,
    pub(crate) params: Option<Box<RawValue>>,
    pub(crate) result: Option<Box<RawValue>>,
    pub(crate) error: Option<Box<RawValue>>,
}

impl Frame {
    /// The frame, when it is one JSON-RPC object (batches and other text are relayed unread).
    pub(crate) fn parse(line: &str) -> Option<Frame> {
        serde_json::from_str(line).ok()
    }

    /// Whether it is a response (to a request of the other side).
    pub(crate) fn is_response(&self) -> bool {
        self.method.is_none() && self.id.is_some()
    }
}

/// A request id as a map key: the same id written as `7` or `"7"` stays two ids, as in JSON-RPC.
pub(crate) fn id_key(id: &RawValue) -> String {
    serde_json::from_str::<serde_json::Value>(id.get())
        .map(|v| v.to_string())
        .unwrap_or_else(|_| id.get().to_owned())
}

/// A response frame with `result`, under the client's `id`.
pub(crate) fn response(id: &RawValue, result: &RawValue) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{},"result":{}}}"#,
        id.get(),
        result.get()
    )
}

/// A JSON-RPC error response (`id` raw, `null` when the request's id could not be read).
pub(crate) fn error_response(id: Option<&RawValue>, code: i64, message: &str) -> String {
    let error = serde_json::json!({ "code": code, "message": message });
    format!(
        r#"{{"jsonrpc":"2.0","id":{},"error":{}}}"#,
        id.map_or("null", RawValue::get),
        error
    )
}

/// What the client is told of text that is not one JSON-RPC message (a batch, a value that is
/// not an object, members of the wrong type or written twice, or no JSON at all), which the
/// proxy never relays: a frame it cannot read is one it cannot judge, and a server that reads
/// it otherwise (a batch element, the last of two `method`s) could run a tool call unjudged.
/// A batch gets an error for each request in it, in an array (JSON-RPC 2.0 "Batch"); one with
/// only notifications gets nothing, as JSON-RPC answers it; anything else one error.
pub(crate) fn refusal_of_unreadable(text: &str) -> Option<String> {
    const BATCH: &str = "batches are not part of MCP since 2025-06-18: send each message on its own; nothing in this batch was sent to the server";
    #[derive(Deserialize)]
    struct Id {
        id: Option<Box<RawValue>>,
        method: Option<Box<RawValue>>,
    }
    let id_of = |v: &RawValue| serde_json::from_str::<Id>(v.get()).ok();
    match serde_json::from_str::<serde_json::Value>(text) {
        Err(_) => Some(error_response(
            None,
            -32700,
            "Parse error: the message is not JSON; it was not sent to the server",
        )),
        Ok(serde_json::Value::Array(items)) if !items.is_empty() => {
            let elements: Vec<Box<RawValue>> = serde_json::from_str(text).unwrap_or_default();
            let answers: Vec<String> = elements
                .iter()
                .filter_map(|e| id_of(e).filter(|i| i.method.is_some() && i.id.is_some()))
                .map(|i| error_response(i.id.as_deref(), -32600, BATCH))
                .collect();
            (!answers.is_empty()).then(|| format!("[{}]", answers.join(",")))
        }
        Ok(serde_json::Value::Array(_)) => Some(error_response(None, -32600, BATCH)),
        Ok(_) => {
            let raw = RawValue::from_string(text.to_owned()).ok();
            let id = raw.as_deref().and_then(id_of).and_then(|i| i.id);
            Some(error_response(
                id.as_deref(),
                -32600,
                "Invalid Request: not one JSON-RPC message (an object whose method is a string, each member once); it was not sent to the server",
            ))
        }
    }
}

/// Raw JSON of a serializable value.
pub(crate) fn raw(value: &impl serde::Serialize) -> Box<RawValue> {
    let text = serde_json::to_string(value).expect("in-memory values always encode");
    RawValue::from_string(text).expect("serialized JSON is JSON")
}

/// The members of a raw object; `None` when it is not an object.
pub(crate) fn object(raw: &RawValue) -> Option<Object> {
    serde_json::from_str(raw.get()).ok()
}

/// A string member's value.
pub(crate) fn string(obj: &Object, name: &str) -> Option<String> {
    obj.get(name)
        .and_then(|v| serde_json::from_str::<String>(v.get()).ok())
}

/// `line` with its `id` replaced (every other member kept as it was).
pub(crate) fn with_id(line: &str, id: &RawValue) -> Option<String> {
    let mut frame: Object = serde_json::from_str(line).ok()?;
    frame.insert("id".to_owned(), id.to_owned());
    serde_json::to_string(&frame).ok()
}

/// `line` with `params[name]` set to `value` (every other member kept as it was).
pub(crate) fn with_param(line: &str, name: &str, value: &RawValue) -> Option<String> {
    let mut frame: Object = serde_json::from_str(line).ok()?;
    let mut params = object(frame.get("params")?)?;
    params.insert(name.to_owned(), value.to_owned());
    frame.insert("params".to_owned(), raw(&params));
    serde_json::to_string(&frame).ok()
}

/// `line` with the W3C trace context in `params._meta` (`traceparent`, and `tracestate` when
/// there is one; a stale one removed), every other member kept as it was.
pub(crate) fn with_trace(line: &str, trace: &idemgate_trace::TraceContext) -> Option<String> {
    let frame: Object = serde_json::from_str(line).ok()?;
    let mut meta = object(frame.get("params")?)?
        .get("_meta")
        .and_then(|m| object(m))
        .unwrap_or_default();
    meta.insert("traceparent".to_owned(), raw(&trace.traceparent()));
    match trace.tracestate() {
        Some(state) => meta.insert("tracestate".to_owned(), raw(&state)),
        None => meta.remove("tracestate"),
    };
    with_param(line, "_meta", &raw(&meta))
}

/// `line` with `params.arguments` replaced (every other member kept as it was).
pub(crate) fn with_arguments(line: &str, arguments: &Object) -> Option<String> {
    with_param(line, "arguments", &raw(arguments))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_only_what_it_needs_and_keeps_the_rest() {
        let line = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"pay","arguments":{"n":123456789012345678901234,"idempotency_key":"k"},"x":[1]}}"#;
        let f = Frame::parse(line).unwrap();
        assert_eq!(f.method.as_deref(), Some("tools/call"));
        assert_eq!(id_key(f.id.as_deref().unwrap()), "7");
        let mut args = object(&object(f.params.as_deref().unwrap()).unwrap()["arguments"]).unwrap();
        args.remove("idempotency_key");
        let out = with_arguments(line, &args).unwrap();
        assert!(
            out.contains(r#""arguments":{"n":123456789012345678901234}"#),
            "{out}"
        );
        assert!(out.contains(r#""x":[1]"#), "{out}");
        assert!(!out.contains("idempotency_key"));
        assert!(Frame::parse("[1,2]").is_none());
        let renamed = with_id(line, &raw(&"p-1")).unwrap();
        assert!(renamed.contains(r#""id":"p-1""#), "{renamed}");
        assert!(renamed.contains("123456789012345678901234"), "{renamed}");
        assert_ne!(id_key(&raw(&7)), id_key(&raw(&"7")));
    }
}

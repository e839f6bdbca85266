//! The two protocol eras and the pieces that translate between them (MCP 2026-07-28,
//! "Versioning and Compatibility"): the legacy era (2025-11-25 and earlier) opens a session with
//! `initialize`; the modern era (2026-07-28) has no handshake, every request carries its
//! protocol version, client info and capabilities in `params._meta` (the envelope), a server
//! describes itself in `server/discover`, and every result carries `resultType`.
//!
//! Only pure functions on frames live here; when the session applies them is in
//! [`Session`](crate::Session).

use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::frame::{self, Object};

/// `_meta` of a modern request: the protocol version it speaks.
pub(crate) const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
/// `_meta` of a modern request: who the client is.
const META_CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
/// `_meta` of a modern request: what the client can do.
const META_CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
/// `_meta` of a modern result: who the server is.
const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";
/// The prefix of the `_meta` names the specification reserves (the envelope's among them).
const META_PROTOCOL_PREFIX: &str = "io.modelcontextprotocol/";
/// The first modern version: requests naming it or a later one have no handshake, and their
/// results MUST carry `resultType`. Versions are dates, so they order as text.
pub(crate) const MODERN_SINCE: &str = "2026-07-28";
/// The modern versions the proxy translates a legacy server into.
pub(crate) const MODERN_VERSIONS: &[&str] = &["2026-07-28"];
/// The legacy version the proxy asks a legacy server for, and the legacy versions it answers a
/// legacy client's `initialize` with when the server is modern.
pub(crate) const LEGACY_VERSION: &str = "2025-11-25";
const LEGACY_VERSIONS: &[&str] = &["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];
/// The modern errors (MCP 2026-07-28, "Error Codes"): `HeaderMismatch`,
/// `MissingRequiredClientCapability`, `UnsupportedProtocolVersion`. A server that answers
/// `server/discover` with one of them is modern; any other error makes it legacy.
const MODERN_ERRORS: &[i64] = &[-32020, -32021, -32022];

/// The modern protocol version a request's params name, if they name one.
pub(crate) fn modern_version(params: &Object) -> Option<String> {
    params
        .get("_meta")
        .and_then(|m| frame::object(m))
        .and_then(|m| frame::string(&m, META_PROTOCOL_VERSION))
        .filter(|v| v.as_str() >= MODERN_SINCE)
}

/// [`modern_version`] of a frame's raw params.
pub(crate) fn modern_version_of(params: Option<&RawValue>) -> Option<String> {
    params
        .and_then(frame::object)
        .as_ref()
        .and_then(modern_version)
}

/// The envelope of a modern request (its `_meta` members under `io.modelcontextprotocol/`:
/// protocol version, client info and capabilities), when it is one: a request the proxy sends on
/// that request's behalf carries the same, or a modern server refuses it.
pub(crate) fn envelope(params: &Object) -> Option<Object> {
    modern_version(params)?;
    let meta = params.get("_meta").and_then(|m| frame::object(m))?;
    Some(
        meta.into_iter()
            .filter(|(k, _)| k.starts_with(META_PROTOCOL_PREFIX))
            .collect(),
    )
}

/// Marks a result `resultType: "complete"` unless it has a type of its own: a modern client
/// requires one on every result, and a legacy result (one from a legacy server, or stored from
/// a legacy call) has none; the specification says to read its absence as `complete`. A legacy
/// task handle (`CreateTaskResult`, `{"task": {...}}`) becomes the tasks extension's flat one,
/// `resultType: "task"` ([`modern_task`]).
pub(crate) fn mark_complete(result: &mut Object) {
    if result.contains_key("resultType") {
        return;
    }
    if let Some(task) = result.get("task").and_then(|t| frame::object(t)) {
        if task.contains_key("taskId") {
            result.remove("task");
            result.extend(modern_task(task));
            result.insert("resultType".to_owned(), frame::raw(&"task"));
            return;
        }
    }
    result.insert("resultType".to_owned(), frame::raw(&"complete"));
}

/// The extension by which a client and a server of the 2026-07-28 era speak of tasks
/// (`io.modelcontextprotocol/tasks`; the 2025-11-25 era had them in the protocol itself).
pub(crate) const TASKS_EXTENSION: &str = "io.modelcontextprotocol/tasks";

/// A 2025-11-25 `Task` in the tasks extension's words: `ttl` is `ttlMs`, `pollInterval` is
/// `pollIntervalMs`; `taskId`, `status`, `statusMessage`, `createdAt` and `lastUpdatedAt` stay.
/// A legacy task waiting for input (`input_required`) asks through server requests, which a
/// modern client takes none of (the proxy refuses them): it is reported `working`, with its
/// status message.
pub(crate) fn modern_task(task: Object) -> Object {
    task.into_iter()
        .map(|(k, v)| match k.as_str() {
            "ttl" => ("ttlMs".to_owned(), v),
            "pollInterval" => ("pollIntervalMs".to_owned(), v),
            "status" if v.get() == r#""input_required""# => (k, frame::raw(&"working")),
            _ => (k, v),
        })
        .collect()
}

/// The answer to a modern client's call of a tool that runs only as a task, when its envelope
/// does not declare the tasks extension: `MissingRequiredClientCapability`, as a modern server
/// answers it. Nothing was sent to the server.
pub(crate) fn missing_tasks_extension(id: &RawValue, tool: &str) -> String {
    let error = json!({
        "code": -32021,
        "message": format!("Missing required client capability: the tool {tool} runs only as a task; declare the {TASKS_EXTENSION} extension in the request's client capabilities"),
        "data": {"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}},
    });
    format!(r#"{{"jsonrpc":"2.0","id":{},"error":{}}}"#, id.get(), error)
}

/// `envelope` with the tasks extension declared among its client capabilities: what a legacy
/// client's task request says in the modern era.
pub(crate) fn with_tasks_extension(envelope: &Object) -> Object {
    let mut envelope = envelope.clone();
    let mut caps = envelope
        .get(META_CLIENT_CAPABILITIES)
        .and_then(|c| frame::object(c))
        .unwrap_or_default();
    declare_tasks_extension(&mut caps);
    envelope.insert(META_CLIENT_CAPABILITIES.to_owned(), frame::raw(&caps));
    envelope
}

/// `capabilities` with the tasks extension among its `extensions`.
fn declare_tasks_extension(capabilities: &mut Object) {
    let mut extensions = capabilities
        .get("extensions")
        .and_then(|e| frame::object(e))
        .unwrap_or_default();
    extensions.insert(TASKS_EXTENSION.to_owned(), frame::raw(&json!({})));
    capabilities.insert("extensions".to_owned(), frame::raw(&extensions));
}

/// A legacy client's task-augmented `tools/call` (2025-11-25 `params.task`) as a modern server
/// of the tasks extension takes it: no `params.task` (such servers ignore it), the envelope
/// with the extension declared.
pub(crate) fn modern_task_call(line: &str, envelope: &Object) -> Option<String> {
    let mut request: Object = serde_json::from_str(line).ok()?;
    let mut params = frame::object(request.get("params")?)?;
    params.remove("task");
    request.insert("params".to_owned(), frame::raw(&params));
    with_envelope(
        &serde_json::to_string(&request).ok()?,
        &with_tasks_extension(envelope),
    )
}

/// A task of the tasks extension in 2025-11-25 words (the reverse of [`modern_task`]): `ttlMs`
/// is `ttl`, `pollIntervalMs` is `pollInterval`; what only the extension has (`resultType`, the
/// inline `result`, `error` and `inputRequests`) is left out, since that era fetches a result
/// with `tasks/result`; a completed task whose tool result is an error is `failed`, as that era
/// counts it.
pub(crate) fn legacy_task(task: &Object) -> Object {
    let failed_tool = task
        .get("result")
        .and_then(|r| serde_json::from_str::<Value>(r.get()).ok())
        .is_some_and(|r| r["isError"] == json!(true));
    task.iter()
        .filter(|(k, _)| !["resultType", "result", "error", "inputRequests"].contains(&k.as_str()))
        .map(|(k, v)| match k.as_str() {
            "ttlMs" => ("ttl".to_owned(), v.clone()),
            "pollIntervalMs" => ("pollInterval".to_owned(), v.clone()),
            "status" if failed_tool && v.get() == r#""completed""# => {
                (k.clone(), frame::raw(&"failed"))
            }
            _ => (k.clone(), v.clone()),
        })
        .collect()
}

/// A result for a legacy request: a handle of the tasks extension (`resultType: "task"`)
/// becomes the 2025-11-25 `CreateTaskResult`, `{"task": {...}}` ([`legacy_task`]); its `_meta`
/// stays on the result. Whether it was one.
pub(crate) fn nest_task(result: &mut Object) -> bool {
    if result
        .get("resultType")
        .is_none_or(|t| t.get() != r#""task""#)
    {
        return false;
    }
    let meta = result.remove("_meta");
    let task = legacy_task(result);
    result.clear();
    result.insert("task".to_owned(), frame::raw(&task));
    if let Some(meta) = meta {
        result.insert("_meta".to_owned(), meta);
    }
    true
}

/// [`nest_task`] on a response frame for a legacy client; `None` when it needs no change.
pub(crate) fn legacy_response(line: &str) -> Option<String> {
    // Most results are no task handles: spare them the parse.
    if !line.contains("\"task\"") {
        return None;
    }
    let mut response: Object = serde_json::from_str(line).ok()?;
    let mut result = frame::object(response.get("result")?)?;
    if !nest_task(&mut result) {
        return None;
    }
    response.insert("result".to_owned(), frame::raw(&result));
    serde_json::to_string(&response).ok()
}

/// A modern server's capabilities as the legacy era says them: the tasks extension is the
/// 2025-11-25 `tasks` capability for tool calls, with `cancel` (not `list`: the extension lists
/// no tasks), which the proxy translates.
fn legacy_capabilities(capabilities: &RawValue) -> Box<RawValue> {
    let Some(mut caps) = frame::object(capabilities) else {
        return capabilities.to_owned();
    };
    let Some(mut extensions) = caps.get("extensions").and_then(|e| frame::object(e)) else {
        return capabilities.to_owned();
    };
    if extensions.remove(TASKS_EXTENSION).is_none() {
        return capabilities.to_owned();
    }
    if extensions.is_empty() {
        caps.remove("extensions");
    } else {
        caps.insert("extensions".to_owned(), frame::raw(&extensions));
    }
    caps.insert(
        "tasks".to_owned(),
        frame::raw(&json!({"requests": {"tools": {"call": {}}}, "cancel": {}})),
    );
    frame::raw(&caps)
}

/// Whether a modern request's envelope declares the tasks extension.
pub(crate) fn takes_tasks(params: &Object) -> bool {
    client_capabilities(params)
        .and_then(|c| c.get("extensions").and_then(|e| frame::object(e)))
        .is_some_and(|e| e.contains_key(TASKS_EXTENSION))
}

/// The capabilities a modern request's envelope declares.
fn client_capabilities(params: &Object) -> Option<Object> {
    let meta = params.get("_meta").and_then(|m| frame::object(m))?;
    frame::object(meta.get(META_CLIENT_CAPABILITIES)?)
}

/// A legacy server's capabilities as the modern era says them: `tasks` (a 2025-11-25
/// capability) is gone, and a server that runs tool calls as tasks
/// (`tasks.requests.tools.call`) has the tasks extension instead, which the proxy translates.
fn modern_capabilities(capabilities: &RawValue) -> Box<RawValue> {
    let Some(mut caps) = frame::object(capabilities) else {
        return capabilities.to_owned();
    };
    let Some(tasks) = caps.remove("tasks") else {
        return capabilities.to_owned();
    };
    let value: Value = serde_json::from_str(tasks.get()).unwrap_or_default();
    if value["requests"]["tools"]["call"].is_object() {
        declare_tasks_extension(&mut caps);
    }
    frame::raw(&caps)
}

/// The methods whose modern results carry caching directives (`CacheableResult`), which a
/// modern client requires.
const CACHEABLE: &[&str] = &[
    "tools/list",
    "prompts/list",
    "resources/list",
    "resources/templates/list",
    "resources/read",
];

/// Whether a modern result of `method` carries `ttlMs` and `cacheScope`.
pub(crate) fn is_cacheable(method: &str) -> bool {
    CACHEABLE.contains(&method)
}

/// A legacy server's response frame as a modern client needs it: its result marked by
/// [`mark_complete`] and, for a `cacheable` method's, told not to be cached (`ttlMs` 0,
/// `cacheScope` private: the legacy server said nothing about how long its lists hold, or for
/// whom); `None` when it needs no change (an error, or a result that has these members).
pub(crate) fn completed_response(line: &str, cacheable: bool) -> Option<String> {
    let mut response: Object = serde_json::from_str(line).ok()?;
    let mut result = frame::object(response.get("result")?)?;
    let before = result.len();
    mark_complete(&mut result);
    if cacheable {
        result
            .entry("ttlMs".to_owned())
            .or_insert_with(|| frame::raw(&0));
        result
            .entry("cacheScope".to_owned())
            .or_insert_with(|| frame::raw(&"private"));
    }
    if result.len() == before {
        return None;
    }
    response.insert("result".to_owned(), frame::raw(&result));
    serde_json::to_string(&response).ok()
}

/// Whether a JSON-RPC error is one only a modern server sends.
pub(crate) fn is_modern_error(error: &RawValue) -> bool {
    serde_json::from_str::<Value>(error.get())
        .ok()
        .and_then(|e| e["code"].as_i64())
        .is_some_and(is_modern_code)
}

/// Whether a JSON-RPC error code is one of the modern errors.
pub(crate) fn is_modern_code(code: i64) -> bool {
    MODERN_ERRORS.contains(&code)
}

/// The params of the `initialize` the proxy sends a legacy server on behalf of a modern client
/// whose envelope is `envelope`: the latest legacy version, and the client's own capabilities
/// and identity (the server may shape its tools to them).
pub(crate) fn initialize_params(envelope: &Object) -> Value {
    let member = |name: &str| {
        envelope
            .get(name)
            .and_then(|v| serde_json::from_str::<Value>(v.get()).ok())
    };
    json!({
        "protocolVersion": LEGACY_VERSION,
        "capabilities": member(META_CLIENT_CAPABILITIES).unwrap_or_else(|| json!({})),
        "clientInfo": member(META_CLIENT_INFO)
            .unwrap_or_else(|| json!({"name": "idemgate", "version": env!("CARGO_PKG_VERSION")})),
    })
}

/// The `server/discover` result for a modern client, from a legacy server's `initialize`
/// result (MCP 2026-07-28, "Discovery"): the server's capabilities and instructions as they
/// are (the capability set is open), its `serverInfo` under `_meta`, the modern versions the
/// proxy translates into, and no caching by intermediaries (`ttlMs` 0, `private`): the answer
/// holds for this proxy's session with the server only.
pub(crate) fn discover_from_initialize(initialized: &RawValue) -> Box<RawValue> {
    let init = frame::object(initialized).unwrap_or_default();
    let mut result = Object::new();
    result.insert("supportedVersions".to_owned(), frame::raw(&MODERN_VERSIONS));
    result.insert(
        "capabilities".to_owned(),
        init.get("capabilities")
            .map(|c| modern_capabilities(c))
            .unwrap_or_else(|| frame::raw(&json!({}))),
    );
    if let Some(instructions) = init.get("instructions") {
        result.insert("instructions".to_owned(), instructions.clone());
    }
    if let Some(info) = init.get("serverInfo") {
        let mut meta = Object::new();
        meta.insert(META_SERVER_INFO.to_owned(), info.clone());
        result.insert("_meta".to_owned(), frame::raw(&meta));
    }
    result.insert("ttlMs".to_owned(), frame::raw(&0));
    result.insert("cacheScope".to_owned(), frame::raw(&"private"));
    mark_complete(&mut result);
    frame::raw(&result)
}

/// The answer to a modern request naming a version the proxy does not translate into:
/// `UnsupportedProtocolVersionError`, which names the ones it does.
pub(crate) fn unsupported_version(id: &RawValue, requested: &str) -> String {
    let error = json!({
        "code": -32022,
        "message": "Unsupported protocol version",
        "data": {"supported": MODERN_VERSIONS, "requested": requested},
    });
    format!(r#"{{"jsonrpc":"2.0","id":{},"error":{}}}"#, id.get(), error)
}

/// The capabilities by which a client says it takes requests from the server: a legacy
/// server sends them as JSON-RPC requests, which the modern era has none of.
const SERVER_REQUEST_CAPABILITIES: &[&str] = &["sampling", "elicitation", "roots"];

/// Whether a modern request's envelope declares that its client takes requests from the
/// server (sampling, elicitation, roots). In front of a legacy server such a client is kept in
/// the legacy era, where those requests reach it ([`legacy_only`]).
pub(crate) fn takes_server_requests(params: &Object) -> bool {
    client_capabilities(params).is_some_and(|caps| {
        SERVER_REQUEST_CAPABILITIES
            .iter()
            .any(|c| caps.get(*c).is_some_and(|v| v.get() != "null"))
    })
}

/// The answer to a modern client's `server/discover` that must use the legacy era: the
/// server behind the proxy is a legacy one (it agreed `initialized`'s version) and the client
/// takes the server's requests, which reach a client only in that era.
/// `UnsupportedProtocolVersionError` naming only that legacy version is what makes a client
/// that speaks both eras fall back to `initialize` (the Python SDK's "auto" mode, the TypeScript
/// SDK's), rather than a discovery under which the server's requests would be refused.
pub(crate) fn legacy_only(id: &RawValue, requested: &str, initialized: &RawValue) -> String {
    let agreed = frame::object(initialized)
        .and_then(|i| frame::string(&i, "protocolVersion"))
        .unwrap_or_else(|| LEGACY_VERSION.to_owned());
    let error = json!({
        "code": -32022,
        "message": format!(
            "Unsupported protocol version: the server behind this proxy speaks {agreed}, and its requests (sampling, elicitation, roots), which this client says it takes, reach a client only in that era; initialize with {agreed}"
        ),
        "data": {"supported": [agreed], "requested": requested},
    });
    format!(r#"{{"jsonrpc":"2.0","id":{},"error":{}}}"#, id.get(), error)
}

/// The envelope the proxy adds to every request of a legacy client it forwards to a modern
/// server, from the client's `initialize` params: the modern version, the client's identity and
/// capabilities.
pub(crate) fn envelope_from_initialize(params: &Object) -> Object {
    let mut envelope = Object::new();
    envelope.insert(META_PROTOCOL_VERSION.to_owned(), frame::raw(&MODERN_SINCE));
    if let Some(info) = params.get("clientInfo") {
        envelope.insert(META_CLIENT_INFO.to_owned(), info.clone());
    }
    envelope.insert(
        META_CLIENT_CAPABILITIES.to_owned(),
        params
            .get("capabilities")
            .cloned()
            .unwrap_or_else(|| frame::raw(&json!({}))),
    );
    envelope
}

/// The `initialize` result for a legacy client, from a modern server's `server/discover`
/// result: the version the client asked for when the proxy knows it (else the latest legacy
/// one), the server's capabilities, identity and instructions.
pub(crate) fn initialize_from_discover(
    discovered: &RawValue,
    requested: Option<&str>,
) -> Box<RawValue> {
    let discover = frame::object(discovered).unwrap_or_default();
    let version = requested
        .filter(|v| LEGACY_VERSIONS.contains(v))
        .unwrap_or(LEGACY_VERSION);
    let mut result = Object::new();
    result.insert("protocolVersion".to_owned(), frame::raw(&version));
    result.insert(
        "capabilities".to_owned(),
        discover
            .get("capabilities")
            .map(|c| legacy_capabilities(c))
            .unwrap_or_else(|| frame::raw(&json!({}))),
    );
    let info = discover
        .get("_meta")
        .and_then(|m| frame::object(m))
        .and_then(|mut m| m.remove(META_SERVER_INFO))
        // serverInfo is required in the legacy result; a server that did not say gets a name.
        .unwrap_or_else(|| frame::raw(&json!({"name": "unknown", "version": "0"})));
    result.insert("serverInfo".to_owned(), info);
    if let Some(instructions) = discover.get("instructions") {
        result.insert("instructions".to_owned(), instructions.clone());
    }
    frame::raw(&result)
}

/// `line` (a request) with `envelope` added to its `params._meta` (members of the same name
/// replaced, every other member kept).
pub(crate) fn with_envelope(line: &str, envelope: &Object) -> Option<String> {
    let mut request: Object = serde_json::from_str(line).ok()?;
    let mut params = match request.get("params") {
        Some(p) => frame::object(p)?,
        None => Object::new(),
    };
    let mut meta = match params.get("_meta") {
        Some(m) => frame::object(m)?,
        None => Object::new(),
    };
    meta.extend(envelope.iter().map(|(k, v)| (k.clone(), v.clone())));
    params.insert("_meta".to_owned(), frame::raw(&meta));
    request.insert("params".to_owned(), frame::raw(&params));
    serde_json::to_string(&request).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(v: Value) -> Object {
        frame::object(&frame::raw(&v)).unwrap()
    }

    fn envelope_2026() -> Object {
        obj(json!({
            META_PROTOCOL_VERSION: "2026-07-28",
            META_CLIENT_INFO: {"name": "agent", "version": "1"},
            META_CLIENT_CAPABILITIES: {"elicitation": {}},
        }))
    }

    #[test]
    fn modern_requests_are_told_by_their_envelope() {
        let params = obj(json!({"_meta": {META_PROTOCOL_VERSION: "2026-07-28", "x": 1}}));
        assert_eq!(modern_version(&params).as_deref(), Some("2026-07-28"));
        assert_eq!(
            envelope(&params).unwrap().keys().collect::<Vec<_>>(),
            vec![META_PROTOCOL_VERSION]
        );
        let legacy = obj(json!({"_meta": {META_PROTOCOL_VERSION: "2025-11-25"}}));
        assert!(modern_version(&legacy).is_none());
        assert!(envelope(&legacy).is_none());
        assert!(modern_version_of(None).is_none());
    }

    #[test]
    fn a_legacy_initialize_becomes_a_discover_result_and_back() {
        let params = initialize_params(&envelope_2026());
        assert_eq!(params["protocolVersion"], LEGACY_VERSION);
        assert_eq!(params["capabilities"], json!({"elicitation": {}}));
        assert_eq!(params["clientInfo"]["name"], "agent");
        assert_eq!(
            initialize_params(&Object::new())["clientInfo"]["name"],
            "idemgate"
        );

        let initialized = frame::raw(&json!({
            "protocolVersion": "2025-11-25",
            "capabilities": {"tools": {"listChanged": true}, "x-own": {"n": 12345678901234567890u64}},
            "serverInfo": {"name": "memory-server", "version": "0.6.3"},
            "instructions": "use me",
        }));
        let discovered = discover_from_initialize(&initialized);
        assert!(
            discovered.get().contains("12345678901234567890"),
            "{discovered}"
        );
        let d: Value = serde_json::from_str(discovered.get()).unwrap();
        assert_eq!(d["resultType"], "complete");
        assert_eq!(d["supportedVersions"], json!(["2026-07-28"]));
        assert_eq!(d["capabilities"]["tools"]["listChanged"], true);
        assert_eq!(d["_meta"][META_SERVER_INFO]["name"], "memory-server");
        assert_eq!(d["instructions"], "use me");
        assert_eq!(d["ttlMs"], 0);
        assert_eq!(d["cacheScope"], "private");
        assert!(d.get("protocolVersion").is_none() && d.get("serverInfo").is_none());

        // And back, for a legacy client in front of a modern server.
        let back: Value =
            serde_json::from_str(initialize_from_discover(&discovered, Some("2025-06-18")).get())
                .unwrap();
        assert_eq!(back["protocolVersion"], "2025-06-18");
        assert_eq!(back["serverInfo"]["name"], "memory-server");
        assert_eq!(back["capabilities"]["tools"]["listChanged"], true);
        assert_eq!(back["instructions"], "use me");
        let unknown: Value = serde_json::from_str(
            initialize_from_discover(
                &frame::raw(&json!({"capabilities": {}})),
                Some("1999-01-01"),
            )
            .get(),
        )
        .unwrap();
        assert_eq!(unknown["protocolVersion"], LEGACY_VERSION);
        assert_eq!(unknown["serverInfo"]["name"], "unknown");
    }

    #[test]
    fn results_get_their_type_once() {
        let line = r#"{"jsonrpc":"2.0","id":3,"result":{"content":[],"n":12345678901234567890}}"#;
        let out = completed_response(line, false).unwrap();
        assert!(out.contains(r#""resultType":"complete""#), "{out}");
        assert!(!out.contains("ttlMs"), "{out}");
        assert!(out.contains("12345678901234567890"), "{out}");
        assert!(completed_response(&out, false).is_none(), "typed already");
        let listed: Value = serde_json::from_str(&completed_response(&out, true).unwrap()).unwrap();
        assert_eq!(listed["result"]["ttlMs"], 0);
        assert_eq!(listed["result"]["cacheScope"], "private");
        let own = r#"{"jsonrpc":"2.0","id":3,"result":{"resultType":"complete","ttlMs":5,"cacheScope":"public"}}"#;
        assert!(
            completed_response(own, true).is_none(),
            "the server's own directives"
        );
        assert!(
            completed_response(r#"{"jsonrpc":"2.0","id":3,"error":{"code":1}}"#, true).is_none()
        );
        assert!(is_cacheable("tools/list") && !is_cacheable("tools/call"));
    }

    #[test]
    fn modern_errors_are_the_three_the_specification_defines() {
        assert!(is_modern_error(&frame::raw(
            &json!({"code": -32022, "message": "x"})
        )));
        assert!(!is_modern_error(&frame::raw(
            &json!({"code": -32601, "message": "x"})
        )));
        assert!(!is_modern_error(&frame::raw(
            &json!({"code": -32602, "message": "x"})
        )));
        let e: Value =
            serde_json::from_str(&unsupported_version(&frame::raw(&7), "2030-01-01")).unwrap();
        assert_eq!(e["id"], 7);
        assert_eq!(e["error"]["code"], -32022);
        assert_eq!(e["error"]["data"]["supported"], json!(MODERN_VERSIONS));
    }

    #[test]
    fn a_legacy_clients_request_gets_the_envelope() {
        let init = obj(
            json!({"protocolVersion": "2025-11-25", "capabilities": {"roots": {}},
                              "clientInfo": {"name": "old", "version": "2"}}),
        );
        let envelope = envelope_from_initialize(&init);
        let line = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","_meta":{"progressToken":5}}}"#;
        let out: Value = serde_json::from_str(&with_envelope(line, &envelope).unwrap()).unwrap();
        assert_eq!(out["params"]["name"], "t");
        assert_eq!(out["params"]["_meta"]["progressToken"], 5);
        assert_eq!(out["params"]["_meta"][META_PROTOCOL_VERSION], MODERN_SINCE);
        assert_eq!(out["params"]["_meta"][META_CLIENT_INFO]["name"], "old");
        assert_eq!(
            out["params"]["_meta"][META_CLIENT_CAPABILITIES],
            json!({"roots": {}})
        );
        let bare: Value = serde_json::from_str(
            &with_envelope(
                r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
                &envelope,
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(bare["params"]["_meta"][META_PROTOCOL_VERSION], MODERN_SINCE);
    }
}

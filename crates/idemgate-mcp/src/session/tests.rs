//! The session's tests: frames in through its public entry points, frames out of its two
//! channels, a session of an in-memory store and no transport.

use std::sync::Arc;

use idemgate_core::{Engine, MemoryStore, TenantId};

use super::{Outputs, Session};
use crate::config::Config;
use crate::wire::frame::Frame;
use crate::META_KEY;

fn session() -> (Session<MemoryStore>, Outputs) {
    let engine = Arc::new(Engine::new(MemoryStore::new()));
    let tenant = TenantId::new("t").unwrap();
    Session::new(engine, Config::default(), "srv".to_owned(), tenant)
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap()
}

/// The next frame for the server, as JSON.
async fn next(out: &mut Outputs) -> serde_json::Value {
    json(&out.to_server.recv().await.unwrap().frame)
}

/// The next frame for the client, as JSON.
async fn answer(out: &mut Outputs) -> serde_json::Value {
    json(&out.to_client.recv().await.unwrap())
}

const ENVELOPE: &str = r#"{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"agent","version":"1"},"io.modelcontextprotocol/clientCapabilities":{"experimental":{"x":{}}}}"#;

fn modern(id: u64, method: &str, mut params: serde_json::Value) -> String {
    params["_meta"] = json(ENVELOPE);
    serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string()
}

#[tokio::test]
async fn a_modern_client_before_a_legacy_server_gets_a_discovery_made_from_initialize() {
    let (session, mut out) = session();
    let discover = modern(1, "server/discover", serde_json::json!({}));
    session.from_client(discover.clone());
    // A request that comes while the proxy learns the eras waits for them.
    session.from_client(modern(2, "resources/list", serde_json::json!({})));
    assert_eq!(
        out.to_server.recv().await.unwrap().frame,
        discover,
        "the client's probe, verbatim"
    );
    session.from_server(
        r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32601,"message":"Method not found"}}"#
            .to_owned(),
    );
    let init = next(&mut out).await;
    assert_eq!(init["method"], "initialize");
    assert_eq!(init["params"]["protocolVersion"], "2025-11-25");
    assert_eq!(
        init["params"]["capabilities"],
        serde_json::json!({"experimental": {"x": {}}})
    );
    assert_eq!(init["params"]["clientInfo"]["name"], "agent");
    session.from_server(
        serde_json::json!({"jsonrpc": "2.0", "id": init["id"], "result": {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}, "serverInfo": {"name": "old", "version": "1"}}})
            .to_string(),
    );
    assert_eq!(next(&mut out).await["method"], "notifications/initialized");
    let discovered = answer(&mut out).await;
    assert_eq!(discovered["id"], 1);
    assert_eq!(
        discovered["result"]["supportedVersions"],
        serde_json::json!(["2026-07-28"])
    );
    assert_eq!(
        discovered["result"]["capabilities"],
        serde_json::json!({"tools": {}})
    );
    assert_eq!(
        discovered["result"]["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
        "old"
    );
    assert_eq!(discovered["result"]["resultType"], "complete");
    // The held request goes on, and its legacy result comes back typed.
    let held = next(&mut out).await;
    assert_eq!(held["method"], "resources/list");
    session.from_server(r#"{"jsonrpc":"2.0","id":2,"result":{"resources":[]}}"#.to_owned());
    let listed = answer(&mut out).await;
    assert_eq!(listed["result"]["resultType"], "complete");
    assert_eq!(listed["result"]["resources"], serde_json::json!([]));
    // Another discovery is answered by the proxy; a call's legacy result gets typed too.
    session.from_client(modern(3, "server/discover", serde_json::json!({})));
    assert_eq!(answer(&mut out).await["result"]["resultType"], "complete");
    session.from_client(modern(
        4,
        "tools/call",
        serde_json::json!({"name": "pay", "arguments": {}, "_meta": {}}),
    ));
    let mut call = json(&modern(
        4,
        "tools/call",
        serde_json::json!({"name": "pay", "arguments": {}}),
    ));
    call["params"]["_meta"][META_KEY] = "k".into();
    session.from_client(call.to_string().replace(r#""id":4"#, r#""id":5"#));
    let listing = next(&mut out).await;
    assert_eq!(listing["method"], "tools/list");
    session.from_server(
        serde_json::json!({"jsonrpc": "2.0", "id": listing["id"], "result": {"tools": [{"name": "pay"}]}}).to_string(),
    );
    // Call 4 has no key: the proxy's own refusal, typed.
    let mut answers = vec![];
    let sent = out.to_server.recv().await.unwrap();
    assert_eq!(json(&sent.frame)["id"], 5);
    sent.sent.unwrap().send(Ok(())).unwrap();
    session.from_server(r#"{"jsonrpc":"2.0","id":5,"result":{"content":[]}}"#.to_owned());
    answers.push(answer(&mut out).await);
    answers.push(answer(&mut out).await);
    answers.sort_by_key(|a| a["id"].as_u64());
    assert_eq!(
        answers[0]["result"]["_meta"][crate::META_VERDICT],
        "key_required"
    );
    assert_eq!(answers[0]["result"]["resultType"], "complete");
    assert_eq!(
        answers[1]["result"],
        serde_json::json!({"content": [], "resultType": "complete"})
    );
    session.drain().await;
}

#[tokio::test]
async fn a_modern_server_gets_the_modern_clients_frames_verbatim() {
    let (session, mut out) = session();
    let discover = modern(1, "server/discover", serde_json::json!({}));
    session.from_client(discover.clone());
    assert_eq!(out.to_server.recv().await.unwrap().frame, discover);
    let discovered = r#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"complete","supportedVersions":["2026-07-28"],"capabilities":{}}}"#;
    session.from_server(discovered.to_owned());
    assert_eq!(
        out.to_client.recv().await.unwrap(),
        discovered,
        "the server's own answer"
    );
    let list = modern(2, "prompts/list", serde_json::json!({}));
    session.from_client(list.clone());
    assert_eq!(out.to_server.recv().await.unwrap().frame, list);
    // An error only a modern server sends is relayed too: the server is modern.
    let (session, mut out) = self::session();
    session.from_client(discover.clone());
    out.to_server.recv().await.unwrap();
    let refused = r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32022,"message":"Unsupported protocol version","data":{"supported":["2027-01-01"]}}}"#;
    session.from_server(refused.to_owned());
    assert_eq!(out.to_client.recv().await.unwrap(), refused);
    session.from_client(list.clone());
    assert_eq!(out.to_server.recv().await.unwrap().frame, list);
}

#[tokio::test]
async fn a_legacy_client_before_a_modern_only_server_gets_an_initialize_made_from_discovery() {
    let (session, mut out) = session();
    let init = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{"roots":{}},"clientInfo":{"name":"old","version":"2"}}}"#;
    session.from_client(init.to_owned());
    session.from_client(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.to_owned());
    session.from_client(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#.to_owned());
    assert_eq!(
        out.to_server.recv().await.unwrap().frame,
        init,
        "the client's initialize, verbatim"
    );
    session.from_server(r#"{"jsonrpc":"2.0","id":0,"error":{"code":-32601,"message":"initialize is not a method; supported: 2026-07-28"}}"#.to_owned());
    let probe = next(&mut out).await;
    assert_eq!(probe["method"], "server/discover");
    assert_eq!(
        probe["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"],
        "2026-07-28"
    );
    assert_eq!(
        probe["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"],
        serde_json::json!({"roots": {}})
    );
    session.from_server(
        serde_json::json!({"jsonrpc": "2.0", "id": probe["id"], "result": {"resultType": "complete", "supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}}, "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "new", "version": "3"}}}}).to_string(),
    );
    let initialized = answer(&mut out).await;
    assert_eq!(initialized["id"], 0);
    assert_eq!(initialized["result"]["protocolVersion"], "2025-06-18");
    assert_eq!(initialized["result"]["serverInfo"]["name"], "new");
    // notifications/initialized is the proxy's to swallow; the request gets the envelope.
    let listed = next(&mut out).await;
    assert_eq!(listed["method"], "tools/list");
    assert_eq!(
        listed["params"]["_meta"]["io.modelcontextprotocol/clientInfo"]["name"],
        "old"
    );
    session.from_client(r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#.to_owned());
    assert_eq!(
        answer(&mut out).await,
        serde_json::json!({"jsonrpc": "2.0", "id": 2, "result": {}})
    );
    assert!(
        out.to_server.try_recv().is_err(),
        "nothing else reached the server"
    );
}

#[tokio::test]
async fn a_legacy_server_that_takes_initialize_sees_only_the_clients_frames() {
    let (session, mut out) = session();
    let init = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"c","version":"1"}}}"#;
    session.from_client(init.to_owned());
    let initialized = r#"{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"2025-11-25","capabilities":{},"serverInfo":{"name":"s","version":"1"}}}"#;
    assert_eq!(out.to_server.recv().await.unwrap().frame, init);
    session.from_server(initialized.to_owned());
    assert_eq!(out.to_client.recv().await.unwrap(), initialized);
    let note = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    session.from_client(note.to_owned());
    assert_eq!(out.to_server.recv().await.unwrap().frame, note);
}

fn call(id: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"pay","arguments":{{"cents":5}},"_meta":{{"{META_KEY}":"k"}}}}}}"#
    )
}

#[tokio::test]
async fn a_retry_is_answered_under_its_own_id_without_the_server() {
    let (session, mut out) = session();
    let list = r#"{"jsonrpc":"2.0","id":"l","method":"tools/list"}"#;
    session.from_client(list.to_owned());
    assert_eq!(out.to_server.recv().await.unwrap().frame, list);
    let listing = r#"{"jsonrpc":"2.0","id":"l","result":{"tools":[{"name":"pay","x-new":[1]}]}}"#;
    session.from_server(listing.to_owned());
    // The write is offered the model's key in its schema; the rest is relayed as it came.
    let shown: serde_json::Value =
        serde_json::from_str(&out.to_client.recv().await.unwrap()).unwrap();
    assert_eq!(shown["id"], "l");
    let pay = &shown["result"]["tools"][0];
    assert_eq!(pay["x-new"], serde_json::json!([1]));
    assert_eq!(
        pay["inputSchema"]["properties"]["idempotency_key"]["type"],
        serde_json::json!(["string", "null"])
    );

    session.from_client(call("1"));
    let sent = out.to_server.recv().await.unwrap();
    assert_eq!(sent.frame, call("1"), "relayed as it came");
    sent.sent.unwrap().send(Ok(())).unwrap();
    let answer = r#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"paid"}]}}"#;
    session.from_server(answer.to_owned());
    assert_eq!(out.to_client.recv().await.unwrap(), answer);

    session.from_client(call(r#""retry-7""#));
    let replay: serde_json::Value =
        serde_json::from_str(&out.to_client.recv().await.unwrap()).unwrap();
    assert_eq!(replay["id"], "retry-7");
    assert_eq!(replay["result"]["content"][0]["text"], "paid");
    assert_eq!(replay["result"]["_meta"][crate::META_REPLAYED], true);
    session.drain().await;
    assert!(out.to_server.try_recv().is_err(), "the server saw one call");
}

#[tokio::test]
async fn the_proxys_own_listing_carries_a_2026_era_calls_envelope() {
    let (session, mut out) = session();
    let envelope = r#"{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}"#;
    session.from_client(format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"pay","arguments":{{}},"_meta":{{"{META_KEY}":"k","x-other":1,{}}}}}}}"#,
        &envelope[1..envelope.len() - 1]
    ));
    // A modern client's first request: the proxy probes the server's era first, with the
    // call's envelope; a modern server answers.
    let probe = next(&mut out).await;
    assert_eq!(probe["method"], "server/discover");
    assert_eq!(probe["params"]["_meta"], json(envelope));
    session.from_server(
        serde_json::json!({"jsonrpc": "2.0", "id": probe["id"], "result": {"resultType": "complete", "supportedVersions": ["2026-07-28"], "capabilities": {}}})
            .to_string(),
    );
    let own = next(&mut out).await;
    assert_eq!(own["method"], "tools/list");
    assert_eq!(
        own["params"]["_meta"],
        json(envelope),
        "the envelope and nothing else of the call's _meta"
    );
    session.server_closed("gone");
}

#[tokio::test]
async fn the_proxy_lists_tools_itself_and_keeps_its_requests_to_itself() {
    let (session, mut out) = session();
    session.from_client(call("1"));
    let own = out.to_server.recv().await.unwrap();
    let f = Frame::parse(&own.frame).unwrap();
    assert_eq!(f.method.as_deref(), Some("tools/list"));
    let id = f.id.unwrap();
    assert!(id.get().contains("dev.idemgate/"), "{}", id.get());
    session.from_server(format!(
        r#"{{"jsonrpc":"2.0","id":{},"result":{{"tools":[{{"name":"pay","inputSchema":{{"properties":{{"idempotency_key":{{}}}}}}}}]}}}}"#,
        id.get()
    ));
    let sent = out.to_server.recv().await.unwrap();
    assert!(
        sent.frame.contains(r#""idempotency_key":""#),
        "{}",
        sent.frame
    );
    // The server is gone before it answers: unknown, in the proxy's own words.
    sent.sent.unwrap().send(Ok(())).unwrap();
    session.server_closed("gone");
    let answer: serde_json::Value =
        serde_json::from_str(&out.to_client.recv().await.unwrap()).unwrap();
    assert_eq!(answer["id"], 1);
    assert_eq!(answer["result"]["isError"], true);
    assert_eq!(answer["result"]["_meta"][crate::META_VERDICT], "unknown");
    assert!(
        out.to_client.try_recv().is_err(),
        "the listing never reached the client"
    );
}

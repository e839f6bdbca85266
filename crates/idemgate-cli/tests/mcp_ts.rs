//! `idemgate mcp` before @modelcontextprotocol/server-everything (a 2025-era server whose tools
//! ask the client for sampling and elicitation and send progress), driven by the official
//! TypeScript SDK v2 client (@modelcontextprotocol/client, tests/fixtures/mcp_ts_client.mjs) in
//! its `versionNegotiation` "auto" mode and its default ("legacy") mode, on stdio and over
//! Streamable HTTP: the same scenario as the Python SDK's in mcp.rs and mcp_http.rs.
//!
//! On stdio in "auto" mode the SDK probes `server/discover` on a disposable sibling process
//! spawned with the same command, so `idemgate mcp` (and the server behind it) starts twice: the
//! probe's proxy is reaped once it has answered, and the session runs on the second one. What a
//! probe was answered is seen over HTTP only (the sibling's output stays inside the SDK).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};

use crate::cli::Sandbox;
use crate::mcp::mcp_deps;

const CLIENT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/mcp_ts_client.mjs"
);

/// The TypeScript SDK's installation and server-everything (scripts/mcp-test-deps), or a loud
/// failure saying how to get them.
fn ts_deps() -> (PathBuf, PathBuf) {
    let deps = mcp_deps();
    let sdk = deps.join("ts-client");
    let server = deps.join("node/node_modules/.bin/mcp-server-everything");
    let pieces = [
        sdk.join("node_modules/@modelcontextprotocol/client/package.json"),
        server.clone(),
    ];
    let missing: Vec<_> = pieces.iter().filter(|p| !p.exists()).collect();
    assert!(
        missing.is_empty(),
        "the TypeScript MCP client's test dependencies are missing ({missing:?}): run scripts/mcp-test-deps (it installs @modelcontextprotocol/client and @modelcontextprotocol/server-everything, pinned)"
    );
    (sdk, server)
}

/// The client script on the machine's node, with the sandbox's store in its environment (the
/// proxies it starts on stdio use it).
fn ts_client(sb: &Sandbox, sdk: &Path, mode: &str, transport: &str) -> Command {
    let mut c = sb.with_store("node");
    c.arg(CLIENT)
        .arg(sdk)
        .args([mode, transport])
        .env("IDEMGATE_LOG", "warn");
    c
}

/// What the client script saw in `mode` ("auto", "legacy", or "plain": "auto" without the
/// sampling and elicitation capabilities) before server-everything through the proxy on
/// `transport` ("stdio" or "http").
fn everything_ts_client(mode: &str, transport: &str) -> Value {
    let (sdk, server) = ts_deps();
    let sb = Sandbox::new();
    let client = ts_client(&sb, &sdk, mode, transport);
    sb.client_saw_through_proxy(client, transport, &server)
}

/// The TypeScript client in `mode` ("auto" or "legacy") before server-everything through the
/// proxy on `transport`; what it saw, checked: the era is the server's 2025-11-25 (in "auto"
/// mode because the client declares sampling and elicitation), the server's sampling and
/// elicitation requests reached the client once each (the replays asked nothing), the re-sent
/// keyed calls were replays of the first, and the progress of the long operation arrived.
fn everything_through_the_proxy(mode: &str, transport: &str) -> Value {
    let seen = everything_ts_client(mode, transport);
    assert_eq!(seen["protocol"], "2025-11-25", "{seen}");
    assert_eq!(
        seen["asked"],
        json!({"sampling": 1, "elicitation": 1}),
        "{seen}"
    );
    for tool in [
        "trigger-sampling-request",
        "trigger-elicitation-request",
        "trigger-long-running-operation",
    ] {
        assert!(
            seen["tools"].as_array().unwrap().contains(&json!(tool)),
            "{seen}"
        );
    }
    let sampled = seen["sampled"]["content"][0]["text"].as_str().unwrap();
    assert!(sampled.contains("fake completion"), "{seen}");
    let elicited = &seen["elicited"];
    assert_ne!(elicited["isError"], true, "{seen}");
    assert!(elicited.to_string().contains("Ada"), "{seen}");
    for (first, again) in [("sampled", "sampled_again"), ("elicited", "elicited_again")] {
        assert!(
            seen[first]["_meta"]["dev.idemgate/replayed"].is_null(),
            "{seen}"
        );
        assert_eq!(
            seen[again]["_meta"]["dev.idemgate/replayed"], true,
            "{seen}"
        );
        assert_eq!(
            seen[again]["content"][0], seen[first]["content"][0],
            "{seen}"
        );
    }
    assert_long_operation_with_progress(&seen);
    seen
}

/// The long operation ran, and its two progress notifications reached the client's handler.
fn assert_long_operation_with_progress(seen: &Value) {
    assert_ne!(seen["long"]["isError"], true, "{seen}");
    assert!(
        seen["long"]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("completed")),
        "{seen}"
    );
    assert_eq!(seen["progress"], json!([[1, 2], [2, 2]]), "{seen}");
}

/// What the proxy answered the "auto" client's probe over HTTP: `-32022` naming the legacy
/// version the server agreed, on which the SDK's probe classifier falls back to `initialize`.
fn assert_probe_refused_for_the_legacy_era(seen: &Value) {
    let error = &seen["probe"]["error"];
    assert_eq!(error["code"], -32022, "{seen}");
    assert_eq!(error["data"]["supported"], json!(["2025-11-25"]), "{seen}");
}

#[test]
fn mcp_real_everything_server_requests_reach_a_typescript_client_in_auto_mode() {
    everything_through_the_proxy("auto", "stdio");
}

#[test]
fn mcp_real_everything_server_requests_reach_a_typescript_client_in_legacy_mode() {
    everything_through_the_proxy("legacy", "stdio");
}

#[test]
fn mcp_real_everything_progress_reaches_a_2026_era_typescript_client() {
    // Without sampling and elicitation the probe is answered with a discovery and the client
    // stays in the 2026-07-28 era. So the probe is answered on stdio too, and the fallback of
    // the clients that declare them is the proxy's -32022, not a probe that went unanswered or
    // a proxy that exited, which the SDK also takes for a legacy server on stdio.
    let seen = everything_ts_client("plain", "stdio");
    assert_eq!(seen["protocol"], "2026-07-28", "{seen}");
    assert_long_operation_with_progress(&seen);
}

#[test]
fn mcp_http_everything_server_requests_reach_a_typescript_client_in_auto_mode() {
    let seen = everything_through_the_proxy("auto", "http");
    assert_probe_refused_for_the_legacy_era(&seen);
}

#[test]
fn mcp_http_everything_server_requests_reach_a_typescript_client_in_legacy_mode() {
    let seen = everything_through_the_proxy("legacy", "http");
    // The default mode sends no probe.
    assert!(seen["probe"].is_null(), "{seen}");
}

#[test]
fn mcp_http_everything_progress_reaches_a_sessionless_2026_era_typescript_client() {
    let seen = everything_ts_client("plain", "http");
    assert_eq!(seen["protocol"], "2026-07-28", "{seen}");
    assert_eq!(
        seen["probe"]["supportedVersions"],
        json!(["2026-07-28"]),
        "{seen}"
    );
    assert_long_operation_with_progress(&seen);
}

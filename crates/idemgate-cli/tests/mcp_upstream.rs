//! `idemgate mcp --upstream-url`: the proxy in front of an MCP server reached over Streamable
//! HTTP, the fixture server (tests/fixtures/mcp_server.py) in its `--http` mode, as a real
//! process; toward the agent stdio (raw frames) and Streamable HTTP (`--listen`, the official
//! Python SDK client). The fixture logs every execution, so counts are checked on its side.

use std::fs;
use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::cli::Sandbox;
use crate::mcp::{text, verdict, wait_for, Proxy, Reaped};
use crate::mcp_http::{assert_fixture_scenario, replayed};

/// Generous: a loaded machine with two cores runs many Python and proxy processes at once.
const DEADLINE: Duration = Duration::from_secs(60);

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/mcp_server.py");
/// The token the proxy sends upstream, from its environment (never from its command line).
const UP_TOKEN: &str = "up-token-1";

/// The fixture serving Streamable HTTP on a free loopback port.
struct Upstream {
    /// Held so that the fixture dies with this value.
    _child: Reaped,
    url: String,
}

impl Sandbox {
    fn upstream(&self) -> Upstream {
        self.upstream_serving(&["--http"])
    }

    /// The fixture started with `args` (`--http`, or `--http --modern` for a 2026-07-28-only
    /// server).
    fn upstream_serving(&self, args: &[&str]) -> Upstream {
        let mut child = Command::new("python3")
            .arg(FIXTURE)
            .args(args)
            .env("FIXTURE_LOG", self.path("executed"))
            .env("FIXTURE_RELEASE", self.path("release"))
            .env("FIXTURE_NOTES", self.path("notes"))
            .env("FIXTURE_HEADERS", self.path("headers"))
            .env("FIXTURE_FORGET", self.path("forget"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let _ = tx.send(line);
            }
        });
        let mut up = Upstream {
            _child: Reaped(child),
            url: String::new(),
        };
        let line = rx
            .recv_timeout(DEADLINE)
            .expect("the HTTP fixture printed its URL");
        let at = line.find("http://").unwrap_or_else(|| panic!("{line}"));
        up.url = line[at..].trim().to_owned();
        up
    }

    /// `idemgate mcp --upstream-url` on stdio, its token for the upstream in its environment.
    fn upstream_proxy(&self, url: &str, config: &str) -> Proxy {
        let cfg = self.path("mcp.toml");
        fs::write(&cfg, config).unwrap();
        let mut command = self.idemgate();
        command
            // Everything idemgate and its HTTP client log, to check that no token is among it.
            .env("IDEMGATE_LOG", "trace")
            .env("UP_TOKEN", UP_TOKEN)
            .args(["mcp", "--config"])
            .arg(&cfg)
            .args(["--upstream-url", url])
            .args(["--upstream-header", "Authorization: Bearer ${UP_TOKEN}"]);
        Proxy::spawn(command, self)
    }

    fn lines_of(&self, name: &str) -> Vec<String> {
        fs::read_to_string(self.path(name))
            .map(|s| s.lines().map(str::to_owned).collect())
            .unwrap_or_default()
    }
}

fn call_frame(id: u64, tool: &str, key: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": tool, "arguments": {}, "_meta": {"dev.idemgate/idempotency-key": key}}})
}

#[test]
fn mcp_upstream_url_replays_a_write_resent_after_a_client_timeout() {
    let sb = Sandbox::new();
    let up = sb.upstream();
    let mut p = sb.upstream_proxy(&up.url, "trusted = true\n");
    let init = p.initialize();
    assert_eq!(init["result"]["serverInfo"]["name"], "fixture", "{init}");
    // The first attempt is still running when the client gives up on it and sends it again.
    p.send(&call_frame(10, "slow", "slow-1"));
    wait_for("the slow call to start", || !sb.executed().is_empty());
    p.send(&call_frame(11, "slow", "slow-1"));
    fs::write(sb.path("release"), "").unwrap();
    let mut answers = std::collections::HashMap::new();
    while answers.len() < 2 {
        let v: Value = serde_json::from_str(&p.line()).unwrap();
        if v.get("method").is_none() {
            answers.insert(v["id"].as_u64().unwrap(), v);
        }
    }
    assert_eq!(text(&answers[&10], 0), "slow done", "{answers:?}");
    let second = &answers[&11];
    assert!(
        replayed(&second["result"]) || verdict(second) == "in_flight",
        "{second}"
    );
    let again = p.call("slow", json!({}), Some("slow-1"));
    assert!(replayed(&again["result"]), "{again}");
    assert_eq!(text(&again, 0), "slow done", "{again}");
    // Reads pass, each to the server; the write ran once.
    for _ in 0..2 {
        let read = p.call("read", json!({}), None);
        assert_eq!(text(&read, 0), "lines 1", "{read}");
        assert!(!replayed(&read["result"]), "{read}");
    }
    assert_eq!(sb.executed(), ["slow started"]);
    // The agent hangs up: the proxy ends the upstream session and exits cleanly.
    drop(p.stdin.take());
    assert_eq!(p.wait_exit(), Some(0));
    assert_eq!(
        sb.lines_of("notes"),
        ["notifications/initialized", "DELETE"]
    );
    // Every request carried the header (its value from the environment) and, after
    // initialize, the agreed protocol version.
    let headers = sb.lines_of("headers");
    assert!(headers.len() >= 6, "{headers:?}");
    for (i, h) in headers.iter().enumerate() {
        assert!(h.contains(&format!("auth=Bearer {UP_TOKEN} ")), "{h}");
        if i > 0 {
            assert!(h.ends_with("version=2025-11-25"), "{h}");
        }
    }
    let stderr = fs::read_to_string(sb.path("stderr")).unwrap_or_default();
    assert!(!stderr.contains(UP_TOKEN), "the token was logged: {stderr}");
}

/// The modern envelope of a request's `_meta`.
fn envelope() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {},
    })
}

#[test]
fn mcp_upstream_url_a_2025_era_client_reaches_a_2026_only_server() {
    let sb = Sandbox::new();
    let up = sb.upstream_serving(&["--http", "--modern"]);
    let mut p = sb.upstream_proxy(&up.url, "");
    // The server refuses initialize (HTTP 400); the proxy answers it from server/discover.
    let init = p.initialize();
    assert_eq!(init["result"]["protocolVersion"], "2025-11-25", "{init}");
    assert_eq!(
        init["result"]["serverInfo"]["name"], "fixture-2026-http",
        "{init}"
    );
    let first = p.call("count", json!({"label": "a"}), Some("k-1"));
    assert_eq!(text(&first, 0), "counted 1", "{first}");
    let again = p.call("count", json!({"label": "a"}), Some("k-1"));
    assert!(replayed(&again["result"]), "{again}");
    assert_eq!(sb.executed(), ["count a"]);
    let listed = p.request("tools/list", json!({}));
    assert!(listed["result"]["tools"].is_array(), "{listed}");
    // A tool whose input schema declares a parameter's header ("x-mcp-header"): the server
    // refuses a call without it, so these run only because the proxy mirrors the argument.
    for (region, key) in [("eu-west-1", "r-1"), ("Zürich", "r-2")] {
        let routed = p.call("regional", json!({ "region": region }), Some(key));
        assert_eq!(text(&routed, 0), format!("routed to {region}"), "{routed}");
    }
    assert_eq!(
        sb.executed(),
        ["count a", "regional eu-west-1", "regional Zürich"]
    );
    drop(p.stdin.take());
    assert_eq!(p.wait_exit(), Some(0));
    // After the refused initialize, every request went with the envelope the proxy added and
    // the headers that mirror it (the server refuses a request without them, -32020); the call
    // reached the server once, with the tool's name.
    let headers = sb.lines_of("headers");
    assert_eq!(
        headers[0], "POST version=None method=None name=None",
        "{headers:?}"
    );
    for h in &headers[1..] {
        assert!(
            h.starts_with("POST version=2026-07-28 method="),
            "{headers:?}"
        );
    }
    let calls: Vec<_> = headers
        .iter()
        .filter(|h| h.contains("method=tools/call"))
        .collect();
    assert_eq!(
        calls,
        [
            "POST version=2026-07-28 method=tools/call name=count",
            "POST version=2026-07-28 method=tools/call name=regional region=eu-west-1",
            // Not ASCII: base64 of the UTF-8, in the specification's wrapper.
            "POST version=2026-07-28 method=tools/call name=regional region==?base64?WsO8cmljaA==?=",
        ],
        "{headers:?}"
    );
}

/// A 2026-era client (raw frames with the envelope) through a proxy in front of `up`: it
/// discovers the server, and a write with its key runs once and is replayed.
fn modern_client_writes_once(sb: &Sandbox, up: &Upstream, label: &str) {
    let mut p = sb.upstream_proxy(&up.url, "");
    let discovered = p.request("server/discover", json!({"_meta": envelope()}));
    assert_eq!(
        discovered["result"]["supportedVersions"],
        json!(["2026-07-28"]),
        "{discovered}"
    );
    let mut meta = envelope();
    meta["dev.idemgate/idempotency-key"] = json!(format!("key-{label}"));
    let params = json!({"name": "count", "arguments": {"label": label}, "_meta": meta});
    let first = p.request("tools/call", params.clone());
    assert_eq!(text(&first, 0), "counted 1", "{first}");
    assert_eq!(first["result"]["resultType"], "complete", "{first}");
    let again = p.request("tools/call", params);
    assert!(replayed(&again["result"]), "{again}");
    assert_eq!(sb.executed(), [format!("count {label}")]);
}

#[test]
fn mcp_upstream_url_a_2026_era_client_reaches_a_2026_only_server() {
    let sb = Sandbox::new();
    let up = sb.upstream_serving(&["--http", "--modern"]);
    modern_client_writes_once(&sb, &up, "m");
    let headers = sb.lines_of("headers");
    assert!(
        headers
            .iter()
            .all(|h| h.starts_with("POST version=2026-07-28 method=")),
        "{headers:?}"
    );
}

#[test]
fn mcp_upstream_url_a_2026_era_client_reaches_a_2025_era_server() {
    // The proxy opens a legacy session for the modern client; its requests keep their envelope
    // but go under the version that session agreed: the server refuses any other (HTTP 400).
    let sb = Sandbox::new();
    let up = sb.upstream();
    modern_client_writes_once(&sb, &up, "l");
    // The probe (the client's server/discover, refused), the proxy's initialize, then every
    // request under the agreed version.
    let headers = sb.lines_of("headers");
    assert!(headers.len() >= 4, "{headers:?}");
    assert!(headers[0].ends_with("version=2026-07-28"), "{headers:?}");
    assert!(headers[1].ends_with("version=None"), "{headers:?}");
    for h in &headers[2..] {
        assert!(h.ends_with("version=2025-11-25"), "{headers:?}");
    }
}

#[test]
fn mcp_upstream_url_resumes_a_stream_the_server_ended_before_its_answer() {
    let sb = Sandbox::new();
    let up = sb.upstream();
    let mut p = sb.upstream_proxy(&up.url, "");
    p.initialize();
    // The server ends the call's stream after a priming event: the answer comes on a GET with
    // Last-Event-ID, and it is a result, stored, not an unknown outcome.
    let first = p.call("poll", json!({}), Some("p-1"));
    assert_eq!(text(&first, 0), "polled", "{first}");
    let again = p.call("poll", json!({}), Some("p-1"));
    assert!(replayed(&again["result"]), "{again}");
    assert_eq!(sb.executed(), ["poll"]);
    assert!(
        sb.lines_of("headers").iter().any(|h| h.starts_with("GET ")),
        "the stream was resumed with a GET"
    );
}

#[test]
fn mcp_upstream_url_racing_duplicates_execute_once() {
    let _heavy = crate::heavy();
    let sb = Sandbox::new();
    let up = sb.upstream();
    let config = "[tools.count]\nwait = \"60s\"\n";
    let mut proxies: Vec<Proxy> = (0..16)
        .map(|_| sb.upstream_proxy(&up.url, config))
        .collect();
    for p in &mut proxies {
        p.initialize();
    }
    let call = json!({"jsonrpc": "2.0", "id": 500, "method": "tools/call", "params": {"name": "count", "arguments": {"label": "race"}, "_meta": {"dev.idemgate/idempotency-key": "race-1"}}});
    for p in &mut proxies {
        p.send(&call);
    }
    let mut replays = 0;
    for p in &mut proxies {
        let r: Value = serde_json::from_str(&p.response_line(500)).unwrap();
        assert_eq!(text(&r, 0), "counted 1", "{r}");
        if replayed(&r["result"]) {
            replays += 1;
        }
    }
    assert_eq!(replays, 15);
    assert_eq!(sb.executed(), ["count race"]);
}

#[test]
fn mcp_upstream_url_going_away_mid_call_is_unknown_and_never_rerun() {
    let sb = Sandbox::new();
    let up = sb.upstream();
    // The server comes back at another port: its records follow its configured name.
    let config = "server_name = \"fixture\"\n";
    let mut p = sb.upstream_proxy(&up.url, config);
    p.initialize();
    // The server process exits in the middle of the call: the connection breaks.
    let crashed = p.call("crash", json!({}), Some("c-1"));
    assert_eq!(verdict(&crashed), "unknown", "{crashed}");
    assert!(
        text(&crashed, 0).contains("will not send it again"),
        "{crashed}"
    );
    assert_eq!(
        p.wait_exit(),
        Some(1),
        "the upstream is gone: the proxy exits"
    );
    drop(up);
    // A new server at a new address, the same records: the retry is unknown, never re-run.
    let up = sb.upstream();
    let mut p = sb.upstream_proxy(&up.url, config);
    p.initialize();
    let retry = p.call("crash", json!({}), Some("c-1"));
    assert_eq!(verdict(&retry), "unknown", "{retry}");
    assert_eq!(sb.executed(), ["crash"]);
}

#[test]
fn mcp_upstream_url_a_5xx_after_the_call_was_sent_is_unknown_and_never_rerun() {
    let sb = Sandbox::new();
    let up = sb.upstream();
    let mut p = sb.upstream_proxy(&up.url, "");
    p.initialize();
    let first = p.call("http500", json!({}), Some("h-1"));
    assert_eq!(verdict(&first), "unknown", "{first}");
    assert_eq!(p.wait_exit(), Some(1), "the upstream counts as gone");
    let stderr = fs::read_to_string(sb.path("stderr")).unwrap_or_default();
    assert!(stderr.contains("HTTP 500"), "{stderr}");
    let mut p = sb.upstream_proxy(&up.url, "");
    p.initialize();
    let retry = p.call("http500", json!({}), Some("h-1"));
    assert_eq!(verdict(&retry), "unknown", "{retry}");
    assert_eq!(sb.executed(), ["http500"]);
}

#[test]
fn mcp_upstream_url_a_refused_request_gets_an_error_and_the_session_goes_on() {
    let sb = Sandbox::new();
    let up = sb.upstream();
    let mut p = sb.upstream_proxy(&up.url, "");
    p.initialize();
    // A 4xx is an answer of the server's: relayed as a JSON-RPC error naming the status, which
    // (as every JSON-RPC error to a write) leaves the outcome unknown; the session goes on.
    let first = p.call("http400", json!({}), Some("r-1"));
    let message = first["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("HTTP 400"), "{first}");
    let again = p.call("http400", json!({}), Some("r-1"));
    assert_eq!(verdict(&again), "unknown", "{again}");
    let counted = p.call("count", json!({}), Some("r-2"));
    assert_eq!(text(&counted, 0), "counted 1", "{counted}");
    assert_eq!(sb.executed(), ["count "]);
}

#[test]
fn mcp_upstream_url_an_expired_session_is_started_again_and_the_call_runs_once() {
    let sb = Sandbox::new();
    let up = sb.upstream();
    let mut p = sb.upstream_proxy(&up.url, "");
    p.initialize();
    // Listed first: the 404 meets the call itself, not the proxy's own listing before it.
    let listing = p.request("tools/list", json!({}));
    assert!(listing["result"]["tools"].is_array(), "{listing}");
    // The server forgets every session, as one that restarted: the call gets 404, which says
    // it was not processed. The proxy starts a new session (as the transport has a client do)
    // and sends the call once more: it runs once, and its result is stored.
    fs::write(sb.path("forget"), "").unwrap();
    let call = p.call("count", json!({"label": "after"}), Some("x-1"));
    assert_eq!(text(&call, 0), "counted 1", "{call}");
    assert!(!replayed(&call["result"]), "{call}");
    let again = p.call("count", json!({"label": "after"}), Some("x-1"));
    assert!(replayed(&again["result"]), "{again}");
    assert_eq!(sb.executed(), ["count after"]);
    // The new session was initialized as the first one was, and the session goes on.
    assert_eq!(
        sb.lines_of("notes"),
        ["notifications/initialized", "notifications/initialized"]
    );
    let read = p.request("tools/list", json!({}));
    assert!(read["result"]["tools"].is_array(), "{read}");
    let stderr = fs::read_to_string(sb.path("stderr")).unwrap_or_default();
    assert!(stderr.contains("started a new one"), "{stderr}");
    drop(p.stdin.take());
    assert_eq!(p.wait_exit(), Some(0));
}

#[test]
fn mcp_upstream_url_an_upstream_that_is_not_there_runs_nothing() {
    let sb = Sandbox::new();
    let up = sb.upstream();
    let url = up.url.clone();
    drop(up);
    let mut p = sb.upstream_proxy(&url, "");
    p.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}));
    assert_eq!(p.wait_exit(), Some(1));
    let stderr = fs::read_to_string(sb.path("stderr")).unwrap_or_default();
    assert!(stderr.contains("could not be reached"), "{stderr}");
    assert!(sb.executed().is_empty());
}

#[test]
fn mcp_upstream_url_and_a_command_exclude_each_other() {
    let sb = Sandbox::new();
    let out = sb
        .idemgate()
        .args([
            "mcp",
            "--upstream-url",
            "http://127.0.0.1:9/mcp",
            "--",
            "python3",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--upstream-url") && err.contains("cannot be used with"),
        "{err}"
    );
    let out = sb.idemgate().arg("mcp").output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--upstream-url URL"), "{err}");
}

/// Both fronts at once: Streamable HTTP toward the official Python SDK client, Streamable HTTP
/// toward the fixture, one upstream session per agent session.
#[test]
fn mcp_listen_upstream_url_python_sdk_retry_races_and_server_requests() {
    let _heavy = crate::heavy();
    let sb = Sandbox::new();
    let up = sb.upstream();
    let p = sb.listen_with(
        "trusted = true\n",
        &[
            "--upstream-url",
            &up.url,
            "--upstream-header",
            "X-Upstream-Test: yes",
        ],
    );
    let seen = p.python(&sb, "fixture", "", &sb.path("release"));
    // The server's elicitation came on its SSE answer, through both hops.
    assert_fixture_scenario(&sb, &seen);
    // Each agent session had its own upstream session, and each was ended with DELETE.
    wait_for("both upstream sessions to end", || {
        sb.lines_of("notes")
            .iter()
            .filter(|l| *l == "DELETE")
            .count()
            == 2
    });
}

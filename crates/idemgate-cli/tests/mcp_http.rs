//! `idemgate mcp --listen`: the MCP proxy over Streamable HTTP, a real proxy process in front of
//! the fixture server (tests/fixtures/mcp_server.py) and @modelcontextprotocol/server-memory,
//! driven by the official Python SDK client (tests/fixtures/mcp_http_client.py) and, for the
//! HTTP rules (tokens, tenants, Origin, SSE streams cut and resumed), by raw HTTP/1.1 requests.

use std::fs;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::cli::Sandbox;
use crate::mcp::{mcp_deps, Reaped};

/// Generous: a loaded machine with two cores runs many Python and proxy processes at once.
const DEADLINE: Duration = Duration::from_secs(60);

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/mcp_server.py");
/// Tokens of two tenants and their SHA-256 (`idemgate token hash`).
const TOKEN_A: &str = "token-of-a";
const TOKEN_B: &str = "token-of-b";

fn sha256(token: &str) -> String {
    idemgate_http::token_sha256(token)
}

fn tenants() -> String {
    format!(
        "[[tenants]]\nid = \"a\"\ntoken_sha256 = \"{}\"\n[[tenants]]\nid = \"b\"\ntoken_sha256 = \"{}\"\n",
        sha256(TOKEN_A),
        sha256(TOKEN_B)
    )
}

/// A proxy listening on a free loopback port.
pub(crate) struct Listening {
    child: Reaped,
    /// `http://127.0.0.1:PORT/mcp`.
    pub(crate) url: String,
    /// `127.0.0.1:PORT`.
    pub(crate) addr: String,
    stderr: PathBuf,
}

impl Sandbox {
    pub(crate) fn listen(&self, config: &str, server: &[&str]) -> Listening {
        let mut args = vec!["--"];
        args.extend_from_slice(server);
        self.listen_with(config, &args)
    }

    /// A proxy listening on a free loopback port, with `args` after its `--config`.
    pub(crate) fn listen_with(&self, config: &str, args: &[&str]) -> Listening {
        self.listen_at("127.0.0.1:0", config, args)
    }

    /// A proxy listening on `addr`, with `args` after its `--config`.
    pub(crate) fn listen_at(&self, addr: &str, config: &str, args: &[&str]) -> Listening {
        let cfg = self.path("mcp.toml");
        fs::write(&cfg, config).unwrap();
        let stderr = self.path("stderr");
        let child = self
            .idemgate()
            .env("IDEMGATE_LOG", "warn")
            .env("FIXTURE_LOG", self.path("executed"))
            .env("FIXTURE_RELEASE", self.path("release"))
            .env("MEMORY_FILE_PATH", self.path("memory.jsonl"))
            .args(["mcp", "--listen", addr, "--config"])
            .arg(&cfg)
            .args(args)
            .stdout(Stdio::null())
            .stderr(fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        let mut p = Listening {
            child: Reaped(child),
            url: String::new(),
            addr: String::new(),
            stderr,
        };
        let start = Instant::now();
        loop {
            let text = fs::read_to_string(&p.stderr).unwrap_or_default();
            // Only a whole line: one read may land while the proxy is still writing it.
            let announced = text
                .split_inclusive('\n')
                .filter(|line| line.ends_with('\n'))
                .find_map(|line| line.split_once("endpoint at http://"));
            if let Some((_, rest)) = announced {
                let addr = rest.trim_end().trim_end_matches("/mcp");
                assert!(
                    addr.parse::<std::net::SocketAddr>().is_ok(),
                    "the proxy announced no address: {text}"
                );
                p.addr = addr.to_owned();
                p.url = format!("http://{addr}/mcp");
                return p;
            }
            if let Some(status) = p.child.try_wait().unwrap() {
                panic!("the proxy exited ({status}) before listening: {text}");
            }
            assert!(
                start.elapsed() < DEADLINE,
                "the proxy never listened: {text}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Listening {
    /// Runs the Python SDK client in `mode`; what it saw.
    pub(crate) fn python(
        &self,
        sb: &Sandbox,
        mode: &str,
        token: &str,
        release: &std::path::Path,
    ) -> Value {
        self.python_in(sb, "2025", mode, token, release)
    }

    /// [`Listening::python`] with the client in `era` ("2025": sessions; "2026": sessionless).
    pub(crate) fn python_in(
        &self,
        sb: &Sandbox,
        era: &str,
        mode: &str,
        token: &str,
        release: &std::path::Path,
    ) -> Value {
        let mut client = sb.python_client("mcp_http_client.py");
        client
            .args([mode, &self.url, token])
            .arg(release)
            .env("MCP_ERA", era);
        sb.client_saw(client)
    }

    /// Sends one HTTP/1.1 request on a connection of its own; the connection.
    fn send(&self, method: &str, headers: &[(&str, &str)], body: &str) -> TcpStream {
        send_to(&self.addr, method, "/mcp", headers, body)
    }

    /// One HTTP/1.1 request on a connection of its own; status, headers (lower-case names) and
    /// body.
    pub(crate) fn http(&self, method: &str, headers: &[(&str, &str)], body: &str) -> Answer {
        http_to(&self.addr, method, "/mcp", headers, body)
    }

    /// `initialize` and `notifications/initialized` as `token`'s tenant; the session id.
    pub(crate) fn session(&self, token: &str) -> String {
        self.session_with(&[("authorization", &format!("Bearer {token}"))])
    }

    /// `initialize` and `notifications/initialized` on a proxy without tenants; the session id.
    pub(crate) fn session_open(&self) -> String {
        self.session_with(&[])
    }

    fn session_with(&self, auth: &[(&str, &str)]) -> String {
        let init = self.http(
            "POST",
            auth,
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#,
        );
        assert_eq!(init.status, 200, "{}", init.body);
        let sid = init.header("mcp-session-id").to_owned();
        let mut headers = auth.to_vec();
        headers.push(("mcp-session-id", &sid));
        let note = self.http(
            "POST",
            &headers,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        );
        assert_eq!(note.status, 202, "{}", note.body);
        sid
    }
}

/// Sends one HTTP/1.1 request to `addr` on a connection of its own; the connection.
pub(crate) fn send_to(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(DEADLINE)).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    if !body.is_empty() {
        req.push_str("content-type: application/json\r\n");
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    s
}

/// One HTTP/1.1 request to `addr` on a connection of its own; status, headers (lower-case
/// names) and body.
pub(crate) fn http_to(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let mut s = send_to(addr, method, path, headers, body);
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    Answer::parse(&raw)
}

pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: String,
}

impl Answer {
    /// A whole HTTP/1.1 response as read from its connection.
    pub(crate) fn parse(raw: &str) -> Answer {
        let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((raw, ""));
        let mut lines = head.lines();
        let status = lines.next().unwrap()[9..12].parse().unwrap();
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        Answer {
            status,
            headers,
            body: body.to_owned(),
        }
    }

    pub(crate) fn header(&self, name: &str) -> &str {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map_or("", |(_, v)| v.as_str())
    }

    pub(crate) fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    /// The response to request `id`: the body itself, or the SSE event that carries it.
    pub(crate) fn message(&self, id: u64) -> Value {
        if self.header("content-type").starts_with("text/event-stream") {
            return sse_messages(&self.body)
                .into_iter()
                .find(|m| m["id"] == json!(id) && m.get("method").is_none())
                .unwrap_or_else(|| panic!("no response to {id} in {}", self.body));
        }
        self.json()
    }
}

/// An answer read as it comes, for SSE: its status and headers at once, then its body's events
/// one at a time. Dropping it hangs up.
struct Streaming {
    status: u16,
    headers: Vec<(String, String)>,
    reader: BufReader<TcpStream>,
    /// Whether the body comes in chunks (HTTP/1.1 without a length: every stream).
    chunked: bool,
    /// Body text read but not taken yet.
    text: String,
    /// The body has ended.
    done: bool,
}

/// One SSE event.
#[derive(Debug, Clone, PartialEq)]
struct Sse {
    id: Option<String>,
    retry: Option<u64>,
    /// Its `data:` lines joined, `None` without any.
    data: Option<String>,
}

impl Sse {
    fn json(&self) -> Value {
        let data = self.data.as_deref().unwrap_or_default();
        serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}: {self:?}"))
    }

    fn id(&self) -> &str {
        self.id
            .as_deref()
            .unwrap_or_else(|| panic!("no id: {self:?}"))
    }
}

impl Listening {
    /// One HTTP/1.1 request on a connection of its own, its answer read as it comes.
    fn stream(&self, method: &str, headers: &[(&str, &str)], body: &str) -> Streaming {
        let mut reader = BufReader::new(self.send(method, headers, body));
        let mut status = String::new();
        reader.read_line(&mut status).unwrap();
        let status = status[9..12].parse().unwrap();
        let mut headers = Vec::new();
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            let Some((k, v)) = line.trim_end().split_once(':') else {
                break;
            };
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
        }
        let chunked = headers
            .iter()
            .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
        Streaming {
            status,
            headers,
            reader,
            chunked,
            text: String::new(),
            done: false,
        }
    }
}

impl Streaming {
    fn header(&self, name: &str) -> &str {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map_or("", |(_, v)| v.as_str())
    }

    /// Reads more of the body; false at its end.
    fn fill(&mut self) -> bool {
        if self.done {
            return false;
        }
        if !self.chunked {
            let mut rest = String::new();
            self.reader.read_to_string(&mut rest).unwrap();
            self.text.push_str(&rest);
            self.done = true;
            return !rest.is_empty();
        }
        let mut size = String::new();
        self.reader.read_line(&mut size).unwrap();
        let size = usize::from_str_radix(size.trim(), 16)
            .unwrap_or_else(|e| panic!("a chunk size, not {size:?}: {e}"));
        let mut chunk = vec![0; size + 2];
        self.reader.read_exact(&mut chunk).unwrap();
        chunk.truncate(size);
        self.text.push_str(&String::from_utf8(chunk).unwrap());
        if size == 0 {
            self.done = true;
        }
        size > 0
    }

    /// The next event (comments skipped); `None` when the stream ends.
    fn event(&mut self) -> Option<Sse> {
        loop {
            if let Some(end) = self.text.find("\n\n") {
                let block: String = self.text.drain(..end + 2).collect();
                let mut event = Sse {
                    id: None,
                    retry: None,
                    data: None,
                };
                let mut fields = false;
                for line in block.lines().filter(|l| !l.starts_with(':')) {
                    let (name, value) = line.split_once(':').unwrap_or((line, ""));
                    let value = value.strip_prefix(' ').unwrap_or(value).to_owned();
                    fields = true;
                    match name {
                        "id" => event.id = Some(value),
                        "retry" => event.retry = Some(value.parse().unwrap()),
                        "data" => {
                            event.data = Some(match event.data.take() {
                                Some(d) => format!("{d}\n{value}"),
                                None => value,
                            });
                        }
                        _ => {}
                    }
                }
                if fields {
                    return Some(event);
                }
                continue;
            }
            if !self.fill() {
                assert!(self.text.trim().is_empty(), "a cut event: {:?}", self.text);
                return None;
            }
        }
    }

    /// The rest of the body, for an answer that is not a stream.
    fn rest(mut self) -> String {
        while self.fill() {}
        self.text
    }
}

pub(crate) fn replayed(result: &Value) -> bool {
    result["_meta"]["dev.idemgate/replayed"] == json!(true)
}

#[test]
fn mcp_http_python_sdk_drives_the_memory_server() {
    let seen = memory_over_http("2025");
    assert_eq!(seen["protocol"], "2025-11-25", "{seen}");
}

#[test]
fn mcp_http_python_sdk_drives_the_memory_server_sessionless_in_the_2026_era() {
    // No session: every request a POST of its own with the 2026-07-28 envelope, to the child
    // the tenant's sessionless requests share, which the proxy initialized (server-memory speaks
    // only the 2025 era); the 16 racers each come on a connection of their own.
    let seen = memory_over_http("2026");
    assert_eq!(seen["protocol"], "2026-07-28", "{seen}");
    assert_eq!(seen["again"]["resultType"], "complete", "{seen}");
}

/// The Python SDK client's memory scenario through `idemgate mcp --listen` in `era`, checked: a
/// re-sent write replays, 16 racing duplicates run once, reads pass; what it saw.
fn memory_over_http(era: &str) -> Value {
    let deps = mcp_deps();
    let sb = Sandbox::new();
    let server = deps.join("node/node_modules/.bin/mcp-server-memory");
    let p = sb.listen(
        "[tools.read_graph]\nkind = \"read\"\n",
        &[server.to_str().unwrap()],
    );
    let seen = p.python_in(&sb, era, "memory", "", &sb.path("unused"));
    crate::mcp::assert_memory_write_replayed(&seen);
    // 16 racing duplicates: one ran (server-memory answers [] when the entity exists already,
    // so every answer naming the entity is the one execution's).
    let racing = seen["racing"].as_array().unwrap();
    assert_eq!(racing.len(), 16);
    assert_eq!(racing.iter().filter(|r| !replayed(r)).count(), 1, "{seen}");
    for r in racing {
        assert_eq!(r["content"][0], racing[0]["content"][0], "{seen}");
        assert!(
            r["content"][0]["text"]
                .as_str()
                .unwrap()
                .contains("ticket-43"),
            "{seen}"
        );
    }
    // Reads pass without a key, each to the server, never replayed.
    for graph in seen["graph"].as_array().unwrap() {
        assert!(!replayed(graph), "{seen}");
        let text = graph["content"][0]["text"].as_str().unwrap();
        assert_eq!(text.matches("printer on fire").count(), 1, "{text}");
        assert_eq!(text.matches("paper jam").count(), 1, "{text}");
    }
    seen
}

#[test]
fn mcp_http_python_sdk_retry_after_timeout_races_and_server_requests() {
    let _heavy = crate::heavy();
    let sb = Sandbox::new();
    let p = sb.listen(
        &format!("trusted = true\n{}", tenants()),
        &["python3", FIXTURE],
    );
    let seen = p.python(&sb, "fixture", TOKEN_A, &sb.path("release"));
    assert_fixture_scenario(&sb, &seen);
}

/// What the Python SDK client's fixture scenario (`mcp_http_client.py fixture`) must have seen
/// through a proxy in front of the fixture server, whichever way the proxy reaches it.
pub(crate) fn assert_fixture_scenario(sb: &Sandbox, seen: &Value) {
    // The client gave up after 1 s; the retry with the same key got the stored result.
    assert_ne!(seen["timed_out"], json!(false), "{seen}");
    assert_eq!(seen["retry"]["content"][0]["text"], "slow done", "{seen}");
    assert!(replayed(&seen["retry"]), "{seen}");
    // 16 racing duplicates: one execution.
    let racing = seen["racing"].as_array().unwrap();
    assert_eq!(racing.len(), 16);
    assert_eq!(racing.iter().filter(|r| !replayed(r)).count(), 1, "{seen}");
    assert!(racing
        .iter()
        .all(|r| r["content"][0] == racing[0]["content"][0]));
    assert_eq!(
        sb.executed(),
        ["slow started", "count race"],
        "the server ran each action once"
    );
    // The server's elicitation reached the client, and its answer the server.
    let asked = seen["asked"]["content"][0]["text"].as_str().unwrap();
    assert!(
        asked.contains("client said") && asked.contains("\"ok\": true"),
        "{seen}"
    );
    // Reads (trusted readOnlyHint) pass without a key, and are never stored.
    for r in seen["read"].as_array().unwrap() {
        assert_eq!(r["content"][0]["text"], "lines 2", "{seen}");
        assert!(!replayed(r), "{seen}");
    }
    // Unknown fields survive in both directions' answers; DELETE ends the session.
    let raw = &seen["raw"];
    assert_eq!(raw["initialize"]["result"]["x-fixture"], true, "{raw}");
    assert_eq!(
        raw["listing"]["result"]["tools"][0]["x-fixture-unknown"],
        json!({"kept": [1, 2, 3]}),
        "{raw}"
    );
    assert_eq!(raw["deleted"], 204, "{raw}");
    assert_eq!(raw["after_delete"], 404, "{raw}");
}

#[test]
fn mcp_http_tokens_tenants_and_origin() {
    let sb = Sandbox::new();
    let config = format!(
        "[http]\nallowed_origins = [\"http://localhost:6274\"]\n{}",
        tenants()
    );
    let p = sb.listen(&config, &["python3", FIXTURE]);
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;

    let none = p.http("POST", &[], init);
    assert_eq!(none.status, 401, "{}", none.body);
    assert_eq!(
        none.header("www-authenticate"),
        r#"Bearer realm="idemgate""#
    );
    let bad = p.http("POST", &[("authorization", "Bearer nope")], init);
    assert_eq!(bad.status, 401);
    assert!(bad.header("www-authenticate").contains("invalid_token"));
    let auth_a = format!("Bearer {TOKEN_A}");
    let evil = p.http(
        "POST",
        &[
            ("authorization", &auth_a),
            ("origin", "http://evil.example"),
        ],
        init,
    );
    assert_eq!(evil.status, 403, "{}", evil.body);
    let allowed = p.http(
        "POST",
        &[
            ("authorization", &auth_a),
            ("origin", "http://localhost:6274"),
        ],
        init,
    );
    assert_eq!(allowed.status, 200, "{}", allowed.body);
    // The proxy's own loopback origin (`http://` and the Host it was reached at) needs no
    // listing: only a page from this very address sends it (the conformance suite's
    // dns-rebinding-protection scenario sends it and expects 2xx). Another port is another origin.
    let own = format!("http://{}", p.addr);
    let same = p.http(
        "POST",
        &[("authorization", &auth_a), ("origin", &own)],
        init,
    );
    assert_eq!(same.status, 200, "{}", same.body);
    let other_port = p.http(
        "POST",
        &[("authorization", &auth_a), ("origin", "http://127.0.0.1:1")],
        init,
    );
    assert_eq!(other_port.status, 403, "{}", other_port.body);
    assert_eq!(
        sb.executed(),
        Vec::<String>::new(),
        "refused requests reach no server"
    );

    let sid_a = p.session(TOKEN_A);
    let sid_b = p.session(TOKEN_B);
    let auth_b = format!("Bearer {TOKEN_B}");
    let list = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
    let missing = p.http("POST", &[("authorization", &auth_a)], list);
    assert_eq!(missing.status, 400, "{}", missing.body);
    // Another tenant's session is unknown.
    let stolen = p.http(
        "POST",
        &[("authorization", &auth_b), ("mcp-session-id", &sid_a)],
        list,
    );
    assert_eq!(stolen.status, 404, "{}", stolen.body);

    // The same key and tool of two tenants are two actions; each replays its own.
    let count = r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"count","arguments":{"label":"x"}}}"#;
    let call = |auth: &str, sid: &str| {
        p.http(
            "POST",
            &[
                ("authorization", auth),
                ("mcp-session-id", sid),
                ("idempotency-key", "\"order-1\""),
                ("mcp-protocol-version", "2025-11-25"),
            ],
            count,
        )
    };
    let a1 = call(&auth_a, &sid_a);
    assert_eq!(a1.status, 200, "{}", a1.body);
    assert_eq!(a1.header("content-type"), "application/json");
    let b1 = call(&auth_b, &sid_b);
    let a2 = call(&auth_a, &sid_a);
    assert!(!replayed(&a1.json()["result"]), "{}", a1.body);
    assert!(!replayed(&b1.json()["result"]), "{}", b1.body);
    assert!(replayed(&a2.json()["result"]), "{}", a2.body);
    assert_eq!(
        a2.json()["result"]["content"][0],
        a1.json()["result"]["content"][0]
    );
    assert_eq!(sb.executed(), ["count x", "count x"]);

    // Without any key the write is refused, as on stdio.
    let unkeyed = p.http(
        "POST",
        &[("authorization", &auth_a), ("mcp-session-id", &sid_a)],
        count,
    );
    assert_eq!(
        unkeyed.json()["result"]["_meta"]["dev.idemgate/verdict"],
        "key_required",
        "{}",
        unkeyed.body
    );
    let version = p.http(
        "POST",
        &[
            ("authorization", &auth_a),
            ("mcp-session-id", &sid_a),
            ("mcp-protocol-version", "1999-01-01"),
        ],
        list,
    );
    assert_eq!(version.status, 400, "{}", version.body);
    assert_eq!(sb.executed().len(), 2);
}

#[test]
fn mcp_http_everything_server_requests_reach_a_python_client_in_auto_mode() {
    crate::mcp::everything_through_the_proxy("auto", "http");
}

#[test]
fn mcp_http_everything_progress_reaches_a_sessionless_2026_era_python_client() {
    crate::mcp::everything_progress_in_the_2026_era("http");
}

#[test]
fn mcp_http_everything_server_requests_reach_a_python_client_in_legacy_mode() {
    crate::mcp::everything_through_the_proxy("legacy", "http");
}

#[test]
fn mcp_http_bad_inputs_are_answered_in_json_rpc_and_bad_keys_reach_the_model() {
    let sb = Sandbox::new();
    let p = sb.listen("[http]\nmax_body_bytes = 4096\n", &["python3", FIXTURE]);
    let sid = p.session("");
    let count = r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"count","arguments":{"label":"x"}}}"#;
    let post = |headers: &[(&str, &str)], body: &str| {
        let mut all = vec![("mcp-session-id", sid.as_str())];
        all.extend_from_slice(headers);
        p.http("POST", &all, body)
    };
    // Two Idempotency-Key headers name no one action: refused as the gateway refuses them.
    let two = post(
        &[("idempotency-key", "k-1"), ("idempotency-key", "k-2")],
        count,
    );
    assert_eq!(two.status, 400, "{}", two.body);
    assert_eq!(two.json()["error"]["code"], -32600, "{}", two.body);
    // An invalid key in the header is the call's refusal, which the model reads.
    let long = "k".repeat(300);
    let invalid = post(&[("idempotency-key", &long)], count);
    assert_eq!(invalid.status, 200, "{}", invalid.body);
    let result = &invalid.json()["result"];
    assert_eq!(result["isError"], true, "{}", invalid.body);
    assert_eq!(
        result["_meta"]["dev.idemgate/verdict"], "bad_request",
        "{}",
        invalid.body
    );
    assert!(
        result["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("Idempotency-Key header"),
        "{}",
        invalid.body
    );
    // A header key that differs from the call's own `_meta` key is refused the same way (two
    // keys of the orchestration layer that do not say which action they name).
    let keyed = r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"count","arguments":{"label":"x"},"_meta":{"dev.idemgate/idempotency-key":"k-meta"}}}"#;
    let differ = post(&[("idempotency-key", "k-header")], keyed);
    assert_eq!(
        differ.json()["result"]["_meta"]["dev.idemgate/verdict"],
        "bad_request",
        "{}",
        differ.body
    );
    // A body over max_body_bytes: 413, as a JSON-RPC error.
    let big = format!(
        r#"{{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{{"name":"count","arguments":{{"label":"{}"}}}}}}"#,
        "x".repeat(5000)
    );
    let too_big = post(&[("idempotency-key", "k-big")], &big);
    assert_eq!(too_big.status, 413, "{}", too_big.body);
    assert_eq!(
        too_big.header("content-type"),
        "application/json",
        "{}",
        too_big.body
    );
    assert!(
        too_big.json()["error"]["message"].is_string(),
        "{}",
        too_big.body
    );
    // A tool call without an id is refused, not relayed as a notification.
    let no_id = r#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"count","arguments":{"label":"x"}}}"#;
    let refused = post(&[("idempotency-key", "k-3")], no_id);
    assert_eq!(refused.status, 400, "{}", refused.body);
    assert_eq!(
        sb.executed(),
        Vec::<String>::new(),
        "nothing reached the server"
    );
}

/// The `data:` payloads of an SSE body, as JSON.
fn sse_messages(body: &str) -> Vec<Value> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}")))
        .collect()
}

#[test]
fn mcp_http_sessionless_requests_get_their_own_progress_and_the_logs_they_asked_for() {
    let sb = Sandbox::new();
    let p = sb.listen(
        "server_name = \"fixture\"\n",
        &["env", "FIXTURE_CHATTY=1", "python3", FIXTURE],
    );
    let call = |id: u64, key: &str, meta: Value| {
        let mut m = json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": {},
            "dev.idemgate/idempotency-key": key,
        });
        m.as_object_mut()
            .unwrap()
            .extend(meta.as_object().unwrap().clone());
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "count", "arguments": {"label": key}, "_meta": m}});
        p.http("POST", &[], &body.to_string())
    };
    // Progress for the request's own token, and the log message its level asked for, come on
    // its stream before its answer, under its own id.
    let chatty = call(
        7,
        "k-1",
        json!({"progressToken": "tok-7", "io.modelcontextprotocol/logLevel": "info"}),
    );
    assert_eq!(chatty.status, 200, "{}", chatty.body);
    assert!(
        chatty
            .header("content-type")
            .starts_with("text/event-stream"),
        "{}",
        chatty.body
    );
    let messages = sse_messages(&chatty.body);
    assert_eq!(messages.len(), 3, "{}", chatty.body);
    assert_eq!(
        messages[0]["method"], "notifications/progress",
        "{}",
        chatty.body
    );
    assert_eq!(
        messages[0]["params"]["progressToken"], "tok-7",
        "{}",
        chatty.body
    );
    assert_eq!(
        messages[1]["method"], "notifications/message",
        "{}",
        chatty.body
    );
    assert_eq!(messages[1]["params"]["level"], "warning", "{}", chatty.body);
    assert_eq!(messages[2]["id"], 7, "{}", chatty.body);
    assert_eq!(
        messages[2]["result"]["content"][0]["text"], "counted 1",
        "{}",
        chatty.body
    );
    // A request that asked for errors only, and for no progress, gets its answer alone.
    let quiet = call(
        8,
        "k-2",
        json!({"io.modelcontextprotocol/logLevel": "error"}),
    );
    assert_eq!(quiet.status, 200, "{}", quiet.body);
    assert_eq!(
        quiet.header("content-type"),
        "application/json",
        "{}",
        quiet.body
    );
    assert_eq!(quiet.json()["id"], 8, "{}", quiet.body);
    assert_eq!(sb.executed(), ["count k-1", "count k-2"]);
}

#[test]
fn mcp_http_sessionless_2026_era_requests_keep_tokens_tenants_and_origin() {
    // The fixture speaks only the 2025 era; sessionless requests go to a child per tenant,
    // which the proxy initialized.
    let sb = Sandbox::new();
    let p = sb.listen(&tenants(), &["python3", FIXTURE]);
    let envelope = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    let discover = json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": envelope}}).to_string();
    let modern = [("mcp-protocol-version", "2026-07-28")];
    let auth_a = format!("Bearer {TOKEN_A}");
    let auth_b = format!("Bearer {TOKEN_B}");
    let discover_with = |headers: &[(&str, &str)]| p.http("POST", headers, &discover);

    let none = discover_with(&modern);
    assert_eq!(none.status, 401, "{}", none.body);
    let evil = discover_with(&[
        ("authorization", &auth_a),
        ("origin", "http://evil.example"),
    ]);
    assert_eq!(evil.status, 403, "{}", evil.body);
    let mismatch = discover_with(&[
        ("authorization", &auth_a),
        ("mcp-protocol-version", "2025-11-25"),
    ]);
    assert_eq!(mismatch.status, 400, "{}", mismatch.body);
    assert_eq!(
        mismatch.json()["error"]["code"],
        -32020,
        "{}",
        mismatch.body
    );

    let found = discover_with(&[
        ("authorization", &auth_a),
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "server/discover"),
    ]);
    assert_eq!(found.status, 200, "{}", found.body);
    assert!(
        !found.headers.iter().any(|(k, _)| k == "mcp-session-id"),
        "no session is minted"
    );
    let result = &found.json()["result"];
    assert_eq!(
        result["supportedVersions"],
        json!(["2026-07-28"]),
        "{result}"
    );
    assert_eq!(
        result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
        "fixture"
    );
    assert_eq!(found.json()["id"], 1, "the client's own id comes back");
    // Errors with the statuses of that era: an unknown method 404, a modern error 400.
    let mut unknown =
        json!({"jsonrpc": "2.0", "id": 2, "method": "prompts/list", "params": {"_meta": envelope}});
    let missing = p.http("POST", &[("authorization", &auth_a)], &unknown.to_string());
    assert_eq!(missing.status, 404, "{}", missing.body);
    assert_eq!(missing.json()["error"]["code"], -32601, "{}", missing.body);
    unknown["method"] = json!("server/discover");
    unknown["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = json!("2030-01-01");
    let newer = p.http("POST", &[("authorization", &auth_a)], &unknown.to_string());
    assert_eq!(newer.status, 400, "{}", newer.body);
    assert_eq!(
        newer.json()["error"]["data"]["supported"],
        json!(["2026-07-28"]),
        "{}",
        newer.body
    );

    // The same key and tool of two tenants are two actions, each run once and replayed to its
    // own tenant only.
    let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": "count", "arguments": {"label": "x"},
        "_meta": {"dev.idemgate/idempotency-key": "k", "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                  "io.modelcontextprotocol/clientCapabilities": {}}}}).to_string();
    let send = |auth: &str| {
        let answer = p.http("POST", &[("authorization", auth)], &call);
        assert_eq!(answer.status, 200, "{}", answer.body);
        answer.json()
    };
    let a1 = send(&auth_a);
    assert_eq!(a1["id"], 7);
    assert_eq!(a1["result"]["content"][0]["text"], "counted 1", "{a1}");
    assert_eq!(a1["result"]["resultType"], "complete", "{a1}");
    let b1 = send(&auth_b);
    assert!(!replayed(&b1["result"]), "{b1}");
    let a2 = send(&auth_a);
    assert!(replayed(&a2["result"]), "{a2}");
    assert_eq!(a2["result"]["content"][0], a1["result"]["content"][0]);
    // Mcp-Name, when sent, must name the body's tool (its value may come base64-wrapped).
    let named = |name: &str| {
        p.http(
            "POST",
            &[("authorization", &auth_a), ("mcp-name", name)],
            &call,
        )
    };
    let other = named("other");
    assert_eq!(other.status, 400, "{}", other.body);
    assert_eq!(other.json()["error"]["code"], -32020, "{}", other.body);
    let wrapped = named("=?base64?Y291bnQ=?=");
    assert_eq!(wrapped.status, 200, "{}", wrapped.body);
    assert!(replayed(&wrapped.json()["result"]), "{}", wrapped.body);
    assert_eq!(sb.executed(), ["count x", "count x"]);

    // A tool whose input schema declares a parameter's header ("x-mcp-header"): once the
    // tenant's listing showed it, a call must carry the header, equal to the argument.
    let mut cursor: Option<String> = None;
    loop {
        let mut params = json!({"_meta": envelope});
        if let Some(c) = &cursor {
            params["cursor"] = json!(c);
        }
        let list = json!({"jsonrpc": "2.0", "id": 8, "method": "tools/list", "params": params});
        let page = p.http("POST", &[("authorization", &auth_a)], &list.to_string());
        assert_eq!(page.status, 200, "{}", page.body);
        cursor = page.json()["result"]["nextCursor"]
            .as_str()
            .map(str::to_owned);
        if cursor.is_none() {
            break;
        }
    }
    let mut meta = envelope.clone();
    meta["dev.idemgate/idempotency-key"] = json!("reg-1");
    let regional = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {
        "name": "regional", "arguments": {"region": "eu-west-1"}, "_meta": meta}})
    .to_string();
    let routed = |header: Option<&str>| {
        let mut headers = vec![("authorization", auth_a.as_str())];
        headers.extend(header.map(|h| ("mcp-param-region", h)));
        p.http("POST", &headers, &regional)
    };
    for refused in [routed(None), routed(Some("us-east-1"))] {
        assert_eq!(refused.status, 400, "{}", refused.body);
        assert_eq!(refused.json()["error"]["code"], -32020, "{}", refused.body);
        assert!(
            refused.body.contains("mcp-param-region"),
            "{}",
            refused.body
        );
    }
    let ran = routed(Some("eu-west-1"));
    assert_eq!(ran.status, 200, "{}", ran.body);
    assert_eq!(
        ran.json()["result"]["content"][0]["text"],
        "routed to eu-west-1",
        "{}",
        ran.body
    );
    assert_eq!(sb.executed(), ["count x", "count x", "regional eu-west-1"]);
}

#[test]
fn mcp_http_python_sdk_2025_era_client_reaches_a_2026_only_server() {
    // The fixture in --modern mode refuses initialize and every request without the 2026-07-28
    // envelope; the SDK client speaks 2025-11-25 with a session. The proxy answers initialize
    // from the server's server/discover and adds the envelope to the client's requests.
    let sb = Sandbox::new();
    let p = sb.listen("", &["python3", FIXTURE, "--modern"]);
    let seen = p.python(&sb, "modern", "", &sb.path("unused"));
    assert_eq!(seen["protocol"], "2025-11-25", "{seen}");
    assert_eq!(seen["server"], "fixture-2026", "{seen}");
    assert!(
        seen["tools"].as_array().unwrap().contains(&json!("count")),
        "{seen}"
    );
    assert_eq!(seen["first"]["content"][0]["text"], "counted 1", "{seen}");
    assert!(!replayed(&seen["first"]), "{seen}");
    assert!(replayed(&seen["again"]), "{seen}");
    assert_eq!(sb.executed(), ["count m"]);
}

#[test]
fn mcp_http_refuses_a_non_loopback_address_without_tokens() {
    let sb = Sandbox::new();
    let out = sb.run(&["mcp", "--listen", "0.0.0.0:0", "--", "python3", FIXTURE]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("without authentication"), "{err}");
}

#[test]
fn mcp_http_sigterm_lets_a_write_in_flight_finish_and_records_it() {
    let sb = Sandbox::new();
    let mut p = sb.listen("", &["python3", FIXTURE]);
    let sid = p.session("unused");
    let slow =
        r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"slow","arguments":{}}}"#;
    let answer = std::thread::scope(|s| {
        let call = s.spawn(|| {
            p.http(
                "POST",
                &[("mcp-session-id", &sid), ("idempotency-key", "slow-1")],
                slow,
            )
        });
        let start = Instant::now();
        while sb.executed().is_empty() {
            assert!(start.elapsed() < DEADLINE, "the slow call never started");
            std::thread::sleep(Duration::from_millis(20));
        }
        // Our own child's pid, positive, by its handle.
        let pid = p.child.id().to_string();
        let term = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap();
        assert!(term.success());
        fs::write(sb.path("release"), "").unwrap();
        call.join().unwrap()
    });
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.json()["result"]["content"][0]["text"], "slow done");
    let start = Instant::now();
    let status = loop {
        if let Some(s) = p.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "the proxy did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
    // A new proxy on the same store replays it.
    let q = sb.listen("", &["python3", FIXTURE]);
    let sid = q.session("unused");
    let again = q.http(
        "POST",
        &[("mcp-session-id", &sid), ("idempotency-key", "slow-1")],
        slow,
    );
    assert!(replayed(&again.json()["result"]), "{}", again.body);
    assert_eq!(sb.executed(), ["slow started"]);
}

#[test]
fn mcp_http_idle_sessions_end() {
    let sb = Sandbox::new();
    let p = sb.listen("[http]\nidle_timeout = \"1s\"\n", &["python3", FIXTURE]);
    let sid = p.session("unused");
    let ping = r#"{"jsonrpc":"2.0","id":9,"method":"ping"}"#;
    let first = p.http("POST", &[("mcp-session-id", &sid)], ping);
    assert_eq!(first.status, 200, "{}", first.body);
    let start = Instant::now();
    loop {
        // Each look is a request, so it waits out the idle time before looking again.
        std::thread::sleep(Duration::from_millis(1500));
        let res = p.http("POST", &[("mcp-session-id", &sid)], ping);
        if res.status == 404 {
            break;
        }
        assert!(start.elapsed() < DEADLINE, "the idle session never ended");
    }
}

/// The headers of a 2025-11-25 client of session `sid` that takes streams.
fn streaming(sid: &str) -> Vec<(&str, &str)> {
    vec![
        ("mcp-session-id", sid),
        ("accept", "application/json, text/event-stream"),
        ("mcp-protocol-version", "2025-11-25"),
    ]
}

/// A `tools/call` of the fixture's `tool` under request id `id`.
fn call_of(tool: &str, id: u64) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{tool}","arguments":{{}}}}}}"#
    )
}

impl Listening {
    /// Opens the stream of session `sid` (a GET), resumed after `last` when given; the stream,
    /// checked to be one.
    fn get(&self, sid: &str, last: Option<&str>) -> Streaming {
        let mut headers = streaming(sid);
        if let Some(last) = last {
            headers.push(("last-event-id", last));
        }
        let get = self.stream("GET", &headers, "");
        assert_eq!(get.status, 200, "{:?}", get.headers);
        assert_eq!(get.header("content-type"), "text/event-stream");
        get
    }

    /// The client's answer to the fixture's elicitation (`srv-1`), accepted.
    fn accept_elicitation(&self, sid: &str) {
        let reply = self.http(
            "POST",
            &[("mcp-session-id", sid)],
            r#"{"jsonrpc":"2.0","id":"srv-1","result":{"action":"accept","content":{"ok":true}}}"#,
        );
        assert_eq!(reply.status, 202, "{}", reply.body);
    }
}

/// A priming event: an id, a `retry` time, and empty data (MCP 2025-11-25).
fn assert_priming(event: &Sse) {
    assert!(event.id.is_some(), "{event:?}");
    assert!(event.retry.is_some(), "{event:?}");
    assert_eq!(event.data.as_deref(), Some(""), "{event:?}");
}

/// An elicitation of the fixture's `ask` tool.
fn assert_elicitation(event: &Sse) {
    let frame = event.json();
    assert_eq!(frame["method"], "elicitation/create", "{event:?}");
    assert_eq!(frame["id"], "srv-1", "{event:?}");
}

#[test]
fn mcp_http_a_post_stream_cut_after_its_priming_event_is_resumed_with_its_answer() {
    let sb = Sandbox::new();
    let p = sb.listen("", &["python3", FIXTURE]);
    let sid = p.session("");
    let mut headers = streaming(&sid);
    headers.push(("idempotency-key", "slow-1"));
    // The answer does not come at once: the POST turns into a stream, primed.
    let mut post = p.stream("POST", &headers, &call_of("slow", 5));
    assert_eq!(post.status, 200);
    assert_eq!(post.header("content-type"), "text/event-stream");
    let priming = post.event().expect("a priming event");
    assert_priming(&priming);
    // The client hangs up; the call goes on, and its answer waits in the stream.
    drop(post);
    fs::write(sb.path("release"), "").unwrap();
    let mut resumed = p.get(&sid, Some(priming.id()));
    let answer = resumed.event().expect("the answer");
    let frame = answer.json();
    assert_eq!(frame["id"], 5, "{frame}");
    assert_eq!(
        frame["result"]["content"][0]["text"], "slow done",
        "{frame}"
    );
    assert!(!replayed(&frame["result"]), "{frame}");
    assert_ne!(answer.id(), priming.id());
    assert_eq!(
        resumed.event(),
        None,
        "a POST's stream ends with its answer"
    );
    // The answer is kept: the same event again for a client that lost it once more, and
    // nothing after it.
    let mut again = p.get(&sid, Some(priming.id()));
    assert_eq!(again.event().as_ref(), Some(&answer));
    assert_eq!(again.event(), None);
    assert_eq!(p.get(&sid, Some(answer.id())).event(), None);
    assert_eq!(sb.executed(), ["slow started"], "the call ran once");
}

#[test]
fn mcp_http_a_get_stream_resumed_after_a_reconnect_loses_and_repeats_nothing() {
    let sb = Sandbox::new();
    let p = sb.listen("", &["python3", FIXTURE]);
    let sid = p.session("");
    let mut get = p.get(&sid, None);
    assert_priming(&get.event().expect("a priming event"));
    // Each ask sends the client an elicitation: on the GET stream, which is open.
    let ask = |n: u64| {
        let key = format!("ask-{n}");
        let res = p.http(
            "POST",
            &[("mcp-session-id", &sid), ("idempotency-key", &key)],
            &call_of("ask", n),
        );
        assert_eq!(res.status, 200, "{}", res.body);
        let text = res.json()["result"]["content"][0]["text"].clone();
        assert!(text.as_str().unwrap().contains("client said"), "{text}");
    };
    std::thread::scope(|s| {
        let first = s.spawn(|| ask(1));
        let e1 = get.event().expect("the first elicitation");
        assert_elicitation(&e1);
        p.accept_elicitation(&sid);
        first.join().unwrap();
        let second = s.spawn(|| ask(2));
        let e2 = get.event().expect("the second elicitation");
        assert_elicitation(&e2);
        // The connection breaks, as if e2 had been lost in it: the client resumes after e1.
        drop(get);
        let mut resumed = p.get(&sid, Some(e1.id()));
        assert_eq!(resumed.event().as_ref(), Some(&e2), "e2 again, and not e1");
        p.accept_elicitation(&sid);
        second.join().unwrap();
        // Later events come on the resumed stream, numbered on.
        let third = s.spawn(|| ask(3));
        let e3 = resumed.event().expect("the third elicitation");
        assert_elicitation(&e3);
        assert!(![e1.id(), e2.id()].contains(&e3.id()), "{e3:?}");
        p.accept_elicitation(&sid);
        third.join().unwrap();
    });
}

#[test]
fn mcp_http_events_of_one_stream_are_never_replayed_on_another() {
    let sb = Sandbox::new();
    let p = sb.listen("", &["python3", FIXTURE]);
    let sid = p.session("");
    let mut get = p.get(&sid, None);
    let get_priming = get.event().expect("a priming event");
    // A POST stream, cut after its priming event.
    let mut headers = streaming(&sid);
    headers.push(("idempotency-key", "slow-1"));
    let mut post = p.stream("POST", &headers, &call_of("slow", 5));
    let post_priming = post.event().expect("a priming event");
    assert_priming(&post_priming);
    drop(post);
    // While the slow call runs (the fixture runs one call at a time: release it first), an
    // elicitation goes to the GET stream.
    fs::write(sb.path("release"), "").unwrap();
    let ask = |n: u64| {
        let key = format!("ask-{n}");
        let res = p.http(
            "POST",
            &[("mcp-session-id", &sid), ("idempotency-key", &key)],
            &call_of("ask", n),
        );
        assert_eq!(res.status, 200, "{}", res.body);
    };
    std::thread::scope(|s| {
        let first = s.spawn(|| ask(1));
        let e1 = get.event().expect("an elicitation");
        assert_elicitation(&e1);
        p.accept_elicitation(&sid);
        first.join().unwrap();
        // The POST's stream, resumed: its answer only, not the GET stream's elicitation.
        let mut resumed_post = p.get(&sid, Some(post_priming.id()));
        let answer = resumed_post.event().expect("the answer");
        assert_eq!(answer.json()["id"], 5, "{answer:?}");
        assert_eq!(resumed_post.event(), None);
        // The GET stream, resumed from its start: its elicitation, then the next one, and never
        // the POST's answer.
        drop(get);
        let mut resumed_get = p.get(&sid, Some(get_priming.id()));
        assert_eq!(resumed_get.event().as_ref(), Some(&e1));
        let second = s.spawn(|| ask(2));
        let e2 = resumed_get.event().expect("the next elicitation");
        assert_elicitation(&e2);
        p.accept_elicitation(&sid);
        second.join().unwrap();
    });
    assert_eq!(sb.executed(), ["slow started"]);
}

#[test]
fn mcp_http_a_last_event_id_of_another_session_or_unknown_is_refused() {
    let sb = Sandbox::new();
    let p = sb.listen("", &["python3", FIXTURE]);
    let (sid_a, sid_b) = (p.session(""), p.session(""));
    let of_a = p.get(&sid_a, None).event().expect("a priming event");
    let of_b = p.get(&sid_b, None).event().expect("a priming event");
    // Ids are `<tag>-<stream>-<n>`: the same stream and event of b's tag, but beyond what b
    // sent, and a stream b never had.
    let (tag_b, stream_b) = of_b
        .id()
        .rsplit_once('-')
        .unwrap()
        .0
        .rsplit_once('-')
        .unwrap();
    let beyond = format!("{tag_b}-{stream_b}-99");
    let nowhere = format!("{tag_b}-999-0");
    for last in [of_a.id(), "nonsense", "", &beyond, &nowhere] {
        let mut headers = streaming(&sid_b);
        headers.push(("last-event-id", last));
        let refused = p.stream("GET", &headers, "");
        assert_eq!(refused.status, 400, "{last:?}");
        assert_eq!(refused.header("content-type"), "application/json");
        let body: Value = serde_json::from_str(&refused.rest()).unwrap();
        assert_eq!(body["error"]["code"], -32600, "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("Last-Event-ID"),
            "{body}"
        );
    }
    // b's own id still resumes b's stream; the session lives on.
    let resumed = p.stream(
        "GET",
        &[streaming(&sid_b), vec![("last-event-id", of_b.id())]].concat(),
        "",
    );
    assert_eq!(resumed.status, 200);
}

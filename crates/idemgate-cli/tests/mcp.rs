//! `idemgate mcp` as an agent runs it: a real proxy process over stdio in front of a fixture MCP
//! server (tests/fixtures/mcp_server.py, Python standard library only) on a real SQLite file.
//! The fixture appends a line to a log for every execution, so counts are checked on the
//! server's side.

use std::fs;
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::cli::Sandbox;

/// Generous: a loaded machine with two cores runs many Python and proxy processes at once.
const DEADLINE: Duration = Duration::from_secs(60);

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/mcp_server.py");

/// The sandbox of the command-line tests, with a fixture server behind a proxy.
impl Sandbox {
    /// A proxy in front of the fixture, configured by `config` (TOML).
    fn proxy(&self, config: &str) -> Proxy {
        let mut command = self.idemgate();
        command
            .env("FIXTURE_LOG", self.path("executed"))
            .env("FIXTURE_RELEASE", self.path("release"))
            .env("FIXTURE_NOTES", self.path("notes"));
        Proxy::spawn(self.mcp(command, config, &["python3", FIXTURE]), self)
    }

    /// `command` (`idemgate`, or a command that ends by running it) extended into
    /// `mcp --config mcp.toml -- server…`, with `config` (TOML) in mcp.toml.
    pub(crate) fn mcp(&self, mut command: Command, config: &str, server: &[&str]) -> Command {
        let cfg = self.path("mcp.toml");
        fs::write(&cfg, config).unwrap();
        command
            .env("IDEMGATE_LOG", "warn")
            .args(["mcp", "--config"])
            .arg(&cfg)
            .arg("--")
            .args(server);
        command
    }

    /// A proxy in front of the fixture speaking only MCP 2026-07-28 (`--modern`).
    fn proxy_to_modern(&self, config: &str) -> Proxy {
        let mut command = self.idemgate();
        command
            .env("FIXTURE_LOG", self.path("executed"))
            .env("FIXTURE_NOTES", self.path("notes"));
        Proxy::spawn(
            self.mcp(command, config, &["python3", FIXTURE, "--modern"]),
            self,
        )
    }

    /// A proxy that has gone through `initialize`.
    pub(crate) fn initialized(&self, config: &str) -> Proxy {
        let mut p = self.proxy(config);
        p.initialize();
        p
    }

    /// Executions the fixture logged.
    pub(crate) fn executed(&self) -> Vec<String> {
        fs::read_to_string(self.path("executed"))
            .map(|s| s.lines().map(str::to_owned).collect())
            .unwrap_or_default()
    }

    fn release(&self) {
        fs::write(self.path("release"), "").unwrap();
    }
}

/// A process that speaks MCP over stdio (the proxy, or a server itself), one JSON-RPC frame a line.
/// A child process of the test, killed and reaped when dropped: by its own handle, never a
/// group or a name.
pub(crate) struct Reaped(pub(crate) Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl std::ops::Deref for Reaped {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Reaped {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

pub(crate) struct Proxy {
    pub(crate) child: Reaped,
    pub(crate) stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    next_id: u64,
}

impl Proxy {
    /// Starts `command` with piped stdin and stdout; its stderr goes to the sandbox's `stderr`.
    pub(crate) fn spawn(mut command: Command, sb: &Sandbox) -> Proxy {
        let stderr = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(sb.path("stderr"))
            .unwrap();
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Proxy {
            child: Reaped(child),
            stdin: Some(stdin),
            lines: rx,
            next_id: 1,
        }
    }

    pub(crate) fn send(&mut self, frame: &Value) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{frame}").unwrap();
        stdin.flush().unwrap();
    }

    /// Writes `text` as one line, as it is (for frames a `Value` cannot hold).
    pub(crate) fn send_text(&mut self, text: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{text}").unwrap();
        stdin.flush().unwrap();
    }

    /// The next line from the proxy, raw.
    pub(crate) fn line(&mut self) -> String {
        self.lines
            .recv_timeout(DEADLINE)
            .expect("the proxy answered within the deadline")
    }

    /// Sends a request and returns the raw line of its response (skipping other frames).
    fn request_raw(&mut self, method: &str, params: Value) -> (u64, String) {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        (id, self.response_line(id))
    }

    pub(crate) fn response_line(&mut self, id: u64) -> String {
        loop {
            let line = self.line();
            let v: Value = serde_json::from_str(&line).unwrap();
            if v.get("method").is_none() && v["id"] == json!(id) {
                return line;
            }
        }
    }

    pub(crate) fn request(&mut self, method: &str, params: Value) -> Value {
        serde_json::from_str(&self.request_raw(method, params).1).unwrap()
    }

    pub(crate) fn initialize(&mut self) -> Value {
        let r = self.request(
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}),
        );
        self.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        r
    }

    /// `tools/call` with the key in `_meta` (when given); the whole response frame.
    pub(crate) fn call(&mut self, tool: &str, args: Value, key: Option<&str>) -> Value {
        let mut params = json!({"name": tool, "arguments": args});
        if let Some(k) = key {
            params["_meta"] = json!({"dev.idemgate/idempotency-key": k});
        }
        self.request("tools/call", params)
    }

    pub(crate) fn wait_exit(&mut self) -> Option<i32> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            assert!(start.elapsed() < DEADLINE, "the proxy did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

pub(crate) fn text(response: &Value, block: usize) -> &str {
    response["result"]["content"][block]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text block {block} in {response}"))
}

pub(crate) fn verdict(response: &Value) -> &str {
    response["result"]["_meta"]["dev.idemgate/verdict"]
        .as_str()
        .unwrap_or("")
}

/// A retry of an action whose outcome is unknown: answered "unknown", and the server's log shows
/// the one execution `ran`, never a second.
fn assert_unknown_and_not_rerun(sb: &Sandbox, p: &mut Proxy, tool: &str, key: &str, ran: &str) {
    let retry = p.call(tool, json!({}), Some(key));
    assert_eq!(verdict(&retry), "unknown", "{retry}");
    assert_eq!(sb.executed(), [ran]);
}

/// Waits for `cond` with a generous deadline, checking often.
pub(crate) fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

const PLAIN: &str = "";

/// A sandbox and an initialized proxy configured by `config`.
fn started(config: &str) -> (Sandbox, Proxy) {
    let sb = Sandbox::new();
    let p = sb.initialized(config);
    (sb, p)
}

#[test]
fn mcp_a_2025_era_client_reaches_a_2026_only_server_through_the_proxy() {
    let sb = Sandbox::new();
    let mut p = sb.proxy_to_modern(PLAIN);
    // The server refuses initialize; the proxy answers it from the server's server/discover.
    let init = p.initialize();
    assert_eq!(init["result"]["protocolVersion"], "2025-11-25", "{init}");
    assert_eq!(
        init["result"]["serverInfo"]["name"], "fixture-2026",
        "{init}"
    );
    // The server's tasks extension is the 2025-11-25 tasks capability for tool calls.
    assert_eq!(
        init["result"]["capabilities"],
        json!({"tools": {}, "tasks": {"requests": {"tools": {"call": {}}}, "cancel": {}}}),
        "{init}"
    );
    // The server refuses every request without the 2026-07-28 envelope: these work because the
    // proxy adds it (and the proxy's own listing, sent for the call, carries it too).
    let first = p.call("count", json!({"label": "a"}), Some("k-1"));
    assert_eq!(text(&first, 0), "counted 1", "{first}");
    let again = p.call("count", json!({"label": "a"}), Some("k-1"));
    assert_eq!(
        again["result"]["_meta"]["dev.idemgate/replayed"], true,
        "{again}"
    );
    assert_eq!(sb.executed(), ["count a"]);
    let listed = p.request("tools/list", json!({}));
    assert!(listed["result"]["tools"].is_array(), "{listed}");
    // The 2026-07-28 era has no ping; the proxy answers it.
    assert_eq!(p.request("ping", json!({}))["result"], json!({}));
    // notifications/initialized is the proxy's to swallow: that era has no handshake.
    drop(p.stdin.take());
    p.wait_exit();
    let notes = fs::read_to_string(sb.path("notes")).unwrap_or_default();
    assert!(!notes.contains("notifications/initialized"), "{notes}");
}

#[test]
fn mcp_relays_frames_and_replays_a_keyed_write() {
    let sb = Sandbox::new();
    let mut p = sb.proxy(PLAIN);
    let init = p.initialize();
    assert_eq!(init["result"]["x-fixture"], true, "{init}");
    let (_, listing) = p.request_raw("tools/list", json!({}));
    // Members the proxy does not know keep their text; write tools are offered the model's key.
    assert!(
        listing.contains(r#""x-fixture-unknown":{"kept": [1, 2, 3]}"#),
        "{listing}"
    );
    assert!(
        listing.contains(r#""taskSupport": "forbidden""#),
        "{listing}"
    );
    let listed: Value = serde_json::from_str(&listing).unwrap();
    let count = &listed["result"]["tools"][0];
    assert_eq!(count["name"], "count");
    assert_eq!(
        count["inputSchema"]["properties"]["idempotency_key"]["type"],
        json!(["string", "null"]),
        "{listing}"
    );
    assert_eq!(p.request("ping", json!({}))["result"], json!({}));

    let first = p.call("count", json!({"label": "a"}), Some("order-1"));
    assert_eq!(text(&first, 0), "counted 1");
    assert!(first["result"]["_meta"].is_null(), "{first}");
    let meta = json!({"dev.idemgate/idempotency-key": "order-1"});
    let params = json!({"name": "count", "arguments": {"label": "a"}, "_meta": meta});
    let (_, again_raw) = p.request_raw("tools/call", params);
    // Numbers keep their text through the store.
    assert!(again_raw.contains("12345678901234567890123"), "{again_raw}");
    let again: Value = serde_json::from_str(&again_raw).unwrap();
    assert_eq!(text(&again, 0), "counted 1");
    assert_eq!(again["result"]["_meta"]["dev.idemgate/replayed"], true);
    assert_eq!(again["result"]["_meta"]["dev.idemgate/rule"], "explicit");
    assert!(again["result"]["_meta"]["dev.idemgate/executed_at"].is_string());
    assert!(text(&again, 1).contains("not repeated"), "{again}");
    assert_eq!(again["result"]["isError"], false);
    // The same text as the model's argument is the model's key, which names an action only
    // within this session (contract rule 2: a model's key is advisory): another action, run
    // once, and not part of the arguments.
    let by_arg = || json!({"label": "a", "idempotency_key": "order-1"});
    let model_first = p.call("count", by_arg(), None);
    assert_eq!(text(&model_first, 0), "counted 2", "{model_first}");
    let model_again = p.call("count", by_arg(), None);
    assert_eq!(
        model_again["result"]["_meta"]["dev.idemgate/replayed"],
        true
    );
    assert_eq!(
        model_again["result"]["_meta"]["dev.idemgate/named_by"], "model_key",
        "{model_again}"
    );
    assert_eq!(sb.executed(), ["count a", "count a"]);
    drop(p);

    // A new proxy process (a client that starts one per call) replays from the store.
    let audit = sb.path("audit.jsonl");
    let config = format!(
        "replay_notice = false\naudit_log = {:?}\n",
        audit.display().to_string()
    );
    let mut p = sb.initialized(&config);
    let later = p.call("count", json!({"label": "a"}), Some("order-1"));
    assert_eq!(later["result"]["_meta"]["dev.idemgate/replayed"], true);
    assert_eq!(later["result"]["content"].as_array().unwrap().len(), 1);
    // The model's key of the session before is not this session's: it runs.
    let model_elsewhere = p.call("count", by_arg(), None);
    assert_eq!(text(&model_elsewhere, 0), "counted 3", "{model_elsewhere}");
    assert_eq!(sb.executed(), ["count a", "count a", "count a"]);
    let audit = fs::read_to_string(&audit).unwrap();
    assert!(audit.contains(r#""event":"replayed""#), "{audit}");
    assert!(audit.contains(r#""tool":"mcp_server/count""#), "{audit}");

    let out = sb
        .idemgate()
        .args(["--json", "keys", "list"])
        .output()
        .unwrap();
    let rows: Value = serde_json::from_slice(&out.stdout).unwrap();
    let row = &rows[0];
    assert_eq!(row["key"]["tool"], "mcp_server/count", "{rows}");
    assert_eq!(row["key"]["tenant"], "local", "{rows}");
    assert_eq!(row["state"], "completed", "{rows}");
    assert_eq!(row["content"], "mcp_tool_result", "{rows}");
}

/// `O_NONBLOCK` (0o4000) in the flags of `fd` of this process, from /proc.
fn non_blocking(fd: &impl std::os::fd::AsRawFd) -> bool {
    let info = fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).unwrap();
    let flags = info
        .lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .map(|f| u32::from_str_radix(f.trim(), 8).unwrap())
        .unwrap();
    flags & 0o4000 != 0
}

#[test]
fn mcp_reads_a_socket_as_its_stdin_and_leaves_it_blocking_when_it_exits() {
    // Node starts a child's stdio on socket pairs; the proxy reads its stdin without blocking,
    // on its runtime, which switches the open socket (shared with every holder of the same
    // descriptor) to O_NONBLOCK until the proxy exits.
    use std::os::unix::net::UnixStream;
    let sb = Sandbox::new();
    let (mut ours, theirs) = UnixStream::pair().unwrap();
    let theirs_too = theirs.try_clone().unwrap();
    assert!(!non_blocking(&theirs_too));
    let mut command = sb.idemgate();
    command.env("FIXTURE_LOG", sb.path("executed"));
    let mut child = sb
        .mcp(command, PLAIN, &["python3", FIXTURE])
        .stdin(Stdio::from(std::os::fd::OwnedFd::from(theirs)))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut send = |frame: Value| writeln!(ours, "{frame}").unwrap();
    let mut answer = |id: u64| -> Value {
        loop {
            let v: Value = serde_json::from_str(&out.next().unwrap().unwrap()).unwrap();
            if v["id"] == json!(id) {
                return v;
            }
        }
    };
    send(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params":
        {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}),
    );
    assert!(answer(1)["result"].is_object());
    send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    let call = |id: u64| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "count",
            "arguments": {"label": "s"}, "_meta": {"dev.idemgate/idempotency-key": "sock-1"}}})
    };
    send(call(2));
    assert_eq!(text(&answer(2), 0), "counted 1");
    assert!(
        non_blocking(&theirs_too),
        "read without blocking while it runs"
    );
    send(call(3));
    assert_eq!(answer(3)["result"]["_meta"]["dev.idemgate/replayed"], true);
    assert_eq!(sb.executed(), ["count s"]);
    drop(ours);
    let deadline = Instant::now() + DEADLINE;
    while child.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "the proxy did not exit at end of input"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!non_blocking(&theirs_too), "the socket is blocking again");
}

#[test]
fn mcp_never_relays_a_frame_it_cannot_judge() {
    let (sb, mut p) = started(PLAIN);
    let unjudged = |label: &str| json!({"name": "count", "arguments": {"label": label}});
    // A batch holding a write without a key: an error for its request, in an array, and
    // nothing reaches the server (which would take the batch element by element).
    p.send(&json!([
        {"jsonrpc": "2.0", "id": 11, "method": "tools/call", "params": unjudged("batch")},
        {"jsonrpc": "2.0", "method": "notifications/progress", "params": {}},
    ]));
    let batch: Value = serde_json::from_str(&p.line()).unwrap();
    assert_eq!(batch.as_array().map(Vec::len), Some(1), "{batch}");
    assert_eq!(batch[0]["id"], 11, "{batch}");
    assert_eq!(batch[0]["error"]["code"], -32600, "{batch}");
    assert!(
        batch[0]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("batches"),
        "{batch}"
    );
    // `method` written twice: the proxy cannot tell which one the server reads (Python and
    // JavaScript read the last), so it relays neither.
    p.send_text(
        r#"{"jsonrpc":"2.0","id":12,"method":"ping","method":"tools/call","params":{"name":"count","arguments":{"label":"twice"}}}"#,
    );
    let twice: Value = serde_json::from_str(&p.line()).unwrap();
    assert_eq!(twice["error"]["code"], -32600, "{twice}");
    p.send_text("{not json");
    let garbled: Value = serde_json::from_str(&p.line()).unwrap();
    assert_eq!(garbled["error"]["code"], -32700, "{garbled}");
    assert_eq!(garbled["id"], Value::Null, "{garbled}");
    // A tool call without an id (or with a null one) gets no answer, and is not sent either.
    p.send(&json!({"jsonrpc": "2.0", "method": "tools/call", "params": unjudged("no id")}));
    p.send(&json!({"jsonrpc": "2.0", "id": null, "method": "tools/call", "params": unjudged("null id")}));
    // The session goes on: a keyed call runs, and it is the only execution the server saw.
    let keyed = p.call("count", json!({"label": "keyed"}), Some("k-1"));
    assert_eq!(text(&keyed, 0), "counted 1", "{keyed}");
    assert_eq!(sb.executed(), ["count keyed"]);
}

#[test]
fn mcp_a_key_that_is_not_a_string_or_that_disagrees_is_refused_with_a_reason() {
    let (sb, mut p) = started(PLAIN);
    let mut params = json!({"name": "count", "arguments": {"label": "a"}});
    params["_meta"] = json!({"dev.idemgate/idempotency-key": 42});
    let number = p.request("tools/call", params);
    assert_eq!(verdict(&number), "bad_request", "{number}");
    assert!(text(&number, 0).contains("must be a string"), "{number}");
    // A tool-call id is a string too (it names the action within its conversation).
    let mut params = json!({"name": "count", "arguments": {"label": "a"}});
    params["_meta"] = json!({"dev.idemgate/tool-call-id": 42});
    let number = p.request("tools/call", params);
    assert_eq!(verdict(&number), "bad_request", "{number}");
    assert!(
        text(&number, 0).contains("dev.idemgate/tool-call-id")
            && text(&number, 0).contains("must be a string"),
        "{number}"
    );
    let number = p.call("count", json!({"label": "a", "idempotency_key": 7}), None);
    assert_eq!(verdict(&number), "bad_request", "{number}");
    assert!(
        text(&number, 0).contains("argument idempotency_key must be a string"),
        "{number}"
    );
    // The orchestration layer's key (_meta) names the action; the model's argument is advisory
    // (the kit's one rule, `idemgate_kit::identity`): the program's name wins, on stdio and
    // over HTTP, and a second call under it is a replay the model is told about.
    let first = p.call(
        "count",
        json!({"label": "a", "idempotency_key": "k-arg"}),
        Some("k-meta"),
    );
    assert_eq!(text(&first, 0), "counted 1", "{first}");
    let again = p.call(
        "count",
        json!({"label": "a", "idempotency_key": "k-other"}),
        Some("k-meta"),
    );
    assert_eq!(text(&again, 0), "counted 1", "{again}");
    assert_eq!(
        again["result"]["_meta"]["dev.idemgate/replayed"], true,
        "{again}"
    );
    assert!(text(&again, 1).contains("already performed"), "{again}");
    assert_eq!(sb.executed(), ["count a"]);
}

/// The envelope of a 2026-07-28 request whose client declares `capabilities`.
fn envelope(capabilities: Value) -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": capabilities,
    })
}

#[test]
fn mcp_a_failure_the_proxy_caused_is_never_stored_as_the_tools_outcome() {
    let sb = Sandbox::new();
    let mut p = sb.proxy(PLAIN);
    // A 2026-07-28 client that takes no server requests, before a legacy server: translated.
    let env = envelope(json!({}));
    let discovered = p.request("server/discover", json!({"_meta": env}));
    assert_eq!(
        discovered["result"]["supportedVersions"],
        json!(["2026-07-28"]),
        "{discovered}"
    );
    let mut meta = env.clone();
    meta["dev.idemgate/idempotency-key"] = json!("k-ask");
    let call = json!({"name": "ask", "arguments": {}, "_meta": meta});
    // The server asks the client for input mid-call; that era's clients take no server
    // requests, so the proxy answers it as a client without the capability does, and the tool
    // fails. The failure is the proxy's doing: the outcome is unknown, never the stored failure.
    let first = p.request("tools/call", call.clone());
    assert_eq!(first["result"]["isError"], true, "{first}");
    // The server's answer goes back in the client's era (the SDKs refuse a result without it).
    assert_eq!(first["result"]["resultType"], "complete", "{first}");
    assert!(
        text(&first, 0).contains("elicitation failed") && text(&first, 0).contains("-32601"),
        "{first}"
    );
    let retry = p.request("tools/call", call);
    assert_eq!(verdict(&retry), "unknown", "{retry}");
}

#[test]
fn mcp_a_2026_era_client_that_takes_server_requests_is_kept_in_the_servers_legacy_era() {
    let sb = Sandbox::new();
    let mut p = sb.proxy(PLAIN);
    let env = envelope(json!({"elicitation": {}}));
    let refused = p.request("server/discover", json!({"_meta": env}));
    assert_eq!(refused["error"]["code"], -32022, "{refused}");
    assert_eq!(
        refused["error"]["data"]["supported"],
        json!(["2025-11-25"]),
        "{refused}"
    );
    // The client falls back to initialize, as the SDKs' "auto" mode does.
    let init = p.initialize();
    assert_eq!(init["result"]["protocolVersion"], "2025-11-25", "{init}");
    let id = 50;
    p.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "ask", "arguments": {}, "_meta": {"dev.idemgate/idempotency-key": "k-ask"}}}));
    // The server's request reaches the client, whose answer reaches the server.
    let asked: Value = serde_json::from_str(&p.line()).unwrap();
    assert_eq!(asked["method"], "elicitation/create", "{asked}");
    p.send(&json!({"jsonrpc": "2.0", "id": asked["id"], "result": {"action": "accept", "content": {"ok": true}}}));
    let answered: Value = serde_json::from_str(&p.response_line(id)).unwrap();
    assert!(text(&answered, 0).starts_with("client said"), "{answered}");
    let again = p.call("ask", json!({}), Some("k-ask"));
    assert_eq!(
        again["result"]["_meta"]["dev.idemgate/replayed"], true,
        "{again}"
    );
    // The client's notifications/initialized reached the server once: the proxy's own.
    drop(p.stdin.take());
    p.wait_exit();
    let notes = fs::read_to_string(sb.path("notes")).unwrap_or_default();
    assert_eq!(
        notes.matches("notifications/initialized").count(),
        1,
        "{notes}"
    );
}

#[test]
fn mcp_refuses_a_write_without_key_and_a_reused_key() {
    let (sb, mut p) = started(PLAIN);
    let refused = p.call("count", json!({"label": "a"}), None);
    assert_eq!(refused["result"]["isError"], true, "{refused}");
    assert_eq!(verdict(&refused), "key_required");
    assert!(
        text(&refused, 0).contains("\"idempotency_key\""),
        "{refused}"
    );
    assert!(text(&refused, 0).contains("dev.idemgate/idempotency-key"));
    assert!(sb.executed().is_empty());

    p.call("count", json!({"label": "a"}), Some("k"));
    let reused = p.call("count", json!({"label": "b"}), Some("k"));
    assert_eq!(reused["result"]["isError"], true);
    assert_eq!(verdict(&reused), "key_reused");
    let bad = p.call("count", json!({}), Some("has space"));
    assert_eq!(verdict(&bad), "bad_request", "{bad}");
    assert_eq!(sb.executed(), ["count a"]);
}

#[test]
fn mcp_what_counts_as_the_same_action_without_a_key() {
    let config = "[tools.count]\non_missing_key = \"window\"\n";
    let sb = Sandbox::new();
    let mut p = sb.initialized(config);
    let args = json!({"label": "a"});
    let first = p.call("count", args.clone(), None);
    assert_eq!(text(&first, 0), "counted 1", "{first}");
    // (b) The model re-emits the identical call under a new request id: the same action, and
    // the text it reads says it ran and was not repeated, and how to repeat it on purpose.
    let again = p.call("count", args.clone(), None);
    assert_eq!(
        again["result"]["_meta"]["dev.idemgate/rule"], "fallback",
        "{again}"
    );
    assert_eq!(text(&again, 0), "counted 1", "{again}");
    let told = text(&again, 1);
    assert!(
        told.contains("taken for a repeat") && told.contains("idempotency_key"),
        "{again}"
    );
    // Clients that show a model only structured content (Pydantic AI's) read the notice there
    // too: the tool's output schema (none) takes another member.
    let notice = &again["result"]["structuredContent"]["idemgate_notice"];
    assert!(
        notice
            .as_str()
            .is_some_and(|n| n.contains("taken for a repeat")),
        "{again}"
    );
    assert_eq!(again["result"]["_meta"]["dev.idemgate/named_by"], "window");
    assert_eq!(sb.executed().len(), 1);
    // (c) The same arguments in another conversation (named by the client) are another action,
    // and so are they in another session (a new proxy process on the same store).
    let mut params = json!({"name": "count", "arguments": args});
    params["_meta"] = json!({"dev.idemgate/conversation": "conversation-2"});
    let elsewhere = p.request("tools/call", params.clone());
    assert_eq!(text(&elsewhere, 0), "counted 2", "{elsewhere}");
    let there_again = p.request("tools/call", params);
    assert_eq!(text(&there_again, 0), "counted 2", "{there_again}");
    let mut other_session = sb.initialized(config);
    let fresh = other_session.call("count", args.clone(), None);
    assert_eq!(text(&fresh, 0), "counted 3", "{fresh}");
    // (d) A deliberate repeat names the new action with a key of its own.
    let repeat = p.call(
        "count",
        json!({"label": "a", "idempotency_key": "second-a"}),
        None,
    );
    assert_eq!(text(&repeat, 0), "counted 4", "{repeat}");
    assert_eq!(sb.executed().len(), 4);
    // A key in params.idempotencyKey (the MCP proposal SEP-3182) names the action too.
    let keyed = json!({"name": "count", "arguments": {"label": "p"}, "idempotencyKey": "sep-1"});
    let ran = p.request("tools/call", keyed.clone());
    let replayed = p.request("tools/call", keyed);
    assert_eq!(
        replayed["result"]["_meta"]["dev.idemgate/replayed"], true,
        "{replayed}"
    );
    assert_eq!(
        replayed["result"]["_meta"]["dev.idemgate/rule"], "explicit",
        "{replayed}"
    );
    assert_eq!(text(&replayed, 0), text(&ran, 0));
    assert_eq!(sb.executed().len(), 5);
    // "refuse" is a write without a key refused, as with no window at all.
    let mut refusing = sb.initialized("[default]\non_missing_key = \"refuse\"\n");
    let refused = refusing.call("count", args, None);
    assert_eq!(verdict(&refused), "key_required", "{refused}");
}

/// The audit log (which the console's duplicates are counted from) and `/metrics` counted a replay
/// of a call named by the model's key or the client's tool-call id under the rule `key`, as if the
/// caller had named the action: each is counted under the rule that named it.
#[test]
fn mcp_duplicates_are_counted_under_the_rule_that_named_them() {
    let sb = Sandbox::new();
    let audit = sb.path("audit.jsonl");
    let mut p = sb.initialized(&format!(
        "replay_notice = false\naudit_log = {:?}\n",
        audit.display().to_string()
    ));
    for (label, args, meta) in [
        (
            "key",
            json!({}),
            json!({"dev.idemgate/idempotency-key": "order-1"}),
        ),
        ("model", json!({"idempotency_key": "mine"}), json!({})),
        (
            "call",
            json!({}),
            json!({"dev.idemgate/tool-call-id": "call-7"}),
        ),
    ] {
        let mut arguments = json!({ "label": label });
        arguments
            .as_object_mut()
            .unwrap()
            .extend(args.as_object().unwrap().clone());
        let params = json!({"name": "count", "arguments": arguments, "_meta": meta});
        p.request("tools/call", params.clone());
        let again = p.request("tools/call", params);
        assert_eq!(
            again["result"]["_meta"]["dev.idemgate/replayed"], true,
            "{again}"
        );
    }
    drop(p);
    let rules: Vec<Value> = fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|l| l["event"] == "replayed")
        .map(|l| l["rule"].clone())
        .collect();
    assert_eq!(rules, [json!("key"), json!("model_key"), json!("call_id")]);
}

#[test]
fn mcp_fallback_window_deduplicates_calls_without_key() {
    let (sb, mut p) = started("[tools.count]\nfallback_window = \"1h\"\n");
    let first = p.call("count", json!({"label": "a"}), None);
    assert_eq!(text(&first, 0), "counted 1");
    let second = p.call("count", json!({"label": "a"}), None);
    assert_eq!(second["result"]["_meta"]["dev.idemgate/rule"], "fallback");
    assert_eq!(text(&second, 0), "counted 1");
    let other = p.call("count", json!({"label": "b"}), None);
    assert_eq!(text(&other, 0), "counted 2");
    assert_eq!(sb.executed().len(), 2);
}

#[test]
fn mcp_reads_pass_unkeyed_only_for_trusted_servers() {
    let (sb, mut p) = started(PLAIN);
    let untrusted = p.call("read", json!({}), None);
    assert_eq!(verdict(&untrusted), "key_required", "{untrusted}");
    // The refusal tells the truth (the tool is not known to be read-only, not "it changes
    // state") and how to let a read-only tool's calls pass.
    let told = text(&untrusted, 0);
    assert!(
        told.contains("not known to be read-only")
            && !told.contains("changes state")
            && told.contains("kind = \"read\"")
            && told.contains("trusted = true"),
        "{untrusted}"
    );
    drop(p);
    let mut p = sb.initialized("trusted = true\n");
    for _ in 0..2 {
        let read = p.call("read", json!({}), None);
        assert_eq!(text(&read, 0), "lines 0", "{read}");
        assert!(read["result"]["_meta"].is_null());
    }
    drop(p);
    // The same in one line of an agent's configuration: `mcp --trust-annotations -- CMD`.
    let mut command = sb.idemgate();
    command.env("FIXTURE_LOG", sb.path("executed")).args([
        "mcp",
        "--trust-annotations",
        "--",
        "python3",
        FIXTURE,
    ]);
    let mut p = Proxy::spawn(command, &sb);
    p.initialize();
    let read = p.call("read", json!({}), None);
    assert_eq!(text(&read, 0), "lines 0", "{read}");
    let write = p.call("count", json!({"label": "w"}), None);
    assert_eq!(verdict(&write), "key_required", "{write}");
    let out = sb
        .idemgate()
        .args(["--json", "keys", "list"])
        .output()
        .unwrap();
    assert_eq!(
        serde_json::from_slice::<Value>(&out.stdout).unwrap(),
        json!([])
    );
}

#[test]
fn mcp_stores_and_replays_an_is_error_result() {
    let (sb, mut p) = started(PLAIN);
    let first = p.call("fail", json!({}), Some("pay-1"));
    assert_eq!(first["result"]["isError"], true);
    assert_eq!(text(&first, 0), "card declined");
    let again = p.call("fail", json!({}), Some("pay-1"));
    assert_eq!(again["result"]["isError"], true);
    assert_eq!(text(&again, 0), "card declined");
    assert_eq!(again["result"]["_meta"]["dev.idemgate/replayed"], true);
    assert_eq!(sb.executed(), ["fail"]);
}

#[test]
fn mcp_json_rpc_error_leaves_the_outcome_unknown() {
    let (sb, mut p) = started(PLAIN);
    let first = p.call("rpc_error", json!({}), Some("e-1"));
    assert_eq!(first["error"]["code"], -32603, "{first}");
    let again = p.call("rpc_error", json!({}), Some("e-1"));
    assert_eq!(verdict(&again), "unknown", "{again}");
    assert!(text(&again, 0).contains("NOT repeated"), "{again}");
    assert!(text(&again, 0).contains("idemgate keys resolve"), "{again}");
    assert_eq!(sb.executed(), ["rpc_error"]);
}

#[test]
fn mcp_server_crash_mid_call_is_unknown_and_never_rerun() {
    let (sb, mut p) = started(PLAIN);
    let crashed = p.call("crash", json!({}), Some("c-1"));
    assert_eq!(verdict(&crashed), "unknown", "{crashed}");
    assert!(text(&crashed, 0).contains("closed its output"), "{crashed}");
    // The server is gone: the proxy exits with its exit code.
    assert_eq!(p.wait_exit(), Some(3));
    let mut p = sb.initialized(PLAIN);
    assert_unknown_and_not_rerun(&sb, &mut p, "crash", "c-1", "crash");
}

#[test]
fn mcp_sigkill_of_the_proxy_mid_call_never_runs_twice() {
    let _heavy = crate::heavy();
    let sb = Sandbox::new();
    // A short lease: the killed proxy's reservation turns unknown soon after.
    let config = "[tools.slow]\nlease = \"1s\"\nwait = \"0s\"\n";
    let mut p = sb.initialized(config);
    p.send(&json!({"jsonrpc": "2.0", "id": 99, "method": "tools/call", "params": {"name": "slow", "arguments": {}, "_meta": {"dev.idemgate/idempotency-key": "s-1"}}}));
    wait_for("the slow call to start", || !sb.executed().is_empty());
    p.child.kill().unwrap();
    p.child.wait().unwrap();
    let mut p = sb.initialized(config);
    let mut last = Value::Null;
    wait_for("the outcome to turn unknown", || {
        last = p.call("slow", json!({}), Some("s-1"));
        assert!(matches!(verdict(&last), "in_flight" | "unknown"), "{last}");
        verdict(&last) == "unknown"
    });
    assert_eq!(sb.executed(), ["slow started"]);
    // Let the orphaned fixture finish; it exits on its closed input.
    sb.release();
}

#[test]
fn mcp_racing_duplicates_in_many_proxies_execute_once() {
    let _heavy = crate::heavy();
    let sb = Sandbox::new();
    let config = "[tools.count]\nwait = \"60s\"\n";
    let mut proxies: Vec<Proxy> = (0..16).map(|_| sb.proxy(config)).collect();
    for p in &mut proxies {
        p.initialize();
    }
    let call = json!({"jsonrpc": "2.0", "id": 500, "method": "tools/call", "params": {"name": "count", "arguments": {"label": "race"}, "_meta": {"dev.idemgate/idempotency-key": "race-1"}}});
    for p in &mut proxies {
        p.send(&call);
    }
    let mut replayed = 0;
    for p in &mut proxies {
        let r: Value = serde_json::from_str(&p.response_line(500)).unwrap();
        assert_eq!(text(&r, 0), "counted 1", "{r}");
        if r["result"]["_meta"]["dev.idemgate/replayed"] == true {
            replayed += 1;
        }
    }
    assert_eq!(replayed, 15);
    assert_eq!(sb.executed(), ["count race"]);
}

#[test]
fn mcp_fills_a_declared_key_argument_with_the_record_digest() {
    let (sb, mut p) = started(PLAIN);
    // The client never listed the tools: the proxy lists them itself (both pages).
    let r = p.call("keyed", json!({"x": 1, "idempotencyKey": "abc"}), None);
    // The model's "abc" names an action within this session; the server gets the digest of
    // its record, the same on every retry of it (and never the model's text).
    let sent = text(&r, 0).to_owned();
    let digest = sent.strip_prefix("key ").expect("a digest").to_owned();
    assert!(
        digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()),
        "{r}"
    );
    let keys = sb.run(&["--json", "keys", "list", "--tool", "mcp_server/keyed"]);
    let rows: Value = serde_json::from_slice(&keys.stdout).unwrap();
    let key: idemgate::Key = serde_json::from_value(rows[0]["key"].clone()).unwrap();
    assert_eq!(idemgate::key::hex(&key.digest()), digest, "{rows}");
    // An undeclared key argument never reaches a server (count would log it otherwise).
    let c = p.call("count", json!({"label": "z", "idempotencyKey": "k9"}), None);
    assert_eq!(text(&c, 0), "counted 2", "{c}");
    assert_eq!(
        sb.executed(),
        [format!("keyed {digest}"), "count z".to_owned()]
    );
}

#[test]
fn mcp_relays_server_requests_and_holds_cancellations_of_writes() {
    let (sb, mut p) = started(PLAIN);
    p.send(&json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "ask", "arguments": {}, "_meta": {"dev.idemgate/idempotency-key": "ask-1"}}}));
    let asked: Value = serde_json::from_str(&p.line()).unwrap();
    assert_eq!(asked["method"], "elicitation/create", "{asked}");
    assert_eq!(asked["id"], "srv-1");
    p.send(&json!({"jsonrpc": "2.0", "id": "srv-1", "result": {"action": "accept"}}));
    let answered: Value = serde_json::from_str(&p.response_line(7)).unwrap();
    assert_eq!(text(&answered, 0), r#"client said {"action": "accept"}"#);

    // A cancelled write runs to its end; its outcome is stored and replayed.
    p.send(&json!({"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": {"name": "slow", "arguments": {}, "_meta": {"dev.idemgate/idempotency-key": "slow-1"}}}));
    // The slow call itself (`ask` ran before it): the cancellation must come once it is upstream.
    wait_for("the slow call to start", || {
        sb.executed().iter().any(|t| t == "slow started")
    });
    p.send(
        &json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 8}}),
    );
    p.send(&json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": 1, "progress": 1}}));
    sb.release();
    let done: Value = serde_json::from_str(&p.response_line(8)).unwrap();
    assert_eq!(text(&done, 0), "slow done");
    // The fixture reads frames in order: once ping is answered it has seen all before it.
    p.request("ping", json!({}));
    let notes = fs::read_to_string(sb.path("notes")).unwrap_or_default();
    assert_eq!(
        notes.lines().collect::<Vec<_>>(),
        ["notifications/initialized", "notifications/progress"]
    );
}

#[test]
fn mcp_input_required_is_never_stored_and_its_continuation_runs_under_the_key() {
    let (sb, mut p) = started(PLAIN);
    let interim = p.call("confirm", json!({}), Some("c-9"));
    assert_eq!(
        interim["result"]["resultType"], "input_required",
        "{interim}"
    );
    let meta = json!({"dev.idemgate/idempotency-key": "c-9"});
    let continued = json!({"name": "confirm", "arguments": {}, "_meta": meta,
        "inputResponses": {"ok": {"action": "accept"}}, "requestState": "s1"});
    let done = p.request("tools/call", continued.clone());
    assert_eq!(text(&done, 0), "confirmed", "{done}");
    let again = p.request("tools/call", continued);
    assert_eq!(
        again["result"]["_meta"]["dev.idemgate/replayed"], true,
        "{again}"
    );
    assert_eq!(sb.executed(), ["confirm"]);
}

#[test]
fn mcp_call_timeout_leaves_the_outcome_unknown_and_drops_the_late_answer() {
    let (sb, mut p) = started("call_timeout = \"300ms\"\n");
    let timed_out = p.call("slow", json!({}), Some("t-1"));
    assert_eq!(verdict(&timed_out), "unknown", "{timed_out}");
    assert!(
        text(&timed_out, 0).contains("did not answer within"),
        "{timed_out}"
    );
    sb.release();
    // The late answer never reaches the client: the next frame it sees answers the ping.
    p.send(&json!({"jsonrpc": "2.0", "id": 900, "method": "ping"}));
    let next: Value = serde_json::from_str(&p.line()).unwrap();
    assert_eq!(next["id"], 900, "{next}");
    assert_unknown_and_not_rerun(&sb, &mut p, "slow", "t-1", "slow started");
}

#[test]
fn mcp_refuses_to_start_without_its_store() {
    let sb = Sandbox::new();
    let out = sb
        .idemgate()
        .args([
            "--store",
            "sqlite:///nonexistent-dir/x/idem.db",
            "mcp",
            "--",
            "python3",
            FIXTURE,
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(69));
    assert!(String::from_utf8_lossy(&out.stderr).contains("failed to open store"));
}

#[test]
fn mcp_client_hanging_up_mid_write_still_records_its_outcome() {
    let (sb, mut p) = started(PLAIN);
    p.send(&json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "slow", "arguments": {}, "_meta": {"dev.idemgate/idempotency-key": "hang-1"}}}));
    wait_for("the slow call to start", || !sb.executed().is_empty());
    drop(p.stdin.take());
    sb.release();
    assert_eq!(p.wait_exit(), Some(0));
    let mut p = sb.initialized(PLAIN);
    let r = p.call("slow", json!({}), Some("hang-1"));
    assert_eq!(text(&r, 0), "slow done", "{r}");
    assert_eq!(r["result"]["_meta"]["dev.idemgate/replayed"], true);
    assert_eq!(sb.executed(), ["slow started"]);
}

/// The pinned third-party pieces (scripts/mcp-test-deps), or a loud failure saying how to get
/// them.
pub(crate) fn mcp_deps() -> PathBuf {
    let dir = std::env::var_os("IDEMGATE_MCP_DEPS").map_or_else(
        || {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../target/mcp-deps"
            ))
        },
        PathBuf::from,
    );
    let pieces = [
        "venv/bin/python",
        "node/node_modules/.bin/mcp-server-memory",
        "venv/bin/mcp-server-git",
        "venv-sqlite/bin/mcp-server-sqlite",
    ];
    let missing: Vec<_> = pieces.iter().filter(|p| !dir.join(p).exists()).collect();
    assert!(
        missing.is_empty(),
        "the MCP end-to-end dependencies are missing in {} ({missing:?}): run scripts/mcp-test-deps (it installs the Python mcp SDK, @modelcontextprotocol/server-memory, mcp-server-git and mcp-server-sqlite, pinned)",
        dir.display()
    );
    dir
}

impl Sandbox {
    /// A client script of tests/fixtures on the pinned Python SDK, with the sandbox's store in its
    /// environment (the proxies it starts use it).
    pub(crate) fn python_client(&self, script: &str) -> Command {
        let mut c = self.with_store(mcp_deps().join("venv/bin/python"));
        c.arg(format!(
            "{}/tests/fixtures/{script}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .env("IDEMGATE_LOG", "warn");
        c
    }

    /// Runs a client script; what it printed, as JSON. A failure shows its output and the
    /// proxy's stderr.
    pub(crate) fn client_saw(&self, mut client: Command) -> Value {
        let out = client.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}\n{}\nproxy: {}",
            String::from_utf8_lossy(&out.stderr),
            fs::read_to_string(self.path("stderr")).unwrap_or_default()
        );
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
    }

    /// [`Sandbox::client_saw`] of `client` reaching `server` through the proxy on `transport`:
    /// "stdio" (the client is given `idemgate -- server` to spawn) or "http" (a proxy listening
    /// in this sandbox, the client given its URL).
    pub(crate) fn client_saw_through_proxy(
        &self,
        mut client: Command,
        transport: &str,
        server: &Path,
    ) -> Value {
        let _listening;
        if transport == "stdio" {
            client
                .arg(env!("CARGO_BIN_EXE_idemgate"))
                .arg("--")
                .arg(server);
        } else {
            let p = self.listen("", &[server.to_str().unwrap()]);
            client.arg(&p.url);
            _listening = p;
        }
        self.client_saw(client)
    }
}

/// The Python SDK client's memory scenario through `idemgate mcp` on stdio, in `era` ("2025":
/// `initialize`; "2026": `server/discover` and per-request `_meta`); what it saw, checked: a
/// re-sent keyed write replays, an unkeyed one is refused, the graph holds the entity once.
fn memory_over_stdio(era: &str) -> Value {
    let deps = mcp_deps();
    let sb = Sandbox::new();
    let mut client = sb.python_client("mcp_memory_client.py");
    client
        .arg(env!("CARGO_BIN_EXE_idemgate"))
        .arg("--")
        .arg(deps.join("node/node_modules/.bin/mcp-server-memory"))
        .env("MEMORY_FILE_PATH", sb.path("memory.jsonl"))
        .env("MCP_ERA", era);
    let seen = sb.client_saw(client);
    assert_memory_write_replayed(&seen);
    assert_eq!(seen["unkeyed"]["isError"], true, "{seen}");
    assert_eq!(
        seen["unkeyed"]["_meta"]["dev.idemgate/verdict"],
        "key_required"
    );
    // The server's state changed once: one entity, one observation.
    let graph = seen["graph"]["content"][0]["text"].as_str().unwrap();
    assert_eq!(graph.matches("printer on fire").count(), 1, "{graph}");
    assert_eq!(seen["server"], "memory-server", "{seen}");
    seen
}

/// What a memory scenario of the Python SDK client must have seen of its keyed write: the tool
/// listed, the write run once, and its re-send replayed with the same content.
pub(crate) fn assert_memory_write_replayed(seen: &Value) {
    assert!(
        seen["tools"]
            .as_array()
            .unwrap()
            .contains(&json!("create_entities")),
        "{seen}"
    );
    let (first, again) = (&seen["first"], &seen["again"]);
    assert_ne!(first["isError"], true, "{seen}");
    assert!(first["_meta"]["dev.idemgate/replayed"].is_null(), "{seen}");
    assert_eq!(again["_meta"]["dev.idemgate/replayed"], true, "{seen}");
    assert_eq!(again["content"][0], first["content"][0], "{seen}");
}

#[test]
fn mcp_real_memory_server_through_the_python_sdk() {
    let seen = memory_over_stdio("2025");
    assert_eq!(seen["protocol"], "2025-11-25", "{seen}");
}

#[test]
fn mcp_real_memory_server_to_a_2026_era_client_through_discovery_the_proxy_answers() {
    // server-memory speaks only the 2025 era (`server/discover`: method not found); the proxy
    // initializes it and answers the client's `server/discover` from that, so the client stays
    // in the 2026 era, and every result it gets carries `resultType` (the SDK refuses one
    // without).
    let seen = memory_over_stdio("2026");
    assert_eq!(seen["protocol"], "2026-07-28", "{seen}");
    assert_eq!(seen["first"]["resultType"], "complete", "{seen}");
    assert_eq!(seen["again"]["resultType"], "complete", "{seen}");
}

/// The Python SDK's `Client` in `mode` ("auto" or "legacy") before server-everything through
/// the proxy on `transport` ("stdio" or "http"); what it saw, checked: the server's sampling and
/// elicitation requests reached the client once each (the replays asked nothing), progress
/// notifications arrived, and the re-sent keyed calls were replays of the first.
pub(crate) fn everything_through_the_proxy(mode: &str, transport: &str) -> Value {
    let seen = everything_client(mode, transport);
    // The server's own requests are answered in the 2025 era, which the client falls back to.
    assert_eq!(seen["protocol"], "2025-11-25", "{seen}");
    assert_eq!(
        seen["asked"],
        json!({"sampling": 1, "elicitation": 1}),
        "{seen}"
    );
    let sampled = seen["sampled"]["content"][0]["text"].as_str().unwrap();
    assert!(sampled.contains("fake completion"), "{seen}");
    assert_eq!(seen["elicited"]["isError"], false, "{seen}");
    for again in ["sampled_again", "elicited_again"] {
        assert_eq!(
            seen[again]["_meta"]["dev.idemgate/replayed"], true,
            "{seen}"
        );
    }
    assert_eq!(seen["progress"], json!([[1.0, 2.0], [2.0, 2.0]]), "{seen}");
    seen
}

/// The Python SDK's `Client` in "auto" mode without callbacks before server-everything: it
/// stays in the 2026-07-28 era, and the progress of its call reaches it (over HTTP, on the
/// sessionless request's own stream).
pub(crate) fn everything_progress_in_the_2026_era(transport: &str) {
    let seen = everything_client("plain", transport);
    assert_eq!(seen["protocol"], "2026-07-28", "{seen}");
    assert_eq!(seen["progress"], json!([[1.0, 2.0], [2.0, 2.0]]), "{seen}");
    assert_eq!(seen["long"]["isError"], false, "{seen}");
}

/// What the server-everything client script saw in `mode` through the proxy on `transport`.
fn everything_client(mode: &str, transport: &str) -> Value {
    let deps = mcp_deps();
    let server = deps.join("node/node_modules/.bin/mcp-server-everything");
    let sb = Sandbox::new();
    let mut client = sb.python_client("mcp_everything_client.py");
    client.args([mode, transport]);
    sb.client_saw_through_proxy(client, transport, &server)
}

#[test]
fn mcp_real_everything_server_requests_reach_a_python_client_in_auto_mode() {
    everything_through_the_proxy("auto", "stdio");
}

#[test]
fn mcp_real_everything_server_requests_reach_a_python_client_in_legacy_mode() {
    everything_through_the_proxy("legacy", "stdio");
}

#[test]
fn mcp_real_everything_progress_reaches_a_2026_era_python_client() {
    everything_progress_in_the_2026_era("stdio");
}

#[test]
fn mcp_real_everything_2025_tasks_reach_a_2026_client_through_the_tasks_extension() {
    let server = mcp_deps().join("node/node_modules/.bin/mcp-server-everything");
    let sb = Sandbox::new();
    let mut p = Proxy::spawn(
        sb.mcp(sb.idemgate(), PLAIN, &[server.to_str().unwrap()]),
        &sb,
    );
    let env = envelope(json!({"extensions": {"io.modelcontextprotocol/tasks": {}}}));
    // The legacy server's `tasks` capability is the tasks extension in the modern era.
    let discovered = p.request("server/discover", json!({"_meta": env}));
    let caps = &discovered["result"]["capabilities"];
    assert_eq!(
        caps["extensions"]["io.modelcontextprotocol/tasks"],
        json!({}),
        "{discovered}"
    );
    assert!(caps["tasks"].is_null(), "{discovered}");
    let mut meta = env.clone();
    meta["dev.idemgate/idempotency-key"] = json!("research-1");
    let call = json!({"name": "simulate-research-query", "arguments": {"topic": "retries"}, "_meta": meta});
    // The tool runs only as a task: the proxy asks the server for one, and the handle comes
    // back flat, as the extension has it.
    let created = p.request("tools/call", call.clone());
    let handle = &created["result"];
    assert_eq!(handle["resultType"], "task", "{created}");
    assert!(handle["task"].is_null(), "{created}");
    let task_id = handle["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("{created}"))
        .to_owned();
    assert!(
        handle.get("ttlMs").is_some() && handle.get("ttl").is_none(),
        "{created}"
    );
    // A retry is the same action: the same handle, replayed, and no second task.
    let again = p.request("tools/call", call);
    assert_eq!(again["result"]["taskId"], task_id.as_str(), "{again}");
    assert_eq!(again["result"]["resultType"], "task", "{again}");
    assert_eq!(
        again["result"]["_meta"]["dev.idemgate/replayed"], true,
        "{again}"
    );
    // Polled until it is done (the server takes about 4 s): the result comes inline.
    let mut done = Value::Null;
    wait_for("the research task to complete", || {
        let got = p.request("tasks/get", json!({"taskId": task_id, "_meta": env}));
        assert_eq!(got["result"]["resultType"], "complete", "{got}");
        let status = got["result"]["status"].as_str().unwrap_or("").to_owned();
        assert!(["working", "completed"].contains(&status.as_str()), "{got}");
        done = got;
        status == "completed"
    });
    let report = done["result"]["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(report.contains("Research Report: retries"), "{done}");
    // A cancel is acknowledged, whatever became of the task.
    let cancelled = p.request("tasks/cancel", json!({"taskId": task_id, "_meta": env}));
    assert_eq!(
        cancelled["result"],
        json!({"resultType": "complete"}),
        "{cancelled}"
    );
    // A client without the extension cannot call a task-only tool: refused, nothing sent.
    let mut plain = envelope(json!({}));
    plain["dev.idemgate/idempotency-key"] = json!("research-2");
    let refused = p.request(
        "tools/call",
        json!({"name": "simulate-research-query", "arguments": {"topic": "x"}, "_meta": plain}),
    );
    assert_eq!(refused["error"]["code"], -32021, "{refused}");
    // The server outlives a killed proxy (its research task keeps it up): the proxy is let go
    // the way an agent lets it go, and stops its server.
    drop(p.stdin.take());
    p.wait_exit();
}

#[test]
fn mcp_a_2025_era_clients_tasks_reach_a_server_of_the_2026_tasks_extension() {
    let sb = Sandbox::new();
    let mut p = sb.proxy_to_modern(PLAIN);
    let init = p.initialize();
    assert_eq!(
        init["result"]["capabilities"]["tasks"]["requests"]["tools"]["call"],
        json!({}),
        "{init}"
    );
    let call = json!({"name": "research", "arguments": {"topic": "retries"}, "task": {"ttl": 60000},
        "_meta": {"dev.idemgate/idempotency-key": "research-1"}});
    // The proxy asks the server in the extension's words; the handle comes back nested, as the
    // client's era has it.
    let created = p.request("tools/call", call.clone());
    let task = &created["result"]["task"];
    let task_id = task["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("{created}"))
        .to_owned();
    assert_eq!(task["status"], "working", "{created}");
    assert_eq!(task["ttl"], 60000, "{created}");
    assert_eq!(task["pollInterval"], 10, "{created}");
    assert!(created["result"].get("resultType").is_none(), "{created}");
    // A retry is the same action: the stored handle, in the client's words again.
    let again = p.request("tools/call", call);
    assert_eq!(
        again["result"]["task"]["taskId"],
        task_id.as_str(),
        "{again}"
    );
    assert_eq!(
        again["result"]["_meta"]["dev.idemgate/replayed"], true,
        "{again}"
    );
    assert_eq!(sb.executed(), ["research retries"]);
    // tasks/get gives the task without its result; tasks/result gives the result.
    let got = p.request("tasks/get", json!({"taskId": task_id}));
    assert_eq!(got["result"]["status"], "working", "{got}");
    assert!(
        got["result"].get("result").is_none() && got["result"].get("ttlMs").is_none(),
        "{got}"
    );
    let result = p.request("tasks/result", json!({"taskId": task_id}));
    assert_eq!(
        result["result"]["content"][0]["text"], "researched retries",
        "{result}"
    );
    assert_eq!(
        result["result"]["_meta"]["io.modelcontextprotocol/related-task"]["taskId"],
        task_id.as_str(),
        "{result}"
    );
    let done = p.request("tasks/get", json!({"taskId": task_id}));
    assert_eq!(done["result"]["status"], "completed", "{done}");
    // The extension lists no tasks.
    let listed = p.request("tasks/list", json!({}));
    assert_eq!(listed["error"]["code"], -32601, "{listed}");
    // A second task, cancelled while it works.
    let second = p.request(
        "tools/call",
        json!({"name": "research", "arguments": {"topic": "other"}, "task": {},
            "_meta": {"dev.idemgate/idempotency-key": "research-2"}}),
    );
    let second_id = second["result"]["task"]["taskId"].clone();
    let cancelled = p.request("tasks/cancel", json!({"taskId": second_id}));
    assert_eq!(cancelled["result"]["status"], "cancelled", "{cancelled}");
    assert_eq!(cancelled["result"]["taskId"], second_id, "{cancelled}");
}

/// Shadow mode: the door's `mode = "observe"` runs every call, and each one enforce mode would
/// have answered without running is on its record (`keys list --observed`), in the audit log
/// and in the proxy's log; one line switches the same records to enforce.
#[test]
fn mcp_observe_mode_runs_every_call_and_records_what_enforce_would_have_done() {
    let sb = Sandbox::new();
    let audit = sb.path("audit.jsonl");
    let observe = format!(
        "mode = \"observe\"\nreplay_notice = false\naudit_log = {:?}\n[tools.count]\non_missing_key = \"window\"\n",
        audit.display().to_string()
    );
    let mut p = sb.initialized(&observe);
    // The same key twice, a reused key, the same call without a key twice (the window).
    assert_eq!(
        text(&p.call("count", json!({"label": "a"}), Some("k")), 0),
        "counted 1"
    );
    assert_eq!(
        text(&p.call("count", json!({"label": "a"}), Some("k")), 0),
        "counted 2"
    );
    let reused = p.call("count", json!({"label": "b"}), Some("k"));
    assert_eq!(text(&reused, 0), "counted 3", "{reused}");
    assert_eq!(reused["result"]["isError"], false, "{reused}");
    assert_eq!(
        text(&p.call("count", json!({"label": "w"}), None), 0),
        "counted 4"
    );
    assert_eq!(
        text(&p.call("count", json!({"label": "w"}), None), 0),
        "counted 5"
    );
    // A client's tool-call id sent twice: one observation, by the call id's record, though
    // the re-emission window's record inside it was found standing too.
    let by_id = json!({"name": "count", "arguments": {"label": "c"},
        "_meta": {"dev.idemgate/tool-call-id": "call-7"}});
    assert_eq!(
        text(&p.request("tools/call", by_id.clone()), 0),
        "counted 6"
    );
    assert_eq!(text(&p.request("tools/call", by_id), 0), "counted 7");
    assert_eq!(sb.executed().len(), 7, "nothing suppressed");
    drop(p);

    let listed = sb.run(&["--json", "keys", "list", "--observed", "--limit", "1"]);
    assert!(listed.status.success(), "{listed:?}");
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let observed: Vec<(String, Value)> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["key"]["key"].as_str().unwrap().to_owned(),
                r["observed"]["would"].clone(),
            )
        })
        .collect();
    assert_eq!(observed.len(), 3, "{listed}");
    assert_eq!(observed[0].0, "k");
    assert_eq!(observed[0].1, json!({"key_reused": 1, "replayed": 1}));
    assert!(observed[1].0.starts_with("fallback-"), "{listed}");
    assert_eq!(observed[1].1, json!({"replayed": 1}));
    assert!(!observed[2].0.starts_with("fallback-"), "{listed}");
    assert_eq!(observed[2].1, json!({"replayed": 1}));
    let shown = sb.run(&["keys", "show", "k"]);
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.contains("enforce mode would have replayed the outcome recorded at"),
        "{shown}"
    );
    let lines: Vec<Value> = fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|l| l["event"] == "observed")
        .map(|l| json!([l["would"], l["rule"]]))
        .collect();
    assert_eq!(
        lines,
        [
            json!(["replayed", "key"]),
            json!(["key_reused", "key"]),
            json!(["replayed", "window"]),
            json!(["replayed", "call_id"])
        ]
    );

    // A write without a key and no window runs too (enforce would refuse it: key_required).
    let mut p = sb.initialized("mode = \"observe\"\n");
    let keyless = p.call("count", json!({"label": "n"}), None);
    assert_eq!(text(&keyless, 0), "counted 8", "{keyless}");
    drop(p);

    // One line: the same records, enforced.
    let mut p = sb.initialized(&observe.replace("mode = \"observe\"", "mode = \"enforce\""));
    let replayed = p.call("count", json!({"label": "a"}), Some("k"));
    assert_eq!(text(&replayed, 0), "counted 1", "{replayed}");
    assert_eq!(
        replayed["result"]["_meta"]["dev.idemgate/replayed"], true,
        "{replayed}"
    );
    assert_eq!(sb.executed().len(), 8);
}

//! "The same action" suite of `idemgate mcp`: one table of cases (what the client and the model
//! send, in which conversation) and how many times the side effect must run, stamped for every
//! way a client reaches the proxy: stdio (a conversation is a client's session, or named in
//! `_meta`), Streamable HTTP with sessions (2025 era) and sessionless (2026-07-28 era). The real
//! proxy in front of the fixture server, whose `count` tool logs each execution, on a real
//! SQLite file; default options but `on_missing_key = "window"`, so calls without a key are
//! joined by the re-emission window rather than refused, and `identity = ["label"]`: the label
//! names the action, and a `note` beside it is the wording a re-plan changes.
//!
//! Besides the count, every case checks the rule of "never silent": an answer to a call that
//! did not run says so in words the model reads (an `idemgate:` text block), never a bare
//! stored result.

use std::collections::HashMap;

use serde_json::{json, Value};

use crate::cli::Sandbox;
use crate::mcp::Proxy;
use crate::mcp_http::Listening;

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/mcp_server.py");
const CONFIG: &str = "[default]\non_missing_key = \"window\"\nidentity = [\"label\"]\n";

/// Two wordings of one message: what a guardrail's retry rewrites when it re-plans an action.
const NOTE_1: &str = "Hello Ann, your refund of 20 EUR is on its way.";
const NOTE_2: &str = "Dear Ann, we have refunded 20 EUR to your card.";

/// One call of a case: in which conversation, with which arguments and keys.
#[derive(Clone, Copy, Debug)]
struct Step {
    conversation: &'static str,
    label: &'static str,
    /// The orchestration layer's key, in `_meta["dev.idemgate/idempotency-key"]`.
    meta_key: Option<&'static str>,
    /// The model's `idempotency_key` argument.
    model_key: Option<&'static str>,
    /// The framework's tool-call id, in `_meta["dev.idemgate/tool-call-id"]` (where the
    /// packages' MCP integrations send it).
    call_id: Option<&'static str>,
    /// A `note` argument: free text, not among the tool's identity fields.
    note: Option<&'static str>,
}

const fn step(conversation: &'static str) -> Step {
    Step {
        conversation,
        label: "a",
        meta_key: None,
        model_key: None,
        call_id: None,
        note: None,
    }
}

const fn noted(step: Step, note: &'static str) -> Step {
    Step {
        note: Some(note),
        ..step
    }
}

const fn call_id(conversation: &'static str, id: &'static str) -> Step {
    Step {
        call_id: Some(id),
        ..step(conversation)
    }
}

const fn keyed(conversation: &'static str, meta_key: &'static str) -> Step {
    Step {
        meta_key: Some(meta_key),
        ..step(conversation)
    }
}

const fn model(conversation: &'static str, model_key: &'static str) -> Step {
    Step {
        model_key: Some(model_key),
        ..step(conversation)
    }
}

struct Case {
    name: &'static str,
    steps: &'static [Step],
    /// How many times the side effect runs.
    executed: usize,
    /// What the answer to the last step says, when it did not run.
    says: Option<&'static str>,
}

/// The table: `docs/MCP.md` ("What names an action") shows it.
const CASES: &[Case] = &[
    Case {
        name: "the same call re-sent with its key",
        steps: &[keyed("c1", "order-1"), keyed("c1", "order-1")],
        executed: 1,
        says: None,
    },
    Case {
        name: "the identical call re-emitted without a key in one conversation",
        steps: &[step("c1"), step("c1")],
        executed: 1,
        says: None,
    },
    Case {
        name: "the same arguments in two conversations",
        steps: &[step("c1"), step("c2")],
        executed: 2,
        says: None,
    },
    Case {
        name: "a deliberate repeat done as the notice says",
        steps: &[step("c1"), step("c1"), model("c1", "second-purchase")],
        executed: 2,
        says: None,
    },
    Case {
        name: "an orchestration key across conversations",
        steps: &[keyed("c1", "order-9"), keyed("c2", "order-9")],
        executed: 1,
        says: None,
    },
    Case {
        name: "the model's key in two conversations",
        steps: &[model("c1", "buy-1"), model("c2", "buy-1")],
        executed: 2,
        says: None,
    },
    Case {
        name: "the same tool-call id re-sent",
        steps: &[call_id("c1", "call_1"), call_id("c1", "call_1")],
        executed: 1,
        says: None,
    },
    Case {
        name: "the identical call under a new call id in one conversation",
        steps: &[call_id("c1", "call_1"), call_id("c1", "call_2")],
        executed: 1,
        says: None,
    },
    Case {
        name: "a constant call id in two conversations",
        steps: &[call_id("c1", "call_1"), call_id("c2", "call_1")],
        executed: 2,
        says: None,
    },
    Case {
        name: "a call id reused for another action in a later turn",
        steps: &[
            call_id("c1", "call_1"),
            Step {
                label: "b",
                ..call_id("c1", "call_1")
            },
        ],
        executed: 1,
        says: None,
    },
    Case {
        name: "the model's key reused in a later turn",
        steps: &[model("c1", "buy-1"), step("c2"), model("c1", "buy-1")],
        executed: 2,
        says: None,
    },
    Case {
        name: "a re-plan that rewords what does not name the action",
        steps: &[noted(step("c1"), NOTE_1), noted(step("c1"), NOTE_2)],
        executed: 1,
        says: Some("with the same label (the arguments that name it"),
    },
    Case {
        name: "a re-plan under a new call id",
        steps: &[
            noted(call_id("c1", "call_1"), NOTE_1),
            noted(call_id("c1", "call_2"), NOTE_2),
        ],
        executed: 1,
        says: Some("with the same label (the arguments that name it"),
    },
    Case {
        name: "the same words for another action",
        steps: &[
            noted(step("c1"), NOTE_1),
            Step {
                label: "b",
                ..noted(step("c1"), NOTE_1)
            },
        ],
        executed: 2,
        says: None,
    },
];

/// A way a client reaches the proxy.
trait Door {
    /// `tools/call` of `count`; the response frame.
    fn call(&mut self, step: &Step) -> Value;
}

fn params(step: &Step, conversation_in_meta: bool) -> Value {
    let mut args = json!({"label": step.label});
    if let Some(k) = step.model_key {
        args["idempotency_key"] = json!(k);
    }
    if let Some(note) = step.note {
        args["note"] = json!(note);
    }
    let mut meta = serde_json::Map::new();
    if let Some(k) = step.meta_key {
        meta.insert("dev.idemgate/idempotency-key".into(), json!(k));
    }
    if let Some(id) = step.call_id {
        meta.insert("dev.idemgate/tool-call-id".into(), json!(id));
    }
    if conversation_in_meta {
        meta.insert("dev.idemgate/conversation".into(), json!(step.conversation));
    }
    json!({"name": "count", "arguments": args, "_meta": meta})
}

/// stdio, a conversation per client process (a session each), on one store.
struct StdioSessions<'a> {
    sb: &'a Sandbox,
    config: &'static str,
    proxies: HashMap<&'static str, Proxy>,
}

impl Door for StdioSessions<'_> {
    fn call(&mut self, step: &Step) -> Value {
        let (sb, config) = (self.sb, self.config);
        let p = self
            .proxies
            .entry(step.conversation)
            .or_insert_with(|| sb.initialized(config));
        p.request("tools/call", params(step, false))
    }
}

/// stdio, one client process whose calls name their conversation in `_meta`.
struct StdioNamed(Proxy);

impl Door for StdioNamed {
    fn call(&mut self, step: &Step) -> Value {
        self.0.request("tools/call", params(step, true))
    }
}

/// Streamable HTTP with sessions: a conversation per session.
struct HttpSessions<'a> {
    p: &'a Listening,
    sessions: HashMap<&'static str, String>,
    next_id: u64,
}

impl Door for HttpSessions<'_> {
    fn call(&mut self, step: &Step) -> Value {
        let p = self.p;
        let sid = self
            .sessions
            .entry(step.conversation)
            .or_insert_with(|| p.session_open());
        self.next_id += 1;
        let body = json!({"jsonrpc": "2.0", "id": self.next_id, "method": "tools/call", "params": params(step, false)});
        let answer = p.http("POST", &[("mcp-session-id", sid)], &body.to_string());
        assert_eq!(answer.status, 200, "{}", answer.body);
        answer.message(self.next_id)
    }
}

/// Streamable HTTP without sessions (2026-07-28): every request on its own, naming its
/// conversation in `_meta`.
struct HttpSessionless<'a> {
    p: &'a Listening,
    next_id: u64,
}

/// The 2026-07-28 envelope a sessionless request carries in `_meta`.
fn envelope(params: &mut Value) {
    let meta = params["_meta"].as_object_mut().unwrap();
    meta.insert(
        "io.modelcontextprotocol/protocolVersion".into(),
        json!("2026-07-28"),
    );
    meta.insert(
        "io.modelcontextprotocol/clientInfo".into(),
        json!({"name": "raw", "version": "1"}),
    );
    meta.insert(
        "io.modelcontextprotocol/clientCapabilities".into(),
        json!({}),
    );
}

impl HttpSessionless<'_> {
    fn send(&mut self, mut params: Value) -> Value {
        envelope(&mut params);
        self.next_id += 1;
        let body =
            json!({"jsonrpc": "2.0", "id": self.next_id, "method": "tools/call", "params": params});
        let answer = self.p.http("POST", &[], &body.to_string());
        assert_eq!(answer.status, 200, "{}", answer.body);
        answer.message(self.next_id)
    }
}

impl Door for HttpSessionless<'_> {
    fn call(&mut self, step: &Step) -> Value {
        self.send(params(step, true))
    }
}

fn run_case(door: &str, case: &Case, sb: &Sandbox, d: &mut dyn Door) {
    let mut last_told = String::new();
    for (i, s) in case.steps.iter().enumerate() {
        let before = sb.executed().len();
        let answer = d.call(s);
        let result = &answer["result"];
        assert!(
            result.is_object(),
            "{door}: {}: step {i}: {answer}",
            case.name
        );
        if sb.executed().len() == before {
            // Not run: the model must read why, in words.
            let told = result["content"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|b| b["text"].as_str())
                .find(|t| t.starts_with("idemgate: "));
            assert!(
                told.is_some(),
                "{door}: {}: step {i} did not run and said nothing: {answer}",
                case.name
            );
            last_told = told.unwrap_or_default().to_owned();
        }
    }
    if let Some(says) = case.says {
        assert!(
            last_told.contains(says),
            "{door}: {}: the last answer does not say {says:?}: {last_told}",
            case.name
        );
    }
    assert_eq!(
        sb.executed().len(),
        case.executed,
        "{door}: {}: executions {:?}",
        case.name,
        sb.executed()
    );
}

#[test]
fn same_action_mcp_stdio_a_conversation_per_session() {
    for case in CASES {
        let sb = Sandbox::new();
        let mut door = StdioSessions {
            sb: &sb,
            config: CONFIG,
            proxies: HashMap::new(),
        };
        run_case("stdio sessions", case, &sb, &mut door);
    }
}

#[test]
fn same_action_mcp_stdio_conversations_named_in_meta() {
    for case in CASES {
        let sb = Sandbox::new();
        let mut door = StdioNamed(sb.initialized(CONFIG));
        run_case("stdio _meta conversations", case, &sb, &mut door);
    }
}

#[test]
fn same_action_mcp_http_sessions_and_sessionless() {
    for case in CASES {
        let sb = Sandbox::new();
        let p = sb.listen(CONFIG, &["python3", FIXTURE]);
        let mut door = HttpSessions {
            p: &p,
            sessions: HashMap::new(),
            next_id: 0,
        };
        run_case("http sessions", case, &sb, &mut door);
    }
    for case in CASES {
        let sb = Sandbox::new();
        let p = sb.listen(CONFIG, &["python3", FIXTURE]);
        let mut door = HttpSessionless { p: &p, next_id: 0 };
        run_case("http sessionless", case, &sb, &mut door);
    }
}

/// A retry that arrives after the record's ttl: never run again silently. Keyed by an
/// orchestration key, a model's key or a tool-call id, it is answered "expired" (it ran at T,
/// its result is no longer kept) in words the model reads, at every way of reaching the proxy;
/// a call joined only by the re-emission window is a new action once the window is past.
#[test]
fn same_action_a_retry_after_the_ttl_is_told_expired() {
    const SHORT: &str =
        "[default]\non_missing_key = \"window\"\nttl = \"1s\"\nfallback_window = \"1s\"\n";
    let keyed_steps: [(&str, Step); 3] = [
        ("an orchestration key", keyed("c1", "order-1")),
        ("a model's key", model("c1", "buy-1")),
        ("a tool-call id", call_id("c1", "call_1")),
    ];
    let expired_and_said = |door: &str, what: &str, answer: &Value| {
        let text: String = answer["result"]["content"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|b| b["text"].as_str())
            .collect();
        assert_eq!(
            answer["result"]["isError"], true,
            "{door}: {what}: {answer}"
        );
        assert!(
            text.starts_with("idemgate: ")
                && text.contains("already performed")
                && text.contains("no longer kept")
                && text.contains("NOT performed again"),
            "{door}: {what}: {answer}"
        );
        assert_eq!(
            answer["result"]["_meta"]["dev.idemgate/verdict"], "expired",
            "{door}: {what}: {answer}"
        );
    };
    let past_the_ttl = || std::thread::sleep(std::time::Duration::from_millis(1_600));
    for (what, s) in keyed_steps {
        let sb = Sandbox::new();
        let mut stdio = StdioNamed(sb.initialized(SHORT));
        stdio.call(&s);
        past_the_ttl();
        let answer = stdio.call(&s);
        expired_and_said("stdio _meta conversations", what, &answer);
        assert_eq!(sb.executed().len(), 1, "stdio _meta conversations: {what}");

        let sb = Sandbox::new();
        let mut sessions = StdioSessions {
            sb: &sb,
            config: SHORT,
            proxies: HashMap::new(),
        };
        sessions.call(&s);
        past_the_ttl();
        let answer = sessions.call(&s);
        expired_and_said("stdio sessions", what, &answer);
        assert_eq!(sb.executed().len(), 1, "stdio sessions: {what}");

        let sb = Sandbox::new();
        let p = sb.listen(SHORT, &["python3", FIXTURE]);
        let mut sessionless = HttpSessionless { p: &p, next_id: 0 };
        sessionless.call(&s);
        past_the_ttl();
        let answer = sessionless.call(&s);
        expired_and_said("http sessionless", what, &answer);
        assert_eq!(sb.executed().len(), 1, "http sessionless: {what}");

        let sb = Sandbox::new();
        let p = sb.listen(SHORT, &["python3", FIXTURE]);
        let mut http = HttpSessions {
            p: &p,
            sessions: HashMap::new(),
            next_id: 0,
        };
        http.call(&s);
        past_the_ttl();
        let answer = http.call(&s);
        expired_and_said("http sessions", what, &answer);
        assert_eq!(sb.executed().len(), 1, "http sessions: {what}");
    }
    // The window joins re-emissions for its length only: after it, the same arguments are a new
    // action (which is what a window means), so the call runs.
    let sb = Sandbox::new();
    let mut stdio = StdioNamed(sb.initialized(SHORT));
    stdio.call(&step("c1"));
    past_the_ttl();
    stdio.call(&step("c1"));
    assert_eq!(sb.executed().len(), 2);
}

#[test]
fn same_action_sessionless_clients_that_name_no_conversation_are_never_joined() {
    // Sessionless requests of every client share one server process; a request that names no
    // conversation is a scope of its own, so two clients' identical calls both run (before:
    // the shared process's one scope joined them, and the second read "in this conversation").
    let sb = Sandbox::new();
    let p = sb.listen(CONFIG, &["python3", FIXTURE]);
    let mut door = HttpSessionless { p: &p, next_id: 0 };
    let bare = || json!({"name": "count", "arguments": {"label": "a"}, "_meta": {}});
    let first = door.send(bare());
    let second = door.send(bare());
    assert_eq!(sb.executed().len(), 2, "{first}\n{second}");
    // The model's key of a sessionless request names nothing beyond the request either.
    let keyed = || json!({"name": "count", "arguments": {"label": "b", "idempotency_key": "m"}, "_meta": {}});
    door.send(keyed());
    door.send(keyed());
    assert_eq!(sb.executed().len(), 4, "{:?}", sb.executed());
}

#[test]
fn same_action_http_gateway() {
    // The gateway's callers are programs: the `Idempotency-Key` header is the orchestration
    // key, which names the action for the tenant in every request; a call without one is
    // refused with a problem that says so (no window is configured). A replay says so in its
    // `Idempotent-Replayed` header and its body.
    let sb = Sandbox::new();
    let token = "test-token-0123456789abcdef";
    let mut serve = sb.idemgate();
    serve.env("IDEMGATE_TOKEN", token);
    let (child, addr) = crate::cli::serve_on_a_free_port(serve);
    let _serve = crate::mcp::Reaped(child);
    let begin = |key: Option<&str>| {
        let key = key.map_or(String::new(), |k| format!("Idempotency-Key: {k}\r\n"));
        crate::cli::http(
            &addr,
            &format!(
                "POST /v1/tools/charge/begin HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\
                 {key}Content-Length: 12\r\nConnection: close\r\n\r\n{{\"order\": 7}}"
            ),
        )
    };
    let complete = |key: &str, begun: &str| {
        let body: Value =
            serde_json::from_str(begun.split("\r\n\r\n").nth(1).unwrap_or_default()).unwrap();
        let lease = body["lease"].as_str().unwrap_or_else(|| panic!("{begun}"));
        let outcome = json!({"key": key, "lease": lease, "outcome": {"kind": "success", "result": {"charged": 1}}}).to_string();
        let done = crate::cli::http(
            &addr,
            &format!(
                "POST /v1/tools/charge/complete HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{outcome}",
                outcome.len()
            ),
        );
        assert!(done.starts_with("HTTP/1.1 200"), "{done}");
    };
    let first = begin(Some("order-7"));
    assert!(first.starts_with("HTTP/1.1 201"), "{first}");
    complete("order-7", &first);
    // Re-sent with its key: replayed, and it says so.
    let again = begin(Some("order-7"));
    assert!(again.starts_with("HTTP/1.1 200"), "{again}");
    assert!(
        again
            .to_ascii_lowercase()
            .contains("idempotent-replayed: true"),
        "{again}"
    );
    // A new key is a new action.
    let other = begin(Some("order-8"));
    assert!(other.starts_with("HTTP/1.1 201"), "{other}");
    // No key: refused, in words, and nothing reserved.
    let bare = begin(None);
    assert!(bare.starts_with("HTTP/1.1 400"), "{bare}");
    assert!(
        bare.contains("key-required") && bare.contains("idempotency key"),
        "{bare}"
    );
}

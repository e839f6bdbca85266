//! One proxied MCP session, independent of the transport: frames from the client and from the
//! server go in, frames for each side come out of two channels. Everything but `tools/call`
//! passes through as it came; `tools/list` answers are read on the way to learn the tools.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use idemgate_core::{
    Call, Effect, Engine, Event, IdempotencyKey, Store, TenantId, ToolKind, ToolName, ToolPolicy,
    Verdict,
};
use idemgate_kit::Payload;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;

use crate::answer::{self, CallContext, META_KEY};
use crate::catalog::{Catalog, Tool, KEY_ARGUMENTS};
use crate::config::{record_tool, Config, KeySource};
use crate::frame::{self, Frame, Object};

/// How long the proxy waits for an answer to its own `tools/list`.
const LIST_TIMEOUT: Duration = Duration::from_secs(30);
/// The most pages of its own `tools/list` the proxy reads.
const MAX_LIST_PAGES: usize = 100;

/// A frame for the server, with a way to learn whether it was written.
#[derive(Debug)]
pub struct Outgoing {
    /// The frame, without its newline.
    pub frame: String,
    /// Told whether the frame was written, when somebody waits for that.
    pub sent: Option<oneshot::Sender<std::io::Result<()>>>,
}

/// What became of a request the proxy sent to the server.
#[derive(Debug)]
pub(crate) enum Reply {
    /// The server answered with this frame.
    Answer {
        frame: String,
        result: Option<Box<RawValue>>,
        error: Option<Box<RawValue>>,
    },
    /// No answer will come: the server closed, or did not answer in time.
    Closed(String),
}

impl Reply {
    /// What the answer says about the side effect.
    fn effect(&self) -> Effect {
        #[derive(Deserialize)]
        struct Shape {
            #[serde(rename = "isError", default)]
            is_error: bool,
            #[serde(rename = "resultType", default)]
            result_type: Option<String>,
        }
        match self {
            Reply::Answer {
                result: Some(r), ..
            } => {
                let shape = serde_json::from_str::<Shape>(r.get()).ok();
                // A 2026-era interim answer: the tool asks for input before it acts. It is never
                // stored; the key is released so that the continuation (the same call with
                // `inputResponses`/`requestState`, which are not part of the fingerprint) runs
                // under the same key and its final result is the one stored.
                if shape
                    .as_ref()
                    .and_then(|s| s.result_type.as_deref())
                    .is_some_and(|t| t == "input_required")
                {
                    return Effect::not_applied("the tool asked for input before acting");
                }
                let failed = shape.is_some_and(|s| s.is_error);
                let body = Payload::McpToolResult(r.clone()).encode();
                if failed {
                    Effect::Failed(body)
                } else {
                    Effect::Success(body)
                }
            }
            // A JSON-RPC error does not prove that nothing happened: servers of the TypeScript
            // SDK answer some failures after acting, and others raise errors midway (issue 9).
            Reply::Answer { error: Some(e), .. } => Effect::Ambiguous(format!(
                "the server answered with a JSON-RPC error {}",
                e.get()
            )),
            Reply::Answer { .. } => {
                Effect::Ambiguous("the server's answer had neither result nor error".to_owned())
            }
            Reply::Closed(why) => Effect::Ambiguous(why.clone()),
        }
    }
}

#[derive(Debug, Default)]
struct Pending {
    /// Requests sent to the server, by id, with whom to tell.
    waiting: HashMap<String, oneshot::Sender<Reply>>,
    /// Requests answered already without the server (timed out): their late answers are dropped.
    abandoned: HashSet<String>,
    /// Why the server is gone, once it is.
    closed: Option<String>,
}

/// One MCP session through the proxy.
pub struct Session<S> {
    inner: Arc<Inner<S>>,
    calls: Mutex<JoinSet<()>>,
}

struct Inner<S> {
    engine: Arc<Engine<S>>,
    config: Config,
    server: String,
    tenant: TenantId,
    catalog: Mutex<Catalog>,
    /// One listing of the proxy's own at a time.
    listing: tokio::sync::Mutex<()>,
    to_client: mpsc::UnboundedSender<String>,
    to_server: mpsc::UnboundedSender<Outgoing>,
    pending: Mutex<Pending>,
    /// Ids of the client's `tools/list` requests not answered yet.
    lists: Mutex<HashSet<String>>,
    /// Ids of writes sent to the server and not answered yet (their cancellations are held).
    writes: Mutex<HashSet<String>>,
    next_id: AtomicU64,
}

/// The two channels a transport drains: frames for the client and frames for the server.
#[derive(Debug)]
pub struct Outputs {
    /// Frames for the client, without newline.
    pub to_client: mpsc::UnboundedReceiver<String>,
    /// Frames for the server.
    pub to_server: mpsc::UnboundedReceiver<Outgoing>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every change under these locks is one insert or remove: a poisoned map is consistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<S: Store> Session<S> {
    /// A session of `server` (its name in record names) for `tenant`.
    pub fn new(
        engine: Arc<Engine<S>>,
        config: Config,
        server: String,
        tenant: TenantId,
    ) -> (Self, Outputs) {
        let (to_client, client_rx) = mpsc::unbounded_channel();
        let (to_server, server_rx) = mpsc::unbounded_channel();
        let inner = Arc::new(Inner {
            engine,
            config,
            server,
            tenant,
            catalog: Mutex::new(Catalog::new()),
            listing: tokio::sync::Mutex::new(()),
            to_client,
            to_server,
            pending: Mutex::new(Pending::default()),
            lists: Mutex::new(HashSet::new()),
            writes: Mutex::new(HashSet::new()),
            next_id: AtomicU64::new(1),
        });
        let session = Session {
            inner,
            calls: Mutex::new(JoinSet::new()),
        };
        (
            session,
            Outputs {
                to_client: client_rx,
                to_server: server_rx,
            },
        )
    }

    /// A frame from the client. `tools/call` requests are judged in a task of their own; a
    /// cancellation of a write in flight is held back unless configured; the rest goes on.
    pub fn from_client(&self, line: String) {
        self.from_client_keyed(line, None);
    }

    /// A frame from the client, with the key its transport carried beside it (the
    /// `Idempotency-Key` header of Streamable HTTP), which a `tools/call` uses before any key
    /// of its own: a different key in the frame itself is refused.
    pub fn from_client_keyed(&self, line: String, key: Option<IdempotencyKey>) {
        let Some(f) = Frame::parse(&line) else {
            self.inner.send_server(line);
            return;
        };
        match (f.method.as_deref(), f.id) {
            (Some("tools/call"), Some(id)) => {
                let inner = Arc::clone(&self.inner);
                let params = f.params;
                let mut calls = lock(&self.calls);
                // Finished calls are reaped as new ones come, so a long session stays small.
                while calls.try_join_next().is_some() {}
                calls.spawn(async move {
                    let answer = inner.call(&id, line, params.as_deref(), key).await;
                    let _ = inner.to_client.send(answer);
                });
            }
            (Some("tools/list"), Some(id)) => {
                lock(&self.inner.lists).insert(frame::id_key(&id));
                self.inner.send_server(line);
            }
            (Some("notifications/cancelled"), None) if !self.inner.config.forward_cancel => {
                let request = f
                    .params
                    .as_deref()
                    .and_then(frame::object)
                    .and_then(|p| p.get("requestId").map(|id| frame::id_key(id)));
                // A started write runs to its end, so that its outcome is stored and the retry
                // that follows replays it instead of finding it unknown.
                if request.is_some_and(|r| lock(&self.inner.writes).contains(&r)) {
                    tracing::info!("held back the cancellation of a write in flight");
                    return;
                }
                self.inner.send_server(line);
            }
            _ => self.inner.send_server(line),
        }
    }

    /// A frame from the server: answers to the proxy's requests go to their callers; everything
    /// else goes to the client as it came.
    pub fn from_server(&self, line: String) {
        let inner = &self.inner;
        let frame = Frame::parse(&line);
        if frame
            .as_ref()
            .is_some_and(|f| f.method.as_deref() == Some("notifications/tools/list_changed"))
        {
            lock(&inner.catalog).changed();
        }
        if let Some(f) = frame.filter(Frame::is_response) {
            let id = frame::id_key(f.id.as_deref().expect("responses have ids"));
            let mut pending = lock(&inner.pending);
            if let Some(tx) = pending.waiting.remove(&id) {
                drop(pending);
                let _ = tx.send(Reply::Answer {
                    frame: line,
                    result: f.result,
                    error: f.error,
                });
                return;
            }
            if pending.abandoned.remove(&id) {
                return;
            }
            drop(pending);
            if lock(&inner.lists).remove(&id) {
                if let Some(result) = &f.result {
                    lock(&inner.catalog).learn(result);
                }
            }
        }
        let _ = inner.to_client.send(line);
    }

    /// The server is gone: every request waiting on it learns so, and later calls are not sent.
    pub fn server_closed(&self, why: &str) {
        let waiting = {
            let mut pending = lock(&self.inner.pending);
            pending.closed = Some(why.to_owned());
            std::mem::take(&mut pending.waiting)
        };
        for (_, tx) in waiting {
            let _ = tx.send(Reply::Closed(why.to_owned()));
        }
    }

    /// Waits until every call taken so far has been answered (and its outcome recorded).
    pub async fn drain(&self) {
        loop {
            let mut calls = std::mem::take(&mut *lock(&self.calls));
            if calls.is_empty() {
                return;
            }
            while calls.join_next().await.is_some() {}
        }
    }
}

impl<S: Store> Inner<S> {
    fn send_server(&self, frame: String) {
        let _ = self.to_server.send(Outgoing { frame, sent: None });
    }

    /// Judges one `tools/call` and returns the frame that answers it.
    async fn call(
        &self,
        id: &RawValue,
        line: String,
        params: Option<&RawValue>,
        outer_key: Option<IdempotencyKey>,
    ) -> String {
        let params = params.and_then(frame::object).unwrap_or_default();
        let name = frame::string(&params, "name").unwrap_or_default();
        let policy_of_unknown = ToolPolicy::default();
        let scope = record_tool(&self.server, if name.is_empty() { "-" } else { &name });
        let mut cx = CallContext {
            id,
            tool: &name,
            scope: scope.as_str(),
            tenant: self.tenant.as_str(),
            policy: &policy_of_unknown,
            replay_notice: self.config.replay_notice,
            result_type: answer::wants_result_type(&params),
        };
        let arguments = match params.get("arguments") {
            None => Some(Object::new()),
            Some(a) if a.get() == "null" => Some(Object::new()),
            Some(a) => frame::object(a),
        };
        let (false, Some(mut arguments)) = (name.is_empty(), arguments) else {
            return self.refuse(
                &cx,
                &scope,
                "tools/call needs params.name and, if any, params.arguments as an object; nothing was done.".to_owned(),
            );
        };
        let tool = self.describe(&name, answer::envelope(&params)).await;
        let policy = self.config.policy(&name, tool.as_ref());
        cx.policy = &policy;
        let key = match (self.key_of(&params, &arguments), outer_key) {
            (Ok(Some(own)), Some(outer)) if own != outer => {
                return self.refuse(
                    &cx,
                    &scope,
                    format!(
                        "the Idempotency-Key header ({}) and the key in the call ({}) differ; nothing was done.",
                        outer.as_str(),
                        own.as_str()
                    ),
                )
            }
            (Ok(_), Some(outer)) => Some(outer),
            (Ok(k), None) => k,
            (Err(e), _) => return self.refuse(&cx, &scope, format!("{e}; nothing was done.")),
        };
        // The key is not part of the action: calls that differ only in it are the same action.
        let declared = tool.as_ref().and_then(|t| t.key_argument.as_deref());
        let mut stripped = false;
        let mut kept = None;
        for k in KEY_ARGUMENTS {
            if let Some(v) = arguments.remove(k) {
                if Some(k) == declared {
                    kept = Some(v);
                } else {
                    stripped = true;
                }
            }
        }
        let mut call = match Call::new(self.tenant.clone(), scope.clone())
            .args_text(frame::raw(&arguments).get().as_bytes())
        {
            Ok(c) => c,
            Err(e) => {
                return self.refuse(
                    &cx,
                    &scope,
                    format!("the arguments are not valid JSON: {e}."),
                )
            }
        };
        if let Some(k) = key {
            call = call.key(k);
        }
        // A server that declares a key argument gets the record's digest in it: the same logical
        // action always sends the same downstream key, whichever proxy process sends it.
        let mut filled = false;
        if let Some(param) = declared {
            match self.engine.key_for(&call, &policy) {
                Ok(Some(named)) => {
                    let digest = idemgate_core::key::hex(&named.key.digest());
                    arguments.insert(param.to_owned(), frame::raw(&digest));
                    filled = true;
                }
                // Reads and natural-idempotent tools have no record: the client's value stays.
                _ => {
                    if let Some(v) = kept {
                        arguments.insert(param.to_owned(), v);
                    }
                }
            }
        }
        let forwarded = if stripped || filled {
            frame::with_arguments(&line, &arguments).unwrap_or(line)
        } else {
            line
        };
        let id_key = frame::id_key(id);
        let write = policy.kind == ToolKind::Write;
        let mut relay = None;
        let result = self
            .engine
            .call_with_policy(call, &policy, || {
                self.forward(id_key, forwarded, write, &mut relay)
            })
            .await;
        answer::respond(&cx, result, relay)
    }

    /// The proxy's answer to a call it could not judge (its params or key are invalid), told to
    /// the observers like every other verdict.
    fn refuse(&self, cx: &CallContext<'_>, scope: &ToolName, text: String) -> String {
        self.engine.observe(&Event::Call {
            tenant: &self.tenant,
            tool: scope,
            key: None,
            verdict: Verdict::BadRequest,
            fence: None,
            answer: None,
            error: None,
        });
        answer::refuse(cx, Verdict::BadRequest, text)
    }

    /// The call's key, from the sources the configuration names, in its order.
    fn key_of(
        &self,
        params: &Object,
        arguments: &Object,
    ) -> Result<Option<IdempotencyKey>, String> {
        for source in &self.config.key_sources {
            let (found, from) = match source {
                KeySource::Meta => (
                    params
                        .get("_meta")
                        .and_then(|m| frame::object(m))
                        .and_then(|m| frame::string(&m, META_KEY)),
                    format!("_meta[\"{META_KEY}\"]"),
                ),
                KeySource::Argument => {
                    let found = KEY_ARGUMENTS
                        .iter()
                        .find_map(|k| frame::string(arguments, k).map(|v| (v, *k)));
                    match found {
                        Some((v, k)) => (Some(v), format!("argument {k}")),
                        None => (None, String::new()),
                    }
                }
            };
            if let Some(k) = found {
                return IdempotencyKey::explicit(k)
                    .map(Some)
                    .map_err(|e| format!("the idempotency key in {from} is invalid: {e}"));
            }
        }
        Ok(None)
    }

    /// Sends a call to the server and waits for its answer, which it keeps in `relay` for the
    /// client; returns what the answer says about the side effect.
    async fn forward(
        &self,
        id: String,
        frame: String,
        write: bool,
        relay: &mut Option<Reply>,
    ) -> Effect {
        let (tx, rx) = oneshot::channel();
        {
            let mut pending = lock(&self.pending);
            if let Some(why) = &pending.closed {
                return Effect::not_applied(format!("the server is not running ({why})"));
            }
            pending.waiting.insert(id.clone(), tx);
        }
        if write {
            lock(&self.writes).insert(id.clone());
        }
        let (sent_tx, sent_rx) = oneshot::channel();
        let _ = self.to_server.send(Outgoing {
            frame,
            sent: Some(sent_tx),
        });
        let sent = sent_rx
            .await
            .unwrap_or_else(|_| Err(std::io::Error::other("the server's input is closed")));
        let reply = match sent {
            // The frame never reached the server's input: nothing can have happened.
            Err(e) => {
                lock(&self.pending).waiting.remove(&id);
                lock(&self.writes).remove(&id);
                return Effect::not_applied(format!("failed to send the call to the server: {e}"));
            }
            Ok(()) => match tokio::time::timeout(self.config.call_timeout, rx).await {
                Ok(Ok(reply)) => reply,
                Ok(Err(_)) => Reply::Closed("the proxy lost track of the call".to_owned()),
                Err(_) => {
                    let mut pending = lock(&self.pending);
                    pending.waiting.remove(&id);
                    pending.abandoned.insert(id.clone());
                    Reply::Closed(format!(
                        "the server did not answer within {}",
                        humantime::format_duration(self.config.call_timeout)
                    ))
                }
            },
        };
        lock(&self.writes).remove(&id);
        let effect = reply.effect();
        *relay = Some(reply);
        effect
    }

    /// What the server said about `name`, listing its tools first if it has not been seen (a
    /// client that starts a proxy per call may call a tool without listing them), under the
    /// call's 2026-07-28 `envelope` when it has one.
    async fn describe(&self, name: &str, envelope: Option<Object>) -> Option<Tool> {
        // Known, or known to be absent from a whole listing: no need to ask.
        let known = |c: &Catalog| match c.get(name) {
            Some(t) => Some(Some(t.clone())),
            None => c.is_complete().then_some(None),
        };
        if let Some(t) = known(&lock(&self.catalog)) {
            return t;
        }
        let _one = self.listing.lock().await;
        if let Some(t) = known(&lock(&self.catalog)) {
            return t;
        }
        self.list_tools(envelope).await;
        lock(&self.catalog).get(name).cloned()
    }

    /// Lists the server's tools with requests of the proxy's own (ids the client never uses),
    /// carrying `envelope` as their `_meta` when given.
    async fn list_tools(&self, envelope: Option<Object>) {
        let mut cursor: Option<String> = None;
        for _ in 0..MAX_LIST_PAGES {
            let n = self.next_id.fetch_add(1, Ordering::Relaxed);
            let id = format!("dev.idemgate/tools-list-{n}");
            let key = frame::id_key(&frame::raw(&id));
            let (tx, rx) = oneshot::channel();
            {
                let mut pending = lock(&self.pending);
                if pending.closed.is_some() {
                    return;
                }
                pending.waiting.insert(key.clone(), tx);
            }
            let mut params = match &cursor {
                Some(c) => serde_json::json!({ "cursor": c }),
                None => serde_json::json!({}),
            };
            if let Some(e) = &envelope {
                params["_meta"] = serde_json::to_value(e).expect("raw JSON is JSON");
            }
            let request = serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/list", "params": params});
            self.send_server(request.to_string());
            let result = match tokio::time::timeout(LIST_TIMEOUT, rx).await {
                Ok(Ok(Reply::Answer {
                    result: Some(r), ..
                })) => r,
                Ok(_) => return,
                Err(_) => {
                    let mut pending = lock(&self.pending);
                    pending.waiting.remove(&key);
                    pending.abandoned.insert(key);
                    return;
                }
            };
            cursor = lock(&self.catalog).learn(&result);
            if cursor.is_none() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use idemgate_core::MemoryStore;

    use super::*;

    fn session() -> (Session<MemoryStore>, Outputs) {
        let engine = Arc::new(Engine::new(MemoryStore::new()));
        let tenant = TenantId::new("t").unwrap();
        Session::new(engine, Config::default(), "srv".to_owned(), tenant)
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
        let listing =
            r#"{"jsonrpc":"2.0","id":"l","result":{"tools":[{"name":"pay","x-new":[1]}]}}"#;
        session.from_server(listing.to_owned());
        assert_eq!(out.to_client.recv().await.unwrap(), listing);

        session.from_client(call("1"));
        let sent = out.to_server.recv().await.unwrap();
        assert_eq!(sent.frame, call("1"), "relayed as it came");
        sent.sent.unwrap().send(Ok(())).unwrap();
        let answer =
            r#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"paid"}]}}"#;
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
        let own: serde_json::Value =
            serde_json::from_str(&out.to_server.recv().await.unwrap().frame).unwrap();
        assert_eq!(own["method"], "tools/list");
        assert_eq!(
            own["params"]["_meta"],
            serde_json::from_str::<serde_json::Value>(envelope).unwrap(),
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
}

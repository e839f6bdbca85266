//! One proxied MCP session, independent of the transport: frames from the client and from the
//! server go in, frames for each side come out of two channels. Everything but `tools/call`
//! passes through as it came; `tools/list` answers are read on the way to learn the tools.
//!
//! The exception is a client and a server of different protocol eras ([`crate::era`]): the
//! client's first request tells the proxy the client's era, and its answer (or a probe of the
//! proxy's own) the server's. Until both are known, the client's later frames wait, in order.
//! When they differ, the proxy holds the handshake the other side lacks (an `initialize` of its
//! own for a legacy server, or a `server/discover` for a modern one) and translates what must be
//! translated for each request; when they agree, frames pass as they came.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use idemgate_core::{
    Call, Effect, Engine, Event, IdempotencyKey, Store, TenantId, ToolKind, ToolName, ToolPolicy,
    Verdict,
};
use serde_json::value::RawValue;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;

use crate::config::{record_tool, Config, KeySource};
use crate::gate::answer::{self, CallContext, META_CONVERSATION, META_KEY};
use crate::gate::catalog::{Catalog, TaskSupport, Tool, KEY_ARGUMENTS};
use crate::gate::CarriedKey;
use crate::peer::{Outgoing, Pending, Reply};
use crate::wire::era;
use crate::wire::frame::{self, Frame, Object};
use crate::wire::mirror::ParamHeaders;

/// How long the proxy waits for an answer to its own `tools/list`.
const LIST_TIMEOUT: Duration = Duration::from_secs(30);
/// The most pages of its own `tools/list` the proxy reads.
const MAX_LIST_PAGES: usize = 100;
/// How long the proxy waits for a legacy server's answer to the task requests it sends on a
/// modern client's behalf (`tasks/get`, `tasks/result` of a finished task, `tasks/cancel`).
const TASK_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the proxy waits for the answer to a `server/discover` probe before it takes the
/// server for a legacy one (as long as the Python SDK client waits for its own).
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the proxy waits for a legacy server to answer the `initialize` it sends itself (a
/// server started by `npx` may still be downloading).
const INITIALIZE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the proxy waits for the answer to a client's own `initialize`: as long as the client
/// does (a relay sets no deadline of its own; a server that exits ends the wait).
const CLIENT_INITIALIZE_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);

/// What the session knows of the protocol eras of its two sides (see [`crate::era`]).
#[derive(Debug)]
enum Era {
    /// Nothing yet: frames pass as they came.
    Unknown,
    /// Both sides speak the same era (the server took the client's `initialize`, or answered a
    /// modern probe as a modern server): frames pass as they came.
    Same,
    /// A modern client in front of a legacy server, which the proxy initialized itself and which
    /// answered with this `initialize` result.
    Legacy { initialized: Box<RawValue> },
    /// A legacy client in front of a modern server: every request it sends gets this envelope.
    Upgraded { envelope: Object },
    /// A client that opened in the modern era and fell back to `initialize` (it was told the
    /// legacy server's requests reach it only there) after the proxy had initialized the server
    /// for it: frames pass as they came, but its `notifications/initialized` is not sent twice.
    FellBack,
}

/// The era, and the client's frames held while the proxy learns it.
#[derive(Debug)]
struct Gate {
    era: Era,
    /// While the era is being learned: the client's frames that came meanwhile, in order.
    held: Option<VecDeque<(String, CarriedKey)>>,
}

/// How a client opened the session, when that decides the eras.
enum Opening {
    /// A legacy client: `initialize`.
    Initialize,
    /// A modern client's first request, with its envelope; `server/discover` or another.
    Modern { envelope: Object, discover: bool },
}

/// One MCP session through the proxy.
pub struct Session<S> {
    inner: Arc<Inner<S>>,
}

struct Inner<S> {
    engine: Arc<Engine<S>>,
    config: Config,
    server: String,
    tenant: TenantId,
    catalog: Mutex<Catalog>,
    /// The tool parameters that requests of the 2026-07-28 era mirror in headers, learned from
    /// the same listings as the catalog; the HTTP transport checks sessionless requests by it.
    params: Arc<Mutex<ParamHeaders>>,
    /// One listing of the proxy's own at a time.
    listing: tokio::sync::Mutex<()>,
    to_client: mpsc::UnboundedSender<String>,
    to_server: mpsc::UnboundedSender<Outgoing>,
    pending: Mutex<Pending>,
    /// Ids of the client's `tools/list` requests not answered yet.
    lists: Mutex<HashSet<String>>,
    /// Ids of writes sent to the server and not answered yet (their cancellations are held).
    writes: Mutex<HashSet<String>>,
    /// Writes in flight while the proxy refused one of the server's requests (a modern client
    /// takes none), with the method refused: a failure they answer may be the proxy's doing,
    /// so it is never stored as what the tool did ([`Inner::forward`]).
    refused_during: Mutex<HashMap<String, String>>,
    next_id: AtomicU64,
    gate: Mutex<Gate>,
    /// Set once the eras are settled as the same and no frame is held: from then on frames pass
    /// without a look at the gate (the common case costs an atomic load, not three locks).
    same_era: AtomicBool,
    /// Ids of a modern client's requests (other than `tools/call`) sent to a legacy server and
    /// not answered yet, with whether their method's result is cacheable: their results get
    /// what a modern result has ([`era::completed_response`]).
    modern_ids: Mutex<HashMap<String, bool>>,
    /// The tasks the session runs: judged calls, and the opening that learns the eras.
    calls: Mutex<JoinSet<()>>,
    /// The scope of the session's calls without a key (`Call::scope`): an identical call is
    /// the same action within the fallback window in this session only, unless the call names
    /// its conversation (`_meta["dev.idemgate/conversation"]`).
    scope: Arc<str>,
}

/// The two channels a transport drains: frames for the client and frames for the server.
#[derive(Debug)]
pub struct Outputs {
    /// Frames for the client, without newline.
    pub to_client: mpsc::UnboundedReceiver<String>,
    /// Frames for the server.
    pub to_server: mpsc::UnboundedReceiver<Outgoing>,
}

/// How a frame opens the session, when it is a request that decides the eras.
fn opening(f: &Frame) -> Option<Opening> {
    f.id.as_ref()?;
    let method = f.method.as_deref()?;
    if method == "initialize" {
        return Some(Opening::Initialize);
    }
    let params = f.params.as_deref().and_then(frame::object)?;
    Some(Opening::Modern {
        envelope: era::envelope(&params)?,
        discover: method == "server/discover",
    })
}

/// The task a server's answer to `tasks/get` holds, or the answer to the client's request `id`
/// when it holds none: the server's error, or why no answer came.
fn task_of(id: &RawValue, reply: Option<Reply>) -> Result<Object, String> {
    match reply {
        Some(Reply::Answer {
            result: Some(r), ..
        }) => Ok(frame::object(&r).unwrap_or_default()),
        Some(Reply::Answer { error: Some(e), .. }) => Err(format!(
            r#"{{"jsonrpc":"2.0","id":{},"error":{}}}"#,
            id.get(),
            e.get()
        )),
        _ => Err(frame::error_response(
            Some(id),
            -32603,
            "the server did not answer tasks/get",
        )),
    }
}

/// A scope of its own for a session: 128 random bits.
fn session_scope() -> Arc<str> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("failed to read randomness from the operating system");
    Arc::from(format!("session:{}", idemgate_core::key::hex(&bytes)))
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
            params: Arc::default(),
            listing: tokio::sync::Mutex::new(()),
            to_client,
            to_server,
            pending: Mutex::new(Pending::default()),
            lists: Mutex::new(HashSet::new()),
            writes: Mutex::new(HashSet::new()),
            refused_during: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            gate: Mutex::new(Gate {
                era: Era::Unknown,
                held: None,
            }),
            same_era: AtomicBool::new(false),
            modern_ids: Mutex::new(HashMap::new()),
            calls: Mutex::new(JoinSet::new()),
            scope: session_scope(),
        });
        let session = Session { inner };
        (
            session,
            Outputs {
                to_client: client_rx,
                to_server: server_rx,
            },
        )
    }

    /// What the session knows of the tool parameters mirrored in headers (see `Inner::params`).
    pub(crate) fn param_headers(&self) -> Arc<Mutex<ParamHeaders>> {
        Arc::clone(&self.inner.params)
    }

    /// A frame from the client. `tools/call` requests are judged in a task of their own; a
    /// cancellation of a write in flight is held back unless configured; the rest goes on.
    pub fn from_client(&self, line: String) {
        self.from_client_keyed(line, None);
    }

    /// A frame from the client, with the key its transport carried beside it (the
    /// `Idempotency-Key` header of Streamable HTTP), which a `tools/call` uses before any key
    /// of its own: a different key in the frame itself is refused.
    pub fn from_client_keyed(&self, line: String, key: CarriedKey) {
        self.inner.from_client(line, key);
    }

    /// A frame from the server: answers to the proxy's requests go to their callers; everything
    /// else goes to the client as it came.
    pub fn from_server(&self, mut line: String) {
        let inner = &self.inner;
        let frame = Frame::parse(&line);
        if frame
            .as_ref()
            .is_some_and(|f| f.method.as_deref() == Some("notifications/tools/list_changed"))
        {
            lock(&inner.catalog).changed();
        }
        if let Some(Frame {
            method: Some(method),
            id: Some(id),
            ..
        }) = &frame
        {
            if inner.answers_for_a_modern_client(method, id) {
                return;
            }
        }
        if let Some(f) = frame.filter(Frame::is_response) {
            let id = frame::id_key(f.id.as_deref().expect("responses have ids"));
            if let Some(cacheable) = lock(&inner.modern_ids).remove(&id) {
                if let Some(typed) = era::completed_response(&line, cacheable) {
                    line = typed;
                }
            }
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
                    inner.learn(result);
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
            let mut calls = std::mem::take(&mut *lock(&self.inner.calls));
            if calls.is_empty() {
                return;
            }
            while calls.join_next().await.is_some() {}
        }
    }
}

impl<S: Store> Inner<S> {
    /// Learns a `tools/list` result (one page) into the catalog and the mirrored parameters;
    /// the next page's cursor.
    fn learn(&self, result: &RawValue) -> Option<String> {
        if let Ok(value) = serde_json::from_str(result.get()) {
            lock(&self.params).learn(&value);
        }
        lock(&self.catalog).learn(result)
    }
    /// A request of the server's own (sampling, elicitation, roots, ping) when the client is
    /// a modern one in front of a legacy server: that era has no server requests (MCP
    /// 2026-07-28, "stdio" and "Streamable HTTP"), so its clients refuse them (the Python SDK)
    /// or never answer (the TypeScript SDK, and the server waits for ever). The proxy answers
    /// as a legacy client without the capability would: `ping` with an empty result, anything
    /// else with -32601; the writes in flight learn that it did ([`Inner::forward`]). (A client
    /// that declares it takes such requests was kept in the legacy era: [`Inner::discovered`].)
    /// Whether it answered.
    fn answers_for_a_modern_client(&self, method: &str, id: &RawValue) -> bool {
        if self.same_era.load(Ordering::Acquire)
            || !matches!(lock(&self.gate).era, Era::Legacy { .. })
        {
            return false;
        }
        if method == "ping" {
            self.send_server(frame::response(id, &frame::raw(&serde_json::json!({}))));
            return true;
        }
        tracing::info!(%method, "refused a server request: the client speaks the 2026-07-28 era, which takes none");
        let writes: Vec<String> = lock(&self.writes).iter().cloned().collect();
        lock(&self.refused_during).extend(writes.into_iter().map(|w| (w, method.to_owned())));
        self.send_server(frame::error_response(
            Some(id),
            -32601,
            &format!(
                "{method}: the client speaks MCP 2026-07-28, which takes no requests from a server"
            ),
        ));
        true
    }

    fn send_server(&self, frame: String) {
        let frame = self.to_upstream(frame);
        let _ = self.to_server.send(Outgoing { frame, sent: None });
    }

    fn send_client(&self, frame: String) {
        let _ = self.to_client.send(frame);
    }

    /// Runs `task` as one of the session's tasks, which [`Session::drain`] waits for.
    fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        let mut calls = lock(&self.calls);
        // Finished tasks are reaped as new ones come, so a long session stays small.
        while calls.try_join_next().is_some() {}
        calls.spawn(task);
    }

    /// A request for the server as the server's era needs it: a legacy client's request to a
    /// modern server gets the envelope the client's `initialize` implied.
    fn to_upstream(&self, frame: String) -> String {
        if self.same_era.load(Ordering::Acquire) {
            return frame;
        }
        let gate = lock(&self.gate);
        let Era::Upgraded { envelope } = &gate.era else {
            return frame;
        };
        // A request the proxy already put in the modern era's words (a task request, whose
        // envelope declares the tasks extension) keeps its own envelope.
        let legacy_request = Frame::parse(&frame).is_some_and(|f| {
            f.method.is_some()
                && f.id.is_some()
                && era::modern_version_of(f.params.as_deref()).is_none()
        });
        if !legacy_request {
            return frame;
        }
        era::with_envelope(&frame, envelope).unwrap_or(frame)
    }

    /// A frame from the client. Until the eras are known, the frame that decides them (a
    /// legacy `initialize`, or a modern client's first request) starts the opening that learns
    /// them, and later frames wait for it, in order; then frames go to [`Inner::dispatch`].
    fn from_client(self: &Arc<Self>, line: String, key: CarriedKey) {
        let Some(f) = Frame::parse(&line) else {
            self.refuse_unreadable(&line);
            return;
        };
        if self.same_era.load(Ordering::Acquire) {
            self.relay(line, f, key);
            return;
        }
        {
            let mut gate = lock(&self.gate);
            if let Some(held) = &mut gate.held {
                held.push_back((line, key));
                return;
            }
            if matches!(gate.era, Era::Unknown) {
                if let Some(opening) = opening(&f) {
                    let mut held = VecDeque::new();
                    let id = f.id.clone().expect("an opening is a request");
                    let consumed = match &opening {
                        Opening::Initialize | Opening::Modern { discover: true, .. } => Some(line),
                        // Any other first request waits for the eras like the frames after it.
                        Opening::Modern { .. } => {
                            held.push_back((line, key));
                            None
                        }
                    };
                    gate.held = Some(held);
                    drop(gate);
                    let inner = Arc::clone(self);
                    self.spawn(async move {
                        let era = inner.open(opening, id, f.params, consumed).await;
                        inner.release(era);
                    });
                    return;
                }
            }
        }
        self.dispatch(line, f, key);
    }

    /// Text from the client that is not one JSON-RPC message: never relayed (the server could
    /// read a tool call in it that the proxy did not judge); the client is told why.
    fn refuse_unreadable(&self, line: &str) {
        tracing::warn!("refused a client message that is not one JSON-RPC message");
        if let Some(answer) = frame::refusal_of_unreadable(line) {
            self.send_client(answer);
        }
    }

    /// Settles the eras and lets the held frames go, in the order they came (frames that come
    /// while they go wait behind them).
    fn release(self: &Arc<Self>, era: Era) {
        tracing::debug!(?era, "protocol eras settled");
        lock(&self.gate).era = era;
        loop {
            let batch = {
                let mut gate = lock(&self.gate);
                match gate.held.as_mut() {
                    Some(held) if !held.is_empty() => std::mem::take(held),
                    _ => {
                        gate.held = None;
                        if matches!(gate.era, Era::Same) {
                            self.same_era.store(true, Ordering::Release);
                        }
                        return;
                    }
                }
            };
            for (line, key) in batch {
                match Frame::parse(&line) {
                    Some(f) => self.dispatch(line, f, key),
                    None => self.refuse_unreadable(&line),
                }
            }
        }
    }

    /// Learns the eras from how the client opened: answers the opening request when it is
    /// `initialize` or `server/discover` (`line`), and returns the era the session keeps.
    async fn open(
        &self,
        opening: Opening,
        id: Box<RawValue>,
        params: Option<Box<RawValue>>,
        line: Option<String>,
    ) -> Era {
        let params = params
            .as_deref()
            .and_then(frame::object)
            .unwrap_or_default();
        match opening {
            Opening::Initialize => {
                let line = line.expect("initialize is consumed");
                self.open_legacy_client(&id, &params, line).await
            }
            Opening::Modern { envelope, discover } => {
                self.open_modern_client(&id, &params, envelope, discover.then_some(line).flatten())
                    .await
            }
        }
    }

    /// A legacy client's `initialize`: passed to the server; if the server refuses it and
    /// answers a modern `server/discover`, it is a modern-only server, and the client gets an
    /// `initialize` result made from the discovery (MCP 2026-07-28, "Versioning").
    async fn open_legacy_client(&self, id: &RawValue, params: &Object, line: String) -> Era {
        let reply = self
            .ask_frame(frame::id_key(id), line, CLIENT_INITIALIZE_TIMEOUT)
            .await;
        let Some(Reply::Answer {
            frame: answer,
            error: Some(_),
            ..
        }) = reply
        else {
            if let Some(Reply::Answer { frame, .. }) = reply {
                self.send_client(frame);
            }
            return Era::Same;
        };
        let envelope = era::envelope_from_initialize(params);
        let discover_params = serde_json::json!({ "_meta": &envelope });
        match self
            .ask("server/discover", discover_params, PROBE_TIMEOUT)
            .await
        {
            Some(Reply::Answer {
                result: Some(discovered),
                ..
            }) => {
                let requested = frame::string(params, "protocolVersion");
                let result = era::initialize_from_discover(&discovered, requested.as_deref());
                tracing::info!("the server speaks only the modern era: the proxy translates for a legacy client");
                self.send_client(frame::response(id, &result));
                Era::Upgraded { envelope }
            }
            // Not a modern server either: the client gets the server's refusal.
            _ => {
                self.send_client(answer);
                Era::Same
            }
        }
    }

    /// A modern client's first request: probes the server with `server/discover` (the
    /// client's own when that is the request, `discover`). A discovery, or an error only a
    /// modern server sends, means a modern server: frames pass as they came. Any other error, or
    /// no answer in time, means a legacy server (MCP 2026-07-28, "stdio: Backward
    /// Compatibility": the fallback is not keyed to one error code, servers answer
    /// -32601, -32602 or nothing): the proxy initializes it with the client's capabilities and
    /// identity and answers `server/discover` itself from the `initialize` result.
    async fn open_modern_client(
        &self,
        id: &RawValue,
        params: &Object,
        envelope: Object,
        discover: Option<String>,
    ) -> Era {
        let probe = match discover.clone() {
            Some(line) => self.ask_frame(frame::id_key(id), line, PROBE_TIMEOUT).await,
            None => {
                let probe_params = serde_json::json!({ "_meta": &envelope });
                self.ask("server/discover", probe_params, PROBE_TIMEOUT)
                    .await
            }
        };
        let legacy = match &probe {
            Some(Reply::Answer { error: Some(e), .. }) => !era::is_modern_error(e),
            Some(Reply::Answer { .. } | Reply::Closed(_)) => false,
            None => true,
        };
        let era = if legacy {
            self.initialize_legacy_server(&envelope).await
        } else {
            Era::Same
        };
        if discover.is_some() {
            let answer = match (&era, probe) {
                (Era::Legacy { initialized }, _) => Some(self.discovered(id, params, initialized)),
                (_, Some(Reply::Answer { frame, .. })) => Some(frame),
                _ => None,
            };
            if let Some(a) = answer {
                self.send_client(a);
            }
        }
        era
    }

    /// Initializes a legacy server for a modern client whose envelope is `envelope`; the
    /// session's era after it.
    async fn initialize_legacy_server(&self, envelope: &Object) -> Era {
        let reply = self
            .ask(
                "initialize",
                era::initialize_params(envelope),
                INITIALIZE_TIMEOUT,
            )
            .await;
        let Some(Reply::Answer {
            result: Some(initialized),
            ..
        }) = reply
        else {
            tracing::warn!("the server refused the proxy's initialize: frames pass untranslated");
            return Era::Same;
        };
        self.send_server(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.to_owned());
        tracing::info!(
            "the server speaks only the legacy era: the proxy translates for a modern client"
        );
        Era::Legacy { initialized }
    }

    /// The answer to a modern client's `server/discover` in front of a legacy server: the
    /// discovery made from the server's `initialize` result, unless the client takes requests
    /// from the server, which only the legacy era carries: then it is told to use that era.
    fn discovered(&self, id: &RawValue, params: &Object, initialized: &RawValue) -> String {
        match era::modern_version(params) {
            Some(v) if !era::MODERN_VERSIONS.contains(&v.as_str()) => {
                era::unsupported_version(id, &v)
            }
            Some(v) if era::takes_server_requests(params) => {
                tracing::info!(
                    "a client that takes server requests is kept in the legacy era of the server"
                );
                era::legacy_only(id, &v, initialized)
            }
            _ => frame::response(id, &era::discover_from_initialize(initialized)),
        }
    }

    /// A client frame once the eras are known: what the eras change, then [`Inner::relay`].
    fn dispatch(self: &Arc<Self>, line: String, f: Frame, key: CarriedKey) {
        let method = f.method.as_deref();
        {
            let gate = lock(&self.gate);
            match (&gate.era, method, f.id.as_deref()) {
                // A modern client before a legacy server: the proxy holds the handshake.
                (Era::Legacy { initialized }, Some("server/discover"), Some(id)) => {
                    let params = f
                        .params
                        .as_deref()
                        .and_then(frame::object)
                        .unwrap_or_default();
                    self.send_client(self.discovered(id, &params, initialized));
                    return;
                }
                // The tasks extension's words for a legacy server's tasks.
                (Era::Legacy { .. }, Some(m @ ("tasks/get" | "tasks/cancel")), Some(id))
                    if era::modern_version_of(f.params.as_deref()).is_some() =>
                {
                    let (inner, id, method) = (Arc::clone(self), id.to_owned(), m.to_owned());
                    let params = f.params.clone();
                    drop(gate);
                    self.spawn(async move {
                        let answer = inner.task_request(&id, &method, params.as_deref()).await;
                        inner.send_client(answer);
                    });
                    return;
                }
                // A legacy client's task requests before a server of the tasks extension.
                (
                    Era::Upgraded { envelope },
                    Some(m @ ("tasks/get" | "tasks/result" | "tasks/cancel" | "tasks/list")),
                    Some(id),
                ) => {
                    let (inner, id, method) = (Arc::clone(self), id.to_owned(), m.to_owned());
                    let (params, envelope) =
                        (f.params.clone(), era::with_tasks_extension(envelope));
                    drop(gate);
                    self.spawn(async move {
                        let answer = inner
                            .legacy_task_request(&id, &method, params.as_deref(), envelope)
                            .await;
                        inner.send_client(answer);
                    });
                    return;
                }
                // The client fell back to a handshake the proxy already made: from now on it is
                // a legacy client, which takes the server's requests.
                (Era::Legacy { initialized }, Some("initialize"), Some(id)) => {
                    self.send_client(frame::response(id, initialized));
                    drop(gate);
                    lock(&self.gate).era = Era::FellBack;
                    return;
                }
                (Era::FellBack, Some("notifications/initialized"), None) => {
                    drop(gate);
                    lock(&self.gate).era = Era::Same;
                    self.same_era.store(true, Ordering::Release);
                    return;
                }
                (
                    Era::Legacy { .. } | Era::Upgraded { .. },
                    Some("notifications/initialized"),
                    None,
                ) => {
                    return;
                }
                (Era::Legacy { .. }, Some(m), Some(id))
                    if m != "tools/call"
                        && era::modern_version_of(f.params.as_deref()).is_some() =>
                {
                    lock(&self.modern_ids).insert(frame::id_key(id), era::is_cacheable(m));
                }
                // The modern era has no ping; the proxy answers it for a legacy client.
                (Era::Upgraded { .. }, Some("ping"), Some(id)) => {
                    self.send_client(frame::response(id, &frame::raw(&serde_json::json!({}))));
                    return;
                }
                _ => {}
            }
        }
        self.relay(line, f, key);
    }

    /// A client frame as every era relays it: `tools/call` judged in a task of its own, a
    /// cancellation of a write in flight held back unless configured, the rest on to the server.
    fn relay(self: &Arc<Self>, line: String, f: Frame, key: CarriedKey) {
        match (f.method.as_deref(), f.id) {
            (Some("tools/call"), Some(id)) => {
                let inner = Arc::clone(self);
                let params = f.params;
                self.spawn(async move {
                    let answer = inner.call(&id, line, params.as_deref(), key).await;
                    inner.send_client(answer);
                });
            }
            // A tool call without an id would run with no answer to store or replay: it is
            // never sent (a notification gets no answer, so the client is not told).
            (Some("tools/call"), None) => {
                tracing::warn!("dropped a tools/call without an id: it cannot be judged");
            }
            (Some("tools/list"), Some(id)) => {
                lock(&self.lists).insert(frame::id_key(&id));
                self.send_server(line);
            }
            (Some("notifications/cancelled"), None) if !self.config.forward_cancel => {
                let request = f
                    .params
                    .as_deref()
                    .and_then(frame::object)
                    .and_then(|p| p.get("requestId").map(|id| frame::id_key(id)));
                // A started write runs to its end, so that its outcome is stored and the retry
                // that follows replays it instead of finding it unknown.
                if request.is_some_and(|r| lock(&self.writes).contains(&r)) {
                    tracing::info!("held back the cancellation of a write in flight");
                    return;
                }
                self.send_server(line);
            }
            _ => self.send_server(line),
        }
    }

    /// Judges one `tools/call` and returns the frame that answers it.
    async fn call(
        &self,
        id: &RawValue,
        line: String,
        params: Option<&RawValue>,
        carried: CarriedKey,
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
        let tool = self.describe(&name, era::envelope(&params)).await;
        let policy = self.config.policy(&name, tool.as_ref());
        cx.policy = &policy;
        let key = match self.key_of(&params, &arguments, carried) {
            Ok(k) => k,
            Err(e) => return self.refuse(&cx, &scope, format!("{e}; nothing was done.")),
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
        // The window joins identical calls of one conversation: the client's, when it names
        // one, else this session.
        let conversation = params
            .get("_meta")
            .and_then(|m| frame::object(m))
            .and_then(|m| frame::string(&m, META_CONVERSATION));
        call = call.scope(match conversation {
            Some(c) => Arc::from(format!("conversation:{c}")),
            None => Arc::clone(&self.scope),
        });
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
        let mut forwarded = if stripped || filled {
            frame::with_arguments(&line, &arguments).unwrap_or(line)
        } else {
            line
        };
        // A legacy server runs a tool as a task only when the call asks (2025-11-25
        // `params.task`); a modern client asks by declaring the tasks extension, and the handle
        // the server answers goes back in the extension's words (`era::mark_complete`).
        let legacy_server = {
            let gate = lock(&self.gate);
            // A legacy client's task-augmented call before a modern server: the tasks
            // extension's request, and its handle back in the client's words (`answer::relayed`).
            if let Era::Upgraded { envelope } = &gate.era {
                if params.contains_key("task") {
                    forwarded = era::modern_task_call(&forwarded, envelope).unwrap_or(forwarded);
                }
            }
            cx.result_type && matches!(gate.era, Era::Legacy { .. })
        };
        let support = tool
            .as_ref()
            .map_or(TaskSupport::Forbidden, |t| t.task_support);
        if legacy_server && support != TaskSupport::Forbidden {
            if era::takes_tasks(&params) {
                forwarded =
                    frame::with_param(&forwarded, "task", &frame::raw(&serde_json::json!({})))
                        .unwrap_or(forwarded);
            } else if support == TaskSupport::Required {
                return era::missing_tasks_extension(id, &name);
            }
        }
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

    /// A modern client's `tasks/get` or `tasks/cancel` before a legacy server, answered in the
    /// tasks extension's words from the server's own `tasks/get`, `tasks/result` and
    /// `tasks/cancel`: a finished task carries its `result` (or `error`) inline, and a tool
    /// result with `isError` is a `completed` task (2025-11-25 called it `failed`); a cancel is
    /// acknowledged whatever became of the task.
    async fn task_request(&self, id: &RawValue, method: &str, params: Option<&RawValue>) -> String {
        let params = params.and_then(frame::object).unwrap_or_default();
        let Some(task_id) = params.get("taskId").cloned() else {
            return frame::error_response(Some(id), -32602, "Invalid params: taskId is required");
        };
        let ask = |method: &'static str| {
            self.ask(
                method,
                serde_json::json!({ "taskId": &task_id }),
                TASK_TIMEOUT,
            )
        };
        if method == "tasks/cancel" {
            let _ = ask("tasks/cancel").await;
            return frame::response(
                id,
                &frame::raw(&serde_json::json!({"resultType": "complete"})),
            );
        }
        let task = match task_of(id, ask("tasks/get").await) {
            Ok(task) => task,
            Err(answer) => return answer,
        };
        let finished = matches!(
            frame::string(&task, "status").as_deref(),
            Some("completed" | "failed")
        );
        let mut answer = era::modern_task(task);
        if finished {
            match ask("tasks/result").await {
                Some(Reply::Answer {
                    result: Some(r), ..
                }) => {
                    answer.insert("status".to_owned(), frame::raw(&"completed"));
                    answer.insert("result".to_owned(), r);
                }
                Some(Reply::Answer { error: Some(e), .. }) => {
                    answer.insert("status".to_owned(), frame::raw(&"failed"));
                    answer.insert("error".to_owned(), e);
                }
                _ => {}
            }
        }
        answer.insert("resultType".to_owned(), frame::raw(&"complete"));
        frame::response(id, &frame::raw(&answer))
    }

    /// A legacy client's `tasks/get`, `tasks/result`, `tasks/cancel` or `tasks/list` before a
    /// modern server of the tasks extension (whose requests carry `envelope`), in 2025-11-25
    /// words ([`era::legacy_task`]): `tasks/result`, which the extension has not, polls the
    /// server's `tasks/get` at its `pollIntervalMs` until the task ends and answers with its
    /// result (marked with the related task, as that era does) or its error; `tasks/cancel`
    /// asks the server to cancel and answers with the task, `cancelled` unless it had ended;
    /// `tasks/list`, which the extension has not either, is refused (`-32601`; the proxy
    /// declares no `tasks.list` capability).
    async fn legacy_task_request(
        &self,
        id: &RawValue,
        method: &str,
        params: Option<&RawValue>,
        envelope: Object,
    ) -> String {
        if method == "tasks/list" {
            return frame::error_response(
                Some(id),
                -32601,
                "tasks/list: the server speaks the 2026 tasks extension, which lists no tasks",
            );
        }
        let params = params.and_then(frame::object).unwrap_or_default();
        let Some(task_id) = params.get("taskId").cloned() else {
            return frame::error_response(Some(id), -32602, "Invalid params: taskId is required");
        };
        let ask = |method: &'static str| {
            let params = serde_json::json!({ "taskId": &task_id, "_meta": &envelope });
            self.ask(method, params, TASK_TIMEOUT)
        };
        if method == "tasks/cancel" {
            let _ = ask("tasks/cancel").await;
        }
        loop {
            let task = match task_of(id, ask("tasks/get").await) {
                Ok(task) => task,
                Err(answer) => return answer,
            };
            let status = frame::string(&task, "status").unwrap_or_default();
            let ended = ["completed", "failed", "cancelled"].contains(&status.as_str());
            match method {
                "tasks/get" => return frame::response(id, &frame::raw(&era::legacy_task(&task))),
                "tasks/cancel" => {
                    let mut answer = era::legacy_task(&task);
                    if !ended {
                        answer.insert("status".to_owned(), frame::raw(&"cancelled"));
                    }
                    return frame::response(id, &frame::raw(&answer));
                }
                _ => {}
            }
            match (status.as_str(), task.get("result"), task.get("error")) {
                ("completed", Some(result), _) => {
                    let mut result = frame::object(result).unwrap_or_default();
                    let mut meta = result
                        .get("_meta")
                        .and_then(|m| frame::object(m))
                        .unwrap_or_default();
                    meta.insert(
                        "io.modelcontextprotocol/related-task".to_owned(),
                        frame::raw(&serde_json::json!({ "taskId": &task_id })),
                    );
                    result.insert("_meta".to_owned(), frame::raw(&meta));
                    return frame::response(id, &frame::raw(&result));
                }
                (_, _, Some(error)) if ended => {
                    return format!(
                        r#"{{"jsonrpc":"2.0","id":{},"error":{}}}"#,
                        id.get(),
                        error.get()
                    )
                }
                _ if ended => {
                    return frame::error_response(
                        Some(id),
                        -32602,
                        &format!("the task ended {status} without a result"),
                    )
                }
                _ => {}
            }
            let poll = task
                .get("pollIntervalMs")
                .and_then(|p| serde_json::from_str::<u64>(p.get()).ok())
                .unwrap_or(1000);
            tokio::time::sleep(Duration::from_millis(poll.clamp(10, 5000))).await;
        }
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

    /// The call's key: the one its transport carried (`carried`) and those in the sources the
    /// configuration names. A key is a string of the key's form; a source holding anything else
    /// is an error, not an absent key (JSON `null` is absent). When several sources hold a key
    /// they must agree: a call whose keys differ is refused, on every transport, since it does
    /// not say which action it names.
    fn key_of(
        &self,
        params: &Object,
        arguments: &Object,
        carried: CarriedKey,
    ) -> Result<Option<IdempotencyKey>, String> {
        fn read(
            value: &RawValue,
            from: String,
        ) -> Result<Option<(IdempotencyKey, String)>, String> {
            if value.get() == "null" {
                return Ok(None);
            }
            let Ok(text) = serde_json::from_str::<String>(value.get()) else {
                let mut shown: String = value.get().chars().take(40).collect();
                if shown.len() < value.get().len() {
                    shown.push('…');
                }
                return Err(format!(
                    "the idempotency key in {from} must be a string, not {shown}"
                ));
            };
            match IdempotencyKey::explicit(text) {
                Ok(k) => Ok(Some((k, from))),
                Err(e) => Err(format!("the idempotency key in {from} is invalid: {e}")),
            }
        }
        let mut found: Vec<(IdempotencyKey, String)> = Vec::new();
        if let Some(carried) = carried {
            let header = "the Idempotency-Key header";
            let key = carried.map_err(|e| {
                if e.starts_with(header) {
                    e
                } else {
                    format!("{header} is invalid: {e}")
                }
            })?;
            found.push((key, header.to_owned()));
        }
        let meta = params.get("_meta").and_then(|m| frame::object(m));
        for source in &self.config.key_sources {
            match source {
                KeySource::Meta => {
                    if let Some(v) = meta.as_ref().and_then(|m| m.get(META_KEY)) {
                        found.extend(read(v, format!("_meta[\"{META_KEY}\"]"))?);
                    }
                }
                KeySource::Params => {
                    if let Some(v) = params.get("idempotencyKey") {
                        found.extend(read(v, "params.idempotencyKey".to_owned())?);
                    }
                }
                KeySource::Argument => {
                    for k in KEY_ARGUMENTS {
                        if let Some(v) = arguments.get(k) {
                            found.extend(read(v, format!("argument {k}"))?);
                        }
                    }
                }
            }
        }
        let mut found = found.into_iter();
        let Some((key, from)) = found.next() else {
            return Ok(None);
        };
        if let Some((other, other_from)) = found.find(|(k, _)| *k != key) {
            return Err(format!(
                "the idempotency keys in {from} ({}) and in {other_from} ({}) differ",
                key.as_str(),
                other.as_str()
            ));
        }
        Ok(Some(key))
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
            frame: self.to_upstream(frame),
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
        let mut effect = reply.effect();
        if let Some(method) = lock(&self.refused_during).remove(&id) {
            // The proxy refused the server's request during this call: a failure may be the
            // proxy's doing, not the tool's, and is never stored as the tool's outcome. What the
            // tool did before it asked is not known either: the outcome is unknown.
            if matches!(effect, Effect::Failed(_)) {
                effect = Effect::Ambiguous(format!(
                    "the tool failed after the proxy refused the server's {method} request (the client speaks MCP 2026-07-28, which takes no server requests); the failure may be the proxy's doing"
                ));
            }
        }
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
            let mut params = match &cursor {
                Some(c) => serde_json::json!({ "cursor": c }),
                None => serde_json::json!({}),
            };
            if let Some(e) = &envelope {
                params["_meta"] = serde_json::to_value(e).expect("raw JSON is JSON");
            }
            let Some(Reply::Answer {
                result: Some(result),
                ..
            }) = self.ask("tools/list", params, LIST_TIMEOUT).await
            else {
                return;
            };
            cursor = self.learn(&result);
            if cursor.is_none() {
                return;
            }
        }
    }

    /// Sends a request of the proxy's own (an id the client never uses) and waits for its
    /// answer; see [`Inner::ask_frame`].
    async fn ask(
        &self,
        method: &str,
        params: serde_json::Value,
        timeout: Duration,
    ) -> Option<Reply> {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let id = format!("dev.idemgate/{method}-{n}");
        let request =
            serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.ask_frame(
            frame::id_key(&frame::raw(&id)),
            request.to_string(),
            timeout,
        )
        .await
    }

    /// Sends the request `frame` whose id is `key` and waits for its answer, which goes to the
    /// proxy, not the client: `Reply::Closed` when the server is gone, `None` when no answer came
    /// within `timeout` (a late one is dropped).
    async fn ask_frame(&self, key: String, frame: String, timeout: Duration) -> Option<Reply> {
        let (tx, rx) = oneshot::channel();
        {
            let mut pending = lock(&self.pending);
            if let Some(why) = &pending.closed {
                return Some(Reply::Closed(why.clone()));
            }
            pending.waiting.insert(key.clone(), tx);
        }
        self.send_server(frame);
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(reply)) => Some(reply),
            Ok(Err(_)) => Some(Reply::Closed(
                "the proxy lost track of its request".to_owned(),
            )),
            Err(_) => {
                let mut pending = lock(&self.pending);
                pending.waiting.remove(&key);
                pending.abandoned.insert(key);
                None
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
        serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
            .to_string()
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
}

//! The Streamable HTTP transport (MCP 2025-11-25, "Transports"): the client side is one endpoint,
//! `/mcp`, where a POST carries one JSON-RPC message, a GET opens the stream of the server's own
//! requests and notifications, and a DELETE ends the session; the server side is a child process
//! over stdio, one per session (or, with an [`Upstream::Http`], one session of a remote server
//! per session, through the adapter in [`crate::upstream`]).
//!
//! Why a child per session: a stdio MCP server holds exactly one session (one `initialize`, the
//! client's capabilities, its subscriptions and log level, and its own requests to that one
//! client). Sharing one child between sessions would mean answering `initialize` for it, renaming
//! every request id in both directions, and guessing which client a server request is meant for.
//! A child per session keeps the proxy a relay, and the server's requests reach the one client
//! whose session it is. The cost is a process per session, bounded by `http.max_sessions` and
//! `http.idle_timeout`.
//!
//! Sessionless requests (MCP 2026-07-28): a POST without `Mcp-Session-Id` whose message names
//! protocol 2026-07-28 or later in `params._meta` goes to one child shared by every such request
//! of its tenant (tenants never share a child, so never see each other's results). The session
//! of that child learns the server's era as for any session ([`Session`]): a legacy
//! server is initialized by the proxy with the first request's client capabilities and info.
//! Request ids are the clients' own, so two clients may send the same one: each request gets an
//! id of the proxy's on the way in and its own back on the way out. Such a client has no stream
//! for the server's own messages: the server's requests are refused (`-32601`), its
//! notifications dropped, and the answer is always `application/json`.
//!
//! Answers: a POST of a request is answered with `application/json` when the server's answer is
//! the first thing that comes for it; when the server first sends requests or notifications of
//! its own while the request is in flight and no GET stream is open, the POST turns into a
//! `text/event-stream` that carries them and then the answer. The server's own messages go to the
//! GET stream when there is one, else to a POST stream in flight, else wait for the next GET.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use futures_util::stream::{self, Stream, StreamExt as _};
use idemgate_core::{Engine, Store, TenantId};
use idemgate_kit::tenants::{authenticate, Tenant};
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinSet;

use crate::config::Config;
use crate::era;
use crate::error::Error;
use crate::frame::{self, Frame};
use crate::mirror::{self, ParamHeaders};
use crate::session::{CarriedKey, Outputs, Session};
use crate::stdio;
use crate::upstream::Upstream;

/// The endpoint's path.
pub const ENDPOINT: &str = "/mcp";
/// The session header.
pub const SESSION_HEADER: &str = "mcp-session-id";
/// The protocol version header.
pub const VERSION_HEADER: &str = "mcp-protocol-version";
/// The method header of the modern era (MCP 2026-07-28, "Request Metadata").
pub const METHOD_HEADER: &str = "mcp-method";
/// The name header of the modern era: the tool's or prompt's name, or the resource's URI.
pub const NAME_HEADER: &str = "mcp-name";
/// Protocol versions with Streamable HTTP a client may name besides the one its session agreed.
const KNOWN_VERSIONS: &[&str] = &["2025-03-26", "2025-06-18", "2025-11-25"];
/// Server messages kept for a GET stream that is not open yet; older ones are dropped.
const MAX_QUEUED: usize = 1000;

/// Everything the transport serves with: the engine, the configuration, the server's command,
/// and the sessions open.
pub struct Proxy<S> {
    engine: Arc<Engine<S>>,
    config: Config,
    server: String,
    upstream: Upstream,
    tenants: Vec<Arc<Tenant>>,
    tenant: TenantId,
    sessions: Mutex<HashMap<String, Arc<Live>>>,
    /// The child each tenant's sessionless requests share.
    shared: Mutex<HashMap<TenantId, Arc<Live>>>,
    /// The number of the next sessionless request (its id on the way to the shared child).
    next_request: AtomicU64,
    tasks: Mutex<JoinSet<()>>,
    stopping: AtomicBool,
}

/// One open session.
struct Live {
    id: String,
    tenant: TenantId,
    /// Whether it serves sessionless requests (no stream for the server's own messages).
    shared: bool,
    to_session: mpsc::UnboundedSender<(String, CarriedKey)>,
    /// The session's knowledge of the tool parameters mirrored in headers.
    params: Arc<Mutex<ParamHeaders>>,
    routes: Mutex<Routes>,
    stop: Notify,
    last_used: Mutex<Instant>,
}

/// Where frames for the client go.
#[derive(Default)]
struct Routes {
    /// POSTs waiting for the answer to their request, by request id, each with its number.
    posts: HashMap<String, VecDeque<(u64, mpsc::UnboundedSender<String>)>>,
    /// The number of the next POST.
    next: u64,
    /// The GET stream, when one is open.
    get: Option<mpsc::UnboundedSender<String>>,
    /// Server messages that found no stream.
    queued: VecDeque<String>,
    /// The protocol version `initialize` agreed.
    version: Option<String>,
    /// What sessionless requests asked to be told besides their answer, by request id.
    asks: HashMap<String, Asks>,
    /// The session has ended: nothing more comes.
    closed: bool,
}

/// What a sessionless request asks to be told on its own stream before its answer (MCP
/// 2026-07-28: no session, so no GET stream; a request's notifications go with its answer):
/// progress for its `progressToken` (renamed on the way to the shared process, whose requests
/// come from many clients, to the request's id there), and log messages at or above its
/// `io.modelcontextprotocol/logLevel`.
#[derive(Debug, Default)]
struct Asks {
    /// The client's own progress token, given back in the notifications routed to it.
    progress_token: Option<Box<serde_json::value::RawValue>>,
    /// The least severe log level the request wants.
    log_level: Option<usize>,
}

/// The `_meta` member by which a 2026-07-28 request asks for log messages.
const META_LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";
/// Log levels from the least severe (MCP, "Logging", RFC 5424).
const LOG_LEVELS: &[&str] = &[
    "debug",
    "info",
    "notice",
    "warning",
    "error",
    "critical",
    "alert",
    "emergency",
];

fn log_severity(level: &str) -> Option<usize> {
    LOG_LEVELS.iter().position(|l| *l == level)
}

/// A sessionless request for the shared process: its id replaced by `proxy_id`, and its
/// progress token, if it has one, too (the notifications for it are routed back by it); what it
/// asks to be told besides its answer.
fn for_shared(text: &str, proxy_id: &serde_json::value::RawValue) -> Option<(String, Asks)> {
    let mut message: frame::Object = serde_json::from_str(text).ok()?;
    message.insert("id".to_owned(), proxy_id.to_owned());
    let mut asks = Asks::default();
    let params = message.get("params").and_then(|p| frame::object(p));
    if let Some(mut params) = params {
        if let Some(mut meta) = params.get("_meta").and_then(|m| frame::object(m)) {
            asks.log_level = frame::string(&meta, META_LOG_LEVEL).and_then(|l| log_severity(&l));
            if let Some(token) = meta.insert("progressToken".to_owned(), proxy_id.to_owned()) {
                asks.progress_token = Some(token);
                params.insert("_meta".to_owned(), frame::raw(&meta));
                message.insert("params".to_owned(), frame::raw(&params));
            }
        }
    }
    Some((serde_json::to_string(&message).ok()?, asks))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every change under these locks leaves the maps consistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Live {
    /// Sends a frame from the session to where it belongs.
    fn route(&self, mut frame: String) {
        let parsed = Frame::parse(&frame);
        let mut r = lock(&self.routes);
        if let Some(f) = parsed.filter(Frame::is_response) {
            let id = frame::id_key(f.id.as_deref().expect("responses have ids"));
            if let Some(waiting) = r.posts.get_mut(&id) {
                while let Some((_, tx)) = waiting.pop_front() {
                    match tx.send(frame) {
                        Ok(()) => break,
                        Err(back) => frame = back.0,
                    }
                }
                if waiting.is_empty() {
                    r.posts.remove(&id);
                }
            }
            // Nobody waits any more (the client hung up): the outcome is recorded all the same.
            return;
        }
        if self.shared {
            match Frame::parse(&frame).and_then(|f| f.method.zip(f.params)) {
                Some((m, params)) if m == "notifications/progress" => {
                    Self::progress_to_its_request(&mut r, &params);
                }
                Some((m, params)) if m == "notifications/message" => {
                    Self::log_to_requests_that_asked(&r, &frame, &params);
                }
                _ => {
                    drop(r);
                    self.refuse_server_message(&frame);
                }
            }
            return;
        }
        if let Some(tx) = &r.get {
            match tx.send(frame) {
                Ok(()) => return,
                Err(back) => {
                    frame = back.0;
                    r.get = None;
                }
            }
        }
        for waiting in r.posts.values() {
            for (_, tx) in waiting {
                match tx.send(frame) {
                    Ok(()) => return,
                    Err(back) => frame = back.0,
                }
            }
        }
        r.queued.push_back(frame);
        if r.queued.len() > MAX_QUEUED {
            r.queued.pop_front();
        }
    }

    /// A progress notification of the shared process: to the request whose (renamed) token it
    /// names, with the client's own token back; dropped when that request has been answered.
    fn progress_to_its_request(r: &mut Routes, params: &serde_json::value::RawValue) {
        let Some(mut params) = frame::object(params) else {
            return;
        };
        let Some(id) = params.get("progressToken").map(|t| frame::id_key(t)) else {
            return;
        };
        let Some(token) = r.asks.get(&id).and_then(|a| a.progress_token.clone()) else {
            return;
        };
        params.insert("progressToken".to_owned(), token);
        let note = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": params});
        if let Some((_, tx)) = r.posts.get(&id).and_then(|w| w.front()) {
            let _ = tx.send(note.to_string());
        }
    }

    /// A log message of the shared process, which says not whose request it concerns: to every
    /// request in flight that asked for messages of its level (the process is the tenant's own,
    /// so no other tenant's client hears it).
    fn log_to_requests_that_asked(r: &Routes, frame: &str, params: &serde_json::value::RawValue) {
        let level = frame::object(params)
            .and_then(|p| frame::string(&p, "level"))
            .and_then(|l| log_severity(&l));
        let Some(level) = level else {
            return;
        };
        for (id, asks) in &r.asks {
            if asks.log_level.is_some_and(|wanted| level >= wanted) {
                if let Some((_, tx)) = r.posts.get(id).and_then(|w| w.front()) {
                    let _ = tx.send(frame.to_owned());
                }
            }
        }
    }

    /// A message of the server's own in a shared session: no client has a stream for it. A
    /// request is refused, so that the server does not wait for an answer that cannot come;
    /// a notification is dropped.
    fn refuse_server_message(&self, frame: &str) {
        let Some(Frame {
            method: Some(method),
            id: Some(id),
            ..
        }) = Frame::parse(frame)
        else {
            return;
        };
        tracing::info!(%method, "refused a server request: sessionless clients have no stream for it");
        let refusal = serde_json::json!({
            "jsonrpc": "2.0",
            "id": serde_json::from_str::<serde_json::Value>(id.get()).unwrap_or_default(),
            "error": {"code": -32601, "message": format!("{method}: the client is sessionless (MCP 2026-07-28) and takes no requests from the server")},
        });
        let _ = self.to_session.send((refusal.to_string(), None));
    }

    /// Sends the request `frame`, whose id is `id`, to the session, with a place in the waiting
    /// list for what comes for it; `None` when the session has ended.
    fn submit(
        self: &Arc<Self>,
        id: String,
        frame: String,
        key: CarriedKey,
    ) -> Option<(mpsc::UnboundedReceiver<String>, Waiting)> {
        let (tx, rx) = mpsc::unbounded_channel();
        let waiting = {
            let mut r = lock(&self.routes);
            if r.closed {
                return None;
            }
            r.next += 1;
            let number = r.next;
            r.posts
                .entry(id.clone())
                .or_default()
                .push_back((number, tx));
            Waiting {
                live: Arc::clone(self),
                id,
                number,
            }
        };
        self.to_session.send((frame, key)).ok()?;
        Some((rx, waiting))
    }

    /// The session has ended: every stream ends.
    fn close(&self) {
        let mut r = lock(&self.routes);
        r.closed = true;
        r.posts.clear();
        r.get = None;
    }

    fn touch(&self) {
        *lock(&self.last_used) = Instant::now();
    }

    /// Whether nothing has happened in it for `idle`, with no request in flight.
    fn idle(&self, idle: Duration) -> bool {
        lock(&self.last_used).elapsed() >= idle && lock(&self.routes).posts.is_empty()
    }
}

/// Takes a POST's place in the waiting list off it when the POST ends, answered or not. (It
/// holds no sender: when the session ends, the POST's channel closes and the POST learns so.)
struct Waiting {
    live: Arc<Live>,
    id: String,
    number: u64,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut r = lock(&self.live.routes);
        if let Some(waiting) = r.posts.get_mut(&self.id) {
            waiting.retain(|(n, _)| *n != self.number);
            if waiting.is_empty() {
                r.posts.remove(&self.id);
                r.asks.remove(&self.id);
            }
        }
    }
}

impl<S: Store> Proxy<S> {
    /// A proxy that starts `command` for every session. Without `config.tenants` every session
    /// is `tenant`'s; with them, the bearer token names the tenant.
    pub fn new(
        engine: Arc<Engine<S>>,
        config: Config,
        tenant: TenantId,
        command: Vec<String>,
    ) -> Arc<Self> {
        Self::with_upstream(engine, config, tenant, Upstream::Command(command))
    }

    /// A proxy in front of `upstream`: a command started per session, or a server at a
    /// Streamable HTTP URL, with one upstream session per session of the proxy.
    pub fn with_upstream(
        engine: Arc<Engine<S>>,
        config: Config,
        tenant: TenantId,
        upstream: Upstream,
    ) -> Arc<Self> {
        let server = upstream.name(&config);
        let tenants = config
            .tenants
            .iter()
            .map(|t| Arc::new(Tenant::new(t)))
            .collect();
        Arc::new(Proxy {
            engine,
            config,
            server,
            upstream,
            tenants,
            tenant,
            sessions: Mutex::new(HashMap::new()),
            shared: Mutex::new(HashMap::new()),
            next_request: AtomicU64::new(1),
            tasks: Mutex::new(JoinSet::new()),
            stopping: AtomicBool::new(false),
        })
    }

    /// The axum router of the endpoint.
    pub fn router(self: &Arc<Self>) -> Router {
        Router::new()
            .route(
                ENDPOINT,
                post(post_message::<S>)
                    .get(open_stream::<S>)
                    .delete(end_session::<S>),
            )
            .layer(DefaultBodyLimit::max(self.config.http.max_body_bytes))
            .with_state(Arc::clone(self))
    }

    /// Sessions open now, the shared children of sessionless requests included.
    pub fn sessions(&self) -> usize {
        lock(&self.sessions).len() + lock(&self.shared).len()
    }

    /// Every session open now, the shared ones included.
    fn every_session(&self) -> Vec<Arc<Live>> {
        let mut all: Vec<_> = lock(&self.sessions).values().cloned().collect();
        all.extend(lock(&self.shared).values().cloned());
        all
    }

    /// Serves on `listener` until `shutdown` completes; then ends every session, lets the calls
    /// in flight finish and their outcomes be recorded, and stops the servers.
    ///
    /// # Errors
    /// [`Error::Io`] when serving fails.
    pub async fn serve(
        self: &Arc<Self>,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), Error> {
        let reaper = {
            let proxy = Arc::clone(self);
            tokio::spawn(async move { proxy.reap_idle().await })
        };
        let proxy = Arc::clone(self);
        let result = axum::serve(listener, self.router())
            .with_graceful_shutdown(async move {
                shutdown.await;
                proxy.stop_all();
            })
            .await;
        reaper.abort();
        self.stop_all();
        let mut tasks = std::mem::take(&mut *lock(&self.tasks));
        while tasks.join_next().await.is_some() {}
        result.map_err(Error::Io)
    }

    /// Serves `command` on `listen` until SIGTERM or SIGINT; prints the endpoint's URL on stderr
    /// once it listens.
    ///
    /// # Errors
    /// [`Error::Io`] when the address cannot be bound or serving fails.
    pub async fn run(self: &Arc<Self>, listen: SocketAddr) -> Result<(), Error> {
        let listener = tokio::net::TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        eprintln!("idemgate: MCP Streamable HTTP endpoint at http://{addr}{ENDPOINT}");
        self.serve(listener, stdio::shutdown_signal()).await
    }

    /// Ends every session (their calls in flight run to their end) and opens no more.
    fn stop_all(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        for live in self.every_session() {
            live.stop.notify_one();
        }
    }

    async fn reap_idle(&self) {
        let idle = self.config.http.idle_timeout;
        let every = (idle / 4).clamp(Duration::from_millis(100), Duration::from_secs(60));
        loop {
            tokio::time::sleep(every).await;
            for live in self.every_session() {
                if live.idle(idle) {
                    tracing::info!(session = %live.id, "ended an idle session");
                    if live.shared {
                        // The next sessionless request starts a new child rather than reach
                        // one that is ending.
                        self.forget(&live);
                    }
                    live.stop.notify_one();
                }
            }
        }
    }

    /// Takes `live` out of the sessions (or the shared children) when it is still there: a
    /// session of the same id, or a newer shared child of its tenant, stays.
    fn forget(&self, live: &Arc<Live>) {
        fn remove<K: Eq + std::hash::Hash>(
            map: &mut HashMap<K, Arc<Live>>,
            key: &K,
            live: &Arc<Live>,
        ) {
            if map.get(key).is_some_and(|l| Arc::ptr_eq(l, live)) {
                map.remove(key);
            }
        }
        if live.shared {
            remove(&mut lock(&self.shared), &live.tenant, live);
        } else {
            remove(&mut lock(&self.sessions), &live.id, live);
        }
    }

    /// The child `tenant`'s sessionless requests share, started if there is none.
    fn shared(self: &Arc<Self>, tenant: TenantId) -> Result<Arc<Live>, Refused> {
        // Held while starting one, so that racing first requests start one child.
        let mut shared = lock(&self.shared);
        if let Some(live) = shared.get(&tenant).filter(|l| !lock(&l.routes).closed) {
            live.touch();
            return Ok(Arc::clone(live));
        }
        let live = self.start(
            tenant.clone(),
            true,
            lock(&self.sessions).len() + shared.len(),
        )?;
        shared.insert(tenant, Arc::clone(&live));
        Ok(live)
    }

    /// Starts a session for `tenant`: its server process, and the tasks that relay its frames.
    fn open(self: &Arc<Self>, tenant: TenantId) -> Result<Arc<Live>, Refused> {
        let live = self.start(tenant, false, self.sessions())?;
        lock(&self.sessions).insert(live.id.clone(), Arc::clone(&live));
        Ok(live)
    }

    /// Starts a session (`shared` by sessionless requests, or not) for `tenant` when `open`
    /// sessions leave room: its server process, and the tasks that relay its frames.
    fn start(
        self: &Arc<Self>,
        tenant: TenantId,
        shared: bool,
        open: usize,
    ) -> Result<Arc<Live>, Refused> {
        if self.stopping.load(Ordering::SeqCst) {
            return Err(refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                "the proxy is shutting down",
            ));
        }
        if open >= self.config.http.max_sessions {
            return Err(refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                "too many sessions are open (http.max_sessions); end one with DELETE or retry later",
            ));
        }
        let started = self.upstream.start().map_err(|e| {
            tracing::error!(error = %e, "failed to start the server for a session");
            refuse(StatusCode::BAD_GATEWAY, &e.to_string())
        })?;
        let (session, outputs) = Session::new(
            Arc::clone(&self.engine),
            self.config.clone(),
            self.server.clone(),
            tenant.clone(),
        );
        let (to_session, client_lines) = mpsc::unbounded_channel();
        let live = Arc::new(Live {
            id: session_id(),
            tenant,
            shared,
            to_session,
            params: session.param_headers(),
            routes: Mutex::new(Routes::default()),
            stop: Notify::new(),
            last_used: Mutex::new(Instant::now()),
        });
        let Outputs {
            mut to_client,
            to_server,
        } = outputs;
        let router = {
            let live = Arc::clone(&live);
            tokio::spawn(async move {
                while let Some(frame) = to_client.recv().await {
                    live.route(frame);
                }
            })
        };
        let proxy = Arc::clone(self);
        let task_live = Arc::clone(&live);
        lock(&self.tasks).spawn(async move {
            let live = task_live;
            let ended = stdio::relay(
                session,
                to_server,
                client_lines,
                started.lines,
                started.input,
                live.stop.notified(),
            )
            .await;
            let _ = router.await;
            live.close();
            proxy.forget(&live);
            let status = started.end.wait().await;
            tracing::info!(session = %live.id, ?ended, ?status, "session ended");
        });
        Ok(live)
    }

    /// Checks `Origin`, the bearer token and the tenant's rate; returns the caller's tenant.
    fn admit(&self, headers: &HeaderMap) -> Result<TenantId, Refused> {
        if let Some(origin) = headers.get(header::ORIGIN) {
            let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
            let allowed = origin.to_str().is_ok_and(|o| {
                let o = o.trim().trim_end_matches('/');
                same_loopback_origin(o, host)
                    || self
                        .config
                        .http
                        .allowed_origins
                        .iter()
                        .any(|a| a.trim_end_matches('/').eq_ignore_ascii_case(o))
            });
            if !allowed {
                return Err(refuse(
                    StatusCode::FORBIDDEN,
                    "the Origin of this request is not in http.allowed_origins",
                ));
            }
        }
        if self.tenants.is_empty() {
            return Ok(self.tenant.clone());
        }
        let authorization = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let tenant = authenticate(&self.tenants, authorization).map_err(|why| {
            let mut res = refuse(StatusCode::UNAUTHORIZED, why.detail());
            res.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(why.challenge()),
            );
            res
        })?;
        tenant.admit().map_err(|after| {
            let mut res = refuse(
                StatusCode::TOO_MANY_REQUESTS,
                "the tenant's request rate limit is exhausted; retry after the time given",
            );
            let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
            res.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
            res
        })?;
        Ok(tenant.id.clone())
    }

    /// The session a request names, if it is the caller's.
    fn session(&self, headers: &HeaderMap, tenant: &TenantId) -> Result<Arc<Live>, Refused> {
        let Some(id) = headers.get(SESSION_HEADER) else {
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                "the Mcp-Session-Id header is required (send initialize first)",
            ));
        };
        let live = id
            .to_str()
            .ok()
            .and_then(|id| lock(&self.sessions).get(id).cloned())
            // Another tenant's session is as unknown as one that never was.
            .filter(|l| l.tenant == *tenant)
            .ok_or_else(|| {
                refuse(
                    StatusCode::NOT_FOUND,
                    "no such session (it ended, or never was): initialize a new one",
                )
            })?;
        if let Some(v) = headers.get(VERSION_HEADER) {
            let v = v.to_str().unwrap_or_default();
            let agreed = lock(&live.routes).version.clone();
            if !(KNOWN_VERSIONS.contains(&v) || agreed.as_deref() == Some(v)) {
                return Err(refuse(
                    StatusCode::BAD_REQUEST,
                    &format!("unsupported MCP-Protocol-Version {v:?}"),
                ));
            }
        }
        live.touch();
        Ok(live)
    }
}

/// Whether `origin` is the proxy's own origin on loopback: `http://` and the request's `Host`,
/// whose name is `localhost`, `127.0.0.1` or `[::1]`. Only a page loaded from this very address
/// sends it, and the proxy serves no pages; a DNS-rebinding page carries its own name in `Origin`
/// (and in `Host`), never a loopback one. Clients that send their target as `Origin` (the MCP
/// conformance suite does) are let in without listing it in `http.allowed_origins`.
fn same_loopback_origin(origin: &str, host: Option<&str>) -> bool {
    let Some(host) = host.map(str::trim) else {
        return false;
    };
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().map(|n| format!("[{n}]")),
        None => host.split(':').next().map(str::to_owned),
    };
    let loopback = name.is_some_and(|n| {
        ["localhost", "127.0.0.1", "[::1]"]
            .iter()
            .any(|l| n.eq_ignore_ascii_case(l))
    });
    loopback
        && origin
            .strip_prefix("http://")
            .is_some_and(|o| o.eq_ignore_ascii_case(host))
}

/// A fresh session id: 128 random bits in hex.
fn session_id() -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("failed to read randomness from the operating system");
    idemgate_core::key::hex(&bytes)
}

/// A refused request's answer (boxed: a response is large).
type Refused = Box<Response>;

fn refuse(status: StatusCode, message: &str) -> Refused {
    Box::new(fail(status, message))
}

/// An HTTP error whose body is a JSON-RPC error without id (the MCP SDKs read it as one).
fn fail(status: StatusCode, message: &str) -> Response {
    let code = match status {
        StatusCode::BAD_REQUEST | StatusCode::NOT_FOUND => -32600,
        _ => -32000,
    };
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {"code": code, "message": message},
    });
    (status, axum::Json(body)).into_response()
}

fn json_response(frame: String) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        frame,
    )
        .into_response()
}

fn event(frame: String) -> Result<Event, std::convert::Infallible> {
    Ok(Event::default().event("message").data(frame))
}

/// `POST /mcp`: one JSON-RPC message from the client.
async fn post_message<S: Store>(
    State(proxy): State<Arc<Proxy<S>>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let tenant = match proxy.admit(&headers) {
        Ok(t) => t,
        Err(res) => return *res,
    };
    // A body over `http.max_body_bytes` (413) or cut short: answered as JSON-RPC, as every
    // refusal of this endpoint is, so that a client reads why.
    let body = match body {
        Ok(b) => b,
        Err(e) => return fail(e.status(), &e.body_text()),
    };
    if let Some(ct) = headers.get(header::CONTENT_TYPE) {
        let json = ct.to_str().is_ok_and(|ct| {
            ct.split(';')
                .next()
                .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
        });
        if !json {
            return fail(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "the body must be application/json",
            );
        }
    }
    let Ok(text) = String::from_utf8(body.to_vec()) else {
        return fail(StatusCode::BAD_REQUEST, "the body is not UTF-8");
    };
    let Some(f) = Frame::parse(&text) else {
        let message = if text.trim_start().starts_with('[') {
            "batches are not part of MCP since 2025-06-18: send one message per POST"
        } else {
            "the body is not one JSON-RPC message"
        };
        return fail(StatusCode::BAD_REQUEST, message);
    };
    if f.method.as_deref() == Some("tools/call") && f.id.is_none() {
        return fail(
            StatusCode::BAD_REQUEST,
            "a tools/call needs an id: without one it cannot be answered, judged or replayed; nothing was run",
        );
    }
    // Two keys name no one action (the HTTP gateway refuses them the same way); an invalid one
    // goes to the call, whose answer tells the model (only a `tools/call` uses the key).
    let mut keys = headers.get_all("idempotency-key").iter();
    let key: CarriedKey = keys
        .next()
        .map(|v| idemgate_kit::header::idempotency_key(v.as_bytes()));
    if keys.next().is_some() {
        return fail(
            StatusCode::BAD_REQUEST,
            "send one Idempotency-Key header, not several; nothing was run",
        );
    }
    let initialize = f.method.as_deref() == Some("initialize") && f.id.is_some();
    if !initialize && headers.get(SESSION_HEADER).is_none() {
        if let Some(version) = era::modern_version_of(f.params.as_deref()) {
            return sessionless(&proxy, tenant, &headers, f, text, key, &version).await;
        }
    }
    let live = if initialize {
        match proxy.open(tenant) {
            Ok(l) => l,
            Err(res) => return *res,
        }
    } else {
        match proxy.session(&headers, &tenant) {
            Ok(l) => l,
            Err(res) => return *res,
        }
    };
    let (Some(id), Some(_)) = (f.id.as_deref(), f.method.as_deref()) else {
        // A notification or the client's answer to a server request: no answer comes back.
        if live.to_session.send((text, key)).is_err() {
            return fail(StatusCode::NOT_FOUND, "the session has ended");
        }
        return StatusCode::ACCEPTED.into_response();
    };
    let Some((mut rx, waiting)) = live.submit(frame::id_key(id), text, key) else {
        return fail(StatusCode::NOT_FOUND, "the session has ended");
    };
    let Some(first) = rx.recv().await else {
        return fail(
            StatusCode::NOT_FOUND,
            "the session ended before the server answered",
        );
    };
    let session_header = initialize
        .then(|| HeaderValue::from_str(&live.id).expect("hex session ids are valid header values"));
    let first_is_answer = Frame::parse(&first).is_some_and(|f| f.is_response());
    let mut res = if first_is_answer {
        if initialize {
            lock(&live.routes).version = agreed_version(&first);
        }
        drop(waiting);
        json_response(first)
    } else {
        // The server speaks first: the answer follows on a stream.
        let rest = stream::unfold(Some((rx, waiting, initialize)), |state| async move {
            let (mut rx, waiting, initialize) = state?;
            let frame = rx.recv().await?;
            if Frame::parse(&frame).is_some_and(|f| f.is_response()) {
                if initialize {
                    lock(&waiting.live.routes).version = agreed_version(&frame);
                }
                return Some((frame, None));
            }
            Some((frame, Some((rx, waiting, initialize))))
        });
        let frames = stream::once(async move { first }).chain(rest);
        sse(frames).into_response()
    };
    if let Some(v) = session_header {
        res.headers_mut()
            .insert(HeaderName::from_static(SESSION_HEADER), v);
    }
    res
}

/// The answer to a request whose headers do not mirror its body: 400 with `-32020`
/// (HeaderMismatch, MCP 2026-07-28).
fn header_mismatch(id: Option<&serde_json::value::RawValue>, message: &str) -> Response {
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": id.and_then(|id| serde_json::from_str::<serde_json::Value>(id.get()).ok()),
        "error": {"code": -32020, "message": format!("Header mismatch: {message}")},
    });
    (StatusCode::BAD_REQUEST, axum::Json(body)).into_response()
}

/// A modern client's request without a session: checked against its headers, renamed, sent
/// to the tenant's shared child, and answered as JSON under its own id.
async fn sessionless<S: Store>(
    proxy: &Arc<Proxy<S>>,
    tenant: TenantId,
    headers: &HeaderMap,
    f: Frame,
    text: String,
    key: CarriedKey,
    version: &str,
) -> Response {
    // The headers mirror the body for intermediaries; a mismatch is refused (MCP 2026-07-28,
    // "Server Validation"). Absent ones are not required here: the body decides.
    let header = |name: &str| headers.get(name).map(|v| v.to_str().unwrap_or_default());
    let method = f.method.as_deref().unwrap_or_default();
    let target = f
        .params
        .as_deref()
        .and_then(frame::object)
        .and_then(|p| mirror::target(method, &p));
    let mismatch = if header(VERSION_HEADER).is_some_and(|v| v != version) {
        Some(format!(
            "the MCP-Protocol-Version header does not match the body's {version}"
        ))
    } else if header(METHOD_HEADER).is_some_and(|m| m != method) {
        Some(format!(
            "the Mcp-Method header does not match the body's {method}"
        ))
    } else {
        header(NAME_HEADER)
            .filter(|n| mirror::decoded(n) != target)
            .map(|name| {
                format!("the Mcp-Name header {name:?} does not match the name or URI in the body")
            })
    };
    if let Some(message) = mismatch {
        return header_mismatch(f.id.as_deref(), &message);
    }
    let live = match proxy.shared(tenant) {
        Ok(l) => l,
        Err(res) => return *res,
    };
    // The tool parameters mirrored in headers, as far as the shared session's listings showed
    // the tool's declarations.
    if method == "tools/call" {
        if let Some(message) = lock(&live.params).mismatch(&text, headers) {
            return header_mismatch(f.id.as_deref(), &message);
        }
    }
    let Some(own_id) = f.id else {
        // The modern era sends no notifications over HTTP (closing a stream cancels its
        // request); one that comes anyway is taken and dropped: its ids are the client's.
        return StatusCode::ACCEPTED.into_response();
    };
    let n = proxy.next_request.fetch_add(1, Ordering::Relaxed);
    let proxy_id = frame::raw(&format!("dev.idemgate/http-{n}"));
    let Some((renamed, asks)) = for_shared(&text, &proxy_id) else {
        return fail(
            StatusCode::BAD_REQUEST,
            "the body is not one JSON-RPC message",
        );
    };
    let id = frame::id_key(&proxy_id);
    lock(&live.routes).asks.insert(id.clone(), asks);
    let Some((mut rx, waiting)) = live.submit(id, renamed, key) else {
        return fail(StatusCode::SERVICE_UNAVAILABLE, "the server ended; retry");
    };
    let Some(first) = rx.recv().await else {
        return fail(
            StatusCode::BAD_GATEWAY,
            "the server ended before it answered",
        );
    };
    let answer = move |frame: String| frame::with_id(&frame, &own_id).unwrap_or(frame);
    if Frame::parse(&first).is_some_and(|f| f.is_response()) {
        drop(waiting);
        let status = modern_status(&first);
        let mut res = json_response(answer(first));
        *res.status_mut() = status;
        return res;
    }
    // Progress or log messages come first: the answer follows them on a stream of its own
    // (MCP 2026-07-28, "Streamable HTTP": a request's notifications go on its response stream).
    let rest = stream::unfold(Some((rx, waiting, answer)), |state| async move {
        let (mut rx, waiting, answer) = state?;
        let frame = rx.recv().await?;
        if Frame::parse(&frame).is_some_and(|f| f.is_response()) {
            return Some((answer(frame), None));
        }
        Some((frame, Some((rx, waiting, answer))))
    });
    sse(stream::once(async move { first }).chain(rest)).into_response()
}

/// The HTTP status of a modern answer (MCP 2026-07-28, "Protocol Version Header"): 404 for an
/// unknown method, 400 for the modern errors (a client that speaks both eras reads them to
/// decide), else 200.
fn modern_status(answer: &str) -> StatusCode {
    let code = Frame::parse(answer)
        .and_then(|f| f.error)
        .and_then(|e| serde_json::from_str::<serde_json::Value>(e.get()).ok())
        .and_then(|e| e["code"].as_i64());
    match code {
        Some(-32601) => StatusCode::NOT_FOUND,
        Some(c) if era::is_modern_code(c) => StatusCode::BAD_REQUEST,
        _ => StatusCode::OK,
    }
}

fn sse(
    frames: impl Stream<Item = String> + Send + 'static,
) -> Sse<impl Stream<Item = Result<Event, std::convert::Infallible>>> {
    Sse::new(frames.map(event)).keep_alive(KeepAlive::default())
}

/// The protocol version an `initialize` answer agreed on.
fn agreed_version(answer: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(answer).ok()?;
    v["result"]["protocolVersion"].as_str().map(str::to_owned)
}

/// `GET /mcp`: the stream of the server's own requests and notifications.
async fn open_stream<S: Store>(State(proxy): State<Arc<Proxy<S>>>, headers: HeaderMap) -> Response {
    let tenant = match proxy.admit(&headers) {
        Ok(t) => t,
        Err(res) => return *res,
    };
    let accepts = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("text/event-stream") || v.contains("*/*"));
    if !accepts {
        return fail(
            StatusCode::NOT_ACCEPTABLE,
            "GET opens a text/event-stream: say so in Accept",
        );
    }
    let live = match proxy.session(&headers, &tenant) {
        Ok(l) => l,
        Err(res) => return *res,
    };
    let (tx, rx) = mpsc::unbounded_channel();
    {
        let mut r = lock(&live.routes);
        if r.closed {
            return fail(StatusCode::NOT_FOUND, "the session has ended");
        }
        for frame in r.queued.drain(..) {
            let _ = tx.send(frame);
        }
        // A new GET replaces the old one, whose stream ends.
        r.get = Some(tx);
    }
    let frames = stream::unfold(rx, |mut rx| async move {
        let frame = rx.recv().await?;
        Some((frame, rx))
    });
    sse(frames).into_response()
}

/// `DELETE /mcp`: the client ends its session. Its calls in flight run to their end.
async fn end_session<S: Store>(State(proxy): State<Arc<Proxy<S>>>, headers: HeaderMap) -> Response {
    let tenant = match proxy.admit(&headers) {
        Ok(t) => t,
        Err(res) => return *res,
    };
    let live = match proxy.session(&headers, &tenant) {
        Ok(l) => l,
        Err(res) => return *res,
    };
    lock(&proxy.sessions).remove(&live.id);
    live.stop.notify_one();
    StatusCode::NO_CONTENT.into_response()
}

#[cfg(test)]
mod tests {
    use super::same_loopback_origin;

    #[test]
    fn own_loopback_origin_only() {
        let own = |o, h| same_loopback_origin(o, Some(h));
        assert!(own("http://127.0.0.1:8765", "127.0.0.1:8765"));
        assert!(own("http://localhost:8765", "localhost:8765"));
        assert!(own("http://LOCALHOST:8765", "localhost:8765"));
        assert!(own("http://[::1]:8765", "[::1]:8765"));
        assert!(own("http://127.0.0.1", "127.0.0.1"));
        // Another port, another name, or a non-loopback host is another origin.
        assert!(!own("http://127.0.0.1:3000", "127.0.0.1:8765"));
        assert!(!own("http://localhost:8765", "127.0.0.1:8765"));
        assert!(!own("http://evil.example:8765", "evil.example:8765"));
        assert!(!own(
            "http://localhost.evil.example:8765",
            "localhost.evil.example:8765"
        ));
        assert!(!own(
            "http://127.0.0.1.nip.io:8765",
            "127.0.0.1.nip.io:8765"
        ));
        assert!(!own("https://127.0.0.1:8765", "127.0.0.1:8765"));
        assert!(!own("null", "127.0.0.1:8765"));
        assert!(!same_loopback_origin("http://127.0.0.1:8765", None));
    }
}

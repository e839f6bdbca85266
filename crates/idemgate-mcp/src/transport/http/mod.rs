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
//!
//! Resumability (MCP 2025-11-25, "Resumability and Redelivery"), for sessions: every event of a
//! session's streams (a POST's answer stream, the GET stream) has an id `<tag>-<stream>-<n>`: the
//! session's random tag, the stream's number in the session, the event's number in the stream.
//! A POST of a client that takes priming events (it accepts `text/event-stream` and speaks
//! 2025-11-25 or later) whose answer has not come within 100 ms (`PRIME_AFTER`) turns into a
//! stream at once, which starts with a priming event (an id, a `retry` time, empty data), so that
//! a client that loses the connection can come back for the answer. A stream keeps its last 1000
//! events (`MAX_EVENTS`), and a POST stream the client was given an id of outlives its
//! connection: its answer lands in it whether or not anybody listens. A GET with `Last-Event-ID`
//! gets that stream's events after the id, never another stream's, then its later ones (a POST
//! stream's up to its answer). A session keeps its last 100 ended POST streams (`MAX_ENDED`).

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use futures_util::stream::{self, Stream, StreamExt as _};
use idemgate_core::{Engine, Store, TenantId};
use idemgate_kit::tenants::{authenticate, bearer, AuthError, Tenant};
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinSet;

mod live;
mod oauth;

use self::live::{for_shared, Inbox, Live, Routes, Waiting};
use self::oauth::{OAuth, Rejection};
use super::pump;
use super::upstream::{Started, Upstream};
use crate::config::Config;
use crate::error::Error;
use crate::gate::CarriedKey;
use crate::session::{Outputs, Session};
use crate::sync::lock;
use crate::wire::era;
use crate::wire::frame::{self, Frame};
use crate::wire::headers::{IDEMPOTENCY_KEY, LAST_EVENT_ID};
use crate::wire::mirror;

/// The endpoint's path.
pub const ENDPOINT: &str = "/mcp";
pub use crate::wire::headers::{METHOD_HEADER, NAME_HEADER, SESSION_HEADER, VERSION_HEADER};
/// Protocol versions with Streamable HTTP a client may name besides the one its session agreed.
const KNOWN_VERSIONS: &[&str] = &["2025-03-26", "2025-06-18", "2025-11-25"];
/// How long a POST waits for its answer as JSON before it turns into a stream with a priming
/// event: quick answers (replays, most writes) stay `application/json`, and a call that takes
/// longer, the kind whose connection breaks or whose client times out, becomes resumable.
const PRIME_AFTER: Duration = Duration::from_millis(100);
/// The reconnection time a priming event asks for (SSE `retry`).
const RETRY: Duration = Duration::from_secs(1);
/// A comment on a stream after this long without an event, so that idle connections stay open
/// through intermediaries (axum's default keep-alive).
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// Everything the transport serves with: the engine, the configuration, the server's command,
/// and the sessions open.
pub struct Proxy<S> {
    engine: Arc<Engine<S>>,
    config: Config,
    server: String,
    upstream: Upstream,
    tenants: Vec<Arc<Tenant>>,
    /// The resource server's side of OAuth, when `[oauth]` is configured.
    oauth: Option<Arc<OAuth>>,
    tenant: TenantId,
    sessions: Mutex<HashMap<String, Arc<Live>>>,
    /// The child each tenant's sessionless requests share.
    shared: Mutex<HashMap<TenantId, Arc<Live>>>,
    /// The number of the next sessionless request (its id on the way to the shared child).
    next_request: AtomicU64,
    tasks: Mutex<JoinSet<()>>,
    stopping: AtomicBool,
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
        let oauth = config.oauth.clone().map(|o| Arc::new(OAuth::new(o)));
        Arc::new(Proxy {
            engine,
            config,
            server,
            upstream,
            tenants,
            oauth,
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
        let mut router = Router::new().route(
            ENDPOINT,
            post(post_message::<S>)
                .get(open_stream::<S>)
                .delete(end_session::<S>),
        );
        if let Some(oauth) = &self.oauth {
            // Public, as RFC 9728 has it: a client reads it before it has a token.
            let document = Arc::new(oauth.metadata());
            for path in oauth.metadata_paths() {
                let document = Arc::clone(&document);
                router = router.route(
                    &path,
                    get(move || async move {
                        (
                            [(header::ACCESS_CONTROL_ALLOW_ORIGIN, "*")],
                            axum::Json((*document).clone()),
                        )
                    }),
                );
            }
        }
        router
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
        self.serve(listener, pump::shutdown_signal()).await
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
        let (session, outputs) = (if shared {
            Session::shared
        } else {
            Session::new
        })(
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
            tag: session_tag(),
            stop: Notify::new(),
            last_used: Mutex::new(Instant::now()),
        });
        self.run_session(Arc::clone(&live), session, outputs, client_lines, started);
        Ok(live)
    }

    /// Runs a started session as one of the proxy's tasks: its frames for the client go to
    /// their routes, the pump relays the rest, and once it ends the session is forgotten and its
    /// server ended.
    fn run_session(
        self: &Arc<Self>,
        live: Arc<Live>,
        session: Session<S>,
        outputs: Outputs,
        client_lines: mpsc::UnboundedReceiver<(String, CarriedKey)>,
        started: Started,
    ) {
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
            let ended = pump::relay(
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
    }

    /// Checks `Origin`, the bearer token (a static tenant's, else an OAuth access token) and the
    /// tenant's rate; returns the caller's tenant.
    async fn admit(&self, headers: &HeaderMap) -> Result<TenantId, Refused> {
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
        if self.tenants.is_empty() && self.oauth.is_none() {
            return Ok(self.tenant.clone());
        }
        let authorization = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let tenant = match (authenticate(&self.tenants, authorization), &self.oauth) {
            (Ok(tenant), _) => tenant,
            (Err(why), None) => {
                let mut res = refuse(StatusCode::UNAUTHORIZED, why.detail());
                res.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static(why.challenge()),
                );
                return Err(res);
            }
            (Err(why), Some(oauth)) => {
                let checked = match why {
                    AuthError::Missing => Err(Rejection::Missing),
                    AuthError::Empty => {
                        Err(Rejection::Invalid("the bearer token is empty".to_owned()))
                    }
                    AuthError::Invalid => {
                        let token = authorization.and_then(bearer).unwrap_or_default();
                        oauth.check(token).await
                    }
                };
                let grant = checked.map_err(|r| oauth_refusal(oauth, &r))?;
                tracing::debug!(tenant = %grant.tenant, "admitted an OAuth access token");
                // A tenant of `[[tenants]]` keeps its rate limit with either kind of token.
                match self.tenants.iter().find(|t| t.id == grant.tenant) {
                    Some(tenant) => Arc::clone(tenant),
                    None => return Ok(grant.tenant),
                }
            }
        };
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

/// The answer to a request whose bearer token was not taken: 401 with a challenge that names
/// the Protected Resource Metadata, 403 for a missing scope or an unmapped tenant, 503 when the
/// keys could not be fetched.
fn oauth_refusal(oauth: &OAuth, rejection: &Rejection) -> Refused {
    let (status, message) = match rejection {
        Rejection::Missing => (
            StatusCode::UNAUTHORIZED,
            "an `Authorization: Bearer <token>` header is required: an access token of the authorization server the resource metadata names",
        ),
        Rejection::Invalid(why) => (StatusCode::UNAUTHORIZED, why.as_str()),
        Rejection::InsufficientScope(why) | Rejection::NoTenant(why) => {
            (StatusCode::FORBIDDEN, why.as_str())
        }
        Rejection::Unavailable(why) => (StatusCode::SERVICE_UNAVAILABLE, why.as_str()),
    };
    // Why a token was refused, never the token: what an operator setting up OAuth looks for.
    if !matches!(rejection, Rejection::Missing | Rejection::Unavailable(_)) {
        tracing::info!(
            status = status.as_u16(),
            reason = message,
            "refused a bearer token"
        );
    }
    let mut res = refuse(status, message);
    if !matches!(rejection, Rejection::Unavailable(_)) {
        if let Ok(v) = HeaderValue::from_str(&oauth.challenge(rejection)) {
            res.headers_mut().insert(header::WWW_AUTHENTICATE, v);
        }
    }
    res
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

/// A session's event id tag: 64 random bits in hex.
fn session_tag() -> String {
    let mut bytes = [0u8; 8];
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

/// Whether the client takes `text/event-stream` answers, by its `Accept`.
fn accepts_sse(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("text/event-stream") || v.contains("*/*"))
}

/// Whether a stream toward this request's client starts with a priming event (an id and empty
/// data, MCP 2025-11-25): only when it takes streams and speaks 2025-11-25 or later, by its
/// `MCP-Protocol-Version` or else by the version its session agreed. (A client of an earlier
/// version may read an empty event as a broken message, so the SDKs prime only from there.)
fn primes(live: &Live, headers: &HeaderMap) -> bool {
    if !accepts_sse(headers) {
        return false;
    }
    let version = match headers.get(VERSION_HEADER) {
        Some(v) => v.to_str().ok().map(str::to_owned),
        None => lock(&live.routes).version.clone(),
    };
    // Versions are dates: their order is the text's.
    version.is_some_and(|v| v.as_str() >= "2025-11-25")
}

/// One SSE event (WHATWG HTML, "Server-sent events"): its id, a `retry` time, and `data` (a
/// priming event's is empty), one `data:` line for each of its lines. (axum's `Event` writes no
/// `data:` line for empty data, which makes no event of it: a priming event needs one.)
fn sse_event(id: &str, retry: Option<Duration>, data: &str) -> Bytes {
    let mut out = String::with_capacity(data.len() + id.len() + 48);
    out.push_str("id: ");
    out.push_str(id);
    out.push('\n');
    if let Some(retry) = retry {
        out.push_str(&format!("retry: {}\n", retry.as_millis()));
    }
    if !data.is_empty() {
        out.push_str("event: message\n");
    }
    // A line ends at CRLF, CR or LF; JSON has them only as white space, but it may have them.
    let mut rest = data;
    loop {
        let end = rest.find(['\r', '\n']).unwrap_or(rest.len());
        out.push_str("data: ");
        out.push_str(&rest[..end]);
        out.push('\n');
        if end == rest.len() {
            break;
        }
        let eol = if rest[end..].starts_with("\r\n") {
            2
        } else {
            1
        };
        rest = &rest[end + eol..];
    }
    out.push('\n');
    Bytes::from(out)
}

/// What an SSE answer writes: the events of stream `stream` of `live` that `rx` brings.
struct Writer {
    live: Arc<Live>,
    stream: u64,
    rx: mpsc::UnboundedReceiver<(u64, String)>,
    /// A POST's stream, which ends with the answer.
    post: bool,
    /// The answer is `initialize`'s: it says the version agreed.
    initialize: bool,
    /// A POST's place in the waiting list, held while its stream is written.
    _waiting: Option<Waiting>,
}

/// The SSE answer of a session's stream: `head` (events written already), then the events `w`
/// brings, each with its id, until a POST stream's answer, or until the stream goes to another connection or the
/// session ends; a comment after [`KEEP_ALIVE`] without an event.
fn resumable_sse(head: Vec<Bytes>, w: Writer) -> Response {
    let events = stream::unfold(Some(w), |state| async move {
        let mut w = state?;
        let Ok(next) = tokio::time::timeout(KEEP_ALIVE, w.rx.recv()).await else {
            return Some((Bytes::from_static(b":\n\n"), Some(w)));
        };
        let (n, frame) = next?;
        let answer = w.post && Frame::parse(&frame).is_some_and(|f| f.is_response());
        if answer && w.initialize {
            lock(&w.live.routes).version = agreed_version(&frame);
        }
        let event = sse_event(&w.live.event_id(w.stream, n), None, &frame);
        Some((event, (!answer).then_some(w)))
    });
    let body = stream::iter(head)
        .chain(events)
        .map(Ok::<_, std::convert::Infallible>);
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/event-stream"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        axum::body::Body::from_stream(body),
    )
        .into_response()
}

/// `POST /mcp`: one JSON-RPC message from the client.
async fn post_message<S: Store>(
    State(proxy): State<Arc<Proxy<S>>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let tenant = match proxy.admit(&headers).await {
        Ok(t) => t,
        Err(res) => return *res,
    };
    let (text, f, key) = match read_message(&headers, body) {
        Ok(message) => message,
        Err(res) => return *res,
    };
    let initialize = f.method.as_deref() == Some("initialize") && f.id.is_some();
    if !initialize && headers.get(SESSION_HEADER).is_none() {
        if let Some(version) = era::modern_version_of(f.params.as_deref()) {
            return sessionless(&proxy, tenant, &headers, f, text, key, &version).await;
        }
    }
    let live = match initialize {
        true => proxy.open(tenant),
        false => proxy.session(&headers, &tenant),
    };
    let live = match live {
        Ok(l) => l,
        Err(res) => return *res,
    };
    let (Some(id), Some(_)) = (f.id.as_deref(), f.method.as_deref()) else {
        // A notification or the client's answer to a server request: no answer comes back.
        if live.to_session.send((text, key)).is_err() {
            return fail(StatusCode::NOT_FOUND, "the session has ended");
        }
        return StatusCode::ACCEPTED.into_response();
    };
    let mut res =
        match answer_request(&live, &headers, frame::id_key(id), text, key, initialize).await {
            Ok(res) => res,
            Err(res) => return res,
        };
    if initialize {
        let v = HeaderValue::from_str(&live.id).expect("hex session ids are valid header values");
        res.headers_mut()
            .insert(HeaderName::from_static(SESSION_HEADER), v);
    }
    res
}

/// The message a POST carries: its text, its frame and the key carried beside it; or the
/// refusal, answered as JSON-RPC, as every refusal of this endpoint is, so that a client reads
/// why.
fn read_message(
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(String, Frame, CarriedKey), Refused> {
    // A body over `http.max_body_bytes` (413) or cut short.
    let body = body.map_err(|e| refuse(e.status(), &e.body_text()))?;
    if headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|ct| !is_json(ct))
    {
        return Err(refuse(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "the body must be application/json",
        ));
    }
    let Ok(text) = String::from_utf8(body.to_vec()) else {
        return Err(refuse(StatusCode::BAD_REQUEST, "the body is not UTF-8"));
    };
    let Some(f) = Frame::parse(&text) else {
        let message = if text.trim_start().starts_with('[') {
            "batches are not part of MCP since 2025-06-18: send one message per POST"
        } else {
            "the body is not one JSON-RPC message"
        };
        return Err(refuse(StatusCode::BAD_REQUEST, message));
    };
    if f.method.as_deref() == Some("tools/call") && f.id.is_none() {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "a tools/call needs an id: without one it cannot be answered, judged or replayed; nothing was run",
        ));
    }
    let key = carried_key(headers)?;
    let text = match f.method.as_deref() {
        Some("tools/call") => with_header_trace(headers, &f, text),
        _ => text,
    };
    Ok((text, f, key))
}

/// A `tools/call` whose HTTP request carries a W3C `traceparent` header and whose `_meta` has
/// none: the header's context goes into `_meta`, where the judge (and the MCP server behind the
/// proxy) read a call's trace context on every transport.
fn with_header_trace(headers: &HeaderMap, f: &Frame, text: String) -> String {
    let Some(trace) =
        idemgate_trace::TraceContext::from_carrier(|name| headers.get(name)?.to_str().ok())
    else {
        return text;
    };
    let has_own = (f.params.as_deref())
        .and_then(crate::wire::frame::object)
        .and_then(|params| crate::wire::frame::object(params.get("_meta")?))
        .is_some_and(|meta| meta.contains_key("traceparent"));
    if has_own {
        return text;
    }
    crate::wire::frame::with_trace(&text, &trace).unwrap_or(text)
}

/// Whether a `Content-Type` is JSON's.
fn is_json(content_type: &HeaderValue) -> bool {
    content_type.to_str().is_ok_and(|ct| {
        ct.split(';')
            .next()
            .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
    })
}

/// The `Idempotency-Key` header. Two keys name no one action (the HTTP gateway refuses them
/// the same way); an invalid one goes to the call, whose answer tells the model (only a
/// `tools/call` uses the key).
fn carried_key(headers: &HeaderMap) -> Result<CarriedKey, Refused> {
    let mut keys = headers.get_all(IDEMPOTENCY_KEY).iter();
    let key: CarriedKey = keys
        .next()
        .map(|v| idemgate_kit::header::idempotency_key(v.as_bytes()));
    if keys.next().is_some() {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "send one Idempotency-Key header, not several; nothing was run",
        ));
    }
    Ok(key)
}

/// The answer to the request `id` (`text`) of a session: JSON when the server's answer is the
/// first thing that comes for it (within [`PRIME_AFTER`] for a client that takes a priming
/// event), else a stream ([`answer_stream`]); `Err` when the session ends first.
async fn answer_request(
    live: &Arc<Live>,
    headers: &HeaderMap,
    id: String,
    text: String,
    key: CarriedKey,
    initialize: bool,
) -> Result<Response, Response> {
    let primed = primes(live, headers);
    let Some((Inbox(mut rx), waiting)) = live.submit(id, text, key) else {
        return Err(fail(StatusCode::NOT_FOUND, "the session has ended"));
    };
    // A client that takes a priming event waits for a JSON answer only so long.
    let first = if primed {
        tokio::time::timeout(PRIME_AFTER, rx.recv()).await.ok()
    } else {
        Some(rx.recv().await)
    };
    let first = match first {
        Some(None) => {
            return Err(fail(
                StatusCode::NOT_FOUND,
                "the session ended before the server answered",
            ))
        }
        Some(Some(event)) => Some(event),
        None => None,
    };
    Ok(match first {
        Some((_, answer)) if Frame::parse(&answer).is_some_and(|f| f.is_response()) => {
            if initialize {
                lock(&live.routes).version = agreed_version(&answer);
            }
            drop(waiting);
            json_response(answer)
        }
        first => answer_stream(live, rx, waiting, first, primed, initialize),
    })
}

/// The server speaks first, or the answer takes a while: it follows on a stream, which the
/// client may resume once it has an event id of it. It opens with a priming event when the
/// client takes one (`primed`), then the `first` event that came, if any.
fn answer_stream(
    live: &Arc<Live>,
    rx: mpsc::UnboundedReceiver<(u64, String)>,
    waiting: Waiting,
    first: Option<(u64, String)>,
    primed: bool,
    initialize: bool,
) -> Response {
    waiting.resumable();
    let number = waiting.number;
    let mut head = Vec::new();
    if primed {
        head.push(sse_event(&live.event_id(number, 0), Some(RETRY), ""));
    }
    if let Some((n, frame)) = first {
        head.push(sse_event(&live.event_id(number, n), None, &frame));
    }
    let w = Writer {
        live: Arc::clone(live),
        stream: number,
        rx,
        post: true,
        initialize,
        _waiting: Some(waiting),
    };
    resumable_sse(head, w)
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
    if let Some(message) = mirrored_mismatch(headers, &f, version) {
        return header_mismatch(f.id.as_deref(), &message);
    }
    let method = f.method.as_deref().unwrap_or_default();
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
    sessionless_answer(first, rx, waiting, own_id)
}

/// The headers of a sessionless request (`f`, of protocol `version`) mirror its body for
/// intermediaries; a mismatch is refused (MCP 2026-07-28, "Server Validation"), and this says
/// which. Absent ones are not required here: the body decides.
fn mirrored_mismatch(headers: &HeaderMap, f: &Frame, version: &str) -> Option<String> {
    let header = |name: &str| headers.get(name).map(|v| v.to_str().unwrap_or_default());
    let method = f.method.as_deref().unwrap_or_default();
    let target = f
        .params
        .as_deref()
        .and_then(frame::object)
        .and_then(|p| mirror::target(method, &p));
    if header(VERSION_HEADER).is_some_and(|v| v != version) {
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
    }
}

/// The answer to a sessionless request, under its own id (`own_id`) again, given the `first`
/// frame that came for it: JSON when that is the answer, else a stream that carries what came
/// before the answer, then the answer.
fn sessionless_answer(
    first: String,
    rx: Inbox,
    waiting: Waiting,
    own_id: Box<serde_json::value::RawValue>,
) -> Response {
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
    let tenant = match proxy.admit(&headers).await {
        Ok(t) => t,
        Err(res) => return *res,
    };
    if !accepts_sse(&headers) {
        return fail(
            StatusCode::NOT_ACCEPTABLE,
            "GET opens a text/event-stream: say so in Accept",
        );
    }
    let live = match proxy.session(&headers, &tenant) {
        Ok(l) => l,
        Err(res) => return *res,
    };
    let primed = primes(&live, &headers);
    let last = headers
        .get(LAST_EVENT_ID)
        .map(|v| v.to_str().unwrap_or_default().to_owned());
    let (tx, rx) = mpsc::unbounded_channel();
    let (number, post, head) = {
        let mut r = lock(&live.routes);
        if r.closed {
            return fail(StatusCode::NOT_FOUND, "the session has ended");
        }
        match last {
            // A stream resumed: the GET stream, or a POST's.
            Some(last) => match r.resume(&live.tag, &last, tx) {
                Ok((number, post)) => (number, post, Vec::new()),
                Err(why) => return fail(StatusCode::BAD_REQUEST, &why),
            },
            // A new GET replaces the old one, whose stream ends.
            None => {
                let number = r.open_get(tx);
                let prime = primed.then(|| sse_event(&live.event_id(number, 0), Some(RETRY), ""));
                (number, false, prime.into_iter().collect())
            }
        }
    };
    let w = Writer {
        live: Arc::clone(&live),
        stream: number,
        rx,
        post,
        initialize: false,
        _waiting: None,
    };
    resumable_sse(head, w)
}

/// `DELETE /mcp`: the client ends its session. Its calls in flight run to their end.
async fn end_session<S: Store>(State(proxy): State<Arc<Proxy<S>>>, headers: HeaderMap) -> Response {
    let tenant = match proxy.admit(&headers).await {
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

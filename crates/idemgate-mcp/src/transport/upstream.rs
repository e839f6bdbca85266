//! The server side of a session: a child process over stdio, or an MCP server reached over
//! Streamable HTTP (MCP 2025-11-25, "Transports") at a URL.
//!
//! The HTTP upstream is an adapter that looks to the forwarding core exactly like a child
//! process: the core writes newline-delimited frames into it and reads the server's frames out
//! of it, so every judgement (keys, policies, records, replays, unknown outcomes) stays in
//! [`Session`](crate::Session). Each frame from the core becomes one POST with
//! `Accept: application/json, text/event-stream`; the answer, JSON or an SSE stream (which may
//! carry the server's own requests and notifications first), comes back as frames. The
//! `Mcp-Session-Id` of the `initialize` answer and the agreed `MCP-Protocol-Version` go on every
//! later request; once the client has sent `notifications/initialized` a GET stream carries the
//! server's own messages (a server without one answers 405); the session ends with a DELETE.
//! A request of the modern era (MCP 2026-07-28: it carries the envelope in `params._meta`) goes
//! with the headers that mirror its body instead of a session's version (`crate::wire::mirror`), so a
//! server that speaks only that era is reached too.
//!
//! A 404 to a request with a session id means the server no longer knows the session (it
//! restarted, or ended the session) and did not process the request. As the transport has a
//! client do then, the adapter starts a new session with the agent's own `initialize` (under an
//! id of its own, so the answer stays here) and `notifications/initialized`, and sends the request
//! once more; the GET stream follows the new session. What the old session held on the server
//! (subscriptions, a logging level) is gone with it.
//!
//! Failures: a lost connection, a 5xx, a second 404 or a new session refused, or an SSE stream
//! that ends before the answer to its request all end the upstream as a crashed child ends: every
//! call in flight has an unknown outcome, and later calls are not sent. A request refused with
//! another 4xx gets a JSON-RPC error answer of the proxy's own (which, for a `tools/call`, the
//! core counts as unknown too: it does not trust errors).

use std::collections::HashSet;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, ACCEPT, CONTENT_TYPE};
use serde_json::value::RawValue;
use tokio::io::{AsyncWrite, DuplexStream};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};

use super::{child, pump};
use crate::config::{server_name, Config};
use crate::error::Error;
use crate::sync::lock;
use crate::wire::frame::{self, Frame};
use crate::wire::headers::{LAST_EVENT_ID, SESSION_HEADER, VERSION_HEADER};
use crate::wire::mirror::ParamHeaders;

/// How long the DELETE that ends the upstream session may take.
const DELETE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the adapter waits before it opens the GET stream again after it ended.
const GET_RETRY: Duration = Duration::from_secs(1);
/// How often in a row a request's stream is resumed without a new event before the upstream
/// counts as gone.
const MAX_RESUMES: u32 = 5;
/// The wait before a resumption when the server named none, and the longest one.
const RESUME_WAIT: Duration = Duration::from_secs(1);
const MAX_RESUME_WAIT: Duration = Duration::from_secs(30);
/// The pipe between the core and the adapter.
const PIPE_BYTES: usize = 256 * 1024;

/// Where the MCP server is.
#[derive(Clone, Debug)]
pub enum Upstream {
    /// A command started per session, speaking stdio.
    Command(Vec<String>),
    /// A server reached over Streamable HTTP.
    Http(Arc<HttpUpstream>),
}

impl Upstream {
    /// The server's name in record names: `server_name` of the configuration, else derived
    /// from the command or the URL's host.
    pub fn name(&self, config: &Config) -> String {
        match self {
            Upstream::Command(c) => server_name(config, c),
            Upstream::Http(h) => server_name(config, &[h.host()]),
        }
    }

    /// Starts one session's server.
    pub(crate) fn start(&self) -> Result<Started, Error> {
        match self {
            Upstream::Command(command) => {
                let (child, input, output) = child::spawn(command)?;
                Ok(Started {
                    input: Box::new(input),
                    lines: pump::lines(output),
                    end: End::Child(child),
                })
            }
            Upstream::Http(h) => Ok(h.connect()),
        }
    }
}

/// A started server: where the core writes frames, where it reads them, and how it ends.
pub(crate) struct Started {
    pub(crate) input: Box<dyn AsyncWrite + Unpin + Send>,
    pub(crate) lines: mpsc::UnboundedReceiver<String>,
    pub(crate) end: End,
}

/// How a started server ends once its input is closed.
pub(crate) enum End {
    Child(tokio::process::Child),
    Http(JoinHandle<()>),
}

impl End {
    /// Waits for the server to end (a child's exit, or the HTTP session's DELETE); the child's
    /// exit status when it is one.
    pub(crate) async fn wait(self) -> Option<ExitStatus> {
        match self {
            End::Child(mut child) => child::reap(&mut child).await,
            End::Http(task) => {
                let _ = tokio::time::timeout(DELETE_TIMEOUT * 2, task).await;
                None
            }
        }
    }
}

/// An MCP server at a Streamable HTTP URL, with the headers every request to it carries.
#[derive(Debug)]
pub struct HttpUpstream {
    client: reqwest::Client,
    url: reqwest::Url,
    headers: HeaderMap,
}

impl HttpUpstream {
    /// The server at `url` (http or https), with `headers` given as `Name: value` on every
    /// request (their values are never logged).
    ///
    /// # Errors
    /// [`Error::Upstream`] when the URL or a header is invalid.
    pub fn new(url: &str, headers: &[String]) -> Result<Self, Error> {
        let url = reqwest::Url::parse(url)
            .map_err(|e| Error::Upstream(format!("invalid upstream URL: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err(Error::Upstream(
                "the upstream URL must be http:// or https:// with a host".to_owned(),
            ));
        }
        let mut map = HeaderMap::new();
        for h in headers {
            let Some((name, value)) = h.split_once(':') else {
                return Err(Error::Upstream(
                    "an upstream header must be given as 'Name: value'".to_owned(),
                ));
            };
            let name = HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| {
                Error::Upstream(format!("invalid upstream header name {:?}", name.trim()))
            })?;
            let reserved = [SESSION_HEADER, VERSION_HEADER, "content-type", "accept"];
            if reserved.contains(&name.as_str()) {
                return Err(Error::Upstream(format!(
                    "the upstream header {name} is the proxy's to set"
                )));
            }
            // The value is never echoed: it is often a secret.
            let mut value = HeaderValue::from_str(value.trim()).map_err(|_| {
                Error::Upstream(format!("the value of upstream header {name} is invalid"))
            })?;
            value.set_sensitive(true);
            map.append(name, value);
        }
        let client = idemgate_kit::tls::client_builder()
            // The URL is configured: a proxy from the environment must not reroute side
            // effects, and a redirect would turn a POST into something else.
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| Error::Upstream(format!("failed to build the HTTP client: {e}")))?;
        Ok(HttpUpstream {
            client,
            url,
            headers: map,
        })
    }

    /// The URL's host, port and path as one name (`mcp.example.com-github-mcp`), for the
    /// server's name in records: two servers behind one host stay apart. A server that may move
    /// to another address keeps its records only under a `server_name` of its own.
    pub fn host(&self) -> String {
        let mut parts = vec![self.url.host_str().unwrap_or("server").to_owned()];
        parts.extend(self.url.port().map(|p| p.to_string()));
        parts.extend(
            self.url
                .path_segments()
                .into_iter()
                .flatten()
                .filter(|s| !s.is_empty())
                .map(str::to_owned),
        );
        parts.join("-")
    }

    /// Starts the adapter of one upstream session.
    fn connect(self: &Arc<Self>) -> Started {
        let (core_side, adapter_side) = tokio::io::duplex(PIPE_BYTES);
        let (tx, lines) = mpsc::unbounded_channel();
        let task = tokio::spawn(adapt(Arc::clone(self), adapter_side, tx));
        Started {
            input: Box::new(core_side),
            lines,
            end: End::Http(task),
        }
    }
}

/// What one upstream session knows.
struct Link {
    up: Arc<HttpUpstream>,
    session: Mutex<Option<HeaderValue>>,
    /// Counts the sessions started, so that the GET stream follows a new one.
    sessions: watch::Sender<u64>,
    /// The agent's `initialize`, to start a new session with when the server forgot this one.
    initialize: Mutex<Option<String>>,
    /// Held while a new session is started, so that requests that met the 404 together start one.
    renewing: tokio::sync::Mutex<()>,
    version: Mutex<Option<HeaderValue>>,
    /// The tool parameters that calls of the modern era mirror in headers, from the server's
    /// `tools/list` answers, and the keys of the `tools/list` requests not answered yet.
    mirror: Mutex<ParamHeaders>,
    listing: Mutex<HashSet<String>>,
    /// Why the upstream is gone, once it is.
    gone: watch::Sender<Option<String>>,
    to_core: mpsc::UnboundedSender<String>,
}

impl Link {
    /// A link of no session yet to `up`, which tells `gone` why it went, and the core its frames.
    fn new(
        up: Arc<HttpUpstream>,
        gone: watch::Sender<Option<String>>,
        to_core: mpsc::UnboundedSender<String>,
    ) -> Self {
        Link {
            up,
            session: Mutex::new(None),
            sessions: watch::channel(0).0,
            initialize: Mutex::new(None),
            renewing: tokio::sync::Mutex::new(()),
            version: Mutex::new(None),
            mirror: Mutex::new(ParamHeaders::default()),
            listing: Mutex::new(HashSet::new()),
            gone,
            to_core,
        }
    }

    /// Ends the upstream session, if one was started, with a DELETE.
    async fn end(&self) {
        if lock(&self.session).is_none() {
            return;
        }
        let ended = self.request(reqwest::Method::DELETE).send();
        match tokio::time::timeout(DELETE_TIMEOUT, ended).await {
            Ok(Ok(r)) => tracing::debug!(status = %r.status(), "ended the upstream session"),
            Ok(Err(e)) => {
                tracing::debug!(error = %error_chain(&e), "failed to end the upstream session")
            }
            Err(_) => tracing::debug!("the upstream did not answer the DELETE in time"),
        }
    }

    fn request(&self, method: reqwest::Method) -> reqwest::RequestBuilder {
        let mut req = self
            .up
            .client
            .request(method, self.up.url.clone())
            .headers(self.up.headers.clone());
        if let Some(s) = lock(&self.session).clone() {
            req = req.header(SESSION_HEADER, s);
        }
        if let Some(v) = lock(&self.version).clone() {
            req = req.header(VERSION_HEADER, v);
        }
        req
    }

    /// POSTs one JSON-RPC message, taking an answer as JSON or as an SSE stream. A request of
    /// the modern era goes with the headers that mirror its body (`crate::wire::mirror`).
    async fn post_message(&self, text: String) -> reqwest::Result<reqwest::Response> {
        // Only while no legacy session was agreed: a modern client before a legacy server has
        // its requests sent with their envelope but under the version the proxy's `initialize`
        // agreed, which such a server checks (a 2026-07-28 version would be refused). Before a
        // modern server (no session: it refuses `initialize`) they go with the mirrored headers,
        // merged in by name.
        let legacy = lock(&self.version).is_some();
        let modern: HeaderMap = match legacy {
            true => HeaderMap::new(),
            false => lock(&self.mirror).headers_of(&text).into_iter().collect(),
        };
        self.request(reqwest::Method::POST)
            .headers(modern)
            .header(ACCEPT, "application/json, text/event-stream")
            .header(CONTENT_TYPE, "application/json")
            .body(text)
            .send()
            .await
    }

    fn fail(&self, why: String) {
        tracing::warn!(reason = %why, "the upstream MCP server is gone");
        self.gone.send_if_modified(|g| {
            if g.is_none() {
                *g = Some(why);
                true
            } else {
                false
            }
        });
    }

    /// Hands a frame from the server to the core; notes what an answer to `request` (the key of
    /// the request whose answer this is being read for) says: the version `initialize` agreed,
    /// the header declarations of a `tools/list`. Whether it answered `request`.
    fn deliver(&self, text: String, request: Option<&str>) -> bool {
        let parsed = Frame::parse(&text);
        let answers = parsed.as_ref().is_some_and(|f| {
            f.is_response()
                && Some(frame::id_key(f.id.as_deref().expect("has id")).as_str()) == request
        });
        if answers {
            let v: Option<serde_json::Value> = serde_json::from_str(&text).ok();
            if let Some(pv) = v
                .as_ref()
                .and_then(|v| v["result"]["protocolVersion"].as_str())
                .and_then(|s| HeaderValue::from_str(s).ok())
            {
                *lock(&self.version) = Some(pv);
            }
            let listed = request.is_some_and(|r| lock(&self.listing).remove(r));
            if let (true, Some(v)) = (listed, &v) {
                lock(&self.mirror).learn(&v["result"]);
            }
        }
        let _ = self.to_core.send(text);
        answers
    }

    /// POSTs one frame and hands the server's answer to the core. Returns `Err` with the reason
    /// when the upstream must count as gone.
    async fn post(&self, text: String) -> Result<(), String> {
        let f = Frame::parse(&text);
        let request_id = f
            .as_ref()
            .filter(|f| f.method.is_some())
            .and_then(|f| f.id.as_deref())
            .map(|id| (frame::id_key(id), id.to_owned()));
        let method = f.as_ref().and_then(|f| f.method.as_deref());
        let initialize = method == Some("initialize");
        if initialize {
            *lock(&self.initialize) = Some(text.clone());
        }
        let listing = match (method, &request_id) {
            (Some("tools/list"), Some((key, _))) => Some(key.clone()),
            _ => None,
        };
        if let Some(key) = &listing {
            lock(&self.listing).insert(key.clone());
        }
        let result = self.post_frame(text, request_id, initialize).await;
        // Whatever became of it, a listing's answer is not awaited any more (a refused one
        // would otherwise stay in the set for the session's life).
        if let Some(key) = &listing {
            lock(&self.listing).remove(key);
        }
        result
    }

    /// POSTs `text`; when the server no longer knows the session (404), starts a new one and
    /// POSTs it once more ([`Link::renew`]).
    async fn post_renewing(&self, text: String) -> Result<reqwest::Response, String> {
        let mut renewed = false;
        loop {
            let sent_with = lock(&self.session).clone();
            let res = self
                .post_message(text.clone())
                .await
                .map_err(|e| format!("the upstream could not be reached: {}", error_chain(&e)))?;
            match sent_with {
                Some(stale) if res.status() == reqwest::StatusCode::NOT_FOUND => {
                    if renewed {
                        return Err("the upstream session expired (HTTP 404) again".to_owned());
                    }
                    // The server did not process the request: in a new session, once more.
                    self.renew(&stale).await?;
                    renewed = true;
                }
                _ => return Ok(res),
            }
        }
    }

    /// [`Link::post`] past its bookkeeping.
    async fn post_frame(
        &self,
        text: String,
        request_id: Option<(String, Box<RawValue>)>,
        initialize: bool,
    ) -> Result<(), String> {
        let res = self.post_renewing(text).await?;
        let status = res.status();
        if status.is_server_error() {
            return Err(format!("the upstream answered HTTP {status}"));
        }
        if !status.is_success() {
            let body = res.text().await.unwrap_or_default();
            let body: String = body.chars().take(300).collect();
            tracing::warn!(%status, "the upstream refused a message");
            if let Some((_, id)) = request_id {
                let message = format!(
                    "the upstream MCP server refused the request with HTTP {status}: {body}"
                );
                let error = serde_json::json!({"code": -32000, "message": message});
                let _ = self.to_core.send(format!(
                    r#"{{"jsonrpc":"2.0","id":{},"error":{}}}"#,
                    id.get(),
                    error
                ));
            }
            return Ok(());
        }
        if initialize {
            if let Some(s) = res.headers().get(SESSION_HEADER) {
                *lock(&self.session) = Some(s.clone());
            }
        }
        let Some((key, _)) = request_id else {
            // A notification or a response: 202 and nothing more, or a body we relay all the same.
            return self.relay_body(res, None).await.map(|_| ());
        };
        if self.relay_body(res, Some(&key)).await? {
            Ok(())
        } else {
            Err("the upstream's answer ended before it answered the request".to_owned())
        }
    }

    /// Starts a new session after the server forgot `stale` (HTTP 404), unless another request
    /// did so meanwhile: the agent's `initialize` under an id of the adapter's own, whose answer
    /// stays here, then `notifications/initialized`.
    async fn renew(&self, stale: &HeaderValue) -> Result<(), String> {
        let _one = self.renewing.lock().await;
        if lock(&self.session).as_ref() != Some(stale) {
            return Ok(());
        }
        let expired = |why: &str| format!("the upstream session expired (HTTP 404) and {why}");
        let mut init: serde_json::Value = lock(&self.initialize)
            .as_deref()
            .and_then(|t| serde_json::from_str(t).ok())
            .ok_or_else(|| expired("no initialize is known to start another"))?;
        init["id"] = serde_json::json!("idemgate-new-session");
        *lock(&self.session) = None;
        let res = self
            .post_message(init.to_string())
            .await
            .map_err(|e| expired(&format!("a new one failed: {}", error_chain(&e))))?;
        let status = res.status();
        let session = res.headers().get(SESSION_HEADER).cloned();
        let body = res.text().await.unwrap_or_default();
        let (true, Some(session), true) =
            (status.is_success(), session, body.contains("\"result\""))
        else {
            return Err(expired(&format!(
                "the server refused a new one (HTTP {status})"
            )));
        };
        *lock(&self.session) = Some(session);
        let done = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
        let res = self
            .post_message(done.to_owned())
            .await
            .map_err(|e| expired(&format!("a new one failed: {}", error_chain(&e))))?;
        if !res.status().is_success() {
            return Err(expired(&format!(
                "the server refused the new one's notifications/initialized (HTTP {})",
                res.status()
            )));
        }
        tracing::warn!("the upstream session expired (HTTP 404): started a new one");
        self.sessions.send_modify(|n| *n += 1);
        Ok(())
    }

    /// Relays a response body (JSON or SSE) to the core; whether it answered `request`.
    async fn relay_body(
        &self,
        res: reqwest::Response,
        request: Option<&str>,
    ) -> Result<bool, String> {
        let sse = res
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
        if !sse {
            let body = res.text().await.map_err(lost)?;
            return self.relay_json(body.trim(), request);
        }
        let mut answered = false;
        let mut events = Sse::default();
        let broken = self
            .read_sse(res, &mut events, request, &mut answered)
            .await;
        let Some(request) = request else {
            return broken.map_or(Ok(answered), Err);
        };
        if answered {
            return Ok(true);
        }
        self.resume(events, request, broken).await
    }

    /// Relays a JSON response body (one message, or a batch) to the core; whether it answered
    /// `request`.
    fn relay_json(&self, body: &str, request: Option<&str>) -> Result<bool, String> {
        if body.is_empty() {
            return Ok(false);
        }
        if !body.starts_with('[') {
            return Ok(self.deliver(body.to_owned(), request));
        }
        let batch: Vec<Box<RawValue>> = serde_json::from_str(body)
            .map_err(|e| format!("the upstream's JSON answer is invalid: {e}"))?;
        let mut answered = false;
        for m in batch {
            answered |= self.deliver(m.get().to_owned(), request);
        }
        Ok(answered)
    }

    /// A server may end the stream of a request before its answer, after an event id (SSE
    /// polling, MCP 2025-11-25), or the connection may break (`broken` says why): the stream is
    /// resumed with a GET carrying Last-Event-ID, after the server's `retry` delay, until the
    /// answer to `request` comes. Without an event id there is nothing to resume.
    async fn resume(
        &self,
        mut events: Sse,
        request: &str,
        mut broken: Option<String>,
    ) -> Result<bool, String> {
        let mut answered = false;
        let mut tries = 0;
        while !answered {
            let Some(last) = events.last_id.clone() else {
                return broken.map_or(Ok(false), Err);
            };
            tries += 1;
            if tries > MAX_RESUMES {
                let why = broken.unwrap_or_else(|| "it ended".to_owned());
                return Err(format!(
                    "the upstream's stream could not be resumed before it answered ({why})"
                ));
            }
            let wait = events.retry.unwrap_or(RESUME_WAIT).min(MAX_RESUME_WAIT);
            tokio::time::sleep(wait).await;
            let res = self
                .request(reqwest::Method::GET)
                .header(ACCEPT, "text/event-stream")
                .header(LAST_EVENT_ID, last.as_str())
                .send()
                .await;
            match res {
                Ok(r) if r.status().is_success() => {
                    broken = self
                        .read_sse(r, &mut events, Some(request), &mut answered)
                        .await;
                    if events.last_id.as_ref() != Some(&last) {
                        tries = 0;
                    }
                }
                Ok(r) => {
                    return Err(format!(
                        "the upstream refused to resume its stream before it answered (HTTP {})",
                        r.status()
                    ))
                }
                Err(e) => broken = Some(lost(e)),
            }
        }
        Ok(true)
    }

    /// Reads an SSE body into the core until it ends; why, when it broke.
    async fn read_sse(
        &self,
        mut res: reqwest::Response,
        events: &mut Sse,
        request: Option<&str>,
        answered: &mut bool,
    ) -> Option<String> {
        loop {
            match res.chunk().await {
                Ok(Some(chunk)) => {
                    for data in events.feed(&chunk) {
                        *answered |= self.deliver(data, request);
                    }
                }
                Ok(None) => return None,
                Err(e) => {
                    return Some(format!(
                        "the connection to the upstream broke before it answered: {}",
                        error_chain(&e)
                    ))
                }
            }
        }
    }

    /// The GET stream of the server's own messages, opened again when it ends, until the server
    /// says it has none.
    async fn listen(&self) {
        let mut sessions = self.sessions.subscribe();
        loop {
            sessions.borrow_and_update();
            let res = self
                .request(reqwest::Method::GET)
                .header(ACCEPT, "text/event-stream")
                .send()
                .await;
            match res {
                Ok(r) if r.status().is_success() => {
                    if let Err(e) = self.relay_body(r, None).await {
                        tracing::debug!(error = %e, "the upstream's GET stream broke");
                    }
                }
                Ok(r) if r.status() == reqwest::StatusCode::NOT_FOUND => {
                    // The session expired: the stream follows the next one, if one starts.
                    if sessions.changed().await.is_err() {
                        return;
                    }
                    continue;
                }
                Ok(r) => {
                    tracing::debug!(status = %r.status(), "the upstream has no GET stream");
                    return;
                }
                Err(e) => {
                    tracing::debug!(error = %error_chain(&e), "the upstream's GET stream failed");
                    return;
                }
            }
            tokio::time::sleep(GET_RETRY).await;
        }
    }
}

/// The adapter: frames from the core become requests; answers become frames for the core.
async fn adapt(
    up: Arc<HttpUpstream>,
    from_core: DuplexStream,
    to_core: mpsc::UnboundedSender<String>,
) {
    let (gone, mut gone_rx) = watch::channel(None);
    let link = Arc::new(Link::new(up, gone, to_core));
    let mut frames = pump::lines(from_core);
    let mut tasks = JoinSet::new();
    let mut listening = false;
    loop {
        let text = tokio::select! {
            f = frames.recv() => match f {
                Some(f) => f,
                None => break,
            },
            _ = gone_rx.wait_for(Option::is_some) => break,
        };
        while tasks.try_join_next().is_some() {}
        let f = Frame::parse(&text);
        let method = f.as_ref().and_then(|f| f.method.clone());
        if method.as_deref() == Some("initialize") {
            // Everything after it needs its session id: it is answered first.
            if let Err(why) = link.post(text).await {
                link.fail(why);
            }
            continue;
        }
        // The GET stream opens once the client has said it is initialized; it is one of the
        // tasks, so that it ends with the session.
        let listen = method.as_deref() == Some("notifications/initialized") && !listening;
        listening |= listen;
        let l = Arc::clone(&link);
        tasks.spawn(async move {
            match l.post(text).await {
                Err(why) => l.fail(why),
                Ok(()) if listen => l.listen().await,
                Ok(()) => {}
            }
        });
    }
    // Whatever is still running is for a client that is gone, or for an upstream that is.
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    if gone_rx.borrow().is_none() {
        link.end().await;
    }
}

/// Why a request's answer was lost: its connection broke, with `e`.
fn lost(e: reqwest::Error) -> String {
    format!(
        "the connection to the upstream broke before it answered: {}",
        error_chain(&e)
    )
}

/// An error and its causes, on one line (reqwest's own message omits them).
fn error_chain(e: &reqwest::Error) -> String {
    let mut out = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

/// An incremental reader of `text/event-stream`: the data of each `message` event.
#[derive(Default)]
struct Sse {
    pending: Vec<u8>,
    data: Option<String>,
    event: String,
    id: Option<String>,
    /// The id of the last event, to resume from.
    last_id: Option<String>,
    /// The server's reconnection delay.
    retry: Option<Duration>,
}

impl Sse {
    fn feed(&mut self, chunk: &[u8]) -> Vec<String> {
        self.pending.extend_from_slice(chunk);
        let mut out = Vec::new();
        while let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
            let raw: Vec<u8> = self.pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&raw[..raw.len() - 1]);
            let line = line.strip_suffix('\r').unwrap_or(&line);
            if line.is_empty() {
                let data = self.data.take();
                let event = std::mem::take(&mut self.event);
                if let Some(id) = self.id.take() {
                    self.last_id = Some(id);
                }
                if let Some(d) = data {
                    if (event.is_empty() || event == "message") && !d.trim().is_empty() {
                        out.push(d);
                    }
                }
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "data" => {
                    let d = self.data.get_or_insert_with(String::new);
                    if !d.is_empty() {
                        d.push('\n');
                    }
                    d.push_str(value);
                }
                "event" => value.clone_into(&mut self.event),
                "id" if !value.contains('\0') => self.id = Some(value.to_owned()),
                "retry" => {
                    if let Ok(ms) = value.parse() {
                        self.retry = Some(Duration::from_millis(ms));
                    }
                }
                _ => {}
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_events_across_chunks() {
        let mut s = Sse::default();
        assert!(s.feed(b"id: 1\nevent: message\ndata: {\"a\"").is_empty());
        let got = s.feed(b":1}\r\n\r\n: keep-alive\n\nevent: ping\ndata: x\n\ndata: {\"b\":2}\n\n");
        assert_eq!(got, [r#"{"a":1}"#, r#"{"b":2}"#]);
        assert_eq!(s.last_id.as_deref(), Some("1"));
        // A priming event: an id and no data; then the server's reconnection delay.
        assert!(s.feed(b"id: p-7\ndata:\n\nretry: 250\n\n").is_empty());
        assert_eq!(s.last_id.as_deref(), Some("p-7"));
        assert_eq!(s.retry, Some(Duration::from_millis(250)));
    }

    #[test]
    fn headers_are_checked_and_never_echoed() {
        let e = HttpUpstream::new(
            "http://127.0.0.1:1/mcp",
            &["Authorization Bearer s3cret".to_owned()],
        )
        .unwrap_err()
        .to_string();
        assert!(!e.contains("s3cret"), "{e}");
        let e = HttpUpstream::new(
            "http://127.0.0.1:1/mcp",
            &["X-A: s3cret\n".to_owned(), "X-B: s3\u{7f}cret".to_owned()],
        )
        .unwrap_err()
        .to_string();
        assert!(!e.contains("s3"), "{e}");
        assert!(HttpUpstream::new("ftp://h/x", &[]).is_err());
        let up = HttpUpstream::new(
            "http://127.0.0.1:8080/mcp",
            &["Authorization: Bearer t".to_owned()],
        )
        .unwrap();
        assert_eq!(up.host(), "127.0.0.1-8080-mcp");
        let named = HttpUpstream::new("https://mcp.example.com/github/mcp/", &[]).unwrap();
        assert_eq!(named.host(), "mcp.example.com-github-mcp");
        assert_eq!(
            Upstream::Http(Arc::new(named)).name(&Config::default()),
            "mcp.example.com-github-mcp"
        );
        assert!(format!("{up:?}").contains("Sensitive"), "{up:?}");
    }
}

//! One open session of the Streamable HTTP transport, apart from the endpoint that serves it:
//! where the frames its session has for the client go ([`Routes`]: the answer to the POST that
//! waits for it, the server's own messages to the GET stream or a POST stream), the streams of
//! events a client may resume ([`Outbound`]), what sessionless requests asked to be told
//! ([`Asks`]), and a POST's place in the waiting list ([`Waiting`]). It knows nothing of HTTP
//! requests: the endpoint ([`super`]) turns them into these calls, which is why it is apart.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idemgate_core::TenantId;
use tokio::sync::{mpsc, Notify};

use crate::gate::CarriedKey;
use crate::sync::lock;
use crate::wire::frame::{self, Frame};
use crate::wire::mirror::ParamHeaders;

/// Server messages kept for a GET stream that is not open yet; older ones are dropped.
const MAX_QUEUED: usize = 1000;
/// Events a stream keeps for a client that resumes it, as many as messages wait for a GET: a
/// client comes back within its `retry` time, and a stream that sent more meanwhile (a tool's
/// progress notifications) is one whose client no longer reads it. Older ones are dropped, and a
/// `Last-Event-ID` before them is refused: replaying the rest would lose some silently.
const MAX_EVENTS: usize = 1000;
/// Ended POST streams a session keeps for a client that lost the connection before it read the
/// answer (it comes back within the `retry` time): enough for a burst of concurrent calls, and a
/// bound on what a session holds when its client never comes back.
const MAX_ENDED: usize = 100;
/// One open session.
pub(super) struct Live {
    pub(super) id: String,
    pub(super) tenant: TenantId,
    /// Whether it serves sessionless requests (no stream for the server's own messages).
    pub(super) shared: bool,
    pub(super) to_session: mpsc::UnboundedSender<(String, CarriedKey)>,
    /// The session's knowledge of the tool parameters mirrored in headers.
    pub(super) params: Arc<Mutex<ParamHeaders>>,
    pub(super) routes: Mutex<Routes>,
    /// The first part of its event ids: random, so that an id of another session names nothing.
    pub(super) tag: String,
    pub(super) stop: Notify,
    pub(super) last_used: Mutex<Instant>,
}

/// Where frames for the client go.
#[derive(Default)]
pub(super) struct Routes {
    /// POSTs waiting for the answer to their request, by request id: their streams, oldest first.
    pub(super) posts: HashMap<String, VecDeque<u64>>,
    /// The session's streams by number: the POSTs' in flight, the GET stream, and ended POST
    /// streams a client may still resume.
    pub(super) streams: HashMap<u64, Outbound>,
    /// The number of the last stream opened.
    pub(super) next: u64,
    /// The GET stream, when there is one (its client may be away, to resume it).
    pub(super) get: Option<u64>,
    /// Ended POST streams kept for a resumption, oldest first (at most [`MAX_ENDED`]).
    pub(super) ended: VecDeque<u64>,
    /// Server messages that found no stream.
    pub(super) queued: VecDeque<String>,
    /// The protocol version `initialize` agreed.
    pub(super) version: Option<String>,
    /// What sessionless requests asked to be told besides their answer, by request id.
    pub(super) asks: HashMap<String, Asks>,
    /// The session has ended: nothing more comes.
    pub(super) closed: bool,
}

/// What a sessionless request asks to be told on its own stream before its answer (MCP
/// 2026-07-28: no session, so no GET stream; a request's notifications go with its answer):
/// progress for its `progressToken` (renamed on the way to the shared process, whose requests
/// come from many clients, to the request's id there), and log messages at or above its
/// `io.modelcontextprotocol/logLevel`.
#[derive(Debug, Default)]
pub(super) struct Asks {
    /// The client's own progress token, given back in the notifications routed to it.
    pub(super) progress_token: Option<Box<serde_json::value::RawValue>>,
    /// The least severe log level the request wants.
    pub(super) log_level: Option<usize>,
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
pub(super) fn for_shared(
    text: &str,
    proxy_id: &serde_json::value::RawValue,
) -> Option<(String, Asks)> {
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

/// What a stream's connection is sent: events, each with its number in the stream.
pub(super) type Sender = mpsc::UnboundedSender<(u64, String)>;

/// One stream of events toward the client: a POST's, which ends with the answer to its
/// request, or the GET stream.
pub(super) struct Outbound {
    /// The connection writing it now (its POST's, or a GET's that resumed it).
    pub(super) to: Option<Sender>,
    /// Its last events, by number (event 0 is a priming event, never kept).
    pub(super) events: VecDeque<(u64, String)>,
    /// The number of its next event.
    pub(super) next: u64,
    /// The number of the last event dropped to keep [`MAX_EVENTS`] (0: none).
    pub(super) dropped: u64,
    /// Whether it ends with an answer (a POST's).
    pub(super) post: bool,
    /// Its client was given an event id of it: it outlives its connection, and an answer that
    /// finds nobody listening waits in it.
    pub(super) resumable: bool,
    /// The answer is in it: nothing more comes.
    pub(super) ended: bool,
}

impl Outbound {
    pub(super) fn new(post: bool, to: Sender) -> Self {
        Outbound {
            to: Some(to),
            events: VecDeque::new(),
            next: 1,
            dropped: 0,
            post,
            resumable: false,
            ended: false,
        }
    }

    /// Sends `frame` as its next event to the connection writing it, and keeps it; `frame` back
    /// when no connection takes it (nothing is kept then).
    pub(super) fn send(&mut self, frame: String) -> Result<(), String> {
        let Some(to) = &self.to else {
            return Err(frame);
        };
        if to.send((self.next, frame.clone())).is_err() {
            self.to = None;
            return Err(frame);
        }
        self.keep(frame);
        Ok(())
    }

    /// Keeps `frame` as its next event, for a connection that resumes the stream.
    pub(super) fn keep(&mut self, frame: String) {
        self.events.push_back((self.next, frame));
        self.next += 1;
        if self.events.len() > MAX_EVENTS {
            if let Some((n, _)) = self.events.pop_front() {
                self.dropped = n;
            }
        }
    }
}

impl Routes {
    /// The answer to request `id` goes to the first POST of it still waiting: one whose client
    /// listens, or that its client may resume (the answer waits in its stream).
    pub(super) fn answer(&mut self, id: &str, mut frame: String) {
        let Some(waiting) = self.posts.get_mut(id) else {
            return;
        };
        while let Some(n) = waiting.pop_front() {
            let Some(stream) = self.streams.get_mut(&n) else {
                continue;
            };
            match stream.send(frame) {
                Ok(()) => {}
                Err(back) if stream.resumable => stream.keep(back),
                // Its client hung up before it had an id to come back with.
                Err(back) => {
                    frame = back;
                    continue;
                }
            }
            stream.ended = true;
            if stream.resumable {
                self.ended.push_back(n);
                if self.ended.len() > MAX_ENDED {
                    if let Some(old) = self.ended.pop_front() {
                        self.streams.remove(&old);
                    }
                }
            }
            break;
        }
        if waiting.is_empty() {
            self.posts.remove(id);
            // What a sessionless request asked to be told ends with its answer.
            self.asks.remove(id);
        }
    }

    /// A message of the server's own goes to the GET stream when its client listens, else to a
    /// POST stream whose client listens, else waits for the next GET: on one stream only.
    pub(super) fn server_message(&mut self, mut frame: String) {
        if let Some(get) = self.get.and_then(|n| self.streams.get_mut(&n)) {
            match get.send(frame) {
                Ok(()) => return,
                Err(back) => frame = back,
            }
        }
        for n in self.posts.values().flatten() {
            if let Some(post) = self.streams.get_mut(n) {
                match post.send(frame) {
                    Ok(()) => return,
                    Err(back) => frame = back,
                }
            }
        }
        self.queued.push_back(frame);
        if self.queued.len() > MAX_QUEUED {
            self.queued.pop_front();
        }
    }

    /// Opens a new GET stream written to `to`, which replaces the GET stream there was (its
    /// connection ends, and it can no longer be resumed); the messages that waited go to it.
    /// Its number.
    pub(super) fn open_get(&mut self, to: Sender) -> u64 {
        self.next += 1;
        let number = self.next;
        if let Some(old) = self.get.replace(number) {
            self.streams.remove(&old);
        }
        let mut get = Outbound::new(false, to);
        get.resumable = true;
        for frame in self.queued.drain(..) {
            // The receiver is the caller's, alive.
            let _ = get.send(frame);
        }
        self.streams.insert(number, get);
        number
    }

    /// Resumes the stream of event `last` (a `Last-Event-ID` of the session tagged `tag`) on the
    /// connection of `to`: its events after `last`, then its later ones. The stream's number and
    /// whether it is a POST's; why not, for an id the session does not know or no longer keeps
    /// what came after.
    pub(super) fn resume(
        &mut self,
        tag: &str,
        last: &str,
        to: Sender,
    ) -> Result<(u64, bool), String> {
        let unknown = || {
            format!(
                "Last-Event-ID {last:?} names no event of this session's streams (or one no longer kept); open a GET without it"
            )
        };
        let (number, after) = last
            .strip_prefix(tag)
            .and_then(|rest| rest.strip_prefix('-'))
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(s, n)| Some((s.parse::<u64>().ok()?, n.parse::<u64>().ok()?)))
            .ok_or_else(unknown)?;
        let stream = self
            .streams
            .get_mut(&number)
            .filter(|s| s.resumable && after < s.next)
            .ok_or_else(unknown)?;
        if after < stream.dropped {
            return Err(format!(
                "the events after Last-Event-ID {last:?} are no longer all kept (a stream keeps its last {MAX_EVENTS}); open a GET without it"
            ));
        }
        for (n, frame) in stream.events.iter().filter(|(n, _)| *n > after) {
            let _ = to.send((*n, frame.clone()));
        }
        let post = stream.post;
        if post && stream.ended {
            // Nothing more comes: the connection ends after the replay.
            return Ok((number, post));
        }
        // The connection writing it until now (if any) ends.
        stream.to = Some(to);
        if !post {
            for frame in self.queued.drain(..) {
                // The receiver is the caller's, alive.
                let _ = stream.send(frame);
            }
        }
        Ok((number, post))
    }
}

impl Live {
    /// Sends a frame from the session to where it belongs.
    pub(super) fn route(&self, frame: String) {
        let parsed = Frame::parse(&frame);
        let mut r = lock(&self.routes);
        if let Some(f) = parsed.filter(Frame::is_response) {
            let id = frame::id_key(f.id.as_deref().expect("responses have ids"));
            r.answer(&id, frame);
            // When nobody waits any more (the client hung up before it had an event id to come
            // back with), the answer is dropped: the outcome is recorded all the same.
            return;
        }
        if self.shared {
            match Frame::parse(&frame).and_then(|f| f.method.zip(f.params)) {
                Some((m, params)) if m == "notifications/progress" => {
                    Self::progress_to_its_request(&mut r, &params);
                }
                Some((m, params)) if m == "notifications/message" => {
                    Self::log_to_requests_that_asked(&mut r, &frame, &params);
                }
                _ => {
                    drop(r);
                    self.refuse_server_message(&frame);
                }
            }
            return;
        }
        r.server_message(frame);
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
        let post = r.posts.get(&id).and_then(|w| w.front());
        if let Some(post) = post.and_then(|n| r.streams.get_mut(n)) {
            let _ = post.send(note.to_string());
        }
    }

    /// A log message of the shared process, which says not whose request it concerns: to every
    /// request in flight that asked for messages of its level (the process is the tenant's own,
    /// so no other tenant's client hears it).
    fn log_to_requests_that_asked(
        r: &mut Routes,
        frame: &str,
        params: &serde_json::value::RawValue,
    ) {
        let level = frame::object(params)
            .and_then(|p| frame::string(&p, "level"))
            .and_then(|l| log_severity(&l));
        let Some(level) = level else {
            return;
        };
        for (id, asks) in &r.asks {
            if asks.log_level.is_some_and(|wanted| level >= wanted) {
                let post = r.posts.get(id).and_then(|w| w.front());
                if let Some(post) = post.and_then(|n| r.streams.get_mut(n)) {
                    let _ = post.send(frame.to_owned());
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
    pub(super) fn submit(
        self: &Arc<Self>,
        id: String,
        frame: String,
        key: CarriedKey,
    ) -> Option<(Inbox, Waiting)> {
        let (tx, rx) = mpsc::unbounded_channel();
        let waiting = {
            let mut r = lock(&self.routes);
            if r.closed {
                return None;
            }
            r.next += 1;
            let number = r.next;
            r.streams.insert(number, Outbound::new(true, tx));
            r.posts.entry(id.clone()).or_default().push_back(number);
            Waiting {
                live: Arc::clone(self),
                id,
                number,
            }
        };
        self.to_session.send((frame, key)).ok()?;
        Some((Inbox(rx), waiting))
    }

    /// The session has ended: every stream ends.
    pub(super) fn close(&self) {
        let mut r = lock(&self.routes);
        r.closed = true;
        r.posts.clear();
        r.streams.clear();
        r.ended.clear();
        r.get = None;
    }

    /// The id of event `n` of stream `stream`.
    pub(super) fn event_id(&self, stream: u64, n: u64) -> String {
        format!("{}-{stream}-{n}", self.tag)
    }

    pub(super) fn touch(&self) {
        *lock(&self.last_used) = Instant::now();
    }

    /// Whether nothing has happened in it for `idle`, with no request in flight.
    pub(super) fn idle(&self, idle: Duration) -> bool {
        lock(&self.last_used).elapsed() >= idle && lock(&self.routes).posts.is_empty()
    }
}

/// What a POST receives for its request: the events of its stream.
pub(super) struct Inbox(pub(super) mpsc::UnboundedReceiver<(u64, String)>);

impl Inbox {
    /// The next frame; `None` when the session has ended.
    pub(super) async fn recv(&mut self) -> Option<String> {
        self.0.recv().await.map(|(_, frame)| frame)
    }
}

/// Takes a POST's place in the waiting list off it when the POST ends, answered or not, unless
/// its client may resume its stream. (It holds no sender: when the session ends, the POST's
/// channel closes and the POST learns so.)
pub(super) struct Waiting {
    pub(super) live: Arc<Live>,
    pub(super) id: String,
    pub(super) number: u64,
}

impl Waiting {
    /// The POST turns into a stream whose event ids its client is given: from now on, it
    /// outlives its connection.
    pub(super) fn resumable(&self) {
        if let Some(stream) = lock(&self.live.routes).streams.get_mut(&self.number) {
            stream.resumable = true;
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut r = lock(&self.live.routes);
        if r.streams.get(&self.number).is_some_and(|s| s.resumable) {
            // Its answer lands in its stream for a GET with Last-Event-ID.
            return;
        }
        r.streams.remove(&self.number);
        if let Some(waiting) = r.posts.get_mut(&self.id) {
            waiting.retain(|n| *n != self.number);
            if waiting.is_empty() {
                r.posts.remove(&self.id);
                r.asks.remove(&self.id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::mpsc;

    use super::{Outbound, Routes, MAX_ENDED, MAX_EVENTS};

    #[test]
    fn a_stream_resumes_only_after_events_it_still_keeps() {
        let mut r = Routes::default();
        let (tx, _listening) = mpsc::unbounded_channel();
        let get = r.open_get(tx);
        // Events 1 to MAX_EVENTS + 5: the first five are dropped.
        for i in 1..=MAX_EVENTS + 5 {
            r.server_message(format!("m{i}"));
        }
        let (tx, _) = mpsc::unbounded_channel();
        let lost = r.resume("t", &format!("t-{get}-4"), tx).unwrap_err();
        assert!(lost.contains("no longer all kept"), "{lost}");
        let (tx, mut rx) = mpsc::unbounded_channel();
        assert_eq!(r.resume("t", &format!("t-{get}-5"), tx), Ok((get, false)));
        let replayed: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        assert_eq!(replayed.len(), MAX_EVENTS);
        assert_eq!(replayed[0], (6, "m6".to_owned()));
        // Later events follow on the resumed connection.
        r.server_message("later".to_owned());
        assert_eq!(
            rx.try_recv(),
            Ok((MAX_EVENTS as u64 + 6, "later".to_owned()))
        );
        // An id beyond what the stream sent, of another tag, or of no stream: refused.
        for id in [
            format!("t-{get}-9999"),
            format!("u-{get}-5"),
            "t-77-0".to_owned(),
        ] {
            let (tx, _) = mpsc::unbounded_channel();
            assert!(r.resume("t", &id, tx).is_err(), "{id}");
        }
    }

    #[test]
    fn answers_nobody_read_are_kept_for_the_last_ended_streams() {
        let mut r = Routes::default();
        let mut streams = Vec::new();
        for i in 0..=MAX_ENDED {
            // A resumable POST whose client hung up before its answer came.
            let (tx, rx) = mpsc::unbounded_channel();
            drop(rx);
            r.next += 1;
            let number = r.next;
            let mut post = Outbound::new(true, tx);
            post.resumable = true;
            r.streams.insert(number, post);
            r.posts.entry(i.to_string()).or_default().push_back(number);
            r.answer(&i.to_string(), format!("answer {i}"));
            streams.push(number);
        }
        assert!(r.posts.is_empty());
        let (tx, _) = mpsc::unbounded_channel();
        assert!(r.resume("t", &format!("t-{}-0", streams[0]), tx).is_err());
        let (tx, mut rx) = mpsc::unbounded_channel();
        let resumed = r.resume("t", &format!("t-{}-0", streams[1]), tx);
        assert_eq!(resumed, Ok((streams[1], true)));
        assert_eq!(rx.try_recv(), Ok((1, "answer 1".to_owned())));
        // Nothing more comes: the connection ends after the answer.
        assert_eq!(rx.try_recv(), Err(mpsc::error::TryRecvError::Disconnected));
    }
}

//! Server-sent events: how the endpoint writes a stream (a POST's answer that turned into one, or
//! the GET stream), its events' ids and priming events for resumption, and `GET /mcp`, which
//! opens the session's stream or resumes one by `Last-Event-ID`. What a stream keeps and where
//! a frame goes is the session's (live.rs); this is the writing of it.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream, StreamExt as _};
use idemgate_core::Store;
use tokio::sync::mpsc;

use super::live::{Live, Waiting};
use super::reply::fail;
use super::sessions::Proxy;
use crate::sync::lock;
use crate::wire::frame::Frame;
use crate::wire::headers::{LAST_EVENT_ID, VERSION_HEADER};

/// The reconnection time a priming event asks for (SSE `retry`).
pub(super) const RETRY: Duration = Duration::from_secs(1);
/// A comment on a stream after this long without an event, so that idle connections stay open
/// through intermediaries (axum's default keep-alive).
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// `GET /mcp`: the stream of the server's own requests and notifications.
pub(super) async fn open_stream<S: Store>(
    State(proxy): State<Arc<Proxy<S>>>,
    headers: HeaderMap,
) -> Response {
    let tenant = match proxy.guard.admit(&headers).await {
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

pub(super) fn sse(
    frames: impl Stream<Item = String> + Send + 'static,
) -> Sse<impl Stream<Item = Result<Event, std::convert::Infallible>>> {
    Sse::new(frames.map(event)).keep_alive(KeepAlive::default())
}

fn event(frame: String) -> Result<Event, std::convert::Infallible> {
    Ok(Event::default().event("message").data(frame))
}

/// The protocol version an `initialize` answer agreed on.
pub(super) fn agreed_version(answer: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(answer).ok()?;
    v["result"]["protocolVersion"].as_str().map(str::to_owned)
}

/// Whether the client takes `text/event-stream` answers, by its `Accept`.
pub(super) fn accepts_sse(headers: &HeaderMap) -> bool {
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
pub(super) fn primes(live: &Live, headers: &HeaderMap) -> bool {
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
pub(super) fn sse_event(id: &str, retry: Option<Duration>, data: &str) -> Bytes {
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
pub(super) struct Writer {
    pub(super) live: Arc<Live>,
    pub(super) stream: u64,
    pub(super) rx: mpsc::UnboundedReceiver<(u64, String)>,
    /// A POST's stream, which ends with the answer.
    pub(super) post: bool,
    /// The answer is `initialize`'s: it says the version agreed.
    pub(super) initialize: bool,
    /// A POST's place in the waiting list, held while its stream is written.
    pub(super) _waiting: Option<Waiting>,
}

/// The SSE answer of a session's stream: `head` (events written already), then the events `w`
/// brings, each with its id, until a POST stream's answer, or until the stream goes to another connection or the
/// session ends; a comment after [`KEEP_ALIVE`] without an event.
pub(super) fn resumable_sse(head: Vec<Bytes>, w: Writer) -> Response {
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

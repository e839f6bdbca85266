//! `POST /mcp`: one JSON-RPC message from the client. Reading it (the body, its media type, the
//! `Idempotency-Key` beside it, a `traceparent` header), then: a request that opens a session,
//! a sessionless one (sessionless.rs), or one of a session, whose answer is JSON or, when the
//! server speaks first or the answer takes a while, a resumable stream (sse.rs).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use idemgate_core::Store;
use tokio::sync::mpsc;

use super::live::{Inbox, Live, Waiting};
use super::reply::{fail, json_response, refuse, Refused};
use super::sessionless::sessionless;
use super::sessions::Proxy;
use super::sse::{agreed_version, primes, resumable_sse, sse_event, Writer, RETRY};
use crate::gate::CarriedKey;
use crate::sync::lock;
use crate::wire::era;
use crate::wire::frame::{self, Frame};
use crate::wire::headers::{IDEMPOTENCY_KEY, SESSION_HEADER};

/// How long a POST waits for its answer as JSON before it turns into a stream with a priming
/// event: quick answers (replays, most writes) stay `application/json`, and a call that takes
/// longer, the kind whose connection breaks or whose client times out, becomes resumable.
const PRIME_AFTER: Duration = Duration::from_millis(100);

/// `POST /mcp`: one JSON-RPC message from the client.
pub(super) async fn post_message<S: Store>(
    State(proxy): State<Arc<Proxy<S>>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let tenant = match proxy.guard.admit(&headers).await {
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

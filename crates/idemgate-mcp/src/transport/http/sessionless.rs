//! Sessionless requests (MCP 2026-07-28): a modern client's POST without `Mcp-Session-Id`,
//! checked against the headers that mirror it, renamed to an id of the proxy's, sent to its
//! tenant's shared child (sessions.rs) and answered under its own id again, as JSON or, when
//! progress or log messages come first, a stream of its own. Apart from post.rs because nothing
//! of a session's streams, resumption or the server's own requests applies here.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, StreamExt as _};
use idemgate_core::{Store, TenantId};

use super::live::{for_shared, Inbox, Waiting};
use super::reply::{fail, json_response};
use super::sessions::Proxy;
use super::sse::sse;
use crate::gate::CarriedKey;
use crate::sync::lock;
use crate::wire::era;
use crate::wire::frame::{self, Frame};
use crate::wire::headers::{METHOD_HEADER, NAME_HEADER, VERSION_HEADER};
use crate::wire::mirror;

/// A modern client's request without a session: checked against its headers, renamed, sent
/// to the tenant's shared child, and answered as JSON under its own id.
pub(super) async fn sessionless<S: Store>(
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

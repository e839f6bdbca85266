//! The answers every part of the endpoint gives: a refusal (an HTTP error whose body is a
//! JSON-RPC error) and a JSON-RPC message as `application/json`. A leaf, so that the guard, the
//! sessions, the POST and GET handlers and the sessionless mode all answer alike without
//! importing one another.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// A refused request's answer (boxed: a response is large).
pub(super) type Refused = Box<Response>;

pub(super) fn refuse(status: StatusCode, message: &str) -> Refused {
    Box::new(fail(status, message))
}

/// An HTTP error whose body is a JSON-RPC error without id (the MCP SDKs read it as one).
pub(super) fn fail(status: StatusCode, message: &str) -> Response {
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

/// A JSON-RPC message (an answer) as `application/json`.
pub(super) fn json_response(frame: String) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        frame,
    )
        .into_response()
}

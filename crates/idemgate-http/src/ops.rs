//! Operations: health, readiness, metrics and the OpenAPI document.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::error::Problem;
use crate::gateway::Gateway;

/// The OpenAPI 3.1 document of every route.
pub(crate) const OPENAPI: &str = include_str!("openapi.json");

/// `GET /healthz`: the process serves.
pub(crate) async fn healthz() -> &'static str {
    "ok\n"
}

/// `GET /readyz`: the store takes a write (a probe reserved and released).
pub(crate) async fn readyz(State(gw): State<Gateway>) -> Response {
    if gw.ready().await {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        gw.metrics().store_error();
        Problem::store_unavailable("the store does not take writes").into_response()
    }
}

/// `GET /metrics`: Prometheus text.
pub(crate) async fn metrics(State(gw): State<Gateway>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        gw.metrics().render(),
    )
        .into_response()
}

/// `GET /openapi.json`.
pub(crate) async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

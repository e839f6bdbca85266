//! A fake payment API for trying the gateway's forwarding (docs/HTTP.md, walk-through): `POST
//! /charge` on 127.0.0.1:9000 answers with a charge number that grows with every call it really
//! gets, so replays are easy to tell from executions.
//!
//! `cargo run -p idemgate-http --example upstream [ADDR]`

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:9000".to_owned());
    let app = Router::new()
        .route("/charge", post(charge))
        .with_state(Arc::new(AtomicU64::new(0)));
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    eprintln!("upstream: POST http://{addr}/charge");
    axum::serve(listener, app).await
}

async fn charge(
    State(count): State<Arc<AtomicU64>>,
    headers: HeaderMap,
    Json(args): Json<Value>,
) -> Json<Value> {
    let n = count.fetch_add(1, Ordering::Relaxed) + 1;
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    eprintln!("upstream: charge #{n} (downstream key {key})");
    Json(json!({"charge": format!("ch_{n}"), "amount": args["amount"]}))
}

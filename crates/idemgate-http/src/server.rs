//! The router, its middleware, and the serving loop with graceful shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use http_body_util::BodyExt as _;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::time::Instant;

use crate::config::Config;
use crate::error::{Error, Problem};
use crate::gateway::Gateway;
use crate::request::TooLarge;
use crate::{coordinate, forward, ops, records};

/// Every route, as metrics and logs name it (never the concrete path, which holds keys).
const ROUTES: &[&str] = &[
    "/healthz",
    "/readyz",
    "/metrics",
    "/openapi.json",
    "/v1/records",
    "/v1/tools/{tool}/begin",
    "/v1/tools/{tool}/heartbeat",
    "/v1/tools/{tool}/complete",
    "/v1/tools/{tool}/release",
    "/v1/tools/{tool}/ambiguous",
    "/v1/tools/{tool}/call",
    "/v1/tools/{tool}/records/{key}",
    "/v1/tools/{tool}/records/{key}/resolve",
    "/v1/tools/{tool}/records/{key}/reopen",
];

/// The gateway's routes with their limits, logging and metrics.
pub fn router(gateway: Gateway) -> Router {
    let mut routes = Router::new();
    if let Some(console) = gateway.console() {
        routes = routes.merge(idemgate_console::router(console.clone()));
    }
    routes
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::metrics))
        .route("/openapi.json", get(ops::openapi))
        .route("/v1/records", get(records::list))
        .route("/v1/tools/{tool}/begin", post(coordinate::begin))
        .route("/v1/tools/{tool}/heartbeat", post(coordinate::heartbeat))
        .route("/v1/tools/{tool}/complete", post(coordinate::complete))
        .route("/v1/tools/{tool}/release", post(coordinate::release))
        .route("/v1/tools/{tool}/ambiguous", post(coordinate::ambiguous))
        .route("/v1/tools/{tool}/call", post(forward::call))
        .route("/v1/tools/{tool}/records/{key}", get(records::show))
        .route(
            "/v1/tools/{tool}/records/{key}/resolve",
            post(records::resolve),
        )
        .route(
            "/v1/tools/{tool}/records/{key}/reopen",
            post(records::reopen),
        )
        // After every route: it applies to the routes added so far. axum adds the `Allow` header.
        .method_not_allowed_fallback(|method: Method| async move {
            Problem::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "Method not allowed",
                format!("{method} is not allowed here; the Allow header lists what is"),
            )
        })
        .fallback(|| async { Problem::not_found("no such route; see /openapi.json") })
        // Innermost first: the body limit, then the whole-request timeout, then observation, so
        // the latency and the log line include timeouts and 413s.
        .layer(middleware::from_fn_with_state(gateway.clone(), limit_body))
        .layer(middleware::from_fn_with_state(gateway.clone(), timeout))
        .layer(middleware::from_fn_with_state(gateway.clone(), observe))
        .with_state(gateway)
}

/// Refuses a declared body over the limit before reading a byte of it, and caps undeclared
/// (chunked) bodies as they are read.
async fn limit_body(State(gw): State<Gateway>, req: Request, next: Next) -> Response {
    let max = gw.config().server.max_body_bytes;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max) {
        return Problem::payload_too_large(max).into_response();
    }
    let limit = usize::try_from(max).unwrap_or(usize::MAX);
    let req = req.map(|body| {
        Body::new(http_body_util::Limited::new(body, limit).map_err(move |e| {
            if e.is::<http_body_util::LengthLimitError>() {
                Box::new(TooLarge(max)) as Box<dyn std::error::Error + Send + Sync>
            } else {
                e
            }
        }))
    });
    next.run(req).await
}

/// Bounds the whole request, reading the body and forwarding included.
async fn timeout(State(gw): State<Gateway>, req: Request, next: Next) -> Response {
    let limit = gw.config().server.request_timeout;
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(res) => res,
        Err(_) => Problem::timeout(limit).into_response(),
    }
}

/// One log line and one latency sample per request, by route template.
async fn observe(State(gw): State<Gateway>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .and_then(|m| ROUTES.iter().find(|r| **r == m.as_str()).copied())
        .unwrap_or("other");
    let method = req.method().clone();
    let start = Instant::now();
    let res = next.run(req).await;
    let took = start.elapsed();
    gw.metrics().request(route, took);
    tracing::info!(
        method = %method,
        route,
        status = res.status().as_u16(),
        micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
        "request"
    );
    res
}

/// A gateway bound to its address, not yet serving.
#[derive(Debug)]
pub struct Server {
    listener: TcpListener,
    gateway: Gateway,
    addr: SocketAddr,
}

impl Server {
    /// Binds the configured listen address (port 0 picks a free one).
    ///
    /// # Errors
    /// [`Error::Listen`] when the address cannot be bound.
    pub async fn bind(gateway: Gateway) -> Result<Self, Error> {
        let want = gateway.config().server.listen;
        let listen_err = |source| Error::Listen {
            addr: want.to_string(),
            source,
        };
        let listener = TcpListener::bind(want).await.map_err(listen_err)?;
        let addr = listener.local_addr().map_err(listen_err)?;
        Ok(Server {
            listener,
            gateway,
            addr,
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The gateway it serves.
    pub fn gateway(&self) -> &Gateway {
        &self.gateway
    }

    /// Serves until `shutdown` completes, then stops accepting, lets in-flight requests finish
    /// (up to the request timeout and a little more), flushes the journal and returns.
    ///
    /// # Errors
    /// None today once bound; accept errors (such as running out of file descriptors) are
    /// logged and retried.
    pub async fn serve(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), Error> {
        let Server {
            listener,
            gateway,
            addr,
        } = self;
        let cfg = gateway.config().server.clone();
        // Outcomes an earlier run could not store go in before the first request is served.
        gateway.flush_journal().await;
        let flusher = gateway.start_journal_flusher();
        let app = router(gateway.clone());
        let graceful = GracefulShutdown::new();
        let mut shutdown = std::pin::pin!(shutdown);
        tracing::info!(%addr, "serving");
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        let _ = stream.set_nodelay(true);
                        let mut builder = http1::Builder::new();
                        builder
                            .timer(TokioTimer::new())
                            .header_read_timeout(cfg.header_timeout);
                        let conn = builder.serve_connection(
                            TokioIo::new(stream),
                            TowerToHyperService::new(app.clone()),
                        );
                        let conn = graceful.watch(conn);
                        tokio::spawn(async move {
                            if let Err(e) = conn.await {
                                tracing::debug!(error = %e, "connection ended with an error");
                            }
                        });
                    }
                    Err(e) => {
                        // Usually out of file descriptors: back off instead of spinning.
                        tracing::warn!(error = %e, "failed to accept a connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
                () = &mut shutdown => break,
            }
        }
        drop(listener);
        tracing::info!(
            connections = graceful.count(),
            "shutting down: finishing in-flight requests"
        );
        let grace = cfg.request_timeout + Duration::from_secs(5);
        if tokio::time::timeout(grace, graceful.shutdown())
            .await
            .is_err()
        {
            tracing::warn!("stopped waiting for connections after the request timeout");
        }
        drop(flusher);
        gateway.flush_journal().await;
        tracing::info!("stopped");
        Ok(())
    }
}

/// Opens the gateway that `config` describes and binds its address.
///
/// # Errors
/// As [`Gateway::open`] and [`Server::bind`].
pub async fn bind(config: Config) -> Result<Server, Error> {
    Server::bind(Gateway::open(config).await?).await
}

/// Runs the gateway that `config` describes until `shutdown` completes.
///
/// # Errors
/// As [`bind`].
pub async fn serve(config: Config, shutdown: impl Future<Output = ()> + Send) -> Result<(), Error> {
    bind(config).await?.serve(shutdown).await
}

/// Completes on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}

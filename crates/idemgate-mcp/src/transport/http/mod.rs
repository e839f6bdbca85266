//! The Streamable HTTP transport (MCP 2025-11-25, "Transports"): the client side is one endpoint,
//! `/mcp`, where a POST carries one JSON-RPC message, a GET opens the stream of the server's own
//! requests and notifications, and a DELETE ends the session; the server side is a child process
//! over stdio, one per session (or, with an [`Upstream::Http`](crate::transport::upstream::Upstream::Http), one session of a remote server
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
//! of that child learns the server's era as for any session ([`Session`](crate::session::Session)): a legacy
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
//!
//! The files, by concern: this one wires the endpoint (its routes, serving, stopping);
//! `sessions.rs` is [`Proxy`] and its table of sessions; `guard.rs` checks a request's origin,
//! token and rate; `post.rs` answers a POST, `sse.rs` writes streams and answers a GET, and
//! `sessionless.rs` answers a POST without a session; `live.rs` is one open session's routes and
//! resumable streams, `oauth.rs` the OAuth resource server, and `reply.rs` the answers they
//! share. Each imports only the ones below it.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::header;
use axum::routing::{get, post};
use axum::Router;
use idemgate_core::Store;

mod guard;
mod live;
mod oauth;
mod post;
mod reply;
mod sessionless;
mod sessions;
mod sse;

use self::post::post_message;
use self::sessions::end_session;
pub use self::sessions::Proxy;
use self::sse::open_stream;
use super::pump;
use crate::error::Error;
use crate::sync::lock;

/// The endpoint's path.
pub const ENDPOINT: &str = "/mcp";
pub use crate::wire::headers::{METHOD_HEADER, NAME_HEADER, SESSION_HEADER, VERSION_HEADER};

/// Serving: the endpoint's routes, serving them until a shutdown, and stopping.
impl<S: Store> Proxy<S> {
    /// The axum router of the endpoint.
    pub fn router(self: &Arc<Self>) -> Router {
        let mut router = Router::new().route(
            ENDPOINT,
            post(post_message::<S>)
                .get(open_stream::<S>)
                .delete(end_session::<S>),
        );
        if let Some(oauth) = &self.guard.oauth {
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
        // One write of the whole line: `eprintln!` writes its pieces one by one to the unbuffered
        // stderr, so a script reading the address as it comes could see `http://` alone.
        let line = format!("idemgate: MCP Streamable HTTP endpoint at http://{addr}{ENDPOINT}\n");
        // Nobody reading stderr is no reason to stop serving.
        let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
        self.serve(listener, pump::shutdown_signal()).await
    }
}

//! The transports: how frames reach the proxy from the client and reach the server from the
//! proxy. None of them judges anything; each feeds a [`Session`](crate::Session) and drains it.
//!
//! - [`stdio`]: the client on the proxy's own stdin and stdout (`idemgate mcp -- CMD ARGS…`);
//! - [`http`]: the client over Streamable HTTP (`idemgate mcp --listen ADDR -- CMD ARGS…`),
//!   one server per session, and sessionless 2026-07-28 requests; the endpoint wired in
//!   `http/mod.rs`, its sessions in `http/sessions.rs`, the guard in `http/guard.rs`, POSTs in
//!   `http/post.rs`, streams and GETs in `http/sse.rs`, sessionless requests in
//!   `http/sessionless.rs`, one open session's routes and resumable streams in `http/live.rs`;
//! - [`pump`]: the relay both run between a client's lines, a session and a server;
//! - [`child`]: the server as a child process, started and reaped;
//! - [`upstream`]: where the server is, a command or a Streamable HTTP URL; the latter an
//!   adapter that looks to the pump exactly like a child.
//!
//! They are a room apart from the session because the session is the same whatever carries
//! the frames; the transports import the session, never the other way round.

pub(crate) mod child;
pub mod http;
#[cfg(unix)]
mod nonblocking;
pub(crate) mod pump;
pub mod stdio;
pub mod upstream;

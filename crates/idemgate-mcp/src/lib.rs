//! The idemgate MCP proxy: it sits between an agent and an MCP server, relays every frame as it
//! came, and makes each write tool run at most once per logical action (docs/MCP.md).
//!
//! - [`Session`]: one proxied session, independent of the transport: frames in, frames out;
//!   it also translates between a client and a server of different protocol eras (2025-11-25
//!   `initialize` and sessions; 2026-07-28 `server/discover` and per-request `_meta`), with the
//!   frame pieces of `era`;
//! - [`stdio`]: the stdio transport (`idemgate mcp -- CMD ARGS…`), the server a child process;
//! - [`http`]: the Streamable HTTP transport (`idemgate mcp --listen ADDR -- CMD ARGS…`), a
//!   child process (or an upstream HTTP session) per session;
//! - [`upstream`]: where the server is: a child command, or a Streamable HTTP URL
//!   (`--upstream-url`), the latter an adapter that looks to the session like a child;
//! - [`Config`]: the TOML configuration; per-tool policies in the gateway's vocabulary;
//! - the `_meta` names the proxy reads and writes are the `META_*` constants.
//!
//! Both transports feed the same [`Session`] from their own frames.

mod answer;
pub mod catalog;
pub mod config;
mod era;
mod error;
mod frame;
pub mod http;
mod mirror;
mod session;
pub mod stdio;
pub mod upstream;

pub use answer::{
    META_CONVERSATION, META_EXECUTED_AT, META_FENCE, META_KEY, META_PROBLEM, META_REPLAYED,
    META_RESOLVED_BY, META_RETRY_AFTER, META_RULE, META_SINCE, META_VERDICT,
};
pub use config::{Config, HttpConfig, KeySource};
pub use error::Error;
pub use session::{CarriedKey, Outgoing, Outputs, Session};
pub use upstream::{HttpUpstream, Upstream};

//! The idemgate MCP proxy: it sits between an agent and an MCP server, relays every frame as it
//! came, and makes each write tool run at most once per logical action (docs/MCP.md).
//!
//! It is laid out in rooms, each of which imports only the ones listed after it:
//!
//! - transports ([`stdio`], [`http`], [`upstream`], and the pump and child process they share):
//!   how frames reach the proxy from the client and the server from the proxy;
//! - [`Session`]: one proxied session, independent of the transport: frames in, frames out;
//! - the handshake: how a session learns the protocol eras of its two sides and translates
//!   between a client and a server of different eras (2025-11-25 `initialize` and sessions;
//!   2026-07-28 `server/discover` and per-request `_meta`);
//! - the gate: judging a `tools/call`, its answers (the `META_*` `_meta` names the proxy reads
//!   and writes), and the [`catalog`] of the server's tools;
//! - the peer: the link with the server, its outgoing frames ([`Outgoing`]) and the requests
//!   that wait for an answer;
//! - the wire: frames, eras, and the HTTP headers MCP names;
//! - [`Config`]: the TOML configuration; per-tool policies in the gateway's vocabulary;
//! - [`Error`], and the one lock helper every room uses.
//!
//! Both transports feed the same [`Session`] from their own frames.

pub mod config;
mod error;
mod gate;
mod handshake;
mod peer;
mod session;
mod sync;
mod transport;
mod wire;

pub use config::{Config, HttpConfig, KeySource, OAuthConfig};
pub use error::Error;
pub use gate::answer::{
    META_CALL_ID, META_CONVERSATION, META_EXECUTED_AT, META_FENCE, META_KEY, META_NAMED_BY,
    META_PROBLEM, META_REPLAYED, META_RESOLVED_BY, META_RETRY_AFTER, META_RULE, META_SINCE,
    META_VERDICT, STRUCTURED_NOTICE,
};
pub use gate::{catalog, CarriedKey};
pub use peer::Outgoing;
pub use session::{Outputs, Session};
pub use transport::upstream::{HttpUpstream, Upstream};
pub use transport::{http, stdio, upstream};

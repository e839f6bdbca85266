//! The wire: what MCP messages look like, apart from who sends them or how they travel.
//!
//! - [`frame`]: one JSON-RPC message, read only as deep as the proxy must look, and the small
//!   edits the proxy makes to one (its id, a param, a call's arguments);
//! - [`era`]: the two protocol eras (2025-11-25 `initialize` and sessions; 2026-07-28
//!   `server/discover` and the per-request envelope) and the pure pieces that translate a frame
//!   between them;
//! - [`headers`]: the names of the HTTP headers MCP defines, which both HTTP sides use;
//! - [`mirror`]: the 2026-07-28 headers that mirror a request's body, and the tool parameters
//!   that ask for one.
//!
//! It is a room of its own because every other one speaks it: the transports, the peer, the
//! gate and the handshake all read and write frames, and none of them owns the format. It
//! imports nothing else of the crate.

pub(crate) mod era;
pub(crate) mod frame;
pub(crate) mod headers;
pub(crate) mod mirror;

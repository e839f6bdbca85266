//! The gate: what makes each write tool run at most once per logical action. It judges one
//! `tools/call` (its key, its policy, the record the engine keeps), turns the engine's answer
//! into the MCP answer, and keeps the catalog of what the server said about its tools.
//!
//! - [`judge`]: judging one call, from its frame to its answer, through the engine;
//! - [`answer`]: the one place the engine's answers become MCP answers, and the `_meta` names
//!   the proxy writes;
//! - [`catalog`]: the tools as `tools/list` showed them, and the policy a tool gets;
//! - [`commerce`]: the commerce protocols' MCP bindings (where their keys live, their words);
//! - [`tools`]: what one session knows of the server's tools, and its listings of its own.
//!
//! It is a room of its own because judging is the proxy's purpose and the rest (eras,
//! transports, the link with the server) only carries frames to it and from it. It imports the
//! peer (to forward a call and list tools), the wire and the configuration, never the session
//! or the handshake.

pub(crate) mod answer;
pub mod catalog;
pub(crate) mod commerce;
pub(crate) mod judge;
pub(crate) mod tools;

use idemgate_core::IdempotencyKey;

/// A key a transport carried beside a frame (the `Idempotency-Key` header of Streamable HTTP),
/// or why the one it carried is not a key: it keys a `tools/call` before any key in the frame,
/// and an invalid one refuses the call with an answer the model reads.
pub type CarriedKey = Option<Result<IdempotencyKey, String>>;

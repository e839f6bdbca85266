//! The gate: what makes each write tool run at most once per logical action. It judges one
//! `tools/call` (its key, its policy, the record the engine keeps), turns the engine's answer
//! into the MCP answer, and keeps the catalog of what the server said about its tools.
//!
//! - [`catalog`]: the tools as `tools/list` showed them, and the policy a tool gets;
//! - [`answer`]: the one place the engine's answers become MCP answers, and the `_meta` names
//!   the proxy writes.
//!
//! It is a room of its own because judging is the proxy's purpose and the rest (eras,
//! transports, the link with the server) only carries frames to it and from it.

pub(crate) mod answer;
pub mod catalog;

use idemgate_core::IdempotencyKey;

/// A key a transport carried beside a frame (the `Idempotency-Key` header of Streamable HTTP),
/// or why the one it carried is not a key: it keys a `tools/call` before any key in the frame,
/// and an invalid one refuses the call with an answer the model reads.
pub type CarriedKey = Option<Result<IdempotencyKey, String>>;

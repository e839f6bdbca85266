//! The names of the HTTP headers of MCP's Streamable HTTP transport (and of idemgate's own
//! `Idempotency-Key`), lower-case as HTTP/2 writes them. They live with the wire, not with one
//! transport: the client-facing endpoint ([`crate::http`]) reads them, the upstream adapter
//! ([`crate::upstream`]) writes them, and the mirror of a modern request ([`super::mirror`])
//! writes and checks them.

/// The session header.
pub const SESSION_HEADER: &str = "mcp-session-id";
/// The protocol version header.
pub const VERSION_HEADER: &str = "mcp-protocol-version";
/// The method header of the modern era (MCP 2026-07-28, "Request Metadata").
pub const METHOD_HEADER: &str = "mcp-method";
/// The name header of the modern era: the tool's or prompt's name, or the resource's URI.
pub const NAME_HEADER: &str = "mcp-name";
/// The prefix of the headers that mirror a tool's parameters (MCP 2026-07-28, `x-mcp-header`).
pub(crate) const PARAM_PREFIX: &str = "mcp-param-";
/// The key a client may carry beside a `tools/call` (idemgate's own, as the gateway reads it).
pub(crate) const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// The last event a client that resumes a stream saw (SSE).
pub(crate) const LAST_EVENT_ID: &str = "last-event-id";

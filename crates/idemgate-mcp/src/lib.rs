#![doc = include_str!("../README.md")]

pub mod config;
mod error;
mod gate;
mod handshake;
pub mod lint;
mod peer;
mod session;
mod sync;
mod transport;
mod wire;

pub use config::{Config, HttpConfig, KeySource, OAuthConfig, Profile};
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

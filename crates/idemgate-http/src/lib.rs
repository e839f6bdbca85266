#![doc = include_str!("../README.md")]

mod answer;
mod auth;
pub mod config;
mod coordinate;
mod error;
mod forward;
mod gateway;
mod headers;
pub mod logging;
mod ops;
pub mod profile;
mod records;
mod request;
mod server;
mod verify;

pub use config::{Config, ServerConfig, TenantConfig, ToolConfig};
pub use error::Error;
pub use gateway::Gateway;
pub use idemgate_kit::tenants::{new_token, token_sha256};
pub use server::{bind, router, serve, shutdown_signal, Server};

/// The OpenAPI 3.1 document the gateway serves at `/openapi.json`.
pub const OPENAPI_JSON: &str = ops::OPENAPI;

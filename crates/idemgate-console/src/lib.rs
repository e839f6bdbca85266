#![doc = include_str!("../README.md")]

mod audit;
mod chart;
mod html;
mod pages;
mod session;
mod tally;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use idemgate::{AnyStore, Engine, TenantId};
use idemgate_kit::tenants::{Tenant, TenantConfig};
use serde::Deserialize;

pub use session::Role;
pub use tally::Tally;

/// How long a session lasts after sign-in (it is not extended by use).
pub const SESSION_LIFETIME: Duration = Duration::from_secs(8 * 60 * 60);

/// `[console]` in the gateway's configuration.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConsoleConfig {
    /// Lower-case hex SHA-256 of the operator's token (`idemgate token hash TOKEN`): who signs in
    /// with it sees and acts on every tenant's records. Without it only tenants sign in.
    pub operator_token_sha256: Option<String>,
    /// Mark the session cookie `Secure`: set it when the console is reached over HTTPS (a
    /// TLS-terminating proxy in front of the gateway), so the browser never sends it in clear.
    pub secure_cookie: bool,
    /// Serve no console at all.
    pub disabled: bool,
}

/// One console: cheap to clone, shared by every request.
#[derive(Clone)]
pub struct Console(Arc<Inner>);

struct Inner {
    engine: Arc<Engine<AnyStore>>,
    tenants: Vec<Arc<Tenant>>,
    operator: Vec<Arc<Tenant>>,
    audit_log: Option<PathBuf>,
    tally: Option<Arc<Tally>>,
    secure_cookie: bool,
    sessions: session::Sessions,
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console")
            .field("tenants", &self.0.tenants.len())
            .field("operator", &!self.0.operator.is_empty())
            .field("audit_log", &self.0.audit_log)
            .finish_non_exhaustive()
    }
}

/// What a console is built from.
pub struct Settings {
    /// The engine whose store it shows and whose resolve and reopen it calls (with the audit log
    /// observing it, so an operator's action is written there with who and why).
    pub engine: Arc<Engine<AnyStore>>,
    /// The tenants that may sign in with their own tokens.
    pub tenants: Vec<Arc<Tenant>>,
    /// Hex SHA-256 of the operator's token, if there is an operator.
    pub operator_token_sha256: Option<String>,
    /// The audit log the engine writes, read for timelines and charts.
    pub audit_log: Option<PathBuf>,
    /// The in-process count of refused calls, when this process serves calls.
    pub tally: Option<Arc<Tally>>,
    /// Mark the session cookie `Secure`.
    pub secure_cookie: bool,
}

impl Console {
    /// A console over `settings`.
    ///
    /// # Errors
    /// When the operator's token hash is not 64 hex digits.
    pub fn new(settings: Settings) -> Result<Self, String> {
        let operator = match settings.operator_token_sha256 {
            Some(hash) => {
                let c = TenantConfig {
                    id: TenantId::new("operator").map_err(|e| e.to_string())?,
                    token_sha256: hash,
                    rate_limit_per_second: None,
                    max_live_keys: None,
                };
                idemgate_kit::tenants::validate(std::slice::from_ref(&c))
                    .map_err(|(_, why)| format!("console.operator_token_sha256: {why}"))?;
                vec![Arc::new(Tenant::new(&c))]
            }
            None => Vec::new(),
        };
        Ok(Console(Arc::new(Inner {
            engine: settings.engine,
            tenants: settings.tenants,
            operator,
            audit_log: settings.audit_log,
            tally: settings.tally,
            secure_cookie: settings.secure_cookie,
            sessions: session::Sessions::default(),
        })))
    }

    /// Who a token names: the operator, a tenant, or nobody.
    pub fn sign_in(&self, token: &str) -> Option<Role> {
        let header = format!("Bearer {token}");
        if idemgate_kit::tenants::authenticate(&self.0.operator, Some(&header)).is_ok() {
            return Some(Role::Operator);
        }
        idemgate_kit::tenants::authenticate(&self.0.tenants, Some(&header))
            .ok()
            .map(|t| Role::Tenant(t.id.clone()))
    }
}

/// The console's routes, all under `/ui`, with their security headers; merge them into a
/// router of any state.
pub fn router<S: Clone + Send + Sync + 'static>(console: Console) -> Router<S> {
    pages::routes().with_state(console)
}

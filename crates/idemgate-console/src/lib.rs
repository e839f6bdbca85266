#![doc = include_str!("../README.md")]

mod audit;
mod chart;
mod html;
pub mod oidc;
pub mod operators;
mod pages;
mod session;
mod tally;
mod value;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use idemgate::{AnyStore, Engine};
use idemgate_kit::tenants::Tenant;
use serde::Deserialize;

pub use oidc::OidcConfig;
pub use operators::{OperatorConfig, DEFAULT_OPERATOR};
pub use session::Role;
pub use tally::Tally;

/// How long a session lasts after sign-in (it is not extended by use).
pub const SESSION_LIFETIME: Duration = Duration::from_secs(8 * 60 * 60);

/// `[console]` in the gateway's configuration.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConsoleConfig {
    /// Lower-case hex SHA-256 of the operator's token (`idemgate token hash TOKEN`): who signs in
    /// with it sees and acts on every tenant's records, as the operator named
    /// [`DEFAULT_OPERATOR`] (`operator`). One token for everyone; `operators` names each.
    pub operator_token_sha256: Option<String>,
    /// `[[console.operators]]`: operators by name, each with a token of its own; the audit log
    /// signs what each does `console:<name>`. Without these and `operator_token_sha256` only
    /// tenants sign in.
    pub operators: Vec<OperatorConfig>,
    /// `[console.oidc]`: operators sign in at an OpenID Connect provider, named by a claim of
    /// their ID token.
    pub oidc: Option<OidcConfig>,
    /// Mark the session cookie `Secure`: set it when the console is reached over HTTPS (a
    /// TLS-terminating proxy in front of the gateway), so the browser never sends it in clear.
    pub secure_cookie: bool,
    /// Serve no console at all.
    pub disabled: bool,
}

impl ConsoleConfig {
    /// Every operator who signs in with a token: those of `[[console.operators]]`, and the one
    /// of `operator_token_sha256`, named [`DEFAULT_OPERATOR`].
    pub fn token_operators(&self) -> Vec<OperatorConfig> {
        let mut all = self.operators.clone();
        if let Some(hash) = &self.operator_token_sha256 {
            all.push(OperatorConfig {
                name: DEFAULT_OPERATOR.to_owned(),
                token_sha256: hash.clone(),
            });
        }
        all
    }

    /// Checks what serde cannot, against the tenants' token hashes (an operator's token must not
    /// be a tenant's).
    ///
    /// # Errors
    /// The field at fault and what is wrong with it.
    pub fn validate(&self, tenant_hashes: &[&str]) -> Result<(), (String, String)> {
        operators::validate(&self.operators, tenant_hashes, "console.operators")?;
        if let Some(oidc) = &self.oidc {
            oidc.validate()?;
        }
        if let Some(h) = &self.operator_token_sha256 {
            let single = [OperatorConfig {
                name: DEFAULT_OPERATOR.to_owned(),
                token_sha256: h.clone(),
            }];
            operators::validate(&single, tenant_hashes, "console.operator_token_sha256")
                .map_err(|(_, why)| ("console.operator_token_sha256".to_owned(), why))?;
            if self.operators.iter().any(|o| o.name == DEFAULT_OPERATOR) {
                return Err((
                    "console.operators".to_owned(),
                    format!("an operator is named {DEFAULT_OPERATOR:?}, the name of console.operator_token_sha256's: rename it, or list the token there only"),
                ));
            }
            operators::validate(&self.token_operators(), tenant_hashes, "console.operators")?;
        }
        Ok(())
    }
}

/// One console: cheap to clone, shared by every request.
#[derive(Clone)]
pub struct Console(Arc<Inner>);

struct Inner {
    engine: Arc<Engine<AnyStore>>,
    tenants: Vec<Arc<Tenant>>,
    operators: operators::Operators,
    oidc: Option<oidc::Oidc>,
    audit_log: Option<PathBuf>,
    tally: Option<Arc<Tally>>,
    secure_cookie: bool,
    sessions: session::Sessions,
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console")
            .field("tenants", &self.0.tenants.len())
            .field("operators", &!self.0.operators.is_empty())
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
    /// The operators who sign in with tokens, each by name ([`ConsoleConfig::token_operators`]).
    pub operators: Vec<OperatorConfig>,
    /// The OpenID Connect provider operators may sign in at.
    pub oidc: Option<OidcConfig>,
    /// The audit log the engine writes, read for the charts.
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
    /// When an operator's name or token hash is not valid, or two operators share one.
    pub fn new(settings: Settings) -> Result<Self, String> {
        operators::validate(&settings.operators, &[], "console.operators")
            .map_err(|(field, why)| format!("{field}: {why}"))?;
        let operators = operators::Operators::new(&settings.operators);
        if let Some(c) = &settings.oidc {
            c.validate()
                .map_err(|(field, why)| format!("{field}: {why}"))?;
        }
        Ok(Console(Arc::new(Inner {
            engine: settings.engine,
            tenants: settings.tenants,
            operators,
            oidc: settings.oidc.map(oidc::Oidc::new),
            audit_log: settings.audit_log,
            tally: settings.tally,
            secure_cookie: settings.secure_cookie,
            sessions: session::Sessions::default(),
        })))
    }

    /// Who a token names: an operator (by name), a tenant, or nobody.
    pub fn sign_in(&self, token: &str) -> Option<Role> {
        if token.is_empty() {
            return None;
        }
        if let Some(name) = self.0.operators.named_by(token) {
            return Some(Role::Operator(name));
        }
        let header = format!("Bearer {token}");
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

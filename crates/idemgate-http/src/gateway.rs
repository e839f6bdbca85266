//! The gateway's shared state: engine, tenants, upstream client, metrics, audit log.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use idemgate::{
    AnyStore, Engine, FileJournal, Journal, MemoryJournal, Policies, Store as _, ToolName,
};

use crate::audit::Audit;
use crate::auth::Tenant;
use crate::config::Config;
use crate::error::Error;
use crate::metrics::Metrics;
use crate::verify::HttpVerifier;

/// One gateway: cheap to clone, shared by every request.
#[derive(Clone, Debug)]
pub struct Gateway(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    config: Config,
    engine: Engine<AnyStore>,
    tenants: Vec<Arc<Tenant>>,
    client: reqwest::Client,
    metrics: Metrics,
    audit: Audit,
}

impl Gateway {
    /// Opens the configured store, journal and audit log.
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid configuration (or one without a store), [`Error::Store`]
    /// when the store cannot be opened, [`Error::File`] when the journal or audit log cannot.
    pub async fn open(config: Config) -> Result<Self, Error> {
        config.validate()?;
        let url = config.server.store.clone().ok_or_else(|| Error::Config {
            origin: "configuration".to_owned(),
            message: "server.store: a store URL is required (sqlite://PATH, postgres://…, redis://…, memory:)".to_owned(),
        })?;
        let store = AnyStore::connect(&url).await.map_err(Error::Store)?;
        let journal: Arc<dyn Journal> = match journal_dir(&config, &store)? {
            Some(dir) => Arc::new(FileJournal::open(&dir).map_err(|source| Error::File {
                what: "journal",
                path: dir.display().to_string(),
                source,
            })?),
            None => Arc::new(MemoryJournal::new()),
        };
        Self::with_store(config, store, journal)
    }

    /// A gateway over an already opened store and journal.
    ///
    /// # Errors
    /// As [`Gateway::open`], without the store.
    pub fn with_store(
        config: Config,
        store: AnyStore,
        journal: Arc<dyn Journal>,
    ) -> Result<Self, Error> {
        config.validate()?;
        let mut policies = Policies::new();
        for name in config.tools.keys() {
            policies = policies.with_tool(name.clone(), config.policy(name));
        }
        let audit =
            Audit::open(config.server.audit_log.as_deref()).map_err(|source| Error::File {
                what: "audit log",
                path: config
                    .server
                    .audit_log
                    .as_deref()
                    .unwrap_or_else(|| std::path::Path::new(""))
                    .display()
                    .to_string(),
                source,
            })?;
        let client = reqwest::Client::builder()
            // Upstreams are configured addresses; a proxy from the environment must not reroute
            // side effects, and a redirect would turn a POST into something else.
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(5))
            // Besides the system's roots, which stay trusted.
            .tls_certs_merge(config.server.upstream_roots()?)
            .build()
            .map_err(Error::Client)?;
        let mut engine = Engine::new(store)
            .with_policies(policies)
            .with_journal(journal);
        // The probe gets half the request's time; the call may still have to run after it.
        let probe_timeout = config.server.request_timeout / 2;
        for (name, tool) in &config.tools {
            if let Some(url) = &tool.verify_url {
                let verifier = HttpVerifier::new(
                    client.clone(),
                    url.clone(),
                    tool.upstream.is_some(),
                    probe_timeout,
                );
                engine = engine.with_verifier(name.clone(), Arc::new(verifier));
            }
        }
        let tenants = config
            .tenants
            .iter()
            .map(|t| Arc::new(Tenant::new(t)))
            .collect();
        Ok(Gateway(Arc::new(Inner {
            config,
            engine,
            tenants,
            client,
            metrics: Metrics::default(),
            audit,
        })))
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &Config {
        &self.0.config
    }

    /// The engine.
    pub fn engine(&self) -> &Engine<AnyStore> {
        &self.0.engine
    }

    /// Writes journaled outcomes into the store; logs what it did.
    pub async fn flush_journal(&self) {
        match self.0.engine.flush_journal().await {
            Ok(r) if r.applied + r.superseded + r.pending > 0 => tracing::info!(
                applied = r.applied,
                superseded = r.superseded,
                pending = r.pending,
                "flushed the journal"
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "failed to flush the journal"),
        }
    }

    /// Whether the store answers a lookup.
    pub async fn ready(&self) -> bool {
        let probe = idemgate::Key::new(
            idemgate::TenantId::new("idemgate").expect("a valid tenant id"),
            ToolName::new("readyz").expect("a valid tool name"),
            idemgate::IdempotencyKey::new("probe").expect("a valid key"),
        );
        self.0.engine.store().get(&probe).await.is_ok()
    }

    pub(crate) fn tenants(&self) -> &[Arc<Tenant>] {
        &self.0.tenants
    }

    pub(crate) fn client(&self) -> &reqwest::Client {
        &self.0.client
    }

    pub(crate) fn metrics(&self) -> &Metrics {
        &self.0.metrics
    }

    pub(crate) fn audit(&self) -> &Audit {
        &self.0.audit
    }

    /// The upstream of a forwarded tool.
    pub(crate) fn upstream(&self, tool: &str) -> Option<&str> {
        self.0.config.tools.get(tool)?.upstream.as_deref()
    }
}

/// The journal directory: configured, else beside the SQLite file; none (in memory) for the
/// memory store, whose records die with the process anyway.
fn journal_dir(config: &Config, store: &AnyStore) -> Result<Option<PathBuf>, Error> {
    if let Some(dir) = &config.server.journal {
        return Ok(Some(dir.clone()));
    }
    match store {
        AnyStore::Memory(_) => Ok(None),
        AnyStore::Sqlite(s) => {
            let mut dir = s.path().as_os_str().to_owned();
            dir.push(".journal");
            Ok(Some(PathBuf::from(dir)))
        }
        _ => Err(Error::Config {
            origin: "configuration".to_owned(),
            message: "server.journal: required for a server store (a local directory for outcomes the store has not confirmed)".to_owned(),
        }),
    }
}

//! The gateway's shared state: engine (with the kit's metrics, audit log and logs observing it),
//! tenants, upstream client.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use idemgate::{
    AnyStore, Engine, FileJournal, Journal, JournalFlusher, MemoryJournal, Policies, Settings,
    Store as _,
};
use idemgate_console::{Console, Tally};
use idemgate_kit::tenants::Tenant;
use idemgate_kit::{Instruments, Metrics};

use crate::config::Config;
use crate::error::Error;
use crate::verify::HttpVerifier;

/// How often journaled outcomes are written into the store while the gateway runs.
const FLUSH_EVERY: Duration = Duration::from_secs(5);

/// One gateway: cheap to clone, shared by every request.
#[derive(Clone, Debug)]
pub struct Gateway(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    config: Config,
    engine: Arc<Engine<AnyStore>>,
    tenants: Vec<Arc<Tenant>>,
    client: reqwest::Client,
    instruments: Instruments,
    console: Option<Console>,
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
        // Tools not listed take the door's mode too (`[server] mode`).
        let mut policies = Policies::new().with_default(config.default_policy());
        for name in config.tools.keys() {
            policies = policies.with_tool(name.clone(), config.policy(name));
        }
        let instruments =
            Instruments::open(config.server.audit_log.as_deref(), config.tools.keys()).map_err(
                |source| Error::File {
                    what: "audit log",
                    path: config
                        .server
                        .audit_log
                        .as_deref()
                        .unwrap_or_else(|| std::path::Path::new(""))
                        .display()
                        .to_string(),
                    source,
                },
            )?;
        let client = idemgate_kit::tls::client_builder()
            // Upstreams are configured addresses; a proxy from the environment must not reroute
            // side effects, and a redirect would turn a POST into something else.
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(5))
            // Besides the system's roots, which stay trusted.
            .tls_certs_merge(config.server.upstream_roots()?)
            .build()
            .map_err(Error::Client)?;
        // A call that first finds a record unknown watches it for the settle window before it
        // answers: within a quarter of the request's time, so that the answer (and a verifier's
        // probe after it, half the time) still comes before the request times out.
        let settings = Settings {
            unknown_settle: Settings::default()
                .unknown_settle
                .min(config.server.request_timeout / 4),
            ..Settings::default()
        };
        let mut engine = instruments.attach(
            Engine::new(store)
                .with_policies(policies)
                .with_journal(journal)
                .with_settings(settings),
        );
        // The probe gets half the request's time; the call may still have to run after it.
        let probe_timeout = config.server.request_timeout / 2;
        for (name, tool) in &config.tools {
            if let Some(url) = &tool.verify_url {
                let verifier = HttpVerifier::new(client.clone(), url.clone(), probe_timeout);
                engine = engine.with_verifier(name.clone(), Arc::new(verifier));
            }
        }
        let tenants: Vec<Arc<Tenant>> = config
            .tenants
            .iter()
            .map(|t| Arc::new(Tenant::new(t)))
            .collect();
        // The console counts refused calls itself: they leave no line in the audit log.
        let tally = Arc::new(Tally::default());
        let engine = Arc::new(engine.with_observer(tally.clone()));
        let console = if config.console.disabled {
            None
        } else {
            let settings = idemgate_console::Settings {
                engine: engine.clone(),
                tenants: tenants.clone(),
                operators: config.console.token_operators(),
                oidc: config.console.oidc.clone(),
                audit_log: config.server.audit_log.clone(),
                tally: Some(tally),
                secure_cookie: config.console.secure_cookie,
            };
            Some(Console::new(settings).map_err(|message| Error::Config {
                origin: "configuration".to_owned(),
                message,
            })?)
        };
        Ok(Gateway(Arc::new(Inner {
            config,
            engine,
            tenants,
            client,
            instruments,
            console,
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

    /// Writes journaled outcomes into the store (the engine's observers log what it did).
    pub async fn flush_journal(&self) {
        let _ = self.0.engine.flush_journal().await;
    }

    /// Starts flushing the journal now and every few seconds, until the handle is dropped.
    pub fn start_journal_flusher(&self) -> JournalFlusher {
        self.0.engine.spawn_journal_flusher(FLUSH_EVERY)
    }

    /// Whether the store takes a write now ([`idemgate::Store::probe_write`]): a store that
    /// answers lookups may still refuse every reservation (read-only files, a full disk).
    pub async fn ready(&self) -> bool {
        self.0.engine.store().probe_write().await.is_ok()
    }

    /// The web console it serves at `/ui`, unless the configuration turned it off.
    pub fn console(&self) -> Option<&Console> {
        self.0.console.as_ref()
    }

    pub(crate) fn tenants(&self) -> &[Arc<Tenant>] {
        &self.0.tenants
    }

    pub(crate) fn client(&self) -> &reqwest::Client {
        &self.0.client
    }

    /// Tells the engine's observers that a call was refused at the tenant's quota of keys in
    /// flight (after its reservation was given back).
    pub(crate) fn quota_exceeded(&self, key: &idemgate::Key) {
        self.0.engine.observe(&idemgate::Event::Call {
            tenant: &key.tenant,
            tool: &key.tool,
            key: Some(key),
            verdict: idemgate::Verdict::QuotaExceeded,
            fence: None,
            answer: None,
            error: None,
        });
    }

    pub(crate) fn metrics(&self) -> &Metrics {
        &self.0.instruments.metrics
    }

    /// The upstream of a forwarded tool.
    pub(crate) fn upstream(&self, tool: &str) -> Option<&str> {
        self.0.config.tools.get(tool)?.upstream.as_deref()
    }

    /// The idempotency contract a forwarded tool answers by.
    pub(crate) fn profile(&self, tool: &str) -> crate::profile::Profile {
        self.0
            .config
            .tools
            .get(tool)
            .and_then(|t| t.profile)
            .unwrap_or_default()
    }
}

/// The journal directory: configured, else beside the SQLite file; none (in memory) for the
/// memory store, whose records die with the process anyway.
fn journal_dir(config: &Config, store: &AnyStore) -> Result<Option<PathBuf>, Error> {
    if let Some(dir) = &config.server.journal {
        return Ok(Some(dir.clone()));
    }
    match store.unsealed() {
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

//! The proxy's sessions: [`Proxy`] itself (what the transport serves with, its table of sessions
//! and of the children sessionless requests share at its heart), starting a session (its server
//! and the tasks that relay its frames), finding the one a request names, ending idle ones, and
//! `DELETE /mcp`. The handlers (post.rs, sse.rs, sessionless.rs) import `Proxy` from here, and
//! mod.rs wires them to the endpoint: so the imports run one way, from mod.rs down.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use idemgate_core::{Engine, Store, TenantId};
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinSet;

use super::guard::Guard;
use super::live::{Live, Routes};
use super::reply::{refuse, Refused};
use crate::config::Config;
use crate::gate::CarriedKey;
use crate::session::{Outputs, Session};
use crate::sync::lock;
use crate::transport::pump;
use crate::transport::upstream::{Started, Upstream};
use crate::wire::headers::{SESSION_HEADER, VERSION_HEADER};

/// Protocol versions with Streamable HTTP a client may name besides the one its session agreed.
const KNOWN_VERSIONS: &[&str] = &["2025-03-26", "2025-06-18", "2025-11-25"];

/// Everything the transport serves with: the engine, the configuration, the server's command,
/// and the sessions open.
pub struct Proxy<S> {
    pub(super) engine: Arc<Engine<S>>,
    pub(super) config: Config,
    pub(super) server: String,
    pub(super) upstream: Upstream,
    /// Who may call (guard.rs).
    pub(super) guard: Guard,
    pub(super) sessions: Mutex<HashMap<String, Arc<Live>>>,
    /// The child each tenant's sessionless requests share.
    pub(super) shared: Mutex<HashMap<TenantId, Arc<Live>>>,
    /// The number of the next sessionless request (its id on the way to the shared child).
    pub(super) next_request: AtomicU64,
    pub(super) tasks: Mutex<JoinSet<()>>,
    pub(super) stopping: AtomicBool,
}

impl<S: Store> Proxy<S> {
    /// A proxy that starts `command` for every session. Without `config.tenants` every session
    /// is `tenant`'s; with them, the bearer token names the tenant.
    pub fn new(
        engine: Arc<Engine<S>>,
        config: Config,
        tenant: TenantId,
        command: Vec<String>,
    ) -> Arc<Self> {
        Self::with_upstream(engine, config, tenant, Upstream::Command(command))
    }

    /// A proxy in front of `upstream`: a command started per session, or a server at a
    /// Streamable HTTP URL, with one upstream session per session of the proxy.
    pub fn with_upstream(
        engine: Arc<Engine<S>>,
        config: Config,
        tenant: TenantId,
        upstream: Upstream,
    ) -> Arc<Self> {
        let server = upstream.name(&config);
        let guard = Guard::new(&config, tenant);
        Arc::new(Proxy {
            engine,
            config,
            server,
            upstream,
            guard,
            sessions: Mutex::new(HashMap::new()),
            shared: Mutex::new(HashMap::new()),
            next_request: AtomicU64::new(1),
            tasks: Mutex::new(JoinSet::new()),
            stopping: AtomicBool::new(false),
        })
    }

    /// Sessions open now, the shared children of sessionless requests included.
    pub fn sessions(&self) -> usize {
        lock(&self.sessions).len() + lock(&self.shared).len()
    }

    /// Every session open now, the shared ones included.
    fn every_session(&self) -> Vec<Arc<Live>> {
        let mut all: Vec<_> = lock(&self.sessions).values().cloned().collect();
        all.extend(lock(&self.shared).values().cloned());
        all
    }

    /// Ends every session (their calls in flight run to their end) and opens no more.
    pub(super) fn stop_all(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        for live in self.every_session() {
            live.stop.notify_one();
        }
    }

    pub(super) async fn reap_idle(&self) {
        let idle = self.config.http.idle_timeout;
        let every = (idle / 4).clamp(Duration::from_millis(100), Duration::from_secs(60));
        loop {
            tokio::time::sleep(every).await;
            for live in self.every_session() {
                if live.idle(idle) {
                    tracing::info!(session = %live.id, "ended an idle session");
                    if live.shared {
                        // The next sessionless request starts a new child rather than reach
                        // one that is ending.
                        self.forget(&live);
                    }
                    live.stop.notify_one();
                }
            }
        }
    }

    /// Takes `live` out of the sessions (or the shared children) when it is still there: a
    /// session of the same id, or a newer shared child of its tenant, stays.
    fn forget(&self, live: &Arc<Live>) {
        fn remove<K: Eq + std::hash::Hash>(
            map: &mut HashMap<K, Arc<Live>>,
            key: &K,
            live: &Arc<Live>,
        ) {
            if map.get(key).is_some_and(|l| Arc::ptr_eq(l, live)) {
                map.remove(key);
            }
        }
        if live.shared {
            remove(&mut lock(&self.shared), &live.tenant, live);
        } else {
            remove(&mut lock(&self.sessions), &live.id, live);
        }
    }

    /// The child `tenant`'s sessionless requests share, started if there is none.
    pub(super) fn shared(self: &Arc<Self>, tenant: TenantId) -> Result<Arc<Live>, Refused> {
        // Held while starting one, so that racing first requests start one child.
        let mut shared = lock(&self.shared);
        if let Some(live) = shared.get(&tenant).filter(|l| !lock(&l.routes).closed) {
            live.touch();
            return Ok(Arc::clone(live));
        }
        let live = self.start(
            tenant.clone(),
            true,
            lock(&self.sessions).len() + shared.len(),
        )?;
        shared.insert(tenant, Arc::clone(&live));
        Ok(live)
    }

    /// Starts a session for `tenant`: its server process, and the tasks that relay its frames.
    pub(super) fn open(self: &Arc<Self>, tenant: TenantId) -> Result<Arc<Live>, Refused> {
        let live = self.start(tenant, false, self.sessions())?;
        lock(&self.sessions).insert(live.id.clone(), Arc::clone(&live));
        Ok(live)
    }

    /// Starts a session (`shared` by sessionless requests, or not) for `tenant` when `open`
    /// sessions leave room: its server process, and the tasks that relay its frames.
    fn start(
        self: &Arc<Self>,
        tenant: TenantId,
        shared: bool,
        open: usize,
    ) -> Result<Arc<Live>, Refused> {
        if self.stopping.load(Ordering::SeqCst) {
            return Err(refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                "the proxy is shutting down",
            ));
        }
        if open >= self.config.http.max_sessions {
            return Err(refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                "too many sessions are open (http.max_sessions); end one with DELETE or retry later",
            ));
        }
        let started = self.upstream.start().map_err(|e| {
            tracing::error!(error = %e, "failed to start the server for a session");
            refuse(StatusCode::BAD_GATEWAY, &e.to_string())
        })?;
        let (session, outputs) = (if shared {
            Session::shared
        } else {
            Session::new
        })(
            Arc::clone(&self.engine),
            self.config.clone(),
            self.server.clone(),
            tenant.clone(),
        );
        let (to_session, client_lines) = mpsc::unbounded_channel();
        let live = Arc::new(Live {
            id: session_id(),
            tenant,
            shared,
            to_session,
            params: session.param_headers(),
            routes: Mutex::new(Routes::default()),
            tag: session_tag(),
            stop: Notify::new(),
            last_used: Mutex::new(Instant::now()),
        });
        self.run_session(Arc::clone(&live), session, outputs, client_lines, started);
        Ok(live)
    }

    /// Runs a started session as one of the proxy's tasks: its frames for the client go to
    /// their routes, the pump relays the rest, and once it ends the session is forgotten and its
    /// server ended.
    fn run_session(
        self: &Arc<Self>,
        live: Arc<Live>,
        session: Session<S>,
        outputs: Outputs,
        client_lines: mpsc::UnboundedReceiver<(String, CarriedKey)>,
        started: Started,
    ) {
        let Outputs {
            mut to_client,
            to_server,
        } = outputs;
        let router = {
            let live = Arc::clone(&live);
            tokio::spawn(async move {
                while let Some(frame) = to_client.recv().await {
                    live.route(frame);
                }
            })
        };
        let proxy = Arc::clone(self);
        let task_live = Arc::clone(&live);
        lock(&self.tasks).spawn(async move {
            let live = task_live;
            let ended = pump::relay(
                session,
                to_server,
                client_lines,
                started.lines,
                started.input,
                live.stop.notified(),
            )
            .await;
            let _ = router.await;
            live.close();
            proxy.forget(&live);
            let status = started.end.wait().await;
            tracing::info!(session = %live.id, ?ended, ?status, "session ended");
        });
    }

    /// The session a request names, if it is the caller's.
    pub(super) fn session(
        &self,
        headers: &HeaderMap,
        tenant: &TenantId,
    ) -> Result<Arc<Live>, Refused> {
        let Some(id) = headers.get(SESSION_HEADER) else {
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                "the Mcp-Session-Id header is required (send initialize first)",
            ));
        };
        let live = id
            .to_str()
            .ok()
            .and_then(|id| lock(&self.sessions).get(id).cloned())
            // Another tenant's session is as unknown as one that never was.
            .filter(|l| l.tenant == *tenant)
            .ok_or_else(|| {
                refuse(
                    StatusCode::NOT_FOUND,
                    "no such session (it ended, or never was): initialize a new one",
                )
            })?;
        if let Some(v) = headers.get(VERSION_HEADER) {
            let v = v.to_str().unwrap_or_default();
            let agreed = lock(&live.routes).version.clone();
            if !(KNOWN_VERSIONS.contains(&v) || agreed.as_deref() == Some(v)) {
                return Err(refuse(
                    StatusCode::BAD_REQUEST,
                    &format!("unsupported MCP-Protocol-Version {v:?}"),
                ));
            }
        }
        live.touch();
        Ok(live)
    }
}

/// `DELETE /mcp`: the client ends its session. Its calls in flight run to their end.
pub(super) async fn end_session<S: Store>(
    State(proxy): State<Arc<Proxy<S>>>,
    headers: HeaderMap,
) -> Response {
    let tenant = match proxy.guard.admit(&headers).await {
        Ok(t) => t,
        Err(res) => return *res,
    };
    let live = match proxy.session(&headers, &tenant) {
        Ok(l) => l,
        Err(res) => return *res,
    };
    lock(&proxy.sessions).remove(&live.id);
    live.stop.notify_one();
    StatusCode::NO_CONTENT.into_response()
}

/// A fresh session id: 128 random bits in hex.
fn session_id() -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("failed to read randomness from the operating system");
    idemgate_core::key::hex(&bytes)
}

/// A session's event id tag: 64 random bits in hex.
fn session_tag() -> String {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).expect("failed to read randomness from the operating system");
    idemgate_core::key::hex(&bytes)
}

//! `NativeEngine`: the handle JavaScript holds on one engine over one store; its opening, the two
//! halves of a call and the operator's view of records. Each method that touches the store is
//! an `async fn` (a promise on Node's side) resolving to a reply's JSON text (see `reply`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idemgate::{
    Answer, AnyStore, Begun, Call, Effect, FileJournal, IdempotencyKey, JournalFlusher, TenantId,
    ToolKind, ToolName, ToolPolicy, UnknownPolicy,
};
use idemgate_kit::reported_effect as effect;
use napi::{Error, Result};
use napi_derive::napi;
use serde_json::{json, Value};
use tokio::sync::oneshot;

use crate::reply;

/// How often the journal of unconfirmed outcomes is flushed into the store.
const FLUSH_EVERY: Duration = Duration::from_secs(5);

/// What a running call's function reports, awaited by the task holding its lease, and the
/// answer that task sends back once the outcome is recorded.
struct Running {
    report: oneshot::Sender<Effect>,
    answer: oneshot::Receiver<Answer>,
}

/// What the engine's calls share.
struct Shared {
    engine: Arc<idemgate::Engine<AnyStore>>,
    tenant: TenantId,
    /// The calls whose function runs now, by ticket id.
    running: Mutex<HashMap<u32, Running>>,
    next_ticket: AtomicU64,
    closed: AtomicBool,
    flusher: Mutex<Option<JournalFlusher>>,
}

/// The engine over one store (see `openEngine`).
#[napi]
pub struct NativeEngine {
    shared: Arc<Shared>,
    url: String,
    journal: Option<String>,
}

/// How one tool's calls are treated (`idemgate_core::ToolPolicy`), durations in seconds; a field
/// left out keeps the engine's default.
#[napi(object)]
#[derive(Default)]
pub struct PolicyInit {
    /// `write` (the default), `read` or `natural_idempotent`.
    pub kind: Option<String>,
    /// How long a completed outcome is kept and replayed.
    pub ttl: Option<f64>,
    /// How long a reservation holds without a heartbeat.
    pub lease: Option<f64>,
    /// How long a duplicate waits for an in-flight call before `InFlight`.
    pub wait: Option<f64>,
    /// When set, calls without a key are joined by (tool, arguments, scope) for this long.
    pub fallback_window: Option<f64>,
    /// `block` (the default), `verify` or `retry`.
    pub on_unknown: Option<String>,
}

/// A call as the package describes it to `begin` and `keyFor`.
#[napi(object)]
pub struct CallInit {
    /// The tool's name.
    pub tool: String,
    /// The idempotency key (none: the fallback window names the record, if the policy has one).
    pub key: Option<String>,
    /// The call's arguments as JSON text, fingerprinted.
    pub args_json: Option<String>,
    /// How the tool's calls are treated.
    pub policy: PolicyInit,
    /// Where the call was made (a conversation): the fallback window joins only its calls.
    pub scope: Option<String>,
}

/// A duration given in seconds; `what` names it in the error.
fn seconds(what: &str, s: f64) -> Result<Duration> {
    Duration::try_from_secs_f64(s)
        .map_err(|e| Error::from_reason(format!("{what} must be a number of seconds >= 0: {e}")))
}

impl PolicyInit {
    /// The engine's policy: its defaults, overridden by every field that is set.
    fn policy(&self) -> Result<ToolPolicy> {
        let mut p = ToolPolicy::default();
        if let Some(kind) = &self.kind {
            p.kind = kind.parse::<ToolKind>().map_err(Error::from_reason)?;
        }
        if let Some(s) = self.ttl {
            p.ttl = seconds("ttl", s)?;
        }
        if let Some(s) = self.lease {
            p.lease = seconds("lease", s)?;
        }
        if let Some(s) = self.wait {
            p.wait = seconds("wait", s)?;
        }
        if let Some(s) = self.fallback_window {
            p.fallback_window = Some(seconds("fallback_window", s)?);
        }
        if let Some(u) = &self.on_unknown {
            p.on_unknown = u.parse::<UnknownPolicy>().map_err(Error::from_reason)?;
        }
        Ok(p)
    }
}

/// Opens the store at `url` (`sqlite:///path`, `postgres://…`, `redis://…`, `memory:`; none: the
/// SQLite file every `idemgate` command uses) with a durable journal beside it (`journal`, else
/// where the command line keeps it), for `tenant`. Rejects with an error whose message is a
/// reply's JSON: `misconfigured` (the URL or the store set up wrong) or `store_unavailable`.
#[napi]
pub async fn open_engine(
    url: Option<String>,
    journal: Option<String>,
    tenant: String,
) -> Result<NativeEngine> {
    let refused = |reply: Value| Error::from_reason(reply.to_string());
    let bad = |message: String| refused(json!({ "error": "misconfigured", "message": message }));
    let tenant = TenantId::new(&tenant).map_err(|e| bad(e.to_string()))?;
    let journal_dir = journal.map(std::path::PathBuf::from);
    let (url, journal_dir) = idemgate::store_and_journal(url.as_deref(), journal_dir.as_deref())
        .map_err(|e| bad(e.to_string()))?;
    let store = AnyStore::connect(&url)
        .await
        .map_err(|e| refused(reply::open_error(&url, &e)))?;
    let mut engine = idemgate::Engine::new(store);
    let mut journal = None;
    if engine.store().is_durable() {
        let file = FileJournal::open(&journal_dir).map_err(|e| {
            bad(format!(
                "failed to open journal {}: {e}",
                journal_dir.display()
            ))
        })?;
        engine = engine.with_journal(Arc::new(file));
        journal = Some(journal_dir.display().to_string());
    }
    let engine = Arc::new(engine);
    let flusher = engine.spawn_journal_flusher(FLUSH_EVERY);
    Ok(NativeEngine {
        shared: Arc::new(Shared {
            engine,
            tenant,
            running: Mutex::new(HashMap::new()),
            next_ticket: AtomicU64::new(1),
            closed: AtomicBool::new(false),
            flusher: Mutex::new(Some(flusher)),
        }),
        url,
        journal,
    })
}

impl Shared {
    fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::from_reason("this engine is closed"));
        }
        Ok(())
    }

    /// The engine's call and its policy; a call the engine refuses is the error reply.
    fn call(&self, init: CallInit) -> Result<std::result::Result<(Call, ToolPolicy), Value>> {
        let policy = init.policy.policy()?;
        let call = || -> std::result::Result<Call, idemgate::EngineError> {
            let mut call = Call::new(self.tenant.clone(), ToolName::new(&init.tool)?);
            if let Some(key) = &init.key {
                call = call.key(IdempotencyKey::explicit(key)?);
            }
            if let Some(args) = &init.args_json {
                call = call.args_text(args.as_bytes())?;
            }
            if let Some(scope) = init.scope {
                call = call.scope(scope);
            }
            Ok(call)
        };
        Ok(call()
            .map(|call| (call, policy))
            .map_err(|e| reply::engine_error(&e)))
    }

    /// Holds the lease of a call allowed to run until its function reports (`finish`), records
    /// that, and hands the answer over; the ticket id `finish` names it by.
    fn run(self: &Arc<Self>, ticket: idemgate::Ticket) -> u32 {
        let (report, reported) = oneshot::channel::<Effect>();
        let (answered, answer) = oneshot::channel::<Answer>();
        let engine = Arc::clone(&self.engine);
        napi::bindgen_prelude::spawn(async move {
            let reported = engine
                .with_heartbeat(&ticket, async {
                    // A ticket dropped unfinished (the engine closed under it): the function may
                    // have run, so its outcome is unknown, never released.
                    reported.await.unwrap_or_else(|_| {
                        Effect::Ambiguous("the call was abandoned before it reported".into())
                    })
                })
                .await;
            let _ = answered.send(engine.finish(&ticket, reported).await);
        });
        // Ticket ids wrap past u32 (JavaScript numbers); a ticket lives for one call only.
        let id = self.next_ticket.fetch_add(1, Ordering::Relaxed) as u32;
        if let Ok(mut running) = self.running.lock() {
            running.insert(id, Running { report, answer });
        }
        id
    }
}

#[napi]
impl NativeEngine {
    /// The store's URL.
    #[napi(getter)]
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// The journal directory (none for the memory store).
    #[napi(getter)]
    pub fn journal(&self) -> Option<String> {
        self.journal.clone()
    }

    /// The tenant whose records these are.
    #[napi(getter)]
    pub fn tenant(&self) -> String {
        self.shared.tenant.as_str().to_owned()
    }

    /// Decides whether a call may run now, waiting up to the policy's `wait` for a racing call:
    /// `{"execute": id, "key", "rule", "fence", "digest"}` (run the function, then `finish(id,
    /// …)`), `{"pass_through": true}` (a read: run it, nothing is recorded), an answer (a replay)
    /// or an error (in flight, unknown, key reused, refused...).
    #[napi]
    pub async fn begin(&self, call: CallInit) -> Result<String> {
        self.shared.check_open()?;
        let (call, policy) = match self.shared.call(call)? {
            Ok(call) => call,
            Err(refused) => return Ok(refused.to_string()),
        };
        let out = match self.shared.engine.begin(call, &policy).await {
            Err(e) => reply::engine_error(&e),
            Ok(Begun::PassThrough) => json!({ "pass_through": true }),
            Ok(Begun::Answered(answer)) => reply::answer(&answer),
            Ok(Begun::Execute(ticket)) => {
                let facts = json!({
                    "key": ticket.key.key.as_str(),
                    "rule": ticket.rule.to_string(),
                    "fence": ticket.lease.fence,
                    "digest": idemgate::key::hex(&ticket.key.digest()),
                });
                let id = self.shared.run(ticket);
                let mut facts = facts;
                facts["execute"] = id.into();
                facts
            }
        };
        Ok(out.to_string())
    }

    /// Records what the function of ticket `id` reported (`success`/`failed` with its JSON
    /// text, `not_applied`/`ambiguous` with a message) and answers. A body the engine cannot
    /// read as JSON makes the record unknown at once (the function ran) and answers the error
    /// `not_json`.
    #[napi]
    pub async fn finish(&self, id: u32, kind: String, body: String) -> Result<String> {
        let running = self
            .shared
            .running
            .lock()
            .ok()
            .and_then(|mut r| r.remove(&id));
        let Some(Running { report, answer }) = running else {
            return Err(Error::from_reason(
                "this ticket was already finished: report each call's outcome once",
            ));
        };
        let (reported, not_json) = match effect(&kind, &body) {
            Ok(e) => (e, None),
            Err(why) if kind == "success" || kind == "failed" => (
                Effect::Ambiguous(format!("the function's {kind} value is not JSON: {why}")),
                Some(why),
            ),
            Err(why) => return Err(Error::from_reason(why)),
        };
        let _ = report.send(reported);
        let answer = answer.await.map_err(|_| {
            Error::from_reason("the engine stopped before the outcome was recorded")
        })?;
        if let Some(why) = not_json {
            return Ok(json!({ "error": "not_json", "message": why }).to_string());
        }
        Ok(reply::answer(&answer).to_string())
    }

    /// The record a call is judged by, as `Engine::key_for` names it: `{tenant, tool, key, rule,
    /// ttl, digest}`, `null` for reads and naturally idempotent tools, or an error.
    #[napi]
    pub fn key_for(&self, call: CallInit) -> Result<String> {
        let named = self.shared.call(call)?.and_then(|(call, policy)| {
            self.shared
                .engine
                .key_for(&call, &policy)
                .map_err(|e| reply::engine_error(&e))
        });
        let out = match named {
            Err(refused) => refused,
            Ok(None) => Value::Null,
            Ok(Some(named)) => json!({
                "tenant": named.key.tenant.as_str(),
                "tool": named.key.tool.as_str(),
                "key": named.key.key.as_str(),
                "rule": named.rule.to_string(),
                "ttl": named.ttl.as_secs_f64(),
                "digest": idemgate::key::hex(&named.key.digest()),
            }),
        };
        Ok(out.to_string())
    }

    /// The state of the record of `(tool, key)`: `{state, fence}` (`in_flight`, `completed`,
    /// `unknown`), `null` when there is none, or an error.
    #[napi]
    pub async fn record_state(&self, tool: String, key: String) -> Result<String> {
        self.shared.check_open()?;
        let name = (|| {
            Ok::<_, idemgate::EngineError>(idemgate::Key::new(
                self.shared.tenant.clone(),
                ToolName::new(&tool)?,
                IdempotencyKey::new(&key)?,
            ))
        })();
        let out = match name {
            Err(e) => reply::engine_error(&e),
            Ok(name) => match self.shared.engine.get(&name).await {
                Err(e) => reply::engine_error(&e),
                Ok(None) => Value::Null,
                Ok(Some(record)) => json!({
                    "state": record.state_name().to_string(),
                    "fence": record.fence,
                }),
            },
        };
        Ok(out.to_string())
    }

    /// Stops the journal flusher; later calls reject. Calls still running finish and are
    /// recorded.
    #[napi]
    pub fn close(&self) {
        self.shared.closed.store(true, Ordering::Release);
        drop(self.shared.flusher.lock().ok().and_then(|mut f| f.take()));
    }
}

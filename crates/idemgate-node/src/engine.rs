//! `NativeEngine`: the handle JavaScript holds on one engine over one store; its opening, the two
//! halves of a call and the operator's view of records. Each method that touches the store
//! returns a reply's JSON text (see `reply`), at once when the engine's work needed no I/O, else
//! a promise of it, or the number of a call parked on the Redis connection Node's loop carries
//! (see `Shared::now_or_later` and carried.rs).

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use idemgate::caller::without_blocking;
use idemgate::redis::CarriedLink;
use idemgate::{
    AnyStore, Begun, Call, Effect, FileJournal, IdempotencyKey, JournalFlusher, Key, ListFilter,
    Mode, TenantId, Ticket, ToolKind, ToolName, ToolPolicy, UnknownPolicy,
};
use idemgate_kit::leases::{keep_leases, Leases};
use idemgate_kit::records::{resolution, seconds as seconds_of, viewed};
use idemgate_kit::reported_effect as effect;
use idemgate_trace::{Door, SplitCall};
use napi::bindgen_prelude::{within_runtime_if_available, Buffer, Either3, PromiseRaw};
use napi::{Env, Error, Result};
use napi_derive::napi;
use serde_json::{json, Value};
use tracing::Instrument as _;

use crate::carried::{handing_in, CarriedRead, CarriedTarget, Parked};
use crate::reply;

/// How often the journal of unconfirmed outcomes is flushed into the store.
const FLUSH_EVERY: Duration = Duration::from_secs(5);

/// A call whose function runs now: its ticket, and its lease as the lease keeper holds it.
struct Running {
    ticket: Ticket,
    lease: u64,
    /// The call's spans, ended by `finish`.
    trace: Arc<SplitCall>,
}

/// What the engine's calls share.
struct Shared {
    engine: Arc<idemgate::Engine<AnyStore>>,
    tenant: TenantId,
    /// The calls whose function runs now, by ticket id.
    running: Mutex<HashMap<u32, Running>>,
    /// Their leases, renewed by one keeper task while the JavaScript functions run.
    leases: Arc<Leases>,
    next_ticket: AtomicU64,
    closed: AtomicBool,
    flusher: Mutex<Option<JournalFlusher>>,
    /// The Redis connection Node's loop carries, when the store has one (carried.rs).
    carried: Option<Arc<CarriedLink>>,
    /// The calls waiting for a reply on it.
    parked: Parked,
    /// Policies already read, by their JSON text: a wrapper sends the same text with every call,
    /// and reading it again costs as much as naming the call.
    policies: Mutex<HashMap<String, ToolPolicy>>,
}

/// How many policies `Shared::policies` keeps before it starts over (a program has a few).
const POLICIES_KEPT: usize = 256;

/// A fence as JavaScript gives it (a safe integer).
fn fence_of(fence: i64) -> Result<u64> {
    u64::try_from(fence)
        .map_err(|_| Error::from_reason(format!("fence must be an integer >= 0, not {fence}")))
}

/// A reply's JSON text now, a promise of it, or the number of a call parked on the connection
/// Node's loop carries (the package resumes it when its reply is in).
pub(crate) type Reply<'env> = Either3<String, PromiseRaw<'env, String>, u32>;

/// The engine over one store (see `openEngine`).
#[napi]
pub struct NativeEngine {
    shared: Arc<Shared>,
    url: String,
    journal: Option<String>,
}

/// A call as the package describes it to `begin` and `keyFor`, given field by field: each field
/// of an object the addon reads costs a property lookup across the boundary (about a microsecond
/// for fifteen of them, more than the engine's work on a replay), an argument next to nothing.
struct CallInit {
    /// The tool's name.
    tool: String,
    /// The idempotency key (none: the fallback window names the record, if the policy has one).
    key: Option<String>,
    /// The call's arguments as JSON text, fingerprinted.
    args_json: Option<String>,
    /// How the tool's calls are treated (see `policy`).
    policy_json: Option<String>,
    /// Where the call was made (a conversation): the fallback window joins only its calls.
    scope: Option<String>,
    /// The model's tool call id, for the call's span (`gen_ai.tool.call.id`).
    call_id: Option<String>,
    /// The caller's W3C `traceparent` (the package passes its active OpenTelemetry span's).
    traceparent: Option<String>,
    /// The caller's W3C `tracestate`.
    tracestate: Option<String>,
    /// The call runs inside the function of an observed call of the same tool (observe mode:
    /// the window inside a call id's record), so it is not observed again.
    within_observed: bool,
}

/// A duration given in seconds; `what` names it in the error.
fn seconds(what: &str, s: f64) -> Result<Duration> {
    seconds_of(what, s).map_err(Error::from_reason)
}

/// How one tool's calls are treated (`idemgate_core::ToolPolicy`), from the JSON text of an
/// object whose fields are each optional (absent or null: the engine's default): `kind`
/// (`write`, the default, `read` or `natural_idempotent`), `ttl` (how long a completed outcome
/// is kept and replayed), `lease` (how long a reservation holds without a heartbeat), `wait` (how
/// long a duplicate waits for an in-flight call before `InFlight`), `fallbackWindow` (when set,
/// calls without a key are joined by tool, arguments and scope for this long), `onUnknown`
/// (`block`, the default, `verify` or `retry`), `tombstone` (how long after a call ran its record
/// is remembered: a retry past the ttl and within this is refused as `OutcomeExpired` instead of
/// running again; default 30 days, 0: none), `identity` (the arguments that name the action,
/// names or JSON pointers: the window compares only these), `mode` (`enforce`, the default, or
/// `observe`: shadow mode, every call runs and what enforce would have done is recorded);
/// durations in seconds.
fn policy(json: Option<&str>) -> Result<ToolPolicy> {
    let mut p = ToolPolicy::default();
    let Some(json) = json else {
        return Ok(p);
    };
    let fields: serde_json::Map<String, Value> = serde_json::from_str(json)
        .map_err(|e| Error::from_reason(format!("a policy must be a JSON object: {e}")))?;
    let text = |name: &str| -> Result<Option<&str>> {
        match fields.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(Error::from_reason(format!(
                "policy field {name} must be a string, not {other}"
            ))),
        }
    };
    let duration = |name: &str, what: &str| -> Result<Option<Duration>> {
        match fields.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) => seconds(what, n.as_f64().unwrap_or(f64::NAN)).map(Some),
            Some(other) => Err(Error::from_reason(format!(
                "policy field {name} must be a number of seconds, not {other}"
            ))),
        }
    };
    if let Some(kind) = text("kind")? {
        p.kind = kind.parse::<ToolKind>().map_err(Error::from_reason)?;
    }
    if let Some(d) = duration("ttl", "ttl")? {
        p.ttl = d;
    }
    if let Some(d) = duration("lease", "lease")? {
        p.lease = d;
    }
    if let Some(d) = duration("wait", "wait")? {
        p.wait = d;
    }
    if let Some(d) = duration("fallbackWindow", "fallback_window")? {
        p.fallback_window = Some(d);
    }
    if let Some(u) = text("onUnknown")? {
        p.on_unknown = u.parse::<UnknownPolicy>().map_err(Error::from_reason)?;
    }
    if let Some(d) = duration("tombstone", "tombstone")? {
        p.tombstone = d;
    }
    if let Some(m) = text("mode")? {
        p.mode = m.parse::<Mode>().map_err(Error::from_reason)?;
    }
    match fields.get("identity") {
        None | Some(Value::Null) => {}
        Some(Value::Array(items)) => {
            p.identity = items
                .iter()
                .map(|v| match v.as_str() {
                    Some(f) if !f.is_empty() && f != "/" => Ok(f.to_owned()),
                    _ => Err(Error::from_reason(format!(
                        "policy field identity must list argument names or JSON pointers, not {v}"
                    ))),
                })
                .collect::<Result<_>>()?;
        }
        Some(other) => {
            return Err(Error::from_reason(format!(
                "policy field identity must be an array of argument names or JSON pointers, not {other}"
            )))
        }
    }
    Ok(p)
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
    // Traces, when the OTEL_* variables ask: set up (or refused, by name) before any call.
    idemgate_trace::install_for_process("idemgate").map_err(bad)?;
    let journal_dir = journal.map(std::path::PathBuf::from);
    let (url, journal_dir) = idemgate::store_and_journal(url.as_deref(), journal_dir.as_deref())
        .map_err(|e| bad(e.to_string()))?;
    let store = AnyStore::connect(&url)
        .await
        .map_err(|e| refused(reply::open_error(&url, &e)))?;
    let in_memory = matches!(store, AnyStore::Memory(_));
    let mut engine = idemgate::Engine::new(store);
    if in_memory {
        // The store is this process's memory: a cache of its completed records would be a
        // second copy, kept up on every call for nothing.
        engine = engine.with_settings(idemgate::Settings {
            replay_cache: 0,
            ..idemgate::Settings::default()
        });
    }
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
    let carried = match engine.store() {
        AnyStore::Redis(redis) => redis.carried_link(),
        _ => None,
    };
    let engine = Arc::new(engine);
    let flusher = engine.spawn_journal_flusher(FLUSH_EVERY);
    let leases = Arc::new(Leases::default());
    let beating = Arc::downgrade(&engine);
    napi::bindgen_prelude::spawn(keep_leases(Arc::downgrade(&leases), move |ticket| {
        if let Some(engine) = beating.upgrade() {
            napi::bindgen_prelude::spawn(async move {
                let _ = engine.heartbeat(&ticket).await;
            });
        }
    }));
    Ok(NativeEngine {
        shared: Arc::new(Shared {
            engine,
            tenant,
            running: Mutex::new(HashMap::new()),
            leases,
            next_ticket: AtomicU64::new(1),
            closed: AtomicBool::new(false),
            flusher: Mutex::new(Some(flusher)),
            carried,
            parked: Parked::default(),
            policies: Mutex::new(HashMap::new()),
        }),
        url,
        journal,
    })
}

impl Shared {
    /// Runs `work` to a reply: first polled here, on Node's thread (in the runtime's context),
    /// where it finishes at once when it needs no I/O (the memory store; a replay from the
    /// engine's cache), so the reply is returned without a round trip through the runtime's
    /// threads and back, which costs more than the engine's work. With the Redis connection
    /// Node's loop carries up, a call waiting for its reply there is parked for the loop to
    /// resume (carried.rs). Otherwise it goes on on the runtime and the promise resolves when it
    /// is done. Nothing blocks Node's thread: the poll is marked `without_blocking` (SQLite's
    /// writer then queues a write it would have run on the caller's thread), and the other
    /// stores' first poll only sends.
    fn now_or_later<'env, F>(&self, env: &'env Env, work: F) -> Result<Reply<'env>>
    where
        F: Future<Output = Result<String>> + Send + 'static,
    {
        if self.carried.as_ref().is_some_and(|link| link.is_up()) {
            return self.parked.drive(env, Box::pin(work), None);
        }
        let mut work = Box::pin(work);
        let polled = within_runtime_if_available(|| {
            without_blocking(|| work.as_mut().poll(&mut Context::from_waker(Waker::noop())))
        });
        match polled {
            Poll::Ready(reply) => reply.map(Either3::A),
            Poll::Pending => env.spawn_future(work).map(Either3::B),
        }
    }

    fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::from_reason("this engine is closed"));
        }
        Ok(())
    }

    /// The policy of `json` (see `policy`), read once per text.
    fn policy(&self, json: Option<&str>) -> Result<ToolPolicy> {
        let Some(json) = json else {
            return Ok(ToolPolicy::default());
        };
        if let Some(known) = self.policies.lock().ok().and_then(|p| p.get(json).cloned()) {
            return Ok(known);
        }
        let read = policy(Some(json))?;
        if let Ok(mut known) = self.policies.lock() {
            if known.len() >= POLICIES_KEPT {
                known.clear();
            }
            known.insert(json.to_owned(), read.clone());
        }
        Ok(read)
    }

    /// The engine's call and its policy; a call the engine refuses is the error reply.
    fn call(&self, init: CallInit) -> Result<std::result::Result<(Call, ToolPolicy), Value>> {
        let policy = self.policy(init.policy_json.as_deref())?;
        let call = || -> std::result::Result<Call, idemgate::EngineError> {
            let mut call = Call::new(self.tenant.clone(), ToolName::new(&init.tool)?);
            if let Some(key) = &init.key {
                call = call.key(IdempotencyKey::explicit(key)?);
            }
            if let Some(args) = &init.args_json {
                call = call.args_text(args.as_bytes())?;
                if init.key.is_none() {
                    // The window names the action by these.
                    call = call.identity(args.as_bytes(), &policy.identity);
                }
            }
            if let Some(scope) = init.scope {
                call = call.scope(scope);
            }
            Ok(call.within_observed(init.within_observed))
        };
        Ok(call()
            .map(|call| (call, policy))
            .map_err(|e| reply::engine_error(&e)))
    }

    /// Keeps the lease of a call allowed to run until its function reports (`finish`); the
    /// ticket id `finish` names it by.
    fn hold(&self, ticket: Ticket, trace: Arc<SplitCall>) -> u32 {
        let lease = self.leases.hold(&ticket);
        // Ticket ids wrap past u32 (JavaScript numbers); a ticket lives for one call only.
        let id = self.next_ticket.fetch_add(1, Ordering::Relaxed) as u32;
        if let Ok(mut running) = self.running.lock() {
            running.insert(
                id,
                Running {
                    ticket,
                    lease,
                    trace,
                },
            );
        }
        id
    }

    /// The record of `(tool, key)` of this engine's tenant.
    fn key(&self, tool: &str, key: &str) -> std::result::Result<Key, Value> {
        (|| {
            Ok::<_, idemgate::EngineError>(Key::new(
                self.tenant.clone(),
                ToolName::new(tool)?,
                IdempotencyKey::new(key)?,
            ))
        })()
        .map_err(|e| reply::engine_error(&e))
    }
}

/// A record as the package shows it (`viewed`: with its history), or `null`.
async fn view<S: idemgate::Store>(
    engine: &idemgate::Engine<S>,
    record: Option<&idemgate::Record>,
) -> std::result::Result<Value, idemgate::EngineError> {
    match record {
        Some(r) => viewed(engine, r).await,
        None => Ok(Value::Null),
    }
}

impl NativeEngine {
    /// Runs `work` on this tenant's record of `(tool, key)` to a reply (see `now_or_later`): its
    /// value, or its engine error; a name that is no record's is refused at once.
    fn on_record<'env, F, Fut>(
        &self,
        env: &'env Env,
        tool: &str,
        key: &str,
        work: F,
    ) -> Result<Reply<'env>>
    where
        F: FnOnce(Arc<Shared>, Key) -> Fut,
        Fut: Future<Output = std::result::Result<Value, idemgate::EngineError>> + Send + 'static,
    {
        self.shared.check_open()?;
        let name = match self.shared.key(tool, key) {
            Ok(name) => name,
            Err(refused) => return Ok(Either3::A(refused.to_string())),
        };
        let work = work(Arc::clone(&self.shared), name);
        self.shared.now_or_later(env, async move {
            Ok(work
                .await
                .unwrap_or_else(|e| reply::engine_error(&e))
                .to_string())
        })
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
    /// or an error (in flight, unknown, key reused, refused...). The call: its `tool`, its `key`
    /// (none: the fallback window names the record, if the policy has one), its arguments as
    /// JSON text (fingerprinted), its tool's policy as JSON text (see `policy`), where it was made
    /// (`scope`: the fallback window joins only its calls), the model's tool call id (for the
    /// call's span), the caller's W3C `traceparent` and `tracestate`, and whether it runs inside
    /// the function of an observed call of the same tool (`withinObserved`). In observe mode a
    /// call enforce mode would have answered without running gets `{"pass_through": true,
    /// "observed": verdict}`. `lean`: the caller wants only the value, so a replay of a success
    /// is `v` and the stored value's JSON text (see `reply::lean`), and a call to run is `x`,
    /// its ticket id, its digest and (when spans are exported) the traceparent its function
    /// hands on, apart by spaces.
    #[napi(ts_return_type = "string | Promise<string> | number")]
    #[allow(clippy::too_many_arguments)] // the call's fields, each one argument (see `CallInit`)
    pub fn begin<'env>(
        &self,
        env: &'env Env,
        tool: String,
        key: Option<String>,
        args_json: Option<String>,
        policy_json: Option<String>,
        scope: Option<String>,
        call_id: Option<String>,
        traceparent: Option<String>,
        tracestate: Option<String>,
        within_observed: Option<bool>,
        lean: Option<bool>,
    ) -> Result<Reply<'env>> {
        self.shared.check_open()?;
        let lean = lean.unwrap_or(false);
        let call = CallInit {
            tool,
            key,
            args_json,
            policy_json,
            scope,
            call_id,
            traceparent,
            tracestate,
            within_observed: within_observed.unwrap_or(false),
        };
        let trace = Arc::new(SplitCall::start(
            Door::Node,
            self.shared.tenant.as_str(),
            &call.tool,
            call.call_id.as_deref(),
            call.traceparent.as_deref(),
            call.tracestate.as_deref(),
        ));
        let (call, policy) = match self.shared.call(call)? {
            Ok(call) => call,
            Err(refused) => return Ok(Either3::A(refused.to_string())),
        };
        let shared = Arc::clone(&self.shared);
        self.shared.now_or_later(env, async move {
            // Boxed where it is made: the engine's future (about 2 KB) is then moved once, not
            // into the span's wrapper, this block and its box in turn.
            let begun = Box::pin(shared.engine.begin(call, &policy))
                .instrument(trace.span())
                .await;
            trace.begun(&begun);
            let out = match begun {
                Err(e) => reply::engine_error(&e).to_string(),
                Ok(Begun::PassThrough) => json!({ "pass_through": true }).to_string(),
                // Observe mode: run it, nothing recorded; what enforce would have said.
                // The downstream key of the record it was named by, for `currentKey()`.
                Ok(Begun::Observed { would, key }) => json!({
                    "pass_through": true,
                    "observed": would.label(),
                    "digest": key.map(|k| idemgate::key::hex(&k.digest())),
                })
                .to_string(),
                Ok(Begun::Answered(answer)) => match lean.then(|| reply::lean(&answer)).flatten() {
                    Some(value) => value,
                    None => reply::named_answer(&answer, &policy.identity),
                },
                Ok(Begun::Execute(ticket)) if lean => {
                    // `x`, the ticket id, the digest and the traceparent the function hands on,
                    // apart by spaces (see `reply::LEAN_EXECUTE`): no JSON to write or read.
                    let digest = idemgate::key::hex(&ticket.key.digest());
                    let out = trace.outgoing().map(|o| o.traceparent().to_owned());
                    let id = shared.hold(ticket, trace);
                    let mut text = format!("{}{id} {digest}", reply::LEAN_EXECUTE);
                    if let Some(traceparent) = out {
                        text.push(' ');
                        text.push_str(&traceparent);
                    }
                    text
                }
                Ok(Begun::Execute(ticket)) => {
                    let mut facts = json!({
                        "key": ticket.key.key.as_str(),
                        "rule": ticket.rule.to_string(),
                        "fence": ticket.lease.fence,
                        "digest": idemgate::key::hex(&ticket.key.digest()),
                    });
                    // What the function hands on: the side effect's span, or the caller's.
                    if let Some(out) = trace.outgoing() {
                        facts["traceparent"] = out.traceparent().into();
                    }
                    facts["execute"] = shared.hold(ticket, trace).into();
                    facts.to_string()
                }
            };
            Ok(out)
        })
    }

    /// Records what the function of ticket `id` reported (`success`/`failed` with its JSON
    /// text, `not_applied`/`ambiguous` with a message) and answers. A body the engine cannot
    /// read as JSON makes the record unknown at once (the function ran) and answers the error
    /// `not_json`. `lean`: the caller needs no answer for a success, which is then `""`.
    #[napi(ts_return_type = "string | Promise<string> | number")]
    pub fn finish<'env>(
        &self,
        env: &'env Env,
        id: u32,
        kind: String,
        body: String,
        lean: Option<bool>,
    ) -> Result<Reply<'env>> {
        let lean = lean.unwrap_or(false);
        let running = self
            .shared
            .running
            .lock()
            .ok()
            .and_then(|mut r| r.remove(&id));
        let Some(Running {
            ticket,
            lease,
            trace,
        }) = running
        else {
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
            Err(why) => {
                // Nothing is recorded for a report the package spelt wrong; the lease keeps
                // being renewed until one it can record arrives.
                if let Ok(mut r) = self.shared.running.lock() {
                    r.insert(
                        id,
                        Running {
                            ticket,
                            lease,
                            trace,
                        },
                    );
                }
                return Err(Error::from_reason(why));
            }
        };
        // The lease has at least two thirds of its time left: finishing needs no more beats.
        self.shared.leases.drop_lease(lease);
        let shared = Arc::clone(&self.shared);
        trace.effect_done();
        self.shared.now_or_later(env, async move {
            let answer = Box::pin(shared.engine.finish(&ticket, reported))
                .instrument(trace.span())
                .await;
            trace.finished(&answer);
            Ok(match not_json {
                Some(why) => json!({ "error": "not_json", "message": why }).to_string(),
                None => match lean.then(|| reply::lean(&answer)).flatten() {
                    Some(nothing) => nothing,
                    None => reply::answer(&answer),
                },
            })
        })
    }

    /// The record a call is judged by, as `Engine::key_for` names it: `{tenant, tool, key, rule,
    /// ttl, digest}`, `null` for reads and naturally idempotent tools, or an error. The call as
    /// `begin` takes it, up to its scope.
    #[napi]
    pub fn key_for(
        &self,
        tool: String,
        key: Option<String>,
        args_json: Option<String>,
        policy_json: Option<String>,
        scope: Option<String>,
    ) -> Result<String> {
        let call = CallInit {
            tool,
            key,
            args_json,
            policy_json,
            scope,
            call_id: None,
            traceparent: None,
            tracestate: None,
            within_observed: false,
        };
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
                "ttl": named.keep.ttl.as_secs_f64(),
                "digest": idemgate::key::hex(&named.key.digest()),
            }),
        };
        Ok(out.to_string())
    }

    /// The state of the record of `(tool, key)`: `{state, fence}` (`in_flight`, `completed`,
    /// `unknown`), `null` when there is none, or an error.
    #[napi(ts_return_type = "string | Promise<string> | number")]
    pub fn record_state<'env>(
        &self,
        env: &'env Env,
        tool: String,
        key: String,
    ) -> Result<Reply<'env>> {
        self.on_record(env, &tool, &key, |shared, name| async move {
            Ok(match shared.engine.get(&name).await? {
                None => Value::Null,
                Some(record) => json!({
                    "state": record.state_name().to_string(),
                    "fence": record.fence,
                }),
            })
        })
    }

    /// The record of `(tool, key)` as `idemgate keys show --json` shows it (the outcome's
    /// content and body as JSON), `null` when there is none, or an error.
    #[napi(ts_return_type = "string | Promise<string> | number")]
    pub fn record<'env>(&self, env: &'env Env, tool: String, key: String) -> Result<Reply<'env>> {
        self.on_record(env, &tool, &key, |shared, name| async move {
            let record = shared.engine.get(&name).await?;
            view(&shared.engine, record.as_ref()).await
        })
    }

    /// This tenant's records, oldest first, as a JSON array of `record`'s shape: only `tool`'s,
    /// only those in `state` (`in_flight`, `completed`, `unknown`), only those made in `scope`,
    /// at most `limit` (0: all); or an error.
    #[napi(ts_return_type = "string | Promise<string> | number")]
    pub fn records<'env>(
        &self,
        env: &'env Env,
        tool: Option<String>,
        state: Option<String>,
        scope: Option<String>,
        limit: Option<u32>,
    ) -> Result<Reply<'env>> {
        self.shared.check_open()?;
        let filter = ListFilter {
            tenant: Some(self.shared.tenant.clone()),
            tool: tool
                .as_deref()
                .map(ToolName::new)
                .transpose()
                .map_err(|e| Error::from_reason(e.to_string()))?,
            state: state
                .as_deref()
                .map(str::parse::<idemgate::State>)
                .transpose()
                .map_err(Error::from_reason)?,
            scope: scope.map(Into::into),
            limit: limit.unwrap_or(0) as usize,
            ..idemgate::ListFilter::default()
        };
        let shared = Arc::clone(&self.shared);
        self.shared.now_or_later(env, async move {
            let views = async {
                let mut views = Vec::new();
                for r in shared.engine.list(&filter).await? {
                    views.push(view(&shared.engine, Some(&r)).await?);
                }
                Ok::<_, idemgate::EngineError>(Value::Array(views))
            };
            Ok(views
                .await
                .unwrap_or_else(|e| reply::engine_error(&e))
                .to_string())
        })
    }

    /// Resolves the unknown record of `(tool, key)` as an operator decided, if its fence is still
    /// `fence`: `completed` with `result` (JSON text; `failed`: a terminal failure), stored for
    /// `ttl` seconds (default: the engine's default TTL) and marked as an operator's resolution, or `release` (it did
    /// not happen: the next call runs). `by` and `reason` go into the audit log. The record after
    /// (`null` once released), or an error (`not_found`, `not_resolvable`...).
    #[napi(ts_return_type = "string | Promise<string> | number")]
    #[allow(clippy::too_many_arguments)] // the package's options, each one argument
    pub fn resolve<'env>(
        &self,
        env: &'env Env,
        tool: String,
        key: String,
        fence: i64,
        how: String,
        result: Option<String>,
        failed: Option<bool>,
        ttl: Option<f64>,
        by: Option<String>,
        reason: Option<String>,
    ) -> Result<Reply<'env>> {
        let fence = fence_of(fence)?;
        let how = resolution(
            &how,
            result.as_deref(),
            failed.unwrap_or(false),
            ttl.unwrap_or_else(|| ToolPolicy::default().ttl.as_secs_f64()),
            self.shared.engine.policies().get(&tool).tombstone,
        )
        .map_err(Error::from_reason)?;
        self.on_record(env, &tool, &key, |shared, name| async move {
            let after = shared
                .engine
                .resolve(&name, fence, how, by.as_deref(), reason.as_deref())
                .await?;
            view(&shared.engine, after.as_ref()).await
        })
    }

    /// Reopens the completed, expired or unknown record of `(tool, key)` at `fence`, so the next call runs
    /// the action again; `by` and `reason` go into the audit log. `{"was": "completed"}` (or
    /// `unknown`), or an error (`not_found`, `not_resolvable`: in flight, or its fence moved on).
    #[napi(ts_return_type = "string | Promise<string> | number")]
    pub fn reopen<'env>(
        &self,
        env: &'env Env,
        tool: String,
        key: String,
        fence: i64,
        by: Option<String>,
        reason: Option<String>,
    ) -> Result<Reply<'env>> {
        let fence = fence_of(fence)?;
        self.on_record(env, &tool, &key, |shared, name| async move {
            let was = shared
                .engine
                .reopen(&name, fence, by.as_deref(), reason.as_deref())
                .await?;
            Ok(json!({ "was": was.to_string() }))
        })
    }

    /// Where the package connects the socket that carries this engine's Redis commands
    /// (carried.rs); `null` when the store has no such link (not Redis, or a URL that needs the
    /// shared connection: Cluster, Sentinel, TLS, RESP3).
    #[napi]
    pub fn carried_target(&self) -> Option<CarriedTarget> {
        self.shared.carried.as_deref().map(CarriedTarget::of)
    }

    /// The package's socket connected: the connection's setup is queued (`carriedOutput`), and
    /// calls use it from now on.
    #[napi]
    pub fn carried_connected(&self) {
        if let Some(link) = &self.shared.carried {
            link.connected();
        }
    }

    /// The bytes to write to the socket now, if any.
    #[napi]
    pub fn carried_output(&self) -> Option<Buffer> {
        self.shared
            .carried
            .as_ref()
            .and_then(|link| link.take_output())
            .map(Buffer::from)
    }

    /// Bytes read from the socket: the parked calls they woke, for `resume`; and, when they
    /// broke the link, why (the package closes the socket).
    #[napi]
    pub fn carried_input(&self, bytes: &[u8]) -> CarriedRead {
        let broken = match &self.shared.carried {
            Some(link) => handing_in(|| link.input(bytes)).err(),
            None => Some("this engine has no carried connection".to_owned()),
        };
        CarriedRead {
            woken: self.shared.parked.woken(),
            broken,
        }
    }

    /// The socket failed or closed (`why`): the commands still waiting fail as over a lost
    /// connection, and calls use the shared connection until the package connects again.
    /// Returns the parked calls to resume.
    #[napi]
    pub fn carried_broken(&self, why: String) -> Vec<u32> {
        if let Some(link) = &self.shared.carried {
            handing_in(|| link.broken(&why));
        }
        self.shared.parked.woken()
    }

    /// Calls `wake` (no arguments, on Node's thread) when a parked call was woken by anything
    /// but the replies the package hands in: it then resumes `carriedWoken()`'s calls.
    #[napi]
    pub fn carried_on_wake(&self, wake: napi::bindgen_prelude::Function<(), ()>) -> Result<()> {
        let js = wake
            .build_threadsafe_function::<()>()
            .weak::<true>()
            .callee_handled::<false>()
            .build()?;
        self.shared.parked.on_wake(Some(js));
        Ok(())
    }

    /// The package is done with the link (its engine closed or collected): the function
    /// `carriedOnWake` gave is released, so that nothing keeps this engine alive.
    #[napi]
    pub fn carried_stop_waking(&self) {
        self.shared.parked.on_wake(None);
    }

    /// The parked calls woken since the package last asked, to resume.
    #[napi]
    pub fn carried_woken(&self) -> Vec<u32> {
        self.shared.parked.woken()
    }

    /// Polls the parked call `id` again, on Node's thread: its reply, a promise of it, or its
    /// number again while it still waits; `null` when no call is parked under it.
    #[napi(ts_return_type = "string | Promise<string> | number | null")]
    pub fn resume<'env>(&self, env: &'env Env, id: u32) -> Result<Option<Reply<'env>>> {
        self.shared.parked.resume(env, id)
    }

    /// Stops the journal flusher; later calls reject. Calls still running finish and are
    /// recorded.
    #[napi]
    pub fn close(&self) {
        self.shared.closed.store(true, Ordering::Release);
        drop(self.shared.flusher.lock().ok().and_then(|mut f| f.take()));
    }
}

/// Whether this process exports idemgate's spans (the OTEL_* variables point at a collector):
/// the package then passes its active span's context with each call. Throws when the variables
/// ask for what idemgate cannot do.
#[napi]
pub fn tracing() -> Result<bool> {
    idemgate_trace::install_for_process("idemgate").map_err(Error::from_reason)
}

/// Sends the spans ended so far to the collector (the package calls it at exit).
#[napi]
pub fn flush_traces() {
    idemgate_trace::flush_process();
}

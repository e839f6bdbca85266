//! The engine: every decision of the contract, built on a [`Store`].

mod decide;
mod finish;
mod operator;
mod shadow;

pub use shadow::MAX_OBSERVATIONS;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;
use tracing::Instrument as _;

use crate::canonical::Fingerprint;
use crate::error::{retry_after, CanonicalError, EngineError, StoreError};
use crate::history::{Happening, HistoryEntry};
use crate::journal::{Journal, JournalEntry, JournalOp, MemoryJournal};
use crate::key::{IdempotencyKey, Key, KeyRule, TenantId, ToolName};
use crate::observe::{Event, Observer, Observers};
use crate::policy::{Policies, ToolKind, ToolPolicy, UnknownPolicy};
use crate::record::{Fence, Lease, Outcome, Record, RecordState, State};
use crate::replay::{Completed, ReplayCache};
use crate::store::{Claim, Completion, Keep, ListFilter, Reopened, Reservation, Store};
use crate::time::{Clock, SystemClock, Timestamp};
use crate::verdict::Verdict;
use crate::TRACE_TARGET;

pub use crate::answer::{Answer, Decision, Effect, Recording};
pub use crate::journal::FlushReport;

/// One call: who, which tool, which logical action, with which arguments.
#[derive(Clone, Debug)]
pub struct Call {
    /// Whose call.
    pub tenant: TenantId,
    /// Which tool.
    pub tool: ToolName,
    /// The idempotency key, if the caller has one.
    pub key: Option<IdempotencyKey>,
    /// The fingerprint of the canonical arguments.
    pub fingerprint: Fingerprint,
    /// Where the call was made (a conversation, an MCP session): a call without a key is
    /// the same action as an identical one within the fallback window only in the same scope
    /// ([`Call::scope`]). `None`: one scope for the tenant.
    pub scope: Option<Arc<str>>,
    /// The rule its key was named by, when it has one: [`KeyRule::Explicit`] unless its door
    /// derived the key from what a model sent ([`Call::key_named_by`]).
    pub key_rule: KeyRule,
    /// The fingerprint of the arguments that name the action, when the tool has identity fields
    /// and the call has them all ([`Call::identity`]): a call without a key is named and
    /// compared by it, instead of by all its arguments.
    pub identity: Option<Fingerprint>,
    /// Whether the call runs inside the side effect of a call observe mode already observed
    /// ([`Call::within_observed`]).
    pub within_observed: bool,
}

impl Call {
    /// A call without key and with `null` arguments.
    pub fn new(tenant: TenantId, tool: ToolName) -> Self {
        // Computed once: most calls set their own arguments right after.
        static NULL_ARGS: std::sync::OnceLock<Fingerprint> = std::sync::OnceLock::new();
        Call {
            tenant,
            tool,
            key: None,
            fingerprint: *NULL_ARGS.get_or_init(|| Fingerprint::of_json(&Value::Null)),
            scope: None,
            key_rule: KeyRule::Explicit,
            identity: None,
            within_observed: false,
        }
    }

    /// Says that the call runs inside the side effect of a call of the same tool that observe
    /// mode observed ([`Begun::Observed`]): a door's re-emission window inside a call id's
    /// record, asked by a door that runs the side effect itself between `begin` and `finish`
    /// (the packages). It is the same call, observed once, by the outer record.
    /// ([`Engine::call`] knows this by itself.)
    pub fn within_observed(mut self, within: bool) -> Self {
        self.within_observed = within;
        self
    }

    /// Sets the scope the call was made in: the fallback window then joins only identical
    /// calls of the same scope (a model re-emitting a call in its conversation), never calls of
    /// another conversation with the same arguments. Explicit keys are not scoped: a caller that
    /// names the action names it everywhere.
    pub fn scope(mut self, scope: impl Into<Arc<str>>) -> Self {
        self.scope = Some(scope.into());
        self
    }

    /// Names the action by the tool's identity fields (`fields`, [`ToolPolicy::identity`]) of
    /// the arguments' JSON text `args`, for the fallback window: a call that rewords its other
    /// arguments (a re-planned mail's body) within the window is then the same action. A call
    /// that lacks a field (or sends it `null`), or a tool without them, keeps being named by all
    /// its arguments ([`Fingerprint::of_identity`]).
    pub fn identity(mut self, args: &[u8], fields: &[String]) -> Self {
        self.identity = if fields.is_empty() {
            None
        } else {
            Fingerprint::of_identity(args, fields)
        };
        self
    }

    /// What a call without a key is compared by: its identity fields' fingerprint when it has
    /// one, else its arguments'.
    pub(crate) fn window_arguments(&self) -> Fingerprint {
        match self.key {
            None => self.identity.unwrap_or(self.fingerprint),
            Some(_) => self.fingerprint,
        }
    }

    /// What names the call's fallback record: what it is compared by, within its scope.
    fn window_fingerprint(&self) -> Fingerprint {
        let arguments = self.window_arguments();
        match &self.scope {
            None => arguments,
            Some(scope) => {
                let mut bytes = Vec::with_capacity(8 + scope.len() + 32);
                bytes.extend_from_slice(&(scope.len() as u64).to_be_bytes());
                bytes.extend_from_slice(scope.as_bytes());
                bytes.extend_from_slice(arguments.as_bytes());
                Fingerprint::of_bytes(&bytes)
            }
        }
    }

    /// Sets the idempotency key.
    pub fn key(mut self, key: IdempotencyKey) -> Self {
        self.key = Some(key);
        self
    }

    /// Says which rule its door named the key by: [`KeyRule::CallId`] or [`KeyRule::ModelKey`]
    /// for a key derived from the framework's call id or the model's own key. The record is named
    /// and kept as for any key; answers carry the rule, so observers count its duplicates under
    /// it. ([`KeyRule::Fallback`] is the engine's to give, for a call without a key: a key so
    /// marked is taken as explicit.)
    pub fn key_named_by(mut self, rule: KeyRule) -> Self {
        self.key_rule = match rule {
            KeyRule::Fallback => KeyRule::Explicit,
            r => r,
        };
        self
    }

    /// Sets the arguments from a JSON value.
    pub fn args(mut self, args: &Value) -> Self {
        self.fingerprint = Fingerprint::of_json(args);
        self
    }

    /// Sets the arguments from raw JSON text, keeping every integer exact.
    ///
    /// # Errors
    /// [`CanonicalError`] when the text is not one well-formed JSON value.
    pub fn args_text(mut self, text: &[u8]) -> Result<Self, CanonicalError> {
        self.fingerprint = Fingerprint::of_json_text(text)?;
        Ok(self)
    }

    /// Sets the fingerprint directly (for arguments that are not JSON).
    pub fn fingerprint(mut self, fingerprint: Fingerprint) -> Self {
        self.fingerprint = fingerprint;
        self
    }
}

/// What [`Engine::begin`] decided.
// Not `non_exhaustive`: every front door matches it whole, so a new way to begin is a compile
// error at each of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Begun {
    /// Run the side effect now, then report with [`Engine::finish`].
    Execute(Ticket),
    /// A read or naturally idempotent tool: run it, nothing is recorded.
    PassThrough,
    /// No execution: a replay, an in-flight or unknown answer.
    Answered(Answer),
    /// Shadow mode ([`crate::Mode::Observe`]): run it, nothing is recorded, though enforce mode
    /// would have answered it without running: `would` is the verdict it would have had (the
    /// record it duplicates holds the observation in its history).
    Observed {
        /// The verdict enforce mode would have given.
        would: Verdict,
        /// The record the call was named by, when it was: its downstream key is the call's
        /// (the side effect passes it on, so that a downstream that deduplicates still does).
        key: Option<Key>,
    },
}

tokio::task_local! {
    /// The tenant and tool of the observed call whose side effect runs ([`Begun::Observed`]): a
    /// call of the same tool nested in it (a door's re-emission window inside a call id's
    /// record) is the same call, which is observed once, by the outer record. A call of another
    /// tool that the side effect makes is a call of its own.
    static OBSERVED_CALL: (TenantId, ToolName);
}

/// Permission to run one call's side effect: the record's name and the lease held on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ticket {
    /// The record.
    pub key: Key,
    /// Which rule named it.
    pub rule: KeyRule,
    /// The lease held on it.
    pub lease: Lease,
    /// How long the outcome is replayed, and the record remembered.
    pub keep: Keep,
    /// How long the lease lasts without a heartbeat.
    pub lease_for: Duration,
    /// The fingerprint of the call's arguments, when this engine reserved the record (`None` for
    /// a lease a caller brings back, [`Engine::ticket_for`]): a journaled outcome whose record
    /// the store lost is written back under it.
    pub fingerprint: Option<Fingerprint>,
}

/// The record a write call is judged by (see [`Engine::key_for`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Named {
    /// The record.
    pub key: Key,
    /// Which rule named it.
    pub rule: KeyRule,
    /// How long its outcome is replayed, and the record remembered.
    pub keep: Keep,
}

/// The task that flushes the journal (see [`Engine::spawn_journal_flusher`]); stops when dropped.
#[derive(Debug)]
pub struct JournalFlusher(tokio::task::JoinHandle<()>);

impl Drop for JournalFlusher {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What a verifier found out about an unknown outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probe {
    /// The side effect happened; this is its outcome, to be stored and replayed.
    Applied(Outcome),
    /// It did not happen: the call runs now.
    NotApplied,
    /// Still cannot tell.
    Unknown,
}

/// The future a verifier returns.
pub type ProbeFuture<'a> = Pin<Box<dyn Future<Output = Result<Probe, String>> + Send + 'a>>;

/// Probes whether the side effect of an unknown record happened, for tools whose unknown policy is
/// `verify` (for example by looking the payment up by its idempotency key downstream).
pub trait Verifier: Send + Sync + 'static {
    /// Probes the record `key`.
    fn verify<'a>(&'a self, key: &'a Key) -> ProbeFuture<'a>;
}

/// How an operator resolves an unknown record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// The side effect happened with this outcome: store it and replay it, kept as `keep` says.
    Completed {
        /// The outcome to store.
        outcome: Outcome,
        /// How long to replay it, and remember the record (the tool's policy: [`Keep::of`]).
        keep: Keep,
    },
    /// The side effect did not happen: the record counts as absent from now on, so the next
    /// call runs. It stays stored (with its fence and history) until a purge, as a reopened
    /// record does, so that its trail says who released it and a retried resolution at the old
    /// fence can never meet the record of the call that ran.
    Release,
}

/// Tuning of the engine's own retries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Attempts at a "done" write (complete, release, mark unknown) before it goes to the journal.
    pub finish_attempts: u32,
    /// Backoff before the second attempt; it doubles each time.
    pub finish_backoff: Duration,
    /// The longest a waiting duplicate goes without looking at the record again.
    pub max_poll: Duration,
    /// How many completed records the engine keeps to answer replays without asking the store
    /// (a completed record changes only when it expires or is reopened); 0 turns the cache off.
    pub replay_cache: usize,
    /// How long after it was read from the store a cached completed record answers replays
    /// (default 2 s); then the store is asked again. This engine's own [`Engine::reopen`] drops
    /// its copy at once; a record reopened by another process (another proxy or worker on the
    /// same store) is replayed here for at most this long, then runs again.
    pub replay_cache_fresh: Duration,
    /// How long a call that finds a record unknown for the first time watches it before judging
    /// it (answering unknown, taking it over, verifying). A holder whose lease ran out while the
    /// store was unreachable may hold the outcome in its journal, acknowledged to its caller; its
    /// flusher retries every [`FLUSH_RETRY`] once entries are pending, so a settle window longer
    /// than that lets the flush land before anybody decides the outcome is unknown (see
    /// docs/ARCHITECTURE.md, "Journaled outcomes and takeovers"). 0 turns it off.
    pub unknown_settle: Duration,
    /// How long a caller whose reservation went unanswered waits for the engine to find and
    /// release it, should it have landed, before being told the reservation failed. The store
    /// already spent its own timeout on the reservation; on a link that drops everything the
    /// clean-up would take as long again. Past the budget the reservation, if it landed, ends
    /// unknown when its lease runs out (never run, never a second execution).
    pub abandon_budget: Duration,
}

/// How often the journal flusher tries again while entries are pending (the store is down).
pub const FLUSH_RETRY: Duration = Duration::from_millis(250);

impl Default for Settings {
    fn default() -> Self {
        Settings {
            finish_attempts: 5,
            finish_backoff: Duration::from_millis(20),
            max_poll: Duration::from_millis(100),
            replay_cache: 4096,
            replay_cache_fresh: Duration::from_secs(2),
            unknown_settle: Duration::from_secs(2),
            abandon_budget: Duration::from_secs(1),
        }
    }
}

/// The idempotency engine over a store.
pub struct Engine<S> {
    store: S,
    policies: Policies,
    journal: Arc<dyn Journal>,
    verifiers: HashMap<String, Arc<dyn Verifier>>,
    settings: Settings,
    replays: ReplayCache,
    clock: Arc<dyn Clock>,
    observers: Observers,
    /// When this engine first found each record unknown (see [`Settings::unknown_settle`]).
    unknown_seen: std::sync::Mutex<HashMap<Key, Instant>>,
    /// Woken when an entry is journaled, so the flusher turns to its fast retry at once.
    journaled: Arc<tokio::sync::Notify>,
}

impl<S: std::fmt::Debug> std::fmt::Debug for Engine<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("store", &self.store)
            .field("policies", &self.policies)
            .field("journal", &self.journal)
            .field("settings", &self.settings)
            .field("observers", &self.observers)
            .finish_non_exhaustive()
    }
}
impl<S: Store> Engine<S> {
    /// An engine over `store`, every tool a write, with an in-memory journal.
    pub fn new(store: S) -> Self {
        Engine {
            store,
            policies: Policies::new(),
            journal: Arc::new(MemoryJournal::new()),
            verifiers: HashMap::new(),
            replays: ReplayCache::new(
                Settings::default().replay_cache,
                Settings::default().replay_cache_fresh,
            ),
            settings: Settings::default(),
            clock: Arc::new(SystemClock),
            observers: Observers::new(),
            unknown_seen: std::sync::Mutex::new(HashMap::new()),
            journaled: Arc::new(tokio::sync::Notify::new()),
        }
    }

    /// Adds an observer: it is told every decision, resolution and journal flush (metrics, audit
    /// log, logs).
    pub fn with_observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observers.push(observer);
        self
    }

    /// Tells the observers of something a front door decided itself (a quota refusal, say).
    pub fn observe(&self, event: &Event<'_>) {
        self.observers.observe(event);
    }

    /// Sets the tool policies.
    pub fn with_policies(mut self, policies: Policies) -> Self {
        self.policies = policies;
        self
    }

    /// Sets the journal of unconfirmed writes (use a durable one with a durable store).
    pub fn with_journal(mut self, journal: Arc<dyn Journal>) -> Self {
        self.journal = journal;
        self
    }

    /// Registers the verifier of a tool whose unknown policy is `verify`.
    pub fn with_verifier(mut self, tool: impl Into<String>, verifier: Arc<dyn Verifier>) -> Self {
        self.verifiers.insert(tool.into(), verifier);
        self
    }

    /// Sets the clock the engine judges its own times by (replay cache expiry, answers the store
    /// did not time). Give it the store's clock when that is not the system's (tests with a
    /// [`crate::ManualClock`]); server stores judge by their server, which should agree with the
    /// system clock to within [`Settings`]' tolerances.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Sets the engine's retry tuning.
    pub fn with_settings(mut self, settings: Settings) -> Self {
        self.replays = ReplayCache::new(settings.replay_cache, settings.replay_cache_fresh);
        self.settings = settings;
        self
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The policies.
    pub fn policies(&self) -> &Policies {
        &self.policies
    }

    /// Runs `effect` at most once for the call's record and says what happened.
    ///
    /// Reads and naturally idempotent writes run at once, without the store. A write needs a key
    /// (or the tool's fallback window); its record is reserved before `effect` is even created, so a
    /// failed reservation never runs it.
    ///
    /// # Concurrent calls on the same key
    /// Exactly one call executes. The others wait up to the tool's wait bound for its outcome and
    /// replay it, or get [`Decision::InFlight`]. If the executing call releases the key
    /// ([`Effect::NotApplied`]), one waiting duplicate reserves it and executes.
    ///
    /// # Cancellation
    /// Dropping the future before `effect` starts leaves at most an in-flight reservation, which
    /// turns unknown when its lease ends; dropping it while `effect` runs is treated as a crash: the
    /// record turns unknown, and is never silently re-run.
    ///
    /// # Errors
    /// [`EngineError::KeyRequired`] for a write without key or fallback window,
    /// [`EngineError::KeyReuse`] when the key was used with other arguments,
    /// [`EngineError::ReserveFailed`] when the store failed at reservation (nothing ran), and
    /// [`EngineError::Store`] when a waiting duplicate could not read the record.
    pub fn call<'a, F, Fut>(
        &'a self,
        call: Call,
        effect: F,
    ) -> impl Future<Output = Result<Answer, EngineError>> + 'a
    where
        F: FnOnce() -> Fut + 'a,
        Fut: Future<Output = Effect> + 'a,
    {
        // Not an `async fn`: returning the inner future itself spares a copy of it per call.
        let policy = self.policies.get(call.tool.as_str());
        self.call_with_policy(call, policy, effect)
    }

    /// As [`Engine::call`], with `policy` instead of the tool's configured one (for front doors
    /// that take the policy per call, such as the command line).
    ///
    /// # Errors
    /// As [`Engine::call`].
    pub async fn call_with_policy<F, Fut>(
        &self,
        call: Call,
        policy: &ToolPolicy,
        effect: F,
    ) -> Result<Answer, EngineError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Effect>,
    {
        // Observe mode only: what a call nested in this one's side effect is compared with.
        let observed_as =
            (!policy.mode.is_enforce()).then(|| (call.tenant.clone(), call.tool.clone()));
        match self.begin(call, policy).await? {
            Begun::Answered(answer) => Ok(answer),
            Begun::PassThrough => Ok(Answer {
                key: None,
                rule: None,
                decision: Decision::PassedThrough {
                    effect: effect().instrument(effect_span()).await,
                },
            }),
            Begun::Observed { .. } => {
                let effect = effect().instrument(effect_span());
                let observed_as = observed_as.expect("only observe mode observes");
                Ok(Answer {
                    key: None,
                    rule: None,
                    decision: Decision::PassedThrough {
                        effect: Box::pin(OBSERVED_CALL.scope(observed_as, effect)).await,
                    },
                })
            }
            Begun::Execute(ticket) => {
                // The span only when it is exported: an untraced call's effect is polled bare,
                // and its future holds no span.
                let reported = if !traced() {
                    self.with_heartbeat(&ticket, effect()).await
                } else {
                    let traced = effect().instrument(effect_span());
                    Box::pin(self.with_heartbeat(&ticket, traced)).await
                };
                Ok(self.finish(&ticket, reported).await)
            }
        }
    }

    /// The first half of a call, for callers that run the side effect themselves (the HTTP
    /// coordination API): decides whether the call may run now. On [`Begun::Execute`] the caller
    /// holds the record's lease and must report what happened with [`Engine::finish`] (and renew
    /// the lease with [`Engine::heartbeat`] while it runs); every other decision is in the answer.
    ///
    /// # Concurrent calls on the same key
    /// As [`Engine::call`]: exactly one racing call gets [`Begun::Execute`]; the others wait up to
    /// the policy's bound for its outcome.
    ///
    /// # Errors
    /// As [`Engine::call`].
    pub async fn begin(&self, call: Call, policy: &ToolPolicy) -> Result<Begun, EngineError> {
        if traced() {
            // Boxed, and apart: an untraced call's future is what it was before spans.
            return Box::pin(self.begin_traced(call, policy)).await;
        }
        if self.observers.is_empty() {
            return self.decide(call, policy).await;
        }
        let (tenant, tool) = (call.tenant.clone(), call.tool.clone());
        let begun = self.decide(call, policy).await;
        self.observe_begun(&tenant, &tool, &begun);
        begun
    }

    /// [`Engine::begin`] inside its span, which then says what was decided.
    async fn begin_traced(&self, call: Call, policy: &ToolPolicy) -> Result<Begun, EngineError> {
        let span = tracing::info_span!(
            target: TRACE_TARGET,
            "idemgate.reserve",
            idemgate.decision = tracing::field::Empty,
        );
        let begun = self
            .begin_observed(call, policy)
            .instrument(span.clone())
            .await;
        let decision = match &begun {
            Ok(Begun::Execute(_)) => Verdict::Execute,
            Ok(Begun::PassThrough | Begun::Observed { .. }) => Verdict::PassedThrough,
            Ok(Begun::Answered(a)) => Verdict::of_answer(a),
            Err(e) => Verdict::of_error(e),
        };
        span.record("idemgate.decision", decision.label());
        begun
    }

    /// What [`Engine::begin`] decides, told to the observers: the traced path's. The untraced
    /// path spells the same lines in `begin` itself, so that its future has no layer more.
    async fn begin_observed(&self, call: Call, policy: &ToolPolicy) -> Result<Begun, EngineError> {
        if self.observers.is_empty() {
            return self.decide(call, policy).await;
        }
        let (tenant, tool) = (call.tenant.clone(), call.tool.clone());
        let begun = self.decide(call, policy).await;
        self.observe_begun(&tenant, &tool, &begun);
        begun
    }

    /// The record a call is judged by, the rule that named it and how long its outcome is kept;
    /// `None` for reads and naturally idempotent writes, which have no record. The one place
    /// record names are derived: a front door that needs the name before the call (to send the
    /// downstream key) asks here.
    ///
    /// In observe mode ([`crate::Mode::Observe`]) a write without key or fallback window has no
    /// record either: it runs, and `begin` tells the observers that enforce mode would have
    /// refused it.
    ///
    /// # Errors
    /// [`EngineError::KeyRequired`] for a write without key or fallback window (in enforce mode).
    pub fn key_for(&self, call: &Call, policy: &ToolPolicy) -> Result<Option<Named>, EngineError> {
        match decide::name(call.clone(), policy) {
            Err(EngineError::KeyRequired { .. }) if !policy.mode.is_enforce() => Ok(None),
            named => named,
        }
    }

    /// The ticket of a lease that `begin` handed out and a caller brings back (the HTTP
    /// coordination API): the record of `key` under `tenant` and `tool`, named by the rule the key
    /// itself shows (fallback keys are minted by the engine; explicit ones can never look like
    /// them, see [`IdempotencyKey::explicit`]), kept as long as that rule says.
    pub fn ticket_for(
        &self,
        tenant: TenantId,
        tool: ToolName,
        key: IdempotencyKey,
        lease: Lease,
        policy: &ToolPolicy,
    ) -> Ticket {
        let rule = KeyRule::of(&key);
        Ticket {
            key: Key::new(tenant, tool, key),
            rule,
            lease,
            keep: Keep::of(rule, policy),
            lease_for: policy.lease,
            fingerprint: None,
        }
    }
}

/// Whether the phases' spans go anywhere: a layer listens to [`TRACE_TARGET`]. One check of a
/// cached interest, so that an untraced call neither makes spans nor carries them (nor a door
/// reads a trace context only spans would use).
pub fn traced() -> bool {
    tracing::span_enabled!(target: TRACE_TARGET, tracing::Level::INFO)
}

/// The span of a side effect run between `begin` and `finish`: the context a door hands to the
/// tool (an upstream's `traceparent`), so the tool's own spans are its children.
pub fn effect_span() -> tracing::Span {
    tracing::info_span!(target: TRACE_TARGET, "idemgate.effect")
}

//! The engine: every decision of the contract, built on a [`Store`].

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
        }
    }

    /// Sets the scope the call was made in: the fallback window then joins only identical
    /// calls of the same scope (a model re-emitting a call in its conversation), never calls of
    /// another conversation with the same arguments. Explicit keys are not scoped: a caller that
    /// names the action names it everywhere.
    pub fn scope(mut self, scope: impl Into<Arc<str>>) -> Self {
        self.scope = Some(scope.into());
        self
    }

    /// What names the call's fallback record: its arguments' fingerprint, within its scope.
    fn window_fingerprint(&self) -> Fingerprint {
        match &self.scope {
            None => self.fingerprint,
            Some(scope) => {
                let mut bytes = Vec::with_capacity(8 + scope.len() + 32);
                bytes.extend_from_slice(&(scope.len() as u64).to_be_bytes());
                bytes.extend_from_slice(scope.as_bytes());
                bytes.extend_from_slice(self.fingerprint.as_bytes());
                Fingerprint::of_bytes(&bytes)
            }
        }
    }

    /// Sets the idempotency key.
    pub fn key(mut self, key: IdempotencyKey) -> Self {
        self.key = Some(key);
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
    /// The side effect did not happen: remove the record so the next call runs.
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
        match self.begin(call, policy).await? {
            Begun::Answered(answer) => Ok(answer),
            Begun::PassThrough => Ok(Answer {
                key: None,
                rule: None,
                decision: Decision::PassedThrough {
                    effect: effect().instrument(effect_span()).await,
                },
            }),
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
            Ok(Begun::PassThrough) => Verdict::PassedThrough,
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
    /// # Errors
    /// [`EngineError::KeyRequired`] for a write without key or fallback window.
    pub fn key_for(&self, call: &Call, policy: &ToolPolicy) -> Result<Option<Named>, EngineError> {
        name(call.clone(), policy)
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
        }
    }

    /// The decision of [`Engine::begin`], before the observers hear of it.
    async fn decide(&self, call: Call, policy: &ToolPolicy) -> Result<Begun, EngineError> {
        let fingerprint = call.fingerprint;
        let scope = call.scope.clone();
        let Some(Named { key, rule, keep }) = name(call, policy)? else {
            return Ok(Begun::PassThrough);
        };
        if let Some(done) = self.replays.get(&key, self.clock.now()) {
            if done.fingerprint != fingerprint {
                return Err(EngineError::KeyReuse {
                    key,
                    rule,
                    first_seen: done.created_at,
                });
            }
            replay_span(done.completed_at);
            return Ok(Begun::Answered(Answer {
                key: Some(key),
                rule: Some(rule),
                decision: done.into_replay(false),
            }));
        }
        // The key moves into the reservation and from there into the ticket or the answer: a
        // call clones no name on its way through the engine.
        let reservation = Reservation::new(key, fingerprint, policy.lease).with_scope(scope);
        match self.store.reserve(&reservation).await {
            Ok(Claim::Acquired(lease)) => Ok(executing(reservation, rule, keep, lease)),
            // A replay, the other common case, also answers without the slow path.
            Ok(Claim::Existing(record))
                if record.fingerprint == fingerprint
                    && matches!(record.state, RecordState::Completed { .. }) =>
            {
                let decision = self.replay(&reservation.key, record);
                Ok(answered(reservation, rule, decision))
            }
            // Waits, unknown records, key reuse and store errors: boxed, so that the common
            // call's future stays small (all of it is copied on every call).
            first => Box::pin(self.settle(reservation, rule, keep, policy, first)).await,
        }
    }

    /// Tells the observers what `begin` decided.
    fn observe_begun(
        &self,
        tenant: &TenantId,
        tool: &ToolName,
        begun: &Result<Begun, EngineError>,
    ) {
        let (key, verdict, fence, answer, error) = match begun {
            Ok(Begun::Execute(t)) => (
                Some(&t.key),
                Verdict::Execute,
                Some(t.lease.fence),
                None,
                None,
            ),
            Ok(Begun::PassThrough) => (None, Verdict::PassedThrough, None, None, None),
            Ok(Begun::Answered(a)) => (a.key.as_ref(), Verdict::of_answer(a), None, Some(a), None),
            Err(e) => {
                let key = match e {
                    EngineError::KeyReuse { key, .. } => Some(key),
                    _ => None,
                };
                (key, Verdict::of_error(e), None, None, Some(e))
            }
        };
        self.observers.observe(&Event::Call {
            tenant,
            tool,
            key,
            verdict,
            fence,
            answer,
            error,
        });
    }

    /// The replay of a completed record (remembered for the next duplicate).
    fn replay(&self, key: &Key, record: Record) -> Decision {
        let RecordState::Completed {
            outcome,
            completed_at,
            expires_at,
            ..
        } = record.state
        else {
            unreachable!("only completed records are replayed")
        };
        replay_span(completed_at);
        let done = Completed {
            fingerprint: record.fingerprint,
            created_at: record.created_at,
            outcome,
            completed_at,
            expires_at,
        };
        self.replays.put(key, done.clone());
        done.into_replay(false)
    }

    /// The slow path of [`Engine::begin`]: judges an existing record (or a failed reservation),
    /// waiting, taking over or verifying as the policy says, and reserving again when the record
    /// goes away meanwhile.
    async fn settle(
        &self,
        reservation: Reservation,
        rule: KeyRule,
        keep: Keep,
        policy: &ToolPolicy,
        first: Result<Claim, StoreError>,
    ) -> Result<Begun, EngineError> {
        let answer = |r: Reservation, decision| answered(r, rule, decision);
        let ticket = |r: Reservation, lease| executing(r, rule, keep, lease);
        let mut first = Some(first);
        // Only a waiting duplicate needs the clock; a fresh call or a replay does not read it.
        let mut deadline = None;
        loop {
            let reserved = match first.take() {
                Some(claim) => claim,
                None => self.store.reserve(&reservation).await,
            };
            let claim = match reserved {
                Ok(claim) => claim,
                Err(e) => {
                    // Unavailable: nothing reached the store, so nothing can have landed.
                    if !matches!(e, StoreError::Unavailable(_)) {
                        let budget = self.settings.abandon_budget;
                        let _ =
                            tokio::time::timeout(budget, self.abandon_reservation(&reservation))
                                .await;
                    }
                    return Err(EngineError::ReserveFailed(e));
                }
            };
            let record = match claim {
                Claim::Acquired(lease) => return Ok(ticket(reservation, lease)),
                Claim::Existing(record) => record,
            };
            if record.fingerprint != reservation.fingerprint {
                return Err(EngineError::KeyReuse {
                    key: reservation.key,
                    rule,
                    first_seen: record.created_at,
                });
            }
            match record.state {
                RecordState::Completed { .. } => {
                    let decision = self.replay(&reservation.key, record);
                    return Ok(answer(reservation, decision));
                }
                // The action ran and its outcome is no longer kept: never run again silently.
                RecordState::Expired {
                    completed_at,
                    expired_at,
                    retain_until,
                } => {
                    let decision = Decision::Expired {
                        executed_at: completed_at,
                        expired_at,
                        retain_until,
                        fence: record.fence,
                    };
                    return Ok(answer(reservation, decision));
                }
                RecordState::InFlight { lease_until } => {
                    let deadline = *deadline.get_or_insert_with(|| Instant::now() + policy.wait);
                    let waiting = self
                        .wait_while_in_flight(&reservation.key, deadline)
                        .instrument(tracing::info_span!(target: TRACE_TARGET, "idemgate.wait"));
                    match Box::pin(waiting).await? {
                        Waited::Left(seen) => first = seen.map(|r| Ok(Claim::Existing(r))),
                        Waited::TimedOut => {
                            let retry_after = retry_after(self.clock.now().until(lease_until));
                            return Ok(answer(
                                reservation,
                                Decision::InFlight {
                                    since: record.created_at,
                                    retry_after,
                                },
                            ));
                        }
                    }
                }
                RecordState::Unknown { since } => {
                    if let Some(left) = self.unknown_settle_left(&reservation.key) {
                        // The holder may still flush an outcome it journaled while the store was
                        // out of reach: watch the record a little before judging it.
                        let until = Instant::now() + left;
                        let still_unknown =
                            |s: &RecordState| matches!(s, RecordState::Unknown { .. });
                        if let Waited::Left(seen) =
                            Box::pin(self.wait_while(&reservation.key, until, still_unknown))
                                .await?
                        {
                            first = seen.map(|r| Ok(Claim::Existing(r)));
                            continue;
                        }
                    }
                    let found = |message| Decision::Unknown {
                        since,
                        fence: record.fence,
                        ran_here: false,
                        message,
                        recording: None,
                    };
                    let verifier = match policy.on_unknown {
                        UnknownPolicy::Block => return Ok(answer(reservation, found(None))),
                        UnknownPolicy::Retry => None,
                        UnknownPolicy::Verify => {
                            match self.verifiers.get(reservation.key.tool.as_str()) {
                                Some(v) => Some(v),
                                None => {
                                    let message = format!(
                                        "tool {} has unknown policy verify but no verifier is registered",
                                        reservation.key.tool
                                    );
                                    return Ok(answer(reservation, found(Some(message))));
                                }
                            }
                        }
                    };
                    // Somebody else changed the record first: look again.
                    let Some(lease) = Box::pin(self.take_over(&reservation, record.fence)).await?
                    else {
                        continue;
                    };
                    return match verifier {
                        None => Ok(ticket(reservation, lease)),
                        Some(v) => {
                            Box::pin(self.verify(&**v, reservation, rule, keep, lease, since)).await
                        }
                    };
                }
            }
        }
    }

    /// Asks `verifier` about a record this call took over from unknown (holding `lease`): runs the
    /// call if it did not happen, stores and replays the outcome if it did, and marks the record
    /// unknown again if the verifier cannot tell.
    async fn verify(
        &self,
        verifier: &dyn Verifier,
        reservation: Reservation,
        rule: KeyRule,
        keep: Keep,
        lease: Lease,
        since: Timestamp,
    ) -> Result<Begun, EngineError> {
        let probe = verifier.verify(&reservation.key).await;
        let decision = match probe {
            Ok(Probe::NotApplied) => return Ok(executing(reservation, rule, keep, lease)),
            Ok(Probe::Applied(outcome)) => {
                let op = JournalOp::complete(outcome, keep);
                let (done, _) = self.record(&reservation.key, lease, &op).await;
                let JournalOp::Complete { outcome, .. } = op else {
                    unreachable!("built as a completion above")
                };
                let done = done.unwrap_or_else(|| self.local_completion(keep.ttl));
                Decision::Replayed {
                    outcome,
                    executed_at: done.completed_at,
                    expires_at: done.expires_at,
                    verified: true,
                }
            }
            Ok(Probe::Unknown) | Err(_) => {
                let (marked, recording) = self.mark_unknown(&reservation.key, lease).await;
                let message = match probe {
                    Err(e) => format!("verifier failed: {e}"),
                    _ => "verifier could not tell".to_owned(),
                };
                // The takeover raised the fence: an operator resolves the record at the new one.
                Decision::Unknown {
                    since: marked.unwrap_or(since),
                    fence: lease.fence,
                    ran_here: false,
                    message: Some(message),
                    recording: Some(recording),
                }
            }
        };
        Ok(answered(reservation, rule, decision))
    }

    /// The second half of a call begun with [`Engine::begin`]: records what the side effect
    /// reported (with bounded retries, then the journal) and answers.
    ///
    /// # Concurrent calls on the same key
    /// Duplicates waiting on the record wake when it settles and replay what this records. Two
    /// `finish`es of one ticket are safe: completing again under the same lease returns the first
    /// completion, and releasing an absent record succeeds. A `finish` whose lease was taken over
    /// meanwhile (the side effect outlived its lease) stores nothing: its answer says
    /// [`Recording::LeaseLost`], and the record keeps the other holder's outcome.
    ///
    /// # Cancellation
    /// Each store write is one atomic step, so dropping the future leaves the record either as it
    /// was (in flight under this lease, turning unknown when the lease ends, for an operator) or
    /// settled, never half written; an outcome already journaled is flushed later. It never lets
    /// the side effect run again.
    pub async fn finish(&self, ticket: &Ticket, reported: Effect) -> Answer {
        if !traced() {
            return self.settle_outcome(ticket, reported).await;
        }
        let span = tracing::info_span!(
            target: TRACE_TARGET,
            "idemgate.complete",
            idemgate.recording = tracing::field::Empty,
        );
        // Boxed, as in `begin`: only a traced call pays for the span in its future.
        let answer = Box::pin(
            self.settle_outcome(ticket, reported)
                .instrument(span.clone()),
        )
        .await;
        let recording = match &answer.decision {
            Decision::Executed { recording, .. } | Decision::NotApplied { recording, .. } => {
                Some(recording)
            }
            Decision::Unknown { recording, .. } => recording.as_ref(),
            _ => None,
        };
        if let Some(recording) = recording {
            span.record("idemgate.recording", recording.name());
        }
        answer
    }

    /// What [`Engine::finish`] does, inside its span.
    async fn settle_outcome(&self, ticket: &Ticket, reported: Effect) -> Answer {
        let (key, lease, keep) = (&ticket.key, ticket.lease, ticket.keep);
        let decision = match reported {
            Effect::Success(body) => {
                self.store_outcome(key, lease, keep, Outcome::success(body))
                    .await
            }
            Effect::Failed(body) => {
                self.store_outcome(key, lease, keep, Outcome::failed(body))
                    .await
            }
            Effect::NotApplied { message, reply } => {
                let (_, recording) = self.record(key, lease, &JournalOp::Release).await;
                Decision::NotApplied {
                    message,
                    reply,
                    recording,
                }
            }
            Effect::Ambiguous(message) => {
                let (marked, recording) = self.mark_unknown(key, lease).await;
                Decision::Unknown {
                    since: marked.unwrap_or_else(|| self.clock.now()),
                    fence: lease.fence,
                    ran_here: true,
                    message: Some(message),
                    recording: Some(recording),
                }
            }
        };
        let answer = Answer {
            key: Some(ticket.key.clone()),
            rule: Some(ticket.rule),
            decision,
        };
        self.observers.observe(&Event::Call {
            tenant: &ticket.key.tenant,
            tool: &ticket.key.tool,
            key: Some(&ticket.key),
            verdict: Verdict::of_answer(&answer),
            fence: Some(ticket.lease.fence),
            answer: Some(&answer),
            error: None,
        });
        answer
    }

    /// Extends the lease of a call begun with [`Engine::begin`] while its side effect runs.
    ///
    /// # Concurrent calls on the same key
    /// Only the ticket's own lease is extended: a record taken over meanwhile (this holder's
    /// lease ran out and another call took it) answers [`StoreError::LeaseLost`], and the holder
    /// should stop and report what it did; its `finish` will say the lease was lost. A heartbeat
    /// racing the ticket's own `finish` extends nothing once the record is settled (it answers
    /// [`StoreError::LeaseLost`] then too).
    ///
    /// # Cancellation
    /// One atomic store write: dropping the future leaves the lease either extended or as it was.
    ///
    /// # Errors
    /// [`StoreError::LeaseLost`] when the record was taken over meanwhile, or the store's error.
    pub async fn heartbeat(&self, ticket: &Ticket) -> Result<Timestamp, StoreError> {
        self.store
            .heartbeat(&ticket.key, ticket.lease, ticket.lease_for)
            .await
    }

    /// Marks the record held under `lease` unknown (with bounded retries, then the journal).
    /// Returns since when the record says it is unknown, when the store took the mark: the
    /// store's clock set it, and the answer must say what the record and every later answer
    /// say, not the engine's own time a write later.
    async fn mark_unknown(&self, key: &Key, lease: Lease) -> (Option<Timestamp>, Recording) {
        let (_, recording) = self.record(key, lease, &JournalOp::MarkUnknown).await;
        if recording != Recording::Stored {
            return (None, recording);
        }
        // The ambiguous path only: one more read, for an answer that agrees with the record.
        let since = match self.store.get(key).await {
            Ok(Some(Record {
                fence,
                state: RecordState::Unknown { since },
                ..
            })) if fence == lease.fence => Some(since),
            _ => None,
        };
        (since, recording)
    }

    /// A completion time from the engine's clock, for outcomes the store has not confirmed.
    fn local_completion(&self, ttl: Duration) -> Completion {
        let now = self.clock.now();
        Completion {
            completed_at: now,
            expires_at: now.plus(ttl),
        }
    }

    async fn store_outcome(
        &self,
        key: &Key,
        lease: Lease,
        keep: Keep,
        outcome: Outcome,
    ) -> Decision {
        let op = JournalOp::complete(outcome, keep);
        let (done, recording) = self.record(key, lease, &op).await;
        let done = done.unwrap_or_else(|| self.local_completion(keep.ttl));
        let JournalOp::Complete { outcome, .. } = op else {
            unreachable!("built as a completion above")
        };
        Decision::Executed {
            outcome,
            executed_at: done.completed_at,
            expires_at: done.expires_at,
            recording,
        }
    }

    /// Drives `fut` to completion, extending the lease every third of its length meanwhile: for
    /// a door that runs the side effect itself between [`Engine::begin`] and [`Engine::finish`]
    /// (the Node addon, whose function reports its effect to a future awaited here).
    pub async fn with_heartbeat(
        &self,
        ticket: &Ticket,
        fut: impl Future<Output = Effect>,
    ) -> Effect {
        let mut fut = std::pin::pin!(fut);
        // A side effect that is done at its first poll needs no timer at all.
        let first = std::future::poll_fn(|cx| match fut.as_mut().poll(cx) {
            std::task::Poll::Ready(e) => std::task::Poll::Ready(Some(e)),
            std::task::Poll::Pending => std::task::Poll::Ready(None),
        })
        .await;
        if let Some(reported) = first {
            return reported;
        }
        Box::pin(self.heartbeat_until_done(ticket, fut)).await
    }

    /// The slow path of [`Engine::with_heartbeat`], boxed so that calls that finish at once do
    /// not carry its timer in their future.
    async fn heartbeat_until_done(
        &self,
        ticket: &Ticket,
        mut fut: Pin<&mut impl Future<Output = Effect>>,
    ) -> Effect {
        let every = (ticket.lease_for / 3).max(Duration::from_millis(1));
        let mut next = Instant::now() + every;
        loop {
            tokio::select! {
                biased;
                reported = &mut fut => return reported,
                _ = tokio::time::sleep_until(next) => {
                    // A failed heartbeat is not fatal: the next one may succeed, and a lease that
                    // is really lost shows up as LeaseLost when the outcome is recorded.
                    let _ = self.heartbeat(ticket).await;
                    next = Instant::now() + every;
                }
            }
        }
    }

    /// Applies a "done" write with bounded retries, then journals it. Returns the store's
    /// confirmation of a completion, if it gave one.
    async fn record(
        &self,
        key: &Key,
        lease: Lease,
        op: &JournalOp,
    ) -> (Option<Completion>, Recording) {
        match self.apply(key, lease, op, None).await {
            Ok(done) => (done, Recording::Stored),
            Err(StoreError::LeaseLost) => (None, Recording::LeaseLost),
            // Retries and the journal are the rare path: boxed, so that the common call's future
            // (all of which is copied on every call) does not carry their timers.
            Err(first) => Box::pin(self.record_after_failure(key, lease, op, first)).await,
        }
    }

    async fn record_after_failure(
        &self,
        key: &Key,
        lease: Lease,
        op: &JournalOp,
        first: StoreError,
    ) -> (Option<Completion>, Recording) {
        // When the side effect reported (the first attempt failed at once): what the record says
        // as its execution time once the journal is flushed, not the time of the flush.
        let reported_at = self.clock.now();
        let mut last = first;
        let mut backoff = self.settings.finish_backoff;
        for _ in 1..self.settings.finish_attempts.max(1) {
            if !last.is_transient() {
                break;
            }
            tokio::time::sleep(backoff).await;
            backoff = backoff.saturating_mul(2);
            match self.apply(key, lease, op, None).await {
                Ok(done) => return (done, Recording::Stored),
                Err(StoreError::LeaseLost) => return (None, Recording::LeaseLost),
                Err(e) => last = e,
            }
        }
        let entry = JournalEntry {
            key: key.clone(),
            lease,
            op: op.clone(),
            journaled_at: reported_at,
        };
        // A durable journal fsyncs: on a blocking thread, so the async workers keep serving.
        let journal = Arc::clone(&self.journal);
        let appended = tokio::task::spawn_blocking(move || journal.append(&entry))
            .instrument(tracing::info_span!(target: TRACE_TARGET, "idemgate.journal"))
            .await
            .unwrap_or_else(|e| Err(format!("the journal writer failed: {e}")));
        // The answer says the time the record will say once the journal is flushed (the flush
        // stores it as the completion time), not the time the retries and the journal took.
        let at_report = match op {
            JournalOp::Complete { ttl_ms, .. } => Some(Completion {
                completed_at: reported_at,
                expires_at: reported_at.plus(Duration::from_millis(*ttl_ms)),
            }),
            JournalOp::Release | JournalOp::MarkUnknown => None,
        };
        match appended {
            Ok(()) => {
                self.journaled.notify_one();
                (at_report, Recording::Journaled)
            }
            Err(e) => (at_report, Recording::Unrecorded(e)),
        }
    }

    /// Applies a "done" write; `executed_at` is when the side effect reported, for writes applied
    /// later than that (journal flushes).
    async fn apply(
        &self,
        key: &Key,
        lease: Lease,
        op: &JournalOp,
        executed_at: Option<Timestamp>,
    ) -> Result<Option<Completion>, StoreError> {
        match op {
            JournalOp::Complete {
                outcome,
                ttl_ms,
                tombstone_ms,
            } => self
                .store
                .complete_at(
                    key,
                    lease,
                    outcome,
                    JournalOp::keep(*ttl_ms, *tombstone_ms),
                    executed_at,
                )
                .await
                .map(Some),
            JournalOp::Release => self.store.release(key, lease).await.map(|()| None),
            JournalOp::MarkUnknown => self.store.mark_unknown(key, lease).await.map(|()| None),
        }
    }

    /// After a failed reservation, makes sure no reservation of ours is left behind to turn into a
    /// false "unknown": the reservation is retried with the same token (which finds our own record
    /// if the first attempt did land) and, if it is ours, released. Best effort and bounded.
    async fn abandon_reservation(&self, r: &Reservation) {
        for _ in 0..2 {
            match self.store.reserve(r).await {
                Ok(Claim::Acquired(lease)) => {
                    let _ = self.store.release(&r.key, lease).await;
                    return;
                }
                Ok(Claim::Existing(_)) => return,
                Err(_) => tokio::time::sleep(self.settings.finish_backoff).await,
            }
        }
    }

    /// Takes an unknown record over. `None` when somebody else changed it first (look again).
    async fn take_over(&self, r: &Reservation, stale: Fence) -> Result<Option<Lease>, EngineError> {
        match self.store.takeover(r, stale).await {
            Ok(Claim::Acquired(lease)) => Ok(Some(lease)),
            Ok(Claim::Existing(_)) => Ok(None),
            Err(e) => {
                // The takeover may have landed: put the record back to unknown, never to absent.
                let lease = Lease {
                    fence: stale + 1,
                    token: r.token,
                };
                let _ = self.store.mark_unknown(&r.key, lease).await;
                Err(EngineError::ReserveFailed(e))
            }
        }
    }

    /// Waits until the record is no longer in flight or the deadline passed.
    async fn wait_while_in_flight(
        &self,
        key: &Key,
        deadline: Instant,
    ) -> Result<Waited, EngineError> {
        self.wait_while(key, deadline, |s| matches!(s, RecordState::InFlight { .. }))
            .await
    }

    /// Waits until the record's state no longer satisfies `still` or the deadline passed.
    async fn wait_while(
        &self,
        key: &Key,
        deadline: Instant,
        still: impl Fn(&RecordState) -> bool,
    ) -> Result<Waited, EngineError> {
        // Looks before each wait, the first included, and takes the change mark before each
        // look: a change that lands between the look and the wait has moved the mark on, so the
        // wait ends at once instead of sleeping a whole slice past it.
        loop {
            let mark = self.store.change_mark(key);
            match self.store.get(key).await? {
                Some(Record { state, .. }) if still(&state) => {}
                seen => return Ok(Waited::Left(seen)),
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(Waited::TimedOut);
            }
            let slice = (deadline - now).min(self.settings.max_poll);
            self.store.wait_changed(key, mark, slice).await;
        }
    }

    /// How much longer a call must watch an unknown record before judging it: the rest of the
    /// settle window since this engine first found it unknown; `None` once that has passed.
    fn unknown_settle_left(&self, key: &Key) -> Option<Duration> {
        let settle = self.settings.unknown_settle;
        if settle.is_zero() {
            return None;
        }
        let now = Instant::now();
        let mut seen = self.unknown_seen.lock().unwrap_or_else(|p| p.into_inner());
        // Bounded: entries past their window only spare a later call the wait; drop them first.
        if seen.len() >= UNKNOWN_SEEN_MAX {
            seen.retain(|_, first| now.duration_since(*first) < settle);
            if seen.len() >= UNKNOWN_SEEN_MAX {
                seen.clear();
            }
        }
        let first = *seen.entry(key.clone()).or_insert(now);
        settle
            .checked_sub(now.duration_since(first))
            .filter(|d| !d.is_zero())
    }

    /// The record, if one counts.
    ///
    /// # Errors
    /// [`EngineError::Store`] when the store fails.
    pub async fn get(&self, key: &Key) -> Result<Option<Record>, EngineError> {
        Ok(self.store.get(key).await?)
    }

    /// Records that pass `filter`.
    ///
    /// # Errors
    /// [`EngineError::Store`] when the store fails.
    pub async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>, EngineError> {
        Ok(self.store.list(filter).await?)
    }

    /// Deletes expired completed records; returns how many.
    ///
    /// # Errors
    /// [`EngineError::Store`] when the store fails.
    pub async fn purge_expired(&self) -> Result<u64, EngineError> {
        Ok(self.store.purge_expired().await?)
    }

    /// Resolves an unknown record as an operator decided: by taking it over (a compare-and-set on
    /// `fence`, the fence the operator looked at) and completing or releasing it. `by` and
    /// `reason` say who and why, for the observers (the audit log).
    ///
    /// # Errors
    /// [`EngineError::NotFound`] when no record counts, [`EngineError::NotResolvable`] when it is
    /// not unknown or its fence moved on, [`EngineError::Store`] when the store fails.
    pub async fn resolve(
        &self,
        key: &Key,
        fence: Fence,
        resolution: Resolution,
        by: Option<&str>,
        reason: Option<&str>,
    ) -> Result<Option<Record>, EngineError> {
        let not_resolvable = |record: &Record| EngineError::NotResolvable {
            key: key.clone(),
            state: record.state_name(),
            fence: record.fence,
        };
        let record = self.operator_look(key).await?;
        if !matches!(record.state, RecordState::Unknown { .. }) || record.fence != fence {
            return Err(not_resolvable(&record));
        }
        let lease = self
            .take_over_unknown(&record)
            .await?
            .map_err(|now| not_resolvable(&now))?;
        let released = matches!(resolution, Resolution::Release);
        match resolution {
            Resolution::Completed { outcome, keep } => {
                self.store
                    .complete_at(key, lease, &outcome, keep, None)
                    .await?;
            }
            Resolution::Release => self.store.release(key, lease).await?,
        }
        self.observers.observe(&Event::Resolved {
            key,
            fence,
            released,
            by,
            reason,
        });
        Ok(self.store.get(key).await?)
    }

    /// Reopens a completed or unknown record, as an operator (or a program) decided: the record
    /// counts as absent from now on, so that the next call with its key runs the action again.
    /// A compare-and-set on `fence`, the fence the caller looked at. Reopening is the one way a
    /// completed outcome stops being replayed before it expires: this engine forgets its copy at
    /// once, other processes' engines within [`Settings::replay_cache_fresh`]. A completed record
    /// is expired now ([`Store::reopen`]); an unknown one is taken over at `fence` and completed
    /// with an expiry of now. Either way the record keeps its fence, the next call's reservation
    /// takes a higher one, and a reopening retried at `fence` is refused instead of reopening
    /// the new record. `by` and `reason` say who and why, for the observers (the audit log).
    /// Returns the state the record had.
    ///
    /// A record in flight is never reopened: its call may be running the action now, and a
    /// second call would run it concurrently. Once its lease ends it reads unknown.
    ///
    /// # Errors
    /// [`EngineError::NotFound`] when no record counts (an expired one included),
    /// [`EngineError::NotReopenable`] when it is in flight or its fence moved on,
    /// [`EngineError::Store`] when the store fails.
    pub async fn reopen(
        &self,
        key: &Key,
        fence: Fence,
        by: Option<&str>,
        reason: Option<&str>,
    ) -> Result<State, EngineError> {
        let not_reopenable = |record: &Record| EngineError::NotReopenable {
            key: key.clone(),
            state: record.state_name(),
            fence: record.fence,
        };
        let record = self.operator_look(key).await?;
        if record.fence != fence {
            return Err(not_reopenable(&record));
        }
        let was = record.state_name();
        match record.state {
            RecordState::InFlight { .. } => return Err(not_reopenable(&record)),
            RecordState::Completed { .. } | RecordState::Expired { .. } => {
                match self.store.reopen(key, fence).await? {
                    Reopened::Expired => {}
                    Reopened::Kept(Some(now)) => return Err(not_reopenable(&now)),
                    Reopened::Kept(None) => return Err(EngineError::NotFound { key: key.clone() }),
                }
            }
            RecordState::Unknown { .. } => {
                let lease = self
                    .take_over_unknown(&record)
                    .await?
                    .map_err(|now| not_reopenable(&now))?;
                // As a resolution to "completed" that expires at once, rather than a release: the
                // record keeps counting its fence up (see `Store::reopen`). Its outcome is never
                // replayed.
                let nothing = Outcome::failed(Vec::new());
                self.store
                    .complete(key, lease, &nothing, Duration::ZERO)
                    .await?;
            }
        }
        self.replays.remove(key);
        self.observers.observe(&Event::Reopened {
            key,
            fence,
            was,
            by,
            reason,
        });
        Ok(was)
    }

    /// The record an operator acts on, read from the store (never from the replay cache).
    async fn operator_look(&self, key: &Key) -> Result<Record, EngineError> {
        self.store
            .get(key)
            .await?
            .ok_or_else(|| EngineError::NotFound { key: key.clone() })
    }

    /// Takes the unknown `record` over at its fence for an operator, who then settles it. `Err`
    /// holds the record as it stands when somebody changed it first.
    async fn take_over_unknown(
        &self,
        record: &Record,
    ) -> Result<Result<Lease, Record>, EngineError> {
        let r = Reservation::new(
            record.key.clone(),
            record.fingerprint,
            Duration::from_secs(30),
        );
        Ok(match self.store.takeover(&r, record.fence).await? {
            Claim::Acquired(lease) => Ok(lease),
            Claim::Existing(now) => Err(now),
        })
    }

    /// Replays journaled writes into the store. Call it at start-up and now and then; entries the
    /// store still refuses stay for the next flush.
    ///
    /// # Errors
    /// [`EngineError::Journal`] when the journal cannot be read or an applied entry cannot be
    /// removed.
    pub async fn flush_journal(&self) -> Result<FlushReport, EngineError> {
        let flushed = self.flush_journal_entries().await;
        if !matches!(&flushed, Ok(r) if *r == FlushReport::default()) {
            self.observers.observe(&Event::Flushed(&flushed));
        }
        flushed
    }

    /// Flushes the journal now, then every `every` in a task of its own, for as long as the
    /// returned handle lives. The one place a front door starts it: call it once at start-up.
    pub fn spawn_journal_flusher(self: &Arc<Self>, every: Duration) -> JournalFlusher
    where
        S: 'static,
    {
        let engine = Arc::clone(self);
        let journaled = Arc::clone(&self.journaled);
        JournalFlusher(tokio::spawn(async move {
            loop {
                // While entries wait for the store, try again soon: other processes hold off
                // judging the records for only `Settings::unknown_settle` after the store is back.
                let next = match engine.flush_journal().await {
                    Ok(r) if r.pending == 0 => every,
                    _ => FLUSH_RETRY,
                };
                tokio::select! {
                    () = tokio::time::sleep(next) => {}
                    () = journaled.notified() => {}
                }
            }
        }))
    }

    async fn flush_journal_entries(&self) -> Result<FlushReport, EngineError> {
        let entries = self.journal.pending().map_err(EngineError::Journal)?;
        if entries.is_empty() {
            return Ok(FlushReport::default());
        }
        // A span only for a flush that has something to send: the flusher looks every 30 s.
        let span = tracing::info_span!(
            target: TRACE_TARGET,
            "idemgate.flush",
            idemgate.entries = entries.len(),
            idemgate.applied = tracing::field::Empty,
            idemgate.pending = tracing::field::Empty,
        );
        let flushed = self.apply_entries(entries).instrument(span.clone()).await;
        if let Ok(report) = &flushed {
            span.record("idemgate.applied", report.applied);
            span.record("idemgate.pending", report.pending);
        }
        flushed
    }

    async fn apply_entries(&self, entries: Vec<JournalEntry>) -> Result<FlushReport, EngineError> {
        let mut report = FlushReport::default();
        for entry in entries {
            match self
                .apply(&entry.key, entry.lease, &entry.op, Some(entry.journaled_at))
                .await
            {
                Ok(_) => report.applied += 1,
                Err(StoreError::LeaseLost) => report.superseded += 1,
                Err(_) => {
                    report.pending += 1;
                    continue;
                }
            }
            self.journal.remove(&entry).map_err(EngineError::Journal)?;
        }
        Ok(report)
    }
}

/// Most records an engine remembers having found unknown (see [`Settings::unknown_settle`]).
const UNKNOWN_SEEN_MAX: usize = 10_000;

/// Names the record of a call (see [`Engine::key_for`]).
fn name(call: Call, policy: &ToolPolicy) -> Result<Option<Named>, EngineError> {
    if policy.kind != ToolKind::Write {
        return Ok(None);
    }
    // Only a call the window names needs it (a scoped one costs a digest).
    let window_fingerprint = call.key.is_none().then(|| call.window_fingerprint());
    let named = match (call.key, policy.fallback_window) {
        (Some(k), _) => Named {
            key: Key::new(call.tenant, call.tool, k),
            rule: KeyRule::Explicit,
            keep: Keep::of(KeyRule::Explicit, policy),
        },
        (None, Some(_)) => Named {
            key: Key::fallback(
                call.tenant,
                call.tool,
                &window_fingerprint.expect("computed for every call without a key"),
            ),
            rule: KeyRule::Fallback,
            keep: Keep::of(KeyRule::Fallback, policy),
        },
        (None, None) => {
            return Err(EngineError::KeyRequired {
                tool: call.tool.to_string(),
            })
        }
    };
    Ok(Some(named))
}

/// How a wait for a record to leave a state ended.
enum Waited {
    /// The record left it: what the wait's last look found (`None`: no record, or one expired).
    /// The caller judges that record as a reservation's answer, rather than reserving again
    /// only to read it anew: after a storm's winner completes, each waiting duplicate then makes
    /// one read instead of a read and a reservation (on Postgres, a read and an insert that
    /// conflicts, then a read). Only an absent record is reserved again.
    Left(Option<Record>),
    /// The deadline passed first.
    TimedOut,
}

fn answered(r: Reservation, rule: KeyRule, decision: Decision) -> Begun {
    Begun::Answered(Answer {
        key: Some(r.key),
        rule: Some(rule),
        decision,
    })
}

fn executing(r: Reservation, rule: KeyRule, keep: Keep, lease: Lease) -> Begun {
    Begun::Execute(Ticket {
        key: r.key,
        rule,
        lease,
        keep,
        lease_for: r.lease_for,
    })
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

/// A replay, marked where it is decided (a moment, not a phase: its time is the reservation's).
fn replay_span(executed_at: Timestamp) {
    let span = tracing::info_span!(
        target: TRACE_TARGET,
        "idemgate.replay",
        idemgate.executed_at = tracing::field::Empty,
    );
    if !span.is_disabled() {
        span.record("idemgate.executed_at", tracing::field::display(executed_at));
    }
}

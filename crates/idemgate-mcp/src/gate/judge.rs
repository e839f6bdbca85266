//! Judging one `tools/call`: reading it, naming its key and policy, taking the key out of the
//! action (and filling a declared key argument with the record's digest), running it through the
//! engine at most once, and answering it ([`super::answer`]). What the server's answer means for
//! the side effect is said here too: the peer only carries it.
//!
//! Apart from the rest of the gate because it is the one part that holds the engine: the
//! catalog and the answers are pure, the judge decides.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use idemgate_core::{
    Answer, Call, Decision, Effect, Engine, EngineError, Event, IdempotencyKey, OutcomeKind, Store,
    TenantId, ToolKind, ToolName, ToolPolicy, Verdict,
};
use idemgate_kit::identity::{self, Facts, Rule, Scope};
use idemgate_kit::Payload;
use serde::Deserialize;
use serde_json::value::RawValue;
use tracing::Instrument as _;

use super::answer::{self, CallContext, Named, META_CALL_ID, META_CONVERSATION, META_KEY};
use super::catalog::{Tool, KEY_ARGUMENTS};
use super::commerce::Reading;
use super::CarriedKey;
use crate::config::{record_tool, Config, KeySource, Profile, DEFAULT_WINDOW};
use crate::peer::{Forwarded, Peer, Reply};
use crate::wire::frame::{self, Object};

/// The calls in flight in this process, across its sessions: one alone may write on the
/// proxy's own thread.
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// One call counted in [`IN_FLIGHT`] while it lives.
struct InFlight;

impl InFlight {
    fn enter() -> Self {
        IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
        InFlight
    }

    fn alone() -> bool {
        IN_FLIGHT.load(Ordering::SeqCst) == 1
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What judges a session's calls: the engine, the configuration, and whose calls they are.
pub(crate) struct Judge<S> {
    engine: Arc<Engine<S>>,
    config: Config,
    /// The server's name in record names.
    server: String,
    tenant: TenantId,
    /// The scope of the session's calls that name no conversation
    /// (`_meta["dev.idemgate/conversation"]`): the model's keys and the fallback window reach
    /// no call outside it. `None` for the child that sessionless (MCP 2026-07-28) requests of
    /// many clients share: each such request is then a scope of its own.
    scope: Option<Arc<str>>,
}

/// A `tools/call` as the judge reads it.
pub(crate) struct Request<'a> {
    /// The client's request id.
    id: &'a RawValue,
    params: &'a Object,
    /// The server's name for the tool.
    pub(crate) name: String,
    /// The record scope (`<server>/<tool>`).
    scope: ToolName,
    /// Whether the request speaks an era whose results carry `resultType`.
    pub(crate) result_type: bool,
}

/// A call judged ready to go: what the engine records, under which policy, and the frame for
/// the server.
pub(crate) struct Prepared {
    call: Call,
    /// The call of the re-emission window that a call id's record holds inside it.
    window: Option<Call>,
    policy: ToolPolicy,
    /// What judging found that the answers tell.
    named: Named,
    /// Whether the call carries an x402 payment (always, outside x402): the binding reads a
    /// payment demand by it.
    paid: bool,
    /// The client's frame, the key taken out of its arguments (or a declared key argument
    /// filled with the record's digest).
    pub(crate) frame: String,
}

impl<S: Store> Judge<S> {
    /// The judge of one session of `server` for `tenant`; `shared` when the session is the
    /// child that sessionless requests of any client share (no scope of its own then).
    pub(crate) fn new(
        engine: Arc<Engine<S>>,
        config: Config,
        server: String,
        tenant: TenantId,
        shared: bool,
    ) -> Self {
        Judge {
            engine,
            config,
            server,
            tenant,
            scope: (!shared).then(|| Arc::from(Scope::fresh("session"))),
        }
    }

    /// The proxy's configuration.
    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    /// How the answers to `request` name things, under `policy`, with what judging found.
    fn context<'a>(
        &'a self,
        request: &'a Request<'_>,
        policy: &'a ToolPolicy,
        named: Named,
    ) -> CallContext<'a> {
        CallContext {
            named,
            id: request.id,
            tool: &request.name,
            scope: request.scope.as_str(),
            tenant: self.tenant.as_str(),
            policy,
            profile: self.config.profile,
            replay_notice: self.config.replay_notice,
            result_type: request.result_type,
        }
    }

    /// Reads the `tools/call` whose request id is `id` and whose params are `params`: the
    /// request and its arguments, or the answer that refuses it (no name, or arguments that
    /// are not an object).
    pub(crate) fn read<'a>(
        &self,
        id: &'a RawValue,
        params: &'a Object,
    ) -> Result<(Request<'a>, Object), String> {
        let name = frame::string(params, "name").unwrap_or_default();
        let scope = record_tool(&self.server, if name.is_empty() { "-" } else { &name });
        let arguments = match params.get("arguments") {
            None => Some(Object::new()),
            Some(a) if a.get() == "null" => Some(Object::new()),
            Some(a) => frame::object(a),
        };
        let request = Request {
            id,
            params,
            name,
            scope,
            result_type: answer::wants_result_type(params),
        };
        match (request.name.is_empty(), arguments) {
            (false, Some(arguments)) => Ok((request, arguments)),
            _ => Err(self.refuse(
                &request,
                &ToolPolicy::default(),
                "tools/call needs params.name and, if any, params.arguments as an object; nothing was done.".to_owned(),
            )),
        }
    }

    /// Judges `request` with its `arguments` (the client's frame `line`), given what the
    /// server said of its tool: its policy and key, the call the engine records, the frame for
    /// the server; or the answer that refuses it.
    pub(crate) fn prepare(
        &self,
        request: &Request<'_>,
        mut arguments: Object,
        tool: Option<&Tool>,
        carried: CarriedKey,
        line: String,
    ) -> Result<Prepared, String> {
        let mut policy = self.config.policy(&request.name, tool);
        let keys = match self.keys_of(request.params, &arguments, carried) {
            Ok(k) => k,
            Err(e) => return Err(self.refuse(request, &policy, format!("{e}; nothing was done."))),
        };
        if self.config.profile == Some(Profile::X402) {
            if keys.paid {
                // A payment is named by its identifier (or a key every call can carry), never by
                // a window: nothing else tells its retry from a new payment.
                policy.fallback_window = None;
            } else {
                // Without a payment the call asks the price, and the flow needs the server's
                // demand: the window names it (a free tool's retry within it is caught), and a
                // payment demand releases it.
                policy.fallback_window.get_or_insert(DEFAULT_WINDOW);
            }
        }
        let declared = tool.and_then(|t| t.key_argument.as_deref());
        let (stripped, kept) = strip_keys(&mut arguments, declared);
        // What the call is compared by: its arguments, or what its protocol compares.
        let compared = match self.config.profile {
            Some(profile) => profile.compared(request.params, &arguments),
            None => frame::raw(&arguments),
        };
        let (call, rule, window) = match self.call_of(request, &compared, &keys, &policy.identity) {
            Ok(c) => c,
            Err(e) => return Err(self.refuse(request, &policy, e)),
        };
        // The record's name, asked once when the server gets its key (a declared key argument,
        // a commerce binding's meta).
        let record = (declared.is_some() || self.config.profile.is_some())
            .then(|| self.engine.key_for(&call, &policy).ok().flatten())
            .flatten()
            .map(|named| named.key);
        let filled = fill_key(record.as_ref(), declared, kept, &mut arguments);
        let rewritten =
            self.put_downstream_key(&request.name, &call, record.as_ref(), &mut arguments);
        let frame = if stripped || filled || rewritten {
            frame::with_arguments(&line, &arguments).unwrap_or(line)
        } else {
            line
        };
        Ok(Prepared {
            call,
            window,
            named: Named {
                rule: Some(rule),
                hinted_read_only: policy.kind == ToolKind::Write
                    && !self.config.trusted
                    && tool.is_some_and(|t| t.read_only),
                // Unknown tools are taken as open: the notice is then in both channels, which
                // a strict schema would refuse only for a tool the listing did not show.
                open_output: tool.is_none_or(|t| t.open_output),
            },
            policy,
            paid: keys.paid,
            frame,
        })
    }

    /// The call the engine records for `request`: what it is compared by (`text`, its
    /// arguments with the keys taken out), and its key and scope as the kit's one rule names
    /// them from `keys` (`idemgate_kit::identity`); why not when the arguments are not valid
    /// JSON or the keys name no action.
    fn call_of(
        &self,
        request: &Request<'_>,
        text: &RawValue,
        keys: &Keys,
        identity: &[String],
    ) -> Result<(Call, Rule, Option<Call>), String> {
        // The window (of a call without a key, and the one a call id's record holds, cloned from
        // this call below) names the action by the tool's identity fields.
        let call = Call::new(self.tenant.clone(), request.scope.clone())
            .args_text(text.get().as_bytes())
            .map_err(|e| format!("the arguments are not valid JSON: {e}."))?
            .identity(text.get().as_bytes(), identity);
        // The scope: the conversation the client names, else this session, else (a request of
        // a sessionless client) the request itself: a model's key or the window never reaches
        // another client's calls.
        let conversation = request
            .params
            .get("_meta")
            .and_then(|m| frame::object(m))
            .and_then(|m| frame::string(&m, META_CONVERSATION))
            .filter(|c| !c.is_empty());
        let scope = match (conversation, &self.scope) {
            (Some(c), _) => Scope::conversation(&c),
            (None, Some(session)) => session.to_string(),
            (None, None) => Scope::fresh("request"),
        };
        let identity = identity::identify(&Facts {
            scope: Some(&scope),
            orchestration_key: keys.orchestration.as_ref().map(IdempotencyKey::as_str),
            model_key: keys.model.as_deref(),
            call_id: keys.call_id.as_deref(),
            ..Facts::default()
        })
        .map_err(|e| format!("{e}; nothing was done."))?;
        let call = match identity.scope {
            Some(s) => call.scope(s),
            None => call,
        };
        // A call id's record holds the window's (`Judge::run`); a call without any key is the
        // window's alone, as the tool's policy gives it one.
        let window = (identity.window && identity.key.is_some()).then(|| call.clone());
        let call = match identity.key {
            Some(k) => call.key(k).key_named_by(identity.rule.key_rule()),
            None => call,
        };
        Ok((call, identity.rule, window))
    }

    /// The server of a commerce binding gets the call's downstream key in the binding's place
    /// ([`Profile::put_downstream_key`]): the record's when the call has one, else (a read, a
    /// natural-idempotent tool) its key's as the record's would be. Never the model's string.
    /// Whether the arguments changed.
    fn put_downstream_key(
        &self,
        tool: &str,
        call: &Call,
        record: Option<&idemgate_core::Key>,
        arguments: &mut Object,
    ) -> bool {
        let Some(profile) = self.config.profile else {
            return false;
        };
        let digest = match (record, &call.key) {
            (Some(record), _) => record.digest(),
            (None, Some(key)) => {
                idemgate_core::Key::new(call.tenant.clone(), call.tool.clone(), key.clone())
                    .digest()
            }
            (None, None) => return false,
        };
        profile.put_downstream_key(arguments, &digest, profile.binds(tool))
    }

    /// Runs a prepared call at most once: the engine decides, and when the call is to run the
    /// peer forwards it and waits for the server's answer; returns the frame that answers it.
    pub(crate) async fn run(
        &self,
        request: &Request<'_>,
        prepared: Prepared,
        peer: &Peer,
    ) -> String {
        let Prepared {
            call,
            window,
            policy,
            named,
            paid,
            frame,
        } = prepared;
        let id = frame::id_key(request.id);
        let write = policy.kind == ToolKind::Write;
        let timeout = self.config.call_timeout;
        let mut relay = None;
        // The client's trace context, as MCP carries it: in the request's `_meta`. Read only for
        // spans: without them the frame carries it on to the server as it came.
        let meta = (idemgate_core::traced())
            .then(|| request.params.get("_meta").and_then(|m| frame::object(m)))
            .flatten();
        let caller = meta.as_ref().and_then(|m| {
            idemgate_trace::TraceContext::from_carrier(|name| {
                m.get(name)
                    .and_then(|v| serde_json::from_str::<&str>(v.get()).ok())
            })
        });
        let span = idemgate_trace::call_span(
            idemgate_trace::Door::Mcp,
            self.tenant.as_str(),
            &request.name,
            None,
            caller.as_ref(),
        );
        if !span.is_disabled() {
            use idemgate_trace::SpanExt as _;
            span.set_attribute("mcp.method.name", "tools/call");
            span.set_attribute("jsonrpc.request.id", id.clone());
            span.set_attribute("idemgate.record_tool", request.scope.to_string());
        }
        // The call sent to the server: what it says of the side effect, and its answer.
        let send = || {
            // Inside the engine's `idemgate.effect`: the server's spans are its children.
            let frame = match idemgate_trace::outgoing(caller.as_ref()) {
                Some(ours) if Some(&ours) != caller.as_ref() => {
                    frame::with_trace(&frame, &ours).unwrap_or(frame)
                }
                _ => frame,
            };
            let profile = self.config.profile.map(|p| (p, paid));
            async move { effect(peer.forward(id, frame, write, timeout).await, profile) }
        };
        // The only call in flight in this process (every session's) may have its writes done on
        // this thread: nothing else waits for it (`idemgate_core::caller::alone`).
        let _in_flight = InFlight::enter();
        let result = idemgate_core::caller::alone(InFlight::alone, async {
            match window {
                None => {
                    self.engine
                        .call_with_policy(call, &policy, || async {
                            let (effect, reply) = send().await;
                            relay = reply;
                            effect
                        })
                        .instrument(span.clone())
                        .await
                }
                // A call id names the action within its scope, and an identical call of the scope
                // within the window is the same action under a new id (the model re-emitting it):
                // the call id's record first, and inside it the window's, always in that order (as
                // the packages do), so two calls never wait for each other in a cycle.
                Some(window_call) => {
                    let window_policy = ToolPolicy {
                        fallback_window: Some(policy.fallback_window.unwrap_or(DEFAULT_WINDOW)),
                        ..policy.clone()
                    };
                    let mut inner = None;
                    let outer = self
                        .engine
                        .call_with_policy(call, &policy, || async {
                            let r = self
                                .engine
                                .call_with_policy(window_call, &window_policy, || async {
                                    let (effect, reply) = send().await;
                                    relay = reply;
                                    effect
                                })
                                .await;
                            let effect = effect_of_window(&r);
                            inner = Some(r);
                            effect
                        })
                        .instrument(span.clone())
                        .await;
                    answer_of_window(outer, inner)
                }
            }
        })
        .await;
        idemgate_trace::record(&span, &result);
        answer::respond(&self.context(request, &policy, named), result, relay)
    }

    /// The proxy's answer to a call it could not judge (its params or key are invalid), told to
    /// the observers like every other verdict.
    fn refuse(&self, request: &Request<'_>, policy: &ToolPolicy, text: String) -> String {
        self.engine.observe(&Event::Call {
            tenant: &self.tenant,
            tool: &request.scope,
            key: None,
            verdict: Verdict::BadRequest,
            fence: None,
            answer: None,
            error: None,
        });
        answer::refuse(
            &self.context(request, policy, Named::default()),
            Verdict::BadRequest,
            text,
        )
    }

    /// The call's keys: the orchestration layer's (the one its transport carried, `carried`,
    /// and those in `_meta` and `params.idempotencyKey`, as the configuration's sources name
    /// them) and the model's (a key argument). A key is a string of the key's form; a source
    /// holding anything else is an error, not an absent key (JSON `null` is absent). When several
    /// orchestration sources hold a key they must agree: a call whose keys differ is refused,
    /// on every transport, since it does not say which action it names. Which of them names the
    /// action is the kit's rule ([`Judge::call_of`]).
    fn keys_of(
        &self,
        params: &Object,
        arguments: &Object,
        carried: CarriedKey,
    ) -> Result<Keys, String> {
        let mut found: Vec<(IdempotencyKey, String)> = Vec::new();
        let mut model: Vec<(IdempotencyKey, String)> = Vec::new();
        found.extend(carried_key(carried)?);
        let meta = params.get("_meta").and_then(|m| frame::object(m));
        for source in &self.config.key_sources {
            match source {
                KeySource::Meta => {
                    if let Some(v) = meta.as_ref().and_then(|m| m.get(META_KEY)) {
                        found.extend(key_in(v, format!("_meta[\"{META_KEY}\"]"))?);
                    }
                }
                KeySource::Params => {
                    if let Some(v) = params.get("idempotencyKey") {
                        found.extend(key_in(v, "params.idempotencyKey".to_owned())?);
                    }
                }
                KeySource::Argument => {
                    for k in KEY_ARGUMENTS {
                        if let Some(v) = arguments.get(k) {
                            model.extend(key_in(v, format!("argument {k}"))?);
                        }
                    }
                }
            }
        }
        // Where the call's protocol puts its keys (`commerce`).
        let mut paid = true;
        if let Some(profile) = self.config.profile {
            let keys = profile.keys(params, arguments)?;
            found.extend(keys.orchestration);
            model.extend(keys.model);
            paid = keys.paid;
        }
        let call_id = match meta.as_ref().and_then(|m| m.get(META_CALL_ID)) {
            Some(v) if v.get() != "null" => Some(
                serde_json::from_str::<String>(v.get())
                    .ok()
                    .filter(|id| !id.is_empty() && id.len() <= MAX_CALL_ID_LEN)
                    .ok_or_else(|| {
                        format!("_meta[\"{META_CALL_ID}\"] must be a string of 1 to {MAX_CALL_ID_LEN} bytes")
                    })?,
            ),
            _ => None,
        };
        Ok(Keys {
            orchestration: agreed(found)?,
            model: agreed(model)?.map(|k| k.as_str().to_owned()),
            call_id,
            paid,
        })
    }
}

/// The keys a call carries, by who chose them.
struct Keys {
    /// The orchestration layer's: names the action in every scope.
    orchestration: Option<IdempotencyKey>,
    /// The model's (an argument): names an action within the call's scope only.
    model: Option<String>,
    /// The framework's tool-call id (`_meta["dev.idemgate/tool-call-id"]`, where the packages'
    /// MCP integrations send it): names an action within the call's scope, with the window.
    call_id: Option<String>,
    /// False for an x402 call without a payment (`commerce`): it asks the price.
    paid: bool,
}

/// The longest tool-call id taken (ids are hashed into the record's key, never stored as
/// they are; OpenAI's are about 30 bytes).
const MAX_CALL_ID_LEN: usize = 512;

/// What the call id's record stores when the window's call inside it ends as `inner`: the same
/// outcome (the window's replay included, so that the call id re-sent replays it too), nothing
/// when the window refused before anything ran (the call id's record is released), an
/// ambiguous effect when the window's record says the side effect may have run.
fn effect_of_window(inner: &Result<Answer, EngineError>) -> Effect {
    let Ok(answer) = inner else {
        return match inner {
            // Neither stored nor journaled: it ran, and nobody knows its outcome.
            Err(EngineError::Journal(why)) => Effect::Ambiguous(why.to_string()),
            _ => Effect::not_applied("the re-emission window refused the call"),
        };
    };
    if let Some(outcome) = answer.outcome() {
        return match outcome.kind {
            OutcomeKind::Success => Effect::Success(outcome.body),
            OutcomeKind::Failed => Effect::Failed(outcome.body),
        };
    }
    match &answer.decision {
        // Observe mode ran the call past the window's standing record: what the server did
        // is the call id's record's outcome, whatever it was.
        Decision::PassedThrough { effect } => effect.clone(),
        Decision::NotApplied { message, .. } => Effect::not_applied(message.clone()),
        Decision::Unknown {
            ran_here: true,
            message,
            ..
        } => Effect::Ambiguous(
            message
                .clone()
                .unwrap_or_else(|| "the outcome is unknown".to_owned()),
        ),
        _ => Effect::not_applied("the re-emission window refused the call"),
    }
}

/// The answer to a call whose call id's record ended as `outer`, and the window's call inside
/// it (when it ran) as `inner`: the window's answer when it took the call for a repeat (its
/// notice says so) or refused it, else the call id's.
fn answer_of_window(
    outer: Result<Answer, EngineError>,
    inner: Option<Result<Answer, EngineError>>,
) -> Result<Answer, EngineError> {
    match inner {
        Some(Ok(a)) if matches!(a.decision, Decision::Executed { .. }) => outer,
        Some(inner) => inner,
        None => outer,
    }
}

/// A server that declares a key argument (`declared`) gets the digest of the call's `record`
/// in it: the same logical action always sends the same downstream key, whichever proxy
/// process sends it. Reads and natural-idempotent tools have no record: the client's value
/// (`kept`) stays. Whether the digest was filled in.
fn fill_key(
    record: Option<&idemgate_core::Key>,
    declared: Option<&str>,
    kept: Option<Box<RawValue>>,
    arguments: &mut Object,
) -> bool {
    let Some(param) = declared else {
        return false;
    };
    match record {
        Some(key) => {
            let digest = idemgate_core::key::hex(&key.digest());
            arguments.insert(param.to_owned(), frame::raw(&digest));
            true
        }
        None => {
            if let Some(v) = kept {
                arguments.insert(param.to_owned(), v);
            }
            false
        }
    }
}

/// The one key of `found` (from several sources), or why they disagree.
fn agreed(found: Vec<(IdempotencyKey, String)>) -> Result<Option<IdempotencyKey>, String> {
    let mut found = found.into_iter();
    let Some((key, from)) = found.next() else {
        return Ok(None);
    };
    if let Some((other, other_from)) = found.find(|(k, _)| *k != key) {
        return Err(format!(
            "the idempotency keys in {from} ({}) and in {other_from} ({}) differ",
            key.as_str(),
            other.as_str()
        ));
    }
    Ok(Some(key))
}

/// The key in `value`, a source of the call named `from` (JSON `null` is none); why not when it
/// holds something else than a key.
pub(super) fn key_in(
    value: &RawValue,
    from: String,
) -> Result<Option<(IdempotencyKey, String)>, String> {
    if value.get() == "null" {
        return Ok(None);
    }
    let Ok(text) = serde_json::from_str::<String>(value.get()) else {
        let mut shown: String = value.get().chars().take(40).collect();
        if shown.len() < value.get().len() {
            shown.push('…');
        }
        return Err(format!(
            "the idempotency key in {from} must be a string, not {shown}"
        ));
    };
    match IdempotencyKey::explicit(text) {
        Ok(k) => Ok(Some((k, from))),
        Err(e) => Err(format!("the idempotency key in {from} is invalid: {e}")),
    }
}

/// The key its transport carried beside the call, named for the answer that refuses it.
fn carried_key(carried: CarriedKey) -> Result<Option<(IdempotencyKey, String)>, String> {
    let Some(carried) = carried else {
        return Ok(None);
    };
    let header = "the Idempotency-Key header";
    let key = carried.map_err(|e| {
        if e.starts_with(header) {
            e
        } else {
            format!("{header} is invalid: {e}")
        }
    })?;
    Ok(Some((key, header.to_owned())))
}

/// The key is not part of the action: calls that differ only in it are the same action. Takes
/// the key arguments out of `arguments` but the one the tool declares (`declared`); whether one
/// was taken out, and the declared one's value.
fn strip_keys(arguments: &mut Object, declared: Option<&str>) -> (bool, Option<Box<RawValue>>) {
    let mut stripped = false;
    let mut kept = None;
    for k in KEY_ARGUMENTS {
        if let Some(v) = arguments.remove(k) {
            if Some(k) == declared {
                kept = Some(v);
            } else {
                stripped = true;
            }
        }
    }
    (stripped, kept)
}

/// What became of a forwarded call says about its side effect, and the server's answer for the
/// client when it came.
/// `profile`: the commerce binding the server speaks, and whether the call carried a payment.
fn effect(forwarded: Forwarded, profile: Option<(Profile, bool)>) -> (Effect, Option<Reply>) {
    let (reply, refused) = match forwarded {
        Forwarded::NotSent(why) => return (Effect::not_applied(why), None),
        Forwarded::Sent { reply, refused } => (reply, refused),
    };
    if let (Some((profile, paid)), Reply::Answer { result, error, .. }) = (profile, &reply) {
        // Its caller gets the server's answer either way.
        match profile.reads_answer(result.as_deref(), error.as_deref(), paid) {
            Some(Reading::Released) => {
                return (
                    Effect::not_applied("the server answered that it did nothing"),
                    Some(reply),
                )
            }
            Some(Reading::Unknown(why)) => return (Effect::Ambiguous(why.to_owned()), Some(reply)),
            None => {}
        }
    }
    let mut effect = effect_of(&reply);
    if let Some(method) = refused {
        // The proxy refused the server's request during this call: a failure may be the
        // proxy's doing, not the tool's, and is never stored as the tool's outcome. What the
        // tool did before it asked is not known either: the outcome is unknown.
        if matches!(effect, Effect::Failed(_)) {
            effect = Effect::Ambiguous(format!(
                "the tool failed after the proxy refused the server's {method} request (the client speaks MCP 2026-07-28, which takes no server requests); the failure may be the proxy's doing"
            ));
        }
    }
    (effect, Some(reply))
}

/// What the answer says about the side effect.
fn effect_of(reply: &Reply) -> Effect {
    #[derive(Deserialize)]
    struct Shape {
        #[serde(rename = "isError", default)]
        is_error: bool,
        #[serde(rename = "resultType", default)]
        result_type: Option<String>,
    }
    match reply {
        Reply::Answer {
            result: Some(r), ..
        } => {
            let shape = serde_json::from_str::<Shape>(r.get()).ok();
            // A 2026-era interim answer: the tool asks for input before it acts. It is never
            // stored; the key is released so that the continuation (the same call with
            // `inputResponses`/`requestState`, which are not part of the fingerprint) runs
            // under the same key and its final result is the one stored.
            if shape
                .as_ref()
                .and_then(|s| s.result_type.as_deref())
                .is_some_and(|t| t == "input_required")
            {
                return Effect::not_applied("the tool asked for input before acting");
            }
            let failed = shape.is_some_and(|s| s.is_error);
            let body = Payload::McpToolResult(r.clone()).encode();
            if failed {
                Effect::Failed(body)
            } else {
                Effect::Success(body)
            }
        }
        // A JSON-RPC error does not prove that nothing happened: servers of the TypeScript
        // SDK answer some failures after acting, and others raise errors midway.
        Reply::Answer { error: Some(e), .. } => Effect::Ambiguous(format!(
            "the server answered with a JSON-RPC error {}",
            e.get()
        )),
        Reply::Answer { .. } => {
            Effect::Ambiguous("the server's answer had neither result nor error".to_owned())
        }
        Reply::Closed(why) => Effect::Ambiguous(why.clone()),
    }
}

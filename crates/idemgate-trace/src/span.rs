//! The call's own span, what its answer records on it, and the context handed to the side effect.

use idemgate_core::{Answer, Begun, EngineError, Key, Verdict};
use idemgate_kit::{Explanation, What};
use opentelemetry::trace::Status;
use std::sync::Mutex;

use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::{TraceContext, TARGET};

/// Which front door took the call (`idemgate.door`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Door {
    /// `idemgate exec`.
    Exec,
    /// The HTTP gateway, `idemgate serve`.
    Http,
    /// The MCP proxy, `idemgate mcp`.
    Mcp,
    /// The Python package, in-process.
    Python,
    /// The Node package, in-process.
    Node,
}

impl Door {
    fn name(self) -> &'static str {
        match self {
            Door::Exec => "exec",
            Door::Http => "http",
            Door::Mcp => "mcp",
            Door::Python => "python",
            Door::Node => "node",
        }
    }
}

/// The span of one tool call, named as the GenAI conventions name a tool's execution
/// (`execute_tool {tool}`, with `gen_ai.operation.name`, `gen_ai.tool.name` and, when the door
/// knows the model's call id, `gen_ai.tool.call.id`), a child of the caller's context when there
/// is one. The engine's phases are its children when the call runs inside it (`Instrument`).
/// Disabled, at the cost of one check, when no layer exports spans.
pub fn call_span(
    door: Door,
    tenant: &str,
    tool: &str,
    call_id: Option<&str>,
    caller: Option<&TraceContext>,
) -> Span {
    let span = tracing::info_span!(
        target: TARGET,
        "execute_tool",
        otel.name = format!("execute_tool {tool}"),
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = tool,
        idemgate.door = door.name(),
        idemgate.tenant = tenant,
    );
    if span.is_disabled() {
        return span;
    }
    if let Some(id) = call_id {
        span.set_attribute("gen_ai.tool.call.id", id.to_owned());
    }
    if let Some(caller) = caller {
        // Fails only when the span has started already, which a span made here has not.
        let _ = span.set_parent(caller.to_otel());
    }
    span
}

/// Records on `span` how the call ended: `idemgate.verdict` (the verdict's label),
/// `idemgate.rule` (explicit key or fallback window), `idemgate.recording` (stored, journaled,
/// ...), `idemgate.executed_at` (when the outcome answered was recorded: now or, for a replay,
/// then), `idemgate.key_hash` (the short digest the logs use, never the key itself) and, for a
/// refusal or a failure to record, an error status. The arguments and results are never
/// recorded.
pub fn record(span: &Span, result: &Result<Answer, EngineError>) {
    if span.is_disabled() {
        return;
    }
    let key = match result {
        Ok(answer) => answer.key.as_ref(),
        Err(e) => refused_key(e),
    };
    record_facts(span, &Explanation::of(result), key);
}

/// The record a refusal names, when it names one (a key used with other arguments).
fn refused_key(e: &EngineError) -> Option<&Key> {
    match e {
        EngineError::KeyReuse { key, .. } => Some(key),
        _ => None,
    }
}

/// As [`record`], for an answer (a door's `finish`).
pub fn record_answer(span: &Span, answer: &Answer) {
    if !span.is_disabled() {
        record_facts(span, &Explanation::of_answer(answer), answer.key.as_ref());
    }
}

/// As [`record`], for a refusal a door met before the engine's call (naming the record of a call
/// without a key, say): the verdict, `error.type` and an error status, as every refusal has.
pub fn record_refusal(span: &Span, refused: &EngineError) {
    if !span.is_disabled() {
        record_facts(span, &Explanation::of_error(refused), refused_key(refused));
    }
}

/// As [`record`], for what `begin` decided, in a door whose caller runs the side effect itself
/// (the gateway's coordination API, the in-process packages): an answer or a refusal is the
/// call's end and is recorded; a call that runs is marked `execute`, and its outcome is recorded
/// where it is reported.
pub fn record_begun(span: &Span, begun: &Result<Begun, EngineError>) {
    if span.is_disabled() {
        return;
    }
    match begun {
        Ok(Begun::Execute(ticket)) => {
            span.set_attribute("idemgate.verdict", Verdict::Execute.label());
            span.set_attribute("idemgate.rule", ticket.rule.to_string());
            span.set_attribute("idemgate.key_hash", idemgate_kit::log::short(&ticket.key));
        }
        Ok(Begun::PassThrough) => {
            span.set_attribute("idemgate.verdict", Verdict::PassedThrough.label());
        }
        Ok(Begun::Observed { would, .. }) => {
            span.set_attribute("idemgate.verdict", Verdict::PassedThrough.label());
            span.set_attribute("idemgate.observed", would.label());
        }
        Ok(Begun::Answered(answer)) => record_answer(span, answer),
        Err(e) => record_refusal(span, e),
    }
}

fn record_facts(span: &Span, facts: &Explanation, key: Option<&Key>) {
    let label = facts.verdict.label();
    span.set_attribute("idemgate.verdict", label);
    if let Some(rule) = facts.rule {
        span.set_attribute("idemgate.rule", rule.to_string());
    }
    if let Some(key) = key {
        span.set_attribute("idemgate.key_hash", idemgate_kit::log::short(key));
    }
    match &facts.what {
        What::Ran { at, recording } => {
            span.set_attribute("idemgate.executed_at", at.to_string());
            span.set_attribute("idemgate.recording", recording.name());
        }
        What::Replayed {
            at,
            until,
            by_operator,
        } => {
            span.set_attribute("idemgate.executed_at", at.to_string());
            span.set_attribute("idemgate.expires_at", until.to_string());
            span.set_attribute("idemgate.resolved_by_operator", *by_operator);
        }
        What::NotApplied { recording, .. } => {
            span.set_attribute("idemgate.recording", recording.name());
        }
        What::InFlight { retry_after, .. } => {
            span.set_attribute("idemgate.retry_after_ms", retry_after.as_millis() as i64);
        }
        What::Unknown { since, fence, .. } => {
            span.set_attribute("idemgate.unknown_since", since.to_string());
            span.set_attribute("idemgate.fence", *fence as i64);
        }
        What::Expired {
            at,
            expired_at,
            fence,
            ..
        } => {
            span.set_attribute("idemgate.executed_at", at.to_string());
            span.set_attribute("idemgate.expires_at", expired_at.to_string());
            span.set_attribute("idemgate.fence", *fence as i64);
        }
        What::PassedThrough | What::Refused { .. } => {}
    }
    if facts.verdict.is_error() {
        span.set_attribute("error.type", label);
        span.set_status(Status::error(label));
    }
}

/// The context to hand to whatever runs the side effect: the current span's (inside the
/// engine's `idemgate.effect`, so the tool's spans are its children) when spans are exported,
/// else the caller's own, passed through unchanged as a transparent proxy would.
pub fn outgoing(caller: Option<&TraceContext>) -> Option<TraceContext> {
    let current = Span::current();
    if !current.is_disabled() {
        if let Some(ours) = TraceContext::of_otel(&current.context()) {
            return Some(ours);
        }
    }
    caller.cloned()
}

/// A call's spans across the two halves of a door that runs the side effect itself between
/// `Engine::begin` and `Engine::finish` (the Python and Node packages): the call's span, and the
/// side effect's while the caller's function runs. Each ends when the call does (`begun` for an
/// answer without execution, `finished` otherwise), however long the door keeps this.
#[derive(Debug)]
pub struct SplitCall {
    call: Mutex<Option<Span>>,
    effect: Mutex<Option<Span>>,
    /// The caller's context, handed on as it is when spans are not exported.
    caller: Option<TraceContext>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl SplitCall {
    /// The call's span (see [`call_span`]) under the caller's W3C context, when its
    /// `traceparent` is a valid one; `begin` runs inside it.
    pub fn start(
        door: Door,
        tenant: &str,
        tool: &str,
        call_id: Option<&str>,
        traceparent: Option<&str>,
        tracestate: Option<&str>,
    ) -> Self {
        let caller = traceparent.and_then(|tp| TraceContext::parse(tp, tracestate));
        SplitCall {
            call: Mutex::new(Some(call_span(
                door,
                tenant,
                tool,
                call_id,
                caller.as_ref(),
            ))),
            effect: Mutex::new(None),
            caller,
        }
    }

    /// The call's span, to run `begin` and `finish` in (a disabled one once the call ended).
    pub fn span(&self) -> Span {
        lock(&self.call).clone().unwrap_or_else(Span::none)
    }

    /// What `begin` decided: a call that runs opens `idemgate.effect` until [`Self::finished`];
    /// any other decision is the call's answer, recorded now, and the call's span ends.
    pub fn begun(&self, begun: &Result<Begun, EngineError>) {
        let mut call = lock(&self.call);
        let Some(span) = call.as_ref().filter(|s| !s.is_disabled()) else {
            return;
        };
        if let Ok(Begun::Execute(_)) = begun {
            let effect = tracing::info_span!(target: TARGET, parent: span, "idemgate.effect");
            *lock(&self.effect) = Some(effect);
            return;
        }
        record_begun(span, begun);
        *call = None;
    }

    /// The context to hand to the caller's function: the side effect's span when spans are
    /// exported, else the caller's own.
    pub fn outgoing(&self) -> Option<TraceContext> {
        let ours = lock(&self.effect)
            .as_ref()
            .and_then(|span| TraceContext::of_otel(&span.context()));
        ours.or_else(|| self.caller.clone())
    }

    /// The function returned (before `finish` records it): ends the side effect's span.
    pub fn effect_done(&self) {
        drop(lock(&self.effect).take());
    }

    /// The call's answer (what `finish` answered, or a replay `begin` answered), recorded on the
    /// call's span, which ends.
    pub fn finished(&self, answer: &Answer) {
        self.effect_done();
        if let Some(span) = lock(&self.call).take() {
            record_answer(&span, answer);
        }
    }
}

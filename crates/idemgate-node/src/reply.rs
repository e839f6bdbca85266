//! Answers and errors as the package reads them: JSON text with the facts of the answer (its
//! verdict label, when it ran, the stored outcome's JSON) and, for every answer that is not a
//! result, the verdict the package throws the error class of, with the kit's explanation for a
//! person as its message and the explanation's facts as its problem members (the HTTP gateway's
//! problem document, as the Python exceptions carry it).

use idemgate::{Answer, Decision, EngineError, OutcomeKind, StoreError, Verdict};
use idemgate_kit::{Door, Explanation, Payload, Problem, Resolve};
use serde::Serialize;
use serde_json::{json, Value};

/// The error reply of a problem document: its detail for a person, the document itself.
fn error(problem: &Problem) -> Value {
    json!({
        "error": problem.verdict.label(),
        "message": problem.detail,
        "status": problem.status(),
        "problem": problem.document(),
    })
}

/// The error reply of an engine error: the kit's problem document of its refusal.
pub(crate) fn engine_error(e: &EngineError) -> Value {
    let explanation = Explanation::of_error(e);
    error(&explanation.problem(&door(&explanation.record_name())))
}

/// Why a store did not open (the URL without its password): `misconfigured` for a URL or a
/// store set up wrong (retrying cannot help), else a `store_unavailable` error.
pub(crate) fn open_error(url: &str, e: &StoreError) -> Value {
    let message = format!("failed to open store {}: {e}", idemgate::redact_url(url));
    if let StoreError::Misconfigured(_) = e {
        return json!({ "error": "misconfigured", "message": message });
    }
    error(&Problem::new(Verdict::StoreUnavailable, message))
}

/// How the package's errors name things: the record, and how an operator resolves it
/// (`Engine.resolve`).
fn door(record: &str) -> Door<'_> {
    Door {
        effect: "the function",
        record,
        resolve: Resolve::Node,
        repeat: "call it again with a new key",
        add_key: "pass a key",
        discreet: false,
    }
}

/// The reply of a result, as the package reads it: written straight to text, without a
/// `Value` tree (a map of a dozen fields built and dropped for every call cost about a tenth of
/// a replay's instructions).
#[derive(Serialize)]
struct Facts<'a> {
    verdict: &'a str,
    executed: bool,
    key: Option<&'a str>,
    rule: Option<String>,
    explanation: &'a str,
    for_model: Option<&'a str>,
    replayed: bool,
    executed_at_ms: Option<i64>,
    expires_at_ms: Option<i64>,
    recording: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    failed: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    value_json: Option<&'a str>,
}

/// The first character of a lean reply that is a stored value (see [`lean`]); every other reply
/// is a JSON object and starts with `{`, but a lean call to run (`LEAN_EXECUTE`).
pub(crate) const LEAN_VALUE: char = 'v';

/// The first character of a lean reply that lets the call run (see `NativeEngine::begin`).
pub(crate) const LEAN_EXECUTE: char = 'x';

/// The lean reply of an answer, for a caller that wants only the value (the package's
/// `idempotent` wrapper), when the answer is a success the caller needs nothing else of: a
/// replay's stored value as `v` and its JSON text; `""` for a call that ran (the caller has
/// its function's value, and its outcome is recorded). `None` for the rest (errors, among them
/// an outcome not recorded; failures; pass-throughs), which get the whole reply. No
/// explanation is built: it costs more than the rest of a replay.
pub(crate) fn lean(answer: &Answer) -> Option<String> {
    // A call that ran but whose outcome is not recorded (its lease lost, the store and the
    // journal both refused) is an error the caller must be told of: the whole reply.
    if Verdict::of_answer(answer).is_error() {
        return None;
    }
    let outcome = match &answer.decision {
        Decision::Executed { .. } => return Some(String::new()),
        Decision::Replayed { outcome, .. } => outcome,
        _ => return None,
    };
    if outcome.kind != OutcomeKind::Success {
        return None;
    }
    let payload = Payload::of(outcome).ok()?;
    let value = payload.to_json();
    let mut text = String::with_capacity(value.get().len() + 1);
    text.push(LEAN_VALUE);
    text.push_str(value.get());
    Some(text)
}

/// The reply of an answer as JSON text: its facts (a result), or the error of its verdict.
pub(crate) fn answer(answer: &Answer) -> String {
    named_answer(answer, &[])
}

/// [`answer`], for a call of a tool whose `identity` fields named it (its policy's): a replay the
/// fallback window answered says that an action with the same ones ran.
pub(crate) fn named_answer(answer: &Answer, identity: &[String]) -> String {
    let verdict = Verdict::of_answer(answer);
    let explanation = Explanation::of_answer(answer).named_by(identity);
    let record = explanation.record_name();
    let told = explanation.problem(&door(&record));
    if verdict.is_error() {
        return error(&told).to_string();
    }
    let (mut replayed, mut at, mut until, mut recording) = (false, None, None, None);
    match &answer.decision {
        Decision::Executed {
            executed_at,
            expires_at,
            recording: r,
            ..
        } => {
            (at, until, recording) = (Some(executed_at), Some(expires_at), Some(r.name()));
        }
        Decision::Replayed {
            executed_at,
            expires_at,
            ..
        } => {
            replayed = true;
            (at, until) = (Some(executed_at), Some(expires_at));
        }
        // The verdicts of the rest are results without times (a pass-through) or errors above.
        Decision::PassedThrough { .. }
        | Decision::NotApplied { .. }
        | Decision::InFlight { .. }
        | Decision::Unknown { .. }
        | Decision::Expired { .. } => {}
    }
    let outcome = answer.outcome();
    let payload = match outcome.as_ref().map(Payload::of).transpose() {
        Ok(payload) => payload,
        Err(e) => {
            let why = format!("the stored outcome of {record} cannot be read: {e}");
            return error(&Problem::new(Verdict::BadRequest, why)).to_string();
        }
    };
    let value_json = payload.as_ref().map(Payload::to_json);
    let facts = Facts {
        verdict: verdict.label(),
        executed: answer.executed_here(),
        key: answer.key.as_ref().map(|k| k.key.as_str()),
        rule: answer.rule.map(|r| r.to_string()),
        explanation: &told.detail,
        for_model: told.for_model.as_deref(),
        replayed,
        executed_at_ms: at.map(|t| t.as_millis()),
        expires_at_ms: until.map(|t| t.as_millis()),
        recording,
        failed: outcome.as_ref().map(|o| o.kind == OutcomeKind::Failed),
        content: payload.as_ref().map(Payload::content),
        value_json: value_json.as_deref().map(serde_json::value::RawValue::get),
    };
    serde_json::to_string(&facts).unwrap_or_else(|e| {
        error(&Problem::new(
            Verdict::BadRequest,
            format!("the answer cannot be written: {e}"),
        ))
        .to_string()
    })
}

//! Answers and errors as the package reads them: JSON text with the facts of the answer (its
//! verdict label, when it ran, the stored outcome's JSON) and, for every answer that is not a
//! result, the verdict the package throws the error class of, with the kit's explanation for a
//! person as its message and the explanation's facts as its problem members (the HTTP gateway's
//! problem document, as the Python exceptions carry it).

use idemgate::{Answer, Decision, EngineError, OutcomeKind, StoreError, Verdict};
use idemgate_kit::{Door, Explanation, Payload, Problem, Resolve};
use serde_json::{json, Map, Value};

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

/// The reply of an answer: its facts (a result), or the error of its verdict.
pub(crate) fn answer(answer: &Answer) -> Value {
    let verdict = Verdict::of_answer(answer);
    let explanation = Explanation::of_answer(answer);
    let record = explanation.record_name();
    let told = explanation.problem(&door(&record));
    if verdict.is_error() {
        return error(&told);
    }
    let key = answer.key.as_ref().map(|k| k.key.as_str().to_owned());
    let rule = answer.rule.map(|r| r.to_string());
    let mut out = Map::new();
    out.insert("verdict".into(), verdict.label().into());
    out.insert("executed".into(), answer.executed_here().into());
    out.insert("key".into(), json!(key));
    out.insert("rule".into(), json!(rule));
    out.insert("explanation".into(), told.detail.into());
    out.insert("for_model".into(), told.for_model.into());
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
    out.insert("replayed".into(), replayed.into());
    out.insert("executed_at_ms".into(), json!(at.map(|t| t.as_millis())));
    out.insert("expires_at_ms".into(), json!(until.map(|t| t.as_millis())));
    out.insert("recording".into(), json!(recording));
    if let Some(outcome) = answer.outcome() {
        out.insert(
            "failed".into(),
            (outcome.kind == OutcomeKind::Failed).into(),
        );
        match Payload::of(&outcome) {
            Ok(payload) => {
                out.insert("content".into(), payload.content().into());
                out.insert("value_json".into(), payload.to_json().get().into());
            }
            Err(e) => {
                let why = format!("the stored outcome of {record} cannot be read: {e}");
                return error(&Problem::new(Verdict::BadRequest, why));
            }
        }
    }
    Value::Object(out)
}

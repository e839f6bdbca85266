//! Answers and errors as the package reads them: JSON text with the facts of the answer (its
//! verdict label, when it ran, the stored outcome's JSON) and, for every answer that is not a
//! result, the verdict the package throws the error class of, with the kit's explanation for a
//! person as its message and the explanation's facts as its problem members (the HTTP gateway's
//! problem document, as the Python exceptions carry it).

use idemgate::{Answer, Decision, EngineError, Key, OutcomeKind, StoreError, Verdict};
use idemgate_kit::{problem_members, Door, Explanation, Payload, Resolve, VerdictCodes, What};
use serde_json::{json, Map, Value};

/// How the model is told to do an action again on purpose (the integrations' key argument).
const MODEL_REPEAT: &str =
    "call the tool again with the argument idempotency_key set to a new value that names the new action";

/// The error reply of `verdict`: `message` for a person, `problem` the facts.
pub(crate) fn error(verdict: Verdict, message: String, problem: Map<String, Value>) -> Value {
    let (name, title) = verdict.problem();
    let mut doc = problem;
    doc.insert("type".into(), idemgate_kit::problem_type(name).into());
    doc.insert("title".into(), title.into());
    doc.insert("status".into(), verdict.http_status().into());
    doc.insert("detail".into(), message.clone().into());
    doc.insert("verdict".into(), verdict.label().into());
    json!({
        "error": verdict.label(),
        "message": message,
        "status": verdict.http_status(),
        "problem": doc,
    })
}

/// The error reply of an engine error (a refusal before anything ran, or a store failure).
pub(crate) fn engine_error(e: &EngineError) -> Value {
    let problem = problem_members(e)
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value.into()))
        .collect();
    error(Verdict::of_error(e), e.to_string(), problem)
}

/// Why a store did not open (the URL without its password): `misconfigured` for a URL or a
/// store set up wrong (retrying cannot help), else a `store_unavailable` error.
pub(crate) fn open_error(url: &str, e: &StoreError) -> Value {
    let message = format!("failed to open store {}: {e}", idemgate::redact_url(url));
    if let StoreError::Misconfigured(_) = e {
        return json!({ "error": "misconfigured", "message": message });
    }
    error(Verdict::StoreUnavailable, message, Map::new())
}

/// How the package's errors name things: the record, and how an operator resolves it
/// (`Engine.resolve`).
fn door<'a>(record: &'a str, repeat: &'a str) -> Door<'a> {
    Door {
        effect: "the function",
        record,
        resolve: Resolve::Node,
        repeat,
        add_key: "pass a key",
    }
}

/// The reply of an answer: its facts (a result), or the error of its verdict.
pub(crate) fn answer(answer: &Answer) -> Value {
    let verdict = Verdict::of_answer(answer);
    let explanation = Explanation::of_answer(answer);
    let record = answer.key.as_ref().map(Key::to_string).unwrap_or_default();
    let for_person = explanation.for_person(&door(&record, "call it again with a new key"));
    let for_model = explanation.for_model(&door(&record, MODEL_REPEAT));
    let key = answer.key.as_ref().map(|k| k.key.as_str().to_owned());
    let rule = answer.rule.map(|r| r.to_string());
    if verdict.is_error() {
        let mut problem = Map::new();
        problem.insert("key".into(), json!(key));
        problem.insert("rule".into(), json!(rule));
        problem.insert("for_model".into(), for_model.into());
        match &explanation.what {
            What::InFlight { since, retry_after } => {
                problem.insert("since".into(), since.to_string().into());
                problem.insert("retry_after".into(), retry_after.as_secs_f64().into());
            }
            What::Unknown {
                since,
                fence,
                ran_here,
                why,
            } => {
                problem.insert("since".into(), since.to_string().into());
                problem.insert("fence".into(), (*fence).into());
                problem.insert("ran_here".into(), (*ran_here).into());
                problem.insert("message".into(), json!(why));
            }
            What::Expired {
                at,
                expired_at,
                until,
                fence,
            } => {
                problem.insert("executed_at".into(), at.to_string().into());
                problem.insert("expired_at".into(), expired_at.to_string().into());
                problem.insert("retain_until".into(), until.to_string().into());
                problem.insert("fence".into(), (*fence).into());
            }
            What::Ran { .. }
            | What::Replayed { .. }
            | What::PassedThrough
            | What::NotApplied { .. }
            | What::Refused { .. } => {}
        }
        return error(verdict, for_person, problem);
    }
    let mut out = Map::new();
    out.insert("verdict".into(), verdict.label().into());
    out.insert("executed".into(), answer.executed_here().into());
    out.insert("key".into(), json!(key));
    out.insert("rule".into(), json!(rule));
    out.insert("explanation".into(), for_person.into());
    out.insert("for_model".into(), for_model.into());
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
                return error(
                    Verdict::BadRequest,
                    format!("the stored outcome of {record} cannot be read: {e}"),
                    Map::new(),
                )
            }
        }
    }
    Value::Object(out)
}

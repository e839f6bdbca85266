//! The one place the engine's answers become HTTP answers, for every endpoint: statuses and
//! problem names come from the verdict's codes (`idemgate_kit::VerdictCodes`), the words from
//! the kit's [`Explanation`]; the match on the decision is exhaustive, so a new one is a compile
//! error here rather than an invented status.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use idemgate::{
    Answer, Decision, KeyRule, Outcome, Recording, Timestamp, ToolPolicy, UnknownPolicy, Verdict,
};
use idemgate_kit::{Explanation, Payload};
use serde::Serialize;
use serde_json::json;

use crate::error::{Problem, DOOR};
use crate::headers::{set_record_headers, RECORDING, RESOLVED_BY};
use crate::request::OutcomeView;

/// How an endpoint shows outcomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shape {
    /// The coordination API: JSON bodies that describe the decision.
    Coordination,
    /// Forwarded calls: the upstream's own answer.
    Forwarded,
}

/// The HTTP answer to an engine answer: the tool's own answer or a JSON body for what ran or was
/// replayed, a problem for the rest: the kit's problem document of its [`Explanation`].
pub(crate) fn respond(
    answer: Answer,
    shape: Shape,
    policy: &ToolPolicy,
) -> Result<Response, Problem> {
    let rule = answer.rule.unwrap_or(KeyRule::Explicit);
    let explanation = Explanation::of_answer(&answer)
        .retried_when_unknown(policy.on_unknown == UnknownPolicy::Retry)
        .named_by(&policy.identity);
    let problem = || Problem::explained(&explanation).with_rule(Some(rule));
    match answer.decision {
        Decision::Executed {
            outcome,
            executed_at,
            expires_at,
            recording: recording @ (Recording::Stored | Recording::Journaled),
        } => {
            let recording = recording.name();
            let mut res = match shape {
                Shape::Coordination => Json(json!({
                    "decision": "executed",
                    "recording": recording,
                    "executed_at": executed_at,
                    "expires_at": expires_at,
                }))
                .into_response(),
                Shape::Forwarded => upstream_answer(&outcome)?,
            };
            let h = res.headers_mut();
            set_record_headers(h, false, rule, Some(executed_at), Some(expires_at));
            h.insert(RECORDING, HeaderValue::from_static(recording));
            Ok(res)
        }
        Decision::Executed { .. } => Err(problem()),
        Decision::Replayed {
            outcome,
            executed_at,
            expires_at,
            ..
        } => {
            // An operator's resolution: `executed_at` is when they resolved it, and nothing ran
            // then; the caller is told so, as the MCP proxy and `exec` tell theirs.
            let resolved_by = Payload::is_resolution(&outcome).then_some(OPERATOR);
            let mut res = match shape {
                // Serialized straight from the view (not through `json!`), so the stored result
                // goes out as its own text: big integers stay exact.
                Shape::Coordination => Json(ReplayedBody {
                    decision: "replayed",
                    outcome: OutcomeView::of(&outcome),
                    executed_at,
                    expires_at,
                    rule,
                    resolved_by,
                })
                .into_response(),
                Shape::Forwarded => upstream_answer(&outcome)?,
            };
            let h = res.headers_mut();
            set_record_headers(h, true, rule, Some(executed_at), Some(expires_at));
            if let Some(by) = resolved_by {
                h.insert(RESOLVED_BY, HeaderValue::from_static(by));
            }
            Ok(res)
        }
        Decision::NotApplied {
            message,
            reply,
            recording,
        } => match recording {
            Recording::Stored | Recording::Journaled => not_applied(shape, rule, &message, reply),
            // The release did not land: the caller must not take the key for free.
            Recording::LeaseLost => Err(Problem::lease_lost().with_rule(Some(rule))),
            Recording::Unrecorded(_) => Err(Problem::of(
                Verdict::Unrecorded,
                explanation.for_person(&DOOR),
            )
            .with_rule(Some(rule))),
        },
        Decision::InFlight { .. } => Err(problem()),
        Decision::Unknown {
            fence,
            ran_here,
            recording,
            ..
        } => match recording {
            // This call marked the record unknown and the mark is recorded: the coordination
            // API's `ambiguous` report succeeded.
            Some(Recording::Stored | Recording::Journaled)
                if ran_here && shape == Shape::Coordination =>
            {
                let mut res = Json(json!({"decision": "unknown", "fence": fence})).into_response();
                set_record_headers(res.headers_mut(), false, rule, None, None);
                Ok(res)
            }
            Some(Recording::LeaseLost) => Err(Problem::lease_lost().with_rule(Some(rule))),
            _ => Err(problem()),
        },
        Decision::Expired { .. } => Err(problem()),
        Decision::PassedThrough { .. } => {
            Ok(Json(json!({"decision": "pass_through"})).into_response())
        }
    }
}

/// The answer to a call whose side effect said it did nothing, and whose release is recorded.
fn not_applied(
    shape: Shape,
    rule: KeyRule,
    message: &str,
    reply: Option<Vec<u8>>,
) -> Result<Response, Problem> {
    let mut res = match (shape, reply) {
        (Shape::Coordination, _) => Json(json!({"decision": "not_applied"})).into_response(),
        // The upstream's own refusal (a 429, say) goes back as it was: it did nothing.
        (Shape::Forwarded, Some(reply)) => upstream_answer(&Outcome::success(reply))?,
        (Shape::Forwarded, None) => {
            return Err(Problem::new(
                StatusCode::BAD_GATEWAY,
                "upstream-unreachable",
                "Upstream unreachable",
                format!("nothing was sent upstream and the key was released: {message}"),
            )
            .with_rule(Some(rule)))
        }
    };
    set_record_headers(res.headers_mut(), false, rule, None, None);
    Ok(res)
}

/// A stored outcome as the upstream's answer (or, for outcomes another front door stored, as
/// JSON: see [`Payload::to_http`]).
pub(crate) fn upstream_answer(outcome: &Outcome) -> Result<Response, Problem> {
    let payload = Payload::of(outcome).map_err(|e| {
        Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "outcome-unreadable",
            "Outcome unreadable",
            e.to_string(),
        )
    })?;
    let answer = payload.into_http(outcome.kind);
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut res = (status, answer.body).into_response();
    let h = res.headers_mut();
    h.remove(header::CONTENT_TYPE);
    for (name, value) in [
        (header::CONTENT_TYPE, answer.content_type),
        (header::RETRY_AFTER, answer.retry_after),
    ] {
        if let Some(v) = value.and_then(|v| HeaderValue::from_str(&v).ok()) {
            h.insert(name, v);
        }
    }
    set_kept_headers(h, &answer.headers);
    Ok(res)
}

/// The headers a profile keeps with an answer (`Payload::Http`'s `headers`), set on it; a name
/// or value that is no longer a valid header is left out rather than failing the answer.
pub(crate) fn set_kept_headers(h: &mut axum::http::HeaderMap, kept: &[(String, String)]) {
    for (name, value) in kept {
        if let (Ok(name), Ok(value)) = (
            axum::http::HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            h.append(name, value);
        }
    }
}

/// Who a replayed outcome was resolved by, when an operator recorded it (`resolved_by`, the
/// `Idempotency-Resolved-By` header): the word the MCP proxy's `_meta` and `exec --json` use.
const OPERATOR: &str = "operator";

/// The body of a replayed `begin`.
#[derive(Debug, Serialize)]
struct ReplayedBody {
    decision: &'static str,
    outcome: OutcomeView,
    executed_at: Timestamp,
    expires_at: Timestamp,
    rule: KeyRule,
    /// `operator` when the outcome is an operator's resolution, not one the action returned.
    #[serde(skip_serializing_if = "Option::is_none")]
    resolved_by: Option<&'static str>,
}

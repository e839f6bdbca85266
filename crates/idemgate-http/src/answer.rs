//! The one place the engine's answers become HTTP answers, for every endpoint: statuses and
//! problem names come from the [`Verdict`] table, and the match on it is exhaustive, so a new
//! verdict is a compile error here rather than an invented status.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use idemgate::{
    Answer, Decision, KeyRule, Outcome, Recording, Timestamp, ToolPolicy, UnknownPolicy, Verdict,
};
use idemgate_kit::Payload;
use serde::Serialize;
use serde_json::json;

use crate::error::Problem;
use crate::headers::{set_record_headers, RECORDING};
use crate::request::OutcomeView;

/// How an endpoint shows outcomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shape {
    /// The coordination API: JSON bodies that describe the decision.
    Coordination,
    /// Forwarded calls: the upstream's own answer.
    Forwarded,
}

/// The HTTP answer to an engine answer.
pub(crate) fn respond(
    answer: Answer,
    shape: Shape,
    policy: &ToolPolicy,
) -> Result<Response, Problem> {
    let rule = answer.rule.unwrap_or(KeyRule::Explicit);
    let verdict = Verdict::of_answer(&answer);
    match (verdict, answer.decision) {
        (
            Verdict::Executed,
            Decision::Executed {
                outcome,
                executed_at,
                expires_at,
                recording,
            },
        ) => {
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
        (
            Verdict::Replayed,
            Decision::Replayed {
                outcome,
                executed_at,
                expires_at,
                ..
            },
        ) => {
            let mut res = match shape {
                // Serialized straight from the view (not through `json!`), so the stored result
                // goes out as its own text: big integers stay exact.
                Shape::Coordination => Json(ReplayedBody {
                    decision: "replayed",
                    outcome: OutcomeView::of(&outcome),
                    executed_at,
                    expires_at,
                    rule,
                })
                .into_response(),
                Shape::Forwarded => upstream_answer(&outcome)?,
            };
            set_record_headers(
                res.headers_mut(),
                true,
                rule,
                Some(executed_at),
                Some(expires_at),
            );
            Ok(res)
        }
        (Verdict::LeaseLost, _) => Err(Problem::lease_lost().with_rule(Some(rule))),
        (Verdict::Unrecorded, _) => Err(Problem::of(
            Verdict::Unrecorded,
            "the side effect ran, but neither the store nor the local journal took its outcome; the record turns unknown when its lease ends, for an operator to resolve",
        )
        .with_rule(Some(rule))),
        (
            Verdict::NotApplied,
            Decision::NotApplied {
                message,
                reply,
                recording,
            },
        ) => not_applied(shape, rule, &message, reply, &recording),
        (Verdict::InFlight, Decision::InFlight { since, retry_after }) => {
            Err(Problem::in_flight(since, retry_after, rule))
        }
        (
            Verdict::Unknown,
            Decision::Unknown {
                since,
                fence,
                ran_here,
                message,
                recording,
            },
        ) => match recording {
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
            _ => Err(Problem::outcome_unknown(
                since,
                fence,
                rule,
                message.as_deref(),
                policy.on_unknown == UnknownPolicy::Retry,
            )),
        },
        (Verdict::PassedThrough, Decision::PassedThrough { .. }) => {
            Ok(Json(json!({"decision": "pass_through"})).into_response())
        }
        // Verdicts of refusals and of `begin`, which no answer carries.
        (
            Verdict::Execute
            | Verdict::Executed
            | Verdict::Replayed
            | Verdict::NotApplied
            | Verdict::InFlight
            | Verdict::Unknown
            | Verdict::PassedThrough
            | Verdict::KeyRequired
            | Verdict::KeyReused
            | Verdict::BadRequest
            | Verdict::StoreUnavailable
            | Verdict::QuotaExceeded
            | Verdict::RateLimited
            | Verdict::NotFound
            | Verdict::NotResolvable
            | Verdict::JournalFailed,
            _,
        ) => Err(Problem::of(verdict, format!("the call ended as {verdict}"))),
    }
}

fn not_applied(
    shape: Shape,
    rule: KeyRule,
    message: &str,
    reply: Option<Vec<u8>>,
    recording: &Recording,
) -> Result<Response, Problem> {
    match recording {
        Recording::LeaseLost => return Err(Problem::lease_lost().with_rule(Some(rule))),
        Recording::Unrecorded(_) => {
            return Err(Problem::of(
                Verdict::Unrecorded,
                "failed to release the key in the store or the journal; it turns unknown when its lease ends",
            )
            .with_rule(Some(rule)))
        }
        Recording::Stored | Recording::Journaled => {}
    }
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
    Ok(res)
}

/// The body of a replayed `begin`.
#[derive(Debug, Serialize)]
struct ReplayedBody {
    decision: &'static str,
    outcome: OutcomeView,
    executed_at: Timestamp,
    expires_at: Timestamp,
    rule: KeyRule,
}

//! Coordination: callers run the side effect themselves between `begin` and
//! `complete`/`release`/`ambiguous`.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use idemgate::{
    Answer, Begun, Decision, Effect, Key, KeyRule, Lease, RecordState, Recording, StoreError,
    Ticket, Timestamp, ToolName, ToolPolicy,
};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::time::Instant;

use crate::audit::Event;
use crate::auth::Caller;
use crate::error::Problem;
use crate::gateway::Gateway;
use crate::headers::set_record_headers;
use crate::request::{self, OutcomeBody, OutcomeView, Path};

/// `POST /v1/tools/{tool}/begin`.
pub(crate) async fn begin(
    State(gw): State<Gateway>,
    Caller(tenant): Caller,
    Path(tool): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Problem> {
    let tool = request::tool_name(&tool)?;
    let bytes = request::read_body(body).await?;
    let call = request::call(&tenant.id, &tool, &headers, &bytes)?;
    let policy = gw.config().policy(tool.as_str());
    let counted = |decision| {
        gw.metrics()
            .call(tenant.id.as_str(), tool.as_str(), decision)
    };
    let begun = match gw.engine().begin(call, &policy).await {
        Ok(b) => b,
        Err(e) => {
            gw.metrics()
                .engine_error(tenant.id.as_str(), tool.as_str(), &e);
            return Err(Problem::from_engine(&e));
        }
    };
    match begun {
        Begun::Execute(ticket) => {
            let digest = ticket.key.digest();
            if !tenant.live.hold(digest, Instant::now() + ticket.lease_for) {
                // Nothing ran: give the key back so the caller can try again later.
                gw.engine()
                    .finish(&ticket, Effect::NotApplied("quota exceeded".to_owned()))
                    .await;
                counted("quota_exceeded");
                return Err(Problem::quota_exceeded(tenant.live.max()));
            }
            counted("execute");
            gw.audit()
                .record(Event::Reserved, &ticket.key, Some(ticket.lease.fence));
            tracing::info!(tenant = %tenant.id, tool = %tool, key = %request::short(&ticket.key), fence = ticket.lease.fence, "reserved");
            let body = json!({
                "decision": "execute",
                "key": ticket.key.key,
                "rule": ticket.rule,
                "lease": ticket.lease.to_string(),
                "lease_until": Timestamp::now().plus(ticket.lease_for),
            });
            let mut res = (StatusCode::CREATED, Json(body)).into_response();
            set_record_headers(res.headers_mut(), false, ticket.rule, None, None);
            Ok(res)
        }
        Begun::PassThrough => {
            counted("pass_through");
            Ok(Json(json!({"decision": "pass_through"})).into_response())
        }
        Begun::Answered(answer) => answered(&gw, &tenant.id, &tool, answer),
        _ => Err(Problem::store_unavailable("failed to decide the call")),
    }
}

/// A `begin` that did not hand out a lease: a replay, or an in-flight or unknown answer.
fn answered(
    gw: &Gateway,
    tenant: &idemgate::TenantId,
    tool: &ToolName,
    answer: Answer,
) -> Result<Response, Problem> {
    let rule = answer.rule.unwrap_or(KeyRule::Explicit);
    let counted = |decision| gw.metrics().call(tenant.as_str(), tool.as_str(), decision);
    match answer.decision {
        Decision::Replayed {
            outcome,
            executed_at,
            expires_at,
            ..
        } => {
            counted("replayed");
            if let Some(key) = &answer.key {
                gw.audit().record(Event::Replayed, key, None);
                tracing::info!(tenant = %tenant, tool = %tool, key = %request::short(key), "replayed");
            }
            // Serialized straight from the view (not through `json!`), so the stored result goes
            // out as its own text: big integers stay exact.
            let body = ReplayedBody {
                decision: "replayed",
                outcome: OutcomeView::of(&outcome),
                executed_at,
                expires_at,
                rule,
            };
            let mut res = Json(body).into_response();
            set_record_headers(
                res.headers_mut(),
                true,
                rule,
                Some(executed_at),
                Some(expires_at),
            );
            Ok(res)
        }
        Decision::InFlight { since, retry_after } => {
            counted("in_flight");
            Err(Problem::in_flight(since, retry_after, rule))
        }
        Decision::Unknown {
            since,
            fence,
            message,
            ..
        } => {
            counted("unknown");
            Err(Problem::outcome_unknown(
                since,
                fence,
                rule,
                message.as_deref(),
            ))
        }
        _ => Err(Problem::store_unavailable("failed to decide the call")),
    }
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

/// The body of `heartbeat`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LeaseBody {
    key: String,
    lease: String,
}

/// The body of `release` and `ambiguous`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReasonBody {
    key: String,
    lease: String,
    #[serde(default)]
    reason: Option<String>,
}

/// The body of `complete`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CompleteBody {
    key: String,
    lease: String,
    outcome: OutcomeBody,
}

/// A request body that names a held lease.
trait Held {
    fn key(&self) -> &str;
    fn lease(&self) -> &str;
}

macro_rules! held {
    ($($body:ty),*) => {$(
        impl Held for $body {
            fn key(&self) -> &str {
                &self.key
            }
            fn lease(&self) -> &str {
                &self.lease
            }
        }
    )*};
}
held!(LeaseBody, ReasonBody, CompleteBody);

/// Reads a lease-carrying request: the tool, its body, and the ticket the lease stands for.
async fn held_request<B: Held + serde::de::DeserializeOwned>(
    gw: &Gateway,
    tenant: &idemgate::TenantId,
    tool: &str,
    body: Body,
) -> Result<(ToolName, B, Ticket), Problem> {
    let tool = request::tool_name(tool)?;
    let b: B = request::json_body(&request::read_body(body).await?)?;
    let policy = gw.config().policy(tool.as_str());
    let ticket = ticket(tenant, &tool, &policy, b.key(), b.lease())?;
    Ok((tool, b, ticket))
}

/// Rebuilds the ticket `begin` handed out from the key, the lease text and the tool's policy.
fn ticket(
    tenant: &idemgate::TenantId,
    tool: &ToolName,
    policy: &ToolPolicy,
    key: &str,
    lease: &str,
) -> Result<Ticket, Problem> {
    let key = request::idempotency_key(key)?;
    let lease: Lease = lease.parse().map_err(Problem::bad_request)?;
    // Fallback keys are minted by `begin` under this prefix; their outcome is kept for the
    // fallback window, not the tool's TTL.
    let (rule, ttl) = match policy.fallback_window {
        Some(window) if key.as_str().starts_with("fallback-") => (KeyRule::Fallback, window),
        _ => (KeyRule::Explicit, policy.ttl),
    };
    Ok(Ticket {
        key: Key::new(tenant.clone(), tool.clone(), key),
        rule,
        lease,
        ttl,
        lease_for: policy.lease,
    })
}

/// `POST /v1/tools/{tool}/heartbeat`.
pub(crate) async fn heartbeat(
    State(gw): State<Gateway>,
    Caller(tenant): Caller,
    Path(tool): Path<String>,
    body: Body,
) -> Result<Response, Problem> {
    let (_, _, ticket) = held_request::<LeaseBody>(&gw, &tenant.id, &tool, body).await?;
    match gw.engine().heartbeat(&ticket).await {
        Ok(until) => {
            tenant
                .live
                .extend(ticket.key.digest(), Instant::now() + ticket.lease_for);
            Ok(Json(json!({ "lease_until": until })).into_response())
        }
        Err(StoreError::LeaseLost) => Err(Problem::lease_lost()),
        Err(e) => {
            gw.metrics().store_error();
            tracing::warn!(error = %e, key = %request::short(&ticket.key), "failed to heartbeat");
            Err(Problem::store_unavailable("failed to extend the lease"))
        }
    }
}

/// `POST /v1/tools/{tool}/complete`.
pub(crate) async fn complete(
    State(gw): State<Gateway>,
    Caller(tenant): Caller,
    Path(tool): Path<String>,
    body: Body,
) -> Result<Response, Problem> {
    let (tool, b, ticket) = held_request::<CompleteBody>(&gw, &tenant.id, &tool, body).await?;
    let outcome = b.outcome.into_outcome();
    let effect = match outcome.kind {
        idemgate::OutcomeKind::Success => Effect::Success(outcome.body),
        idemgate::OutcomeKind::Failed => Effect::Failed(outcome.body),
    };
    let answer = finish(&gw, &ticket, effect).await;
    tenant.live.release(&ticket.key.digest());
    match answer.decision {
        Decision::Executed {
            executed_at,
            expires_at,
            recording,
            ..
        } => {
            let recording = match recording {
                Recording::Stored => "stored",
                Recording::Journaled => "journaled",
                Recording::LeaseLost => return Err(Problem::lease_lost()),
                Recording::Unrecorded(_) => {
                    return Err(Problem::store_unavailable(
                        "failed to record the outcome in the store or the journal; the record turns unknown when its lease ends",
                    ))
                }
            };
            gw.metrics()
                .call(tenant.id.as_str(), tool.as_str(), "executed");
            gw.audit()
                .record(Event::Executed, &ticket.key, Some(ticket.lease.fence));
            tracing::info!(tenant = %tenant.id, tool = %tool, key = %request::short(&ticket.key), recording, "executed");
            let body = json!({
                "decision": "executed",
                "recording": recording,
                "executed_at": executed_at,
                "expires_at": expires_at,
            });
            let mut res = Json(body).into_response();
            set_record_headers(
                res.headers_mut(),
                false,
                ticket.rule,
                Some(executed_at),
                Some(expires_at),
            );
            Ok(res)
        }
        _ => Err(Problem::store_unavailable("failed to record the outcome")),
    }
}

/// `POST /v1/tools/{tool}/release`.
pub(crate) async fn release(
    State(gw): State<Gateway>,
    Caller(tenant): Caller,
    Path(tool): Path<String>,
    body: Body,
) -> Result<Response, Problem> {
    let (tool, b, ticket) = held_request::<ReasonBody>(&gw, &tenant.id, &tool, body).await?;
    let reason = b.reason.unwrap_or_default();
    let answer = finish(&gw, &ticket, Effect::NotApplied(reason)).await;
    tenant.live.release(&ticket.key.digest());
    match answer.decision {
        Decision::NotApplied {
            recording: Recording::LeaseLost,
            ..
        } => Err(Problem::lease_lost()),
        Decision::NotApplied {
            recording: Recording::Unrecorded(_),
            ..
        } => Err(Problem::store_unavailable(
            "failed to release the key in the store or the journal; it turns unknown when its lease ends",
        )),
        Decision::NotApplied { .. } => {
            gw.metrics()
                .call(tenant.id.as_str(), tool.as_str(), "not_applied");
            gw.audit()
                .record(Event::Released, &ticket.key, Some(ticket.lease.fence));
            tracing::info!(tenant = %tenant.id, tool = %tool, key = %request::short(&ticket.key), "released");
            let mut res = Json(json!({"decision": "not_applied"})).into_response();
            set_record_headers(res.headers_mut(), false, ticket.rule, None, None);
            Ok(res)
        }
        _ => Err(Problem::store_unavailable("failed to release the key")),
    }
}

/// `POST /v1/tools/{tool}/ambiguous`.
pub(crate) async fn ambiguous(
    State(gw): State<Gateway>,
    Caller(tenant): Caller,
    Path(tool): Path<String>,
    body: Body,
) -> Result<Response, Problem> {
    let (tool, b, ticket) = held_request::<ReasonBody>(&gw, &tenant.id, &tool, body).await?;
    let reason = b.reason.unwrap_or_default();
    finish(&gw, &ticket, Effect::Ambiguous(reason)).await;
    tenant.live.release(&ticket.key.digest());
    // The engine does not say whether marking the record unknown found the lease current, so
    // look: after a successful mark the record is unknown at this lease's fence. A store that
    // does not answer leaves the write journaled, which is still this caller's report.
    if let Ok(record) = gw.engine().get(&ticket.key).await {
        let ours = matches!(
            &record,
            Some(r) if r.fence == ticket.lease.fence && matches!(r.state, RecordState::Unknown { .. })
        );
        if !ours {
            return Err(Problem::lease_lost());
        }
    }
    gw.metrics()
        .call(tenant.id.as_str(), tool.as_str(), "unknown");
    gw.audit()
        .record(Event::Unknown, &ticket.key, Some(ticket.lease.fence));
    tracing::info!(tenant = %tenant.id, tool = %tool, key = %request::short(&ticket.key), "unknown");
    let mut res = Json(json!({"decision": "unknown"})).into_response();
    set_record_headers(res.headers_mut(), false, ticket.rule, None, None);
    Ok(res)
}

/// Records a reported outcome in a task of its own, so a caller that hangs up mid-request does
/// not cut the "done" write short.
async fn finish(gw: &Gateway, ticket: &Ticket, effect: Effect) -> Answer {
    let (gw2, t2) = (gw.clone(), ticket.clone());
    match tokio::spawn(async move { gw2.engine().finish(&t2, effect).await }).await {
        Ok(a) => a,
        Err(e) => Answer {
            key: Some(ticket.key.clone()),
            rule: Some(ticket.rule),
            decision: Decision::NotApplied {
                message: String::new(),
                recording: Recording::Unrecorded(format!("failed to record the outcome: {e}")),
            },
        },
    }
}

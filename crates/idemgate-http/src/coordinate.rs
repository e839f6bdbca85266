//! Coordination: callers run the side effect themselves between `begin` and
//! `complete`/`release`/`ambiguous`.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use idemgate::{Begun, Effect, Lease, StoreError, Ticket, Timestamp, ToolPolicy, Verdict};
use idemgate_kit::tenants::Tenant;
use serde::Deserialize;
use serde_json::json;
use tokio::time::Instant;
use tracing::Instrument as _;

use crate::answer::{respond, Shape};
use crate::auth::Caller;
use crate::error::Problem;
use crate::gateway::Gateway;
use crate::headers::{call_span, set_record_headers};
use crate::request::{self, OutcomeBody, Path};

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
    let policy = gw.config().policy(tool.as_str());
    let call = request::call(&tenant.id, &tool, &headers, &bytes, &policy.identity)?;
    // The reservation of a call the caller runs itself; `idemgate.reserve` says what was decided.
    let (_, span) = call_span(&headers, &tenant.id, &tool);
    let begun = gw
        .engine()
        .begin(call, &policy)
        .instrument(span.clone())
        .await;
    // The span says how `begin` ended, refusals (a write without a key) included, as every
    // door's call span does.
    idemgate_trace::record_begun(&span, &begun);
    let begun = begun.map_err(|e| Problem::from_engine(&e))?;
    let ticket = match begun {
        Begun::Execute(ticket) => ticket,
        Begun::PassThrough => return Ok(Json(json!({"decision": "pass_through"})).into_response()),
        // Observe mode: run it, nothing recorded; the program may read what enforce would
        // have answered.
        Begun::Observed { would, .. } => {
            return Ok(
                Json(json!({"decision": "pass_through", "observed": would.label()}))
                    .into_response(),
            )
        }
        Begun::Answered(answer) => return respond(answer, Shape::Coordination, &policy),
    };
    if !tenant
        .live
        .hold(ticket.key.digest(), Instant::now() + ticket.lease_for)
    {
        // Nothing ran: give the key back so the caller can try again later.
        gw.engine()
            .finish(&ticket, Effect::not_applied("quota exceeded"))
            .await;
        gw.quota_exceeded(&ticket.key);
        return Err(Problem::quota_exceeded(tenant.live.max()));
    }
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

/// Reads a lease-carrying request: its body, the tool's policy, and the ticket the lease stands
/// for.
async fn held_request<B: Held + serde::de::DeserializeOwned>(
    gw: &Gateway,
    tenant: &idemgate::TenantId,
    tool: &str,
    body: Body,
) -> Result<(B, ToolPolicy, Ticket), Problem> {
    let tool = request::tool_name(tool)?;
    let b: B = request::json_body(&request::read_body(body).await?)?;
    let policy = gw.config().policy(tool.as_str());
    // The key `begin` answered, fallback keys included: not checked as a caller's own key.
    let key =
        idemgate::IdempotencyKey::new(b.key()).map_err(|e| Problem::bad_request(e.to_string()))?;
    let lease: Lease = b.lease().parse().map_err(Problem::bad_request)?;
    let ticket = gw
        .engine()
        .ticket_for(tenant.clone(), tool, key, lease, &policy);
    Ok((b, policy, ticket))
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
            tracing::warn!(error = %e, key = %idemgate_kit::log::short(&ticket.key), "failed to heartbeat");
            Err(Problem::store_unavailable("failed to extend the lease"))
        }
    }
}

/// `POST /v1/tools/{tool}/complete`.
pub(crate) async fn complete(
    State(gw): State<Gateway>,
    Caller(tenant): Caller,
    Path(tool): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Problem> {
    let (b, policy, ticket) = held_request::<CompleteBody>(&gw, &tenant.id, &tool, body).await?;
    let outcome = b.outcome.into_outcome();
    let effect = match outcome.kind {
        idemgate::OutcomeKind::Success => Effect::Success(outcome.body),
        idemgate::OutcomeKind::Failed => Effect::Failed(outcome.body),
    };
    report(&gw, &tenant, &policy, &ticket, effect, &headers).await
}

/// `POST /v1/tools/{tool}/release`.
pub(crate) async fn release(
    State(gw): State<Gateway>,
    Caller(tenant): Caller,
    Path(tool): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Problem> {
    let (b, policy, ticket) = held_request::<ReasonBody>(&gw, &tenant.id, &tool, body).await?;
    let effect = Effect::not_applied(b.reason.unwrap_or_default());
    report(&gw, &tenant, &policy, &ticket, effect, &headers).await
}

/// `POST /v1/tools/{tool}/ambiguous`.
pub(crate) async fn ambiguous(
    State(gw): State<Gateway>,
    Caller(tenant): Caller,
    Path(tool): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Problem> {
    let (b, policy, ticket) = held_request::<ReasonBody>(&gw, &tenant.id, &tool, body).await?;
    let effect = Effect::Ambiguous(b.reason.unwrap_or_default());
    report(&gw, &tenant, &policy, &ticket, effect, &headers).await
}

/// Records what the caller reported under its lease and answers. The write runs in a task of its
/// own, so a caller that hangs up mid-request does not cut the "done" write short.
async fn report(
    gw: &Gateway,
    tenant: &Tenant,
    policy: &ToolPolicy,
    ticket: &Ticket,
    effect: Effect,
    headers: &HeaderMap,
) -> Result<Response, Problem> {
    // The caller ran the side effect (under its own span); this span is the recording of it.
    let (_, span) = call_span(headers, &ticket.key.tenant, &ticket.key.tool);
    let (gw2, t2, recorded) = (gw.clone(), ticket.clone(), span.clone());
    let finished = async move {
        let answer = gw2.engine().finish(&t2, effect).await;
        idemgate_trace::record_answer(&recorded, &answer);
        answer
    };
    let answer = tokio::spawn(finished.instrument(span)).await.map_err(|e| {
        Problem::of(
            Verdict::Unrecorded,
            format!("failed to record the outcome: {e}"),
        )
    })?;
    tenant.live.release(&ticket.key.digest());
    respond(answer, Shape::Coordination, policy)
}

//! The operator view of a tenant's records: list, show, resolve, reopen.

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use idemgate::{Keep, Key, KeyRule, ListFilter, Resolution, State as RecordStateName};
use serde::Deserialize;

use crate::auth::Caller;
use crate::error::Problem;
use crate::gateway::Gateway;
use crate::request::{self, OutcomeBody, Path, Query, RecordView};

/// Most records one list answer holds.
const MAX_LIST: usize = 1000;

/// `GET /v1/records` query.
#[derive(Debug, Deserialize)]
pub(crate) struct ListQuery {
    state: Option<String>,
    tool: Option<String>,
    scope: Option<String>,
    limit: Option<usize>,
}

/// `GET /v1/records?state=&tool=&scope=&limit=`: the caller's records, oldest first.
pub(crate) async fn list(
    State(gw): State<Gateway>,
    Caller(tenant): Caller,
    Query(q): Query<ListQuery>,
) -> Result<Response, Problem> {
    let state = q
        .state
        .as_deref()
        .map(str::parse::<RecordStateName>)
        .transpose()
        .map_err(Problem::bad_request)?;
    let tool = q.tool.as_deref().map(request::tool_name).transpose()?;
    // Outside 1..=1000 is refused, as the document says, rather than quietly clamped: a caller
    // asking for 5000 would otherwise take 1000 for everything there is.
    let limit = q.limit.unwrap_or(100);
    if !(1..=MAX_LIST).contains(&limit) {
        return Err(Problem::bad_request(format!(
            "limit must be between 1 and {MAX_LIST}, not {limit}"
        )));
    }
    let filter = ListFilter {
        tenant: Some(tenant.id.clone()),
        tool,
        state,
        scope: q.scope.map(Into::into),
        limit,
    };
    let records = gw.engine().list(&filter).await.map_err(|e| {
        gw.metrics().store_error();
        Problem::from_engine(&e)
    })?;
    let views: Vec<RecordView> = records.iter().map(RecordView::of).collect();
    Ok(Json(views).into_response())
}

/// `GET /v1/tools/{tool}/records/{key}`.
pub(crate) async fn show(
    State(gw): State<Gateway>,
    Caller(tenant): Caller,
    Path((tool, key)): Path<(String, String)>,
) -> Result<Response, Problem> {
    let key = Key::new(
        tenant.id.clone(),
        request::tool_name(&tool)?,
        request::idempotency_key(&key)?,
    );
    match gw.engine().get(&key).await {
        Ok(Some(r)) => Ok(Json(RecordView::of(&r)).into_response()),
        Ok(None) => Err(Problem::not_found("no record under this key")),
        Err(e) => {
            gw.metrics().store_error();
            Err(Problem::from_engine(&e))
        }
    }
}

/// The body of `resolve`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResolveBody {
    fence: u64,
    resolution: String,
    outcome: Option<OutcomeBody>,
    /// Why, for the audit log.
    reason: Option<String>,
}

/// Who an operator's request at the gateway came from, for the audit log: the tenant whose token
/// it carried.
fn operator(tenant: &idemgate_kit::tenants::Tenant) -> String {
    format!("tenant:{}", tenant.id)
}

/// `POST /v1/tools/{tool}/records/{key}/resolve`: an operator says what happened to an unknown
/// record. Answers the record after (`null` once released).
pub(crate) async fn resolve(
    State(gw): State<Gateway>,
    Caller(tenant): Caller,
    Path((tool, key)): Path<(String, String)>,
    body: Body,
) -> Result<Response, Problem> {
    let tool = request::tool_name(&tool)?;
    let key = Key::new(
        tenant.id.clone(),
        tool.clone(),
        request::idempotency_key(&key)?,
    );
    let b: ResolveBody = request::json_body(&request::read_body(body).await?)?;
    let resolution = match (b.resolution.as_str(), b.outcome) {
        ("completed", Some(o)) => Resolution::Completed {
            outcome: o.into_resolution(),
            keep: Keep::of(KeyRule::Explicit, &gw.config().policy(tool.as_str())),
        },
        ("completed", None) => {
            return Err(Problem::bad_request(
                "resolution \"completed\" needs an outcome: {\"kind\": \"success\"|\"failed\", \"result\": ...}",
            ))
        }
        ("release", None) => Resolution::Release,
        ("release", Some(_)) => {
            return Err(Problem::bad_request(
                "resolution \"release\" takes no outcome: nothing happened",
            ))
        }
        (other, _) => {
            return Err(Problem::bad_request(format!(
                "unknown resolution {other:?}: expected \"completed\" or \"release\""
            )))
        }
    };
    let by = operator(&tenant);
    let resolved = gw
        .engine()
        .resolve(&key, b.fence, resolution, Some(&by), b.reason.as_deref())
        .await;
    match resolved {
        Ok(after) => Ok(Json(after.as_ref().map(RecordView::of)).into_response()),
        Err(e) => Err(operator_error(&gw, &e)),
    }
}

/// The body of `reopen`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReopenBody {
    fence: u64,
    reason: String,
}

/// `POST /v1/tools/{tool}/records/{key}/reopen`: an operator (or a program) reopens a completed
/// or unknown record at the fence they looked at, so that the next call runs the action again.
/// Answers `{"reopened": true, "was": STATE, "fence": N}`.
pub(crate) async fn reopen(
    State(gw): State<Gateway>,
    Caller(tenant): Caller,
    Path((tool, key)): Path<(String, String)>,
    body: Body,
) -> Result<Response, Problem> {
    let key = Key::new(
        tenant.id.clone(),
        request::tool_name(&tool)?,
        request::idempotency_key(&key)?,
    );
    let b: ReopenBody = request::json_body(&request::read_body(body).await?)?;
    let by = operator(&tenant);
    match gw
        .engine()
        .reopen(&key, b.fence, Some(&by), Some(&b.reason))
        .await
    {
        Ok(was) => Ok(Json(serde_json::json!({
            "reopened": true,
            "was": was,
            "fence": b.fence,
        }))
        .into_response()),
        Err(e) => Err(operator_error(&gw, &e)),
    }
}

/// The problem of an operator's request the engine refused, counting store errors.
fn operator_error(gw: &Gateway, e: &idemgate::EngineError) -> Problem {
    if matches!(e, idemgate::EngineError::Store(_)) {
        gw.metrics().store_error();
    }
    Problem::from_engine(e)
}

//! The operator view of a tenant's records: list, show, resolve, reopen.

use axum::body::Body;
use axum::extract::State;
use axum::http::header::LINK;
use axum::http::{HeaderValue, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use idemgate::{
    Keep, Key, KeyRule, ListCursor, ListFilter, Resolution, State as RecordStateName, Timestamp,
};
use serde::{Deserialize, Serialize};

use crate::auth::Caller;
use crate::error::Problem;
use crate::gateway::Gateway;
use crate::request::{self, OutcomeBody, Path, Query, RecordView};

/// Most records one list answer holds.
const MAX_LIST: usize = 1000;

/// How far a list answer's `count` goes: counting stops there (the answer then says
/// `"count_exact": false`), so that a page of a table of millions does not count all of them.
/// Each count is one query that reads at most this many rows' index entries or rows.
const COUNT_UP_TO: usize = 10_000;

/// `GET /v1/records` query.
#[derive(Debug, Deserialize)]
pub(crate) struct ListQuery {
    state: Option<String>,
    tool: Option<String>,
    scope: Option<String>,
    key_prefix: Option<String>,
    created_from: Option<String>,
    created_before: Option<String>,
    cursor: Option<String>,
    limit: Option<usize>,
}

/// The answer of `GET /v1/records`.
#[derive(Serialize)]
struct ListAnswer {
    /// This page's records, in the listing order (oldest first).
    records: Vec<RecordView>,
    /// The cursor of the page after this one, `null` on the last page.
    next: Option<String>,
    /// How many records the filter selects, every page together (up to [`COUNT_UP_TO`]).
    count: usize,
    /// Whether `count` is every record, or counting stopped at [`COUNT_UP_TO`].
    count_exact: bool,
}

/// `GET /v1/records?state=&tool=&scope=&key_prefix=&created_from=&created_before=&cursor=&limit=`:
/// one page of the caller's records, oldest first, with the cursor of the next page in the body
/// (`next`) and in a `Link: <...>; rel="next"` header.
pub(crate) async fn list(
    State(gw): State<Gateway>,
    Caller(tenant): Caller,
    uri: Uri,
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
    let time = |name: &str, t: &Option<String>| {
        t.as_deref()
            .map(str::parse::<Timestamp>)
            .transpose()
            .map_err(|e| Problem::bad_request(format!("{name}: {e}")))
    };
    let after = q
        .cursor
        .as_deref()
        .map(str::parse::<ListCursor>)
        .transpose()
        .map_err(Problem::bad_request)?;
    if after.as_ref().is_some_and(|c| c.key.tenant != tenant.id) {
        // Another tenant's cursor would only say where its records stand: refused as unreadable.
        return Err(Problem::bad_request(
            "cursor: not a cursor of this tenant's records",
        ));
    }
    let filter = ListFilter {
        tenant: Some(tenant.id.clone()),
        tool,
        state,
        scope: q.scope.map(Into::into),
        key_prefix: q.key_prefix.map(Into::into),
        created_from: time("created_from", &q.created_from)?,
        created_before: time("created_before", &q.created_before)?,
        after,
        // One more than the page, to know whether a next page follows.
        limit: limit + 1,
    };
    let failed = |e: idemgate::EngineError| {
        gw.metrics().store_error();
        Problem::from_engine(&e)
    };
    let mut records = gw.engine().list(&filter).await.map_err(failed)?;
    let count = gw
        .engine()
        .count(&filter, COUNT_UP_TO)
        .await
        .map_err(failed)?;
    let next = (records.len() > limit).then(|| ListCursor::of(&records[limit - 1]).to_string());
    records.truncate(limit);
    let answer = ListAnswer {
        records: records.iter().map(RecordView::of).collect(),
        next: next.clone(),
        count,
        count_exact: count < COUNT_UP_TO,
    };
    let mut res = Json(answer).into_response();
    if let Some(next) = next {
        // The same query with this page's cursor. The cursor's text needs no escaping (letters,
        // digits and dots); the other parameters are passed on as the caller wrote them.
        let mut query: Vec<&str> = uri
            .query()
            .unwrap_or("")
            .split('&')
            .filter(|p| !p.is_empty() && !p.starts_with("cursor="))
            .collect();
        let cursor = format!("cursor={next}");
        query.push(&cursor);
        let link = format!("<{}?{}>; rel=\"next\"", uri.path(), query.join("&"));
        if let Ok(value) = HeaderValue::from_str(&link) {
            res.headers_mut().insert(LINK, value);
        }
    }
    Ok(res)
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
    match gw.engine().record_and_history(&key).await {
        Ok((Some(r), history)) => Ok(Json(RecordView::with_history(&r, &history)).into_response()),
        Ok((None, _)) => Err(Problem::not_found("no record under this key")),
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

//! What every handler needs: reading bodies within the limit, names from paths and headers, and
//! the JSON shapes of outcomes and records.

use axum::body::Body;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use bytes::Bytes;
use http_body_util::BodyExt as _;
use idemgate::{
    Call, IdempotencyKey, Outcome, OutcomeKind, Record, RecordState, TenantId, Timestamp, ToolName,
};
use idemgate_kit::identity::{identify, Facts};
use idemgate_kit::Payload;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::error::Problem;
use crate::headers::IDEMPOTENCY_KEY;

/// Reads a whole request body. The limit itself sits in the body (see `server::limit_body`), so a
/// body that grows past it fails here with 413 instead of filling memory.
pub(crate) async fn read_body(body: Body) -> Result<Bytes, Problem> {
    match body.collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) => {
            let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
            while let Some(err) = source {
                if let Some(limit) = err.downcast_ref::<TooLarge>() {
                    return Err(Problem::payload_too_large(limit.0));
                }
                source = err.source();
            }
            Err(Problem::bad_request(format!(
                "failed to read the request body: {e}"
            )))
        }
    }
}

/// The error a body gives once it grows past the limit. The limit is set in `server::limit_body`
/// and read back here, where bodies are read: it lives with the reading, so that the server
/// imports the handlers' module and never the other way round.
#[derive(Debug)]
pub(crate) struct TooLarge(pub(crate) u64);

impl std::fmt::Display for TooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the request body is larger than {} bytes", self.0)
    }
}

impl std::error::Error for TooLarge {}

/// Path and query extractors whose rejections are problem answers, like every other error (axum's
/// own answer plain text).
macro_rules! problem_extractor {
    ($($(#[$doc:meta])* $name:ident = $inner:path;)*) => {$(
        $(#[$doc])*
        #[derive(Debug)]
        pub(crate) struct $name<T>(pub(crate) T);

        impl<S: Send + Sync, T: serde::de::DeserializeOwned + Send> FromRequestParts<S> for $name<T> {
            type Rejection = Problem;

            async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Problem> {
                match <$inner as FromRequestParts<S>>::from_request_parts(parts, state).await {
                    Ok(v) => Ok($name(v.0)),
                    Err(rejection) => Err(Problem::bad_request(rejection.body_text())),
                }
            }
        }
    )*};
}

problem_extractor! {
    /// The path parameters (`axum::extract::Path`), or 400 `bad-request`.
    Path = axum::extract::Path<T>;
    /// The query string (`axum::extract::Query`), or 400 `bad-request`.
    Query = axum::extract::Query<T>;
}

/// Reads a JSON body into `T`, with a 400 problem that says what is wrong.
pub(crate) fn json_body<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, Problem> {
    serde_json::from_slice(bytes)
        .map_err(|e| Problem::bad_request(format!("failed to read the JSON body: {e}")))
}

/// The tool named in the path.
pub(crate) fn tool_name(tool: &str) -> Result<ToolName, Problem> {
    ToolName::new(tool).map_err(|e| Problem::bad_request(e.to_string()))
}

/// An idempotency key from a body or path.
pub(crate) fn idempotency_key(key: &str) -> Result<IdempotencyKey, Problem> {
    IdempotencyKey::new(key).map_err(|e| Problem::bad_request(e.to_string()))
}

/// The engine call of a request: tenant, tool, the `Idempotency-Key` header, and the fingerprint
/// of the raw JSON arguments (integers kept exact), and, without a key, of the tool's identity
/// fields (`fields`) for its fallback window. An empty body counts as `null`.
pub(crate) fn call(
    tenant: &TenantId,
    tool: &ToolName,
    headers: &HeaderMap,
    body: &[u8],
    fields: &[String],
) -> Result<Call, Problem> {
    let (call, args) = call_of_body(tenant, tool, body)?;
    let header = single_header(headers, &IDEMPOTENCY_KEY, "Idempotency-Key")?
        .map(|v| idemgate_kit::header::idempotency_key(v.as_bytes()))
        .transpose()
        .map_err(Problem::bad_request)?;
    let call = named_by_orchestration(call, header.as_ref().map(IdempotencyKey::as_str))?;
    Ok(match call.key {
        Some(_) => call,
        // Without it the call is the tool's window, tenant-wide (a program's client has no
        // conversation to scope it by), named by the tool's identity fields.
        None => call.identity(args, fields),
    })
}

/// The call of a request body, compared by its raw JSON text (integers kept exact), and the
/// text: an empty body counts as `null`.
pub(crate) fn call_of_body<'b>(
    tenant: &TenantId,
    tool: &ToolName,
    body: &'b [u8],
) -> Result<(Call, &'b [u8]), Problem> {
    let args: &[u8] = if body.iter().all(u8::is_ascii_whitespace) {
        b"null"
    } else {
        body
    };
    let call = Call::new(tenant.clone(), tool.clone())
        .args_text(args)
        .map_err(|e| Problem::bad_request(e.to_string()))?;
    Ok((call, args))
}

/// The one value of header `name` (written `shown` in the refusal), if any: which of several
/// would win is up to whoever added the second, so several are refused rather than guessed at.
pub(crate) fn single_header<'h>(
    headers: &'h HeaderMap,
    name: &HeaderName,
    shown: &str,
) -> Result<Option<&'h HeaderValue>, Problem> {
    let mut values = headers.get_all(name).iter();
    let first = values.next();
    if values.next().is_some() {
        return Err(Problem::bad_request(format!(
            "only one {shown} header is allowed; this request has several"
        )));
    }
    Ok(first)
}

/// `call` named by the orchestration layer's key (an `Idempotency-Key` header, an x402
/// payment's identifier), when there is one: it names the action for the tenant, in every
/// request (the kit's one rule).
pub(crate) fn named_by_orchestration(call: Call, key: Option<&str>) -> Result<Call, Problem> {
    let identity = identify(&Facts {
        orchestration_key: key,
        ..Facts::default()
    })
    .map_err(|e| Problem::bad_request(e.to_string()))?;
    Ok(match identity.key {
        Some(key) => call.key(key),
        None => call,
    })
}

/// An outcome as the API shows it: `{"kind", "content", "result"}`. A JSON result is its own
/// text, byte for byte (so integers of any size come back exact); other content is its JSON view
/// ([`Payload::to_json`]); unreadable bytes are a string.
#[derive(Debug, Serialize)]
pub(crate) struct OutcomeView {
    kind: OutcomeKind,
    content: &'static str,
    result: Box<RawValue>,
}

impl OutcomeView {
    pub(crate) fn of(outcome: &Outcome) -> Self {
        let (content, result) = match Payload::of(outcome) {
            Ok(p) => (p.content(), p.to_json()),
            Err(_) => (
                "unreadable",
                serde_json::value::to_raw_value(&String::from_utf8_lossy(&outcome.body))
                    .expect("a string always encodes"),
            ),
        };
        OutcomeView {
            kind: outcome.kind,
            content,
            result,
        }
    }
}

/// A record as the API shows it.
#[derive(Debug, Serialize)]
pub(crate) struct RecordView {
    key: IdempotencyKey,
    tool: ToolName,
    tenant: TenantId,
    state: String,
    fence: u64,
    created_at: Timestamp,
    fingerprint: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    scope: Option<std::sync::Arc<str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lease_until: Option<Timestamp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    since: Option<Timestamp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    outcome: Option<OutcomeView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    completed_at: Option<Timestamp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    expires_at: Option<Timestamp>,
    /// Until when the record is remembered after `expires_at` (a retry past the ttl is then
    /// answered 410 "outcome expired").
    #[serde(skip_serializing_if = "Option::is_none")]
    retain_until: Option<Timestamp>,
    /// The key the upstream got in `Idempotency-Key`: what an operator searches for there.
    downstream_key: String,
    /// Why an unknown record is unknown (only where its history was read: one record's view).
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    /// Its story, from its state and its history (only in one record's view).
    #[serde(skip_serializing_if = "Option::is_none")]
    history: Option<Vec<idemgate_kit::story::Step>>,
}

impl RecordView {
    /// `r` with its story told from `history`: one record's view.
    pub(crate) fn with_history(r: &Record, history: &[idemgate::HistoryEntry]) -> Self {
        RecordView {
            reason: idemgate_kit::story::unknown_reason(r, history),
            history: Some(idemgate_kit::story::story(Some(r), history)),
            ..RecordView::of(r)
        }
    }

    /// `r` as a listing shows it, without its history.
    pub(crate) fn of(r: &Record) -> Self {
        let mut v = RecordView {
            key: r.key.key.clone(),
            tool: r.key.tool.clone(),
            tenant: r.key.tenant.clone(),
            state: r.state_name().to_string(),
            fence: r.fence,
            created_at: r.created_at,
            fingerprint: r.fingerprint.to_hex(),
            scope: r.scope.clone(),
            lease_until: None,
            since: None,
            outcome: None,
            completed_at: None,
            expires_at: None,
            retain_until: None,
            downstream_key: idemgate_kit::story::downstream_key(&r.key),
            reason: None,
            history: None,
        };
        match &r.state {
            RecordState::InFlight { lease_until } => v.lease_until = Some(*lease_until),
            RecordState::Unknown { since } => v.since = Some(*since),
            RecordState::Completed {
                outcome,
                completed_at,
                expires_at,
                retain_until,
            } => {
                v.outcome = Some(OutcomeView::of(outcome));
                v.completed_at = Some(*completed_at);
                v.expires_at = Some(*expires_at);
                v.retain_until = Some(*retain_until);
            }
            RecordState::Expired {
                completed_at,
                expired_at,
                retain_until,
            } => {
                v.completed_at = Some(*completed_at);
                v.expires_at = Some(*expired_at);
                v.retain_until = Some(*retain_until);
            }
        }
        v
    }
}

/// The outcome a caller reports: `{"kind": "success"|"failed", "result": <any JSON>}`. The result
/// is kept as the caller wrote it, so it is replayed verbatim (integers exact).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct OutcomeBody {
    pub(crate) kind: OutcomeKind,
    #[serde(default = "null_raw")]
    pub(crate) result: Box<RawValue>,
}

fn null_raw() -> Box<RawValue> {
    RawValue::from_string("null".to_owned()).expect("null is JSON")
}

impl OutcomeBody {
    /// The outcome, stored as a JSON result.
    pub(crate) fn into_outcome(self) -> Outcome {
        Payload::Json(self.result).into_outcome(self.kind)
    }

    /// The outcome an operator records to resolve an unknown record, stored as a JSON result and
    /// marked as a resolution, so that every door's replay says an operator resolved it then
    /// instead of that the action ran then.
    pub(crate) fn into_resolution(self) -> Outcome {
        Payload::Json(self.result).into_resolution(self.kind)
    }
}

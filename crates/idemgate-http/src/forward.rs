//! Forwarding: `POST /v1/tools/{tool}/call` reserves the key, calls the tool's upstream, stores its
//! answer and replays it.

use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use bytes::Bytes;
use idemgate::key::hex;
use idemgate::{Call, Decision, Effect, Key, KeyRule, Outcome, ToolKind, ToolPolicy};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::audit::Event;
use crate::auth::{Caller, Tenant};
use crate::error::Problem;
use crate::gateway::Gateway;
use crate::headers::{set_record_headers, IDEMPOTENCY_KEY};
use crate::request::{self, Path};

/// The stored outcome of a forwarded call: the upstream's answer.
#[derive(Debug, Serialize, Deserialize)]
struct Envelope {
    status: u16,
    content_type: Option<String>,
    /// The body, base64 (standard alphabet, padded).
    body: String,
}

/// What the upstream answered.
#[derive(Debug)]
struct Upstream {
    status: StatusCode,
    content_type: Option<HeaderValue>,
    retry_after: Option<HeaderValue>,
    body: Bytes,
}

/// The stored outcome of an upstream answer, as a forwarded call replays it (also what the HTTP
/// verifier stores for a call it found applied).
pub(crate) fn envelope(status: StatusCode, content_type: Option<&str>, body: &[u8]) -> Vec<u8> {
    let env = Envelope {
        status: status.as_u16(),
        content_type: content_type.map(str::to_owned),
        body: base64::engine::general_purpose::STANDARD.encode(body),
    };
    serde_json::to_vec(&env).expect("an envelope always serializes")
}

impl Upstream {
    fn envelope(&self) -> Vec<u8> {
        envelope(
            self.status,
            self.content_type.as_ref().and_then(|v| v.to_str().ok()),
            &self.body,
        )
    }

    fn from_outcome(outcome: &Outcome) -> Option<Self> {
        let env: Envelope = serde_json::from_slice(&outcome.body).ok()?;
        Some(Upstream {
            status: StatusCode::from_u16(env.status).ok()?,
            content_type: env
                .content_type
                .and_then(|c| HeaderValue::from_str(&c).ok()),
            retry_after: None,
            body: base64::engine::general_purpose::STANDARD
                .decode(env.body)
                .ok()?
                .into(),
        })
    }

    fn into_response(self) -> Response {
        let mut res = (self.status, self.body).into_response();
        let h = res.headers_mut();
        h.remove(header::CONTENT_TYPE);
        if let Some(ct) = self.content_type {
            h.insert(header::CONTENT_TYPE, ct);
        }
        if let Some(ra) = self.retry_after {
            h.insert(header::RETRY_AFTER, ra);
        }
        res
    }
}

/// Why a call ended without a stored outcome, for the answer to the caller.
#[derive(Debug, Default)]
enum Note {
    #[default]
    None,
    Quota,
    Unreachable(String),
    Passed(Upstream),
}

/// `POST /v1/tools/{tool}/call`.
pub(crate) async fn call(
    State(gw): State<Gateway>,
    Caller(tenant): Caller,
    Path(tool): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Problem> {
    let tool = request::tool_name(&tool)?;
    let Some(upstream) = gw.upstream(tool.as_str()).map(str::to_owned) else {
        return Err(Problem::not_found(format!(
            "tool {tool} has no upstream; run it yourself with the coordination endpoints (/v1/tools/{tool}/begin)"
        )));
    };
    let bytes = request::read_body(body).await?;
    let call = request::call(&tenant.id, &tool, &headers, &bytes)?;
    let policy = gw.config().policy(tool.as_str());
    // Runs in a task of its own: a caller that hangs up must not cut the side effect off between
    // sending it upstream and recording what came back.
    let task = tokio::spawn(forward(gw, tenant, call, policy, upstream, bytes));
    task.await.unwrap_or_else(|e| {
        Err(Problem::store_unavailable(format!(
            "failed to finish the call: {e}"
        )))
    })
}

async fn forward(
    gw: Gateway,
    tenant: std::sync::Arc<Tenant>,
    call: Call,
    policy: ToolPolicy,
    upstream: String,
    body: Bytes,
) -> Result<Response, Problem> {
    let (tenant_id, tool) = (call.tenant.clone(), call.tool.clone());
    let counted = |decision| {
        gw.metrics()
            .call(tenant_id.as_str(), tool.as_str(), decision)
    };
    let deadline = upstream_deadline(gw.config().server.request_timeout);
    if policy.kind != ToolKind::Write {
        counted("pass_through");
        return match send(&gw, &upstream, None, body, deadline).await {
            Ok(up) => Ok(up.into_response()),
            Err(e) => Err(unreachable(&e)),
        };
    }
    // The record's name, known before the engine reserves it, so the downstream key can be sent.
    let key = match (&call.key, policy.fallback_window) {
        (Some(k), _) => Key::new(tenant_id.clone(), tool.clone(), k.clone()),
        (None, Some(_)) => Key::fallback(tenant_id.clone(), tool.clone(), &call.fingerprint),
        (None, None) => {
            let e = idemgate::EngineError::KeyRequired {
                tool: tool.to_string(),
            };
            gw.metrics()
                .engine_error(tenant_id.as_str(), tool.as_str(), &e);
            return Err(Problem::from_engine(&e));
        }
    };
    let digest = key.digest();
    let mut note = Note::None;
    let note_slot = &mut note;
    let effect = {
        let (gw, tenant, key) = (gw.clone(), tenant.clone(), key.clone());
        move || async move {
            if !tenant
                .live
                .hold(digest, Instant::now() + deadline + Duration::from_secs(1))
            {
                *note_slot = Note::Quota;
                return Effect::NotApplied("quota exceeded".to_owned());
            }
            gw.audit().record(Event::Reserved, &key, None);
            let sent = send(&gw, &upstream, Some(hex(&digest)), body, deadline).await;
            tenant.live.release(&digest);
            classify(sent, note_slot)
        }
    };
    let answer = gw
        .engine()
        .call_with_policy(call, &policy, effect)
        .await
        .map_err(|e| {
            gw.metrics()
                .engine_error(tenant_id.as_str(), tool.as_str(), &e);
            Problem::from_engine(&e)
        })?;
    let rule = answer.rule.unwrap_or(KeyRule::Explicit);
    let short = request::short(&key);
    match answer.decision {
        Decision::Executed {
            outcome,
            executed_at,
            expires_at,
            recording,
        } => {
            counted("executed");
            gw.audit().record(Event::Executed, &key, None);
            tracing::info!(tenant = %tenant_id, tool = %tool, key = %short, recording = ?recording_name(&recording), "executed");
            let up = Upstream::from_outcome(&outcome)
                .ok_or_else(|| Problem::store_unavailable("failed to read the stored answer"))?;
            let mut res = up.into_response();
            set_record_headers(
                res.headers_mut(),
                false,
                rule,
                Some(executed_at),
                Some(expires_at),
            );
            Ok(res)
        }
        Decision::Replayed {
            outcome,
            executed_at,
            expires_at,
            ..
        } => {
            counted("replayed");
            gw.audit().record(Event::Replayed, &key, None);
            tracing::info!(tenant = %tenant_id, tool = %tool, key = %short, "replayed");
            let up = Upstream::from_outcome(&outcome).ok_or_else(|| {
                Problem::store_unavailable(
                    "failed to read the stored answer: it was not stored by a forwarded call",
                )
            })?;
            let mut res = up.into_response();
            set_record_headers(
                res.headers_mut(),
                true,
                rule,
                Some(executed_at),
                Some(expires_at),
            );
            Ok(res)
        }
        Decision::NotApplied { .. } => {
            gw.audit().record(Event::Released, &key, None);
            tracing::info!(tenant = %tenant_id, tool = %tool, key = %short, "released");
            match note {
                Note::Quota => {
                    counted("quota_exceeded");
                    Err(Problem::quota_exceeded(tenant.live.max()))
                }
                Note::Passed(up) => {
                    counted("not_applied");
                    let mut res = up.into_response();
                    set_record_headers(res.headers_mut(), false, rule, None, None);
                    Ok(res)
                }
                Note::Unreachable(detail) => {
                    counted("not_applied");
                    Err(Problem::new(
                        StatusCode::BAD_GATEWAY,
                        "upstream-unreachable",
                        "Upstream unreachable",
                        format!("failed to reach the upstream, so nothing was sent and the key was released: {detail}"),
                    )
                    .with_rule(Some(rule)))
                }
                Note::None => {
                    counted("not_applied");
                    Err(Problem::new(
                        StatusCode::BAD_GATEWAY,
                        "upstream-unreachable",
                        "Upstream unreachable",
                        "the upstream call was not applied and the key was released",
                    )
                    .with_rule(Some(rule)))
                }
            }
        }
        Decision::InFlight { since, retry_after } => {
            counted("in_flight");
            Err(Problem::in_flight(since, retry_after, rule))
        }
        Decision::Unknown {
            since,
            fence,
            ran_here,
            message,
        } => {
            counted("unknown");
            if ran_here {
                gw.audit().record(Event::Unknown, &key, Some(fence));
                tracing::warn!(tenant = %tenant_id, tool = %tool, key = %short, fence, "outcome unknown");
            }
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

/// Maps what the upstream did onto what the engine records (docs/HTTP.md, "Upstream result
/// mapping").
fn classify(sent: Result<Upstream, reqwest::Error>, note: &mut Note) -> Effect {
    match sent {
        Ok(up) if up.status.is_success() => Effect::Success(up.envelope()),
        Ok(up) if up.status == StatusCode::TOO_MANY_REQUESTS => {
            *note = Note::Passed(up);
            Effect::NotApplied("the upstream answered 429".to_owned())
        }
        Ok(up) if up.status.is_client_error() && up.status != StatusCode::REQUEST_TIMEOUT => {
            Effect::Failed(up.envelope())
        }
        Ok(up) => Effect::Ambiguous(format!("the upstream answered {}", up.status)),
        Err(e) if e.is_connect() => {
            // A failed connect never sent a byte of the request.
            *note = Note::Unreachable(error_chain(&e));
            Effect::NotApplied(format!(
                "failed to connect to the upstream: {}",
                error_chain(&e)
            ))
        }
        Err(e) if e.is_timeout() => {
            Effect::Ambiguous("the upstream did not answer in time".to_owned())
        }
        Err(e) => Effect::Ambiguous(format!(
            "the connection to the upstream failed after sending: {}",
            error_chain(&e)
        )),
    }
}

/// Leaves time, within the whole-request timeout, to record what the upstream did.
fn upstream_deadline(request_timeout: Duration) -> Duration {
    request_timeout.saturating_sub((request_timeout / 10).min(Duration::from_secs(1)))
}

async fn send(
    gw: &Gateway,
    url: &str,
    key: Option<String>,
    body: Bytes,
    timeout: Duration,
) -> Result<Upstream, reqwest::Error> {
    let mut req = gw
        .client()
        .post(url)
        .header(header::CONTENT_TYPE, "application/json")
        .body(body)
        .timeout(timeout);
    if let Some(k) = key {
        req = req.header(IDEMPOTENCY_KEY, k);
    }
    let res = req.send().await?;
    let status = res.status();
    let content_type = res.headers().get(header::CONTENT_TYPE).cloned();
    let retry_after = res.headers().get(header::RETRY_AFTER).cloned();
    let body = res.bytes().await?;
    Ok(Upstream {
        status,
        content_type,
        retry_after,
        body,
    })
}

fn unreachable(e: &reqwest::Error) -> Problem {
    if e.is_timeout() {
        Problem::new(
            StatusCode::GATEWAY_TIMEOUT,
            "timeout",
            "Upstream timeout",
            "the upstream did not answer in time",
        )
    } else {
        Problem::new(
            StatusCode::BAD_GATEWAY,
            "upstream-unreachable",
            "Upstream unreachable",
            format!("failed to call the upstream: {}", error_chain(e)),
        )
    }
}

fn recording_name(r: &idemgate::Recording) -> &'static str {
    match r {
        idemgate::Recording::Stored => "stored",
        idemgate::Recording::Journaled => "journaled",
        idemgate::Recording::LeaseLost => "lease_lost",
        idemgate::Recording::Unrecorded(_) => "unrecorded",
    }
}

/// An error with its causes, without the URL (which may carry credentials).
pub(crate) fn error_chain(e: &reqwest::Error) -> String {
    let mut out = String::new();
    let mut cur: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(c) = cur {
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&c.to_string());
        cur = c.source();
    }
    if out.is_empty() {
        out = "request failed".to_owned();
    }
    out
}

//! Forwarding: `POST /v1/tools/{tool}/call` reserves the key, calls the tool's upstream, stores its
//! answer and replays it.

use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use idemgate::key::hex;
use idemgate::{Call, Decision, Effect, ToolPolicy};
use idemgate_kit::tenants::Tenant;
use idemgate_kit::Payload;
use idemgate_trace::TraceContext;
use tokio::time::Instant;
use tracing::Instrument as _;

use crate::answer::{respond, Shape};
use crate::auth::Caller;
use crate::error::{error_chain, Problem};
use crate::gateway::Gateway;
use crate::headers::IDEMPOTENCY_KEY;
use crate::profile::{Profile, Reading};
use crate::request::{self, Path};

/// What the upstream answered.
#[derive(Debug)]
struct Upstream {
    status: StatusCode,
    content_type: Option<HeaderValue>,
    retry_after: Option<HeaderValue>,
    /// The answer headers the tool's profile keeps with it (`Profile::kept_headers`).
    kept: Vec<(String, String)>,
    body: Bytes,
}

impl Upstream {
    /// The answer as the stored outcome format.
    fn payload(&self) -> Vec<u8> {
        Payload::Http {
            status: self.status.as_u16(),
            content_type: text(self.content_type.as_ref()),
            retry_after: text(self.retry_after.as_ref()),
            headers: self.kept.clone(),
            body: self.body.to_vec(),
        }
        .encode()
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
        crate::answer::set_kept_headers(h, &self.kept);
        res
    }
}

/// `POST /v1/tools/{tool}/call`, answered in the tool's profile (`crate::profile`).
pub(crate) async fn call(
    State(gw): State<Gateway>,
    Caller(tenant): Caller,
    Path(tool): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Problem> {
    let profile = gw.profile(&tool);
    let result = call_of(gw, tenant, tool, &headers, body, profile).await;
    profile.answer(result, &headers)
}

async fn call_of(
    gw: Gateway,
    tenant: std::sync::Arc<Tenant>,
    tool: String,
    headers: &HeaderMap,
    body: Body,
    profile: Profile,
) -> Result<Response, Problem> {
    let tool = request::tool_name(&tool)?;
    let Some(upstream) = gw.upstream(tool.as_str()).map(str::to_owned) else {
        return Err(Problem::not_found(format!(
            "tool {tool} has no upstream; run it yourself with the coordination endpoints (/v1/tools/{tool}/begin)"
        )));
    };
    let bytes = request::read_body(body).await?;
    let mut policy = gw.config().policy(tool.as_str());
    let call = profile.call(&tenant.id, &tool, headers, &bytes, &mut policy)?;
    let (caller, span) = crate::headers::call_span(headers, &tenant.id, &tool);
    let outgoing = Outgoing {
        url: upstream,
        headers: profile
            .forwarded(headers)
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect(),
        body: bytes,
        profile,
    };
    // Runs in a task of its own: a caller that hangs up must not cut the side effect off between
    // sending it upstream and recording what came back.
    let forwarded = forward(gw, tenant, call, policy, outgoing, caller);
    let task = tokio::spawn(forwarded.instrument(span));
    task.await.unwrap_or_else(|e| {
        Err(Problem::store_unavailable(format!(
            "failed to finish the call: {e}"
        )))
    })
}

/// What goes upstream: where, the request's headers its profile passes on, and the body.
struct Outgoing {
    url: String,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: Bytes,
    profile: Profile,
}

async fn forward(
    gw: Gateway,
    tenant: std::sync::Arc<Tenant>,
    call: Call,
    policy: ToolPolicy,
    outgoing: Outgoing,
    caller: Option<TraceContext>,
) -> Result<Response, Problem> {
    let deadline = upstream_deadline(gw.config().server.request_timeout);
    // The record's name, known before the engine reserves it, so the downstream key can be sent.
    // A call refused before the engine runs it (a write without a key) ends here: its span says
    // so, as the engine's refusals say it below.
    let refused = |e: idemgate::EngineError| {
        idemgate_trace::record_refusal(&tracing::Span::current(), &e);
        Problem::from_engine(&e)
    };
    let Some(named) = gw.engine().key_for(&call, &policy).map_err(refused)? else {
        // Reads and naturally idempotent tools: no record, the upstream answers as it is.
        let tool = call.tool.clone();
        let begun = gw.engine().begin(call, &policy).await;
        idemgate_trace::record_begun(&tracing::Span::current(), &begun);
        begun.map_err(|e| Problem::from_engine(&e))?;
        let trace = idemgate_trace::outgoing(caller.as_ref());
        return match send(&gw, &outgoing, None, trace, deadline).await {
            Ok(up) => {
                if outgoing.profile == Profile::X402 && up.status != StatusCode::PAYMENT_REQUIRED {
                    // x402 passes a request without a payment unrecorded because a paid
                    // resource answers it 402: one that served it broke that contract.
                    tracing::warn!(
                        tool = %tool,
                        status = up.status.as_u16(),
                        "an x402 tool answered a request without a payment other than 402; it passed without a record, so a retry of it is not caught"
                    );
                }
                Ok(up.into_response())
            }
            Err(e) => Err(unreachable(&e)),
        };
    };
    let digest = named.key.digest();
    let mut quota_exceeded = false;
    let refused = &mut quota_exceeded;
    // What the upstream answered, for a call observe mode runs past a standing record: its
    // caller gets that answer as it came.
    let profile = outgoing.profile;
    let mut relay = None;
    let sent_back = &mut relay;
    let effect = {
        let (gw, tenant) = (gw.clone(), tenant.clone());
        move || async move {
            if !tenant
                .live
                .hold(digest, Instant::now() + deadline + Duration::from_secs(1))
            {
                *refused = true;
                return Effect::not_applied("quota exceeded");
            }
            // Inside the engine's `idemgate.effect`: the upstream's spans are its children.
            let trace = idemgate_trace::outgoing(caller.as_ref());
            let sent = send(&gw, &outgoing, Some(hex(&digest)), trace, deadline).await;
            tenant.live.release(&digest);
            let effect = classify(&sent, outgoing.profile);
            *sent_back = Some(sent);
            effect
        }
    };
    let result = gw.engine().call_with_policy(call, &policy, effect).await;
    idemgate_trace::record(&tracing::Span::current(), &result);
    let answer = result.map_err(|e| Problem::from_engine(&e))?;
    if quota_exceeded {
        gw.quota_exceeded(&named.key);
        return Err(Problem::quota_exceeded(tenant.live.max()));
    }
    match (&answer.decision, relay) {
        (Decision::PassedThrough { .. }, Some(sent)) => {
            return match sent {
                Ok(up) => Ok(up.into_response()),
                Err(e) => Err(unreachable(&e)),
            }
        }
        // An answer the profile reads as unknown (x402's failed settlement) is this call's own
        // answer: its caller gets it as it came (the receipt says what failed); a retry is then
        // refused as unknown.
        (Decision::Unknown { ran_here: true, .. }, Some(Ok(up)))
            if matches!(
                profile.reads(up.status, &up.kept),
                Some(Reading::Unknown(_))
            ) =>
        {
            return Ok(up.into_response());
        }
        _ => {}
    }
    respond(answer, Shape::Forwarded, &policy)
}

fn text(v: Option<&HeaderValue>) -> Option<String> {
    v.and_then(|v| v.to_str().ok()).map(str::to_owned)
}

/// Maps what the upstream did onto what the engine records (docs/HTTP.md, "Upstream result
/// mapping").
fn classify(sent: &Result<Upstream, reqwest::Error>, profile: Profile) -> Effect {
    match sent {
        // An answer the profile reads otherwise (`Profile::reads`): released, the caller gets
        // it and the key is free for the retry, which runs fresh (the upstream got the same
        // downstream key both times); or unknown.
        Ok(up) => match profile.reads(up.status, &up.kept) {
            Some(Reading::Released) => Effect::NotApplied {
                message: format!("the upstream answered {}", up.status),
                reply: Some(up.payload()),
            },
            Some(Reading::Unknown(why)) => Effect::Ambiguous(why.to_owned()),
            None => classify_by_status(up),
        },
        Err(e) if e.is_connect() => {
            // A failed connect never sent a byte of the request.
            Effect::not_applied(format!(
                "failed to connect to the upstream: {}",
                error_chain(e)
            ))
        }
        Err(e) if e.is_timeout() => {
            Effect::Ambiguous("the upstream did not answer in time".to_owned())
        }
        Err(e) => Effect::Ambiguous(format!(
            "the connection to the upstream failed after sending: {}",
            error_chain(e)
        )),
    }
}

/// What the upstream's answer says of the side effect by its status, under idemgate's own
/// contract.
fn classify_by_status(up: &Upstream) -> Effect {
    if up.status.is_success() {
        Effect::Success(up.payload())
    } else if up.status == StatusCode::TOO_MANY_REQUESTS {
        // The upstream refused before acting: its answer goes back to this caller only.
        Effect::NotApplied {
            message: "the upstream answered 429".to_owned(),
            reply: Some(up.payload()),
        }
    } else if up.status.is_client_error() && up.status != StatusCode::REQUEST_TIMEOUT {
        Effect::Failed(up.payload())
    } else {
        Effect::Ambiguous(format!("the upstream answered {}", up.status))
    }
}

/// Leaves time, within the whole-request timeout, to record what the upstream did.
fn upstream_deadline(request_timeout: Duration) -> Duration {
    request_timeout.saturating_sub((request_timeout / 10).min(Duration::from_secs(1)))
}

async fn send(
    gw: &Gateway,
    outgoing: &Outgoing,
    key: Option<String>,
    trace: Option<TraceContext>,
    timeout: Duration,
) -> Result<Upstream, reqwest::Error> {
    let mut req = gw
        .client()
        .post(&outgoing.url)
        .header(header::CONTENT_TYPE, "application/json")
        .body(outgoing.body.clone())
        .timeout(timeout);
    for (name, value) in &outgoing.headers {
        req = req.header(name, value);
    }
    if let Some(k) = key {
        req = req.header(IDEMPOTENCY_KEY, k);
    }
    if let Some(trace) = trace {
        req = req.header("traceparent", trace.traceparent());
        if let Some(state) = trace.tracestate() {
            req = req.header("tracestate", state);
        }
    }
    let res = req.send().await?;
    let status = res.status();
    let content_type = res.headers().get(header::CONTENT_TYPE).cloned();
    let retry_after = res.headers().get(header::RETRY_AFTER).cloned();
    let kept = outgoing
        .profile
        .kept_headers()
        .iter()
        .flat_map(|name| res.headers().get_all(name).iter().map(move |v| (name, v)))
        .filter_map(|(name, v)| Some((name.as_str().to_owned(), v.to_str().ok()?.to_owned())))
        .collect();
    let body = res.bytes().await?;
    Ok(Upstream {
        status,
        content_type,
        retry_after,
        kept,
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

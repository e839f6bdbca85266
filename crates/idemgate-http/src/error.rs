//! Errors: the gateway's own (start-up, serving) and the problem answers it gives callers.

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use idemgate::{EngineError, KeyRule, StoreError, Verdict};
use idemgate_kit::{Door, Explanation, Refusal, Resolve, VerdictCodes, What};
use serde_json::{json, Map, Value};

/// How the gateway's problems name things: never the raw key (callers know it; answers and logs
/// stay free of it) but in the path that settles its record, which the caller sends as it is, and
/// never the store's insides.
pub(crate) const DOOR: Door<'static> = Door {
    effect: "the side effect",
    record: "this key",
    resolve: Resolve::Http,
    repeat: "send it again with a new Idempotency-Key",
    add_key: "send it in the Idempotency-Key header",
    discreet: true,
};

/// Why the gateway could not start or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration is invalid.
    #[error("failed to load {origin}: {message}")]
    Config {
        /// The file (or "configuration" for text).
        origin: String,
        /// What is wrong, naming the field.
        message: String,
    },
    /// The store could not be opened.
    // Sources are not repeated in the messages: error reports print the whole chain.
    #[error("failed to open the store")]
    Store(#[source] StoreError),
    /// The journal or the audit log could not be opened.
    #[error("failed to open {what} {path}")]
    File {
        /// Which file.
        what: &'static str,
        /// Its path.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The listening socket could not be bound or accepted on.
    #[error("failed to listen on {addr}")]
    Listen {
        /// The address.
        addr: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The HTTP client for upstreams could not be built.
    #[error("failed to build the upstream HTTP client")]
    Client(#[source] reqwest::Error),
}

/// An RFC 9457 problem answer (`application/problem+json`).
#[derive(Clone, Debug)]
pub(crate) struct Problem {
    pub(crate) status: StatusCode,
    /// The last part of its type URI (`idemgate_kit::problem_type`).
    pub(crate) name: &'static str,
    pub(crate) title: &'static str,
    pub(crate) detail: String,
    pub(crate) retry_after: Option<Duration>,
    /// Extra members (`since`, `fence`...: the kit's facts).
    pub(crate) extra: Map<String, Value>,
    /// `Idempotent-Replayed: false` and `Idempotency-Rule` when the answer is about a record.
    pub(crate) rule: Option<KeyRule>,
}

impl Problem {
    pub(crate) fn new(
        status: StatusCode,
        name: &'static str,
        title: &'static str,
        detail: impl Into<String>,
    ) -> Self {
        Problem {
            status,
            name,
            title,
            detail: detail.into(),
            retry_after: None,
            extra: Map::new(),
            rule: None,
        }
    }

    /// The problem of a verdict (its status, name and title), with `detail`.
    pub(crate) fn of(verdict: Verdict, detail: impl Into<String>) -> Self {
        let (name, title) = verdict.problem();
        let status = StatusCode::from_u16(verdict.http_status())
            .expect("the verdict table holds valid status codes");
        Problem::new(status, name, title, detail)
    }

    pub(crate) fn unauthorized() -> Self {
        Problem::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "Unauthorized",
            "a valid `Authorization: Bearer <token>` header is required",
        )
    }

    pub(crate) fn bad_request(detail: impl Into<String>) -> Self {
        Problem::of(Verdict::BadRequest, detail)
    }

    pub(crate) fn not_found(detail: impl Into<String>) -> Self {
        Problem::of(Verdict::NotFound, detail)
    }

    pub(crate) fn payload_too_large(max: u64) -> Self {
        Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload-too-large",
            "Payload too large",
            format!("the request body is larger than the limit of {max} bytes"),
        )
    }

    pub(crate) fn lease_lost() -> Self {
        Problem::explained(&Explanation::refused(Refusal::LeaseLost))
    }

    /// The store failed before anything ran.
    pub(crate) fn store_unavailable(detail: impl Into<String>) -> Self {
        Problem::of(Verdict::StoreUnavailable, detail)
    }

    pub(crate) fn timeout(after: Duration) -> Self {
        Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "timeout",
            "Request timeout",
            format!(
                "the request took longer than the limit of {}",
                humantime::format_duration(after)
            ),
        )
    }

    pub(crate) fn quota_exceeded(max: Option<usize>) -> Self {
        Problem::of(
            Verdict::QuotaExceeded,
            format!(
                "the tenant already holds its limit of {} keys in flight; nothing ran",
                max.unwrap_or_default()
            ),
        )
        .with_retry_after(Duration::from_secs(1))
    }

    pub(crate) fn with_retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    pub(crate) fn with_rule(mut self, rule: Option<KeyRule>) -> Self {
        self.rule = rule;
        self
    }

    /// The problem for an engine error: the kit's problem document of its explanation.
    pub(crate) fn from_engine(e: &EngineError) -> Self {
        Problem::explained(&Explanation::of_error(e))
    }

    /// The kit's problem document of an explanation, as the gateway names things ([`DOOR`]): its
    /// status, type and title from the verdict, its detail and members from the explanation, the
    /// rule that named its record and when to ask again as headers.
    pub(crate) fn explained(explanation: &Explanation) -> Self {
        let told = explanation.problem(&DOOR);
        let mut problem = Problem::of(told.verdict, told.detail).with_rule(explanation.rule);
        problem.extra = told.members;
        if let What::InFlight { retry_after, .. } = explanation.what {
            problem = problem.with_retry_after(retry_after);
        }
        problem
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let mut body = Map::new();
        body.insert("type".into(), json!(idemgate_kit::problem_type(self.name)));
        body.insert("title".into(), json!(self.title));
        body.insert("status".into(), json!(self.status.as_u16()));
        body.insert("detail".into(), json!(self.detail));
        body.extend(self.extra);
        let mut res = (self.status, Value::Object(body).to_string()).into_response();
        let h = res.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(after) = self.retry_after {
            set_retry_after(h, after);
        }
        if let Some(rule) = self.rule {
            crate::headers::set_record_headers(h, false, rule, None, None);
        }
        res
    }
}

/// `Retry-After` of `after`, in whole seconds rounded up (at least 1), so a client never asks
/// again too early: every refusal's, whichever protocol's shape it is written in.
pub(crate) fn set_retry_after(h: &mut axum::http::HeaderMap, after: Duration) {
    let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
    h.insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
}

/// An error of a request the gateway made (to an upstream, to a verify URL) with its causes,
/// without the URL (which may carry credentials). Here, with the gateway's other wording of
/// errors, so that the forwarding and the verifier both use it without importing each other.
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

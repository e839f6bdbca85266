//! The HTTP verifier: for a tool with `on_unknown = "verify"`, asks the tool's `verify_url`
//! whether the side effect of an unknown record happened.

use std::time::Duration;

use idemgate::key::hex;
use idemgate::{Key, OutcomeKind, Probe, ProbeFuture, Verifier};
use idemgate_kit::Payload;
use serde::Deserialize;
use serde_json::json;
use serde_json::value::RawValue;

use crate::error::error_chain;
use crate::headers::IDEMPOTENCY_KEY;

/// Asks `url` about a record by its downstream key (the 64-hex digest the upstream got).
#[derive(Debug)]
pub(crate) struct HttpVerifier {
    client: reqwest::Client,
    url: String,
    timeout: Duration,
}

/// What the verify URL answers. (Not an internally tagged enum: serde buffers those, and a
/// buffered value cannot become a `RawValue`.)
#[derive(Debug, Deserialize)]
struct Answer {
    status: Status,
    /// The call's result under `applied`; null when absent.
    #[serde(default)]
    result: Option<Box<RawValue>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Status {
    Applied,
    NotApplied,
    Unknown,
}

impl HttpVerifier {
    pub(crate) fn new(client: reqwest::Client, url: String, timeout: Duration) -> Self {
        HttpVerifier {
            client,
            url,
            timeout,
        }
    }

    async fn probe(&self, key: &Key) -> Result<Probe, String> {
        let digest = hex(&key.digest());
        // Errors name neither the URL (it may carry credentials) nor the raw key.
        let res = self
            .client
            .post(&self.url)
            .header(IDEMPOTENCY_KEY, &digest)
            .json(&json!({"idempotency_key": digest, "tool": key.tool.as_str()}))
            .timeout(self.timeout)
            .send()
            .await
            .map_err(|e| format!("failed to ask the verify URL: {}", error_chain(&e)))?;
        let status = res.status();
        if !status.is_success() {
            return Err(format!("the verify URL answered {status}"));
        }
        let body = res.bytes().await.map_err(|e| {
            format!(
                "failed to read the verify URL's answer: {}",
                error_chain(&e)
            )
        })?;
        let answer: Answer = serde_json::from_slice(&body).map_err(|e| {
            format!(
                "the verify URL's answer is not {{\"status\": \"applied\"|\"not_applied\"|\"unknown\"}}: {e}"
            )
        })?;
        let probe = match answer.status {
            // Stored as a JSON result: a forwarded call replays it as a 200 JSON answer, the
            // coordination API as its `result` (the stored-outcome format is every door's).
            Status::Applied => Probe::Applied(
                Payload::Json(answer.result.unwrap_or_else(|| {
                    RawValue::from_string("null".to_owned()).expect("null is JSON")
                }))
                .into_outcome(OutcomeKind::Success),
            ),
            Status::NotApplied => Probe::NotApplied,
            Status::Unknown => Probe::Unknown,
        };
        tracing::info!(tool = %key.tool, key = %idemgate_kit::log::short(key), probe = ?ProbeName(&probe), "verified");
        Ok(probe)
    }
}

impl Verifier for HttpVerifier {
    fn verify<'a>(&'a self, key: &'a Key) -> ProbeFuture<'a> {
        Box::pin(self.probe(key))
    }
}

/// A probe for the logs, without its result.
struct ProbeName<'a>(&'a Probe);

impl std::fmt::Debug for ProbeName<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.0 {
            Probe::Applied(_) => "applied",
            Probe::NotApplied => "not_applied",
            Probe::Unknown => "unknown",
        })
    }
}

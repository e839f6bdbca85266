//! Verifiers written in Python: asked, on a thread of the runtime's blocking pool, what happened
//! to a call whose record is unknown.

use std::sync::Arc;

use idemgate::{Key, OutcomeKind};
use idemgate_kit::Payload;
use pyo3::prelude::*;

/// A tool's verifier written in Python: `verify(tool, key, downstream_key)`, called when a call
/// finds the tool's record unknown (the function may or may not have done its work) under the
/// policy `on_unknown = "verify"`, typically to look the side effect up downstream by its key.
/// It says what happened in the words of a tool function: it returns the result the side effect
/// had (JSON data: stored and replayed), raises `Failed(result)` (a terminal failure, stored),
/// `NotApplied` (it did not happen: the call runs now) or `MaybeApplied` (still cannot tell: the
/// record stays unknown); any other exception leaves it unknown too, its message recorded.
pub(crate) struct PyVerifier(pub(crate) Arc<Py<PyAny>>);

impl idemgate::Verifier for PyVerifier {
    fn verify<'a>(&'a self, key: &'a Key) -> idemgate::ProbeFuture<'a> {
        let verify = Arc::clone(&self.0);
        let (tool, k) = (key.tool.to_string(), key.key.as_str().to_owned());
        let downstream = idemgate::key::hex(&key.digest());
        Box::pin(async move {
            // On a thread of its own: a verifier asks another system and blocks while it does,
            // and it must not hold up the runtime's few workers (nor wait for the GIL on one).
            tokio::task::spawn_blocking(move || {
                Python::attach(|py| probe(py, verify.bind(py).call1((tool, k, downstream))))
            })
            .await
            .map_err(|e| format!("the verifier did not finish: {e}"))?
        })
    }
}

/// What a verifier's return or exception says (see [`PyVerifier`]).
fn probe(py: Python<'_>, answer: PyResult<Bound<'_, PyAny>>) -> Result<idemgate::Probe, String> {
    let applied =
        |kind: OutcomeKind, value: &Bound<'_, PyAny>| -> Result<idemgate::Probe, String> {
            let text: String = py
                .import("idemgate.engine")
                .and_then(|m| m.getattr("_json_text"))
                .and_then(|f| f.call1((value,)))
                .and_then(|t| t.extract())
                .map_err(|e| format!("the verifier's result is not JSON: {e}"))?;
            let payload = Payload::json_text(&text).map_err(|e| e.to_string())?;
            Ok(idemgate::Probe::Applied(idemgate::Outcome {
                kind,
                body: payload.encode(),
            }))
        };
    let raised = match answer {
        Ok(value) => return applied(OutcomeKind::Success, &value),
        Err(e) => e.into_value(py).into_bound(py),
    };
    let class = |name: &str| py.import("idemgate.errors").and_then(|m| m.getattr(name));
    let is = |name: &str| {
        class(name)
            .and_then(|c| raised.is_instance(&c))
            .unwrap_or(false)
    };
    if is("NotApplied") {
        Ok(idemgate::Probe::NotApplied)
    } else if is("Failed") {
        let result = raised
            .getattr("result")
            .map_err(|e| format!("Failed without a result: {e}"))?;
        applied(OutcomeKind::Failed, &result)
    } else if is("MaybeApplied") {
        Ok(idemgate::Probe::Unknown)
    } else {
        Err(raised.to_string())
    }
}

//! Records as an operator sees and resolves them (`Engine.record`, `records`, `resolve`): the JSON
//! view every door shows, and a resolution from Python's words.

use idemgate::OutcomeKind;
use idemgate_kit::Payload;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::policy::seconds;

/// A record as JSON text, the shape `idemgate keys show --json` prints from, with the outcome as
/// every door shows it: its kind and its content as JSON, not raw bytes.
pub(crate) fn record_view(record: &idemgate::Record) -> PyResult<String> {
    let mut view =
        serde_json::to_value(record).map_err(|e| PyValueError::new_err(e.to_string()))?;
    if let (idemgate::RecordState::Completed { outcome, .. }, Some(o)) =
        (&record.state, view.get_mut("outcome"))
    {
        if let Ok(payload) = Payload::of(outcome) {
            o["content"] = payload.content().into();
            o["body"] =
                serde_json::from_str(payload.to_json().get()).unwrap_or(serde_json::Value::Null);
        }
    }
    Ok(view.to_string())
}

/// How an operator resolves an unknown record, from `Engine.resolve`'s words (`resolution`, and
/// `result`, `failed` and `ttl` for `completed`); the error is the message of the `ValueError` it
/// raises.
pub(crate) fn resolution(
    resolution: &str,
    result: Option<&str>,
    failed: bool,
    ttl: f64,
) -> Result<idemgate::Resolution, String> {
    Ok(match (resolution, result) {
        ("completed", Some(text)) => idemgate::Resolution::Completed {
            // Marked, so that replays say an operator resolved it then, not that it ran then.
            outcome: Payload::json_text(text)
                .map_err(|e| format!("invalid result: {e}"))?
                .into_resolution(if failed {
                    OutcomeKind::Failed
                } else {
                    OutcomeKind::Success
                }),
            ttl: seconds("ttl", ttl)?,
        },
        ("completed", None) => {
            return Err("resolution \"completed\" needs the result the side effect had".to_owned())
        }
        ("release", None) => idemgate::Resolution::Release,
        ("release", Some(_)) => {
            return Err("resolution \"release\" takes no result: nothing happened".to_owned())
        }
        (other, _) => {
            return Err(format!(
                "unknown resolution {other:?}: expected \"completed\" or \"release\""
            ))
        }
    })
}

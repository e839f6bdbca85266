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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use idemgate::{Effect, Key, Resolution};

    use super::*;
    use crate::test_support::{memory_engine, ticket};

    #[test]
    fn completed_stores_the_result_marked_as_an_operators() {
        for (failed, kind) in [(false, OutcomeKind::Success), (true, OutcomeKind::Failed)] {
            let Resolution::Completed { outcome, ttl } =
                resolution("completed", Some(r#"{"id":7}"#), failed, 60.0).unwrap()
            else {
                panic!("completed resolves as completed");
            };
            assert_eq!(outcome.kind, kind);
            assert!(Payload::is_resolution(&outcome));
            let payload = Payload::of(&outcome).unwrap();
            assert_eq!(payload.to_json().get(), r#"{"id":7}"#);
            assert_eq!(ttl, Duration::from_secs(60));
        }
    }

    #[test]
    fn release_takes_no_result() {
        assert_eq!(
            resolution("release", None, false, 1.0),
            Ok(Resolution::Release)
        );
        assert_eq!(
            resolution("release", Some("1"), false, 1.0).unwrap_err(),
            "resolution \"release\" takes no result: nothing happened"
        );
    }

    #[test]
    fn a_resolution_python_spelled_wrong_is_refused() {
        assert_eq!(
            resolution("completed", None, false, 1.0).unwrap_err(),
            "resolution \"completed\" needs the result the side effect had"
        );
        assert_eq!(
            resolution("done", None, false, 1.0).unwrap_err(),
            "unknown resolution \"done\": expected \"completed\" or \"release\""
        );
        // The result is read before the ttl, as `resolve` always checked them.
        let e = resolution("completed", Some("{nope"), false, -1.0).unwrap_err();
        assert!(e.starts_with("invalid result: "), "{e}");
        let e = resolution("completed", Some("1"), false, -1.0).unwrap_err();
        assert!(
            e.starts_with("ttl must be a number of seconds >= 0: "),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_completed_record_shows_its_content_as_json() {
        let shared = memory_engine().await;
        let t = ticket(&shared, "k-view", Duration::from_secs(30)).await;
        let body = Payload::json_text(r#"{"sent":true}"#).unwrap().encode();
        shared.engine.finish(&t, Effect::Success(body)).await;
        let key: &Key = &t.key;
        let record = shared.engine.get(key).await.unwrap().unwrap();
        let view: serde_json::Value = serde_json::from_str(&record_view(&record).unwrap()).unwrap();
        assert_eq!(view["key"]["key"], "k-view", "{view}");
        assert_eq!(view["outcome"]["content"], "json", "{view}");
        assert_eq!(
            view["outcome"]["body"],
            serde_json::json!({"sent": true}),
            "{view}"
        );
    }
}

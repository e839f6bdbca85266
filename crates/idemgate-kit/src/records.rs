//! Records as an operator sees and resolves them from an in-process door (the Python and Node
//! packages' `record`, `records`, `resolve`): the JSON view every door shows, and a resolution
//! from the words those packages take.

use std::time::Duration;

use idemgate_core::{
    Engine, EngineError, HistoryEntry, Keep, OutcomeKind, Record, RecordState, Resolution, Store,
};
use serde_json::Value;

use crate::{story, Payload};

/// A duration a caller gave in seconds (`what` names it in the error).
pub fn seconds(what: &str, s: f64) -> Result<Duration, String> {
    Duration::try_from_secs_f64(s)
        .map_err(|e| format!("{what} must be a number of seconds >= 0: {e}"))
}

/// A record as JSON, the shape `idemgate keys show --json` prints from, with the outcome as every
/// door shows it (its kind and its content as JSON, not raw bytes), and its story: the key a
/// downstream sees (`downstream_key`), why it is unknown (`reason`, for an unknown record), and
/// every step from its state and its `history` ([`crate::story`]).
pub fn record_view(record: &Record, history: &[HistoryEntry]) -> Result<Value, serde_json::Error> {
    let mut view = serde_json::to_value(record)?;
    view["downstream_key"] = story::downstream_key(&record.key).into();
    if let Some(reason) = story::unknown_reason(record, history) {
        view["reason"] = reason.into();
    }
    view["history"] = serde_json::to_value(story::story(Some(record), history))?;
    if let (RecordState::Completed { outcome, .. }, Some(o)) =
        (&record.state, view.get_mut("outcome"))
    {
        if let Ok(payload) = Payload::of(outcome) {
            o["content"] = payload.content().into();
            o["body"] = serde_json::from_str(payload.to_json().get()).unwrap_or(Value::Null);
        }
    }
    Ok(view)
}

/// `record` as [`record_view`] shows it, its history read from `engine`'s store: what the Python
/// and Node packages' `record()` and `records()` answer.
///
/// # Errors
/// When the store fails to give the history.
pub async fn viewed<S: Store>(engine: &Engine<S>, record: &Record) -> Result<Value, EngineError> {
    let history = engine.history(&record.key).await?;
    // A record and its history are plain data: serializing them cannot fail.
    Ok(record_view(record, &history).unwrap_or(Value::Null))
}

/// The records among `records` whose history holds what observe mode recorded, each with it, in
/// their order: what `keys list --observed` and the console's observed filter show. One history
/// read per record: observations live in histories, which no store filters on.
///
/// # Errors
/// When the store fails to give a history.
pub async fn observed<S: Store>(
    engine: &Engine<S>,
    records: Vec<Record>,
) -> Result<Vec<(Record, story::Observed)>, EngineError> {
    let mut kept = Vec::new();
    for record in records {
        let seen = story::Observed::of(&engine.history(&record.key).await?);
        if !seen.is_empty() {
            kept.push((record, seen));
        }
    }
    Ok(kept)
}

/// How an operator resolves an unknown record, from a package's words (`resolution`, and
/// `result` as JSON text, `failed` and `ttl` in seconds for `completed`, remembered for the tool's
/// `tombstone` after); the error says what is wrong in the caller's terms.
pub fn resolution(
    resolution: &str,
    result: Option<&str>,
    failed: bool,
    ttl: f64,
    tombstone: Duration,
) -> Result<Resolution, String> {
    Ok(match (resolution, result) {
        ("completed", Some(text)) => Resolution::Completed {
            // Marked, so that replays say an operator resolved it then, not that it ran then.
            outcome: Payload::json_text(text)
                .map_err(|e| format!("invalid result: {e}"))?
                .into_resolution(if failed {
                    OutcomeKind::Failed
                } else {
                    OutcomeKind::Success
                }),
            keep: Keep {
                ttl: seconds("ttl", ttl)?,
                tombstone,
            },
        },
        ("completed", None) => {
            return Err("resolution \"completed\" needs the result the side effect had".to_owned())
        }
        ("release", None) => Resolution::Release,
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
    use idemgate_core::{Begun, Call, Effect, Engine, IdempotencyKey, MemoryStore, TenantId};
    use idemgate_core::{ToolName, ToolPolicy};

    use super::*;

    #[test]
    fn completed_stores_the_result_marked_as_an_operators() {
        for (failed, kind) in [(false, OutcomeKind::Success), (true, OutcomeKind::Failed)] {
            let Resolution::Completed { outcome, keep } = resolution(
                "completed",
                Some(r#"{"id":7}"#),
                failed,
                60.0,
                Duration::from_secs(600),
            )
            .unwrap() else {
                panic!("completed resolves as completed");
            };
            assert_eq!(outcome.kind, kind);
            assert!(Payload::is_resolution(&outcome));
            let payload = Payload::of(&outcome).unwrap();
            assert_eq!(payload.to_json().get(), r#"{"id":7}"#);
            assert_eq!(keep.ttl, Duration::from_secs(60));
            assert_eq!(keep.tombstone, Duration::from_secs(600));
        }
    }

    #[test]
    fn release_takes_no_result() {
        assert_eq!(
            resolution("release", None, false, 1.0, Duration::ZERO),
            Ok(Resolution::Release)
        );
        assert_eq!(
            resolution("release", Some("1"), false, 1.0, Duration::ZERO).unwrap_err(),
            "resolution \"release\" takes no result: nothing happened"
        );
    }

    #[test]
    fn a_resolution_spelled_wrong_is_refused() {
        assert_eq!(
            resolution("completed", None, false, 1.0, Duration::ZERO).unwrap_err(),
            "resolution \"completed\" needs the result the side effect had"
        );
        assert_eq!(
            resolution("done", None, false, 1.0, Duration::ZERO).unwrap_err(),
            "unknown resolution \"done\": expected \"completed\" or \"release\""
        );
        // The result is read before the ttl.
        let e = resolution("completed", Some("{nope"), false, -1.0, Duration::ZERO).unwrap_err();
        assert!(e.starts_with("invalid result: "), "{e}");
        let e = resolution("completed", Some("1"), false, -1.0, Duration::ZERO).unwrap_err();
        assert!(
            e.starts_with("ttl must be a number of seconds >= 0: "),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_completed_record_shows_its_content_as_json() {
        let engine = Engine::new(MemoryStore::new());
        let call = Call::new(TenantId::new("t").unwrap(), ToolName::new("send").unwrap())
            .key(IdempotencyKey::explicit("k-view").unwrap());
        let Begun::Execute(t) = engine.begin(call, &ToolPolicy::default()).await.unwrap() else {
            panic!("a fresh key executes");
        };
        let body = Payload::json_text(r#"{"sent":true}"#).unwrap().encode();
        engine.finish(&t, Effect::Success(body)).await;
        let record = engine.get(&t.key).await.unwrap().unwrap();
        let view = viewed(&engine, &record).await.unwrap();
        assert_eq!(view["key"]["key"], "k-view", "{view}");
        assert_eq!(view["downstream_key"], story::downstream_key(&t.key));
        assert_eq!(view["history"][0]["what"], "reserved", "{view}");
        assert_eq!(view["history"][1]["what"], "completed", "{view}");
        assert!(view.get("reason").is_none(), "{view}");
        assert_eq!(view["outcome"]["content"], "json", "{view}");
        assert_eq!(
            view["outcome"]["body"],
            serde_json::json!({"sent": true}),
            "{view}"
        );
    }
}

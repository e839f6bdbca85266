//! The one place the engine's answers become MCP answers: a relayed server frame, a replayed
//! `CallToolResult`, or the proxy's own `isError` result. Which one, and its `_meta`, come from
//! the [`Verdict`] table; the match on it is exhaustive, so a new verdict is a compile error here
//! rather than an invented answer.

use idemgate_core::{Answer, Decision, EngineError, KeyRule, Timestamp, ToolPolicy, Verdict};
use idemgate_kit::Payload;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use crate::catalog::KEY_ARGUMENTS;
use crate::era;
use crate::frame::{self, Object};
use crate::session::Reply;

/// The `_meta` key a client puts its idempotency key under.
pub const META_KEY: &str = "dev.idemgate/idempotency-key";
/// The `_meta` key a client names its conversation under: calls without a key are joined by
/// the fallback window within one conversation only (without it, within one MCP session).
pub const META_CONVERSATION: &str = "dev.idemgate/conversation";
/// `_meta` of a replay: true.
pub const META_REPLAYED: &str = "dev.idemgate/replayed";
/// `_meta` of a replay: when the action ran (RFC 3339).
pub const META_EXECUTED_AT: &str = "dev.idemgate/executed_at";
/// `_meta` of a replay: which rule named the record, `explicit` (a key) or `fallback`.
pub const META_RULE: &str = "dev.idemgate/rule";
/// `_meta` of a replay of an operator's resolution (`idemgate keys resolve`): `operator`; its
/// `executed_at` is then when the operator resolved it.
pub const META_RESOLVED_BY: &str = "dev.idemgate/resolved_by";
/// `_meta` of the proxy's own answers: the verdict's label (`in_flight`, `unknown`, ...).
pub const META_VERDICT: &str = "dev.idemgate/verdict";
/// `_meta` of the proxy's own answers: the problem type URI.
pub const META_PROBLEM: &str = "dev.idemgate/problem";
/// `_meta` of in-flight answers: seconds to wait before calling again.
pub const META_RETRY_AFTER: &str = "dev.idemgate/retry_after_secs";
/// `_meta` of unknown answers: the record's fence, for `idemgate keys resolve --fence`.
pub const META_FENCE: &str = "dev.idemgate/fence";
/// `_meta` of in-flight and unknown answers: since when.
pub const META_SINCE: &str = "dev.idemgate/since";
/// Whether a request's params say it speaks 2026-07-28 or later: answers the proxy writes itself
/// (its own results, replays) then carry `resultType`, which that era's clients require (a result
/// the server wrote goes back as it was, or typed by the session when the server is legacy).
pub(crate) fn wants_result_type(params: &Object) -> bool {
    era::modern_version(params).is_some()
}

/// What the answer needs to know about the call besides the engine's answer.
pub(crate) struct CallContext<'a> {
    /// The client's request id.
    pub(crate) id: &'a RawValue,
    /// The server's name for the tool.
    pub(crate) tool: &'a str,
    /// The record scope (`<server>/<tool>`).
    pub(crate) scope: &'a str,
    /// The tenant.
    pub(crate) tenant: &'a str,
    /// The tool's policy.
    pub(crate) policy: &'a ToolPolicy,
    /// Whether replays get the text block that says so.
    pub(crate) replay_notice: bool,
    /// Whether the request speaks an era whose results carry `resultType` ([`wants_result_type`]).
    pub(crate) result_type: bool,
}

/// The frame that answers a `tools/call`, given what the engine decided and what the server
/// answered (when the call reached it).
pub(crate) fn respond(
    cx: &CallContext<'_>,
    result: Result<Answer, EngineError>,
    relay: Option<Reply>,
) -> String {
    let verdict = Verdict::of(&result);
    let (answer, error) = match result {
        Ok(a) => (Some(a), None),
        Err(e) => (None, Some(e)),
    };
    let rule = answer.as_ref().and_then(|a| a.rule);
    let decision = answer.map(|a| a.decision);
    match (verdict, decision) {
        // The call reached the server: its own answer goes back as the server wrote it.
        (
            Verdict::Executed | Verdict::PassedThrough | Verdict::LeaseLost | Verdict::Unrecorded,
            _,
        ) => match relay {
            Some(Reply::Answer { frame, .. }) => relayed(cx, frame),
            Some(Reply::Closed(why)) => own(
                cx,
                Verdict::Unknown,
                format!("The tool {} did not answer: {why}.", cx.tool),
                Map::new(),
            ),
            None => own(
                cx,
                verdict,
                format!("The tool {} ended as {verdict}.", cx.tool),
                Map::new(),
            ),
        },
        (
            Verdict::Replayed,
            Some(Decision::Replayed {
                outcome,
                executed_at,
                ..
            }),
        ) => match Payload::of(&outcome) {
            Ok(p) => {
                let result = replayed(
                    &p.to_mcp_tool_result(outcome.kind),
                    Replay {
                        executed_at,
                        rule: rule.unwrap_or(KeyRule::Explicit),
                        resolved: Payload::is_resolution(&outcome),
                    },
                    cx.replay_notice,
                    cx.result_type,
                );
                frame::response(cx.id, &result)
            }
            Err(e) => own(
                cx,
                verdict,
                format!("This action was already performed at {executed_at} and was not repeated, but its stored result cannot be shown: {e}."),
                Map::new(),
            ),
        },
        (Verdict::NotApplied, Some(Decision::NotApplied { message, .. })) => match relay {
            // The server's own answer that it did nothing yet (an `input_required` interim
            // result) goes back as it was.
            Some(Reply::Answer { frame, .. }) => relayed(cx, frame),
            _ => own(
                cx,
                verdict,
                format!("Nothing was done: {message}. The call may be sent again."),
                Map::new(),
            ),
        },
        (Verdict::InFlight, Some(Decision::InFlight { since, retry_after })) => {
            let secs = retry_after.as_secs().max(1);
            own(
                cx,
                verdict,
                format!("This action is already running in another call (since {since}); it was not started again. Call again with the same key in about {secs} s to get its result."),
                meta([(META_RETRY_AFTER, json!(secs)), (META_SINCE, json!(since))]),
            )
        }
        (
            Verdict::Unknown,
            Some(Decision::Unknown {
                since,
                fence,
                ran_here,
                message,
                ..
            }),
        ) => {
            // The server's own answer (a JSON-RPC error, or a failure the proxy may have caused)
            // goes back as the server wrote it, in the request's era: it is this call's answer;
            // only its effect is uncertain.
            if let (true, Some(Reply::Answer { frame, .. })) = (ran_here, &relay) {
                return relayed(cx, frame.clone());
            }
            let why = message.unwrap_or_else(|| {
                "an earlier attempt stopped before its outcome was recorded".to_owned()
            });
            let resolve = format!(
                "Check whether it took effect; an operator records what happened with `idemgate keys resolve KEY --tool {} --tenant {} --fence {fence} --completed` (it did) or `--release` (it did not; the next call with this key runs the action again).",
                cx.scope, cx.tenant
            );
            let next = match (ran_here, cx.policy.on_unknown) {
                (false, idemgate_core::UnknownPolicy::Retry) => {
                    "The next call with the same key runs it again.".to_owned()
                }
                (false, _) => format!("It was NOT repeated, so that it cannot happen twice. {resolve}"),
                (true, _) => format!("It was sent to the tool once and calls with the same key will not send it again. {resolve}"),
            };
            own(
                cx,
                verdict,
                format!("The outcome of this action is unknown (since {since}): {why}. {next}"),
                meta([(META_FENCE, json!(fence)), (META_SINCE, json!(since))]),
            )
        }
        (Verdict::KeyRequired, _) => own(
            cx,
            verdict,
            format!(
                "The tool {tool} changes state, so this call needs an idempotency key, and none was sent; nothing was done. To the model: call {tool} again with the argument \"{arg}\" set to a value that names this one action (the same value on every retry of it, a new value for a new action). To the developer: put a stable key (for example the tool call id) in params._meta[\"{META_KEY}\"], or give the tool a fallback_window in the idemgate MCP configuration (docs/MCP.md).",
                tool = cx.tool,
                arg = KEY_ARGUMENTS[0],
            ),
            Map::new(),
        ),
        (Verdict::KeyReused, _) => own(
            cx,
            verdict,
            format!(
                "This idempotency key was already used for {} with other arguments, so nothing was done. Use a new key for a new action, and the same arguments when retrying an action. ({})",
                cx.tool,
                error.map(|e| e.to_string()).unwrap_or_default()
            ),
            Map::new(),
        ),
        (Verdict::StoreUnavailable, _) => own(
            cx,
            verdict,
            format!(
                "The idempotency store is unavailable, so nothing was done (the call was not sent to the tool). Try again later. ({})",
                error.map(|e| e.to_string()).unwrap_or_default()
            ),
            Map::new(),
        ),
        (
            Verdict::BadRequest
            | Verdict::Execute
            | Verdict::Replayed
            | Verdict::NotApplied
            | Verdict::InFlight
            | Verdict::Unknown
            | Verdict::QuotaExceeded
            | Verdict::RateLimited
            | Verdict::NotFound
            | Verdict::NotResolvable
            | Verdict::JournalFailed,
            _,
        ) => own(
            cx,
            verdict,
            match error {
                Some(e) => format!("Nothing was done: {e}."),
                None => format!("The call ended as {verdict}."),
            },
            Map::new(),
        ),
    }
}

/// The server's answer to the call, as it wrote it; a result without `resultType` (a legacy
/// server's) to a modern call gets one.
fn relayed(cx: &CallContext<'_>, frame: String) -> String {
    if !cx.result_type {
        // A modern server's task handle, in the words of the legacy client's era.
        return era::legacy_response(&frame).unwrap_or(frame);
    }
    era::completed_response(&frame, false).unwrap_or(frame)
}

/// The proxy's own answer to a call it could not even judge (bad params, a bad key).
pub(crate) fn refuse(cx: &CallContext<'_>, verdict: Verdict, text: String) -> String {
    own(cx, verdict, text, Map::new())
}

fn meta<const N: usize>(members: [(&str, Value); N]) -> Map<String, Value> {
    members
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
}

/// An `isError` result in the proxy's own words: text for the model, `_meta` for programs.
fn own(
    cx: &CallContext<'_>,
    verdict: Verdict,
    text: String,
    mut extra: Map<String, Value>,
) -> String {
    extra.insert(META_VERDICT.to_owned(), json!(verdict.label()));
    extra.insert(
        META_PROBLEM.to_owned(),
        json!(format!(
            "https://idemgate.dev/problems/{}",
            verdict.problem().0
        )),
    );
    let mut result = Object::new();
    result.insert(
        "content".to_owned(),
        frame::raw(&json!([{"type": "text", "text": format!("idemgate: {text}")}])),
    );
    result.insert("isError".to_owned(), frame::raw(&verdict.is_error()));
    result.insert("_meta".to_owned(), frame::raw(&extra));
    if cx.result_type {
        era::mark_complete(&mut result);
    }
    frame::response(cx.id, &frame::raw(&result))
}

/// A stored result marked as a replay in `_meta`, with the notice block unless turned off, and
/// `resultType` when `result_type` and the result (stored from an earlier era) has none.
/// What a replay says of the record it comes from.
struct Replay {
    /// When the action ran, or when an operator resolved it.
    executed_at: Timestamp,
    /// The rule that named the record.
    rule: KeyRule,
    /// Whether the outcome is an operator's resolution rather than one the tool returned.
    resolved: bool,
}

fn replayed(result: &RawValue, replay: Replay, notice: bool, result_type: bool) -> Box<RawValue> {
    let Replay {
        executed_at,
        rule,
        resolved,
    } = replay;
    let Some(mut obj) = frame::object(result) else {
        return result.to_owned();
    };
    let mut meta: Object = obj
        .get("_meta")
        .and_then(|m| frame::object(m))
        .unwrap_or_default();
    meta.insert(META_REPLAYED.to_owned(), frame::raw(&true));
    meta.insert(META_EXECUTED_AT.to_owned(), frame::raw(&executed_at));
    meta.insert(META_RULE.to_owned(), frame::raw(&rule));
    if resolved {
        meta.insert(META_RESOLVED_BY.to_owned(), frame::raw(&"operator"));
    }
    obj.insert("_meta".to_owned(), frame::raw(&meta));
    // A task handle has no content to add the notice to; its `_meta` says it is a replay.
    let task = obj.contains_key("task")
        || obj
            .get("resultType")
            .is_some_and(|t| t.get() == r#""task""#);
    // A call the window took for a repeat is always told so: the model must learn that what it
    // sent was not done again, and how to do it again on purpose.
    if (notice || rule == KeyRule::Fallback) && !task {
        let mut content: Vec<Box<RawValue>> = obj
            .get("content")
            .and_then(|c| serde_json::from_str(c.get()).ok())
            .unwrap_or_default();
        content.push(frame::raw(&json!({
            "type": "text",
            "text": if rule == KeyRule::Fallback {
                format!("idemgate: an identical call of this tool (the same arguments, without an idempotency key) ran at {executed_at} in this conversation, so this one was taken for a repeat of that action and was not run again; the result above is the one it returned then. To do it again on purpose, call the tool again with the argument idempotency_key set to a new value that names the new action.")
            } else if resolved {
                format!("idemgate: an operator resolved this action with `idemgate keys resolve` at {executed_at}; it was not run now, and the result above is the one the operator recorded.")
            } else {
                format!("idemgate: this action was already performed at {executed_at} and was not repeated; the result above is the one it returned then.")
            },
        })));
        obj.insert("content".to_owned(), frame::raw(&content));
    }
    if result_type {
        era::mark_complete(&mut obj);
    } else {
        era::nest_task(&mut obj);
    }
    frame::raw(&obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replay_keeps_the_result_and_says_so() {
        let stored = RawValue::from_string(
            r#"{"content":[{"type":"text","text":"ok"}],"structuredContent":{"n":12345678901234567890},"_meta":{"x":1}}"#.into(),
        )
        .unwrap();
        let at = Timestamp::from_millis(1_000);
        let out: Value = serde_json::from_str(
            replayed(
                &stored,
                Replay {
                    executed_at: at,
                    rule: KeyRule::Explicit,
                    resolved: false,
                },
                true,
                false,
            )
            .get(),
        )
        .unwrap();
        assert_eq!(out["_meta"]["x"], 1);
        assert_eq!(out["_meta"][META_REPLAYED], true);
        assert_eq!(out["_meta"][META_RULE], "explicit");
        assert_eq!(out["_meta"][META_EXECUTED_AT], "1970-01-01T00:00:01.000Z");
        assert_eq!(out["content"].as_array().unwrap().len(), 2);
        assert!(out["content"][1]["text"]
            .as_str()
            .unwrap()
            .contains("not repeated"));
        assert!(out.get("resultType").is_none(), "{out}");
        let quiet = replayed(
            &stored,
            Replay {
                executed_at: at,
                rule: KeyRule::Fallback,
                resolved: false,
            },
            false,
            false,
        );
        // An operator's resolution is replayed as what it is: resolved then, not run then.
        let resolved: Value = serde_json::from_str(
            replayed(
                &stored,
                Replay {
                    executed_at: at,
                    rule: KeyRule::Explicit,
                    resolved: true,
                },
                true,
                false,
            )
            .get(),
        )
        .unwrap();
        assert_eq!(
            resolved["_meta"][META_RESOLVED_BY], "operator",
            "{resolved}"
        );
        let notice = resolved["content"][1]["text"].as_str().unwrap();
        assert!(
            notice.contains("an operator resolved this action")
                && !notice.contains("already performed"),
            "{notice}"
        );
        assert!(quiet.get().contains(r#""n":12345678901234567890"#));
        // A call the window took for a repeat is told so, and how to repeat on purpose, even
        // where replays are otherwise quiet.
        let quiet: Value = serde_json::from_str(quiet.get()).unwrap();
        assert_eq!(quiet["_meta"][META_RULE], "fallback");
        let told = quiet["content"][1]["text"].as_str().unwrap();
        assert!(
            told.contains("taken for a repeat") && told.contains("idempotency_key"),
            "{told}"
        );
        let explicit = replayed(
            &stored,
            Replay {
                executed_at: at,
                rule: KeyRule::Explicit,
                resolved: false,
            },
            false,
            false,
        );
        let explicit: Value = serde_json::from_str(explicit.get()).unwrap();
        assert_eq!(explicit["content"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn answers_to_a_2026_era_call_carry_its_result_type() {
        let params = |version: &str| -> Object {
            frame::object(&frame::raw(
                &json!({"name": "t", "_meta": {era::META_PROTOCOL_VERSION: version}}),
            ))
            .unwrap()
        };
        assert!(wants_result_type(&params("2026-07-28")));
        assert!(!wants_result_type(&params("2025-11-25")));
        assert!(!wants_result_type(
            &frame::object(&frame::raw(&json!({"name": "t"}))).unwrap()
        ));

        // A result stored from a 2025-era call has none: a 2026-era replay adds it; one that has
        // it keeps its own.
        let at = Timestamp::from_millis(1_000);
        let old = RawValue::from_string(r#"{"content":[]}"#.into()).unwrap();
        let out: Value = serde_json::from_str(
            replayed(
                &old,
                Replay {
                    executed_at: at,
                    rule: KeyRule::Explicit,
                    resolved: false,
                },
                true,
                true,
            )
            .get(),
        )
        .unwrap();
        assert_eq!(out["resultType"], "complete", "{out}");
        let own_type =
            RawValue::from_string(r#"{"content":[],"resultType":"x-own"}"#.into()).unwrap();
        let out: Value = serde_json::from_str(
            replayed(
                &own_type,
                Replay {
                    executed_at: at,
                    rule: KeyRule::Explicit,
                    resolved: false,
                },
                true,
                true,
            )
            .get(),
        )
        .unwrap();
        assert_eq!(out["resultType"], "x-own", "{out}");

        // The proxy's own answers.
        let id = frame::raw(&1);
        let policy = ToolPolicy::default();
        let mut cx = CallContext {
            id: &id,
            tool: "t",
            scope: "s/t",
            tenant: "local",
            policy: &policy,
            replay_notice: true,
            result_type: true,
        };
        let answer = |cx: &CallContext<'_>| -> Value {
            serde_json::from_str(&refuse(cx, Verdict::KeyRequired, "no key".to_owned())).unwrap()
        };
        assert_eq!(answer(&cx)["result"]["resultType"], "complete");
        cx.result_type = false;
        assert!(answer(&cx)["result"].get("resultType").is_none());
    }
}

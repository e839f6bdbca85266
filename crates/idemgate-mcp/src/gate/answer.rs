//! The one place the engine's answers become MCP answers: a relayed server frame, a replayed
//! `CallToolResult`, or the proxy's own `isError` result. Which one, and its `_meta`, come from
//! the [`Verdict`] table; the match on it is exhaustive, so a new verdict is a compile error here
//! rather than an invented answer.

use idemgate_core::{
    Answer, Decision, EngineError, KeyRule, Timestamp, ToolPolicy, UnknownPolicy, Verdict,
};
use idemgate_kit::identity::Rule;
use idemgate_kit::{Door, Explanation, Payload, Resolve, VerdictCodes, What, MODEL_REPEAT};
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use super::catalog::KEY_ARGUMENTS;
use crate::peer::Reply;
use crate::wire::era;
use crate::wire::frame::{self, Object};

/// The `_meta` key a client puts its idempotency key under.
pub const META_KEY: &str = "dev.idemgate/idempotency-key";
/// The `_meta` key a client names its conversation under: calls without a key are joined by
/// the fallback window within one conversation only (without it, within one MCP session).
pub const META_CONVERSATION: &str = "dev.idemgate/conversation";
/// The `_meta` key a client (the packages' MCP integrations) puts its framework's tool-call id
/// under: it names the action within the call's conversation, backed by the re-emission window
/// (a key of the orchestration layer would name it everywhere, and get no window).
pub const META_CALL_ID: &str = "dev.idemgate/tool-call-id";
/// `_meta` of a replay: true.
pub const META_REPLAYED: &str = "dev.idemgate/replayed";
/// `_meta` of a replay: when the action ran (RFC 3339).
pub const META_EXECUTED_AT: &str = "dev.idemgate/executed_at";
/// `_meta` of a replay: which rule named the record, `explicit` (a key) or `fallback`.
pub const META_RULE: &str = "dev.idemgate/rule";
/// `_meta` of a replay: the rule of `idemgate_kit::identity` that named the action
/// (`orchestration_key`, `model_key`, `window`).
pub const META_NAMED_BY: &str = "dev.idemgate/named_by";
/// The member of a replay's `structuredContent` that carries the notice, for clients that show
/// the model only that channel (when the tool's output schema allows another member).
pub const STRUCTURED_NOTICE: &str = "idemgate_notice";
/// `_meta` of a replay of an operator's resolution (`idemgate keys resolve`): `operator`; its
/// `executed_at` is then when the operator resolved it.
pub const META_RESOLVED_BY: &str = "dev.idemgate/resolved_by";
/// `_meta` of the proxy's own answers: the verdict's label (`in_flight`, `unknown`, ...).
pub const META_VERDICT: &str = "dev.idemgate/verdict";
/// `_meta` of the proxy's own answers: the problem type URI.
pub const META_PROBLEM: &str = "dev.idemgate/problem";
/// `_meta` of in-flight answers: seconds to wait before calling again.
pub const META_RETRY_AFTER: &str = "dev.idemgate/retry_after_secs";
/// `_meta` of unknown and expired answers: the record's fence, for `idemgate keys resolve
/// --fence` or `idemgate keys reopen --fence`.
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
    /// The commerce protocol whose binding the server speaks, whose words the refusals it
    /// defines are written in.
    pub(crate) profile: Option<crate::config::Profile>,
    /// Whether replays get the text block that says so.
    pub(crate) replay_notice: bool,
    /// Whether the request speaks an era whose results carry `resultType` ([`wants_result_type`]).
    pub(crate) result_type: bool,
    /// What the call's judging found that its answers tell.
    pub(crate) named: Named,
}

/// What judging a call found that its answers tell: by which rule its action was named, and
/// what the server said of the tool.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Named {
    /// The rule that named the call's action (`idemgate_kit::identity`); `None` when the call
    /// was refused before it was named.
    pub(crate) rule: Option<Rule>,
    /// The server marks the tool read-only though its annotations are not trusted: a refusal
    /// for a missing key then says how to let its reads pass.
    pub(crate) hinted_read_only: bool,
    /// The tool's structured output takes a member its schema does not name
    /// ([`super::catalog::Tool::open_output`]).
    pub(crate) open_output: bool,
}

impl CallContext<'_> {
    /// How the explanations of this call name things.
    fn door<'d>(
        &self,
        effect: &'d str,
        record: &'d str,
        resolve: &'d str,
        add_key: &'d str,
    ) -> Door<'d> {
        Door {
            effect,
            record,
            resolve: Resolve::Command(resolve),
            repeat: MODEL_REPEAT,
            add_key,
            discreet: false,
        }
    }
}

/// The frame that answers a `tools/call`, given what the engine decided and what the server
/// answered (when the call reached it). The words come from the kit's [`Explanation`]; this says
/// only which frame carries them.
pub(crate) fn respond(
    cx: &CallContext<'_>,
    result: Result<Answer, EngineError>,
    relay: Option<Reply>,
) -> String {
    let explanation = Explanation::of(&result)
        .retried_when_unknown(cx.policy.on_unknown == UnknownPolicy::Retry)
        .named_by(&cx.policy.identity);
    let verdict = explanation.verdict;
    let effect = format!("the tool {}", cx.tool);
    // The record as a person finds it: its key when the engine named one.
    let key = explanation
        .key
        .as_ref()
        .map_or_else(|| "KEY".to_owned(), |k| k.key.as_str().to_owned());
    let record = format!("record {key} (tool {}, tenant {})", cx.scope, cx.tenant);
    let resolve = format!("{key} --tool {} --tenant {}", cx.scope, cx.tenant);
    // Under a commerce binding the key has the binding's own place (`meta`).
    let arg = cx
        .profile
        .filter(|p| p.binds(cx.tool))
        .and_then(|p| p.key_in_arguments())
        .map_or_else(
            || format!("the argument \"{}\"", KEY_ARGUMENTS[0]),
            |(_, path)| path.to_owned(),
        );
    let mut add_key = format!(
        "To the model: call {tool} again with {arg} set to a value that names this one action (the same value on every retry of it, a new value for a new action). To the developer: put a stable key (for example the tool call id) in params._meta[\"{META_KEY}\"], or give the tool a fallback_window in the idemgate MCP configuration (docs/MCP.md).",
        tool = cx.tool,
    );
    if cx.named.hinted_read_only {
        add_key.push_str(&format!(
            " The server marks {tool} read-only, but its annotations are not trusted: if it only reads, mark it kind = \"read\" under [tools.{tool}], or set trusted = true for this server, in the idemgate MCP configuration (docs/MCP.md).",
            tool = cx.tool,
        ));
    }
    let door = cx.door(&effect, &record, &resolve, &add_key);
    let text = explanation.for_model(&door);
    let server_answer = match relay {
        Some(Reply::Answer { frame, .. }) => Ok(frame),
        Some(Reply::Closed(why)) => Err(Some(why)),
        None => Err(None),
    };
    let retry_after = match &explanation.what {
        What::InFlight { retry_after, .. } => Some(retry_after.as_secs().max(1)),
        _ => None,
    };
    if let Some(refusal) = cx
        .profile
        .and_then(|p| p.refusal(cx.id, verdict, &text, retry_after))
    {
        return refusal;
    }
    match (&explanation.what, server_answer) {
        // The call reached the server: its own answer goes back as the server wrote it; so does
        // a server's answer that it did nothing yet (an `input_required` interim result), and
        // its answer to a call whose effect it called ambiguous (a JSON-RPC error, say): that is
        // this call's answer, only its effect is uncertain.
        (What::Ran { .. } | What::PassedThrough | What::NotApplied { .. }, Ok(frame))
        | (What::Unknown { ran_here: true, .. }, Ok(frame)) => relayed(cx, frame),
        (What::Ran { .. } | What::PassedThrough, Err(Some(why))) => own(
            cx,
            Verdict::Unknown,
            format!("The tool {} did not answer: {why}.", cx.tool),
            Map::new(),
        ),
        (What::Replayed { at, .. }, _) => replay(cx, &result, &explanation, text, at),
        (What::InFlight { since, retry_after }, _) => own(
            cx,
            verdict,
            text,
            meta([
                (META_RETRY_AFTER, json!(retry_after.as_secs().max(1))),
                (META_SINCE, json!(since)),
            ]),
        ),
        (What::Unknown { since, fence, .. }, _) => own(
            cx,
            verdict,
            text,
            meta([(META_FENCE, json!(fence)), (META_SINCE, json!(since))]),
        ),
        (What::Expired { at, fence, .. }, _) => own(
            cx,
            verdict,
            text,
            meta([(META_EXECUTED_AT, json!(at)), (META_FENCE, json!(fence))]),
        ),
        (
            What::Ran { .. } | What::PassedThrough | What::NotApplied { .. } | What::Refused { .. },
            _,
        ) => own(cx, verdict, text, Map::new()),
    }
}

/// The answer to a call the engine answered with a stored outcome (replayed `at`): the stored
/// result, marked as a replay, or why it cannot be shown.
fn replay(
    cx: &CallContext<'_>,
    result: &Result<Answer, EngineError>,
    explanation: &Explanation,
    text: String,
    at: &Timestamp,
) -> String {
    let verdict = explanation.verdict;
    match result {
        Ok(Answer {
            decision: Decision::Replayed { outcome, .. },
            ..
        }) => match Payload::of(outcome) {
            Ok(p) => {
                let result = replayed(
                    &p.to_mcp_tool_result(outcome.kind),
                    explanation,
                    replay_notice(explanation, &text, cx.replay_notice),
                    cx.result_type,
                    cx.named,
                );
                frame::response(cx.id, &result)
            }
            Err(e) => own(
                cx,
                verdict,
                format!("This action was already performed at {at} and was not repeated, but its stored result cannot be shown: {e}."),
                Map::new(),
            ),
        },
        // `What::Replayed` comes only of a replayed decision.
        _ => own(cx, verdict, text, Map::new()),
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
        json!(idemgate_kit::problem_type(verdict.problem().0)),
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

/// The note a replay carries for the model: `text` when replays are told (`wanted`), and always
/// when the window took the call for a repeat: the model must learn that what it sent was not
/// done again, and how to do it again on purpose.
fn replay_notice<'t>(explanation: &Explanation, text: &'t str, wanted: bool) -> Option<&'t str> {
    (wanted || explanation.rule == Some(KeyRule::Fallback)).then_some(text)
}

/// A stored result marked as a replay in `_meta` (when it ran, by which rule, whether an
/// operator resolved it), with the `notice` text block for the model when given, and
/// `resultType` when `result_type` and the result (stored from an earlier era) has none.
///
/// Some clients show the model only `structuredContent` when a result has it (Pydantic AI's
/// MCP client, the OpenAI Agents SDK's with `use_structured_content`), so a notice in a text
/// block never reaches it. The notice then also goes into `structuredContent`
/// ([`STRUCTURED_NOTICE`]) when the tool's output schema allows another member. When it does
/// not, and the action was named by what the model sent (a call id, its own key, the window:
/// it may have meant a new action), the replay is answered as an error whose text carries the
/// stored result and the notice, which every client shows the model (the record is untouched:
/// a later identical call is still a replay). A replay under a program's key keeps its result
/// as stored, the notice in a text block and `_meta`.
fn replayed(
    result: &RawValue,
    explanation: &Explanation,
    notice: Option<&str>,
    result_type: bool,
    named: Named,
) -> Box<RawValue> {
    let Some(mut obj) = frame::object(result) else {
        return result.to_owned();
    };
    let mut meta: Object = obj
        .get("_meta")
        .and_then(|m| frame::object(m))
        .unwrap_or_default();
    meta.insert(META_REPLAYED.to_owned(), frame::raw(&true));
    if let What::Replayed {
        at, by_operator, ..
    } = &explanation.what
    {
        meta.insert(META_EXECUTED_AT.to_owned(), frame::raw(at));
        if *by_operator {
            meta.insert(META_RESOLVED_BY.to_owned(), frame::raw(&"operator"));
        }
    }
    meta.insert(
        META_RULE.to_owned(),
        frame::raw(&explanation.rule.unwrap_or(KeyRule::Explicit)),
    );
    if let Some(rule) = named.rule {
        meta.insert(META_NAMED_BY.to_owned(), frame::raw(&rule.as_str()));
    }
    obj.insert("_meta".to_owned(), frame::raw(&meta));
    // A task handle has no content to add the notice to; its `_meta` says it is a replay.
    let task = obj.contains_key("task")
        || obj
            .get("resultType")
            .is_some_and(|t| t.get() == r#""task""#);
    if let (Some(notice), false) = (notice, task) {
        let mut content: Vec<Box<RawValue>> = obj
            .get("content")
            .and_then(|c| serde_json::from_str(c.get()).ok())
            .unwrap_or_default();
        let structured = obj
            .get("structuredContent")
            .filter(|s| s.get() != "null")
            .map(|s| s.to_owned());
        // Named by what the model sent (a call id, its own key, the window): the model may
        // have meant a new action, and must read that it was not done now.
        let told_to_model = matches!(
            named.rule,
            Some(Rule::Window | Rule::ModelKey | Rule::CallId)
        ) || explanation.rule == Some(KeyRule::Fallback);
        match structured {
            Some(stored) if named.open_output && frame::object(&stored).is_some() => {
                let mut members = frame::object(&stored).expect("checked above");
                members.insert(
                    STRUCTURED_NOTICE.to_owned(),
                    frame::raw(&format!("idemgate: {notice}")),
                );
                obj.insert("structuredContent".to_owned(), frame::raw(&members));
                content.push(frame::raw(
                    &json!({"type": "text", "text": format!("idemgate: {notice}")}),
                ));
            }
            Some(stored) if told_to_model => {
                // The stored blocks (the structured result in words when there are none), then
                // the notice, which speaks of "the result above".
                if content.is_empty() {
                    content.push(frame::raw(&json!({"type": "text", "text": stored.get()})));
                }
                content.push(frame::raw(
                    &json!({"type": "text", "text": format!("idemgate: {notice}")}),
                ));
                obj.remove("structuredContent");
                obj.insert("isError".to_owned(), frame::raw(&true));
            }
            _ => content.push(frame::raw(
                &json!({"type": "text", "text": format!("idemgate: {notice}")}),
            )),
        }
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
    use idemgate_core::Timestamp;

    /// A replay of `stored` as `respond` makes it, ran (or resolved) at 1 s.
    fn replay_of(
        stored: &RawValue,
        rule: KeyRule,
        by_operator: bool,
        notice: bool,
        result_type: bool,
    ) -> Box<RawValue> {
        let explanation = Explanation {
            verdict: Verdict::Replayed,
            rule: Some(rule),
            key: None,
            what: What::Replayed {
                at: Timestamp::from_millis(1_000),
                until: Timestamp::from_millis(2_000),
                by_operator,
            },
            next: idemgate_kit::Next::Nothing,
            identity: None,
        };
        let door = Door {
            effect: "the tool t",
            record: "the tool t",
            resolve: Resolve::Command("KEY"),
            repeat: MODEL_REPEAT,
            add_key: "",
            discreet: false,
        };
        let text = explanation.for_model(&door);
        replayed(
            stored,
            &explanation,
            replay_notice(&explanation, &text, notice),
            result_type,
            Named {
                open_output: true,
                ..Named::default()
            },
        )
    }

    #[test]
    fn a_replay_keeps_the_result_and_says_so() {
        let stored = RawValue::from_string(
            r#"{"content":[{"type":"text","text":"ok"}],"structuredContent":{"n":12345678901234567890},"_meta":{"x":1}}"#.into(),
        )
        .unwrap();
        let out: Value =
            serde_json::from_str(replay_of(&stored, KeyRule::Explicit, false, true, false).get())
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
        let quiet = replay_of(&stored, KeyRule::Fallback, false, false, false);
        // An operator's resolution is replayed as what it is: resolved then, not run then.
        let resolved: Value =
            serde_json::from_str(replay_of(&stored, KeyRule::Explicit, true, true, false).get())
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
        // A call the window took for a repeat is told so, and how to repeat on purpose, even
        // where replays are otherwise quiet, in the structured result too (exact).
        assert!(quiet.get().contains(r#""n":12345678901234567890"#));
        let quiet: Value = serde_json::from_str(quiet.get()).unwrap();
        assert_eq!(quiet["_meta"][META_RULE], "fallback");
        assert!(
            quiet["structuredContent"][STRUCTURED_NOTICE].is_string(),
            "{quiet}"
        );
        let told = quiet["content"][1]["text"].as_str().unwrap();
        assert!(
            told.contains("taken for a repeat") && told.contains("idempotency_key"),
            "{told}"
        );
        let explicit = replay_of(&stored, KeyRule::Explicit, false, false, false);
        let explicit: Value = serde_json::from_str(explicit.get()).unwrap();
        assert_eq!(explicit["content"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn a_replay_reaches_clients_that_read_only_structured_content() {
        let stored = RawValue::from_string(
            r#"{"content":[{"type":"text","text":"{\"order\":1}"}],"structuredContent":{"order":1}}"#
                .into(),
        )
        .unwrap();
        let explanation = |rule| Explanation {
            verdict: Verdict::Replayed,
            rule: Some(rule),
            key: None,
            what: What::Replayed {
                at: Timestamp::from_millis(1_000),
                until: Timestamp::from_millis(2_000),
                by_operator: false,
            },
            next: idemgate_kit::Next::Nothing,
            identity: None,
        };
        let shaped = |key_rule, rule, open_output| -> Value {
            let named = Named {
                rule: Some(rule),
                hinted_read_only: false,
                open_output,
            };
            let e = explanation(key_rule);
            let out = replayed(&stored, &e, Some("told"), false, named);
            serde_json::from_str(out.get()).unwrap()
        };
        // Named by what the model sent, and a schema that takes no other member: an error
        // every client shows as text, with the stored result in it.
        for (key_rule, rule) in [
            (KeyRule::Fallback, Rule::Window),
            (KeyRule::Explicit, Rule::ModelKey),
            (KeyRule::Explicit, Rule::CallId),
        ] {
            let open = shaped(key_rule, rule, true);
            assert!(open.get("isError").is_none(), "{open}");
            assert_eq!(
                open["structuredContent"][STRUCTURED_NOTICE],
                "idemgate: told"
            );
            let out = shaped(key_rule, rule, false);
            assert_eq!(out["isError"], true, "{out}");
            assert!(out.get("structuredContent").is_none(), "{out}");
            assert_eq!(out["content"][0]["text"], r#"{"order":1}"#, "{out}");
            assert_eq!(out["content"][1]["text"], "idemgate: told", "{out}");
            assert_eq!(out["_meta"][META_NAMED_BY], rule.as_str());
            assert_eq!(out["_meta"][META_REPLAYED], true);
        }
        // A program's key: the result as stored, the notice in both channels when the output
        // schema takes another member, else in the text only.
        let open = shaped(KeyRule::Explicit, Rule::OrchestrationKey, true);
        assert!(open.get("isError").is_none(), "{open}");
        assert_eq!(open["structuredContent"]["order"], 1);
        assert_eq!(
            open["structuredContent"][STRUCTURED_NOTICE],
            "idemgate: told"
        );
        assert_eq!(open["content"][1]["text"], "idemgate: told");
        let closed = shaped(KeyRule::Explicit, Rule::OrchestrationKey, false);
        assert_eq!(closed["structuredContent"], json!({"order": 1}));
        assert_eq!(closed["content"][1]["text"], "idemgate: told");
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
        let old = RawValue::from_string(r#"{"content":[]}"#.into()).unwrap();
        let out: Value =
            serde_json::from_str(replay_of(&old, KeyRule::Explicit, false, true, true).get())
                .unwrap();
        assert_eq!(out["resultType"], "complete", "{out}");
        let own_type =
            RawValue::from_string(r#"{"content":[],"resultType":"x-own"}"#.into()).unwrap();
        let out: Value =
            serde_json::from_str(replay_of(&own_type, KeyRule::Explicit, false, true, true).get())
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
            profile: None,
            replay_notice: true,
            result_type: true,
            named: Named::default(),
        };
        let answer = |cx: &CallContext<'_>| -> Value {
            serde_json::from_str(&refuse(cx, Verdict::KeyRequired, "no key".to_owned())).unwrap()
        };
        assert_eq!(answer(&cx)["result"]["resultType"], "complete");
        cx.result_type = false;
        assert!(answer(&cx)["result"].get("resultType").is_none());
    }
}

//! Finds the duplicate side effects that already happened, in the traces agents leave.
//!
//! `idemgate scan` reads OpenTelemetry trace files ([`otlp`]), takes the GenAI `execute_tool`
//! spans for tool calls, and reports the write calls that repeated an earlier call's action in
//! the same conversation ([`find`]): a call id sent twice (the framework's retry), the same
//! arguments while the first call still ran (the client's timeout), the same arguments under a
//! new call id (the model's re-emission), and arguments that agree where the action is named and
//! differ only where it is described (a re-plan). Each is reported with the likely source and a
//! confidence ([`report`]). A repeat a gate already answered (`idemgate.verdict` says it did not
//! run) is listed apart, as caught.
//!
//! The crate does no I/O of its own: the command line reads the files and writes the report.

pub mod find;
pub mod otlp;
pub mod report;

pub use find::{calls, record_calls, scan, Call, Confidence, Finding, Group, Rules, Scan, Source};
pub use otlp::{read, Span};

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};
    use std::collections::BTreeMap;

    const S: u64 = 1_000_000_000;

    struct T {
        spans: Vec<Span>,
    }

    impl T {
        fn new() -> Self {
            T { spans: Vec::new() }
        }

        /// A tool span in trace `trace`, under `parent`, from `start` to `end` seconds.
        #[allow(clippy::too_many_arguments)]
        fn tool(
            &mut self,
            trace: &str,
            id: &str,
            parent: Option<&str>,
            tool: &str,
            call_id: Option<&str>,
            args: Option<Value>,
            at: (u64, u64),
            extra: &[(&str, Value)],
        ) -> &mut Self {
            let mut attributes = BTreeMap::new();
            attributes.insert("gen_ai.operation.name".into(), json!("execute_tool"));
            attributes.insert("gen_ai.tool.name".into(), json!(tool));
            if let Some(c) = call_id {
                attributes.insert("gen_ai.tool.call.id".into(), json!(c));
            }
            if let Some(a) = args {
                attributes.insert("gen_ai.tool.call.arguments".into(), json!(a.to_string()));
            }
            for (k, v) in extra {
                attributes.insert((*k).into(), v.clone());
            }
            self.spans.push(Span {
                trace_id: trace.into(),
                span_id: id.into(),
                parent_span_id: parent.map(Into::into),
                name: format!("execute_tool {tool}"),
                start_ns: at.0 * S,
                end_ns: at.1 * S,
                error: None,
                attributes,
                origin: format!("test:{id}"),
            });
            self
        }

        /// A conversation's agent span, root of `trace`.
        fn agent(&mut self, trace: &str, id: &str, conversation: &str) -> &mut Self {
            let mut attributes = BTreeMap::new();
            attributes.insert("gen_ai.conversation.id".into(), json!(conversation));
            self.spans.push(Span {
                trace_id: trace.into(),
                span_id: id.into(),
                parent_span_id: None,
                name: "agent run".into(),
                start_ns: 0,
                end_ns: 1000 * S,
                error: None,
                attributes,
                origin: "test".into(),
            });
            self
        }

        fn scan(&self, rules: &Rules) -> Scan {
            scan(calls(&self.spans, rules), rules)
        }
    }

    fn sources(s: &Scan) -> Vec<(Source, String, bool)> {
        s.findings
            .iter()
            .map(|f| {
                let d = &s.calls[f.duplicate];
                (f.source, d.call_id.clone().unwrap_or_default(), f.caught)
            })
            .collect()
    }

    #[test]
    fn each_retry_source_is_told_apart() {
        let charge = json!({"card": "c-1", "amount": 1999});
        let mut t = T::new();
        t.agent("t1", "a", "conv-1")
            // The model re-emits the charge after it finished.
            .tool(
                "t1",
                "s1",
                Some("a"),
                "charge",
                Some("call-1"),
                Some(charge.clone()),
                (10, 11),
                &[],
            )
            .tool(
                "t1",
                "s2",
                Some("a"),
                "charge",
                Some("call-2"),
                Some(charge.clone()),
                (14, 15),
                &[],
            )
            // The framework re-runs call-3 with its id.
            .tool(
                "t1",
                "s3",
                Some("a"),
                "refund",
                Some("call-3"),
                Some(json!({"id": 1})),
                (20, 21),
                &[],
            )
            .tool(
                "t1",
                "s4",
                Some("a"),
                "refund",
                Some("call-3"),
                Some(json!({"id": 1})),
                (25, 26),
                &[],
            )
            // The caller gives up on a slow mail after 30 s and asks again while it runs.
            .tool(
                "t1",
                "s5",
                Some("a"),
                "mail",
                Some("call-5"),
                Some(json!({"to": "x"})),
                (100, 145),
                &[],
            )
            .tool(
                "t1",
                "s6",
                Some("a"),
                "mail",
                Some("call-6"),
                Some(json!({"to": "x"})),
                (130, 131),
                &[],
            );
        let s = t.scan(&Rules::default());
        assert_eq!(
            sources(&s),
            [
                (Source::ModelReEmission, "call-2".into(), false),
                (Source::FrameworkRetry, "call-3".into(), false),
                (Source::ClientTimeout, "call-6".into(), false),
            ]
        );
        assert!(s.findings.iter().all(|f| f.confidence == Confidence::High));
        assert_eq!(
            s.calls[s.findings[0].duplicate].group(),
            Group::Conversation {
                id: "conv-1".into()
            }
        );
        assert!(
            s.findings[2].why.contains("while the first still ran"),
            "{}",
            s.findings[2].why
        );
    }

    #[test]
    fn a_call_that_ended_without_its_result_was_given_up_on() {
        // As the OpenAI Agents SDK's instrumentation leaves a call its caller cancelled: ended,
        // no error, no result; the retry's span has one.
        let args = json!({"order": "o-9"});
        let result = [("gen_ai.tool.call.result", json!("ok"))];
        let mut t = T::new();
        t.tool(
            "t1",
            "s1",
            None,
            "invoice",
            None,
            Some(args.clone()),
            (1, 2),
            &[],
        )
        .tool(
            "t1",
            "s2",
            None,
            "invoice",
            None,
            Some(args.clone()),
            (3, 5),
            &result,
        );
        let s = t.scan(&Rules::default());
        assert_eq!(sources(&s), [(Source::ClientTimeout, String::new(), false)]);
        assert_eq!(s.findings[0].confidence, Confidence::Medium);
        assert!(
            s.findings[0].why.contains("ended with no result"),
            "{}",
            s.findings[0].why
        );

        // Both with their results: the model asked again.
        let mut t = T::new();
        t.tool(
            "t1",
            "s1",
            None,
            "invoice",
            None,
            Some(args.clone()),
            (1, 2),
            &result,
        )
        .tool(
            "t1",
            "s2",
            None,
            "invoice",
            None,
            Some(args),
            (3, 5),
            &result,
        );
        assert_eq!(
            sources(&t.scan(&Rules::default())),
            [(Source::ModelReEmission, String::new(), false)]
        );
    }

    #[test]
    fn the_langchain_envelope_gives_arguments_and_call_id() {
        // OpenLLMetry's LangChain instrumentation: the callback's envelope, whose run metadata
        // differs between any two calls, with the arguments in `inputs` and the id in `kwargs`.
        let envelope = |step: u64, id: &str| {
            json!({
                "input_str": "{'card': '4242'}",
                "tags": ["seq:step:1"],
                "metadata": {"thread_id": "conv", "langgraph_step": step},
                "inputs": {"card": "4242"},
                "kwargs": {"color": "green", "tool_call_id": id},
            })
        };
        let failed = |t: &mut T, id: &str| {
            t.spans.iter_mut().find(|s| s.span_id == id).unwrap().error =
                Some("CancelledError".into());
        };
        let mut t = T::new();
        t.tool(
            "t1",
            "s1",
            None,
            "charge",
            None,
            Some(envelope(2, "call_1")),
            (1, 2),
            &[],
        )
        .tool(
            "t1",
            "s2",
            None,
            "charge",
            None,
            Some(envelope(4, "call_2")),
            (3, 4),
            &[],
        )
        // The same call id after the first was cancelled: resumed after a client timeout.
        .tool(
            "t1",
            "s3",
            None,
            "charge",
            None,
            Some(envelope(6, "call_2")),
            (5, 6),
            &[],
        );
        failed(&mut t, "s2");
        let s = t.scan(&Rules::default());
        assert_eq!(s.calls[0].arguments, Some(json!({"card": "4242"})));
        assert_eq!(
            sources(&s),
            [
                (Source::ModelReEmission, "call_2".into(), false),
                (Source::ClientTimeout, "call_2".into(), false),
            ]
        );
        assert!(
            s.findings[1]
                .why
                .contains("the framework ran the call again"),
            "{}",
            s.findings[1].why
        );
    }

    #[test]
    fn records_fold_a_call_ids_window_and_a_repeat_the_window_answered() {
        use idemgate_core::{
            Fingerprint, IdempotencyKey, Key, Outcome, Record, RecordState, TenantId, Timestamp,
            ToolName,
        };
        let (tenant, tool) = (
            TenantId::new("acme").unwrap(),
            ToolName::new("mcp/charge").unwrap(),
        );
        let args = Fingerprint::of_json(&json!({"card": "c"}));
        let s = |secs: i64| Timestamp::from_millis(secs * 1000);
        let record = |key: Key, from: i64, to: i64, expires: i64| Record {
            key,
            fingerprint: args,
            fence: 1,
            created_at: s(from),
            scope: Some("conversation:c1".into()),
            state: RecordState::Completed {
                outcome: Outcome::success(b"ok".to_vec()),
                completed_at: s(to),
                expires_at: s(expires),
                retain_until: s(expires),
            },
        };
        let keyed = |k: &str| {
            Key::new(
                tenant.clone(),
                tool.clone(),
                IdempotencyKey::explicit(k).unwrap(),
            )
        };
        let window = Key::fallback(tenant.clone(), tool.clone(), &args);
        let records = [
            // call_1 ran, with the window's record inside it (answering until 1060 s).
            record(keyed("c1:call_1"), 1000, 1002, 87400),
            record(window, 1000, 1001, 1060),
            // call_2, within the window: the window's replay, stored under call_2's key.
            record(keyed("c1:call_2"), 1010, 1010, 87410),
            // call_3, after the window: ran again.
            record(keyed("c1:call_3"), 1200, 1201, 87600),
        ];
        let rules = Rules::default();
        let s = scan(record_calls(&records, &rules), &rules);
        assert_eq!(s.calls.len(), 3, "the window's record is its call id's own");
        assert_eq!(
            sources(&s),
            [
                (Source::ModelReEmission, "c1:call_2".into(), true),
                (Source::ModelReEmission, "c1:call_3".into(), false),
            ]
        );
        assert_eq!(s.findings[1].confidence, Confidence::Medium);
        assert!(s.fails());
    }

    #[test]
    fn distinct_actions_are_not_flagged() {
        let mut t = T::new();
        t.agent("t1", "a", "conv-1")
            .agent("t2", "b", "conv-2")
            // Two different charges.
            .tool(
                "t1",
                "s1",
                Some("a"),
                "charge",
                Some("c1"),
                Some(json!({"card": "1", "amount": 5})),
                (1, 2),
                &[],
            )
            .tool(
                "t1",
                "s2",
                Some("a"),
                "charge",
                Some("c2"),
                Some(json!({"card": "1", "amount": 6})),
                (3, 4),
                &[],
            )
            // The same charge in another conversation: another customer's action.
            .tool(
                "t2",
                "s3",
                Some("b"),
                "charge",
                Some("c3"),
                Some(json!({"card": "1", "amount": 5})),
                (3, 4),
                &[],
            )
            // The same charge again after the window.
            .tool(
                "t1",
                "s4",
                Some("a"),
                "charge",
                Some("c4"),
                Some(json!({"card": "1", "amount": 5})),
                (700, 701),
                &[],
            )
            // A deliberate repeat: the model's key differs.
            .tool(
                "t1",
                "s5",
                Some("a"),
                "mail",
                Some("c5"),
                Some(json!({"to": "x", "idempotency_key": "k1"})),
                (10, 11),
                &[],
            )
            .tool(
                "t1",
                "s6",
                Some("a"),
                "mail",
                Some("c6"),
                Some(json!({"to": "x", "idempotency_key": "k2"})),
                (12, 13),
                &[],
            )
            // Another tool with the same arguments.
            .tool(
                "t1",
                "s7",
                Some("a"),
                "refund",
                Some("c7"),
                Some(json!({"card": "1", "amount": 5})),
                (4, 5),
                &[],
            );
        let s = t.scan(&Rules::default());
        assert!(s.findings.is_empty(), "{:?}", sources(&s));
    }

    #[test]
    fn a_gate_layer_folds_into_its_call_and_a_caught_repeat_is_apart() {
        let args = json!({"to": "a@b"});
        let mut t = T::new();
        t.agent("t1", "a", "conv")
            .tool(
                "t1",
                "f1",
                Some("a"),
                "mail",
                Some("m1"),
                Some(args.clone()),
                (1, 3),
                &[],
            )
            // idemgate's own span inside the framework's, no arguments of its own.
            .tool(
                "t1",
                "g1",
                Some("f1"),
                "mail",
                Some("m1"),
                None,
                (1, 2),
                &[("idemgate.verdict", json!("executed"))],
            )
            .tool(
                "t1",
                "f2",
                Some("a"),
                "mail",
                Some("m2"),
                Some(args.clone()),
                (5, 6),
                &[],
            )
            .tool(
                "t1",
                "g2",
                Some("f2"),
                "mail",
                Some("m2"),
                None,
                (5, 6),
                &[("idemgate.verdict", json!("replayed"))],
            );
        let s = t.scan(&Rules::default());
        assert_eq!(s.calls.len(), 2);
        assert_eq!(s.calls[0].verdict.as_deref(), Some("executed"));
        assert_eq!(sources(&s), [(Source::ModelReEmission, "m2".into(), true)]);
        assert_eq!(s.uncaught().count(), 0);
    }

    #[test]
    fn re_plans_by_identity_fields_and_by_free_text() {
        let mail =
            |body: &str| json!({"to": "ann@example.com", "subject": "Your refund", "body": body});
        let mut t = T::new();
        t.agent("t1", "a", "conv")
            .tool("t1", "s1", Some("a"), "send_mail", Some("c1"), Some(mail("Hello Ann, your refund of 20 EUR is on its way.")), (1, 2), &[])
            .tool("t1", "s2", Some("a"), "send_mail", Some("c2"), Some(mail("Dear Ann, we have refunded 20 EUR to your card.")), (9, 10), &[])
            // Another recipient: a distinct action.
            .tool("t1", "s3", Some("a"), "send_mail", Some("c3"), Some(json!({"to": "bob@example.com", "subject": "Your refund", "body": "Dear Bob, we have refunded 20 EUR to your card."})), (11, 12), &[]);
        let s = t.scan(&Rules::default());
        assert_eq!(sources(&s), [(Source::RePlan, "c2".into(), false)]);
        assert_eq!(s.findings[0].confidence, Confidence::Low);
        assert!(
            s.findings[0].why.contains("reworded body"),
            "{}",
            s.findings[0].why
        );

        let mut rules = Rules::default();
        rules
            .identity
            .insert("send_mail".into(), vec!["to".into(), "/subject".into()]);
        let s = t.scan(&rules);
        assert_eq!(sources(&s), [(Source::RePlan, "c2".into(), false)]);
        assert_eq!(s.findings[0].confidence, Confidence::Medium);
        assert!(
            s.findings[0].why.starts_with("the same to, subject"),
            "{}",
            s.findings[0].why
        );
    }

    #[test]
    fn reads_are_listed_apart_and_traces_group_without_a_conversation() {
        let mut t = T::new();
        t.tool(
            "t1",
            "s1",
            None,
            "search",
            Some("c1"),
            Some(json!({"q": "x"})),
            (1, 2),
            &[],
        )
        .tool(
            "t1",
            "s2",
            None,
            "search",
            Some("c2"),
            Some(json!({"q": "x"})),
            (3, 4),
            &[],
        )
        .tool(
            "t1",
            "s3",
            None,
            "create",
            Some("c3"),
            Some(json!({"q": "x"})),
            (5, 6),
            &[],
        )
        .tool(
            "t2",
            "s4",
            None,
            "create",
            Some("c4"),
            Some(json!({"q": "x"})),
            (7, 8),
            &[],
        );
        let rules = Rules {
            is_read: Box::new(|t| t == "search"),
            ..Rules::default()
        };
        let s = t.scan(&rules);
        assert!(s.findings.is_empty(), "{:?}", sources(&s));
        assert_eq!(s.repeated_reads.len(), 1);
        assert_eq!(s.repeated_reads[0].calls.len(), 2);
        assert_eq!(s.repeated_reads[0].group, Group::Trace { id: "t1".into() });
    }

    fn args2() -> Value {
        json!({"card": "c-2"})
    }

    #[test]
    fn reports_say_what_was_found() {
        let args = json!({"card": "c-1"});
        let mut t = T::new();
        t.agent("t1", "a", "conv <1>")
            .tool(
                "t1",
                "s1",
                Some("a"),
                "charge",
                Some("x1"),
                Some(args.clone()),
                (1, 2),
                &[],
            )
            .tool(
                "t1",
                "s2",
                Some("a"),
                "charge",
                Some("x2"),
                Some(args),
                (6, 7),
                &[],
            );
        let s = t.scan(&Rules::default());
        let inputs = report::Inputs {
            files: vec!["f.jsonl".into()],
            spans: 3,
            skipped: vec![("f.jsonl:9".into(), "bad".into())],
            records: None,
        };
        let text = report::text(&s, &inputs);
        assert!(
            text.starts_with("1 likely duplicate side effect in 1 conversation"),
            "{text}"
        );
        assert!(text.contains("model re-emission  high"), "{text}");
        assert!(text.contains("Skipped f.jsonl:9: bad"), "{text}");
        let j = report::json(&s, &inputs);
        assert_eq!(j["duplicates"][0]["source"], "model_re_emission");
        assert_eq!(j["duplicates"][0]["duplicate"]["call_id"], "x2");
        assert_eq!(j["duplicates"][0]["gap_ms"], 5000.0);
        // Trace text reaches a terminal without its control characters.
        let mut hostile = T::new();
        hostile
            .agent("t1", "a", "conv")
            .tool(
                "t1",
                "s1",
                Some("a"),
                "charge\u{1b}[2J",
                Some("x1"),
                Some(args2()),
                (1, 2),
                &[],
            )
            .tool(
                "t1",
                "s2",
                Some("a"),
                "charge\u{1b}[2J",
                Some("x2\nforged"),
                Some(args2()),
                (6, 7),
                &[],
            );
        let shown = report::text(&hostile.scan(&Rules::default()), &inputs);
        assert!(
            !shown.contains('\u{1b}') && !shown.contains("\nforged"),
            "{shown}"
        );
        assert!(shown.contains("charge\u{fffd}[2J"), "{shown}");
        let page = report::html(&s, &inputs);
        assert!(page.contains("conversation conv &lt;1&gt;"), "escaped");
        assert!(!page.contains("<script"));
        assert!(page.contains("class=\"dup\""));
    }
}

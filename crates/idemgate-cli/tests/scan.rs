//! `idemgate scan` from the outside: its inputs, exit statuses and refusals. What it finds in
//! traces a real framework made is tested in tests/traces/test_scan.py (scripts/test-traces);
//! its rules, in idemgate-scan's own tests.

use std::io::Write as _;
use std::process::{Command, Output, Stdio};

fn scan(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_idemgate"))
        .arg("scan")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut pipe = child.stdin.take().unwrap();
    pipe.write_all(stdin.unwrap_or_default()).unwrap();
    drop(pipe);
    child.wait_with_output().unwrap()
}

/// One OTLP JSON line holding a tool span of `conversation` at `second`.
fn line(conversation: &str, span: u8, call_id: &str, args: &str, second: u64) -> String {
    let attr = |k: &str, v: &str| serde_json::json!({"key": k, "value": {"stringValue": v}});
    serde_json::json!({"resourceSpans": [{"scopeSpans": [{"spans": [{
        "traceId": "5b8efff798038103d269b633813fc60c",
        "spanId": format!("{span:016x}"),
        "name": "execute_tool charge",
        "startTimeUnixNano": (second * 1_000_000_000).to_string(),
        "endTimeUnixNano": (second * 1_000_000_000 + 5_000_000).to_string(),
        "attributes": [
            attr("gen_ai.operation.name", "execute_tool"),
            attr("gen_ai.tool.name", "charge"),
            attr("gen_ai.tool.call.id", call_id),
            attr("gen_ai.tool.call.arguments", args),
            attr("gen_ai.conversation.id", conversation),
        ]
    }]}]}]})
    .to_string()
        + "\n"
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn exit_1_for_a_duplicate_0_for_none_and_stdin_reads() {
    let dir = tempfile::tempdir().unwrap();
    let twice = dir.path().join("twice.jsonl");
    let charge = r#"{"amount": 5, "card": "c"}"#;
    // The same charge again, its members in another order: the same canonical arguments.
    std::fs::write(
        &twice,
        line("conv", 1, "a", charge, 1_800_000_000)
            + &line(
                "conv",
                2,
                "b",
                r#"{"card":"c","amount":5.0}"#,
                1_800_000_004,
            ),
    )
    .unwrap();
    let out = scan(&[twice.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.starts_with("1 likely duplicate side effect in 1 conversation"),
        "{stdout}"
    );
    assert!(stdout.contains("model re-emission"), "{stdout}");

    let once = line("conv", 1, "a", charge, 1_800_000_000)
        + &line(
            "conv",
            2,
            "b",
            r#"{"amount": 6, "card": "c"}"#,
            1_800_000_004,
        );
    let out = scan(&["--json", "-"], Some(once.as_bytes()));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["duplicates"], serde_json::json!([]));
    assert_eq!(report["tool_calls"], 2);
    assert_eq!(report["files"], serde_json::json!(["-"]));

    // --read takes the tool out of what is reported.
    let out = scan(&["--read", "charge", twice.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
}

#[test]
fn files_that_hold_no_trace_exit_66_and_a_cut_line_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.jsonl");
    let out = scan(&[missing.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(66));
    assert!(
        text(&out.stderr).contains("missing.jsonl"),
        "{}",
        text(&out.stderr)
    );

    let notes = dir.path().join("notes.txt");
    std::fs::write(&notes, "these are not traces\n").unwrap();
    let out = scan(&[notes.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(66));
    assert!(
        text(&out.stderr).contains("neither OTLP JSON"),
        "{}",
        text(&out.stderr)
    );

    // Nothing at all is no trace either: a scan of an empty file must not pass a CI run.
    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    assert_eq!(
        scan(&[empty.to_str().unwrap()], None).status.code(),
        Some(66)
    );
    assert_eq!(scan(&["-"], Some(b"\n")).status.code(), Some(66));

    // A file whose writer died mid-line: what came before stands, the cut line is named.
    let cut = dir.path().join("cut.jsonl");
    let whole = line("conv", 1, "a", "{}", 1_800_000_000);
    std::fs::write(&cut, whole.clone() + &whole[..40]).unwrap();
    let out = scan(&[cut.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("Skipped "),
        "{}",
        text(&out.stdout)
    );
    assert!(
        text(&out.stdout).contains("cut.jsonl:2"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn usage_errors_exit_2() {
    for args in [
        &["--identity", "send_mail", "x.jsonl"][..],
        &["--identity", "=to", "x.jsonl"][..],
        &["--window", "soon", "x.jsonl"][..],
        &[][..],
    ] {
        let out = scan(args, None);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.toml");
    std::fs::write(&config, "[tools.x]\nkind = \"sometimes\"\n").unwrap();
    let out = scan(&["--config", config.to_str().unwrap(), "x.jsonl"], None);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
}

#[test]
fn records_an_action_ran_under_two_keys() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("idem.db").display());
    let idemgate = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_idemgate"))
            .args(["--store", &store])
            .args(args)
            .output()
            .unwrap()
    };
    // The same command under two keys: exec cannot tell they are one action. A third key runs
    // another command: a distinct action.
    for (key, what) in [
        ("order-1", "charge"),
        ("order-1-retry", "charge"),
        ("order-2", "refund"),
    ] {
        let out = idemgate(&["exec", "--key", key, "--", "echo", what]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    }
    let out = idemgate(&["--json", "scan", "--records"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let dups = report["duplicates"].as_array().unwrap();
    assert_eq!(dups.len(), 1, "{report:#}");
    assert_eq!(dups[0]["duplicate"]["call_id"], "order-1-retry");
    assert_eq!(dups[0]["first"]["call_id"], "order-1");
    assert_eq!(
        dups[0]["group"],
        serde_json::json!({"kind": "records", "tenant": "local", "scope": null})
    );
    assert!(
        dups[0]["why"]
            .as_str()
            .unwrap()
            .contains("under key order-1-retry after order-1"),
        "{}",
        dups[0]["why"]
    );
    assert_eq!(report["records"], 3);

    // Another tenant's records are not this one's.
    let out = idemgate(&["--tenant", "acme", "scan", "--records"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    // exec's tool, named a read, is not reported.
    let out = idemgate(&["scan", "--records", "--read", "exec"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
}

#[test]
fn a_re_plan_by_free_text_alone_is_reported_but_does_not_fail() {
    let mail = |body: &str| serde_json::json!({"channel": "#deploys", "text": body}).to_string();
    let trace = line(
        "conv",
        1,
        "a",
        &mail("Deploy of api v1.4 started just now"),
        1_800_000_000,
    ) + &line(
        "conv",
        2,
        "b",
        &mail("Deploy of api v1.4 finished in three minutes"),
        1_800_000_004,
    );
    let out = scan(&["--json", "-"], Some(trace.as_bytes()));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["duplicates"][0]["source"], "re_plan");
    assert_eq!(report["duplicates"][0]["confidence"], "low");
    // Named by identity fields, the same re-plan is found with medium confidence: it fails.
    let out = scan(
        &["--identity", "charge=/channel", "-"],
        Some(trace.as_bytes()),
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
}

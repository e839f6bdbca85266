//! Regressions of issues 7, 17 and 33: what users ran into with the command line, one test each.

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::cli::{http, serve_on_a_free_port, text, Sandbox};

/// `--store memory:` ran the command on every call: its records die with the process.
#[test]
fn memory_store_is_refused_for_one_shot_commands() {
    let sb = Sandbox::new();
    for _ in 0..2 {
        let out = sb.run(&[
            "--store", "memory:", "exec", "--key", "m1", "--", "echo", "run",
        ]);
        assert_eq!(out.status.code(), Some(1));
        assert!(!text(&out.stdout).contains("run"), "nothing ran");
        assert!(
            text(&out.stderr).contains("memory:"),
            "{}",
            text(&out.stderr)
        );
    }
}

/// Store trouble at open exited 1, at reservation 69: nothing ran in both.
#[test]
fn store_trouble_at_open_exits_69() {
    let sb = Sandbox::new();
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = dead.local_addr().unwrap().port();
    drop(dead);
    for store in [
        format!("postgres://postgres@127.0.0.1:{port}/x"),
        format!("redis://127.0.0.1:{port}"),
    ] {
        let out = sb.run(&["--store", &store, "exec", "--key", "k", "--", "echo", "ran"]);
        assert_eq!(
            out.status.code(),
            Some(69),
            "{store}: {}",
            text(&out.stderr)
        );
        assert!(!text(&out.stdout).contains("ran"));
        let out = sb.run(&["--store", &store, "keys", "list"]);
        assert_eq!(
            out.status.code(),
            Some(69),
            "{store}: {}",
            text(&out.stderr)
        );
    }
}

/// SIGTERM to a running `exec` left the child running and the record in flight.
#[test]
fn sigterm_reaches_the_command_and_its_outcome_is_recorded() {
    let sb = Sandbox::new();
    // A command that exits on its own after SIGTERM: its exit code is recorded and replayed.
    let graceful = "trap 'echo got-term; exit 3' TERM; echo ready; while :; do sleep 0.02; done";
    let code = exec_then_term(&sb, "t1", graceful);
    assert_eq!(code, Some(3));
    let shown: serde_json::Value =
        serde_json::from_slice(&sb.run(&["--json", "keys", "show", "t1"]).stdout).unwrap();
    assert_eq!(shown["state"], "completed", "{shown}");
    assert_eq!(shown["exit_code"], 3);
    assert!(shown["stdout"].as_str().unwrap().contains("got-term"));

    // A command the signal kills: the outcome is unknown, never silently re-run.
    let killed = "echo ready; exec sleep 60";
    let code = exec_then_term(&sb, "t2", killed);
    assert_eq!(code, Some(76));
    let shown: serde_json::Value =
        serde_json::from_slice(&sb.run(&["--json", "keys", "show", "t2"]).stdout).unwrap();
    assert_eq!(shown["state"], "unknown", "{shown}");
    // The hint names the tenant, so it works whichever tenant the record is under.
    let again = sb.run(&["exec", "--key", "t2", "--", "sh", "-c", killed]);
    assert_eq!(again.status.code(), Some(76));
    assert!(
        text(&again.stderr).contains("--tenant local"),
        "{}",
        text(&again.stderr)
    );
}

/// Runs `exec --key KEY -- sh -c SCRIPT`, waits until the script printed "ready", sends SIGTERM
/// to idemgate (a pid this test started) and returns idemgate's exit code.
fn exec_then_term(sb: &Sandbox, key: &str, script: &str) -> Option<i32> {
    let mut child = sb
        .idemgate()
        .args(["exec", "--key", key, "--", "sh", "-c", script])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    // Keep reading so the command's output never blocks on a full pipe.
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s.code();
        }
        assert!(
            Instant::now() < deadline,
            "exec did not finish after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// After the README's quick start (`serve`, tenant "default"), `keys list` showed nothing: it
/// looked only under tenant "local". It now shows every tenant, and show/resolve find the key.
#[test]
fn operator_commands_find_records_of_every_tenant() {
    let sb = Sandbox::new();
    assert!(sb
        .run(&["exec", "--key", "a", "--", "true"])
        .status
        .success());
    let ran = sb.run(&[
        "--tenant", "default", "exec", "--tool", "t", "--key", "b", "--", "true",
    ]);
    assert!(ran.status.success());
    let listed = text(&sb.run(&["keys", "list"]).stdout);
    assert!(listed.contains("TENANT"), "{listed}");
    assert!(
        listed.contains("local") && listed.contains("default"),
        "{listed}"
    );
    let shown = sb.run(&["--json", "keys", "show", "b"]);
    let shown: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(shown["key"]["tenant"], "default", "{shown}");
    // With --tenant the list is that tenant's.
    let local = text(&sb.run(&["--tenant", "local", "keys", "list"]).stdout);
    assert!(!local.contains("default"), "{local}");
}

/// `idemgate token new | head -n1` panicked with a backtrace now and then (a closed stdout).
#[test]
fn a_closed_stdout_ends_quietly() {
    let sb = Sandbox::new();
    let (reader, writer) = std::io::pipe().unwrap();
    // The reader is gone before idemgate writes: every write meets a closed pipe.
    drop(reader);
    let out = sb
        .idemgate()
        .args(["token", "new"])
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(out.status.code(), Some(141), "{err}");
}

/// `--json key mint` printed plain text.
#[test]
fn json_key_commands_print_json() {
    let sb = Sandbox::new();
    for args in [
        &["--json", "key", "mint"][..],
        &["--json", "key", "derive", "--run", "r", "--step", "1"],
    ] {
        let out = sb.run(args);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(v["key"].as_str().unwrap().len() > 8, "{v}");
    }
}

/// "Address already in use" was printed twice; `serve --tenant` was ignored.
#[test]
fn serve_says_a_busy_address_once() {
    let sb = Sandbox::new();
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let out = sb
        .idemgate()
        .env("IDEMGATE_TOKEN", "test-token-0123456789abcdef")
        .args(["serve", "--listen", &addr])
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.matches("in use").count(), 1, "{err}");
    // --tenant names the gateway's one tenant (it was ignored): an invalid one is refused.
    let out = sb
        .idemgate()
        .env("IDEMGATE_TOKEN", "test-token-0123456789abcdef")
        .args(["--tenant", "no spaces", "serve", "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("--tenant"),
        "{}",
        text(&out.stderr)
    );
}

/// An operator's JSON resolution is replayed by `exec` and shown exactly (big integers keep
/// their digits in `--json`; they came back as floats).
#[test]
fn a_json_resolution_replays_and_keeps_big_integers() {
    let sb = Sandbox::new();
    // A command killed by a signal: the outcome is unknown.
    let first = sb.run(&["exec", "--key", "j", "--", "sh", "-c", "kill -9 $$"]);
    assert_eq!(first.status.code(), Some(76), "{}", text(&first.stderr));
    let resolved = sb.run(&[
        "keys",
        "resolve",
        "j",
        "--completed",
        "--result",
        r#"{"n":12345678901234567890123}"#,
    ]);
    assert!(resolved.status.success(), "{}", text(&resolved.stderr));
    let shown = text(&sb.run(&["--json", "keys", "show", "j"]).stdout);
    assert!(
        shown.contains(r#""result":{"n":12345678901234567890123}"#),
        "{shown}"
    );
    let listed = text(&sb.run(&["--json", "keys", "list"]).stdout);
    assert!(listed.contains("12345678901234567890123"), "{listed}");
    let replay = sb.run(&["exec", "--key", "j", "--", "sh", "-c", "kill -9 $$"]);
    assert_eq!(replay.status.code(), Some(0));
    assert_eq!(
        text(&replay.stdout).trim(),
        r#"{"n":12345678901234567890123}"#
    );
}

/// The JSON answer of one `--json exec` or `--json keys show`.
fn json_of(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {} {}", text(&out.stdout), text(&out.stderr)))
}

/// The first `unknown` answer (of the call whose command was killed) said the engine's own time,
/// some milliseconds after the `since` the record, every later answer and `keys list` say.
#[test]
fn the_first_unknown_answer_says_the_records_since() {
    let sb = Sandbox::new();
    let killed = [
        "--json",
        "exec",
        "--key",
        "u",
        "--",
        "sh",
        "-c",
        "kill -9 $$",
    ];
    let first = sb.run(&killed);
    assert_eq!(first.status.code(), Some(76), "{}", text(&first.stderr));
    let first = json_of(&first);
    assert_eq!(first["ran_here"], true, "{first}");
    let later = json_of(&sb.run(&killed));
    assert_eq!(later["ran_here"], false, "{later}");
    let shown = json_of(&sb.run(&["--json", "keys", "show", "u"]));
    let listed = json_of(&sb.run(&["--json", "keys", "list", "--state", "unknown"]));
    assert_eq!(first["since"], shown["since"], "{first} {shown}");
    assert_eq!(later["since"], shown["since"], "{later} {shown}");
    assert_eq!(listed[0]["since"], shown["since"], "{listed} {shown}");
}

/// `idemgate mcp -- /nonexistent` said why twice ("...: No such file or directory (os error 2):
/// No such file or directory (os error 2)").
#[test]
fn a_server_that_cannot_start_is_said_once() {
    let sb = Sandbox::new();
    let out = sb.run(&["mcp", "--", "/nonexistent"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("/nonexistent"), "{err}");
    // ENOENT, as the operating system words it.
    let why = std::io::Error::from_raw_os_error(2).to_string();
    assert_eq!(err.matches(&why).count(), 1, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// The proxy's WARN line for a call whose server crashed had `"error":""` (and `"recording":""`
/// on other lines): it says what happened now, the server's exit status is logged, and no field
/// is written empty.
#[test]
fn a_crashed_mcp_servers_log_lines_say_what_happened() {
    let sb = Sandbox::new();
    let mut p = sb.initialized("");
    let crashed = p.call("crash", serde_json::json!({}), Some("c-1"));
    assert_eq!(crate::mcp::verdict(&crashed), "unknown", "{crashed}");
    // The fixture exits with 3 mid-call; the proxy exits with its code once it has logged.
    assert_eq!(p.wait_exit(), Some(3));
    let log = std::fs::read_to_string(sb.path("stderr")).unwrap();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let unknown = lines
        .iter()
        .find(|l| l["fields"]["decision"] == "unknown")
        .unwrap_or_else(|| panic!("no unknown line in {log}"));
    assert_eq!(unknown["level"], "WARN", "{unknown}");
    let error = unknown["fields"]["error"].as_str().unwrap_or("");
    assert!(error.contains("closed its output"), "{unknown}");
    assert!(
        lines.iter().any(|l| l["level"] == "WARN"
            && l["fields"]["status"]
                .as_str()
                .is_some_and(|s| s.contains('3'))),
        "the exit status is logged: {log}"
    );
    for l in &lines {
        let fields = l["fields"].as_object().unwrap();
        assert!(fields.values().all(|v| v != ""), "an empty field: {l}");
    }
}

/// `keys resolve --release` said the next call "runs the command" for records of the MCP proxy
/// and the gateway too, where no command exists; its help spoke of the command as well.
#[test]
fn keys_resolve_speaks_of_the_action_for_every_door() {
    let sb = Sandbox::new();
    let mut p = sb.initialized("");
    let crashed = p.call("crash", serde_json::json!({}), Some("c-1"));
    assert_eq!(crate::mcp::verdict(&crashed), "unknown", "{crashed}");
    assert_eq!(p.wait_exit(), Some(3));
    let released = sb.run(&["keys", "resolve", "c-1", "--release"]);
    let said = text(&released.stdout);
    assert!(released.status.success(), "{}", text(&released.stderr));
    assert!(said.contains("runs the action again"), "{said}");
    assert!(!said.contains("command"), "{said}");
    let help = text(&sb.run(&["keys", "resolve", "--help"]).stdout);
    // Each option's paragraph: from its name to the next option's, whatever the wrapping.
    for option in ["--completed", "--release"] {
        let at = help
            .find(&format!("  {option} "))
            .unwrap_or_else(|| panic!("no {option} in {help}"));
        let rest = &help[at + 2..];
        let end = rest
            .match_indices('\n')
            .map(|(i, _)| i)
            .find(|&i| rest[i + 1..].trim_start().starts_with('-'))
            .unwrap_or(rest.len());
        let paragraph = rest[..end].split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(!paragraph.contains("command"), "{paragraph}");
        assert!(paragraph.contains("The action did"), "{paragraph}");
    }
}

/// A replay after an operator's resolution said "the command ran at <the resolution's time>":
/// nothing ran then. It now says an operator resolved it, in text, `--json` and `keys show`.
#[test]
fn a_replay_of_an_operators_resolution_says_so() {
    let sb = Sandbox::new();
    let resolutions: [(&str, &[&str]); 2] = [
        ("json", &["--result", r#"{"ok":true}"#]),
        ("cmd", &["--exit-code", "0", "--stdout", "paid by hand\n"]),
    ];
    for (key, how) in resolutions {
        let killed = ["exec", "--key", key, "--", "sh", "-c", "kill -9 $$"];
        let first = sb.run(&killed);
        assert_eq!(first.status.code(), Some(76), "{}", text(&first.stderr));
        let mut resolve = vec!["keys", "resolve", key, "--completed"];
        resolve.extend_from_slice(how);
        let resolved = sb.run(&resolve);
        assert!(resolved.status.success(), "{}", text(&resolved.stderr));
        let shown = json_of(&sb.run(&["--json", "keys", "show", key]));
        assert_eq!(shown["resolved_by"], "operator", "{shown}");
        let at = shown["completed_at"].as_str().unwrap();

        let replay = sb.run(&killed);
        assert_eq!(replay.status.code(), Some(0), "{}", text(&replay.stderr));
        let said = text(&replay.stderr);
        let expected = format!("an operator resolved it with `idemgate keys resolve` at {at}");
        assert!(said.contains(&expected), "{said}");
        assert!(!said.contains("ran at"), "{said}");
        let mut json = vec!["--json"];
        json.extend_from_slice(&killed);
        let replay = json_of(&sb.run(&json));
        assert_eq!(replay["resolved_by"], "operator", "{replay}");
        let show = text(&sb.run(&["keys", "show", key]).stdout);
        assert!(show.contains("resolved by:  an operator"), "{show}");
    }
    // An outcome that ran is replayed as one, unmarked.
    assert!(sb
        .run(&["exec", "--key", "ran", "--", "true"])
        .status
        .success());
    let again = text(&sb.run(&["exec", "--key", "ran", "--", "true"]).stderr);
    assert!(again.contains("the command ran at"), "{again}");
    let shown = json_of(&sb.run(&["--json", "keys", "show", "ran"]));
    assert!(shown.get("resolved_by").is_none(), "{shown}");
}

/// `keys resolve --reason` and `keys reopen --reason` wrote no audit entry anywhere, though their
/// help says the reason is for the audit log: they append to the audit log the gateway and the
/// console write (`--audit-log`, or `IDEMGATE_AUDIT_LOG`), with who and why; without one, the
/// record's history in the store still keeps both.
#[test]
fn operator_commands_write_the_audit_log() {
    let sb = Sandbox::new();
    let audit = sb.path("audit.jsonl");
    let killed = sb.run(&["exec", "--key", "pay-1", "--", "sh", "-c", "kill -9 $$"]);
    assert_eq!(killed.status.code(), Some(76), "{}", text(&killed.stderr));
    let resolved = sb
        .idemgate()
        .env("USER", "alice")
        .args([
            "keys",
            "resolve",
            "pay-1",
            "--completed",
            "--reason",
            "seen at the bank",
        ])
        .arg("--audit-log")
        .arg(&audit)
        .output()
        .unwrap();
    assert!(resolved.status.success(), "{}", text(&resolved.stderr));
    let fence = json_of(&sb.run(&["--json", "keys", "show", "pay-1"]))["fence"]
        .as_u64()
        .unwrap()
        .to_string();
    let reopened = sb
        .idemgate()
        .env("USER", "bob")
        .env("IDEMGATE_AUDIT_LOG", &audit)
        .args([
            "keys", "reopen", "pay-1", "--fence", &fence, "--reason", "refunded",
        ])
        .output()
        .unwrap();
    assert!(reopened.status.success(), "{}", text(&reopened.stderr));

    let log = std::fs::read_to_string(&audit).unwrap_or_default();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let of = |event: &str| {
        lines
            .iter()
            .find(|l| l["event"] == event)
            .unwrap_or_else(|| panic!("no {event} line in {log:?}"))
    };
    let resolution = of("resolved");
    assert_eq!(
        (
            &resolution["by"],
            &resolution["reason"],
            &resolution["released"]
        ),
        (&"alice".into(), &"seen at the bank".into(), &false.into()),
        "{resolution}"
    );
    assert_eq!(resolution["tenant"], "local");
    assert_eq!(resolution["tool"], "exec");
    let reopening = of("reopened");
    assert_eq!(reopening["by"], "bob", "{reopening}");
    assert_eq!(reopening["reason"], "refunded");
    assert_eq!(reopening["was"], "completed");
    assert!(!log.contains("pay-1"), "the raw key never appears: {log}");

    // Without an audit log, who and why are still on the record: in its history in the store.
    let killed = sb.run(&["exec", "--key", "pay-2", "--", "sh", "-c", "kill -9 $$"]);
    assert_eq!(killed.status.code(), Some(76), "{}", text(&killed.stderr));
    let unaudited = sb
        .idemgate()
        .env("USER", "carol")
        .args([
            "keys",
            "resolve",
            "pay-2",
            "--release",
            "--reason",
            "never ran",
        ])
        .output()
        .unwrap();
    assert!(unaudited.status.success(), "{}", text(&unaudited.stderr));
    let shown = json_of(&sb.run(&[
        "--json", "keys", "show", "pay-2", "--tool", "exec", "--tenant", "local",
    ]));
    let released = shown["history"]
        .as_array()
        .and_then(|h| h.iter().find(|s| s["what"] == "resolved_released"))
        .unwrap_or_else(|| panic!("no release in {shown}"));
    assert_eq!(
        (&released["by"], &released["reason"]),
        (&"carol".into(), &"never ran".into()),
        "{shown}"
    );
}

/// `keys resolve mail-1 --completed` without `--result` on a gateway's record stored a command's
/// outcome (`{"exit_code":0,...}`) that HTTP then replayed to the caller of `send_mail`: it is
/// refused, saying what to pass; the result passed is what HTTP replays, said to be an
/// operator's; `exec`'s own records still take a bare `--completed`.
#[test]
fn resolving_another_doors_record_needs_the_result_its_callers_get() {
    let sb = Sandbox::new();
    let token = "gateway-token-0123456789abcdef";
    let mut serve = sb.idemgate();
    serve.env("IDEMGATE_TOKEN", token);
    let (mut gateway, addr) = serve_on_a_free_port(serve);
    let post = |path: &str, key: Option<&str>, body: &str| {
        let key = key
            .map(|k| format!("Idempotency-Key: {k}\r\n"))
            .unwrap_or_default();
        http(
            &addr,
            &format!(
                "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\
                 Content-Type: application/json\r\n{key}Content-Length: {}\r\n\
                 Connection: close\r\n\r\n{body}",
                body.len()
            ),
        )
    };
    let begun = post("/v1/tools/send_mail/begin", Some("mail-1"), "{}");
    let lease = begun
        .split(r#""lease":""#)
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("no lease in {begun}"));
    let marked = post(
        "/v1/tools/send_mail/ambiguous",
        None,
        &format!(r#"{{"key":"mail-1","lease":"{lease}","reason":"smtp timeout"}}"#),
    );
    assert!(marked.starts_with("HTTP/1.1 200"), "{marked}");

    let bare = sb.run(&["keys", "resolve", "mail-1", "--completed"]);
    assert_eq!(bare.status.code(), Some(2), "{}", text(&bare.stderr));
    let said = text(&bare.stderr);
    assert!(
        said.contains("tool send_mail") && said.contains("--result JSON"),
        "{said}"
    );
    let shown = json_of(&sb.run(&["--json", "keys", "show", "mail-1"]));
    assert_eq!(shown["state"], "unknown", "nothing was resolved: {shown}");

    let resolved = sb.run(&[
        "keys",
        "resolve",
        "mail-1",
        "--completed",
        "--result",
        r#"{"message_id":"m-1"}"#,
    ]);
    assert!(resolved.status.success(), "{}", text(&resolved.stderr));
    let replay = post("/v1/tools/send_mail/begin", Some("mail-1"), "{}");
    let _ = Command::new("kill")
        .args(["-TERM", &gateway.id().to_string()])
        .status();
    let _ = gateway.wait();
    assert!(replay.starts_with("HTTP/1.1 200"), "{replay}");
    assert!(
        replay.contains(r#""result":{"message_id":"m-1"}"#) && !replay.contains("exit_code"),
        "{replay}"
    );
    assert!(
        replay
            .to_ascii_lowercase()
            .contains("idempotency-resolved-by: operator"),
        "{replay}"
    );

    let killed = sb.run(&["exec", "--key", "cmd-1", "--", "sh", "-c", "kill -9 $$"]);
    assert_eq!(killed.status.code(), Some(76), "{}", text(&killed.stderr));
    let resolved = sb.run(&["keys", "resolve", "cmd-1", "--completed"]);
    assert!(resolved.status.success(), "{}", text(&resolved.stderr));
    let replay = sb.run(&["exec", "--key", "cmd-1", "--", "sh", "-c", "kill -9 $$"]);
    assert_eq!(replay.status.code(), Some(0), "{}", text(&replay.stderr));
    // A command `exec` ran under another tool is told to say its exit code, which resolves it.
    let killed = [
        "exec",
        "--tool",
        "deploy",
        "--key",
        "cmd-2",
        "--",
        "sh",
        "-c",
        "kill -9 $$",
    ];
    let unknown = sb.run(&killed);
    assert_eq!(unknown.status.code(), Some(76), "{}", text(&unknown.stderr));
    let said = text(&unknown.stderr);
    let told = said
        .split('`')
        .find(|part| part.starts_with("idemgate keys resolve cmd-2"))
        .unwrap_or_else(|| panic!("no resolve command in {said}"));
    assert!(told.ends_with("--completed --exit-code 0"), "{said}");
    let args: Vec<&str> = told.split_whitespace().skip(1).collect();
    let resolved = sb.run(&args);
    assert!(resolved.status.success(), "{}", text(&resolved.stderr));
    assert_eq!(sb.run(&killed).status.code(), Some(0));
}

/// `exec --kye K -- CMD` got only the tip to pass `--kye` to the command after `--`: clap's
/// similarity finds nothing near a three-letter option. It now names `--key`, and exits 2 with
/// nothing run.
#[test]
fn a_mistyped_option_is_told_the_one_it_meant() {
    let sb = Sandbox::new();
    let effect = sb.path("effect");
    let script = format!("echo ran >> '{}'", effect.display());
    let typo = sb.run(&["exec", "--kye", "k", "--", "sh", "-c", &script]);
    assert_eq!(typo.status.code(), Some(2));
    let said = text(&typo.stderr);
    assert!(
        said.contains("a similar argument exists: '--key'"),
        "{said}"
    );
    assert!(!effect.exists(), "nothing ran");
    // A subcommand's own options, not another's: `keys reopen --reasn` means --reason.
    let typo = sb.run(&["keys", "reopen", "k", "--fence", "1", "--reasn", "x"]);
    assert!(
        text(&typo.stderr).contains("'--reason'"),
        "{}",
        text(&typo.stderr)
    );
}

/// The README's exit-code table and `--help` left out 2 (a usage error: clap's, and a resolution
/// without the result it needs), and `--help` 80: every code of the one table is in both.
#[test]
fn every_exit_code_is_documented() {
    use idemgate_kit::exit;
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let table = readme
        .split("The exit codes come from one table")
        .nth(1)
        .and_then(|rest| rest.split("\n\n").next())
        .expect("the README's exit-code paragraph");
    let help = text(&Sandbox::new().run(&["--help"]).stdout);
    let help = help
        .split("Exit codes of `exec`")
        .nth(1)
        .and_then(|rest| rest.split("\n\n").next())
        .expect("the exit codes in --help");
    for code in [
        exit::FAILURE,
        exit::USAGE,
        exit::KEY_REUSE,
        exit::STORE_UNAVAILABLE,
        exit::UNRECORDED,
        exit::IN_FLIGHT,
        exit::UNKNOWN,
        exit::LEASE_LOST,
        exit::NOT_APPLIED,
        exit::EXPIRED,
        exit::NOT_STARTED,
    ] {
        let listed = |text: &str| text.split_whitespace().any(|w| w == code.to_string());
        assert!(listed(table), "exit {code} is not in the README: {table}");
        assert!(listed(help), "exit {code} is not in --help: {help}");
    }
}

/// `keys purge --expired` after a reopening said "purged 1 expired record(s)": nothing had
/// expired. The count is of records whose time is up, reopened ones included, and says so.
#[test]
fn purge_does_not_call_a_reopened_record_expired() {
    let sb = Sandbox::new();
    assert!(sb
        .run(&["exec", "--key", "r-1", "--", "true"])
        .status
        .success());
    let fence = json_of(&sb.run(&["--json", "keys", "show", "r-1"]))["fence"]
        .as_u64()
        .unwrap()
        .to_string();
    let reopened = sb.run(&[
        "keys", "reopen", "r-1", "--fence", &fence, "--reason", "redo",
    ]);
    assert!(reopened.status.success(), "{}", text(&reopened.stderr));
    let purged = sb.run(&["keys", "purge", "--expired"]);
    assert!(purged.status.success(), "{}", text(&purged.stderr));
    let said = text(&purged.stdout);
    assert!(
        said.contains("purged 1 record(s)") && said.contains("reopened"),
        "{said}"
    );
    assert!(!said.contains("1 expired record"), "{said}");
    let purged = json_of(&sb.run(&["--json", "keys", "purge", "--expired"]));
    assert_eq!(purged["purged"], 0, "gone: {purged}");
}

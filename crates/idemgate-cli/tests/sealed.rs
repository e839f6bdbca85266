//! `idemgate` with sealing on (docs/OPERATIONS.md): the records on disk show neither keys nor
//! results, duplicates still replay, operators find records by their key, and keys rotate.

use std::process::Output;

use base64::Engine as _;
use idemgate_seal::testing::{self, SECRET_KEY, SECRET_RESULT};

use crate::cli::{http, lines, serve_on_a_free_port, text, Sandbox};

/// The sealing variables for the test keyring `ids` (the first current).
fn seal_env(ids: &[&str]) -> [(&'static str, String); 2] {
    [
        (idemgate_seal::KEYS_VAR, testing::keyring_text(ids)),
        (idemgate_seal::SECRET_VAR, testing::secret_b64()),
    ]
}

fn run(sb: &Sandbox, env: &[(&str, String)], args: &[&str]) -> Output {
    let mut c = sb.idemgate();
    for (name, value) in env {
        c.env(name, value);
    }
    c.args(args).output().unwrap()
}

/// `exec --key SECRET_KEY` of a command that counts its runs in `effect` and prints the result.
fn exec(sb: &Sandbox, env: &[(&str, String)]) -> Output {
    let script = format!(
        "echo ran >> '{}'; echo '{SECRET_RESULT}'",
        sb.path("effect").display()
    );
    run(
        sb,
        env,
        &["exec", "--key", SECRET_KEY, "--", "sh", "-c", &script],
    )
}

/// Every byte of the sandbox's SQLite files and journal.
fn dump(sb: &Sandbox) -> Vec<u8> {
    let mut bytes = Vec::new();
    for entry in std::fs::read_dir(sb.path("")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("idem.db") && path.is_file() {
            bytes.extend(std::fs::read(&path).unwrap());
        }
    }
    bytes
}

#[test]
fn sealed_records_replay_and_show_neither_key_nor_result_on_disk() {
    let (plain, sealed) = (Sandbox::new(), Sandbox::new());
    let env = seal_env(&["k1"]);
    for (sb, env) in [(&plain, &[][..]), (&sealed, &env[..])] {
        let first = exec(sb, env);
        assert!(first.status.success(), "{}", text(&first.stderr));
        let again = exec(sb, env);
        assert!(again.status.success(), "{}", text(&again.stderr));
        assert_eq!(text(&again.stdout).trim(), SECRET_RESULT, "the replay");
        assert_eq!(lines(&sb.path("effect")), 1, "ran once");
    }
    // `exec` stores its output in base64.
    let stored = base64::engine::general_purpose::STANDARD.encode(format!("{SECRET_RESULT}\n"));
    for (what, secret) in [("key", SECRET_KEY), ("result", stored.as_str())] {
        let (p, s) = (dump(&plain), dump(&sealed));
        assert!(
            testing::reveals(&p, secret),
            "the plain store shows its {what}"
        );
        assert!(
            !testing::reveals(&s, secret),
            "the sealed store shows its {what}"
        );
    }
}

#[test]
fn operators_find_a_sealed_record_by_its_key_or_its_listed_name() {
    let sb = Sandbox::new();
    let env = seal_env(&["k1"]);
    assert!(exec(&sb, &env).status.success());
    let listed: serde_json::Value =
        serde_json::from_slice(&run(&sb, &env, &["--json", "keys", "list"]).stdout).unwrap();
    let name = listed[0]["key"]["key"].as_str().unwrap().to_owned();
    assert!(name.starts_with("hmac-"), "{listed}");
    for key in [SECRET_KEY, name.as_str()] {
        let shown = run(&sb, &env, &["--json", "keys", "show", key]);
        assert!(shown.status.success(), "{key}: {}", text(&shown.stderr));
        let shown: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
        assert_eq!(shown["state"], "completed", "{shown}");
    }
    let shown: serde_json::Value =
        serde_json::from_slice(&run(&sb, &env, &["--json", "keys", "show", SECRET_KEY]).stdout)
            .unwrap();
    assert_eq!(
        shown["key"]["key"], SECRET_KEY,
        "shown under the operator's key"
    );
    let fence = shown["fence"].as_u64().unwrap().to_string();
    let reopened = run(
        &sb,
        &env,
        &[
            "keys", "reopen", SECRET_KEY, "--fence", &fence, "--reason", "redo",
        ],
    );
    assert!(reopened.status.success(), "{}", text(&reopened.stderr));
    assert!(exec(&sb, &env).status.success());
    assert_eq!(
        lines(&sb.path("effect")),
        2,
        "reopened, the command ran again"
    );
}

#[test]
fn after_rotation_old_records_replay_and_a_keyring_without_their_key_says_which() {
    let sb = Sandbox::new();
    assert!(exec(&sb, &seal_env(&["k1"])).status.success());
    let rotated = exec(&sb, &seal_env(&["k2", "k1"]));
    assert!(rotated.status.success(), "{}", text(&rotated.stderr));
    assert_eq!(text(&rotated.stdout).trim(), SECRET_RESULT);
    assert_eq!(
        lines(&sb.path("effect")),
        1,
        "replayed under the rotated keyring"
    );
    let without_k1 = run(&sb, &seal_env(&["k2"]), &["keys", "show", SECRET_KEY]);
    assert!(!without_k1.status.success());
    assert!(
        text(&without_k1.stderr).contains("key id \"k1\""),
        "{}",
        text(&without_k1.stderr)
    );
    let refused = exec(&sb, &seal_env(&["k2"]));
    assert!(!refused.status.success(), "{}", text(&refused.stdout));
    assert!(
        text(&refused.stderr).contains("key id \"k1\""),
        "{}",
        text(&refused.stderr)
    );
    assert_eq!(lines(&sb.path("effect")), 1, "nothing ran again");
}

#[test]
fn a_short_key_is_refused_before_anything_runs() {
    let sb = Sandbox::new();
    let short = format!(
        "k1:{}",
        base64::engine::general_purpose::STANDARD.encode([7u8; 16])
    );
    let out = exec(
        &sb,
        &[
            (idemgate_seal::KEYS_VAR, short),
            (idemgate_seal::SECRET_VAR, testing::secret_b64()),
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(69),
        "the store's exit code: nothing ran"
    );
    assert!(
        text(&out.stderr).contains("exactly 32 random bytes"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(lines(&sb.path("effect")), 0);
}

#[test]
fn the_gateway_seals_and_finds_its_records_by_key() {
    let sb = Sandbox::new();
    let token = "test-token-0123456789abcdef";
    let mut serve = sb.idemgate();
    serve.env("IDEMGATE_TOKEN", token);
    for (name, value) in seal_env(&["k1"]) {
        serve.env(name, value);
    }
    let (mut child, addr) = serve_on_a_free_port(serve);
    let request = |method: &str, path: &str, headers: &str| {
        http(
            &addr,
            &format!(
                "{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\
                 {headers}Content-Length: 2\r\nConnection: close\r\n\r\n{{}}"
            ),
        )
    };
    let begin = request(
        "POST",
        "/v1/tools/t/begin",
        &format!("Idempotency-Key: {SECRET_KEY}\r\n"),
    );
    assert!(begin.starts_with("HTTP/1.1 201"), "{begin}");
    let by_key = request("GET", &format!("/v1/tools/t/records/{SECRET_KEY}"), "");
    assert!(by_key.starts_with("HTTP/1.1 200"), "{by_key}");
    let listed = request("GET", "/v1/records", "");
    assert!(listed.contains("\"hmac-"), "{listed}");
    assert!(!listed.contains(SECRET_KEY), "{listed}");
    assert!(!testing::reveals(&dump(&sb), SECRET_KEY));
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn a_gateway_whose_keyring_lacks_a_record_s_key_names_the_record_and_the_key_id() {
    let sb = Sandbox::new();
    let token = "test-token-0123456789abcdef";
    let serve = |ids: &[&str]| {
        let mut serve = sb.idemgate();
        serve.env("IDEMGATE_TOKEN", token);
        for (name, value) in seal_env(ids) {
            serve.env(name, value);
        }
        serve_on_a_free_port(serve)
    };
    let request = |addr: &str, path: &str, headers: &str, body: &str| {
        http(
            addr,
            &format!(
                "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\
                 {headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            ),
        )
    };
    let key = format!("Idempotency-Key: {SECRET_KEY}\r\n");
    let (mut child, addr) = serve(&["k1"]);
    let begin = request(&addr, "/v1/tools/t/begin", &key, "{}");
    assert!(begin.starts_with("HTTP/1.1 201"), "{begin}");
    let lease: serde_json::Value =
        serde_json::from_str(begin.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    let complete = serde_json::json!({
        "key": SECRET_KEY,
        "lease": lease["lease"],
        "outcome": {"kind": "success", "result": SECRET_RESULT},
    });
    let done = request(&addr, "/v1/tools/t/complete", "", &complete.to_string());
    assert!(done.starts_with("HTTP/1.1 200"), "{done}");
    let _ = child.kill();
    let _ = child.wait();

    // The key it was sealed under is gone: nothing runs, and the operator reads which record
    // cannot be opened and which key id it needs (as `exec` says it), not only that the store
    // failed.
    let (mut child, addr) = serve(&["k2"]);
    let refused = request(&addr, "/v1/tools/t/begin", &key, "{}");
    let _ = child.kill();
    let _ = child.wait();
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    let problem: serde_json::Value =
        serde_json::from_str(refused.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(
        problem["type"], "https://idemgate.dev/problems/store-unavailable",
        "{problem}"
    );
    let detail = problem["detail"].as_str().unwrap();
    for said in ["nothing ran", SECRET_KEY, "key id \"k1\""] {
        assert!(detail.contains(said), "{said:?} in {detail}");
    }
    assert!(!detail.contains(SECRET_RESULT), "{detail}");
}

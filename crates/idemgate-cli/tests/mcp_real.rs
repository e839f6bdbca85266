//! Real Python MCP servers from PyPI behind `idemgate mcp`, pinned by scripts/mcp-test-deps:
//! mcp-server-git (SDK 2.x) on a temporary repository and mcp-server-sqlite (SDK 1.x) on a
//! temporary database, driven by the official Python SDK client
//! (tests/fixtures/mcp_real_client.py) over stdio and Streamable HTTP, and without the proxy as the
//! baseline. State is checked on the server's side: with `git` itself, and by counting rows.

use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};

use crate::cli::Sandbox;
use crate::mcp::{mcp_deps, Proxy};

/// Commits and branches wait for the first of their duplicates however long it takes; the reads
/// are configured as reads (the server is not trusted, so its `readOnlyHint`s alone are not).
const GIT_CONFIG: &str = "[tools.git_commit]\nwait = \"60s\"\n[tools.git_create_branch]\nwait = \"60s\"\n[tools.git_status]\nkind = \"read\"\n[tools.git_log]\nkind = \"read\"\n";
const SQLITE_CONFIG: &str = "[tools.read_query]\nkind = \"read\"\n";
const COMMIT_MESSAGE: &str = "idemgate: once";

fn git_server() -> String {
    mcp_deps()
        .join("venv/bin/mcp-server-git")
        .display()
        .to_string()
}

fn sqlite_server() -> String {
    let server = mcp_deps().join("venv-sqlite/bin/mcp-server-sqlite");
    server.display().to_string()
}

fn replayed(result: &Value) -> bool {
    result["_meta"]["dev.idemgate/replayed"] == json!(true)
}

fn text(result: &Value) -> &str {
    result["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text in {result}"))
}

/// `git -C repo args…`, which must succeed; its stdout.
fn git(repo: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A repository with one commit on `main`, an untracked notes.txt, and a pre-commit hook that
/// logs each run to .git/hook-ran and then waits (bounded, a minute) for .git/release, which the
/// client writes once it has given up on the commit and re-sent it.
fn git_repo(sb: &Sandbox) -> PathBuf {
    let repo = sb.path("repo");
    fs::create_dir(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    git(&repo, &["config", "user.name", "Test"]);
    git(&repo, &["config", "user.email", "test@example.com"]);
    fs::write(repo.join("README"), "hello\n").unwrap();
    git(&repo, &["add", "README"]);
    git(&repo, &["commit", "-q", "-m", "init"]);
    fs::write(repo.join("notes.txt"), "printer on fire\n").unwrap();
    let dot_git = repo.join(".git");
    let hook = dot_git.join("hooks/pre-commit");
    fs::write(
        &hook,
        format!(
            "#!/bin/sh\necho ran >> '{ran}'\ni=0\nwhile [ ! -e '{release}' ]; do\n  i=$((i+1)); [ $i -gt 1200 ] && exit 1\n  sleep 0.05\ndone\n",
            ran = dot_git.join("hook-ran").display(),
            release = dot_git.join("release").display()
        ),
    )
    .unwrap();
    fs::set_permissions(&hook, fs::Permissions::from_mode(0o755)).unwrap();
    repo
}

/// How the client reaches the server.
enum Via<'a> {
    /// Through a proxy on stdio configured by this TOML.
    Stdio(&'a str),
    /// Through this `idemgate mcp --listen`.
    Http(&'a crate::mcp_http::Listening),
    /// Straight to the server on stdio.
    Direct,
}

/// The client in `scenario` (`era` of the handshake) on `path`, reaching `server` `via`; what it
/// saw.
fn run_client(
    sb: &Sandbox,
    via: Via,
    era: &str,
    scenario: &str,
    path: &Path,
    server: &[&str],
) -> Value {
    let mut client = sb.python_client("mcp_real_client.py");
    client.arg(scenario).arg(path).env("MCP_ERA", era);
    let client = match via {
        Via::Stdio(config) => {
            client.args(["stdio", env!("CARGO_BIN_EXE_idemgate")]);
            sb.mcp(client, config, server)
        }
        Via::Http(listening) => {
            client.args(["http", &listening.url]);
            client
        }
        Via::Direct => {
            client.arg("stdio").args(server);
            client
        }
    };
    sb.client_saw(client)
}

/// What the git scenario must show through the proxy: the commit the client gave up on and
/// re-sent ran once (one hook run, one new commit) and the re-sent call got its stored result;
/// 16 racing branch creations ran once; the reads passed unkeyed.
fn assert_git_ran_once(seen: &Value, repo: &Path, protocol: &str) {
    assert_eq!(seen["protocol"], protocol, "{seen}");
    assert!(
        seen["tools"]
            .as_array()
            .unwrap()
            .contains(&json!("git_commit")),
        "{seen}"
    );
    assert_eq!(text(&seen["add"]), "Files staged successfully", "{seen}");
    assert_ne!(seen["timed_out"], json!(false), "{seen}");
    let head = git(repo, &["rev-parse", "HEAD"]);
    let retry = &seen["retry"];
    assert!(replayed(retry), "{seen}");
    assert_ne!(retry["isError"], true, "{seen}");
    assert_eq!(
        text(retry),
        format!("Changes committed successfully with hash {}", head.trim()),
        "{seen}"
    );
    let subjects = git(repo, &["log", "--format=%s"]);
    assert_eq!(
        subjects.lines().collect::<Vec<_>>(),
        [COMMIT_MESSAGE, "init"]
    );
    let hook_runs = fs::read_to_string(repo.join(".git/hook-ran")).unwrap();
    assert_eq!(hook_runs.lines().count(), 1, "the commit ran once");

    // Without the proxy 15 of these answer "already exists" (an error for an action that was
    // done); through it one ran and 15 replayed its answer.
    let racing = seen["racing"].as_array().unwrap();
    assert_eq!(racing.len(), 16);
    assert_eq!(racing.iter().filter(|r| !replayed(r)).count(), 1, "{seen}");
    for r in racing {
        assert_ne!(r["isError"], true, "{seen}");
        assert_eq!(text(r), "Created branch 'feature-1' from 'main'", "{seen}");
    }
    assert_eq!(
        git(repo, &["branch", "--list", "--format=%(refname:short)"]),
        "feature-1\nmain\n"
    );

    for read in seen["status"].as_array().unwrap() {
        assert!(!replayed(read), "{seen}");
        assert!(text(read).contains("working tree clean"), "{seen}");
    }
    assert!(!replayed(&seen["log"]), "{seen}");
    assert_eq!(
        text(&seen["log"]).matches(COMMIT_MESSAGE).count(),
        1,
        "{seen}"
    );
}

/// The reads left no records: only the three keyed actions are in the store.
fn assert_records(sb: &Sandbox, server_name: &str, tools: &[&str]) {
    let out = sb.run(&["--json", "keys", "list"]);
    let rows: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut recorded: Vec<String> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"]["tool"].as_str().unwrap().to_owned())
        .collect();
    recorded.sort();
    let expected: Vec<String> = tools.iter().map(|t| format!("{server_name}/{t}")).collect();
    assert_eq!(recorded, expected, "{rows}");
}

/// The git scenario over stdio in one protocol era (`era` as the client script names it), which
/// the server must confirm as `version`.
fn git_over_stdio_runs_once(era: &str, version: &str) {
    let sb = Sandbox::new();
    let repo = git_repo(&sb);
    let server = git_server();
    let seen = run_client(
        &sb,
        Via::Stdio(GIT_CONFIG),
        era,
        "git",
        &repo,
        &[&server, "--repository", repo.to_str().unwrap()],
    );
    assert_git_ran_once(&seen, &repo, version);
    assert_records(
        &sb,
        "mcp-server-git",
        &["git_add", "git_commit", "git_create_branch"],
    );
}

#[test]
fn mcp_real_git_server_over_stdio_runs_a_retried_commit_and_racing_branches_once() {
    git_over_stdio_runs_once("2025", "2025-11-25");
}

#[test]
fn mcp_real_git_server_over_stdio_in_the_2026_era() {
    // The same through `server/discover` and per-request `_meta` (2026-07-28), which
    // mcp-server-git speaks besides `initialize`: the frames pass through the proxy as they are.
    git_over_stdio_runs_once("2026", "2026-07-28");
}

#[test]
fn mcp_real_git_server_replays_2025_era_results_to_a_2026_era_client() {
    // Results stored from 2025-era calls have no `resultType`, which 2026-07-28 results must
    // carry (the SDK refuses a result without it): the proxy adds it to what it answers itself,
    // replays and refusals, when the request speaks that era.
    let sb = Sandbox::new();
    let repo = git_repo(&sb);
    let server = git_server();
    let args = [server.as_str(), "--repository", repo.to_str().unwrap()];
    let first = run_client(&sb, Via::Stdio(GIT_CONFIG), "2025", "git", &repo, &args);
    assert_git_ran_once(&first, &repo, "2025-11-25");
    let later = run_client(
        &sb,
        Via::Stdio(GIT_CONFIG),
        "2026",
        "git-again",
        &repo,
        &args,
    );
    assert_eq!(later["protocol"], "2026-07-28", "{later}");
    let earlier = [&first["add"], &first["retry"], &first["racing"][0]];
    let again = later["again"].as_array().unwrap();
    assert_eq!(again.len(), earlier.len());
    for (r, e) in again.iter().zip(earlier) {
        assert!(replayed(r), "{later}");
        assert_eq!(r["content"][0], e["content"][0], "{later}");
    }
    let unkeyed = &later["unkeyed"];
    assert_eq!(unkeyed["isError"], true, "{later}");
    assert_eq!(unkeyed["_meta"]["dev.idemgate/verdict"], "key_required");
    let subjects = git(&repo, &["log", "--format=%s"]);
    assert_eq!(
        subjects.lines().collect::<Vec<_>>(),
        [COMMIT_MESSAGE, "init"]
    );
    let hook_runs = fs::read_to_string(repo.join(".git/hook-ran")).unwrap();
    assert_eq!(hook_runs.lines().count(), 1, "the commit ran once");
}

#[test]
fn mcp_real_git_server_without_the_proxy_answers_retries_with_errors() {
    // The baseline: git refuses the second commit and the second branch itself, so the state
    // changes once, but the re-sent commit and 15 of the racing creations answer with errors for
    // actions that were done.
    let sb = Sandbox::new();
    let repo = git_repo(&sb);
    let server = git_server();
    let seen = run_client(
        &sb,
        Via::Direct,
        "2025",
        "git",
        &repo,
        &[&server, "--repository", repo.to_str().unwrap()],
    );
    assert_ne!(seen["timed_out"], json!(false), "{seen}");
    assert_eq!(seen["retry"]["isError"], true, "{seen}");
    assert!(
        text(&seen["retry"]).contains("No changes staged for commit"),
        "{seen}"
    );
    let racing = seen["racing"].as_array().unwrap();
    let refused: Vec<&Value> = racing.iter().filter(|r| r["isError"] == true).collect();
    assert_eq!(refused.len(), 15, "{seen}");
    for r in refused {
        assert!(text(r).contains("already exists"), "{seen}");
    }
    let subjects = git(&repo, &["log", "--format=%s"]);
    assert_eq!(
        subjects.lines().collect::<Vec<_>>(),
        [COMMIT_MESSAGE, "init"]
    );
}

#[test]
fn mcp_real_git_server_over_http_runs_a_retried_commit_and_racing_branches_once() {
    git_over_http_runs_once("2025", "2025-11-25");
}

#[test]
fn mcp_real_git_server_over_http_in_the_2026_era_without_a_session() {
    // Sessionless: every request a POST of its own to the child shared by the tenant's
    // sessionless requests; mcp-server-git answers server/discover itself, so its frames pass.
    git_over_http_runs_once("2026", "2026-07-28");
}

/// The git scenario through `idemgate mcp --listen` with a client of `era`, which agrees on
/// `version`.
fn git_over_http_runs_once(era: &str, version: &str) {
    let sb = Sandbox::new();
    let repo = git_repo(&sb);
    let server = git_server();
    let listening = sb.listen(
        GIT_CONFIG,
        &[&server, "--repository", repo.to_str().unwrap()],
    );
    let seen = run_client(&sb, Via::Http(&listening), era, "git", &repo, &[]);
    assert_git_ran_once(&seen, &repo, version);
    assert_records(
        &sb,
        "mcp-server-git",
        &["git_add", "git_commit", "git_create_branch"],
    );
}

/// `talk` with a fresh mcp-server-git on `repo` straight, then through a fresh proxy; the
/// answers of each.
fn direct_and_proxied(
    sb: &Sandbox,
    repo: &Path,
    talk: impl Fn(&mut Proxy) -> Vec<Value>,
) -> (Vec<Value>, Vec<Value>) {
    let server = git_server();
    let mut straight = Command::new(&server);
    straight.arg("--repository").arg(repo);
    let direct = talk(&mut Proxy::spawn(straight, sb));
    let args = [server.as_str(), "--repository", repo.to_str().unwrap()];
    let proxied = talk(&mut Proxy::spawn(
        sb.mcp(sb.idemgate(), GIT_CONFIG, &args),
        sb,
    ));
    (direct, proxied)
}

/// `frames` without the `idempotency_key` argument the proxy offers in the write tools of a
/// `tools/list` answer (the one thing it adds to the server's frames), checked to be there:
/// in `git_commit` (a write), as an optional string or null.
fn without_offered_key(mut frames: Vec<Value>) -> Vec<Value> {
    let mut offered = Vec::new();
    for frame in &mut frames {
        let tools = frame
            .pointer_mut("/result/tools")
            .and_then(Value::as_array_mut);
        for tool in tools.into_iter().flatten() {
            let name = tool["name"].as_str().unwrap_or_default().to_owned();
            let properties = tool["inputSchema"]["properties"].as_object_mut();
            if let Some(key) = properties.and_then(|p| p.remove("idempotency_key")) {
                assert_eq!(key["type"], json!(["string", "null"]), "{name}");
                let required = &tool["inputSchema"]["required"];
                assert!(!required.to_string().contains("idempotency_key"), "{name}");
                offered.push(name);
            }
        }
    }
    assert!(offered.iter().any(|n| n == "git_commit"), "{offered:?}");
    frames
}

#[test]
fn mcp_real_git_server_frames_pass_the_proxy_unchanged() {
    // The server's answers through the proxy equal its answers straight, field for field (the
    // raw frames, with whatever the SDK client would drop), in both eras.
    let sb = Sandbox::new();
    let repo = git_repo(&sb);
    let (direct, proxied) = direct_and_proxied(&sb, &repo, |peer| {
        let init = json!({"protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "test", "version": "1"}, "x-client-unknown": {"kept": true}});
        let initialized = peer.request("initialize", init);
        peer.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        let listed = peer.request("tools/list", json!({"x-client-unknown": 1}));
        vec![initialized, listed]
    });
    assert_eq!(
        direct[0]["result"]["protocolVersion"], "2025-11-25",
        "{direct:?}"
    );
    assert_eq!(
        direct[1]["result"]["tools"][0]["annotations"]["readOnlyHint"], true,
        "{direct:?}"
    );
    assert_eq!(without_offered_key(proxied), direct);

    // 2026-07-28: no handshake on the connection, the envelope in every request's `_meta`.
    let (direct, proxied) = direct_and_proxied(&sb, &repo, |peer| {
        let envelope = json!({"_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": {}}});
        let discovered = peer.request("server/discover", envelope.clone());
        let listed = peer.request("tools/list", envelope);
        vec![discovered, listed]
    });
    assert_eq!(
        direct[0]["result"]["supportedVersions"],
        json!(["2026-07-28"]),
        "{direct:?}"
    );
    assert!(direct[1]["result"]["tools"].is_array(), "{direct:?}");
    assert_eq!(without_offered_key(proxied), direct);
}

#[test]
fn mcp_real_git_server_2026_era_trusted_read_passes_without_a_listing() {
    // A 2026-era client that calls a tool without listing first: the proxy lists the tools
    // itself to learn the annotations, under the call's envelope (the server refuses a listing
    // without it), so a trusted server's `readOnlyHint` tool passes unkeyed.
    let sb = Sandbox::new();
    let repo = git_repo(&sb);
    let server = git_server();
    let args = [server.as_str(), "--repository", repo.to_str().unwrap()];
    let mut proxied = Proxy::spawn(sb.mcp(sb.idemgate(), "trusted = true\n", &args), &sb);
    let envelope = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {}});
    let discovered = proxied.request("server/discover", json!({"_meta": envelope}));
    assert!(discovered["result"].is_object(), "{discovered}");
    let status = proxied.request(
        "tools/call",
        json!({"name": "git_status", "arguments": {"repo_path": repo}, "_meta": envelope}),
    );
    assert!(
        status["result"]["_meta"]["dev.idemgate/verdict"].is_null(),
        "{status}"
    );
    assert!(
        text(&status["result"]).contains("Repository status"),
        "{status}"
    );
    // A write still needs its key, and the refusal carries the era's resultType.
    let commit = proxied.request(
        "tools/call",
        json!({"name": "git_commit", "arguments": {"repo_path": repo, "message": "m"}, "_meta": envelope}),
    );
    assert_eq!(
        commit["result"]["_meta"]["dev.idemgate/verdict"], "key_required",
        "{commit}"
    );
    assert_eq!(commit["result"]["resultType"], "complete", "{commit}");
}

/// What the sqlite scenario must show: the INSERT sent twice with one key, and the rows it left.
fn assert_sqlite(seen: &Value, rows: u64, again_replayed: bool) {
    assert_eq!(seen["protocol"], "2025-11-25", "{seen}");
    assert_eq!(
        text(&seen["create"]),
        "Table created successfully",
        "{seen}"
    );
    assert_eq!(text(&seen["first"]), "[{'affected_rows': 1}]", "{seen}");
    assert!(!replayed(&seen["first"]), "{seen}");
    assert_eq!(text(&seen["again"]), "[{'affected_rows': 1}]", "{seen}");
    assert_eq!(replayed(&seen["again"]), again_replayed, "{seen}");
    assert!(!replayed(&seen["read"]), "{seen}");
    assert_eq!(text(&seen["read"]), format!("[{{'n': {rows}}}]"), "{seen}");
    assert_eq!(seen["rows"], rows, "{seen}");
}

#[test]
fn mcp_real_sqlite_server_without_the_proxy_inserts_twice() {
    // The baseline: the server ignores the key, and a re-sent INSERT inserts again.
    let sb = Sandbox::new();
    let db = sb.path("orders.db");
    let server = sqlite_server();
    let seen = run_client(
        &sb,
        Via::Direct,
        "2025",
        "sqlite",
        &db,
        &[&server, "--db-path", db.to_str().unwrap()],
    );
    assert_sqlite(&seen, 2, false);
}

#[test]
fn mcp_real_sqlite_server_over_stdio_inserts_once() {
    let sb = Sandbox::new();
    let db = sb.path("orders.db");
    let server = sqlite_server();
    let seen = run_client(
        &sb,
        Via::Stdio(SQLITE_CONFIG),
        "2025",
        "sqlite",
        &db,
        &[&server, "--db-path", db.to_str().unwrap()],
    );
    assert_sqlite(&seen, 1, true);
    assert_records(&sb, "mcp-server-sqlite", &["create_table", "write_query"]);
}

#[test]
fn mcp_real_sqlite_server_over_http_inserts_once() {
    let sb = Sandbox::new();
    let db = sb.path("orders.db");
    let server = sqlite_server();
    let listening = sb.listen(SQLITE_CONFIG, &[&server, "--db-path", db.to_str().unwrap()]);
    let seen = run_client(&sb, Via::Http(&listening), "2025", "sqlite", &db, &[]);
    assert_sqlite(&seen, 1, true);
    assert_records(&sb, "mcp-server-sqlite", &["create_table", "write_query"]);
}

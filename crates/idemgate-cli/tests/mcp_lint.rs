//! `idemgate mcp lint` against the real servers scripts/mcp-test-deps installs (what they list,
//! and the configuration it writes for them, which the proxy must take), against a fixture whose
//! listing defeats a gate, and against commands that are no MCP server at all.

use std::path::Path;
use std::process::Output;

use idemgate::ToolKind;
use serde_json::Value;

use crate::cli::{text, Sandbox};
use crate::mcp::mcp_deps;

/// `idemgate mcp lint [flags] -- server…`.
fn lint(sb: &Sandbox, flags: &[&str], server: &[&str]) -> Output {
    let mut args = vec!["mcp", "lint"];
    args.extend_from_slice(flags);
    args.push("--");
    args.extend_from_slice(server);
    sb.idemgate()
        .args(&args)
        .env("MEMORY_FILE_PATH", sb.path("memory.json"))
        .output()
        .unwrap()
}

/// The `--json` report of a lint that must exit with `code`.
fn report(sb: &Sandbox, server: &[&str], code: i32) -> Value {
    let out = lint(sb, &["--json"], server);
    assert_eq!(out.status.code(), Some(code), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn tool<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {report}"))
}

fn codes(report: &Value, name: &str) -> Vec<String> {
    tool(report, name)["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["code"].as_str().unwrap().to_owned())
        .collect()
}

/// The configuration `--print-config` writes, as the proxy reads it.
fn printed_config(sb: &Sandbox, server: &[&str]) -> idemgate_mcp::Config {
    let out = lint(sb, &["--print-config"], server);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let toml = text(&out.stdout);
    idemgate_mcp::Config::parse(&toml).unwrap_or_else(|e| panic!("{e}\n{toml}"))
}

fn kind(config: &idemgate_mcp::Config, tool: &str) -> ToolKind {
    config.policy(tool, None).kind
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

#[test]
fn lint_reads_the_memory_servers_annotations() {
    let sb = Sandbox::new();
    let server = path(&mcp_deps().join("node/node_modules/.bin/mcp-server-memory"));
    let r = report(&sb, &[&server], 0);
    assert_eq!(r["server"]["name"], "memory-server", "{r}");
    assert_eq!(r["tools"].as_array().unwrap().len(), 9, "{r}");
    for read in ["read_graph", "search_nodes", "open_nodes"] {
        assert_eq!(tool(&r, read)["kind"], "read", "{read}");
        assert_eq!(codes(&r, read), Vec::<String>::new(), "{read}");
    }
    for write in ["create_entities", "create_relations", "add_observations"] {
        assert_eq!(tool(&r, write)["kind"], "write", "{write}");
    }
    // Deletes are annotated idempotent, and destructive: kept writes, with a note.
    assert_eq!(codes(&r, "delete_entities"), ["idempotent_but_destructive"]);
    assert_eq!(tool(&r, "delete_entities")["kind"], "write");

    let config = printed_config(&sb, &[&server]);
    assert!(!config.trusted);
    assert_eq!(kind(&config, "read_graph"), ToolKind::Read);
    assert_eq!(kind(&config, "create_entities"), ToolKind::Write);
    assert_eq!(kind(&config, "delete_entities"), ToolKind::Write);
}

#[test]
fn lint_reads_the_git_servers_annotations() {
    let sb = Sandbox::new();
    let repo = sb.path("repo");
    let init = std::process::Command::new("git")
        .args(["init", "-q"])
        .arg(&repo)
        .status()
        .unwrap();
    assert!(init.success());
    let server = path(&mcp_deps().join("venv/bin/mcp-server-git"));
    let repo = path(&repo);
    let r = report(&sb, &[&server, "--repository", &repo], 0);
    for read in ["git_status", "git_log", "git_diff", "git_show"] {
        assert_eq!(tool(&r, read)["kind"], "read", "{read}");
    }
    for write in ["git_commit", "git_add", "git_create_branch", "git_checkout"] {
        assert_eq!(tool(&r, write)["kind"], "write", "{write}");
    }
    // `git add` is idempotent indeed: no warning for it.
    assert_eq!(codes(&r, "git_add"), Vec::<String>::new());
    assert_eq!(codes(&r, "git_reset"), ["idempotent_but_destructive"]);
    // What the proxy's end-to-end tests configure by hand, the lint writes from the listing.
    let config = printed_config(&sb, &[&server, "--repository", &repo]);
    assert_eq!(kind(&config, "git_status"), ToolKind::Read);
    assert_eq!(kind(&config, "git_log"), ToolKind::Read);
    assert_eq!(kind(&config, "git_commit"), ToolKind::Write);
}

#[test]
fn lint_suggests_reads_for_the_sqlite_server_which_says_nothing() {
    let sb = Sandbox::new();
    let server = path(&mcp_deps().join("venv-sqlite/bin/mcp-server-sqlite"));
    let db = path(&sb.path("lint.db"));
    let r = report(&sb, &[&server, "--db-path", &db], 0);
    let tools = r["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 6, "{r}");
    for t in tools {
        assert_eq!(t["kind"], "write", "{t}");
        assert!(codes(&r, t["name"].as_str().unwrap()).contains(&"no_annotations".to_owned()));
    }
    for read in ["read_query", "list_tables", "describe_table"] {
        assert_eq!(tool(&r, read)["suggested"], "read", "{read}");
    }
    for write in ["write_query", "create_table", "append_insight"] {
        assert_eq!(tool(&r, write)["suggested"], Value::Null, "{write}");
    }
    // The suggestions are comments: until a person uncomments them, every tool is a write.
    let out = lint(&sb, &["--print-config"], &[&server, "--db-path", &db]);
    let toml = text(&out.stdout);
    assert!(
        toml.contains("# [tools.read_query]\n# kind = \"read\"\n"),
        "{toml}"
    );
    let config = idemgate_mcp::Config::parse(&toml).unwrap();
    assert_eq!(kind(&config, "read_query"), ToolKind::Write);
    let uncommented = toml
        .replace("# [tools.", "[tools.")
        .replace("# kind", "kind");
    let config = idemgate_mcp::Config::parse(&uncommented).unwrap();
    assert_eq!(kind(&config, "read_query"), ToolKind::Read);
    assert_eq!(kind(&config, "write_query"), ToolKind::Write);
}

#[test]
fn lint_warns_of_a_listing_that_defeats_the_gate() {
    let sb = Sandbox::new();
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/mcp_lint_server.py"
    );
    let server = ["python3", fixture];
    // Both pages, read past a line of noise and a request of the server's own.
    let r = report(&sb, &server, 1);
    assert_eq!(r["tools"].as_array().unwrap().len(), 4, "{r}");
    assert_eq!(codes(&r, "delete_user"), ["read_only_name_writes"]);
    assert_eq!(tool(&r, "delete_user")["kind"], "write");
    assert_eq!(tool(&r, "list_users")["kind"], "read");
    assert_eq!(
        codes(&r, "pay"),
        [
            "no_annotations",
            "declares_key_argument",
            "new_key_every_request"
        ]
    );
    assert_eq!(codes(&r, "create_order"), ["idempotent_name_creates"]);

    // The configuration alone, for a file: the warnings still reach stderr.
    let out = lint(&sb, &["--print-config"], &server);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("warning: delete_user [read_only_name_writes]"),
        "{}",
        text(&out.stderr)
    );
    idemgate_mcp::Config::parse(&text(&out.stdout)).unwrap();

    let out = lint(&sb, &[], &server);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(
        shown.starts_with("lint-fixture 0.0.1 (protocol 2025-11-25): 4 tools, 3 gated as writes; 3 warnings, 2 notes."),
        "{shown}"
    );
    assert!(
        shown.contains("Warnings:\n  delete_user [read_only_name_writes]"),
        "{shown}"
    );
    assert!(
        shown.contains(
            "pay [new_key_every_request]: the description of `idempotency_key` tells the model"
        ),
        "{shown}"
    );
    assert!(shown.contains("[tools.list_users]"), "{shown}");
    assert!(!shown.contains("[tools.delete_user]"), "{shown}");
}

#[test]
fn lint_fails_loudly_when_there_is_no_server() {
    let sb = Sandbox::new();
    let silent = lint(&sb, &["--timeout", "1s"], &["sh", "-c", "cat > /dev/null"]);
    assert_eq!(silent.status.code(), Some(69));
    assert!(
        text(&silent.stderr).contains("the server did not answer initialize in time"),
        "{}",
        text(&silent.stderr)
    );
    let dies = lint(&sb, &[], &["sh", "-c", "echo no database here >&2; exit 3"]);
    assert_eq!(dies.status.code(), Some(69));
    let err = text(&dies.stderr);
    // It exits before or after the request is written: either way, said so.
    assert!(
        err.contains("the server closed its output before answering initialize")
            || err.contains("the server closed its input before initialize could be sent"),
        "{err}"
    );
    assert!(err.contains("no database here"), "{err}");
    let missing = lint(&sb, &[], &[&path(&sb.path("no-such-server"))]);
    assert_eq!(missing.status.code(), Some(69));
    assert!(
        text(&missing.stderr).contains("failed to start"),
        "{}",
        text(&missing.stderr)
    );
    let usage = sb.run(&["mcp", "lint"]);
    assert_eq!(usage.status.code(), Some(2), "{}", text(&usage.stderr));
    let both = lint(&sb, &["--print-config", "--json"], &["true"]);
    assert_eq!(both.status.code(), Some(2), "{}", text(&both.stderr));
}

#[test]
fn lint_stops_a_server_that_never_stops_writing_at_its_deadline() {
    let sb = Sandbox::new();
    // `yes` writes lines that are not JSON-RPC as fast as it can and never answers.
    let started = std::time::Instant::now();
    let out = lint(&sb, &["--timeout", "2s"], &["yes"]);
    assert_eq!(out.status.code(), Some(69), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("the server did not answer initialize in time"),
        "{}",
        text(&out.stderr)
    );
    // The deadline bounds it (a generous margin for a loaded machine, far below forever).
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
}

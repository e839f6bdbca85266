//! The binary, run as a user runs it: real processes on a real SQLite file.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A data directory and SQLite store of one test's own (the MCP tests use it too).
pub(crate) struct Sandbox {
    dir: tempfile::TempDir,
}

impl Sandbox {
    pub(crate) fn new() -> Self {
        Sandbox {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub(crate) fn idemgate(&self) -> Command {
        self.with_store(env!("CARGO_BIN_EXE_idemgate"))
    }

    /// `program` with the sandbox's store in its environment (for idemgate, or for a program that
    /// starts idemgate).
    pub(crate) fn with_store(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new(program);
        c.env("XDG_DATA_HOME", self.path("data"))
            .env(
                "IDEMGATE_STORE",
                format!("sqlite://{}", self.path("idem.db").display()),
            )
            .env_remove("IDEMGATE_TENANT")
            .env_remove("IDEMGATE_JOURNAL")
            .env_remove("IDEMGATE_AUDIT_LOG")
            .stdin(Stdio::null());
        c
    }

    pub(crate) fn run(&self, args: &[&str]) -> Output {
        self.idemgate().args(args).output().unwrap()
    }

    /// `exec` of a shell snippet that appends a line to `file` (the side effect we count).
    fn exec_append(&self, key: &str, file: &Path, extra: &[&str]) -> Output {
        let script = format!("echo ran >> '{}'; echo out; echo err >&2", file.display());
        let mut args = vec!["exec", "--key", key];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "sh", "-c", &script]);
        self.run(&args)
    }
}

/// `idemgate serve` on a free loopback port, run by `command` (with its environment), and the
/// address it listens on.
pub(crate) fn serve_on_a_free_port(mut command: Command) -> (std::process::Child, String) {
    let mut child = command
        .args(["serve", "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr = announced(&mut child, "idemgate: listening on http://");
    (child, addr)
}

/// What follows `prefix` on the first line `child` prints (its address, as `serve` and
/// `console` announce it on stdout).
pub(crate) fn announced(child: &mut std::process::Child, prefix: &str) -> String {
    use std::io::BufRead as _;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    line.trim()
        .strip_prefix(prefix)
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned()
}

/// The whole answer to one raw HTTP/1.1 request (which should say `Connection: close`).
pub(crate) fn http(addr: &str, request: &str) -> String {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

pub(crate) fn lines(file: &Path) -> usize {
    fs::read_to_string(file)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

pub(crate) fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn exec_runs_once_and_replays_output_and_exit_code() {
    let sb = Sandbox::new();
    let effect = sb.path("effect");
    let script = format!(
        "echo ran >> '{}'; echo hello; echo oops >&2; exit 3",
        effect.display()
    );
    let first = sb.run(&["exec", "--key", "order-1", "--", "sh", "-c", &script]);
    assert_eq!(first.status.code(), Some(3));
    assert_eq!(text(&first.stdout), "hello\n");
    assert_eq!(text(&first.stderr), "oops\n");
    let again = sb.run(&["exec", "--key", "order-1", "--", "sh", "-c", &script]);
    assert_eq!(again.status.code(), Some(3), "the exit code is replayed");
    assert_eq!(text(&again.stdout), "hello\n");
    assert!(text(&again.stderr).starts_with("oops\n"));
    assert!(
        text(&again.stderr).contains("replayed"),
        "{}",
        text(&again.stderr)
    );
    let quiet = sb.run(&["exec", "-q", "--key", "order-1", "--", "sh", "-c", &script]);
    assert_eq!(text(&quiet.stderr), "oops\n");
    assert_eq!(lines(&effect), 1);
}

#[test]
fn a_full_disk_journals_the_outcome_into_the_reserve_else_exits_70() {
    let tiny = idemgate_conformance::tmpfs::TmpFs::mount(4 << 20);
    let sb = Sandbox::new();
    let store = format!("sqlite://{}", tiny.path().join("idem.db").display());
    let journal = tiny.path().join("idem.db.journal");
    let ran = sb.path("ran");
    // The command's side effect happens, then the disk fills up (the command does it, so that
    // the reservation had room and the completion has none).
    let exec = |key: &str, also: &str| {
        let script = format!(
            "echo ran >> '{}'; {also} cat /dev/zero > '{}' 2>/dev/null; true",
            ran.display(),
            tiny.path().join(key).display()
        );
        sb.idemgate()
            .args(["--store", &store, "exec", "--key", key, "--", "sh", "-c"])
            .arg(script)
            .output()
            .unwrap()
    };

    let out = exec("k1", "");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("it is journaled"),
        "{}",
        text(&out.stderr)
    );
    let entries = fs::read_dir(&journal)
        .unwrap()
        .filter(|f| {
            f.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "json")
        })
        .count();
    assert_eq!(entries, 1, "the outcome is in the journal");

    // A full disk refuses the reservation: nothing runs (69). The disk is filled again first:
    // the last process, exiting, checkpointed its write-ahead log and deleted it, which freed
    // what the log held (170 KiB here).
    let _ = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "cat /dev/zero > '{}' 2>/dev/null",
            tiny.path().join("k0-fill").display()
        ))
        .status();
    let out = exec("k0", "");
    assert_eq!(out.status.code(), Some(69), "{}", text(&out.stderr));
    assert_eq!(lines(&ran), 1);

    // With room again, but the reserve gone too when the disk fills, nothing can hold the
    // outcome: the caller is told (exit 70), never a plain success.
    fs::remove_file(tiny.path().join("k1")).unwrap();
    let out = exec("k2", &format!("rm -f '{}'/.reserve-*;", journal.display()));
    assert_eq!(out.status.code(), Some(70), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("recorded neither in the store nor in the journal"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(lines(&ran), 2);
}

/// A private `redis-server` on a free loopback port (never the shared 6379), with an fsynced
/// append-only file and no replica; killed by its pid when dropped.
struct LonePrimary {
    child: std::process::Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl LonePrimary {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("redis-server")
            .args([
                "--bind",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--save",
                "",
            ])
            .args(["--appendonly", "yes", "--appendfsync", "always", "--dir"])
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("failed to start redis-server (apt-get install redis-server)");
        let me = LonePrimary {
            child,
            port,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !me.answers_ping() {
            assert!(
                Instant::now() < deadline,
                "redis-server on {port} did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        me
    }

    fn answers_ping(&self) -> bool {
        use std::io::{Read, Write};
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let mut reply = [0u8; 7];
        s.write_all(b"PING\r\n").is_ok()
            && s.read_exact(&mut reply).is_ok()
            && &reply == b"+PONG\r\n"
    }
}

impl Drop for LonePrimary {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-9", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

#[test]
fn exec_against_a_redis_without_the_replicas_it_waits_for_runs_nothing() {
    let redis = LonePrimary::start();
    let sb = Sandbox::new();
    let ran = sb.path("ran");
    let store = format!(
        "redis://127.0.0.1:{}/0?wait_replicas=1&wait_timeout=200ms",
        redis.port
    );
    let script = format!("echo ran >> '{}'", ran.display());
    let out = sb
        .idemgate()
        .args([
            "--store", &store, "exec", "--key", "k", "--", "sh", "-c", &script,
        ])
        .output()
        .unwrap();
    // Before, `wait_replicas` was ignored: the command ran with its record on one server.
    assert_eq!(out.status.code(), Some(69), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("0 of 1 replicas"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(lines(&ran), 0, "nothing ran");
}

#[test]
fn key_reuse_with_another_command_is_refused() {
    let sb = Sandbox::new();
    let effect = sb.path("effect");
    sb.exec_append("k", &effect, &[]);
    let other = sb.run(&["exec", "--key", "k", "--", "echo", "something else"]);
    assert_eq!(other.status.code(), Some(65));
    assert!(text(&other.stderr).contains("different arguments"));
    assert_eq!(lines(&effect), 1);
}

#[test]
fn json_answers_say_what_happened() {
    let sb = Sandbox::new();
    let effect = sb.path("effect");
    let first = sb.exec_append("j", &effect, &["--tool", "mailer"]);
    assert!(first.status.success());
    let out = sb.run(&[
        "--json",
        "exec",
        "--key",
        "j",
        "--tool",
        "mailer",
        "--",
        "sh",
        "-c",
        &format!("echo ran >> '{}'; echo out; echo err >&2", effect.display()),
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["decision"], "replayed");
    assert_eq!(v["rule"], "explicit");
    assert_eq!(v["stdout"], "out\n");
    assert_eq!(v["exit_code"], 0);
    assert!(v["executed_at"].as_str().unwrap().ends_with('Z'));
    let listed = sb.run(&["--json", "keys", "list", "--tool", "mailer"]);
    let rows: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(rows.as_array().unwrap().len(), 1);
    assert_eq!(rows[0]["state"], "completed");
}

#[test]
fn not_applied_exit_code_frees_the_key() {
    let sb = Sandbox::new();
    let first = sb.run(&[
        "exec",
        "--key",
        "t",
        "--not-applied-exit-code",
        "75",
        "--",
        "sh",
        "-c",
        "exit 75",
    ]);
    assert_eq!(first.status.code(), Some(79), "declared not applied");
    let second = sb.run(&[
        "exec",
        "--key",
        "t",
        "--not-applied-exit-code",
        "75",
        "--",
        "sh",
        "-c",
        "exit 75",
    ]);
    assert_eq!(
        second.status.code(),
        Some(79),
        "ran again: nothing was stored"
    );
    let missing = sb.run(&["exec", "--key", "m", "--", "/no/such/program"]);
    assert_eq!(missing.status.code(), Some(127));
    assert!(text(&missing.stderr).contains("free again"));
}

#[test]
fn duplicate_gets_in_flight_answer_while_the_first_runs() {
    let sb = Sandbox::new();
    // The first run holds the key until the test opens the gate: no race against a sleep.
    let gate = sb.path("gate");
    let script = format!("while [ ! -e '{}' ]; do sleep 0.02; done", gate.display());
    let mut first = sb
        .idemgate()
        .args(["exec", "--key", "slow", "--", "sh", "-c", &script])
        .spawn()
        .unwrap();
    wait_for_state(&sb, "slow", "in_flight");
    let dup = sb.run(&[
        "exec", "--key", "slow", "--wait", "200ms", "--", "sh", "-c", &script,
    ]);
    assert_eq!(dup.status.code(), Some(75), "{}", text(&dup.stderr));
    assert!(text(&dup.stderr).contains("try again"));
    fs::write(&gate, b"").unwrap();
    assert!(first.wait().unwrap().success());
    let waited = sb.run(&["exec", "--key", "slow", "--", "sh", "-c", &script]);
    assert!(waited.status.success());
}

pub(crate) fn wait_for_state(sb: &Sandbox, key: &str, state: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = sb.run(&["--json", "keys", "show", key]);
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&out.stdout) {
            if v["state"] == state {
                return;
            }
        }
        assert!(Instant::now() < deadline, "{key} never reached {state}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The process running the command is killed with SIGKILL mid-command: later calls get an
/// outcome-unknown answer with its own exit code and a hint, never a second run, until resolved.
#[test]
fn sigkill_mid_command_leaves_unknown_never_a_second_run() {
    let sb = Sandbox::new();
    let effect = sb.path("effect");
    let pidfile = sb.path("command.pid");
    // The command records its pid and becomes `sleep`, so the test can stop the orphan it leaves
    // by that pid alone: /bin/kill from procps-ng 4.0.2 reads a negative (group) pid as -1, all
    // processes, so no group kill here.
    let script = format!(
        "echo $$ > '{}'; echo ran >> '{}'; exec sleep 30",
        pidfile.display(),
        effect.display()
    );
    let mut victim = sb
        .idemgate()
        .args([
            "exec", "--key", "pay-7", "--lease", "1s", "--", "sh", "-c", &script,
        ])
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while lines(&effect) == 0 {
        assert!(Instant::now() < deadline, "the command never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    let status = Command::new("kill")
        .args(["-KILL", &victim.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    victim.wait().unwrap();
    // The orphaned `sleep` is this test's to clean up, by its own pid, and only while that pid
    // still runs our `sleep 30`.
    if let Ok(pid) = fs::read_to_string(&pidfile) {
        let pid = pid.trim();
        let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if cmdline.starts_with(b"sleep\0") && pid.parse::<u32>().is_ok() {
            let _ = Command::new("kill").args(["-KILL", pid]).status();
        }
    }

    let dup = sb.run(&[
        "exec", "--key", "pay-7", "--lease", "1s", "--wait", "5s", "--", "sh", "-c", &script,
    ]);
    assert_eq!(dup.status.code(), Some(76), "{}", text(&dup.stderr));
    let msg = text(&dup.stderr);
    assert!(
        msg.contains("unknown") && msg.contains("idemgate keys resolve pay-7"),
        "{msg}"
    );
    assert_eq!(lines(&effect), 1, "never silently re-run");

    let listed = sb.run(&["--json", "keys", "list", "--state", "unknown"]);
    let rows: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(rows.as_array().unwrap().len(), 1);
    let fence = rows[0]["fence"].as_u64().unwrap().to_string();

    // What the operator needs to decide: why it is unknown, and the key to search downstream.
    let shown = sb.run(&["keys", "show", "pay-7"]);
    let page = text(&shown.stdout);
    assert!(
        page.contains("reason:       no reason is on record: most likely the lease ended")
            && page.contains("downstream:   "),
        "{page}"
    );

    let wrong = sb.run(&["keys", "resolve", "pay-7", "--fence", "99", "--release"]);
    assert_eq!(wrong.status.code(), Some(1));
    let resolved = sb
        .idemgate()
        .env("USER", "ops-alice")
        .args([
            "keys",
            "resolve",
            "pay-7",
            "--fence",
            &fence,
            "--completed",
            "--exit-code",
            "0",
            "--stdout",
            "paid by hand\n",
            "--reason",
            "the ledger shows it",
        ])
        .output()
        .unwrap();
    assert!(resolved.status.success(), "{}", text(&resolved.stderr));
    let shown = sb.run(&["keys", "show", "pay-7"]);
    let page = text(&shown.stdout);
    assert!(
        page.contains("resolved as completed by ops-alice: the ledger shows it"),
        "{page}"
    );
    let replay = sb.run(&["exec", "-q", "--key", "pay-7", "--", "sh", "-c", &script]);
    assert!(replay.status.success());
    assert_eq!(text(&replay.stdout), "paid by hand\n");
    assert_eq!(lines(&effect), 1);
}

/// The default store and its journal hold results: created for their owner only (0700
/// directories, 0600 files, the database's log and shared memory included).
#[cfg(unix)]
#[test]
fn the_default_store_and_its_journal_are_private_to_their_owner() {
    use std::os::unix::fs::PermissionsExt as _;
    let sb = Sandbox::new();
    let out = sb
        .idemgate()
        .env_remove("IDEMGATE_STORE")
        .args(["exec", "--key", "private-1", "--", "true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let data = sb.path("data").join("idemgate");
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&data), 0o700, "{}", data.display());
    let mut seen = 0;
    for entry in walk(&data) {
        let want = if entry.is_dir() { 0o700 } else { 0o600 };
        assert_eq!(mode(&entry), want, "{}", entry.display());
        seen += 1;
    }
    assert!(
        seen >= 3,
        "the database, its log and the journal: {:?}",
        walk(&data)
    );
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out
}

/// A retry after --ttl is not run again: exit 80, and stderr says when the command ran and how to
/// run it again (a new key, or `keys reopen` at the fence it names); `keys show` and `keys list
/// --state expired` show the tombstone; reopening it runs the command again; `--tombstone 0s`
/// keeps none.
#[test]
fn a_retry_after_the_ttl_exits_expired_until_reopened() {
    let sb = Sandbox::new();
    let effect = sb.path("effect");
    let short = ["--ttl", "300ms"];
    assert!(sb.exec_append("late-1", &effect, &short).status.success());
    std::thread::sleep(std::time::Duration::from_millis(700));
    let late = sb.exec_append("late-1", &effect, &short);
    assert_eq!(late.status.code(), Some(80), "{}", text(&late.stderr));
    assert_eq!(lines(&effect), 1, "not run again");
    let said = text(&late.stderr);
    assert!(
        said.contains("already ran at") && said.contains("not run now"),
        "{said}"
    );
    assert!(said.contains("run it again with a new --key"), "{said}");
    let reopen_at = said
        .split("idemgate keys reopen late-1 --tool exec --tenant ")
        .nth(1)
        .and_then(|rest| rest.split("--fence ").nth(1))
        .and_then(|rest| rest.split(' ').next())
        .unwrap_or_else(|| panic!("names the reopening: {said}"))
        .to_owned();

    let shown = text(&sb.run(&["keys", "show", "late-1"]).stdout);
    assert!(
        shown.contains("state:        expired") && shown.contains("remembered:   until"),
        "{shown}"
    );
    let listed = text(&sb.run(&["keys", "list", "--state", "expired"]).stdout);
    assert!(listed.contains("late-1"), "{listed}");

    let reopened = sb.run(&[
        "keys",
        "reopen",
        "late-1",
        "--fence",
        &reopen_at,
        "--reason",
        "the customer asked again",
    ]);
    assert!(reopened.status.success(), "{}", text(&reopened.stderr));
    assert!(sb.exec_append("late-1", &effect, &short).status.success());
    assert_eq!(lines(&effect), 2, "reopened: the command ran again");

    let none = ["--ttl", "300ms", "--tombstone", "0s"];
    assert!(sb.exec_append("late-2", &effect, &none).status.success());
    std::thread::sleep(std::time::Duration::from_millis(700));
    assert!(sb.exec_append("late-2", &effect, &none).status.success());
    assert_eq!(
        lines(&effect),
        4,
        "no tombstone: a new action after the ttl"
    );
}

/// `keys reopen` makes a completed record's command run again at the next call, only at the fence
/// the operator looked at; its help says what it does and how soon other processes follow.
#[test]
fn keys_reopen_runs_a_completed_command_again() {
    let sb = Sandbox::new();
    let effect = sb.path("effect");
    assert!(sb.exec_append("r-1", &effect, &[]).status.success());
    assert!(sb.exec_append("r-1", &effect, &[]).status.success());
    assert_eq!(lines(&effect), 1, "a replay");
    let shown = sb.run(&["keys", "show", "r-1"]);
    assert!(
        text(&shown.stdout).contains("reopen with:  idemgate keys reopen r-1 --tool"),
        "{}",
        text(&shown.stdout)
    );
    let shown: serde_json::Value =
        serde_json::from_slice(&sb.run(&["--json", "keys", "show", "r-1"]).stdout).unwrap();
    let fence = shown["fence"].as_u64().unwrap().to_string();

    let wrong = sb.run(&["keys", "reopen", "r-1", "--fence", "99", "--reason", "redo"]);
    assert_eq!(wrong.status.code(), Some(1));
    assert!(
        text(&wrong.stderr)
            .contains("only a completed or unknown record at the fence you looked at"),
        "{}",
        text(&wrong.stderr)
    );
    let no_reason = sb.run(&["keys", "reopen", "r-1", "--fence", &fence]);
    assert_eq!(no_reason.status.code(), Some(2), "--reason is required");
    assert!(sb.exec_append("r-1", &effect, &[]).status.success());
    assert_eq!(lines(&effect), 1, "nothing reopened yet");

    let reopened = sb.run(&[
        "--json",
        "keys",
        "reopen",
        "r-1",
        "--fence",
        &fence,
        "--reason",
        "the mail bounced",
    ]);
    assert!(reopened.status.success(), "{}", text(&reopened.stderr));
    let said: serde_json::Value = serde_json::from_slice(&reopened.stdout).unwrap();
    assert_eq!(said["reopened"], true);
    assert_eq!(said["was"], "completed");
    assert!(sb.exec_append("r-1", &effect, &[]).status.success());
    assert_eq!(lines(&effect), 2, "the command ran again");
    assert!(sb.exec_append("r-1", &effect, &[]).status.success());
    assert_eq!(lines(&effect), 2, "and is replayed again");
    let again = sb.run(&[
        "keys", "reopen", "r-1", "--fence", &fence, "--reason", "twice",
    ]);
    assert_eq!(
        again.status.code(),
        Some(1),
        "a retried reopening leaves the new record alone"
    );

    let help = text(&sb.run(&["keys", "reopen", "--help"]).stdout);
    let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
    for said in [
        "runs the action again",
        "fence you looked at",
        "in flight is never reopened",
        "up to 2 seconds",
        "audit log",
    ] {
        assert!(help.contains(said), "{said:?} not in {help}");
    }
}

/// `keys list --scope` lists the records made in one scope (`exec` names none).
#[test]
fn keys_list_filters_by_scope() {
    let sb = Sandbox::new();
    assert!(sb
        .exec_append("s-1", &sb.path("effect"), &[])
        .status
        .success());
    let all = sb.run(&["--json", "keys", "list"]);
    let all: serde_json::Value = serde_json::from_slice(&all.stdout).unwrap();
    assert_eq!(all.as_array().unwrap().len(), 1);
    assert!(all[0].get("scope").is_none(), "{all}");
    let scoped = sb.run(&["--json", "keys", "list", "--scope", "conversation:1"]);
    assert!(scoped.status.success(), "{}", text(&scoped.stderr));
    assert_eq!(text(&scoped.stdout).trim(), "[]");
}

/// `keys list` keeps its columns in line when a tool's name is longer than the column's usual
/// width (an MCP tool's `server/tool` names often are): every row's fence (right-aligned) ends
/// where the header's FENCE does.
#[test]
fn keys_list_keeps_its_columns_in_line_for_long_tool_names() {
    let sb = Sandbox::new();
    let effect = sb.path("effect");
    for (key, tool) in [("k-1", "exec"), ("k-2", "server-memory/create_entities")] {
        let out = sb.exec_append(key, &effect, &["--tool", tool]);
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let listed = text(&sb.run(&["keys", "list"]).stdout);
    let lines: Vec<&str> = listed.lines().collect();
    let column = |line: &str| line.find(" 1  ").map(|i| i + 2);
    let header = lines[0].find("FENCE").unwrap() + "FENCE".len();
    assert_eq!(lines.len(), 3, "{listed}");
    for row in &lines[1..] {
        assert_eq!(column(row), Some(header), "out of line:\n{listed}");
    }
}

/// 16 processes fire the same key at once, for 200 keys: the command runs exactly once per key
/// and every process gets its outcome.
#[test]
fn sixteen_processes_per_key_run_the_command_exactly_once() {
    let _heavy = crate::heavy();
    let sb = Sandbox::new();
    // Create the database before the storm, as a deployed tool would have.
    assert!(sb.run(&["keys", "list"]).status.success());
    let keys = 200;
    for k in 0..keys {
        let effect = sb.path(&format!("effect-{k}"));
        let script = format!("echo ran >> '{}'; echo result-{k}", effect.display());
        let key = format!("storm-{k}");
        let children: Vec<_> = (0..16)
            .map(|_| {
                sb.idemgate()
                    .args([
                        "exec", "-q", "--key", &key, "--wait", "30s", "--", "sh", "-c", &script,
                    ])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for child in children {
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "key {k}: {:?} {}",
                out.status,
                text(&out.stderr)
            );
            assert_eq!(text(&out.stdout), format!("result-{k}\n"));
        }
        assert_eq!(lines(&effect), 1, "key {k} ran {} times", lines(&effect));
    }
}

#[test]
fn help_teaches_and_bad_input_says_what_to_do() {
    let sb = Sandbox::new();
    let help = sb.run(&["exec", "--help"]);
    let h = text(&help.stdout);
    assert!(
        h.contains("--key") && h.contains("--not-applied-exit-code"),
        "{h}"
    );
    let top = sb.run(&["--help"]);
    assert!(text(&top.stdout).contains("Examples:"));
    let bad = sb.run(&["exec", "--key", "has space", "--", "true"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        text(&bad.stderr).contains("position 3"),
        "{}",
        text(&bad.stderr)
    );
    let bad_store = sb
        .idemgate()
        .args(["--store", "mongodb://x", "keys", "list"])
        .output()
        .unwrap();
    assert!(
        text(&bad_store.stderr).contains("sqlite://"),
        "{}",
        text(&bad_store.stderr)
    );
    let derived = sb.run(&["key", "derive", "--run", "r", "--step", "1"]);
    assert_eq!(
        derived.stdout,
        sb.run(&["key", "derive", "--run", "r", "--step", "1"])
            .stdout
    );
    // `--run "$RUN_ID"` with the variable unset: refused, not one key shared by every run.
    for (run, step, says) in [("", "1", "run id is empty"), ("r", " ", "step is empty")] {
        let refused = sb
            .idemgate()
            .args(["key", "derive", "--run", run, "--step", step])
            .output()
            .unwrap();
        assert_ne!(refused.status.code(), Some(0), "{run:?} {step:?}");
        assert!(refused.stdout.is_empty(), "{}", text(&refused.stdout));
        assert!(
            text(&refused.stderr).contains(says),
            "{}",
            text(&refused.stderr)
        );
    }
}

#[test]
fn token_commands_make_and_hash_tokens() {
    let sb = Sandbox::new();
    let hash = sb.run(&["token", "hash", "test"]);
    assert_eq!(
        text(&hash.stdout),
        "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\n"
    );
    let new = text(&sb.run(&["token", "new"]).stdout);
    let lines: Vec<&str> = new.lines().collect();
    assert_eq!(lines.len(), 2, "{new}");
    assert!(lines[0].starts_with("igt_"));
    let rehashed = sb.run(&["token", "hash", lines[0]]);
    assert_eq!(text(&rehashed.stdout).trim(), lines[1]);
}

#[test]
fn serve_refuses_to_start_without_a_tenant() {
    let sb = Sandbox::new();
    let out = sb
        .idemgate()
        .env_remove("IDEMGATE_TOKEN")
        .args(["serve", "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("IDEMGATE_TOKEN"),
        "{}",
        text(&out.stderr)
    );
    let short = sb
        .idemgate()
        .env("IDEMGATE_TOKEN", "short")
        .args(["serve", "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert_eq!(short.status.code(), Some(1));
    let help = text(&sb.run(&["serve", "--help"]).stdout);
    assert!(
        help.contains("--token-env") && help.contains("never starts without a tenant"),
        "{help}"
    );
    assert!(
        help.contains("profile = \"acp\", \"ucp\" or \"x402\""),
        "{help}"
    );
    let mcp = text(&sb.run(&["mcp", "--help"]).stdout);
    assert!(mcp.contains("Commerce protocol bindings"), "{mcp}");
}

#[test]
fn serve_answers_and_stops_cleanly_on_sigterm() {
    let sb = Sandbox::new();
    let token = "test-token-0123456789abcdef";
    let mut serve = sb.idemgate();
    serve.env("IDEMGATE_TOKEN", token);
    let (mut child, addr) = serve_on_a_free_port(serve);
    let request = |req: String| http(&addr, &req);
    let begin = request(format!(
        "POST /v1/tools/t/begin HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\
         Idempotency-Key: k\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}"
    ));
    assert!(begin.starts_with("HTTP/1.1 201"), "{begin}");
    let unauthorized =
        request("GET /v1/records HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_owned());
    assert!(unauthorized.starts_with("HTTP/1.1 401"), "{unauthorized}");
    // The gateway's records are the CLI's: same default store, tenant "default".
    let listed = sb.run(&[
        "--tenant", "default", "keys", "list", "--tool", "t", "--json",
    ]);
    assert!(
        text(&listed.stdout).contains("in_flight"),
        "{}",
        text(&listed.stdout)
    );
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "serve did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
}

#[test]
fn exec_and_keys_work_on_a_redis_cluster() {
    // A private three-master cluster on free loopback ports, stopped by pid when dropped.
    let cluster = crate::cluster_support::PrivateCluster::start(&[]);
    let sb = Sandbox::new();
    let ran = sb.path("ran");
    let store = format!("{}?key_prefix=cli-cluster:", cluster.url());
    let script = format!("echo ran >> '{}'; echo hello", ran.display());
    let exec = |key: &str| {
        sb.idemgate()
            .args([
                "--store", &store, "exec", "--key", key, "--", "sh", "-c", &script,
            ])
            .output()
            .unwrap()
    };
    for key in ["a", "b", "c", "d", "e", "f"] {
        let first = exec(key);
        assert_eq!(first.status.code(), Some(0), "{}", text(&first.stderr));
        assert_eq!(text(&first.stdout), "hello\n");
    }
    let again = exec("a");
    assert_eq!(again.status.code(), Some(0), "{}", text(&again.stderr));
    assert!(
        text(&again.stderr).contains("replayed"),
        "{}",
        text(&again.stderr)
    );
    assert_eq!(lines(&ran), 6, "each key ran once");
    // Listing gathers the records from every master.
    let list = sb
        .idemgate()
        .args(["--store", &store, "--json", "keys", "list"])
        .output()
        .unwrap();
    assert_eq!(list.status.code(), Some(0), "{}", text(&list.stderr));
    let listed = text(&list.stdout);
    for key in ["a", "b", "c", "d", "e", "f"] {
        assert!(
            listed.contains(&format!("\"key\":\"{key}\"")),
            "{key} missing from {listed}"
        );
    }
}

/// The value of `name="NAME" value="..."` in a page.
fn form_value(page: &str, name: &str) -> String {
    let marker = format!(r#"name="{name}" value=""#);
    let at = page
        .find(&marker)
        .unwrap_or_else(|| panic!("no {name} in {page}"))
        + marker.len();
    page[at..at + page[at..].find('"').unwrap()].to_owned()
}

/// The "name=value" of the cookie `name` a raw answer sets.
fn set_cookie(answer: &str, name: &str) -> String {
    answer
        .lines()
        .filter_map(|l| l.strip_prefix("set-cookie: "))
        .find(|c| c.starts_with(&format!("{name}=")))
        .map(|c| c.split(';').next().unwrap().to_owned())
        .unwrap_or_else(|| panic!("no cookie {name} in {answer}"))
}

#[test]
fn console_serves_the_operator_over_a_store_without_a_gateway() {
    let sb = Sandbox::new();
    let refused = sb
        .idemgate()
        .env_remove("IDEMGATE_OPERATOR_TOKEN")
        .args(["console", "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(1));
    assert!(text(&refused.stderr).contains("IDEMGATE_OPERATOR_TOKEN"));

    let effect = sb.path("effect");
    let out = sb.exec_append("order-1", &effect, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let token = "operator-token-0123456789abcdef";
    let audit = sb.path("audit.jsonl");
    let mut child = sb
        .idemgate()
        .env("IDEMGATE_OPERATOR_TOKEN", token)
        .args(["console", "--listen", "127.0.0.1:0", "--audit-log"])
        .arg(&audit)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let announced = announced(&mut child, "idemgate: console on http://");
    let addr = announced
        .strip_suffix("/ui")
        .unwrap_or_else(|| panic!("the console's address {announced:?} does not end in /ui"))
        .to_owned();
    let get = |path: &str, cookie: &str| {
        http(
            &addr,
            &format!(
                "GET {path} HTTP/1.1\r\nHost: x\r\nCookie: {cookie}\r\nConnection: close\r\n\r\n"
            ),
        )
    };
    let post = |path: &str, cookie: &str, body: &str| {
        http(
            &addr,
            &format!(
                "POST {path} HTTP/1.1\r\nHost: x\r\nCookie: {cookie}\r\n\
                 Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{body}",
                body.len()
            ),
        )
    };
    let login = get("/ui/login", "");
    let csrf = form_value(&login, "csrf");
    let answer = post(
        "/ui/login",
        &set_cookie(&login, "idemgate_console_login"),
        &format!("csrf={csrf}&token={token}"),
    );
    assert!(answer.starts_with("HTTP/1.1 303"), "{answer}");
    let session = set_cookie(&answer, "idemgate_console");
    // exec's record, under its tenant "local".
    let list = get("/ui", &session);
    assert!(list.contains("order-1") && list.contains("local"), "{list}");
    let csrf = form_value(&list, "csrf");
    let confirm = get("/ui/reopen?tenant=local&tool=exec&key=order-1", &session);
    let fence = form_value(&confirm, "fence");
    let answer = post(
        "/ui/reopen",
        &session,
        &format!(
            "csrf={csrf}&tenant=local&tool=exec&key=order-1&fence={fence}&reason=run+it+again"
        ),
    );
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let log = fs::read_to_string(&audit).unwrap();
    assert!(
        log.contains(r#""event":"reopened""#) && log.contains(r#""by":"console:operator""#),
        "{log}"
    );
    // The next exec with the key runs again.
    let again = sb.exec_append("order-1", &effect, &[]);
    assert_eq!(again.status.code(), Some(0), "{}", text(&again.stderr));
    assert_eq!(lines(&effect), 2);
    // Another process, another door, the same trail: the console's reopening is in the store's
    // history of the record the next exec made, named and with its reason.
    let shown = sb.run(&["--json", "keys", "show", "order-1"]);
    assert!(shown.status.success(), "{}", text(&shown.stderr));
    let view: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    let steps = view["history"].as_array().unwrap();
    let reopened = steps
        .iter()
        .find(|s| s["what"] == "reopened")
        .unwrap_or_else(|| panic!("no reopening in {view}"));
    assert_eq!(reopened["by"], "console:operator", "{view}");
    assert_eq!(reopened["reason"], "run it again", "{view}");
    assert_eq!(steps.last().unwrap()["what"], "completed", "{view}");
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            assert_eq!(s.code(), Some(0));
            break;
        }
        assert!(Instant::now() < deadline, "console did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `keys list` a page at a time: a page tells on stderr the command for the next page (this one
/// with `--cursor`), which run as printed reaches every record once; `--all` streams every page
/// as one JSON array; `--key-prefix` narrows to keys starting with it.
#[test]
fn keys_list_pages_through_every_record() {
    let sb = Sandbox::new();
    let keys: Vec<String> = (0..5).map(|i| format!("page-{i}")).collect();
    for k in &keys {
        assert!(sb.run(&["exec", "--key", k, "--", "true"]).status.success());
    }
    assert!(sb
        .run(&["exec", "--key", "other-1", "--", "true"])
        .status
        .success());
    let listed_keys = |out: &Output| -> Vec<String> {
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)));
        doc.as_array()
            .unwrap()
            .iter()
            .map(|r| r["key"]["key"].as_str().unwrap().to_owned())
            .collect()
    };
    let mut args: Vec<String> = [
        "--json",
        "keys",
        "list",
        "--key-prefix",
        "page-",
        "--limit",
        "2",
    ]
    .map(String::from)
    .to_vec();
    let mut seen = Vec::new();
    for page in 0.. {
        assert!(page < 5, "the pages never end");
        let out = sb.run(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(out.status.success(), "{}", text(&out.stderr));
        let got = listed_keys(&out);
        assert!(got.len() <= 2);
        seen.extend(got);
        let err = text(&out.stderr);
        let Some(at) = err.find("the next page: idemgate ") else {
            break;
        };
        // The printed command, run as printed (its words have no quotes to undo here).
        let line = err[at + "the next page: idemgate ".len()..]
            .lines()
            .next()
            .unwrap();
        assert!(line.contains("--key-prefix page-"), "{line}");
        args = line.split(' ').map(String::from).collect();
    }
    let mut sorted = seen.clone();
    sorted.sort();
    assert_eq!(sorted, keys, "every record once: {seen:?}");

    let all = sb.run(&["--json", "keys", "list", "--all", "--limit", "2"]);
    assert!(all.status.success());
    let everything = listed_keys(&all);
    assert_eq!(everything.len(), 6, "{everything:?}");
    assert!(!text(&all.stderr).contains("next page"));
    assert_eq!(
        &everything
            .iter()
            .filter(|k| k.starts_with("page-"))
            .cloned()
            .collect::<Vec<_>>(),
        &seen,
        "--all lists in the pages' order"
    );
    let bad = sb.run(&["keys", "list", "--cursor", "nonsense"]);
    assert!(!bad.status.success());
    assert!(
        text(&bad.stderr).contains("--cursor"),
        "{}",
        text(&bad.stderr)
    );
}

/// Resolutions and reopenings made at the command line (`keys resolve`, `keys reopen` given the
/// audit log) are counted by how and through the CLI on the console's "what idemgate saved".
#[test]
fn the_console_counts_resolutions_made_at_the_command_line() {
    let sb = Sandbox::new();
    let audit = sb.path("audit.jsonl");
    let audit_arg = audit.to_str().unwrap();
    for key in ["pay-1", "pay-2"] {
        let killed = sb.run(&["exec", "--key", key, "--", "sh", "-c", "kill -9 $$"]);
        assert_eq!(killed.status.code(), Some(76), "{}", text(&killed.stderr));
    }
    // Signed with the OS user, as a shell's `USER` names it (a line without one cannot say
    // which door it came through, and the console counts it as unsigned).
    let as_alice = |args: &[&str]| {
        sb.idemgate()
            .env("USER", "alice")
            .args(args)
            .output()
            .unwrap()
    };
    let completed = as_alice(&[
        "keys",
        "resolve",
        "pay-1",
        "--completed",
        "--reason",
        "seen",
        "--audit-log",
        audit_arg,
    ]);
    assert!(completed.status.success(), "{}", text(&completed.stderr));
    let released = as_alice(&[
        "keys",
        "resolve",
        "pay-2",
        "--release",
        "--reason",
        "not sent",
        "--audit-log",
        audit_arg,
    ]);
    assert!(released.status.success(), "{}", text(&released.stderr));
    let shown = sb.run(&["--json", "keys", "show", "pay-1"]);
    let fence = serde_json::from_slice::<serde_json::Value>(&shown.stdout).unwrap()["fence"]
        .as_u64()
        .unwrap()
        .to_string();
    let reopened = as_alice(&[
        "keys",
        "reopen",
        "pay-1",
        "--fence",
        &fence,
        "--reason",
        "refunded",
        "--audit-log",
        audit_arg,
    ]);
    assert!(reopened.status.success(), "{}", text(&reopened.stderr));

    let token = "operator-token-0123456789abcdef";
    let mut child = sb
        .idemgate()
        .env("IDEMGATE_OPERATOR_TOKEN", token)
        .args([
            "console",
            "--listen",
            "127.0.0.1:0",
            "--audit-log",
            audit_arg,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let announced = announced(&mut child, "idemgate: console on http://");
    let addr = announced.strip_suffix("/ui").unwrap().to_owned();
    let login = http(
        &addr,
        "GET /ui/login HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    let body = format!("csrf={}&token={token}", form_value(&login, "csrf"));
    let answer = http(
        &addr,
        &format!(
            "POST /ui/login HTTP/1.1\r\nHost: x\r\nCookie: {}\r\n\
             Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            set_cookie(&login, "idemgate_console_login"),
            body.len()
        ),
    );
    let session = set_cookie(&answer, "idemgate_console");
    let page = http(
        &addr,
        &format!(
            "GET /ui/charts HTTP/1.1\r\nHost: x\r\nCookie: {session}\r\nConnection: close\r\n\r\n"
        ),
    );
    for row in [
        "<tr><td>local</td><td>exec</td><td>completed</td><td>CLI</td><td>1</td></tr>",
        "<tr><td>local</td><td>exec</td><td>released</td><td>CLI</td><td>1</td></tr>",
        "<tr><td>local</td><td>exec</td><td>reopened</td><td>CLI</td><td>1</td></tr>",
    ] {
        assert!(page.contains(row), "missing {row} in:\n{page}");
    }
    // Stopped by its own pid, as the test above stops its console.
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    child.wait().unwrap();
}

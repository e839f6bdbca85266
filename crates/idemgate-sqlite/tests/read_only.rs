//! A store started while its database, its log (`-wal`) and its shared memory (`-shm`) were all
//! read-only (0444) refuses writes (and answers reads), and once an operator makes them writable
//! again (0644) it writes, and reads what it and other processes write, without a restart.
//!
//! Permission bits do not bind root, and CI runs as root. The store therefore runs in child
//! processes of this test binary which, when the test runs as root, start as the unprivileged
//! user and group 65534 (`nobody`): `Command::uid` and `gid` switch before `exec` and clear the
//! supplementary groups, and a process that leaves uid 0 loses its capabilities
//! (`CAP_DAC_OVERRIDE` included), so the kernel checks the permission bits for it as for a
//! gateway run by a user who may not write the files. Each child first checks that a 0444 file
//! really refuses it, so the test cannot pass by being allowed to write. Run by another user, the
//! children run as that user, whom the bits already bind.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use idemgate_core::{
    Claim, Fingerprint, IdempotencyKey, Key, ListFilter, Reservation, State, Store, StoreError,
    TenantId, ToolName,
};
use idemgate_sqlite::{SqliteOptions, SqliteStore};

/// The child's part: `crash`, `serve` or `write` (unset: this is the parent, and the helper test
/// below does nothing).
const ROLE: &str = "IDEMGATE_SQLITE_READ_ONLY_ROLE";
/// The database file the child opens.
const DB: &str = "IDEMGATE_SQLITE_READ_ONLY_DB";
/// The unprivileged user and group the children run as when the test runs as root.
const NOBODY: u32 = 65534;
/// How long the parent waits for a child's next line: far longer than any step takes.
const STEP: Duration = Duration::from_secs(120);

#[test]
fn a_store_started_on_read_only_files_reads_and_writes_once_they_are_writable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idemgate.db");
    let log_and_index = [
        dir.path().join("idemgate.db-wal"),
        dir.path().join("idemgate.db-shm"),
    ];
    let children = if bits_bind(dir.path()) {
        Children {
            exe: std::env::current_exe().unwrap(),
            uid: None,
        }
    } else {
        // Root: the children run as nobody, who must be able to use the directory, and to run
        // this binary, wherever the checkout is: a copy of it in that directory.
        std::os::unix::fs::chown(dir.path(), Some(NOBODY), Some(NOBODY)).unwrap();
        let exe = dir.path().join("read_only-child");
        std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
        set_mode(&exe, 0o755);
        Children {
            exe,
            uid: Some(NOBODY),
        }
    };

    // A gateway that stopped without closing the store (killed, or its machine halted) leaves
    // the log and the shared memory behind; somebody makes all three files read-only.
    let status = child("crash", &path, &children)
        .stdout(Stdio::null())
        .status()
        .expect("run the crashing child");
    assert!(status.success(), "the crashing child failed: {status}");
    for file in log_and_index.iter().chain([&path]) {
        assert!(file.exists(), "{} was not left behind", file.display());
        set_mode(file, 0o444);
    }

    // The gateway starts on them: it reads and refuses writes.
    let mut serve = Running::start(child("serve", &path, &children));
    serve.expect("DENIED");
    // The operator fixes one file at a time: a write between the two still fails, and the
    // store must not keep the connection it opened then, which cannot write although SQLite
    // does not call it read-only (the database file is writable; its log is not).
    set_mode(&path, 0o644);
    serve.tell("DATABASE_WRITABLE");
    serve.expect("STILL_DENIED");
    for file in &log_and_index {
        set_mode(file, 0o644);
    }
    serve.tell("WRITABLE");
    serve.expect("RECOVERED");
    // Another process writes; the one that started read-only must read that.
    let status = child("write", &path, &children)
        .stdout(Stdio::null())
        .status()
        .expect("run the writing child");
    assert!(status.success(), "the writing child failed: {status}");
    serve.tell("WRITTEN");
    serve.expect("READ");
    serve.finish();
}

/// The children's side; does nothing in the parent.
#[test]
fn child_process_role() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let path = PathBuf::from(std::env::var(DB).unwrap());
    assert!(
        bits_bind(path.parent().unwrap()),
        "the child may write a read-only file: it is privileged, and this test would prove nothing"
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        match role.as_str() {
            "crash" => crash(&path).await,
            "serve" => serve(&path).await,
            "write" => {
                let store = SqliteStore::open(&path, SqliteOptions::default()).unwrap();
                acquire(&store, "other").await;
            }
            other => panic!("unknown role {other}"),
        }
    });
}

async fn crash(path: &Path) {
    let store = SqliteStore::open(path, SqliteOptions::default()).unwrap();
    acquire(&store, "kept").await;
    // Out without closing anything, as a killed process: the log and shared memory stay.
    std::process::exit(0);
}

async fn serve(path: &Path) {
    let store = SqliteStore::open(path, SqliteOptions::default())
        .expect("a store on read-only files opens, to answer reads and refuse writes");
    let mut stdin = std::io::stdin().lock().lines();
    let mut wait_for = |word: &str| {
        let line = stdin.next().expect("the parent went away").unwrap();
        assert_eq!(line, word);
    };

    assert_eq!(state(&store, "kept").await, Some(State::InFlight));
    let e = reserve(&store, "new").await.unwrap_err();
    assert!(matches!(e, StoreError::Unavailable(_)), "{e}");
    let e = store.probe_write().await.unwrap_err();
    assert!(matches!(e, StoreError::Unavailable(_)), "{e}");
    say("DENIED");

    wait_for("DATABASE_WRITABLE");
    let e = store.probe_write().await.unwrap_err();
    assert!(matches!(e, StoreError::Unavailable(_)), "{e}");
    say("STILL_DENIED");

    wait_for("WRITABLE");
    store
        .probe_write()
        .await
        .expect("the files are writable again: /readyz says ready");
    acquire(&store, "new").await;
    assert_eq!(state(&store, "new").await, Some(State::InFlight));
    say("RECOVERED");

    wait_for("WRITTEN");
    assert_eq!(
        state(&store, "other").await,
        Some(State::InFlight),
        "a write of another process is read"
    );
    let mut names: Vec<String> = store
        .list(&ListFilter::default())
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.key.key.as_str().to_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["kept", "new", "other"]);
    // And this process still writes after the other one did.
    acquire(&store, "last").await;
    say("READ");
}

fn key(name: &str) -> Key {
    Key::new(
        TenantId::new("acme").unwrap(),
        ToolName::new("send_invoice").unwrap(),
        IdempotencyKey::new(name).unwrap(),
    )
}

async fn reserve(store: &SqliteStore, name: &str) -> Result<Claim, StoreError> {
    let r = Reservation::new(
        key(name),
        Fingerprint::of_bytes(b"args"),
        Duration::from_secs(600),
    );
    store.reserve(&r).await
}

async fn acquire(store: &SqliteStore, name: &str) {
    match reserve(store, name).await {
        Ok(Claim::Acquired(_)) => {}
        other => panic!("expected to acquire {name}, got {other:?}"),
    }
}

async fn state(store: &SqliteStore, name: &str) -> Option<State> {
    store.get(&key(name)).await.unwrap().map(|r| r.state_name())
}

fn say(word: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{word}").unwrap();
    out.flush().unwrap();
}

/// Whether this process is refused a file that is read-only (0444) to everybody.
fn bits_bind(dir: &Path) -> bool {
    let probe = dir.join(format!("probe-{}", std::process::id()));
    std::fs::write(&probe, b"").unwrap();
    set_mode(&probe, 0o444);
    let refused = std::fs::OpenOptions::new()
        .write(true)
        .open(&probe)
        .is_err();
    std::fs::remove_file(&probe).unwrap();
    refused
}

fn set_mode(file: &Path, mode: u32) {
    std::fs::set_permissions(file, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {mode:o} {}: {e}", file.display()));
}

/// How the children run: which copy of this test binary, as which user.
struct Children {
    exe: PathBuf,
    uid: Option<u32>,
}

/// This test binary, running only the child's helper test in `role`.
fn child(role: &str, path: &Path, how: &Children) -> Command {
    let mut cmd = Command::new(&how.exe);
    cmd.args(["child_process_role", "--exact", "--nocapture", "--quiet"])
        .env(ROLE, role)
        .env(DB, path)
        .stderr(Stdio::inherit());
    if let Some(uid) = how.uid {
        // Also clears the supplementary groups, root's among them.
        cmd.uid(uid).gid(uid);
    }
    cmd
}

/// A child that talks to the parent in lines.
struct Running {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl Running {
    fn start(mut cmd: Command) -> Running {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the child");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Running {
            child,
            stdin,
            lines,
        }
    }

    /// Waits for `word` on a line of its own (libtest writes lines of its own around it).
    fn expect(&mut self, word: &str) {
        loop {
            match self.lines.recv_timeout(STEP) {
                Ok(line) if line == word => return,
                Ok(_) => {}
                Err(e) => {
                    let status = self.child.try_wait();
                    let _ = self.child.kill();
                    panic!("the child did not say {word} ({e}; its status: {status:?})");
                }
            }
        }
    }

    fn tell(&mut self, word: &str) {
        writeln!(self.stdin, "{word}").unwrap();
        self.stdin.flush().unwrap();
    }

    fn finish(mut self) {
        let status = self.child.wait().unwrap();
        assert!(status.success(), "the serving child failed: {status}");
    }
}

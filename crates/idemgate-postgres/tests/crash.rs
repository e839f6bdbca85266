//! A private Postgres instance is killed with SIGKILL in the middle of a stream of engine calls
//! and restarted on the same data directory: no acknowledged completion is lost, no key runs twice,
//! and the store serves again within seconds.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idemgate_core::engine::Settings;
use idemgate_core::{
    Call, Decision, Effect, Engine, EngineError, IdempotencyKey, Key, Policies, RecordState,
    Recording, Store, TenantId, ToolName, ToolPolicy,
};
use idemgate_postgres::{PgOptions, PgStore};

/// A Postgres instance of our own, in a temporary directory, run as the `postgres` OS user
/// (Postgres refuses to run as root). Dropping it kills it.
struct PrivatePg {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    launchers: Vec<Child>,
}

fn bin_dir() -> PathBuf {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|p| p.join("initdb").exists())
        .collect();
    found.sort();
    // Newest major version; else rely on PATH.
    found.pop().unwrap_or_default()
}

fn run(cmd: &mut Command, what: &str) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("failed to {what}: {e}"));
    assert!(
        out.status.success(),
        "failed to {what}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl PrivatePg {
    fn init() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("idemgate-pg-crash")
            .tempdir()
            .expect("temp dir");
        run(
            Command::new("chown")
                .args(["-R", "postgres:"])
                .arg(dir.path()),
            "chown the temp dir to postgres",
        );
        let bin = bin_dir();
        let nonce = u16::from_str_radix(&IdempotencyKey::mint().as_str()[4..8], 16).unwrap();
        let port = 55432 + nonce % 4000;
        let pg = PrivatePg {
            dir,
            bin,
            port,
            launchers: Vec::new(),
        };
        run(
            Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(pg.bin.join("initdb"))
                .args([
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                    "--no-sync",
                    "-D",
                ])
                .arg(pg.data()),
            "initdb (are the postgresql server binaries installed?)",
        );
        pg
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Starts the postmaster (fsync on) and waits until it takes connections.
    async fn start(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("log"))
            .expect("log file");
        let child = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bin.join("postgres"))
            .arg("-D")
            .arg(self.data())
            .args(["-p", &self.port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .arg("-c")
            .arg(format!(
                "unix_socket_directories={}",
                self.dir.path().display()
            ))
            .args(["-c", "fsync=on", "-c", "synchronous_commit=on"])
            .args(["-c", "max_connections=40", "-c", "shared_buffers=16MB"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start postgres");
        self.launchers.push(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if tokio_postgres::connect(&self.url(), tokio_postgres::NoTls)
                .await
                .is_ok()
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "private postgres did not start; log:\n{}",
                std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The pid of this instance's running postmaster. The pid file outlives a SIGKILLed
    /// postmaster, and pids are reused (`pid_max` is 32768 here), so the pid only counts when
    /// that process still runs `postgres -D <this data directory>`: never signal a stranger.
    fn postmaster_pid(&self) -> Option<u32> {
        let pid: u32 = std::fs::read_to_string(self.data().join("postmaster.pid"))
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let data = self.data();
        let data = data.to_str()?;
        cmdline
            .split(|b| *b == 0)
            .any(|arg| arg == data.as_bytes())
            .then_some(pid)
    }

    /// SIGKILLs the postmaster and all its children at once, as a machine crash would.
    fn kill9(&mut self) {
        let Some(pm) = self.postmaster_pid() else {
            return;
        };
        let mut pids = children_of(pm);
        pids.push(pm);
        let _ = Command::new("kill")
            .arg("-9")
            .args(pids.iter().map(u32::to_string))
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while pids
            .iter()
            .any(|p| Path::new(&format!("/proc/{p}")).exists())
            && Instant::now() < deadline
        {
            for c in &mut self.launchers {
                let _ = c.try_wait();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        for c in &mut self.launchers {
            let _ = c.wait();
        }
        self.launchers.clear();
    }
}

impl Drop for PrivatePg {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Processes whose parent is `pid` (read from /proc, so no procps is needed).
fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(child) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid ...; comm may hold spaces, so split after the last ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|s| s.parse::<u32>().ok());
        if ppid == Some(pid) {
            out.push(child);
        }
    }
    out
}

#[derive(Default)]
struct Tally {
    /// Executions of each key's side effect (in this process).
    executions: HashMap<String, u32>,
    /// Keys whose call executed and whose completion the store acknowledged.
    stored: Vec<String>,
    /// Keys whose call executed but whose completion went to the journal.
    journaled: Vec<String>,
    /// Every key called.
    called: Vec<String>,
    /// Calls refused because the store failed at reservation.
    refused: usize,
    /// Stored acknowledgements before and after the restart.
    stored_before: usize,
    stored_after: usize,
}

fn key_of(tenant: &TenantId, name: &str) -> Key {
    Key::new(
        tenant.clone(),
        ToolName::new("crash").unwrap(),
        IdempotencyKey::new(name).unwrap(),
    )
}

async fn call_once(
    engine: &Engine<PgStore>,
    tenant: &TenantId,
    name: &str,
    tally: &Arc<Mutex<Tally>>,
) -> Result<Decision, EngineError> {
    let call = Call::new(tenant.clone(), ToolName::new("crash").unwrap())
        .key(IdempotencyKey::new(name).unwrap())
        .args(&serde_json::json!({ "key": name }));
    let t = tally.clone();
    let n = name.to_owned();
    engine
        .call(call, move || async move {
            *t.lock().unwrap().executions.entry(n.clone()).or_default() += 1;
            Effect::Success(n.into_bytes())
        })
        .await
        .map(|a| a.decision)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_stream_loses_no_acknowledged_completion() {
    let mut pg = PrivatePg::init();
    pg.start().await;
    let store = PgStore::connect_with(
        &pg.url(),
        PgOptions {
            schema: "idemgate".to_owned(),
            pool_size: 8,
            connect_timeout: Duration::from_secs(1),
            statement_timeout: Duration::from_secs(2),
            answer_margin: Duration::from_secs(1),
            ..PgOptions::default()
        },
    )
    .await
    .expect("connect to the private postgres");
    let policy = ToolPolicy {
        lease: Duration::from_secs(2),
        wait: Duration::from_millis(300),
        ..ToolPolicy::default()
    };
    let engine = Arc::new(
        Engine::new(store)
            .with_policies(Policies::new().with_default(policy))
            .with_settings(Settings {
                finish_attempts: 3,
                finish_backoff: Duration::from_millis(20),
                max_poll: Duration::from_millis(50),
                ..Settings::default()
            }),
    );
    let tenant = TenantId::new("crash-test").unwrap();
    let tally = Arc::new(Mutex::new(Tally::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let restarted = Arc::new(AtomicBool::new(false));

    let mut workers = Vec::new();
    for w in 0..8 {
        let (engine, tenant, tally, stop, restarted) = (
            engine.clone(),
            tenant.clone(),
            tally.clone(),
            stop.clone(),
            restarted.clone(),
        );
        workers.push(tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                let name = format!("w{w}-{i}");
                i += 1;
                tally.lock().unwrap().called.push(name.clone());
                let after = restarted.load(Ordering::SeqCst);
                match call_once(&engine, &tenant, &name, &tally).await {
                    Ok(Decision::Executed { recording, .. }) => {
                        let mut t = tally.lock().unwrap();
                        match recording {
                            Recording::Stored => {
                                t.stored.push(name);
                                if after {
                                    t.stored_after += 1;
                                } else {
                                    t.stored_before += 1;
                                }
                            }
                            Recording::Journaled => t.journaled.push(name),
                            other => panic!("unexpected recording {other:?}"),
                        }
                    }
                    Ok(other) => panic!("a fresh key got {other:?}"),
                    Err(EngineError::ReserveFailed(_)) => {
                        tally.lock().unwrap().refused += 1;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    Err(e) => panic!("unexpected error {e}"),
                }
            }
        }));
    }

    tokio::time::sleep(Duration::from_millis(700)).await;
    pg.kill9();
    let killed_at = Instant::now();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let restart_at = Instant::now();
    pg.start().await;
    restarted.store(true, Ordering::SeqCst);
    // The store serves again: a fresh call gets through.
    let probe_tally = Arc::new(Mutex::new(Tally::default()));
    let mut n = 0;
    let served_after = loop {
        n += 1;
        if let Ok(Decision::Executed {
            recording: Recording::Stored,
            ..
        }) = call_once(&engine, &tenant, &format!("probe-{n}"), &probe_tally).await
        {
            break restart_at.elapsed();
        }
        assert!(
            restart_at.elapsed() < Duration::from_secs(10),
            "the store did not serve again within 10 s of the restart"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.await.expect("worker");
    }

    // Journaled completions reach the store now that it is back.
    let report = engine.flush_journal().await.expect("flush");
    // Every key once more: nothing executed runs again.
    let called = tally.lock().unwrap().called.clone();
    for name in &called {
        let _ = call_once(&engine, &tenant, name, &tally).await;
    }

    let (over, executed): (Vec<_>, Vec<_>) = {
        let t = tally.lock().unwrap();
        let over = t
            .executions
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(k, n)| (k.clone(), *n))
            .collect();
        (over, t.stored.iter().chain(&t.journaled).cloned().collect())
    };
    assert!(over.is_empty(), "keys executed more than once: {over:?}");
    let mut lost = Vec::new();
    for name in &executed {
        match engine
            .store()
            .get(&key_of(&tenant, name))
            .await
            .expect("get")
        {
            Some(rec) => match rec.state {
                RecordState::Completed { outcome, .. } => {
                    assert_eq!(outcome.body, name.as_bytes());
                }
                other => lost.push((name.clone(), format!("{other:?}"))),
            },
            None => lost.push((name.clone(), "absent".to_owned())),
        }
    }
    let t = tally.lock().unwrap();
    eprintln!(
        "crash test: {} calls, {} acknowledged before the kill and {} after the restart, {} \
         journaled, {} refused while down; served again {served_after:?} after the restart \
         ({:?} after the kill); journal flush {report:?}",
        called.len(),
        t.stored_before,
        t.stored_after,
        t.journaled.len(),
        t.refused,
        restart_at.duration_since(killed_at) + served_after,
    );
    assert!(lost.is_empty(), "acknowledged completions lost: {lost:?}");
    assert!(t.stored_before > 0, "no completion before the kill");
    assert!(t.stored_after > 0, "no completion after the restart");
    assert!(
        served_after < Duration::from_secs(5),
        "served again only after {served_after:?}"
    );
    assert_eq!(report.pending, 0, "journal entries left: {report:?}");
}

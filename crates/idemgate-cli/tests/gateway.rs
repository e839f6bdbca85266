//! Crash test of the HTTP gateway: three `idemgate serve` processes on one store, one of them
//! killed with SIGKILL every 2 s and restarted, while clients race four duplicates per key through
//! all three to a fake upstream that counts its executions.
//!
//! Asserted at the end: no key ran twice; every key a client got a success for ran exactly once
//! and has a completed record; no record is left in flight once the lease has passed.
//!
//! Time-boxed, so that a loaded machine makes it prove less rather than fail: the clients take no
//! new key after `IDEMGATE_CRASH_SECONDS` (default 60); keys started by then are finished, keys
//! never started must never have run. `scripts/chaos` runs the long version.
//!
//! Knobs (environment): `IDEMGATE_CRASH_KEYS` (default 10000), `IDEMGATE_CRASH_SECONDS`,
//! `IDEMGATE_TEST_POSTGRES_URL` (default the shared server on loopback; the Postgres variant fails
//! when it cannot reach it).
//!
//! Only std: a small HTTP/1.1 client and server over `std::net`, so the test needs no more
//! dependencies than the binary itself.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idemgate_conformance::servers::PrivatePostgres;

use crate::faultproxy::{FaultProxy, Faults};

const GATEWAYS: usize = 3;
const DUPLICATES: usize = 4;
const THREADS_PER_DUPLICATE: usize = 12;
const KILL_EVERY: Duration = Duration::from_secs(2);
const LEASE: Duration = Duration::from_secs(2);
const TOOL: &str = "charge";
/// How long a key the clients started may take to get its answers after they stopped taking new
/// ones (the test then fails: a key that never settles is a bug, not a slow machine).
const FINISH_DEADLINE: Duration = Duration::from_secs(300);

fn from_env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn keys_from_env() -> usize {
    from_env("IDEMGATE_CRASH_KEYS", 10_000) as usize
}

/// After this long the clients take no new key.
fn budget_from_env() -> Duration {
    Duration::from_secs(from_env("IDEMGATE_CRASH_SECONDS", 60))
}

#[test]
fn gateway_crash_sqlite_three_processes_one_file() {
    let _heavy = crate::heavy();
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("idem.db").display());
    crash_test(
        dir.path(),
        &store,
        "crash",
        keys_from_env(),
        Tidy::No,
        Chaos::KillGateways,
    );
}

#[test]
fn gateway_crash_postgres_three_processes() {
    // The shared server on loopback; a test that cannot reach it fails (it never skips).
    let url = std::env::var("IDEMGATE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let _heavy = crate::heavy();
    let dir = tempfile::tempdir().unwrap();
    // The shared database: a tenant of our own keeps these records apart from everybody else's;
    // completed records expire after 10 minutes, unknown ones are released at the end.
    let tenant = format!("crash-{}", unique());
    crash_test(
        dir.path(),
        &url,
        &tenant,
        keys_from_env(),
        Tidy::Yes,
        Chaos::KillGateways,
    );
}

/// Issue 8 §5, a flaky link: the three gateways reach the shared Postgres through a proxy that
/// delays every chunk by 0-200 ms, closes 1% of connections mid-query, and cuts 1% of
/// connections right after a statement was sent (it commits; its answer is lost). No double
/// execution; every ambiguous store error ends as a replay or as outcome-unknown.
#[test]
fn gateway_flaky_store_link_postgres() {
    let url = std::env::var("IDEMGATE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let target = postgres_port(&url);
    let _heavy = crate::heavy();
    let proxy = FaultProxy::start(target, FLAKY);
    let proxied = postgres_on_port(&url, proxy.port);
    let dir = tempfile::tempdir().unwrap();
    let tenant = format!("flaky-{}", unique());
    crash_test(
        dir.path(),
        &proxied,
        &tenant,
        keys_from_env(),
        Tidy::Yes,
        Chaos::FlakyStore(&proxy),
    );
}

/// Issue 8 §5, cut off: gateway A reaches the shared Postgres through a link that drops every
/// packet for 10 s (bytes held, nothing refused, as a partition does); gateway B reaches it
/// directly. A's calls fail closed within its store timeout (503, nothing executed); B serves
/// all along; A serves again within 5 s of the link healing.
#[test]
fn gateway_cut_off_from_postgres_fails_closed_and_recovers() {
    let url = std::env::var("IDEMGATE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let target = postgres_port(&url);
    let _heavy = crate::heavy();
    let proxy = FaultProxy::start(target, Faults::default());
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_idemgate"));
    let upstream = Upstream::start(1000);
    let token = format!("token-{}", unique());
    let hash = token_hash(&bin, &token);
    let tenant = format!("cutoff-{}", unique());
    let mut gateways = Vec::new();
    for (name, store) in [
        ("a", postgres_on_port(&url, proxy.port)),
        ("b", url.clone()),
    ] {
        let port = free_port();
        let config = dir.join(format!("{name}.toml"));
        fs::write(
            &config,
            format!(
                "[server]\nlisten = \"127.0.0.1:{port}\"\nstore = \"{store}\"\n\
                 journal = \"{journal}\"\nrequest_timeout = \"60s\"\n\n\
                 [[tenants]]\nid = \"{tenant}\"\ntoken_sha256 = \"{hash}\"\n\n\
                 [tools.{TOOL}]\nupstream = \"http://127.0.0.1:{up}/charge\"\n\
                 lease = \"10s\"\nwait = \"1s\"\nttl = \"10m\"\n",
                journal = dir.join(format!("journal-{name}")).display(),
                up = upstream.port,
            ),
        )
        .unwrap();
        gateways.push(Gateway::start(
            &bin,
            &config,
            port,
            &dir.join(format!("{name}.log")),
        ));
    }
    let (a, b) = (gateways[0].port, gateways[1].port);
    let auth = format!("Bearer {token}");
    let call = move |client: &mut HttpClient, port: u16, k: usize| {
        client
            .post(
                port,
                &format!("/v1/tools/{TOOL}/call"),
                &[
                    ("Authorization", auth.as_str()),
                    ("Idempotency-Key", &format!("c-{k}")),
                ],
                format!("{{\"k\":{k}}}").as_bytes(),
            )
            .unwrap()
    };
    let mut client = HttpClient::default();
    // Both serve, A through the (healthy) link.
    assert_eq!(call(&mut client, a, 0).status, 200);
    assert_eq!(call(&mut client, b, 1).status, 200);

    proxy.set(Faults {
        blackhole: true,
        ..Faults::default()
    });
    let cut_at = Instant::now();
    let cut_for = Duration::from_secs(10);
    // B serves all along, from another thread.
    let b_calls = {
        let call = call.clone();
        thread::spawn(move || {
            let mut client = HttpClient::default();
            let mut answers = Vec::new();
            let mut k = 500;
            while cut_at.elapsed() < cut_for {
                let started = Instant::now();
                let status = call(&mut client, b, k).status;
                answers.push((k, status, started.elapsed()));
                k += 1;
                thread::sleep(Duration::from_millis(250));
            }
            answers
        })
    };
    // A fails closed within its store timeout (statement timeout 5 s + answer margin 2 s).
    let mut k = 100;
    while cut_at.elapsed() + Duration::from_secs(7) < cut_for {
        let started = Instant::now();
        let r = call(&mut HttpClient::default(), a, k);
        let took = started.elapsed();
        let body = String::from_utf8_lossy(&r.body).into_owned();
        assert_eq!(r.status, 503, "A during the cut: {body}");
        assert!(
            took < Duration::from_secs(12),
            "A took {took:?} to fail closed"
        );
        assert_eq!(
            upstream.executions_by_key()[k],
            0,
            "A ran a call it could not record"
        );
        k += 1;
    }
    for (k, status, took) in b_calls.join().unwrap() {
        assert_eq!(status, 200, "B's call {k} during the cut");
        assert!(took < Duration::from_secs(3), "B's call {k} took {took:?}");
    }
    while cut_at.elapsed() < cut_for {
        thread::sleep(Duration::from_millis(50));
    }
    proxy.set(Faults::default());
    let healed_at = Instant::now();
    // A serves again within 5 s (its first calls may meet connections that broke in the cut).
    let mut k = 200;
    loop {
        let r = call(&mut HttpClient::default(), a, k);
        if r.status == 200 {
            break;
        }
        assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));
        assert!(
            healed_at.elapsed() < Duration::from_secs(5),
            "A did not serve within 5 s of the link healing"
        );
        k += 1;
        thread::sleep(Duration::from_millis(50));
    }
    eprintln!(
        "cut off: A served again {:?} after the link healed",
        healed_at.elapsed()
    );
    for g in &mut gateways {
        g.stop();
    }
}

/// The port of a `postgres://USER@HOST:PORT/DB` URL (5432 when it names none).
fn postgres_port(url: &str) -> u16 {
    url.split_once('@')
        .and_then(|(_, rest)| rest.split('/').next())
        .and_then(|host_port| host_port.rsplit_once(':'))
        .and_then(|(_, port)| port.parse().ok())
        .unwrap_or(5432)
}

/// `url` with its host and port replaced by `127.0.0.1:port` (a proxy in front of it).
fn postgres_on_port(url: &str, port: u16) -> String {
    let (scheme_user, rest) = url.split_once('@').expect("a postgres://USER@HOST URL");
    let db = rest.split_once('/').map_or("", |(_, db)| db);
    format!("{scheme_user}@127.0.0.1:{port}/{db}")
}

/// The flaky link of [`gateway_flaky_store_link_postgres`].
const FLAKY: Faults = Faults {
    max_latency: Duration::from_millis(200),
    reset_per_mille: 10,
    cut_after_send_per_mille: 10,
    blackhole: false,
};

/// What goes wrong during a crash test.
#[derive(Clone, Copy)]
enum Chaos<'a> {
    /// Every [`KILL_EVERY`], one gateway is SIGKILLed (round robin) and started again.
    KillGateways,
    /// The store is reached through this proxy, which injects faults; turned off before the
    /// records are read.
    FlakyStore(&'a FaultProxy),
}

/// Issue 8, recipe V3 (a zombie): gateway A's lease runs out while it is stopped mid-call, B takes
/// the record over and answers its own run; when A wakes up, its completion is rejected by fence,
/// and its caller must not be told A's result (which the store threw away): it gets `lease-lost`,
/// while every replay holds B's.
#[test]
fn zombie_caller_is_told_lease_lost_sqlite() {
    let _heavy = crate::heavy();
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("idem.db").display());
    zombie_test(dir.path(), &store, "zombie");
}

/// As [`zombie_caller_is_told_lease_lost_sqlite`], on the shared Postgres.
#[test]
fn zombie_caller_is_told_lease_lost_postgres() {
    let url = std::env::var("IDEMGATE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let _heavy = crate::heavy();
    let dir = tempfile::tempdir().unwrap();
    zombie_test(dir.path(), &url, &format!("zombie-{}", unique()));
}

fn zombie_test(dir: &Path, store: &str, tenant: &str) {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_idemgate"));
    let upstream = Upstream::start(1);
    let token = format!("token-{}", unique());
    let hash = token_hash(&bin, &token);
    let mut gateways = Vec::new();
    for name in ["a", "b"] {
        let port = free_port();
        let config = dir.join(format!("{name}.toml"));
        fs::write(
            &config,
            format!(
                "[server]\nlisten = \"127.0.0.1:{port}\"\nstore = \"{store}\"\n\
                 journal = \"{journal}\"\nrequest_timeout = \"30s\"\n\n\
                 [[tenants]]\nid = \"{tenant}\"\ntoken_sha256 = \"{hash}\"\n\n\
                 [tools.{TOOL}]\nupstream = \"http://127.0.0.1:{up}/charge\"\n\
                 lease = \"2s\"\nwait = \"1s\"\nttl = \"10m\"\non_unknown = \"retry\"\n",
                journal = dir.join(format!("journal-{name}")).display(),
                up = upstream.port,
            ),
        )
        .unwrap();
        gateways.push(Gateway::start(
            &bin,
            &config,
            port,
            &dir.join(format!("{name}.log")),
        ));
    }
    let (a, b) = (gateways[0].port, gateways[1].port);
    let auth = format!("Bearer {token}");
    let call = move |client: &mut HttpClient, port: u16| {
        client
            .post(
                port,
                &format!("/v1/tools/{TOOL}/call"),
                &[("Authorization", auth.as_str()), ("Idempotency-Key", "z")],
                br#"{"k":0,"delay_ms":1500}"#,
            )
            .unwrap()
    };
    let zombie = {
        let call = call.clone();
        thread::spawn(move || call(&mut HttpClient::default(), a))
    };
    // A sent the call upstream: stop it there, past its lease.
    let deadline = Instant::now() + Duration::from_secs(30);
    while upstream.executions_by_key()[0] == 0 {
        assert!(Instant::now() < deadline, "A never called the upstream");
        thread::sleep(Duration::from_millis(5));
    }
    let a_pid = gateways[0].child.as_ref().unwrap().id().to_string();
    assert!(Command::new("kill")
        .args(["-STOP", &a_pid])
        .status()
        .unwrap()
        .success());
    // B answers in flight until A's lease has run out, then takes over and runs the call itself.
    let mut client = HttpClient::default();
    let b_answer = loop {
        let r = call(&mut client, b);
        if r.status == 200 {
            break r;
        }
        assert_eq!(r.status, 409, "{}", String::from_utf8_lossy(&r.body));
        assert!(Instant::now() < deadline, "B never took the record over");
    };
    let b_body = String::from_utf8_lossy(&b_answer.body).into_owned();
    assert!(b_body.contains("\"run\":2"), "{b_body}");
    assert!(Command::new("kill")
        .args(["-CONT", &a_pid])
        .status()
        .unwrap()
        .success());
    let a_answer = zombie.join().unwrap();
    let a_body = String::from_utf8_lossy(&a_answer.body).into_owned();
    assert_eq!(
        a_answer.status, 409,
        "the zombie's caller was told {a_body}"
    );
    assert!(a_body.contains("lease-lost"), "{a_body}");
    // Every later answer, from either gateway, is B's run.
    for port in [a, b] {
        let r = call(&mut client, port);
        assert_eq!(r.status, 200);
        assert_eq!(r.header("idempotent-replayed"), Some("true"));
        assert_eq!(String::from_utf8_lossy(&r.body), b_body);
    }
    assert_eq!(upstream.executions_by_key()[0], 2);
    for g in &mut gateways {
        g.stop();
    }
}

/// Issue 8, recipe V1: the store goes out of reach while gateway A's call is upstream, so A
/// journals the outcome and acknowledges it; A's lease runs out while the store is out of reach;
/// the store comes back and gateway B gets the duplicate at once, under `retry`. B must replay A's
/// acknowledged outcome (A's flusher lands it within B's settle window), never run it again.
#[test]
fn journaled_outcome_survives_a_store_restart_redis() {
    let _heavy = crate::heavy();
    let dir = tempfile::tempdir().unwrap();
    let redis = PrivateRedis::start(dir.path());
    let store = format!("redis://127.0.0.1:{}", redis.port);
    journaled_outcome_test(dir.path(), &store, redis);
}

/// As [`journaled_outcome_survives_a_store_restart_redis`], on a Postgres of the test's own,
/// SIGKILLed (postmaster and backends) and restarted on its data directory.
#[test]
fn journaled_outcome_survives_a_store_restart_postgres() {
    let _heavy = crate::heavy();
    let dir = tempfile::tempdir().unwrap();
    let mut pg = PrivatePostgres::init();
    pg.start();
    let store = pg.url();
    journaled_outcome_test(dir.path(), &store, pg);
}

/// As [`journaled_outcome_survives_a_store_restart_redis`], on the embedded default: SQLite has no
/// server to kill, so the outage is another process holding the database's write lock (every
/// write of both gateways fails after the busy timeout) until A's lease has run out.
#[test]
fn journaled_outcome_survives_a_store_outage_sqlite() {
    let _heavy = crate::heavy();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("idem.db");
    let store = format!("sqlite://{}?busy_timeout=200ms", db.display());
    journaled_outcome_test(dir.path(), &store, SqliteLockHolder::new(&db));
}

/// How a V1 test takes its store out of reach and brings it back.
trait Outage {
    fn begin(&mut self);
    fn end(&mut self);
}

impl Outage for PrivateRedis {
    fn begin(&mut self) {
        self.kill();
    }
    fn end(&mut self) {
        self.restart();
    }
}

impl Outage for PrivatePostgres {
    fn begin(&mut self) {
        self.kill9();
    }
    fn end(&mut self) {
        self.start();
    }
}

/// A `sqlite3` process holding a database's write lock (`BEGIN EXCLUSIVE`) while the outage lasts.
struct SqliteLockHolder {
    db: PathBuf,
    child: Option<Child>,
}

impl SqliteLockHolder {
    fn new(db: &Path) -> SqliteLockHolder {
        SqliteLockHolder {
            db: db.to_owned(),
            child: None,
        }
    }
}

impl Outage for SqliteLockHolder {
    fn begin(&mut self) {
        let mut child = Command::new("sqlite3")
            .arg(&self.db)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("failed to start sqlite3 (Debian package sqlite3)");
        // The lock is held once the SELECT after BEGIN EXCLUSIVE printed its row.
        let stdin = child.stdin.as_mut().unwrap();
        stdin
            .write_all(b".timeout 10000\nBEGIN EXCLUSIVE;\nSELECT 'locked';\n")
            .unwrap();
        stdin.flush().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "locked", "sqlite3 did not take the lock");
        self.child = Some(child);
    }
    fn end(&mut self) {
        let mut child = self.child.take().expect("the outage began");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"COMMIT;\n.quit\n")
            .unwrap();
        assert!(child.wait().unwrap().success(), "sqlite3 failed");
    }
}

impl Drop for SqliteLockHolder {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn journaled_outcome_test(dir: &Path, store: &str, mut outage: impl Outage) {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_idemgate"));
    let upstream = Upstream::start(1);
    let token = format!("token-{}", unique());
    let hash = token_hash(&bin, &token);
    let mut gateways = Vec::new();
    for name in ["a", "b"] {
        let port = free_port();
        let config = dir.join(format!("{name}.toml"));
        fs::write(
            &config,
            format!(
                "[server]\nlisten = \"127.0.0.1:{port}\"\nstore = \"{store}\"\n\
                 journal = \"{journal}\"\nrequest_timeout = \"30s\"\n\n\
                 [[tenants]]\nid = \"v1\"\ntoken_sha256 = \"{hash}\"\n\n\
                 [tools.{TOOL}]\nupstream = \"http://127.0.0.1:{up}/charge\"\n\
                 lease = \"2s\"\nwait = \"5s\"\non_unknown = \"retry\"\n",
                journal = dir.join(format!("journal-{name}")).display(),
                up = upstream.port,
            ),
        )
        .unwrap();
        gateways.push(Gateway::start(
            &bin,
            &config,
            port,
            &dir.join(format!("{name}.log")),
        ));
    }
    let (a, b) = (gateways[0].port, gateways[1].port);
    let auth = format!("Bearer {token}");
    let call = move |client: &mut HttpClient, port: u16| {
        client
            .post(
                port,
                &format!("/v1/tools/{TOOL}/call"),
                &[("Authorization", auth.as_str()), ("Idempotency-Key", "v1")],
                br#"{"k":0,"delay_ms":500}"#,
            )
            .unwrap()
    };
    let first = {
        let call = call.clone();
        thread::spawn(move || call(&mut HttpClient::default(), a))
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while upstream.executions_by_key()[0] == 0 {
        assert!(Instant::now() < deadline, "A never called the upstream");
        thread::sleep(Duration::from_millis(5));
    }
    // The store goes out of reach while the call is upstream: A cannot record the outcome.
    outage.begin();
    let acked = first.join().unwrap();
    let acked_body = String::from_utf8_lossy(&acked.body).into_owned();
    assert_eq!(acked.status, 200, "{acked_body}");
    assert_eq!(acked.header("idempotency-recording"), Some("journaled"));
    // The outage lasts past A's lease (a loaded machine only makes this longer).
    thread::sleep(Duration::from_secs(3));
    // B's caller is already retrying when the store comes back (503 while it is out of reach,
    // nothing ran), so B finds the record the moment it can: the race A's flush must win.
    let duplicate = thread::spawn(move || {
        let mut client = HttpClient::default();
        loop {
            let r = call(&mut client, b);
            if r.status != 503 {
                return r;
            }
            assert!(
                Instant::now() < deadline,
                "B never reached the store after the outage"
            );
            thread::sleep(Duration::from_millis(10));
        }
    });
    outage.end();
    let replay = duplicate.join().unwrap();
    let replay_body = String::from_utf8_lossy(&replay.body).into_owned();
    assert_eq!(replay.status, 200, "{replay_body}");
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(
        replay_body, acked_body,
        "B superseded A's acknowledged outcome"
    );
    assert_eq!(
        upstream.executions_by_key()[0],
        1,
        "never a second execution"
    );
    for g in &mut gateways {
        g.stop();
    }
}

/// A Redis server of this test's own, with an append-only file that survives SIGKILL, on a free
/// loopback port; stopped by its recorded pid, never the shared one.
struct PrivateRedis {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl PrivateRedis {
    fn start(dir: &Path) -> PrivateRedis {
        let dir = dir.join("redis");
        fs::create_dir_all(&dir).unwrap();
        let mut r = PrivateRedis {
            port: free_port(),
            dir,
            child: None,
        };
        r.restart();
        r
    }

    fn restart(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
            ])
            .arg("--dir")
            .arg(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("failed to start redis-server (installed with the machine's Redis)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) {
                let mut pong = [0u8; 5];
                if s.write_all(b"PING\r\n").is_ok()
                    && s.read_exact(&mut pong).is_ok()
                    && &pong == b"+PONG"
                {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "private redis did not come up");
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let status = Command::new("kill")
                .args(["-9", &child.id().to_string()])
                .status()
                .unwrap();
            assert!(status.success(), "kill -9 failed");
            child.wait().unwrap();
        }
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

// ---- the test --------------------------------------------------------------------------------

/// What one client finally got for one duplicate of a key.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Answer {
    /// 2xx: the upstream's body, and the `Idempotent-Replayed` header.
    Success { body: String, replayed: bool },
    /// 409 outcome-unknown: the gateway says it cannot tell (never a silent re-run).
    Unknown,
    /// Anything else that ended the attempts (an unexpected status, or the deadline).
    Other(String),
}

/// Whether to clean the store up after a passing run (a shared database).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tidy {
    Yes,
    No,
}

fn crash_test(dir: &Path, store: &str, tenant: &str, keys: usize, tidy: Tidy, chaos: Chaos<'_>) {
    let started = Instant::now();
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_idemgate"));
    let upstream = Upstream::start(keys);
    let token = format!("token-{}", unique());
    let hash = token_hash(&bin, &token);

    let ports: Vec<u16> = (0..GATEWAYS).map(|_| free_port()).collect();
    let mut configs = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let config = dir.join(format!("gateway-{i}.toml"));
        fs::write(
            &config,
            format!(
                "[server]\n\
                 listen = \"127.0.0.1:{port}\"\n\
                 store = \"{store}\"\n\
                 journal = \"{journal}\"\n\
                 request_timeout = \"20s\"\n\
                 \n\
                 [[tenants]]\n\
                 id = \"{tenant}\"\n\
                 token_sha256 = \"{hash}\"\n\
                 \n\
                 [tools.{TOOL}]\n\
                 upstream = \"http://127.0.0.1:{up}/charge\"\n\
                 lease = \"{lease}s\"\n\
                 wait = \"1s\"\n\
                 ttl = \"{ttl}\"\n",
                journal = dir.join(format!("journal-{i}")).display(),
                up = upstream.port,
                lease = LEASE.as_secs(),
                ttl = if tidy == Tidy::Yes { "10m" } else { "1h" },
            ),
        )
        .unwrap();
        configs.push(config);
    }
    let gateways: Vec<Mutex<Gateway>> = (0..GATEWAYS)
        .map(|i| {
            Mutex::new(Gateway::start(
                &bin,
                &configs[i],
                ports[i],
                &dir.join(format!("gateway-{i}.log")),
            ))
        })
        .collect();
    let gateways = Arc::new(gateways);
    eprintln!(
        "crash test on {store}: {GATEWAYS} gateways up after {:.1}s",
        started.elapsed().as_secs_f64()
    );

    // The killer: every KILL_EVERY, SIGKILL one gateway (round robin) and start it again.
    let done = Arc::new(AtomicBool::new(false));
    let kills = Arc::new(AtomicUsize::new(0));
    let kill = matches!(chaos, Chaos::KillGateways);
    let killer = {
        let gateways = Arc::clone(&gateways);
        let done = Arc::clone(&done);
        let kills = Arc::clone(&kills);
        thread::spawn(move || {
            let mut next = 0;
            let mut last = Instant::now();
            while !done.load(Ordering::SeqCst) {
                if !kill || last.elapsed() < KILL_EVERY {
                    thread::sleep(Duration::from_millis(20));
                    continue;
                }
                last = Instant::now();
                gateways[next].lock().unwrap().kill_and_restart();
                kills.fetch_add(1, Ordering::SeqCst);
                next = (next + 1) % GATEWAYS;
            }
        })
    };

    // The clients: DUPLICATES groups walk the keys in the same order, so the duplicates of a key
    // race; duplicate d of key k starts at gateway (k + d) % GATEWAYS.
    let answers: Arc<Vec<Mutex<Vec<Answer>>>> =
        Arc::new((0..keys).map(|_| Mutex::new(Vec::new())).collect());
    let retries = Arc::new(AtomicU64::new(0));
    let client_start = Instant::now();
    let stop_taking = client_start + budget_from_env();
    let deadline = stop_taking + FINISH_DEADLINE;
    let mut workers = Vec::new();
    for dup in 0..DUPLICATES {
        let next_key = Arc::new(AtomicUsize::new(0));
        for _ in 0..THREADS_PER_DUPLICATE {
            let next_key = Arc::clone(&next_key);
            let answers = Arc::clone(&answers);
            let retries = Arc::clone(&retries);
            let ports = ports.clone();
            let token = token.clone();
            workers.push(thread::spawn(move || {
                let mut client = HttpClient::default();
                loop {
                    if Instant::now() > stop_taking {
                        return;
                    }
                    let k = next_key.fetch_add(1, Ordering::Relaxed);
                    if k >= keys {
                        return;
                    }
                    let answer = call_until_answered(
                        &mut client,
                        &ports,
                        &token,
                        k,
                        dup,
                        deadline,
                        &retries,
                    );
                    answers[k].lock().unwrap().push(answer);
                }
            }));
        }
    }
    for w in workers {
        w.join().unwrap();
    }
    let client_time = client_start.elapsed();
    done.store(true, Ordering::SeqCst);
    killer.join().unwrap();

    if let Chaos::FlakyStore(proxy) = chaos {
        eprintln!(
            "fault proxy: {} connections, {} closed mid-query, {} cut after a statement was sent",
            proxy.injected.connections.load(Ordering::Relaxed),
            proxy.injected.resets.load(Ordering::Relaxed),
            proxy.injected.cuts_after_send.load(Ordering::Relaxed),
        );
        proxy.set(Faults::default());
    }
    // Let every lease run out, then read the records.
    thread::sleep(LEASE + Duration::from_secs(2));
    let records = list_records(&bin, store, tenant, dir);
    for g in gateways.iter() {
        g.lock().unwrap().stop();
    }

    // ---- the verdict ----
    let executions = upstream.executions_by_key();
    let by_downstream = upstream.executions_by_downstream_key();
    let mut executed_twice = Vec::new();
    let mut success_not_once = Vec::new();
    let mut success_not_completed = Vec::new();
    let mut completed_not_executed = Vec::new();
    let mut two_executed_answers = Vec::new();
    let mut differing_bodies = Vec::new();
    let mut others = Vec::new();
    let mut ran_unasked = Vec::new();
    let mut keys_started = 0;
    let (mut keys_ok, mut keys_unknown, mut answers_ok, mut answers_executed) = (0, 0, 0, 0);
    let mut states: BTreeMap<String, usize> = BTreeMap::new();
    for state in records.values() {
        *states.entry(state.clone()).or_default() += 1;
    }
    let in_flight: Vec<&String> = records
        .iter()
        .filter(|(_, s)| s.as_str() == "in_flight")
        .map(|(k, _)| k)
        .collect();

    for k in 0..keys {
        let n = executions[k];
        if n > 1 {
            executed_twice.push(k);
        }
        let got = answers[k].lock().unwrap().clone();
        if got.is_empty() {
            // No client reached this key before the budget ran out: nothing may have run it.
            if n != 0 || records.contains_key(&key_name(k)) {
                ran_unasked.push(k);
            }
            continue;
        }
        keys_started += 1;
        let bodies: Vec<&String> = got
            .iter()
            .filter_map(|a| match a {
                Answer::Success { body, .. } => Some(body),
                _ => None,
            })
            .collect();
        let executed_answers = got
            .iter()
            .filter(|a| {
                matches!(
                    a,
                    Answer::Success {
                        replayed: false,
                        ..
                    }
                )
            })
            .count();
        answers_ok += bodies.len();
        answers_executed += executed_answers;
        if got.contains(&Answer::Unknown) {
            keys_unknown += 1;
        }
        for a in &got {
            if let Answer::Other(what) = a {
                others.push(format!("key {k}: {what}"));
            }
        }
        let record = records.get(&key_name(k)).map(String::as_str);
        if record == Some("completed") && n != 1 {
            completed_not_executed.push(k);
        }
        if bodies.is_empty() {
            continue;
        }
        keys_ok += 1;
        if n != 1 {
            success_not_once.push((k, n));
        }
        if record != Some("completed") {
            success_not_completed.push((k, record.map(str::to_owned)));
        }
        if executed_answers > 1 {
            two_executed_answers.push(k);
        }
        if bodies.iter().any(|b| *b != bodies[0]) {
            differing_bodies.push(k);
        }
    }
    let answers_total: usize = answers.iter().map(|a| a.lock().unwrap().len()).sum();
    let downstream_twice = by_downstream.values().filter(|&&n| n > 1).count();
    let total_executions: u64 = executions.iter().map(|&n| u64::from(n)).sum();

    eprintln!(
        "crash test on {store}: {keys_started} keys (of {keys}) x {DUPLICATES} duplicates through \
         {GATEWAYS} gateways in {:.1}s ({:.0} answers/s), {} kills, {} client retries\n  \
         {total_executions} upstream executions ({} distinct downstream keys), {keys_ok} keys \
         answered with success ({answers_ok} successful answers, {answers_executed} of them \
         'executed'), {keys_unknown} keys answered outcome-unknown\n  records: {states:?}",
        client_time.as_secs_f64(),
        answers_total as f64 / client_time.as_secs_f64(),
        kills.load(Ordering::SeqCst),
        retries.load(Ordering::Relaxed),
        by_downstream.len(),
    );

    assert!(
        executed_twice.is_empty() && downstream_twice == 0,
        "keys executed more than once: {} (first: {:?}); downstream keys seen twice: {downstream_twice}",
        executed_twice.len(),
        &executed_twice[..executed_twice.len().min(10)]
    );
    assert!(
        success_not_once.is_empty(),
        "keys answered with success that did not run exactly once: {} (first: {:?})",
        success_not_once.len(),
        &success_not_once[..success_not_once.len().min(10)]
    );
    assert!(
        success_not_completed.is_empty(),
        "keys answered with success without a completed record (lost records): {} (first: {:?})",
        success_not_completed.len(),
        &success_not_completed[..success_not_completed.len().min(10)]
    );
    assert!(
        completed_not_executed.is_empty(),
        "completed records whose key never ran: {:?}",
        &completed_not_executed[..completed_not_executed.len().min(10)]
    );
    assert!(
        in_flight.is_empty(),
        "records still in flight {}s after the clients stopped: {:?}",
        (LEASE + Duration::from_secs(2)).as_secs(),
        &in_flight[..in_flight.len().min(10)]
    );
    assert!(
        differing_bodies.is_empty(),
        "keys whose successful answers differ: {:?}",
        &differing_bodies[..differing_bodies.len().min(10)]
    );
    assert!(
        two_executed_answers.is_empty(),
        "keys where more than one answer said 'executed' (Idempotent-Replayed: false): {} \
         (first: {:?})",
        two_executed_answers.len(),
        &two_executed_answers[..two_executed_answers.len().min(10)]
    );
    assert!(
        others.is_empty(),
        "unexpected answers: {} (first: {:?})",
        others.len(),
        &others[..others.len().min(10)]
    );
    assert!(
        ran_unasked.is_empty(),
        "keys no client sent that ran or have a record: {:?}",
        &ran_unasked[..ran_unasked.len().min(10)]
    );
    assert!(
        keys_started >= 200.min(keys),
        "only {keys_started} keys were started within the budget: the test proves little"
    );
    assert!(
        keys_ok * 2 > keys_started,
        "fewer than half the keys got a success ({keys_ok} of {keys_started}): the test proves little"
    );
    match chaos {
        Chaos::KillGateways => assert!(
            kills.load(Ordering::SeqCst) >= 3,
            "too few kills landed during the run"
        ),
        Chaos::FlakyStore(proxy) => {
            let injected = &proxy.injected;
            assert!(
                injected.resets.load(Ordering::Relaxed) >= 3
                    && injected.cuts_after_send.load(Ordering::Relaxed) >= 3,
                "too few faults were injected: {injected:?}"
            );
        }
    }

    if tidy == Tidy::Yes {
        for (key, state) in &records {
            if state == "unknown" {
                let out = Command::new(&bin)
                    .args(["--store", store, "--tenant", tenant])
                    .args(["keys", "resolve", key, "--tool", TOOL, "--release"])
                    .env("XDG_DATA_HOME", dir.join("data"))
                    .env("IDEMGATE_JOURNAL", dir.join("journal-cli"))
                    .stdin(Stdio::null())
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "failed to release {key}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
}

fn key_name(k: usize) -> String {
    format!("k-{k}")
}

/// Sends duplicate `dup` of key `k` until it gets an answer that ends it: a success, an
/// outcome-unknown, or something unexpected. Connection errors, 409 in-flight, 502 and 503 are
/// retried with the same key (at the next gateway after a connection error).
fn call_until_answered(
    client: &mut HttpClient,
    ports: &[u16],
    token: &str,
    k: usize,
    dup: usize,
    deadline: Instant,
    retries: &AtomicU64,
) -> Answer {
    let key = key_name(k);
    let body = format!("{{\"k\":{k}}}");
    let auth = format!("Bearer {token}");
    let mut gateway = (k + dup) % ports.len();
    let mut attempt = 0u32;
    let started = Instant::now();
    // What the attempts got (the last few), reported for a key that took long or never settled.
    let mut trace: Vec<String> = Vec::new();
    let mut note = |what: String| {
        if trace.len() == 40 {
            trace.remove(0);
        }
        trace.push(format!("+{}ms {what}", started.elapsed().as_millis()));
    };
    let answer = loop {
        if Instant::now() > deadline {
            break Answer::Other(format!("client deadline passed after {attempt} attempts"));
        }
        if attempt > 0 {
            retries.fetch_add(1, Ordering::Relaxed);
        }
        attempt += 1;
        let sent = client.post(
            ports[gateway],
            &format!("/v1/tools/{TOOL}/call"),
            &[("Authorization", &auth), ("Idempotency-Key", &key)],
            body.as_bytes(),
        );
        let response = match sent {
            Ok(r) => r,
            Err(e) => {
                note(format!("{e} from port {}", ports[gateway]));
                // Killed mid-request, or refused while it restarts: same key, another gateway,
                // one or two places on. Always the next one would march in step with the
                // killer, which kills them in that order: the client would always land on the
                // gateway to be killed next, and a request that needs the settle window (2 s,
                // as long as the kill interval) would never finish (seen: 400 s on one key).
                gateway = (gateway + 1 + (k + attempt as usize) % 2) % ports.len();
                thread::sleep(Duration::from_millis(20));
                continue;
            }
        };
        let text = String::from_utf8_lossy(&response.body).into_owned();
        note(format!(
            "{} {} from port {}",
            response.status,
            text.chars().take(160).collect::<String>(),
            ports[gateway]
        ));
        match response.status {
            200..=299 => {
                break Answer::Success {
                    replayed: response.header("idempotent-replayed") == Some("true"),
                    body: text,
                };
            }
            409 if text.contains("outcome-unknown") => break Answer::Unknown,
            409 if text.contains("in-flight") => thread::sleep(Duration::from_millis(100)),
            502 | 503 => thread::sleep(Duration::from_millis(50)),
            status => break Answer::Other(format!("{status} {text}")),
        }
    };
    if started.elapsed() > SLOW_KEY {
        eprintln!(
            "slow key {key} (duplicate {dup}): {:.1}s, {attempt} attempts, got {answer:?}; the last \
             attempts:\n  {}",
            started.elapsed().as_secs_f64(),
            trace.join("\n  ")
        );
    }
    answer
}

/// A key whose answers take longer than this is reported with its attempts.
const SLOW_KEY: Duration = Duration::from_secs(30);

/// The tenant's records of the tool: key → state, read with `idemgate keys list`.
fn list_records(bin: &Path, store: &str, tenant: &str, dir: &Path) -> HashMap<String, String> {
    let out = Command::new(bin)
        .args(["--store", store, "--tenant", tenant, "--json"])
        .args(["keys", "list", "--tool", TOOL, "--limit", "0"])
        .env("XDG_DATA_HOME", dir.join("data"))
        .env("IDEMGATE_JOURNAL", dir.join("journal-cli"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "keys list failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    rows.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["key"]["key"].as_str().unwrap().to_owned(),
                r["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn token_hash(bin: &Path, token: &str) -> String {
    let out = Command::new(bin)
        .args(["token", "hash", token])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "idemgate token hash failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let hash = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert_eq!(hash.len(), 64, "not a SHA-256 hex digest: {hash:?}");
    hash
}

fn unique() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
        ^ u128::from(std::process::id())
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

// ---- the gateway processes -------------------------------------------------------------------

struct Gateway {
    bin: PathBuf,
    config: PathBuf,
    port: u16,
    log: PathBuf,
    child: Option<Child>,
}

impl Gateway {
    fn start(bin: &Path, config: &Path, port: u16, log: &Path) -> Gateway {
        let mut g = Gateway {
            bin: bin.to_owned(),
            config: config.to_owned(),
            port,
            log: log.to_owned(),
            child: None,
        };
        g.spawn_until_healthy();
        g
    }

    fn spawn_until_healthy(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let log = fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.log)
                .unwrap();
            let mut child = Command::new(&self.bin)
                .args(["serve", "--config"])
                .arg(&self.config)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap();
            // Wait for /healthz; if the process exits (say the port is not free yet), start again.
            let until = Instant::now() + Duration::from_secs(20);
            let mut client = HttpClient::default();
            while Instant::now() < until {
                if child.try_wait().unwrap().is_some() {
                    break;
                }
                if let Ok(r) = client.get(self.port, "/healthz") {
                    if r.status == 200 {
                        self.child = Some(child);
                        return;
                    }
                }
                thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
            thread::sleep(Duration::from_millis(200));
        }
        panic!(
            "gateway on port {} did not come up; log:\n{}",
            self.port,
            fs::read_to_string(&self.log).unwrap_or_default()
        );
    }

    fn kill_and_restart(&mut self) {
        if let Some(mut child) = self.child.take() {
            let status = Command::new("kill")
                .args(["-9", &child.id().to_string()])
                .status()
                .unwrap();
            assert!(status.success(), "kill -9 failed");
            child.wait().unwrap();
        }
        self.spawn_until_healthy();
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let until = Instant::now() + Duration::from_secs(10);
            while Instant::now() < until {
                if child.try_wait().unwrap().is_some() {
                    return;
                }
                thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

// ---- the fake upstream -----------------------------------------------------------------------

/// Counts executions per client key (from the body) and per downstream `Idempotency-Key`.
struct Upstream {
    port: u16,
    by_key: Arc<Vec<AtomicU32>>,
    by_downstream: Arc<Mutex<HashMap<String, u32>>>,
}

impl Upstream {
    fn start(keys: usize) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let by_key: Arc<Vec<AtomicU32>> = Arc::new((0..keys).map(|_| AtomicU32::new(0)).collect());
        let by_downstream = Arc::new(Mutex::new(HashMap::new()));
        {
            let by_key = Arc::clone(&by_key);
            let by_downstream = Arc::clone(&by_downstream);
            thread::spawn(move || {
                for stream in listener.incoming() {
                    let Ok(stream) = stream else { continue };
                    let by_key = Arc::clone(&by_key);
                    let by_downstream = Arc::clone(&by_downstream);
                    thread::spawn(move || {
                        let _ = serve_upstream(stream, &by_key, &by_downstream);
                    });
                }
            });
        }
        Upstream {
            port,
            by_key,
            by_downstream,
        }
    }

    fn executions_by_key(&self) -> Vec<u32> {
        self.by_key
            .iter()
            .map(|n| n.load(Ordering::SeqCst))
            .collect()
    }

    fn executions_by_downstream_key(&self) -> HashMap<String, u32> {
        self.by_downstream.lock().unwrap().clone()
    }
}

fn serve_upstream(
    stream: TcpStream,
    by_key: &[AtomicU32],
    by_downstream: &Mutex<HashMap<String, u32>>,
) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    loop {
        let Some(request) = read_message(&mut reader, true)? else {
            return Ok(());
        };
        let downstream = request
            .header("idempotency-key")
            .unwrap_or_default()
            .to_owned();
        let args: serde_json::Value =
            serde_json::from_slice(&request.body).unwrap_or(serde_json::Value::Null);
        let k = args["k"].as_u64().and_then(|k| usize::try_from(k).ok());
        // The side effect: counted before the answer, as a real one would have happened.
        let run = k
            .and_then(|k| by_key.get(k))
            .map_or(0, |n| n.fetch_add(1, Ordering::SeqCst) + 1);
        *by_downstream
            .lock()
            .unwrap()
            .entry(downstream.clone())
            .or_default() += 1;
        // A little work, so that kills land while calls are on the wire (or as long as asked).
        let work = args["delay_ms"]
            .as_u64()
            .unwrap_or_else(|| k.map_or(0, |k| (k % 3) as u64));
        thread::sleep(Duration::from_millis(work));
        let body = format!(
            "{{\"k\":{},\"run\":{run},\"downstream_key\":\"{downstream}\"}}",
            k.map_or(-1, |k| k as i64)
        );
        write!(
            writer,
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )?;
        writer.flush()?;
        if request
            .header("connection")
            .is_some_and(|c| c.eq_ignore_ascii_case("close"))
        {
            let _ = writer.shutdown(Shutdown::Both);
            return Ok(());
        }
    }
}

// ---- a small HTTP/1.1 client and message reader ----------------------------------------------

struct Message {
    /// The status of a response (0 for a request).
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Message {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Reads one HTTP/1.1 message (request or response); `None` on a clean end of stream before it.
fn read_message(reader: &mut BufReader<TcpStream>, request: bool) -> io::Result<Option<Message>> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let status = if request {
        0
    } else {
        line.split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("bad status line {line:?}"),
                )
            })?
    };
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((n, v)) = h.split_once(':') {
            headers.push((n.trim().to_ascii_lowercase(), v.trim().to_owned()));
        }
    }
    let mut message = Message {
        status,
        headers,
        body: Vec::new(),
    };
    if let Some(len) = message.header("content-length") {
        let len: usize = len
            .parse()
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad content-length"))?;
        message.body = vec![0; len];
        reader.read_exact(&mut message.body)?;
    } else if message
        .header("transfer-encoding")
        .is_some_and(|t| t.to_ascii_lowercase().contains("chunked"))
    {
        loop {
            let mut size = String::new();
            if reader.read_line(&mut size)? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            let size = usize::from_str_radix(size.trim().split(';').next().unwrap_or("0"), 16)
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad chunk size"))?;
            if size == 0 {
                // Trailers, up to the empty line.
                loop {
                    let mut t = String::new();
                    if reader.read_line(&mut t)? == 0 || t.trim_end().is_empty() {
                        break;
                    }
                }
                break;
            }
            let start = message.body.len();
            message.body.resize(start + size, 0);
            reader.read_exact(&mut message.body[start..])?;
            let mut crlf = [0u8; 2];
            reader.read_exact(&mut crlf)?;
        }
    } else if !request && !matches!(status, 100..=199 | 204 | 304) {
        reader.read_to_end(&mut message.body)?;
    }
    Ok(Some(message))
}

/// Keep-alive connections, one per port; any error drops the connection.
#[derive(Default)]
struct HttpClient {
    conns: HashMap<u16, (TcpStream, BufReader<TcpStream>)>,
}

impl HttpClient {
    fn get(&mut self, port: u16, path: &str) -> io::Result<Message> {
        self.send(port, "GET", path, &[], &[])
    }

    fn post(
        &mut self,
        port: u16,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> io::Result<Message> {
        self.send(port, "POST", path, headers, body)
    }

    fn send(
        &mut self,
        port: u16,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> io::Result<Message> {
        let result = self.try_send(port, method, path, headers, body);
        match &result {
            Ok(m)
                if m.header("connection")
                    .is_some_and(|c| c.eq_ignore_ascii_case("close")) =>
            {
                self.conns.remove(&port);
            }
            Ok(_) => {}
            Err(_) => {
                self.conns.remove(&port);
            }
        }
        result
    }

    fn try_send(
        &mut self,
        port: u16,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> io::Result<Message> {
        let (stream, reader) = match self.conns.entry(port) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(v) => {
                let stream = TcpStream::connect(("127.0.0.1", port))?;
                stream.set_nodelay(true)?;
                stream.set_read_timeout(Some(Duration::from_secs(30)))?;
                let reader = BufReader::new(stream.try_clone()?);
                v.insert((stream, reader))
            }
        };
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-length: {}\r\n",
            body.len()
        );
        if !body.is_empty() {
            head.push_str("content-type: application/json\r\n");
        }
        for (n, v) in headers {
            head.push_str(&format!("{n}: {v}\r\n"));
        }
        head.push_str("\r\n");
        let mut request = head.into_bytes();
        request.extend_from_slice(body);
        stream.write_all(&request)?;
        read_message(reader, false)?.ok_or_else(|| io::ErrorKind::UnexpectedEof.into())
    }
}

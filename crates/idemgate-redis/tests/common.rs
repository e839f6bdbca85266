//! Servers and stores for the tests.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use idemgate_redis::{RedisOptions, RedisStore};

/// How to start the shared test server, for failure messages.
pub(crate) const START_HINT: &str =
    "start one with `redis-server --daemonize yes --bind 127.0.0.1 \
    -::1 --port 6379 --save \"\" --appendonly no --dir /var/lib/redis --logfile \
    /var/log/redis/ci.log`, or point IDEMGATE_TEST_REDIS_URL at one";

/// The shared server's URL.
pub(crate) fn test_url() -> String {
    std::env::var("IDEMGATE_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// Lower-case hex of `n` random bytes.
pub(crate) fn random_hex(n: usize) -> String {
    let mut b = vec![0u8; n];
    getrandom::fill(&mut b).expect("randomness");
    idemgate_core::key::hex(&b)
}

/// A key prefix of this test run on the shared server, so runs never see each other's records.
pub(crate) fn run_prefix() -> &'static str {
    static PREFIX: OnceLock<String> = OnceLock::new();
    PREFIX.get_or_init(|| format!("idemgate-test-{}:", random_hex(6)))
}

/// A store on the shared server (which has no persistence, so volatile is allowed) under
/// `prefix`; fails the test with instructions when the server cannot be reached.
pub(crate) async fn shared_store(prefix: &str) -> RedisStore {
    let url = test_url();
    let options = RedisOptions {
        allow_volatile: true,
        key_prefix: prefix.to_owned(),
        ..RedisOptions::default()
    };
    RedisStore::connect_with(&url, options)
        .await
        .unwrap_or_else(|e| panic!("failed to reach the test redis at {url} ({e}); {START_HINT}"))
}

/// A plain connection to `url`, for looking behind the store's back.
pub(crate) async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("failed to reach redis at {url} ({e}); {START_HINT}"))
}

/// The names of every key under `prefix` on `conn`.
pub(crate) async fn names_under(
    conn: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
) -> Vec<String> {
    let mut all = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, names): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await
            .expect("scan");
        all.extend(names);
        if next == 0 {
            return all;
        }
        cursor = next;
    }
}

/// Deletes every key under `prefix` (only this run's own keys; never a flush).
pub(crate) async fn delete_prefix(url: &str, prefix: &str) {
    let mut conn = raw(url).await;
    let names = names_under(&mut conn, prefix).await;
    for chunk in names.chunks(1000) {
        let _: i64 = redis::cmd("UNLINK")
            .arg(chunk)
            .query_async(&mut conn)
            .await
            .expect("unlink");
    }
}

/// A private `redis-server` on a random loopback port, killed by pid when dropped (also when the
/// test panics).
pub(crate) struct PrivateRedis {
    child: Option<Child>,
    port: u16,
    aof: bool,
    extra: Vec<String>,
    dir: tempfile::TempDir,
}

impl PrivateRedis {
    /// Starts one; with `aof`, it fsyncs its append-only file on every write.
    pub(crate) fn start(aof: bool) -> Self {
        Self::start_with(aof, &[])
    }

    /// Starts one with extra command-line settings.
    pub(crate) fn start_with(aof: bool, extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut me = PrivateRedis {
            child: None,
            port: free_port(),
            aof,
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
            dir,
        };
        // The port was free when picked, but another process (an outgoing connection's
        // ephemeral port, another test's server) may take it before redis-server binds it:
        // redis-server then exits at once, and another port is tried.
        for _ in 0..4 {
            match me.try_spawn() {
                Spawned::Serving => return me,
                Spawned::Exited(_) => me.port = free_port(),
            }
        }
        me.spawn();
        me
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// SIGKILL, as a crash: nothing is flushed beyond what was fsynced.
    pub(crate) fn kill9(&mut self) {
        let pid = self.pid().to_string();
        let status = Command::new("kill")
            .args(["-9", &pid])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -9 {pid} failed");
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port and directory, waiting until it serves.
    pub(crate) fn restart(&mut self) {
        assert!(self.child.is_none(), "still running");
        self.spawn();
    }

    /// Starts the server on its port and directory, waiting until it serves; panics, with its
    /// log, when it does not.
    fn spawn(&mut self) {
        if let Spawned::Exited(why) = self.try_spawn() {
            panic!(
                "private redis-server on port {} did not start: {why}",
                self.port
            );
        }
    }

    fn try_spawn(&mut self) -> Spawned {
        let dir = self.dir.path().to_str().expect("utf-8 temp dir").to_owned();
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--dir", &dir, "--save", ""])
            .args(["--appendonly", if self.aof { "yes" } else { "no" }])
            .args(["--appendfsync", "always", "--daemonize", "no"])
            .args(["--logfile", &format!("{dir}/redis.log")])
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "failed to start redis-server ({e}); install it (apt-get install redis-server)"
                )
            });
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        let client = redis::Client::open(self.url()).expect("url");
        loop {
            let pong = client
                .get_connection_with_timeout(Duration::from_millis(200))
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
            if pong.is_ok() {
                return Spawned::Serving;
            }
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                self.child = None;
                let log =
                    std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(3).collect();
                return Spawned::Exited(format!("it exited ({status}): {tail:?}"));
            }
            assert!(
                Instant::now() < deadline,
                "private redis-server on port {} did not start: {pong:?}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// How a start of a private server went.
enum Spawned {
    /// It answers PING.
    Serving,
    /// It exited before serving (its port taken, say), with what it said.
    Exited(String),
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-9", &child.id().to_string()])
                .status();
            let _ = child.wait();
        }
    }
}

/// A loopback port from 56379 up that nothing listens on right now.
pub(crate) fn free_port() -> u16 {
    loop {
        let mut b = [0u8; 2];
        getrandom::fill(&mut b).expect("randomness");
        let port = 56379 + u16::from_be_bytes(b) % 2000;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

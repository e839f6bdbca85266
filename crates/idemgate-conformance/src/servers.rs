//! Private store servers for tests that kill or restart a store: their own processes on free
//! loopback ports, in temporary directories, stopped by their recorded pids. The shared servers of
//! the machine are never touched.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A PostgreSQL instance of a test's own, in a temporary directory, run as the `postgres` OS user
/// (Postgres refuses to run as root), fsync on. Dropping it SIGKILLs it. A running one can be
/// given streaming standbys of its own ([`start_standby`](Self::start_standby)).
pub struct PrivatePostgres {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    launchers: Vec<Child>,
}

/// The newest installed server's binaries (`/usr/lib/postgresql/<major>/bin`).
fn postgres_bin_dir() -> PathBuf {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|p| p.join("initdb").exists())
        .collect();
    found.sort();
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

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

impl PrivatePostgres {
    /// An empty temporary directory owned by the `postgres` OS user, not yet holding a cluster.
    fn empty() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("idemgate-private-pg")
            .tempdir()
            .expect("temp dir");
        run(
            Command::new("chown")
                .args(["-R", "postgres:"])
                .arg(dir.path()),
            "chown the temp dir to postgres",
        );
        PrivatePostgres {
            dir,
            bin: postgres_bin_dir(),
            port: free_port(),
            launchers: Vec::new(),
        }
    }

    /// Creates the cluster (`initdb`); [`start`](Self::start) runs it.
    ///
    /// # Panics
    /// When the server binaries are missing or `initdb` fails.
    #[must_use]
    pub fn init() -> Self {
        let pg = Self::empty();
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

    /// Its URL (database `postgres`).
    #[must_use]
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The directory of the server's binaries (`pg_receivewal`, `psql`, …).
    #[must_use]
    pub fn bin_dir(&self) -> &Path {
        &self.bin
    }

    /// Its port on 127.0.0.1.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The name a standby made by [`start_standby`](Self::start_standby) runs under
    /// (`cluster_name`), which is the `application_name` of its row in the primary's
    /// `pg_stat_replication`.
    #[must_use]
    pub fn standby_name(&self) -> String {
        format!("idemgate-standby-{}", self.port)
    }

    /// Runs `sql` with `psql` as the `postgres` role and returns its output, unaligned, tuples
    /// only (`a|b` per row).
    ///
    /// # Panics
    /// When `psql` fails (the message holds its output).
    #[must_use]
    pub fn psql(&self, sql: &str) -> String {
        let out = Command::new(self.bin.join("psql"))
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", "postgres", "-d", "postgres", "-c", sql])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("failed to run psql: {e}"));
        assert!(
            out.status.success(),
            "failed to run {sql:?}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Promotes this standby to a primary (`SELECT pg_promote(true, 60)`, which waits for the
    /// promotion) and waits (up to 60 s) until it is out of recovery (`pg_is_in_recovery()`
    /// false), so that it takes writes.
    ///
    /// # Panics
    /// When it is not a standby, or the promotion does not finish; the message holds its log.
    pub fn promote(&self) {
        let log = || std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default();
        let promoted = self.psql("SELECT pg_promote(true, 60)");
        assert_eq!(
            promoted,
            "t",
            "the standby on port {} was not promoted within 60 s; its log:\n{}",
            self.port,
            log()
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.psql("SELECT pg_is_in_recovery()") != "f" {
            assert!(
                Instant::now() < deadline,
                "the standby on port {} was still in recovery 60 s after its promotion; its log:\n{}",
                self.port,
                log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends `signal` (`STOP`, `CONT`) to the walsender of this running instance that streams to
    /// the standby `name` (its `pg_stat_replication` row): stopped, it sends that standby nothing
    /// more, as a stalled standby or link would, and commits that wait for the standby go on
    /// waiting. The pid is signalled only when it is a child of this instance's postmaster.
    ///
    /// # Panics
    /// When no walsender streams to `name`, or `kill` fails.
    pub fn signal_walsender(&self, name: &str, signal: &str) {
        let row = self.psql(&format!(
            "SELECT pid FROM pg_stat_replication WHERE application_name = '{name}'"
        ));
        let pid: u32 = row.parse().unwrap_or_else(|_| {
            panic!("no walsender streams to {name} (pg_stat_replication: {row:?})")
        });
        let ours = self
            .postmaster_pid()
            .is_some_and(|pm| children_of(pm).contains(&pid));
        assert!(
            ours,
            "pid {pid} is not a walsender of this instance's postmaster"
        );
        run(
            Command::new("kill")
                .arg(format!("-{signal}"))
                .arg(pid.to_string()),
            &format!("send SIG{signal} to the walsender {pid}"),
        );
    }

    /// Makes a streaming standby of this running instance (`pg_basebackup -R -X stream` into a
    /// temporary directory of its own), starts it on its own free port, and waits (up to 30 s)
    /// until this instance's `pg_stat_replication` shows it streaming, under
    /// [`standby_name`](Self::standby_name), and it has reported its flush position (until then
    /// Postgres shows even a synchronous standby as `async`). Whether commits wait for it is this instance's
    /// `synchronous_standby_names` (see [`start_with`](Self::start_with)). Dropping it SIGKILLs it.
    ///
    /// # Panics
    /// When the base backup fails, or the standby does not come up or stream.
    #[must_use]
    pub fn start_standby(&self) -> PrivatePostgres {
        let mut standby = Self::empty();
        run(
            Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(self.bin.join("pg_basebackup"))
                .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
                .args(["-U", "postgres", "-R", "-X", "stream", "--checkpoint=fast"])
                .arg("-D")
                .arg(standby.data()),
            "pg_basebackup a standby",
        );
        let name = standby.standby_name();
        standby.start_with(&[("cluster_name", &name)]);
        let deadline = Instant::now() + Duration::from_secs(30);
        let streaming = format!(
            "SELECT count(*) FROM pg_stat_replication \
             WHERE application_name = '{name}' AND state = 'streaming' \
             AND flush_lsn IS NOT NULL"
        );
        while self.psql(&streaming) != "1" {
            assert!(
                Instant::now() < deadline,
                "the standby {name} did not stream within 30 s; its log:\n{}",
                std::fs::read_to_string(standby.dir.path().join("log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        standby
    }

    /// Starts the postmaster and waits (up to 30 s) until it accepts connections.
    ///
    /// # Panics
    /// When it does not come up; the message holds its log.
    pub fn start(&mut self) {
        self.start_with(&[]);
    }

    /// As [`start`](Self::start), with server settings on top (`-c name=value` each, such as
    /// `("synchronous_standby_names", "*")`), for this run only.
    ///
    /// # Panics
    /// When it does not come up; the message holds its log.
    pub fn start_with(&mut self, settings: &[(&str, &str)]) {
        let log_path = self.dir.path().join("log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
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
            .args(
                settings
                    .iter()
                    .flat_map(|(name, value)| ["-c".to_owned(), format!("{name}={value}")]),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .expect("start postgres");
        self.launchers.push(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = Command::new(self.bin.join("pg_isready"))
                .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string()])
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "private postgres did not start; log:\n{}",
                std::fs::read_to_string(&log_path).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
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

    /// SIGKILLs the postmaster and all its children at once, as a machine crash would, and waits
    /// until they are gone.
    pub fn kill9(&mut self) {
        let Some(pm) = self.postmaster_pid() else {
            return;
        };
        let mut pids = children_of(pm);
        pids.push(pm);
        // Positive pids only, each checked above to be ours (a negative one means every process).
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

impl Drop for PrivatePostgres {
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

//! A private Redis Cluster of three masters on free loopback ports, for tests.
//!
//! Each node is its own `redis-server` process (append-only file, `appendfsync everysec`), started
//! under a small `sh` keeper that holds the node's pid and kills exactly that pid when the test
//! process ends, however it ends (its stdin is a pipe from the test process; end of file is the
//! signal), then deletes the node's directory. Dropping a [`PrivateCluster`] kills the nodes at
//! once by their recorded pids.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

/// One node: its keeper shell, the keeper's stdin (closing it stops the node) and the node's pid.
struct Node {
    port: u16,
    pid: u32,
    keeper: Child,
    stdin: Option<ChildStdin>,
}

/// A running three-master cluster.
pub(crate) struct PrivateCluster {
    nodes: Vec<Node>,
}

impl PrivateCluster {
    /// Starts three masters, joins them with `redis-cli --cluster create`, and waits until every
    /// node reports `cluster_state:ok`. `extra` settings go to every node's command line.
    pub(crate) fn start(extra: &[&str]) -> Self {
        let mut cluster = PrivateCluster { nodes: Vec::new() };
        for _ in 0..3 {
            cluster.nodes.push(start_node(extra));
        }
        let addrs: Vec<String> = cluster
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create {addrs:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        for node in &cluster.nodes {
            let client = redis::Client::open(format!("redis://127.0.0.1:{}", node.port)).unwrap();
            loop {
                let info = client
                    .get_connection_with_timeout(Duration::from_millis(500))
                    .and_then(|mut c| redis::cmd("CLUSTER").arg("INFO").query::<String>(&mut c));
                if info
                    .as_deref()
                    .is_ok_and(|i| i.contains("cluster_state:ok"))
                {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "cluster node {} did not reach cluster_state:ok: {info:?}",
                    node.port
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        cluster
    }

    /// `redis+cluster://` URL naming every node.
    pub(crate) fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// The `redis://` URL of each node.
    pub(crate) fn node_urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}", n.port))
            .collect()
    }

    /// The ports of the nodes.
    pub(crate) fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            // Only the pid this keeper reported for the server it started, and only while the
            // keeper still runs (so the pid cannot have been reused by another process yet).
            if matches!(node.keeper.try_wait(), Ok(None)) {
                let _ = Command::new("kill")
                    .args(["-9", &node.pid.to_string()])
                    .status();
            }
            drop(node.stdin.take());
            let _ = node.keeper.wait();
        }
    }
}

/// Starts one cluster-enabled node under its keeper and waits until it answers `PING`.
fn start_node(extra: &[&str]) -> Node {
    let dir = tempfile::tempdir().expect("temp dir").keep();
    let dir = dir.to_str().expect("utf-8 temp dir").to_owned();
    let (port, bus) = free_ports();
    let mut args: Vec<String> = [
        "--bind",
        "127.0.0.1",
        "--port",
        &port.to_string(),
        "--cluster-enabled",
        "yes",
        "--cluster-port",
        &bus.to_string(),
        "--cluster-config-file",
        &format!("{dir}/nodes.conf"),
        "--cluster-node-timeout",
        "5000",
        "--dir",
        &dir,
        "--save",
        "",
        "--appendonly",
        "yes",
        "--appendfsync",
        "everysec",
        "--daemonize",
        "no",
        "--logfile",
        &format!("{dir}/redis.log"),
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    // The keeper: starts the server, reports its pid, waits for end of file on stdin (the test
    // process closed it or ended), then kills that pid and removes the directory.
    let script = r#"redis-server "$@" </dev/null >/dev/null 2>&1 &
pid=$!
echo "$pid"
cat >/dev/null
kill -9 "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
rm -rf "$KEEPER_DIR"
"#;
    let mut keeper = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("keeper")
        .args(&args)
        .env("KEEPER_DIR", &dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("failed to start sh for redis-server ({e})"));
    let mut line = String::new();
    BufReader::new(keeper.stdout.take().expect("keeper stdout"))
        .read_line(&mut line)
        .expect("read the node's pid");
    let pid: u32 = line
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("keeper reported no pid: {line:?}"));
    let node = Node {
        port,
        pid,
        stdin: keeper.stdin.take(),
        keeper,
    };
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).expect("url");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let pong = client
            .get_connection_with_timeout(Duration::from_millis(200))
            .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
        if pong.is_ok() {
            return node;
        }
        assert!(
            Instant::now() < deadline,
            "cluster node on port {port} did not start (redis-server installed? see {dir}/redis.log): {pong:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A client port from 42000 up and a cluster-bus port from 47000 up that nothing listens on
/// right now.
fn free_ports() -> (u16, u16) {
    let pick = |base: u16| loop {
        let mut b = [0u8; 2];
        getrandom::fill(&mut b).expect("randomness");
        let port = base + u16::from_be_bytes(b) % 5000;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    };
    (pick(42000), pick(47000))
}

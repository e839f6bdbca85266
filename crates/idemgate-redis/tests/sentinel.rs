//! The store behind Redis Sentinel, through a failover, in network namespaces this test makes
//! (needs root and `ip`; it fails loudly without them).
//!
//! Each round builds its own lab: a bridge in a hub namespace, and one namespace each (veth to
//! the bridge, addresses in 10.77.0.0/24, traffic only inside the lab) for the primary, its
//! replica, three sentinels and the client. Every server is its own `redis-server` process,
//! recorded by pid. The client (this process, on a thread moved into the client namespace) drives
//! calls through the engine with `wait_replicas=1` all along, while the test partitions the
//! primary from the replica and the sentinels for 8 s (unreachable routes both ways; the client
//! still reaches the old primary, the worst case for acknowledged writes), so the sentinels
//! promote the replica; then it heals, and the sentinels turn the old primary into a replica.
//!
//! Asserted: the failover happened, no acknowledged completion is lost (every call answered
//! executed-and-stored or replayed has a completed record on the new primary), and no side effect
//! ran twice. Printed: the share of calls that failed closed. `IDEMGATE_SENTINEL_ROUNDS` sets
//! the number of rounds (default 2; scripts/chaos-redis-sentinel runs 20). Namespaces and
//! processes are removed by a guard, also when the test fails.

use std::collections::HashMap;
use std::fs::File;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idemgate_core::{
    Call, Decision, Effect, Engine, IdempotencyKey, Key, Recording, State, Store, TenantId,
    ToolName,
};
use idemgate_redis::RedisStore;

const PRIMARY: &str = "10.77.0.1";
const REPLICA: &str = "10.77.0.2";
const SENTINELS: [&str; 3] = ["10.77.0.11", "10.77.0.12", "10.77.0.13"];
const CLIENT: &str = "10.77.0.100";
const SERVICE: &str = "mymaster";

/// Runs `ip` with `args`, failing the test with its output when it fails.
fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("failed to run ip ({e}); this test needs iproute2 and root"));
    assert!(
        out.status.success(),
        "ip {} failed: {} (this test needs root to make network namespaces)",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One lab: its namespaces and processes, removed on drop.
struct Lab {
    id: String,
    namespaces: Vec<String>,
    procs: Vec<(String, Child)>,
    dir: tempfile::TempDir,
}

impl Lab {
    fn ns(&self, role: &str) -> String {
        format!("ig{}{role}", self.id)
    }

    fn build() -> Lab {
        let mut b = [0u8; 3];
        getrandom::fill(&mut b).expect("randomness");
        let mut lab = Lab {
            id: idemgate_core::key::hex(&b),
            namespaces: Vec::new(),
            procs: Vec::new(),
            dir: tempfile::tempdir().expect("temp dir"),
        };
        let hub = lab.ns("h");
        ip(&["netns", "add", &hub]);
        lab.namespaces.push(hub.clone());
        ip(&["-n", &hub, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &hub, "link", "set", "br0", "up"]);
        let members = [
            ("p", PRIMARY),
            ("r", REPLICA),
            ("s1", SENTINELS[0]),
            ("s2", SENTINELS[1]),
            ("s3", SENTINELS[2]),
            ("c", CLIENT),
        ];
        for (role, addr) in members {
            let ns = lab.ns(role);
            ip(&["netns", "add", &ns]);
            lab.namespaces.push(ns.clone());
            let peer = format!("v{role}");
            ip(&[
                "-n", &ns, "link", "add", "eth0", "type", "veth", "peer", "name", &peer, "netns",
                &hub,
            ]);
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                "eth0",
            ]);
            ip(&["-n", &ns, "link", "set", "eth0", "up"]);
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
            ip(&["-n", &hub, "link", "set", &peer, "master", "br0", "up"]);
        }
        lab
    }

    fn path(&self, name: &str) -> String {
        let p = self.dir.path().join(name);
        std::fs::create_dir_all(&p).expect("dir");
        p.to_str().expect("utf-8").to_owned()
    }

    /// Starts `redis-server args` in the namespace of `role` and records its pid (`ip netns exec`
    /// execs it, so the child is the server).
    fn spawn(&mut self, role: &str, args: &[String]) {
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns(role), "redis-server"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server in its namespace");
        self.procs.push((role.to_owned(), child));
    }

    fn start_data_node(
        &mut self,
        role: &str,
        addr: &str,
        replica_of: Option<&str>,
        extra: &[&str],
    ) {
        let dir = self.path(role);
        let mut args: Vec<String> = [
            "--bind",
            addr,
            "--port",
            "6379",
            "--protected-mode",
            "no",
            "--dir",
            &dir,
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "everysec",
            "--logfile",
            &format!("{dir}/redis.log"),
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        if let Some(primary) = replica_of {
            args.extend([
                "--replicaof".to_owned(),
                primary.to_owned(),
                "6379".to_owned(),
            ]);
        }
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        self.spawn(role, &args);
    }

    fn start_sentinel(&mut self, role: &str, addr: &str) {
        let dir = self.path(role);
        let conf = format!("{dir}/sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port 26379\nbind {addr}\nprotected-mode no\ndir {dir}\nlogfile {dir}/sentinel.log\n\
                 sentinel monitor {SERVICE} {PRIMARY} 6379 2\n\
                 sentinel down-after-milliseconds {SERVICE} 1000\n\
                 sentinel failover-timeout {SERVICE} 4000\n\
                 sentinel parallel-syncs {SERVICE} 1\n"
            ),
        )
        .expect("write sentinel.conf");
        self.spawn(role, &[conf, "--sentinel".to_owned()]);
    }

    /// `redis-cli` from the client namespace; its output, or `None` when it failed.
    fn cli(&self, host: &str, port: u16, args: &[&str]) -> Option<String> {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns("c"), "redis-cli", "-h", host])
            .args(["-p", &port.to_string()])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Waits for `what` with a generous deadline.
    fn wait_for(&self, what: &str, secs: u64, mut ok: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while !ok() {
            assert!(Instant::now() < deadline, "timed out waiting until {what}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The primary the sentinels name (by a majority of those answering).
    fn primary_by_sentinels(&self) -> Option<String> {
        let mut votes: HashMap<String, usize> = HashMap::new();
        for s in SENTINELS {
            if let Some(out) = self.cli(s, 26379, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE])
            {
                if let Some(host) = out.lines().next().filter(|h| !h.is_empty()) {
                    *votes.entry(host.to_owned()).or_default() += 1;
                }
            }
        }
        votes.into_iter().find(|(_, n)| *n >= 2).map(|(h, _)| h)
    }

    /// Cuts `a` and `b` apart (both directions), or joins them again.
    fn cut(&self, a: (&str, &str), b: (&str, &str), on: bool) {
        let verb = if on { "add" } else { "del" };
        ip(&[
            "-n",
            &self.ns(a.0),
            "route",
            verb,
            "unreachable",
            &format!("{}/32", b.1),
        ]);
        ip(&[
            "-n",
            &self.ns(b.0),
            "route",
            verb,
            "unreachable",
            &format!("{}/32", a.1),
        ]);
    }

    fn partition_primary(&self, on: bool) {
        let primary = ("p", PRIMARY);
        for other in [
            ("r", REPLICA),
            ("s1", SENTINELS[0]),
            ("s2", SENTINELS[1]),
            ("s3", SENTINELS[2]),
        ] {
            self.cut(primary, other, on);
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for (_, child) in &mut self.procs {
            // Only our own recorded pid, and only while it is still our unreaped child.
            if matches!(child.try_wait(), Ok(None)) {
                let _ = Command::new("kill")
                    .args(["-9", &child.id().to_string()])
                    .status();
            }
            let _ = child.wait();
        }
        for ns in self.namespaces.iter().rev() {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// What the client saw in one round.
#[derive(Debug, Default)]
struct Tally {
    calls: u64,
    /// Answered executed with the outcome stored, or replayed.
    acknowledged: u64,
    /// Refused or not recorded (reservation failed, outcome journaled or unrecorded, in flight).
    failed_closed: u64,
    lost: u64,
    doubles: u64,
    keys: u64,
    /// Why calls failed closed (the start of the answer), with counts.
    reasons: HashMap<String, u64>,
    /// When each call started and ended, and whether it was acknowledged.
    timeline: Vec<(Instant, Instant, bool)>,
    /// Calls started while the primary was cut off, and how many of them failed closed.
    partition_calls: u64,
    partition_failed: u64,
    /// Calls acknowledged before the heal that started after the cut.
    partition_acked_before_heal: u64,
}

/// The store's URL: through the sentinels, waiting for one replica unless `IDEMGATE_SENTINEL_NO_WAIT`
/// is set (the control run of scripts/chaos-redis-sentinel, which shows what the wait prevents).
fn store_url() -> String {
    let sentinels: Vec<String> = SENTINELS.iter().map(|s| format!("{s}:26379")).collect();
    let wait = if no_wait() {
        ""
    } else {
        "?wait_replicas=1&wait_timeout=500ms"
    };
    format!("redis+sentinel://{}/{SERVICE}{wait}", sentinels.join(","))
}

fn no_wait() -> bool {
    std::env::var_os("IDEMGATE_SENTINEL_NO_WAIT").is_some()
}

/// The asserting tests never run with the control's setting: they would check a store that
/// does not wait for its replica.
fn refuse_control_settings() {
    assert!(
        !no_wait(),
        "IDEMGATE_SENTINEL_NO_WAIT is for the ignored control test only \
         (control_failover_without_wait_reports_what_it_loses)"
    );
}

/// The control of scripts/chaos-redis-sentinel: the same failover with a store that does not
/// wait for its replica, which shows what the wait prevents. It reports (acknowledged writes Redis
/// lost, double executions) and asserts only that it ran: how much a failover without the wait
/// loses is chance, so it cannot be a pass or a failure.
#[test]
#[ignore = "the control run of scripts/chaos-redis-sentinel (IDEMGATE_SENTINEL_NO_WAIT=1): reports, checks no guarantee"]
fn control_failover_without_wait_reports_what_it_loses() {
    assert!(
        no_wait(),
        "run by scripts/chaos-redis-sentinel with IDEMGATE_SENTINEL_NO_WAIT=1"
    );
    let t = round(1, false);
    assert!(t.calls > 0, "the control round made no calls");
    println!(
        "SENTINEL-CONTROL calls={} acknowledged={} lost={} doubles={}",
        t.calls, t.acknowledged, t.lost, t.doubles
    );
}

/// The client side of a round, on a thread inside the client namespace: workers call with fresh
/// keys, retrying a key until it is answered, until `stop`; then every acknowledged key is looked
/// up on the (new) primary.
fn client(ns: String, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Tally> {
    std::thread::spawn(move || {
        let file = File::open(format!("/var/run/netns/{ns}")).expect("open the client namespace");
        nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET)
            .expect("enter the client namespace");
        // One thread: every socket of the store is made here, inside the namespace.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(drive(stop))
    })
}

async fn drive(stop: Arc<AtomicBool>) -> Tally {
    let store = RedisStore::connect(&store_url())
        .await
        .unwrap_or_else(|e| panic!("failed to open the store through the sentinels: {e}"));
    let engine = Arc::new(Engine::new(store.clone()));
    let executions: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let tally = Arc::new(Mutex::new(Tally::default()));
    let acked: Arc<Mutex<Vec<String>>> = Arc::default();
    let tenant = TenantId::new("chaos").unwrap();
    let tool = ToolName::new("charge").unwrap();
    let mut workers = Vec::new();
    for w in 0..8 {
        let (engine, executions, tally, acked, stop) = (
            engine.clone(),
            executions.clone(),
            tally.clone(),
            acked.clone(),
            stop.clone(),
        );
        let (tenant, tool) = (tenant.clone(), tool.clone());
        workers.push(tokio::spawn(async move {
            let mut n = 0;
            'keys: while !stop.load(Ordering::Relaxed) {
                n += 1;
                let name = format!("w{w}-{n}");
                tally.lock().unwrap().keys += 1;
                // A key whose reservation was left in flight by a write that failed closed stays
                // blocked until its lease ends (never re-run); after a few tries the worker moves
                // on to a fresh key, as a caller with a deadline would.
                for _ in 0..5 {
                    let call = Call::new(tenant.clone(), tool.clone())
                        .key(IdempotencyKey::new(name.clone()).unwrap());
                    let counter = executions.clone();
                    let started = Instant::now();
                    let key_name = name.clone();
                    let answer = engine
                        .call(call, || async move {
                            *counter.lock().unwrap().entry(key_name).or_default() += 1;
                            Effect::Success(b"charged".to_vec())
                        })
                        .await;
                    let ok = matches!(
                        answer.as_ref().map(|a| &a.decision),
                        Ok(Decision::Executed {
                            recording: Recording::Stored,
                            ..
                        }) | Ok(Decision::Replayed { .. })
                    );
                    {
                        let mut t = tally.lock().unwrap();
                        t.calls += 1;
                        t.timeline.push((started, Instant::now(), ok));
                        if ok {
                            t.acknowledged += 1;
                        } else {
                            t.failed_closed += 1;
                            let why = match &answer {
                                Ok(a) => format!("{:?}", a.decision),
                                Err(e) => e.to_string(),
                            };
                            let why: String = why.chars().take(100).collect();
                            *t.reasons.entry(why).or_default() += 1;
                        }
                    }
                    if ok {
                        acked.lock().unwrap().push(name.clone());
                        break;
                    }
                    if stop.load(Ordering::Relaxed) {
                        break 'keys;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                // Given up on (still counted for double executions).
            }
        }));
    }
    for w in workers {
        w.await.expect("worker");
    }
    let mut t = std::mem::take(&mut *tally.lock().unwrap());
    t.doubles = executions
        .lock()
        .unwrap()
        .values()
        .filter(|n| **n > 1)
        .count() as u64;
    let acked = std::mem::take(&mut *acked.lock().unwrap());
    for name in &acked {
        let key = Key::new(tenant.clone(), tool.clone(), name.parse().unwrap());
        let record = store
            .get(&key)
            .await
            .expect("read the record on the new primary");
        if !record.is_some_and(|r| r.state_name() == State::Completed) {
            if t.lost < 5 {
                println!("LOST acknowledged completion {name}");
            }
            t.lost += 1;
        }
    }
    t
}

/// One round. With `unsynced`, the primary holds back the replica's first full sync (diskless,
/// delayed an hour), so the sentinels promote a replica that never had any data.
fn round(n: u32, unsynced: bool) -> Tally {
    let mut lab = Lab::build();
    let hold_back: &[&str] = if unsynced {
        &[
            "--repl-diskless-sync",
            "yes",
            "--repl-diskless-sync-delay",
            "3600",
        ]
    } else {
        &[]
    };
    lab.start_data_node("p", PRIMARY, None, hold_back);
    lab.start_data_node("r", REPLICA, Some(PRIMARY), &[]);
    for (i, s) in SENTINELS.iter().enumerate() {
        lab.start_sentinel(&format!("s{}", i + 1), s);
    }
    if unsynced {
        lab.wait_for("the primary knows its waiting replica", 30, || {
            lab.cli(PRIMARY, 6379, &["INFO", "replication"])
                .is_some_and(|i| i.contains("connected_slaves:1"))
        });
    } else {
        lab.wait_for("the replica synced", 30, || {
            lab.cli(REPLICA, 6379, &["INFO", "replication"])
                .is_some_and(|i| i.contains("master_link_status:up"))
        });
    }
    lab.wait_for(
        "every sentinel knows the replica and the others",
        30,
        || {
            SENTINELS.iter().all(|s| {
                lab.cli(s, 26379, &["SENTINEL", "MASTER", SERVICE])
                    .is_some_and(|m| {
                        let v: Vec<&str> = m.lines().collect();
                        let field = |name: &str| {
                            v.iter()
                                .position(|l| *l == name)
                                .and_then(|i| v.get(i + 1))
                                .and_then(|x| x.parse::<u32>().ok())
                        };
                        field("num-slaves") == Some(1) && field("num-other-sentinels") == Some(2)
                    })
            })
        },
    );
    let stop = Arc::new(AtomicBool::new(false));
    let client = client(lab.ns("c"), stop.clone());
    std::thread::sleep(Duration::from_secs(2));
    if unsynced {
        assert!(
            lab.cli(REPLICA, 6379, &["INFO", "replication"])
                .is_some_and(|i| i.contains("master_link_status:down")),
            "the replica must still be waiting for its first sync"
        );
    }
    let started = Instant::now();
    lab.partition_primary(true);
    // The window of the partition counts from the last cut to the first heal (spawning `ip` takes
    // a while on a loaded machine).
    let cut = Instant::now();
    lab.wait_for("the sentinels promoted the replica", 60, || {
        lab.primary_by_sentinels().as_deref() == Some(REPLICA)
    });
    let promoted_after = started.elapsed();
    // Hold the partition for 8 s in all.
    std::thread::sleep(Duration::from_secs(8).saturating_sub(started.elapsed()));
    let healed = Instant::now();
    lab.partition_primary(false);
    lab.wait_for("the old primary follows the new one", 60, || {
        lab.cli(PRIMARY, 6379, &["INFO", "replication"])
            .is_some_and(|i| i.contains("role:slave") && i.contains("master_link_status:up"))
    });
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    let mut t = client.join().expect("the client thread panicked");
    for (at, done, ok) in &t.timeline {
        if (cut..healed).contains(at) {
            t.partition_calls += 1;
            t.partition_failed += u64::from(!ok);
            t.partition_acked_before_heal += u64::from(*ok && *done < healed);
        }
    }
    println!(
        "round {n}{}: promoted after {promoted_after:?}; {} calls on {} keys, {} acknowledged, \
         {} failed closed ({:.1}%), {} lost acknowledged completions, {} double executions",
        if unsynced {
            " (replica promoted before its first sync)"
        } else {
            ""
        },
        t.calls,
        t.keys,
        t.acknowledged,
        t.failed_closed,
        100.0 * t.failed_closed as f64 / t.calls.max(1) as f64,
        t.lost,
        t.doubles
    );
    println!(
        "  during the partition: {} calls, {} failed closed ({:.1}%), {} acknowledged before the heal",
        t.partition_calls,
        t.partition_failed,
        100.0 * t.partition_failed as f64 / t.partition_calls.max(1) as f64,
        t.partition_acked_before_heal
    );
    for (why, count) in &t.reasons {
        println!("  failed closed {count}x: {why}");
    }
    drop(lab);
    t
}

#[test]
fn a_replica_promoted_before_its_first_sync_loses_nothing_acknowledged() {
    refuse_control_settings();
    let t = round(1, true);
    assert_eq!(
        t.lost, 0,
        "acknowledged completions were lost (see the output above)"
    );
    assert_eq!(
        t.doubles, 0,
        "side effects ran twice (see the output above)"
    );
}

#[test]
fn failover_through_sentinel_loses_no_acknowledged_completion_and_runs_nothing_twice() {
    refuse_control_settings();
    let rounds: u32 = std::env::var("IDEMGATE_SENTINEL_ROUNDS")
        .ok()
        .map_or(2, |r| {
            r.parse().expect("IDEMGATE_SENTINEL_ROUNDS is a number")
        });
    let mut total = Tally::default();
    for n in 1..=rounds {
        let t = round(n, false);
        assert!(
            t.acknowledged > 0,
            "round {n}: nothing was acknowledged: {} calls, why: {:?}",
            t.calls,
            t.reasons
        );
        total.calls += t.calls;
        total.acknowledged += t.acknowledged;
        total.failed_closed += t.failed_closed;
        total.lost += t.lost;
        total.doubles += t.doubles;
        total.keys += t.keys;
        total.partition_calls += t.partition_calls;
        total.partition_failed += t.partition_failed;
    }
    println!(
        "SENTINEL-RESULT rounds={rounds} calls={} acknowledged={} failed_closed={} \
         failed_closed_share={:.1}% partition_calls={} partition_failed_closed_share={:.1}% \
         lost={} doubles={}",
        total.calls,
        total.acknowledged,
        total.failed_closed,
        100.0 * total.failed_closed as f64 / total.calls.max(1) as f64,
        total.partition_calls,
        100.0 * total.partition_failed as f64 / total.partition_calls.max(1) as f64,
        total.lost,
        total.doubles
    );
    assert_eq!(
        total.lost, 0,
        "acknowledged completions were lost (see the output above)"
    );
    assert_eq!(
        total.doubles, 0,
        "side effects ran twice (see the output above)"
    );
}

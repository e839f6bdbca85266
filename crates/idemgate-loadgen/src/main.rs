#![doc = include_str!("../README.md")]

use std::fmt::Write as _;
use std::net::{SocketAddr, TcpListener as StdTcpListener};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context as _, Result};
use axum::body::Bytes;
use axum::http::header::CONTENT_TYPE;
use axum::routing::post;
use axum::Router;
use clap::{Parser, ValueEnum};
use sha2::{Digest as _, Sha256};

const ABOUT: &str =
    "Load benchmark of the idemgate HTTP gateway: direct upstream vs fresh keys vs replays.";

const LONG_ABOUT: &str = "\
Load benchmark of the idemgate HTTP gateway, measured in one run on one machine.

It starts a fake upstream (an in-process axum server answering POST /charge) and an `idemgate serve`
process (spawned from --gateway-bin with a generated config: one tenant, one forwarded write tool
`charge` pointing at the upstream, the store from --store or a fresh SQLite file in a temp dir).
Then, for each phase, --concurrency clients send requests back to back for --warmup (not counted)
plus --duration (measured):

  direct   POST straight to the upstream (the baseline)
  fresh    POST /v1/tools/charge/call through the gateway, a new Idempotency-Key per request
           (reserve, forward, store the answer)
  replay   the same through the gateway with keys completed beforehand (the stored answer comes
           back; the upstream is not called)
  storm    all clients meet at a barrier before every key and send it at once: one executes,
           the others find it in flight and wait; the latencies shown are how long after the
           winner's answer each loser got its own (a lost wake-up shows as a polling interval),
           and its requests and req/s count those losers; a key executed other than once
           counts as an error. Give the upstream a delay (--upstream-delay 2ms) so that the
           losers find the key in flight

It prints requests/s, p50 and p99 latency per phase and the latency the gateway adds over direct.
A request that fails, or whose Idempotent-Replayed header is not what the phase expects, counts as
an error, not as a latency sample. The run stops by itself: every phase is bounded in time, every
request has a timeout, and the gateway process is stopped at the end (also on Ctrl-C).

The client, the gateway and the upstream share this machine's cores, so absolute figures are lower
bounds; compare phases of the same run. Build both in release mode for meaningful numbers.";

const EXAMPLES: &str = "\
Examples:
  cargo build --release -p idemgate-cli -p idemgate-loadgen
  target/release/idemgate-loadgen                       # 32 clients, 1 s warm-up + 5 s per phase
  target/release/idemgate-loadgen -c 64 -d 10s --store postgres://postgres@127.0.0.1:5432/test
  target/release/idemgate-loadgen --phases direct,replay --upstream-delay 2ms --json
  target/release/idemgate-loadgen -c 16 --phases storm --upstream-delay 2ms";

#[derive(Debug, Parser)]
#[command(
    name = "idemgate-loadgen",
    version,
    about = ABOUT,
    long_about = LONG_ABOUT,
    after_help = EXAMPLES
)]
struct Args {
    /// Concurrent HTTP clients (each sends its next request when the previous one is answered).
    #[arg(long, short = 'c', default_value_t = 32)]
    concurrency: usize,

    /// How long each phase is measured.
    #[arg(long, short = 'd', default_value = "5s", value_parser = humantime::parse_duration)]
    duration: Duration,

    /// Warm-up before each phase's measurement (requests sent, not counted).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    warmup: Duration,

    /// The phases to run, in order.
    #[arg(long, value_delimiter = ',', default_value = "direct,fresh,replay")]
    phases: Vec<Phase>,

    /// The `idemgate` binary to spawn. Default: `idemgate` beside this binary, else on PATH.
    #[arg(long, env = "IDEMGATE_BIN", value_name = "PATH")]
    gateway_bin: Option<PathBuf>,

    /// The gateway's store URL (sqlite://, postgres://, redis://, memory:). Default: a fresh SQLite
    /// file in a temporary directory.
    #[arg(long, value_name = "URL")]
    store: Option<String>,

    /// Bytes of padding in each request's JSON arguments.
    #[arg(long, default_value_t = 128)]
    payload_bytes: usize,

    /// How long the fake upstream works on each request before it answers.
    #[arg(long, default_value = "0ms", value_parser = humantime::parse_duration)]
    upstream_delay: Duration,

    /// Keys completed before the replay phase, which its clients then cycle through.
    #[arg(long, default_value_t = 2000)]
    replay_keys: usize,

    /// Timeout of a single request.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    request_timeout: Duration,

    /// How long to wait for the gateway to answer /healthz after it was started.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    startup_timeout: Duration,

    /// Also print one JSON object per phase and one with the comparison.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Phase {
    /// Straight to the upstream.
    Direct,
    /// Through the gateway, a new key per request.
    Fresh,
    /// Through the gateway, keys completed beforehand.
    Replay,
    /// Through the gateway, every client on the same key at once, key after key.
    Storm,
}

impl Phase {
    fn label(self) -> &'static str {
        match self {
            Phase::Direct => "direct (upstream)",
            Phase::Fresh => "gateway, fresh keys",
            Phase::Replay => "gateway, replays",
            Phase::Storm => "storm, losers' lateness",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Phase::Direct => "direct",
            Phase::Fresh => "fresh",
            Phase::Replay => "replay",
            Phase::Storm => "storm",
        }
    }
}

const TENANT: &str = "loadgen";
const TOOL: &str = "charge";

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("idemgate-loadgen: failed to start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        // Everything is bounded: phases, startup, the replay seeding, and a margin for teardown.
        let phases = u32::try_from(args.phases.len()).unwrap_or(u32::MAX);
        let budget = args.startup_timeout
            + (args.warmup + args.duration + args.request_timeout) * phases
            + args.request_timeout * 4
            + Duration::from_secs(60);
        tokio::select! {
            r = tokio::time::timeout(budget, run(args)) => match r {
                Ok(r) => r,
                Err(_) => Err(anyhow::anyhow!("gave up after {}", humantime::format_duration(budget))),
            },
            _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        }
    });
    // Dropping the runtime drops the gateway child, which kills it if it still runs.
    drop(runtime);
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("idemgate-loadgen: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<()> {
    if args.concurrency == 0 {
        bail!("--concurrency must be at least 1");
    }
    if args.duration.is_zero() {
        bail!("--duration must be more than 0");
    }
    let upstream = start_upstream(args.upstream_delay).await?;
    let needs_gateway = args.phases.iter().any(|p| *p != Phase::Direct);
    let dir = tempfile::tempdir().context("failed to create a temporary directory")?;
    let token = format!("loadgen-{:x}", unique());
    let gateway = if needs_gateway {
        Some(Gateway::start(&args, dir.path(), upstream, &token).await?)
    } else {
        None
    };

    let client = idemgate_kit::tls::client_builder()
        .pool_max_idle_per_host(args.concurrency)
        .tcp_nodelay(true)
        .timeout(args.request_timeout)
        .build()
        .context("failed to build the HTTP client")?;
    let target = Target {
        client,
        upstream: format!("http://{upstream}/charge"),
        gateway: gateway
            .as_ref()
            .map(|g| format!("http://{}/v1/tools/{TOOL}/call", g.addr))
            .unwrap_or_default(),
        auth: format!("Bearer {token}"),
        pad: "x".repeat(args.payload_bytes),
        run: format!("{:x}", unique()),
    };
    let target = Arc::new(target);

    println!(
        "idemgate-loadgen: {} clients, {} warm-up + {} measured per phase, {} B padding, upstream delay {}",
        args.concurrency,
        humantime::format_duration(args.warmup),
        humantime::format_duration(args.duration),
        args.payload_bytes,
        humantime::format_duration(args.upstream_delay),
    );
    if let Some(g) = &gateway {
        println!(
            "gateway: {} ({}), store {}",
            g.bin.display(),
            g.addr,
            g.store
        );
    }
    if cfg!(debug_assertions) {
        println!(
            "note: this load generator is a debug build; use --release for meaningful figures"
        );
    }

    let mut results: Vec<(Phase, Stats)> = Vec::new();
    for &phase in &args.phases {
        if phase == Phase::Replay {
            seed_replays(&target, args.replay_keys.max(1), args.concurrency).await?;
        }
        let stats = run_phase(phase, &target, &args).await;
        println!(
            "  {:<22} done: {} ok, {} errors",
            phase.label(),
            stats.ok(),
            stats.errors
        );
        results.push((phase, stats));
    }

    print_report(&results, &args);
    if let Some(g) = gateway {
        g.stop().await;
    }
    if results.iter().any(|(_, s)| s.ok() == 0) {
        bail!("a phase had no successful request");
    }
    Ok(())
}

// ---- the fake upstream ---------------------------------------------------------------------------

async fn start_upstream(delay: Duration) -> Result<SocketAddr> {
    let served = Arc::new(AtomicU64::new(0));
    let app = Router::new().route(
        "/charge",
        post(move |body: Bytes| {
            let served = Arc::clone(&served);
            async move {
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                let n = served.fetch_add(1, Ordering::Relaxed) + 1;
                (
                    [(CONTENT_TYPE, "application/json")],
                    format!("{{\"charged\":true,\"n\":{n},\"bytes\":{}}}", body.len()),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("failed to bind the upstream")?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            eprintln!("idemgate-loadgen: upstream stopped: {e}");
        }
    });
    Ok(addr)
}

// ---- the gateway process -------------------------------------------------------------------------

struct Gateway {
    child: tokio::process::Child,
    addr: SocketAddr,
    bin: PathBuf,
    store: String,
    log: PathBuf,
}

impl Gateway {
    async fn start(args: &Args, dir: &Path, upstream: SocketAddr, token: &str) -> Result<Gateway> {
        let bin = match &args.gateway_bin {
            Some(b) => b.clone(),
            None => default_gateway_bin(),
        };
        let addr = free_port()?;
        let store = args
            .store
            .clone()
            .unwrap_or_else(|| format!("sqlite://{}", dir.join("idem.db").display()));
        let config = format!(
            "[server]\n\
             listen = \"{addr}\"\n\
             store = \"{store}\"\n\
             journal = \"{journal}\"\n\
             request_timeout = \"{timeout}s\"\n\
             \n\
             [[tenants]]\n\
             id = \"{TENANT}\"\n\
             token_sha256 = \"{hash}\"\n\
             \n\
             [tools.{TOOL}]\n\
             upstream = \"http://{upstream}/charge\"\n\
             ttl = \"1h\"\n",
            journal = dir.join("journal").display(),
            timeout = args.request_timeout.as_secs().max(1),
            hash = sha256_hex(token),
        );
        let config_path = dir.join("idemgate.toml");
        std::fs::write(&config_path, config).context("failed to write the gateway config")?;
        let log = dir.join("gateway.log");
        let out = std::fs::File::create(&log).context("failed to create the gateway log")?;
        let err = out.try_clone()?;
        let child = tokio::process::Command::new(&bin)
            .arg("serve")
            .arg("--config")
            .arg(&config_path)
            .env("XDG_DATA_HOME", dir.join("data"))
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("failed to start {} serve", bin.display()))?;
        let mut gateway = Gateway {
            child,
            addr,
            bin,
            store,
            log,
        };
        gateway.wait_healthy(args.startup_timeout).await?;
        Ok(gateway)
    }

    async fn wait_healthy(&mut self, within: Duration) -> Result<()> {
        let client = idemgate_kit::tls::client_builder()
            .timeout(Duration::from_secs(1))
            .build()?;
        let url = format!("http://{}/healthz", self.addr);
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "the gateway exited with {status} before it served:\n{}",
                    log_tail(&self.log)
                );
            }
            if let Ok(r) = client.get(&url).send().await {
                if r.status().is_success() {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!(
            "the gateway did not answer {url} within {}:\n{}",
            humantime::format_duration(within),
            log_tail(&self.log)
        )
    }

    /// SIGTERM (graceful), then SIGKILL after 10 s.
    async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            let _ = tokio::process::Command::new("kill")
                .arg("-TERM")
                .arg(pid.to_string())
                .status()
                .await;
        }
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

fn default_gateway_bin() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("idemgate")))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("idemgate"))
}

fn free_port() -> Result<SocketAddr> {
    let l = StdTcpListener::bind("127.0.0.1:0").context("failed to find a free port")?;
    Ok(l.local_addr()?)
}

fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

fn sha256_hex(s: &str) -> String {
    let digest = Sha256::digest(s.as_bytes());
    let mut out = String::with_capacity(64);
    for b in digest {
        let _ = write!(out, "{b:02x}");
    }
    out
}

fn unique() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default()
        ^ u128::from(std::process::id())
}

// ---- the load ------------------------------------------------------------------------------------

struct Target {
    client: reqwest::Client,
    upstream: String,
    gateway: String,
    auth: String,
    pad: String,
    run: String,
}

impl Target {
    fn body(&self, order: &str) -> String {
        format!(
            "{{\"order\":\"{order}\",\"amount\":\"19.99\",\"pad\":\"{}\"}}",
            self.pad
        )
    }

    fn direct(&self, order: &str) -> reqwest::RequestBuilder {
        self.client
            .post(&self.upstream)
            .header(CONTENT_TYPE, "application/json")
            .body(self.body(order))
    }

    fn through_gateway(&self, key: &str) -> reqwest::RequestBuilder {
        self.client
            .post(&self.gateway)
            .header(CONTENT_TYPE, "application/json")
            .header("authorization", &self.auth)
            .header("idempotency-key", key)
            .body(self.body(key))
    }

    fn replay_key(&self, i: usize) -> String {
        format!("lg-{}-replay-{i}", self.run)
    }
}

/// Completes `n` keys (through the gateway) for the replay phase to cycle through.
async fn seed_replays(target: &Arc<Target>, n: usize, concurrency: usize) -> Result<()> {
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..concurrency.min(n) {
        let target = Arc::clone(target);
        let next = Arc::clone(&next);
        tasks.push(tokio::spawn(async move {
            loop {
                let i = usize::try_from(next.fetch_add(1, Ordering::Relaxed)).unwrap_or(usize::MAX);
                if i >= n {
                    return Ok::<(), anyhow::Error>(());
                }
                let key = target.replay_key(i);
                let r = target.through_gateway(&key).send().await?;
                if !r.status().is_success() {
                    let status = r.status();
                    let text = r.text().await.unwrap_or_default();
                    bail!("seeding replay key {i} failed: {status} {text}");
                }
                r.bytes().await?;
            }
        }));
    }
    for t in tasks {
        t.await.context("a seeding task panicked")??;
    }
    Ok(())
}

async fn run_phase(phase: Phase, target: &Arc<Target>, args: &Args) -> Stats {
    if phase == Phase::Storm {
        return run_storm(target, args).await;
    }
    let start = Instant::now();
    let measure_from = start + args.warmup;
    let end = measure_from + args.duration;
    let replay_keys = args.replay_keys.max(1);
    let concurrency = args.concurrency;
    let mut tasks = Vec::with_capacity(concurrency);
    for worker in 0..concurrency {
        let target = Arc::clone(target);
        tasks.push(tokio::spawn(async move {
            let mut stats = Stats::default();
            let mut i: usize = 0;
            loop {
                let t0 = Instant::now();
                if t0 >= end {
                    break;
                }
                let (request, expect_replayed) = match phase {
                    Phase::Direct => (target.direct(&format!("{worker}-{i}")), None),
                    Phase::Fresh => (
                        target.through_gateway(&format!("lg-{}-fresh-{worker}-{i}", target.run)),
                        Some("false"),
                    ),
                    Phase::Replay => (
                        target.through_gateway(
                            &target.replay_key((worker + i * concurrency) % replay_keys),
                        ),
                        Some("true"),
                    ),
                    Phase::Storm => unreachable!("run_storm runs the storm phase"),
                };
                let ok = match request.send().await {
                    Ok(r) => {
                        let good = r.status().is_success()
                            && expect_replayed.is_none_or(|want| {
                                r.headers()
                                    .get("idempotent-replayed")
                                    .and_then(|v| v.to_str().ok())
                                    == Some(want)
                            });
                        r.bytes().await.is_ok() && good
                    }
                    Err(_) => false,
                };
                let elapsed = t0.elapsed();
                if t0 >= measure_from {
                    if ok {
                        stats
                            .latencies
                            .push(u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX));
                    } else {
                        stats.errors += 1;
                    }
                }
                i += 1;
            }
            stats
        }));
    }
    let mut all = Stats::default();
    for t in tasks {
        match t.await {
            Ok(s) => all.merge(s),
            Err(_) => all.errors += 1,
        }
    }
    all.window = end.saturating_duration_since(measure_from);
    all.latencies.sort_unstable();
    all
}

/// The storm phase: `--concurrency` clients meet at a barrier before each key and send it at
/// once. Its samples are the losers' lateness after the winner's answer; its errors, failed
/// requests and keys not executed exactly once.
async fn run_storm(target: &Arc<Target>, args: &Args) -> Stats {
    let start = Instant::now();
    let measure_from = start + args.warmup;
    let end = measure_from + args.duration;
    let clients = args.concurrency;
    let barrier = Arc::new(tokio::sync::Barrier::new(clients));
    let mut all = Stats::default();
    let mut key = 0usize;
    // The clients go key by key together; the first key started at or after `end` is not sent.
    loop {
        let t0 = Instant::now();
        if t0 >= end {
            break;
        }
        let name = format!("lg-{}-storm-{key}", target.run);
        let mut tasks = Vec::with_capacity(clients);
        for _ in 0..clients {
            let (target, barrier, name) = (Arc::clone(target), Arc::clone(&barrier), name.clone());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                let answered = match target.through_gateway(&name).send().await {
                    Ok(r) if r.status().is_success() => {
                        let replayed = r
                            .headers()
                            .get("idempotent-replayed")
                            .and_then(|v| v.to_str().ok())
                            .map(|v| v == "true");
                        r.bytes().await.ok().and(replayed)
                    }
                    _ => None,
                };
                (Instant::now(), answered)
            }));
        }
        let mut ends = Vec::with_capacity(clients);
        for t in tasks {
            ends.push(t.await.unwrap_or((Instant::now(), None)));
        }
        if t0 >= measure_from {
            let failed = ends.iter().filter(|(_, a)| a.is_none()).count() as u64;
            let winners: Vec<Instant> = ends
                .iter()
                .filter(|(_, a)| *a == Some(false))
                .map(|(at, _)| *at)
                .collect();
            all.errors += failed;
            if let [winner] = winners[..] {
                for (at, a) in &ends {
                    if *a == Some(true) {
                        let late = at.saturating_duration_since(winner);
                        all.latencies
                            .push(u64::try_from(late.as_nanos()).unwrap_or(u64::MAX));
                    }
                }
            } else {
                all.errors += 1;
            }
        }
        key += 1;
    }
    all.window = end.saturating_duration_since(measure_from);
    all.latencies.sort_unstable();
    all
}

#[derive(Default)]
struct Stats {
    latencies: Vec<u64>,
    errors: u64,
    window: Duration,
}

impl Stats {
    fn merge(&mut self, other: Stats) {
        self.latencies.extend(other.latencies);
        self.errors += other.errors;
    }

    fn ok(&self) -> usize {
        self.latencies.len()
    }

    fn rate(&self) -> f64 {
        self.ok() as f64 / self.window.as_secs_f64().max(1e-9)
    }

    /// The `p`-th percentile latency in milliseconds (latencies sorted).
    fn percentile_ms(&self, p: f64) -> f64 {
        if self.latencies.is_empty() {
            return f64::NAN;
        }
        let rank = ((p / 100.0) * (self.latencies.len() - 1) as f64).round() as usize;
        self.latencies[rank.min(self.latencies.len() - 1)] as f64 / 1e6
    }
}

fn print_report(results: &[(Phase, Stats)], args: &Args) {
    println!();
    println!(
        "{:<22} {:>9} {:>7} {:>11} {:>9} {:>9}",
        "phase", "requests", "errors", "req/s", "p50 ms", "p99 ms"
    );
    for (phase, s) in results {
        println!(
            "{:<22} {:>9} {:>7} {:>11.0} {:>9.3} {:>9.3}",
            phase.label(),
            s.ok(),
            s.errors,
            s.rate(),
            s.percentile_ms(50.0),
            s.percentile_ms(99.0)
        );
    }
    let find = |p: Phase| results.iter().find(|(q, _)| *q == p).map(|(_, s)| s);
    let mut comparison = serde_json::Map::new();
    let compared = find(Phase::Fresh).is_some() || find(Phase::Replay).is_some();
    if let Some(direct) = find(Phase::Direct).filter(|_| compared) {
        println!();
        println!("added by the gateway (vs direct, same run):");
        for phase in [Phase::Fresh, Phase::Replay] {
            if let Some(s) = find(phase) {
                let d50 = s.percentile_ms(50.0) - direct.percentile_ms(50.0);
                let d99 = s.percentile_ms(99.0) - direct.percentile_ms(99.0);
                let ratio = s.rate() / direct.rate().max(1e-9);
                println!(
                    "  {:<20} p50 {:+.3} ms, p99 {:+.3} ms, throughput {:.2}x of direct",
                    phase.label(),
                    d50,
                    d99,
                    ratio
                );
                comparison.insert(
                    phase.name().to_owned(),
                    serde_json::json!({
                        "added_p50_ms": d50, "added_p99_ms": d99, "throughput_ratio": ratio
                    }),
                );
            }
        }
    }
    if args.json {
        for (phase, s) in results {
            println!(
                "{}",
                serde_json::json!({
                    "phase": phase.name(),
                    "requests": s.ok(),
                    "errors": s.errors,
                    "seconds": s.window.as_secs_f64(),
                    "requests_per_second": s.rate(),
                    "p50_ms": s.percentile_ms(50.0),
                    "p99_ms": s.percentile_ms(99.0),
                    "concurrency": args.concurrency,
                })
            );
        }
        println!("{}", serde_json::json!({ "vs_direct": comparison }));
    }
}

//! The MCP proxy's cost: `tools/call` straight to a server vs through `idemgate mcp`, over stdio
//! and over Streamable HTTP, for fresh writes (a new key each call: reserve, run, record) and
//! replays (a key already recorded: answered from the store), at 1 and 16 concurrent callers, on
//! the SQLite default store, every combination in the same run, several rounds.
//!
//! The server is this binary itself (`--fixture-stdio`, `--fixture-http`): a Rust MCP server that
//! answers every call at once, so that what is measured is the proxy and not the server's jitter.
//! Direct over stdio is a client on the fixture's pipes; direct over HTTP is the fixture's own
//! Streamable HTTP endpoint (axum, JSON answers). Proxied over HTTP, the proxy's upstream is the
//! fixture over stdio (a child per session), so the HTTP figure includes that extra hop.
//!
//! Added latency is proxied minus direct, per round, for the same transport and callers; the
//! table shows the median over rounds with the min and max. The `engine` rows are the floor a
//! fresh write costs without any transport: the engine in this process on its own SQLite file
//! (reserve, run a no-op, record: two durable commits), at 1 and 16 concurrent callers.
//!
//! The peer: over HTTP, the same fixture behind `mcp-proxy` (PyPI), a proxy that serves a stdio
//! server over Streamable HTTP and passes every call through, when `IDEMGATE_BENCH_MCP_PROXY`
//! names its binary (scripts/bench-mcp installs a pinned one): what a hop that does nothing
//! costs, beside what idemgate's hop adds.
//!
//! The storm: 200 keys, each called by 16 callers released together through the proxy; how late
//! the losers hear of the winner's outcome (their replay's arrival minus the winner's answer),
//! p50, p99 and max, and how many keys had a loser later than 15 ms.
//!
//! Run with `scripts/bench-mcp [--rounds 5] [--calls 2000]` (or
//! `cargo bench -p idemgate-cli --bench mcp_proxy -- --rounds 5 --calls 2000`).

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::{Child, ChildStdin};
use tokio::sync::oneshot;

const IDEMGATE: &str = env!("CARGO_BIN_EXE_idemgate");
const KEY: &str = "dev.idemgate/idempotency-key";
/// Keys per storm (each with 16 callers).
const STORM_KEYS: usize = 200;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--fixture-stdio") {
        fixture_stdio();
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    if args.iter().any(|a| a == "--fixture-http") {
        rt.block_on(fixture_http());
        return;
    }
    let opt = |name: &str, default: usize| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map_or(default, |v| v.parse().expect("a number"))
    };
    rt.block_on(bench(opt("--rounds", 5), opt("--calls", 2000)));
}

// ---------------------------------------------------------------------------------------------
// The fixture server.

/// The answer to one frame (none for notifications).
fn answer(line: &str, calls: &AtomicU64) -> Option<String> {
    let v: Value = serde_json::from_str(line).ok()?;
    let id = v.get("id")?.clone();
    let result = match v.get("method")?.as_str()? {
        "initialize" => json!({"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                               "serverInfo": {"name": "bench", "version": "1"}}),
        "tools/list" => json!({"tools": [{"name": "write", "inputSchema": {"type": "object"}}]}),
        "tools/call" => {
            let n = calls.fetch_add(1, Ordering::Relaxed) + 1;
            json!({"content": [{"type": "text", "text": format!("done {n}")}]})
        }
        _ => json!({}),
    };
    Some(json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string())
}

fn fixture_stdio() {
    use std::io::{BufRead as _, Write as _};
    let calls = AtomicU64::new(0);
    let mut out = std::io::stdout().lock();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { return };
        if let Some(a) = answer(&line, &calls) {
            if writeln!(out, "{a}").and_then(|()| out.flush()).is_err() {
                return;
            }
        }
    }
}

async fn fixture_http() {
    use axum::http::{header, StatusCode};
    use axum::response::IntoResponse as _;
    let calls = Arc::new(AtomicU64::new(0));
    let app = axum::Router::new().route(
        "/mcp",
        axum::routing::post(move |body: String| {
            let calls = Arc::clone(&calls);
            async move {
                match answer(&body, &calls) {
                    Some(a) => (
                        [
                            (header::CONTENT_TYPE, "application/json"),
                            (header::HeaderName::from_static("mcp-session-id"), "bench"),
                        ],
                        a,
                    )
                        .into_response(),
                    None => StatusCode::ACCEPTED.into_response(),
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    println!("http://{}/mcp", listener.local_addr().unwrap());
    axum::serve(listener, app).await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// Clients.

type Waiters = Arc<Mutex<HashMap<u64, oneshot::Sender<String>>>>;

enum Conn {
    Stdio {
        _child: Child,
        stdin: tokio::sync::Mutex<ChildStdin>,
        waiters: Waiters,
    },
    Http {
        _child: Child,
        client: reqwest::Client,
        url: String,
        session: String,
    },
}

fn frame(id: u64, method: &str, params: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string()
}

fn call_frame(id: u64, key: &str) -> String {
    frame(
        id,
        "tools/call",
        json!({"name": "write", "arguments": {"n": 1}, "_meta": {KEY: key}}),
    )
}

const INIT: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}}"#;
const INITIALIZED: &str = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;

impl Conn {
    async fn stdio(mut cmd: tokio::process::Command) -> Conn {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let waiters: Waiters = Arc::default();
        let w = Arc::clone(&waiters);
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let v: Value = serde_json::from_str(&line).unwrap();
                if let Some(id) = v.get("id").and_then(Value::as_u64) {
                    if let Some(tx) = w.lock().unwrap().remove(&id) {
                        let _ = tx.send(line);
                    }
                }
            }
        });
        let conn = Conn::Stdio {
            _child: child,
            stdin: tokio::sync::Mutex::new(stdin),
            waiters,
        };
        conn.request(0, INIT).await;
        conn.notify(INITIALIZED).await;
        conn
    }

    /// A Streamable HTTP server started by `cmd`, which prints its URL on stdout or stderr.
    async fn http(cmd: tokio::process::Command, on_stderr: bool) -> Conn {
        Self::http_with(cmd, on_stderr, |line| {
            line.find("http://").map(|at| line[at..].trim().to_owned())
        })
        .await
    }

    /// A Streamable HTTP server started by `cmd`, whose endpoint `url_of` finds in a line it
    /// prints on stdout or stderr (once it listens).
    async fn http_with(
        mut cmd: tokio::process::Command,
        on_stderr: bool,
        url_of: impl Fn(&str) -> Option<String>,
    ) -> Conn {
        let mut child = if on_stderr {
            cmd.stderr(Stdio::piped()).stdout(Stdio::null())
        } else {
            cmd.stdout(Stdio::piped()).stderr(Stdio::inherit())
        }
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
        let out: Box<dyn tokio::io::AsyncRead + Unpin + Send> = if on_stderr {
            Box::new(child.stderr.take().unwrap())
        } else {
            Box::new(child.stdout.take().unwrap())
        };
        let mut lines = BufReader::new(out).lines();
        let url = tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                let line = lines
                    .next_line()
                    .await
                    .unwrap()
                    .expect("the server printed its URL");
                if let Some(url) = url_of(&line) {
                    break url;
                }
            }
        })
        .await
        .expect("the server listened within a minute");
        // Keep draining the rest, so that the server never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let client = idemgate_kit::tls::client_builder()
            .no_proxy()
            .pool_max_idle_per_host(64)
            .build()
            .unwrap();
        let res = client
            .post(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(INIT)
            .send()
            .await
            .unwrap();
        let session = res.headers()["mcp-session-id"].to_str().unwrap().to_owned();
        let conn = Conn::Http {
            _child: child,
            client,
            url,
            session,
        };
        conn.notify(INITIALIZED).await;
        conn
    }

    async fn notify(&self, frame: &str) {
        match self {
            Conn::Stdio { stdin, .. } => {
                let mut s = stdin.lock().await;
                s.write_all(format!("{frame}\n").as_bytes()).await.unwrap();
                s.flush().await.unwrap();
            }
            Conn::Http { .. } => {
                self.post(frame).await;
            }
        }
    }

    async fn post(&self, frame: &str) -> String {
        let Conn::Http {
            client,
            url,
            session,
            ..
        } = self
        else {
            unreachable!()
        };
        client
            .post(url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-session-id", session)
            .header("mcp-protocol-version", "2025-11-25")
            .body(frame.to_owned())
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    async fn request(&self, id: u64, frame: &str) -> String {
        match self {
            Conn::Stdio { stdin, waiters, .. } => {
                let (tx, rx) = oneshot::channel();
                waiters.lock().unwrap().insert(id, tx);
                {
                    let mut s = stdin.lock().await;
                    let mut buf = Vec::with_capacity(frame.len() + 1);
                    buf.extend_from_slice(frame.as_bytes());
                    buf.push(b'\n');
                    s.write_all(&buf).await.unwrap();
                    s.flush().await.unwrap();
                }
                rx.await.expect("an answer")
            }
            Conn::Http { .. } => self.post(frame).await,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Measurements.

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Path {
    Direct,
    /// Through the peer, a pass-through proxy (`mcp-proxy`): every call reaches the server.
    PassThrough,
    Fresh,
    Replay,
}

impl Path {
    fn name(self) -> &'static str {
        match self {
            Path::Direct => "direct",
            Path::PassThrough => "mcp-proxy",
            Path::Fresh => "fresh",
            Path::Replay => "replay",
        }
    }
}

/// The peer over HTTP: `mcp-proxy` (PyPI), a pass-through proxy that serves a stdio server over
/// Streamable HTTP, in front of the same fixture, when `IDEMGATE_BENCH_MCP_PROXY` names its
/// binary (scripts/bench-mcp installs a pinned one). Its port is chosen here: it announces only
/// that uvicorn runs.
async fn pass_through(me: &std::path::Path) -> Option<Conn> {
    let bin = std::env::var_os("IDEMGATE_BENCH_MCP_PROXY")?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut cmd = tokio::process::Command::new(bin);
    cmd.args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--log-level", "INFO", "--"])
        .arg(me)
        .arg("--fixture-stdio");
    let url = format!("http://127.0.0.1:{port}/mcp");
    Some(
        Conn::http_with(cmd, true, move |line| {
            line.contains("Uvicorn running on").then(|| url.clone())
        })
        .await,
    )
}

/// The engine alone on SQLite: `calls` fresh writes of a no-op over `callers` tasks.
async fn measure_engine(
    engine: &Arc<idemgate::Engine<idemgate::AnyStore>>,
    callers: usize,
    calls: usize,
    tag: &str,
) -> Lat {
    use idemgate::{Call, Effect, IdempotencyKey, TenantId, ToolName, ToolPolicy};
    let per = calls / callers;
    let mut tasks = Vec::new();
    for c in 0..callers {
        let engine = Arc::clone(engine);
        let tag = tag.to_owned();
        tasks.push(tokio::spawn(async move {
            let policy = ToolPolicy::default();
            let mut lat = Vec::with_capacity(per);
            for i in 0..per {
                let call = Call::new(
                    TenantId::new("local").unwrap(),
                    ToolName::new("bench/write").unwrap(),
                )
                .args_text(br#"{"n":1}"#)
                .unwrap()
                .key(IdempotencyKey::explicit(format!("engine-{tag}-{c}-{i}")).unwrap());
                let start = Instant::now();
                let answer = engine
                    .call_with_policy(call, &policy, || async { Effect::Success(b"{}".to_vec()) })
                    .await
                    .unwrap();
                lat.push(start.elapsed().as_secs_f64() * 1e6);
                std::hint::black_box(answer);
            }
            lat
        }));
    }
    Lat::of(tasks).await
}

/// p50 and p99 in microseconds.
#[derive(Clone, Copy, Debug)]
struct Lat {
    p50: f64,
    p99: f64,
}

impl Lat {
    /// The percentiles of every latency the `tasks` measured.
    async fn of(tasks: Vec<tokio::task::JoinHandle<Vec<f64>>>) -> Lat {
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        all.sort_by(f64::total_cmp);
        Lat {
            p50: quantile(&all, 0.50),
            p99: quantile(&all, 0.99),
        }
    }
}

/// The `p` quantile of `sorted` (nearest rank).
fn quantile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// `calls` calls spread over `callers` concurrent callers; each caller's key is `key(caller, i)`.
async fn measure(
    conn: &Arc<Conn>,
    callers: usize,
    calls: usize,
    key: impl Fn(usize, usize) -> String + Send + Sync + 'static,
    expect_replay: Option<bool>,
) -> Lat {
    let key = Arc::new(key);
    let per = calls / callers;
    let mut tasks = Vec::new();
    for c in 0..callers {
        let (conn, key) = (Arc::clone(conn), Arc::clone(&key));
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(per);
            for i in 0..per {
                let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
                let f = call_frame(id, &key(c, i));
                let start = Instant::now();
                let answer = conn.request(id, &f).await;
                lat.push(start.elapsed().as_secs_f64() * 1e6);
                if let Some(replayed) = expect_replay {
                    assert_eq!(
                        answer.contains(r#""dev.idemgate/replayed":true"#),
                        replayed,
                        "{answer}"
                    );
                }
                assert!(!answer.contains("isError\":true"), "{answer}");
            }
            lat
        }));
    }
    Lat::of(tasks).await
}

/// How late the losers of a storm heard: `keys` keys, each called by `callers` callers at once
/// (a barrier before every key); a loser's lateness is when its replay arrived minus when the
/// winner's own answer did. Checks that each key ran once and every loser got a replay.
#[derive(Clone, Copy, Debug)]
struct Storm {
    p50: f64,
    p99: f64,
    max: f64,
    /// Keys with a loser later than 15 ms.
    slow_keys: usize,
    /// Calls answered per second over the whole storm (every caller of every key).
    calls_per_s: f64,
}

async fn measure_storm(conn: &Arc<Conn>, keys: usize, callers: usize, tag: &str) -> Storm {
    let mut late = Vec::with_capacity(keys * (callers - 1));
    let mut slow_keys = 0;
    let start = Instant::now();
    for k in 0..keys {
        let key = Arc::new(format!("storm-{tag}-{k}"));
        let barrier = Arc::new(tokio::sync::Barrier::new(callers));
        let tasks: Vec<_> = (0..callers)
            .map(|_| {
                let (conn, key, barrier) =
                    (Arc::clone(conn), Arc::clone(&key), Arc::clone(&barrier));
                tokio::spawn(async move {
                    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
                    let f = call_frame(id, &key);
                    barrier.wait().await;
                    let answer = conn.request(id, &f).await;
                    let at = Instant::now();
                    assert!(!answer.contains("isError\":true"), "{answer}");
                    (answer.contains(r#""dev.idemgate/replayed":true"#), at)
                })
            })
            .collect();
        let mut answers = Vec::with_capacity(callers);
        for t in tasks {
            answers.push(t.await.unwrap());
        }
        let winners: Vec<Instant> = answers
            .iter()
            .filter(|(r, _)| !r)
            .map(|&(_, at)| at)
            .collect();
        assert_eq!(winners.len(), 1, "key {k}: exactly one call executes");
        let won = winners[0];
        let mut slow = false;
        for &(_, at) in answers.iter().filter(|(r, _)| *r) {
            // A loser may read the record before the winner's answer has crossed back: 0.
            let us = at.saturating_duration_since(won).as_secs_f64() * 1e6;
            slow |= us > 15_000.0;
            late.push(us);
        }
        slow_keys += usize::from(slow);
    }
    let calls_per_s = (keys * callers) as f64 / start.elapsed().as_secs_f64();
    late.sort_by(f64::total_cmp);
    Storm {
        p50: quantile(&late, 0.50),
        p99: quantile(&late, 0.99),
        max: late[late.len() - 1],
        slow_keys,
        calls_per_s,
    }
}

fn median_min_max(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let m = if v.len() % 2 == 1 {
        v[v.len() / 2]
    } else {
        (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
    };
    (m, v[0], v[v.len() - 1])
}

fn fmt_ms((m, lo, hi): (f64, f64, f64)) -> String {
    format!("{:.3} [{:.3}..{:.3}]", m / 1e3, lo / 1e3, hi / 1e3)
}

async fn bench(rounds: usize, calls: usize) {
    let dir = tempfile::tempdir().unwrap();
    let me = std::env::current_exe().unwrap();
    let store = format!("sqlite://{}", dir.path().join("bench.db").display());
    let proxy = |listen: bool| {
        let mut c = tokio::process::Command::new(IDEMGATE);
        c.env("XDG_DATA_HOME", dir.path().join("data"))
            .env("IDEMGATE_STORE", &store)
            .env("IDEMGATE_LOG", "error")
            .env_remove("IDEMGATE_TENANT")
            .env_remove("IDEMGATE_JOURNAL")
            .arg("mcp");
        if listen {
            c.args(["--listen", "127.0.0.1:0"]);
        }
        c.arg("--").arg(&me).arg("--fixture-stdio");
        c
    };
    let fixture = |arg: &str| {
        let mut c = tokio::process::Command::new(&me);
        c.arg(arg);
        c
    };
    eprintln!(
        "idemgate: {IDEMGATE}\nstore: {store}\nrounds: {rounds}, calls per measurement: {calls}"
    );
    let peer = pass_through(&me).await.map(Arc::new);
    eprintln!(
        "peer over HTTP: {}",
        if peer.is_some() {
            "mcp-proxy (IDEMGATE_BENCH_MCP_PROXY)"
        } else {
            "none (IDEMGATE_BENCH_MCP_PROXY is not set)"
        }
    );
    let transports: Vec<(&str, Arc<Conn>, Arc<Conn>)> = vec![
        (
            "stdio",
            Arc::new(Conn::stdio(fixture("--fixture-stdio")).await),
            Arc::new(Conn::stdio(proxy(false)).await),
        ),
        (
            "http",
            Arc::new(Conn::http(fixture("--fixture-http"), false).await),
            Arc::new(Conn::http(proxy(true), true).await),
        ),
    ];
    // Warm up every path (connections, page cache, the proxy's own tools/list).
    for (_, direct, proxied) in &transports {
        for conn in [direct, proxied] {
            measure(conn, 4, 400, |c, i| format!("warm-{c}-{i}"), None).await;
        }
    }
    if let Some(peer) = &peer {
        measure(peer, 4, 400, |c, i| format!("warm-{c}-{i}"), None).await;
    }
    let engine_store = format!("sqlite://{}", dir.path().join("engine.db").display());
    let engine = Arc::new(idemgate::Engine::new(
        idemgate::AnyStore::connect(&engine_store).await.unwrap(),
    ));
    measure_engine(&engine, 4, 400, "warm").await;
    // results[(transport, callers, path)] = one Lat per round.
    let mut results: HashMap<(&str, usize, Path), Vec<Lat>> = HashMap::new();
    let mut storms: HashMap<&str, Vec<Storm>> = HashMap::new();
    for round in 0..rounds {
        for callers in [1usize, 16] {
            let lat = measure_engine(&engine, callers, calls, &format!("{callers}-{round}")).await;
            results
                .entry(("engine", callers, Path::Fresh))
                .or_default()
                .push(lat);
        }
        for (name, direct, proxied) in &transports {
            for callers in [1usize, 16] {
                let lat = measure(direct, callers, calls, |_, _| "direct".to_owned(), None).await;
                results
                    .entry((name, callers, Path::Direct))
                    .or_default()
                    .push(lat);
                if let (Some(peer), "http") = (&peer, *name) {
                    let lat = measure(peer, callers, calls, |_, _| "direct".to_owned(), None).await;
                    results
                        .entry((name, callers, Path::PassThrough))
                        .or_default()
                        .push(lat);
                }
                let tag = format!("{name}-{callers}-{round}");
                let t = tag.clone();
                let lat = measure(
                    proxied,
                    callers,
                    calls,
                    move |c, i| format!("fresh-{t}-{c}-{i}"),
                    Some(false),
                )
                .await;
                results
                    .entry((name, callers, Path::Fresh))
                    .or_default()
                    .push(lat);
                // One key per caller, recorded first: every measured call is a replay.
                let t = tag.clone();
                measure(
                    proxied,
                    callers,
                    callers,
                    move |c, _| format!("replay-{t}-{c}"),
                    Some(false),
                )
                .await;
                let lat = measure(
                    proxied,
                    callers,
                    calls,
                    move |c, _| format!("replay-{tag}-{c}"),
                    Some(true),
                )
                .await;
                results
                    .entry((name, callers, Path::Replay))
                    .or_default()
                    .push(lat);
            }
        }
        for (name, _, proxied) in &transports {
            let storm = measure_storm(proxied, STORM_KEYS, 16, &format!("{name}-{round}")).await;
            storms.entry(*name).or_default().push(storm);
        }
        eprintln!("round {} of {rounds} done", round + 1);
    }
    println!();
    println!("MCP proxy latency per tools/call, ms: median over {rounds} rounds [min..max]; {calls} calls per measurement; SQLite store");
    println!(
        "{:<6} {:>7}  {:<9} {:<26} {:<26} {:<26} {:<26}",
        "", "callers", "path", "p50", "p99", "added p50", "added p99"
    );
    for callers in [1usize, 16] {
        let lats = &results[&("engine", callers, Path::Fresh)];
        let p50 = median_min_max(lats.iter().map(|l| l.p50).collect());
        let p99 = median_min_max(lats.iter().map(|l| l.p99).collect());
        println!(
            "{:<6} {:>7}  {:<9} {:<26} {:<26} {:<26} {:<26}",
            "engine",
            callers,
            "fresh",
            fmt_ms(p50),
            fmt_ms(p99),
            "(no transport)",
            "-"
        );
    }
    for (name, _, _) in &transports {
        for callers in [1usize, 16] {
            let direct = &results[&(*name, callers, Path::Direct)];
            for path in [Path::Direct, Path::PassThrough, Path::Fresh, Path::Replay] {
                let Some(lats) = results.get(&(*name, callers, path)) else {
                    continue;
                };
                let p50 = median_min_max(lats.iter().map(|l| l.p50).collect());
                let p99 = median_min_max(lats.iter().map(|l| l.p99).collect());
                let (a50, a99) = if path == Path::Direct {
                    ("-".to_owned(), "-".to_owned())
                } else {
                    let a50 = lats
                        .iter()
                        .zip(direct)
                        .map(|(l, d)| l.p50 - d.p50)
                        .collect();
                    let a99 = lats
                        .iter()
                        .zip(direct)
                        .map(|(l, d)| l.p99 - d.p99)
                        .collect();
                    (fmt_ms(median_min_max(a50)), fmt_ms(median_min_max(a99)))
                };
                println!(
                    "{:<6} {:>7}  {:<9} {:<26} {:<26} {:<26} {:<26}",
                    name,
                    callers,
                    path.name(),
                    fmt_ms(p50),
                    fmt_ms(p99),
                    a50,
                    a99
                );
            }
        }
    }
    println!();
    println!("Storm through the proxy: {STORM_KEYS} keys, 16 callers per key released together; a loser's lateness is its replay's arrival minus the winner's answer, ms: median over {rounds} rounds [min..max]");
    println!(
        "{:<6} {:<26} {:<26} {:<26} {:<18} {:<24}",
        "", "loser p50", "loser p99", "loser max", "keys > 15 ms", "calls/s"
    );
    for (name, _, _) in &transports {
        let s = &storms[name];
        let slow = median_min_max(s.iter().map(|x| x.slow_keys as f64).collect());
        let rate = median_min_max(s.iter().map(|x| x.calls_per_s).collect());
        println!(
            "{:<6} {:<26} {:<26} {:<26} {:<18} {:.0} [{:.0}..{:.0}]",
            name,
            fmt_ms(median_min_max(s.iter().map(|x| x.p50).collect())),
            fmt_ms(median_min_max(s.iter().map(|x| x.p99).collect())),
            fmt_ms(median_min_max(s.iter().map(|x| x.max).collect())),
            format!("{:.0} [{:.0}..{:.0}]", slow.0, slow.1, slow.2),
            rate.0,
            rate.1,
            rate.2
        );
    }
}

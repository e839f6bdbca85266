//! Limits: body size, header and request timeouts, rate limits and live-key quotas.

use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::support::{config_text, header, problem, start, start_config, ACME};

/// Sends raw bytes and reads whatever comes back until the server closes or 3 s pass.
async fn raw(addr: std::net::SocketAddr, head: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(head).await.unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_secs(3), async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    out.extend_from_slice(&buf[..n]);
                    if out.windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
            }
        }
    })
    .await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn an_oversized_body_is_refused_before_it_is_sent() {
    let gw = start("max_body_bytes = 1024", "").await;
    // Only the head goes out: the answer must not wait for ten megabytes that never come.
    let head = format!(
        "POST /v1/tools/t/begin HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ACME}\r\n\
         Idempotency-Key: big\r\nContent-Type: application/json\r\nContent-Length: 10000000\r\n\r\n"
    );
    let answer = raw(gw.addr, head.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("application/problem+json"), "{answer}");
    // A chunked body that grows past the limit is cut off as it is read.
    let mut chunked = format!(
        "POST /v1/tools/t/begin HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ACME}\r\n\
         Idempotency-Key: big\r\nTransfer-Encoding: chunked\r\n\r\n800\r\n"
    )
    .into_bytes();
    chunked.extend(std::iter::repeat_n(b' ', 0x800));
    chunked.extend_from_slice(b"\r\n");
    let answer = raw(gw.addr, &chunked).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    // Within the limit all is well, and nothing was reserved by the refused calls.
    let res = gw.begin("t", "big", "{}").await;
    assert_eq!(res.status(), 201);
}

#[tokio::test]
async fn a_slow_request_head_is_cut_off() {
    let gw = start("header_timeout = \"300ms\"", "").await;
    let started = std::time::Instant::now();
    let answer = raw(gw.addr, b"GET /healthz HTTP/1.1\r\nHost: x\r\n").await;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "closed by the header timeout"
    );
    assert!(!answer.contains("200 OK"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_over_the_timeout_is_answered() {
    let gw = start("request_timeout = \"500ms\"", "[tools.t]\nwait = \"5s\"\n").await;
    assert_eq!(gw.begin("t", "k", "{}").await.status(), 201);
    // The duplicate would wait up to 5 s for the first call; the request timeout is shorter.
    let started = std::time::Instant::now();
    problem(gw.begin("t", "k", "{}").await, 503, "timeout").await;
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn the_rate_limit_answers_429_with_retry_after() {
    let dir = tempfile::tempdir().unwrap();
    let text =
        config_text("", "").replace("id = \"acme\"", "id = \"acme\"\nrate_limit_per_second = 1");
    let gw = start_config(idemgate_http::Config::parse(&text).unwrap(), dir).await;
    // Burst is twice the rate.
    for _ in 0..2 {
        assert_eq!(
            gw.get("/v1/records", ACME).send().await.unwrap().status(),
            200
        );
    }
    let res = gw.get("/v1/records", ACME).send().await.unwrap();
    assert_eq!(header(&res, "retry-after"), Some("1"));
    problem(res, 429, "rate-limited").await;
    // Another tenant has its own bucket.
    let res = gw
        .get("/v1/records", crate::support::OTHER)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
}

#[tokio::test]
async fn the_live_key_quota_answers_429_and_frees_up() {
    let dir = tempfile::tempdir().unwrap();
    let text = config_text("", "").replace("id = \"acme\"", "id = \"acme\"\nmax_live_keys = 1");
    let gw = start_config(idemgate_http::Config::parse(&text).unwrap(), dir).await;
    let first: Value = gw.begin("t", "k1", "{}").await.json().await.unwrap();
    problem(gw.begin("t", "k2", "{}").await, 429, "quota-exceeded").await;
    // Nothing was left reserved by the refused call.
    let res = gw.get("/v1/tools/t/records/k2", ACME).send().await.unwrap();
    problem(res, 404, "not-found").await;
    let res = gw
        .post("/v1/tools/t/complete", ACME)
        .json(&json!({"key": "k1", "lease": first["lease"], "outcome": {"kind": "success", "result": null}}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(gw.begin("t", "k2", "{}").await.status(), 201);
}

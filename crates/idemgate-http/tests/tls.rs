//! Forwarding to an HTTPS upstream whose certificate a private CA issued.

use serde_json::Value;

use crate::support::{header, https_upstream, problem, start, ACME};

/// `[server]` lines trusting the CA in `pem` (written into `dir`), or none.
fn trusting(dir: &tempfile::TempDir, pem: Option<&str>) -> String {
    match pem {
        Some(pem) => {
            let path = dir.path().join("ca.pem");
            std::fs::write(&path, pem).unwrap();
            format!("upstream_ca_file = \"{}\"", path.display())
        }
        None => String::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_upstream_under_a_private_ca_runs_once_and_replays() {
    let (up, ca) = https_upstream().await;
    assert!(up.url.starts_with("https://127.0.0.1:"));
    let dir = tempfile::tempdir().unwrap();
    let gw = start(
        &trusting(&dir, Some(&ca)),
        &format!("[tools.charge]\nupstream = \"{}/ok\"\n", up.url),
    )
    .await;
    let mut bodies = Vec::new();
    for replayed in ["false", "true"] {
        let res = gw
            .post("/v1/tools/charge/call", ACME)
            .header("idempotency-key", "tls-1")
            .body(r#"{"amount":5}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        assert_eq!(header(&res, "idempotent-replayed"), Some(replayed));
        bodies.push(res.json::<Value>().await.unwrap());
    }
    assert_eq!(bodies[0], bodies[1]);
    assert_eq!(bodies[0]["n"], 1);
    assert_eq!(up.calls("ok"), 1);
    let keys = up.seen.lock().unwrap().keys.clone();
    assert_eq!(
        keys[0].as_deref().map(str::len),
        Some(64),
        "the downstream key"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_https_upstream_is_unreachable_and_nothing_runs() {
    let (up, _ca) = https_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = start(
        &trusting(&dir, None),
        &format!("[tools.charge]\nupstream = \"{}/ok\"\n", up.url),
    )
    .await;
    for _ in 0..2 {
        let res = gw
            .post("/v1/tools/charge/call", ACME)
            .header("idempotency-key", "tls-2")
            .body("{}")
            .send()
            .await
            .unwrap();
        let body = problem(res, 502, "upstream-unreachable").await;
        let detail = body["detail"].as_str().unwrap();
        assert!(detail.contains("nothing was sent"), "{detail}");
        assert!(detail.contains("certificate"), "{detail}");
    }
    assert_eq!(up.calls("ok"), 0, "the handshake failed before a request");
    // The key was released, not left unknown.
    let res = gw
        .get("/v1/tools/charge/records/tls-2", ACME)
        .send()
        .await
        .unwrap();
    problem(res, 404, "not-found").await;
}

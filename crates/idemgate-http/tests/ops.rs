//! Operations: health, metrics, OpenAPI, logs, audit, graceful shutdown.

use std::time::Duration;

use serde_json::Value;

use crate::support::{config_text, logs, problem, start, start_config, upstream, ACME};

#[tokio::test]
async fn health_readiness_and_openapi() {
    let gw = start("", "").await;
    for path in ["/healthz", "/readyz"] {
        assert_eq!(
            gw.http
                .get(format!("{}{path}", gw.url))
                .send()
                .await
                .unwrap()
                .status(),
            200
        );
    }
    let doc: Value = gw
        .http
        .get(format!("{}/openapi.json", gw.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    for path in [
        "/healthz",
        "/readyz",
        "/metrics",
        "/openapi.json",
        "/v1/records",
        "/v1/tools/{tool}/begin",
        "/v1/tools/{tool}/heartbeat",
        "/v1/tools/{tool}/complete",
        "/v1/tools/{tool}/release",
        "/v1/tools/{tool}/ambiguous",
        "/v1/tools/{tool}/call",
        "/v1/tools/{tool}/records/{key}",
        "/v1/tools/{tool}/records/{key}/resolve",
    ] {
        assert!(doc["paths"][path].is_object(), "{path} is documented");
    }
}

#[tokio::test]
async fn readyz_probes_a_write_and_the_store_recovers_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("idemgate.db");
    let url = format!("sqlite://{}", db.display());
    drop(idemgate::AnyStore::connect(&url).await.unwrap());
    // Started while the database file is read-only (for root too).
    let read_only = idemgate_conformance::tmpfs::Immutable::set(&db);
    let text = config_text("", "").replace("store = \"memory:\"", &format!("store = \"{url}\""));
    let gw = start_config(idemgate_http::Config::parse(&text).unwrap(), dir).await;
    let ready = || async {
        gw.http
            .get(format!("{}/readyz", gw.url))
            .send()
            .await
            .unwrap()
    };
    let answer = ready().await;
    assert_eq!(answer.status(), 503);
    assert!(answer
        .text()
        .await
        .unwrap()
        .contains("does not take writes"));
    assert_eq!(gw.begin("t", "k1", "{}").await.status(), 503);

    // Writable again: ready and serving, with no restart.
    read_only.lift();
    assert_eq!(ready().await.status(), 200);
    assert_eq!(gw.begin("t", "k1", "{}").await.status(), 201);
}

#[tokio::test]
async fn a_full_disk_journals_the_outcome_else_answers_outcome_unrecorded() {
    let tiny = idemgate_conformance::tmpfs::TmpFs::mount(4 << 20);
    let db = tiny.path().join("idemgate.db");
    let text = config_text("", "").replace(
        "store = \"memory:\"",
        &format!("store = \"sqlite://{}\"", db.display()),
    );
    let gw = start_config(
        idemgate_http::Config::parse(&text).unwrap(),
        tempfile::tempdir().unwrap(),
    )
    .await;
    let complete = |key: &'static str, lease: String| {
        gw.post("/v1/tools/t/complete", ACME)
            .body(
                serde_json::json!({
                    "key": key,
                    "lease": lease,
                    "outcome": {"kind": "success", "result": {"done": key}},
                })
                .to_string(),
            )
            .send()
    };
    let lease = |begun: Value| begun["lease"].as_str().unwrap().to_owned();

    // Reserved with room on the disk; the side effect ran; then the disk is full.
    let begun: Value = gw.begin("t", "k1", "{}").await.json().await.unwrap();
    let filler = tiny.fill("filler");
    let answer = complete("k1", lease(begun)).await.unwrap();
    assert_eq!(answer.status(), 200);
    let body: Value = answer.json().await.unwrap();
    assert_eq!(body["recording"], "journaled", "{body}");

    // The same, with the journal's reserve gone too: nothing holds the outcome, and the caller
    // is told so, not 200.
    std::fs::remove_file(filler).unwrap();
    let begun: Value = gw.begin("t", "k2", "{}").await.json().await.unwrap();
    tiny.fill("filler");
    for spare in std::fs::read_dir(tiny.path().join("idemgate.db.journal")).unwrap() {
        let spare = spare.unwrap().path();
        if spare
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with(".reserve-")
        {
            std::fs::remove_file(spare).unwrap();
        }
    }
    tiny.fill("filler-2");
    let answer = complete("k2", lease(begun)).await.unwrap();
    problem(answer, 500, "outcome-unrecorded").await;
}

#[tokio::test]
async fn metrics_count_decisions() {
    let gw = start("", "[tools.t]\nwait = \"10ms\"\n").await;
    gw.begin("t", "m", "{}").await;
    gw.begin("t", "m", "{}").await;
    gw.begin("t", "m", r#"{"other":1}"#).await;
    let text = gw.metrics().await;
    for line in [
        "idemgate_calls_total{tenant=\"acme\",tool=\"t\",decision=\"execute\"} 1",
        "idemgate_calls_total{tenant=\"acme\",tool=\"t\",decision=\"in_flight\"} 1",
        "idemgate_calls_total{tenant=\"acme\",tool=\"t\",decision=\"key_reused\"} 1",
        "idemgate_in_flight_waits_total 1",
        "idemgate_key_reuse_total 1",
        "idemgate_unknown_total 0",
        "idemgate_store_errors_total 0",
        "idemgate_request_duration_seconds_count{route=\"/v1/tools/{tool}/begin\"} 3",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
}

#[tokio::test]
async fn logs_and_audit_never_hold_raw_keys_or_tokens() {
    let gw = start("audit_log = \"AUDIT\"", "").await;
    let key = "raw-key-that-must-not-leak-7f3a";
    let b: Value = gw
        .begin("t", key, r#"{"card":"4242-result-secret"}"#)
        .await
        .json()
        .await
        .unwrap();
    gw.post("/v1/tools/t/complete", ACME)
        .json(&serde_json::json!({"key": key, "lease": b["lease"], "outcome": {"kind": "success", "result": "result-secret-9c1d"}}))
        .send()
        .await
        .unwrap();
    gw.begin("t", key, r#"{"card":"4242-result-secret"}"#).await;
    let text = String::from_utf8(logs().lock().unwrap().clone()).unwrap();
    let audit = std::fs::read_to_string(gw.dir.path().join("audit.jsonl")).unwrap();
    let digest = {
        use std::fmt::Write as _;
        let k = idemgate::Key::new(
            idemgate::TenantId::new("acme").unwrap(),
            idemgate::ToolName::new("t").unwrap(),
            idemgate::IdempotencyKey::new(key).unwrap(),
        );
        k.digest().iter().fold(String::new(), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
    };
    assert!(
        text.contains(&digest[..12]),
        "the logs name the key by its digest prefix"
    );
    for secret in [key, ACME, crate::support::OTHER, "result-secret"] {
        assert!(!text.contains(secret), "the logs hold {secret:?}");
        assert!(!audit.contains(secret), "the audit log holds {secret:?}");
    }
    let events: Vec<Value> = audit
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let names: Vec<&str> = events
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["reserved", "executed", "replayed"]);
    assert_eq!(events[0]["tenant"], "acme");
    assert_eq!(events[0]["tool"], "t");
    assert_eq!(events[0]["key_digest"], digest);
    assert_eq!(events[0]["fence"], 1);
    assert!(events[0]["time"].is_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_the_request_in_flight() {
    let up = upstream().await;
    let mut gw = start(
        "",
        &format!("[tools.gated]\nupstream = \"{}/gate\"\n", up.url),
    )
    .await;
    let req = gw
        .post("/v1/tools/gated/call", ACME)
        .header("idempotency-key", "s-1")
        .body("{}")
        .send();
    let pending = tokio::spawn(req);
    // The call is in flight once it reached the upstream, which holds it until the gate opens.
    up.wait_for_calls("gate", 1).await;
    gw.stop_signal();
    // The gateway stops accepting while the call is still held upstream.
    tokio::time::timeout(Duration::from_secs(10), async {
        while tokio::net::TcpStream::connect(gw.addr).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the gateway stops accepting connections");
    assert!(!pending.is_finished(), "the call waits for the upstream");
    up.open_gate();
    let res = pending.await.unwrap().unwrap();
    assert_eq!(res.status(), 200, "the call in flight was answered");
    let stopped = tokio::time::timeout(Duration::from_secs(5), gw.task.take().unwrap()).await;
    assert!(
        matches!(stopped, Ok(Ok(Ok(())))),
        "the server stopped cleanly"
    );
    assert_eq!(up.calls("gate"), 1);
    // It no longer accepts connections.
    assert!(gw
        .http
        .get(format!("{}/healthz", gw.url))
        .send()
        .await
        .is_err());
}

/// The value of `name="NAME" value="..."` in a page.
fn form_value(page: &str, name: &str) -> String {
    let marker = format!(r#"name="{name}" value=""#);
    let at = page.find(&marker).expect("the field") + marker.len();
    page[at..at + page[at..].find('"').unwrap()].to_owned()
}

/// The "name=value" of the cookie `name` an answer sets.
fn cookie(res: &reqwest::Response, name: &str) -> String {
    res.headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap())
        .find(|c| c.starts_with(&format!("{name}=")))
        .map(|c| c.split(';').next().unwrap().to_owned())
        .expect("the cookie")
}

#[tokio::test]
async fn the_console_is_served_at_ui_and_counts_refusals_for_its_charts() {
    let gw = start("", "").await;
    let http = idemgate_kit::tls::client_builder()
        .no_proxy()
        .tls_certs_only([])
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let res = http.get(format!("{}/ui", gw.url)).send().await.unwrap();
    assert_eq!(res.status(), 303);
    let res = http
        .get(format!("{}/ui/login", gw.url))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let csp = res.headers()["content-security-policy"].to_str().unwrap();
    assert!(csp.starts_with("default-src 'none'"), "{csp}");
    let login = cookie(&res, "idemgate_console_login");
    let csrf = form_value(&res.text().await.unwrap(), "csrf");
    // A tenant of the gateway signs in with its bearer token.
    let res = http
        .post(format!("{}/ui/login", gw.url))
        .header("cookie", &login)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("csrf={csrf}&token={ACME}"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 303);
    let session = cookie(&res, "idemgate_console");
    // A write without a key is refused; the charts count it (the audit log cannot).
    let res = gw
        .post("/v1/tools/charge/begin", ACME)
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 400);
    let page = http
        .get(format!("{}/ui/charts", gw.url))
        .header("cookie", &session)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("<h3>charge</h3>"), "{page}");
    assert!(
        page.contains("0 executed, 0 replayed, 1 refused, 0 unknown"),
        "{page}"
    );
}

#[tokio::test]
async fn the_console_can_be_turned_off() {
    let gw = start("", "[console]\ndisabled = true\n").await;
    let res = gw
        .http
        .get(format!("{}/ui/login", gw.url))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 404);
}

/// Runs a call of `tool` under `key` (none: the fallback window names it) to its end, as a
/// caller of the coordination endpoints does: begin, then complete with a result.
async fn executed(gw: &crate::support::Gw, tool: &str, key: Option<&str>, body: &str) {
    let mut req = gw
        .post(&format!("/v1/tools/{tool}/begin"), ACME)
        .body(body.to_owned());
    if let Some(k) = key {
        req = req.header("idempotency-key", k);
    }
    let b: Value = req.send().await.unwrap().json().await.unwrap();
    // The action takes a while, so the time a replay saves is more than nothing.
    tokio::time::sleep(Duration::from_millis(30)).await;
    let res = gw
        .post(&format!("/v1/tools/{tool}/complete"), ACME)
        .json(&serde_json::json!({"key": b["key"], "lease": b["lease"], "outcome": {"kind": "success", "result": "done"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200, "{b}");
}

/// A record of `tool` under `key` whose outcome is unknown (its caller said `ambiguous`).
async fn unknown(gw: &crate::support::Gw, tool: &str, key: &str) {
    let b: Value = gw.begin(tool, key, "{}").await.json().await.unwrap();
    let res = gw
        .post(&format!("/v1/tools/{tool}/ambiguous"), ACME)
        .json(&serde_json::json!({"key": key, "lease": b["lease"], "reason": "timed out"}))
        .send()
        .await
        .unwrap();
    assert!(
        res.status().is_client_error() || res.status().is_success(),
        "{}",
        res.status()
    );
}

/// What the operator can show: duplicates the gateway answered without running (by rule: a
/// key, the fallback window, an expired outcome) and resolutions by how and through which door
/// are on the console's charts page and in `/metrics`, with their tenant, tool and rule.
#[tokio::test]
async fn duplicates_and_resolutions_show_on_the_console_and_in_metrics() {
    let gw = start(
        "audit_log = \"AUDIT\"",
        "[tools.charge]\n[tools.mail]\nfallback_window = \"1m\"\n[tools.brief]\nttl = \"1s\"\n",
    )
    .await;
    // A key's replay, twice; the window's replay once; an expired outcome's retry once.
    executed(&gw, "charge", Some("order-1"), "{}").await;
    for _ in 0..2 {
        let res = gw.begin("charge", "order-1", "{}").await;
        assert_eq!(
            crate::support::header(&res, "idempotent-replayed"),
            Some("true")
        );
    }
    executed(&gw, "mail", None, r#"{"to":"bob"}"#).await;
    let res = gw
        .post("/v1/tools/mail/begin", ACME)
        .body(r#"{"to":"bob"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(
        crate::support::header(&res, "idempotent-replayed"),
        Some("true")
    );
    executed(&gw, "brief", Some("b-1"), "{}").await;
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    problem(gw.begin("brief", "b-1", "{}").await, 410, "outcome-expired").await;

    // Resolutions: released and reopened through the API, completed through the console.
    unknown(&gw, "charge", "u-api").await;
    let res = gw
        .post("/v1/tools/charge/records/u-api/resolve", ACME)
        .json(&serde_json::json!({"fence": 1, "resolution": "release", "reason": "not sent"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200, "{}", res.text().await.unwrap());
    let res = gw
        .post("/v1/tools/charge/records/order-1/reopen", ACME)
        .json(&serde_json::json!({"fence": 1, "reason": "refunded"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    unknown(&gw, "charge", "u-console").await;
    let http = idemgate_kit::tls::client_builder()
        .no_proxy()
        .tls_certs_only([])
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let res = http
        .get(format!("{}/ui/login", gw.url))
        .send()
        .await
        .unwrap();
    let login = cookie(&res, "idemgate_console_login");
    let csrf = form_value(&res.text().await.unwrap(), "csrf");
    let res = http
        .post(format!("{}/ui/login", gw.url))
        .header("cookie", &login)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("csrf={csrf}&token={ACME}"))
        .send()
        .await
        .unwrap();
    let session = cookie(&res, "idemgate_console");
    let form = http
        .get(format!(
            "{}/ui/resolve?tenant=acme&tool=charge&key=u-console",
            gw.url
        ))
        .header("cookie", &session)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let csrf = form_value(&form, "csrf");
    let res = http
        .post(format!("{}/ui/resolve", gw.url))
        .header("cookie", &session)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!(
            "csrf={csrf}&tenant=acme&tool=charge&key=u-console&fence=1&resolution=completed&result=%7B%22ok%22%3Atrue%7D&reason=seen"
        ))
        .send()
        .await
        .unwrap();
    assert!(
        res.status().is_redirection() || res.status().is_success(),
        "{}",
        res.status()
    );

    let page = http
        .get(format!("{}/ui/charts", gw.url))
        .header("cookie", &session)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for row in [
        "<tr><td>acme</td><td>charge</td><td>key</td><td>2</td></tr>",
        "<tr><td>acme</td><td>mail</td><td>window</td><td>1</td></tr>",
        "<tr><td>acme</td><td>brief</td><td>expired</td><td>1</td></tr>",
        "<tr><td>acme</td><td>charge</td><td>released</td><td>API</td><td>1</td></tr>",
        "<tr><td>acme</td><td>charge</td><td>reopened</td><td>API</td><td>1</td></tr>",
        "<tr><td>acme</td><td>charge</td><td>completed</td><td>console</td><td>1</td></tr>",
    ] {
        assert!(
            page.contains(row),
            "missing {row} in the console's page:\n{page}"
        );
    }
    // Two replays of a timed execution of order-1: the time saved is twice its time, at least
    // the 30 ms it took each.
    let saved = page
        .split("<tr><td>acme</td><td>charge</td><td>2</td><td>")
        .nth(1)
        .unwrap_or_else(|| panic!("no timed replays of charge: {page}"));
    let saved = &saved[..saved.find('<').unwrap()];
    let ms: f64 = saved
        .trim_end_matches(" ms")
        .parse()
        .unwrap_or_else(|_| panic!("{saved}"));
    assert!(ms >= 60.0, "two replays of a 30 ms execution saved {saved}");
    // The duplicates chart of charge, with acme's series.
    assert!(
        page.contains("charge: duplicates answered without running, by tenant"),
        "{page}"
    );

    let metrics = gw.metrics().await;
    for line in [
        "idemgate_duplicates_answered_total{tenant=\"acme\",tool=\"charge\",rule=\"key\"} 2",
        "idemgate_duplicates_answered_total{tenant=\"acme\",tool=\"mail\",rule=\"window\"} 1",
        "idemgate_duplicates_answered_total{tenant=\"acme\",tool=\"brief\",rule=\"expired\"} 1",
        "idemgate_resolutions_total{tenant=\"acme\",tool=\"charge\",how=\"released\"} 1",
        "idemgate_resolutions_total{tenant=\"acme\",tool=\"charge\",how=\"reopened\"} 1",
        "idemgate_resolutions_total{tenant=\"acme\",tool=\"charge\",how=\"completed\"} 1",
    ] {
        assert!(
            metrics.contains(line),
            "missing {line} in /metrics:\n{metrics}"
        );
    }
}

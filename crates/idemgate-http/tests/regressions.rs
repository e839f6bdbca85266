//! Regressions of issue 7: what a new user ran into, one test each.

use serde_json::json;

use crate::support::{header, problem, start, upstream, Gw, ACME};

async fn call(gw: &Gw, tool: &str, key: &str) -> reqwest::Response {
    gw.post(&format!("/v1/tools/{tool}/call"), ACME)
        .header("idempotency-key", key)
        .body("{}")
        .send()
        .await
        .unwrap()
}

/// The outcome-unknown text said "not run again until an operator resolves" under `retry` too.
#[tokio::test]
async fn unknown_under_retry_says_the_next_call_runs_it_again() {
    let up = upstream().await;
    let gw = start(
        "",
        &format!(
            "[tools.flaky]\nupstream = \"{}/flaky\"\non_unknown = \"retry\"\n",
            up.url
        ),
    )
    .await;
    let p = problem(call(&gw, "flaky", "k").await, 409, "outcome-unknown").await;
    let detail = p["detail"].as_str().unwrap();
    assert!(detail.contains("runs it again"), "{detail}");
    assert!(!detail.contains("operator"), "{detail}");
    let res = call(&gw, "flaky", "k").await;
    assert_eq!(res.status(), 200, "retry takes the record over and runs");
    assert_eq!(up.calls("flaky"), 2);
}

/// A record of a forwarded tool resolved by an operator (or written by another front door) made
/// every later `/call` answer 503 for the whole TTL: `/call` could read only its own format.
#[tokio::test]
async fn an_operator_resolution_of_a_forwarded_tool_is_replayed() {
    let up = upstream().await;
    let gw = start(
        "",
        &format!("[tools.flaky]\nupstream = \"{}/flaky\"\n", up.url),
    )
    .await;
    let p = problem(call(&gw, "flaky", "k").await, 409, "outcome-unknown").await;
    let fence = p["fence"].as_u64().unwrap();
    let res = gw
        .post("/v1/tools/flaky/records/k/resolve", ACME)
        .json(&json!({
            "fence": fence,
            "resolution": "completed",
            "outcome": {"kind": "success", "result": {"charge": 12345678901234567890u64}},
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200, "{:?}", res.text().await);
    for _ in 0..2 {
        let res = call(&gw, "flaky", "k").await;
        assert_eq!(res.status(), 200);
        assert_eq!(header(&res, "idempotent-replayed"), Some("true"));
        assert_eq!(header(&res, "content-type"), Some("application/json"));
        assert_eq!(
            res.text().await.unwrap(),
            r#"{"charge":12345678901234567890}"#
        );
    }
    assert_eq!(up.calls("flaky"), 1, "the upstream never ran again");
}

/// Every answer about an execution says how it was recorded.
#[tokio::test]
async fn call_answers_say_how_the_outcome_was_recorded() {
    let up = upstream().await;
    let gw = start(
        "",
        &format!("[tools.charge]\nupstream = \"{}/ok\"\n", up.url),
    )
    .await;
    let res = call(&gw, "charge", "r-1").await;
    assert_eq!(res.status(), 200);
    assert_eq!(header(&res, "idempotency-recording"), Some("stored"));
    assert!(header(&res, "idempotency-executed-at").is_some());
}

/// An explicit key that starts like the keys the fallback window derives got the fallback
/// window's retention; such keys are now refused.
#[tokio::test]
async fn explicit_keys_cannot_pose_as_fallback_keys() {
    let gw = start("", "[tools.t]\nfallback_window = \"1s\"\n").await;
    let res = gw.begin("t", "fallback-0123", "{}").await;
    let p = problem(res, 400, "bad-request").await;
    assert!(p["detail"].as_str().unwrap().contains("reserved"), "{p}");
}

/// `/metrics` labelled series by any tool name a caller sent.
#[tokio::test]
async fn metrics_label_unconfigured_tools_as_one_series() {
    let gw = start("", "[tools.t]\n").await;
    for i in 0..5 {
        gw.begin(&format!("made-up-{i}"), "k", "{}").await;
    }
    gw.begin("t", "k", "{}").await;
    let text = gw.metrics().await;
    assert!(!text.contains("made-up"), "{text}");
    for line in [
        "idemgate_calls_total{tenant=\"acme\",tool=\"other\",decision=\"execute\"} 5",
        "idemgate_calls_total{tenant=\"acme\",tool=\"t\",decision=\"execute\"} 1",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
}

// Found by scripts/schemathesis (issue 8): answers that broke the served /openapi.json.

/// The served OpenAPI document, as JSON.
async fn served_document(gw: &Gw) -> serde_json::Value {
    gw.http
        .get(format!("{}/openapi.json", gw.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// `GET /v1/records?limit=1001` answered 200 with the limit quietly clamped to 1000, though the
/// document says `maximum: 1000`; limits outside 1..=1000 are now refused with 400.
#[tokio::test]
async fn schemathesis_records_limit_outside_the_documented_range_is_refused() {
    let gw = start("", "").await;
    let doc = served_document(&gw).await;
    let limit = doc["paths"]["/v1/records"]["get"]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "limit")
        .unwrap()
        .clone();
    assert_eq!(limit["schema"]["minimum"], 1, "{limit}");
    assert_eq!(limit["schema"]["maximum"], 1000, "{limit}");
    for bad in ["0", "1001", "5000"] {
        let res = gw
            .get(&format!("/v1/records?limit={bad}"), ACME)
            .send()
            .await
            .unwrap();
        let p = problem(res, 400, "bad-request").await;
        assert!(p["detail"].as_str().unwrap().contains("limit"), "{p}");
    }
    for good in ["1", "1000"] {
        let res = gw
            .get(&format!("/v1/records?limit={good}"), ACME)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200, "limit={good}");
    }
}

/// A forwarded tool's upstream answered 400 (a stored terminal failure, replayed with its own
/// Content-Type), but the document promised only `application/problem+json` for a 400 from
/// `/call`. The document now lists the upstream's answer for every 4xx `/call` can pass on.
#[tokio::test]
async fn schemathesis_call_documents_the_upstreams_own_4xx_answers() {
    let up = upstream().await;
    let gw = start(
        "",
        &format!("[tools.declines]\nupstream = \"{}/bad\"\n", up.url),
    )
    .await;
    for replayed in ["false", "true"] {
        let res = call(&gw, "declines", "d-1").await;
        assert_eq!(res.status(), 400);
        assert_eq!(header(&res, "content-type"), Some("text/plain"));
        assert_eq!(header(&res, "idempotent-replayed"), Some(replayed));
    }
    assert_eq!(up.calls("bad"), 1);
    let doc = served_document(&gw).await;
    let responses = &doc["paths"]["/v1/tools/{tool}/call"]["post"]["responses"];
    for status in ["400", "401", "404", "409", "413", "422", "429"] {
        let content = &responses[status]["content"];
        assert!(
            content["application/problem+json"].is_object() && content["*/*"].is_object(),
            "{status}: {content}"
        );
    }
}

/// The body limit sits in front of every route, the operations' too, but the document listed
/// 413 only under `/v1/`: a `GET /healthz` with an oversized body answers 413, as documented now.
#[tokio::test]
async fn schemathesis_operations_document_the_body_limit_they_enforce() {
    let gw = start("max_body_bytes = 16", "").await;
    let doc = served_document(&gw).await;
    for path in ["/healthz", "/readyz", "/metrics", "/openapi.json"] {
        let res = gw
            .http
            .get(format!("{}{path}", gw.url))
            .body("x".repeat(64))
            .send()
            .await
            .unwrap();
        problem(res, 413, "payload-too-large").await;
        assert!(
            doc["paths"][path]["get"]["responses"]["413"].is_object(),
            "{path} documents 413"
        );
    }
}

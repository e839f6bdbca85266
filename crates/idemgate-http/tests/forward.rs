//! Forwarding: the gateway calls the upstream at most once per key and replays its answer.

use std::sync::Arc;

use serde_json::Value;

use crate::support::{closed_port, header, problem, start, upstream, Gw, ACME, OTHER};

fn tools(up: &str, extra: &str) -> String {
    format!(
        r#"
[tools.charge]
upstream = "{up}/ok"
wait = "5s"
{extra}

[tools.slow]
upstream = "{up}/slow"
wait = "5s"

[tools.declined]
upstream = "{up}/bad"

[tools.busy]
upstream = "{up}/busy"

[tools.broken]
upstream = "{up}/fail"

[tools.hang]
upstream = "{up}/hang"

[tools.lookup]
kind = "read"
upstream = "{up}/ok"
"#
    )
}

async fn call(gw: &Gw, tool: &str, token: &str, key: &str, body: &str) -> reqwest::Response {
    gw.post(&format!("/v1/tools/{tool}/call"), token)
        .header("idempotency-key", key)
        .body(body.to_owned())
        .send()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_racing_calls_reach_the_upstream_once() {
    let up = upstream().await;
    let gw = Arc::new(start("", &tools(&up.url, "")).await);
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let gw = gw.clone();
        tasks.push(tokio::spawn(async move {
            let res = call(&gw, "slow", ACME, "order-1", r#"{"amount":5}"#).await;
            let replayed = header(&res, "idempotent-replayed").unwrap().to_owned();
            let status = res.status().as_u16();
            (status, replayed, res.text().await.unwrap())
        }));
    }
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    assert_eq!(up.calls("slow"), 1);
    assert!(
        answers
            .iter()
            .all(|(s, _, b)| *s == 200 && *b == answers[0].2),
        "{answers:?}"
    );
    assert_eq!(answers.iter().filter(|(_, r, _)| r == "false").count(), 1);
    assert_eq!(answers.iter().filter(|(_, r, _)| r == "true").count(), 15);
    // The downstream saw the record's digest, never the raw key.
    let keys = up.seen.lock().unwrap().keys.clone();
    let k = keys[0].as_deref().unwrap();
    assert_eq!(k.len(), 64);
    assert!(k.bytes().all(|b| b.is_ascii_hexdigit()));
}

#[tokio::test]
async fn answers_are_stored_and_replayed_with_headers() {
    let up = upstream().await;
    let gw = start("", &tools(&up.url, "")).await;
    let first = call(&gw, "charge", ACME, "c-1", r#"{"amount":5}"#).await;
    assert_eq!(first.status(), 200);
    assert_eq!(header(&first, "content-type"), Some("application/json"));
    assert_eq!(header(&first, "idempotent-replayed"), Some("false"));
    assert_eq!(header(&first, "idempotency-rule"), Some("explicit"));
    let executed_at = header(&first, "idempotency-executed-at")
        .unwrap()
        .to_owned();
    assert!(header(&first, "idempotency-expires-at").is_some());
    let body = first.text().await.unwrap();
    let again = call(&gw, "charge", ACME, "c-1", r#"{"amount": 5}"#).await;
    assert_eq!(again.status(), 200);
    assert_eq!(header(&again, "idempotent-replayed"), Some("true"));
    assert_eq!(
        header(&again, "idempotency-executed-at"),
        Some(executed_at.as_str())
    );
    assert_eq!(again.text().await.unwrap(), body);
    assert_eq!(up.calls("ok"), 1);
    // Other arguments under the same key: 422, nothing sent.
    problem(
        call(&gw, "charge", ACME, "c-1", r#"{"amount":6}"#).await,
        422,
        "key-reused",
    )
    .await;
    assert_eq!(up.calls("ok"), 1);
    // No key: 400, nothing sent.
    let res = gw
        .post("/v1/tools/charge/call", ACME)
        .body("{}")
        .send()
        .await
        .unwrap();
    problem(res, 400, "key-required").await;
    assert_eq!(up.calls("ok"), 1);
}

#[tokio::test]
async fn a_4xx_is_a_stored_terminal_failure() {
    let up = upstream().await;
    let gw = start("", &tools(&up.url, "")).await;
    for replayed in ["false", "true"] {
        let res = call(&gw, "declined", ACME, "d-1", "{}").await;
        assert_eq!(res.status(), 400);
        assert_eq!(header(&res, "content-type"), Some("text/plain"));
        assert_eq!(header(&res, "idempotent-replayed"), Some(replayed));
        assert_eq!(res.text().await.unwrap(), "card declined 1");
    }
    assert_eq!(up.calls("bad"), 1);
}

#[tokio::test]
async fn a_429_is_passed_on_and_the_key_released() {
    let up = upstream().await;
    let gw = start("", &tools(&up.url, "")).await;
    for _ in 0..2 {
        let res = call(&gw, "busy", ACME, "b-1", "{}").await;
        assert_eq!(res.status(), 429);
        assert_eq!(header(&res, "retry-after"), Some("7"));
        assert_eq!(header(&res, "idempotent-replayed"), Some("false"));
        assert_eq!(res.text().await.unwrap(), "slow down");
    }
    assert_eq!(up.calls("busy"), 2, "a released key runs again");
}

#[tokio::test]
async fn an_unreachable_upstream_is_502_and_releases_the_key() {
    let dead = closed_port().await;
    let gw = start("", &format!("[tools.dead]\nupstream = \"{dead}/x\"\n")).await;
    problem(
        call(&gw, "dead", ACME, "u-1", "{}").await,
        502,
        "upstream-unreachable",
    )
    .await;
    let rec = gw
        .get("/v1/tools/dead/records/u-1", ACME)
        .send()
        .await
        .unwrap();
    problem(rec, 404, "not-found").await;
}

#[tokio::test]
async fn a_5xx_makes_the_outcome_unknown() {
    let up = upstream().await;
    let gw = start("", &tools(&up.url, "")).await;
    let body = problem(
        call(&gw, "broken", ACME, "x-1", "{}").await,
        409,
        "outcome-unknown",
    )
    .await;
    assert_eq!(body["fence"], 1);
    problem(
        call(&gw, "broken", ACME, "x-1", "{}").await,
        409,
        "outcome-unknown",
    )
    .await;
    assert_eq!(up.calls("fail"), 1, "never silently re-run");
    let rec: Value = gw
        .get("/v1/tools/broken/records/x-1", ACME)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(rec["state"], "unknown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_timeout_makes_the_outcome_unknown() {
    let up = upstream().await;
    let gw = start("request_timeout = \"1s\"", &tools(&up.url, "")).await;
    problem(
        call(&gw, "hang", ACME, "h-1", "{}").await,
        409,
        "outcome-unknown",
    )
    .await;
    problem(
        call(&gw, "hang", ACME, "h-1", "{}").await,
        409,
        "outcome-unknown",
    )
    .await;
    assert_eq!(up.calls("hang"), 1);
}

#[tokio::test]
async fn tenants_with_the_same_key_and_payload_run_separately() {
    let up = upstream().await;
    let gw = start("", &tools(&up.url, "")).await;
    let a = call(&gw, "charge", ACME, "same", r#"{"amount":1}"#).await;
    let b = call(&gw, "charge", OTHER, "same", r#"{"amount":1}"#).await;
    assert_eq!(header(&a, "idempotent-replayed"), Some("false"));
    assert_eq!(header(&b, "idempotent-replayed"), Some("false"));
    let (a, b): (Value, Value) = (a.json().await.unwrap(), b.json().await.unwrap());
    assert_eq!(up.calls("ok"), 2);
    assert_ne!(a["n"], b["n"]);
    // Each replays its own answer.
    let a2: Value = call(&gw, "charge", ACME, "same", r#"{"amount":1}"#)
        .await
        .json()
        .await
        .unwrap();
    let b2: Value = call(&gw, "charge", OTHER, "same", r#"{"amount":1}"#)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!((a2, b2), (a, b));
    let keys = up.seen.lock().unwrap().keys.clone();
    assert_ne!(keys[0], keys[1], "downstream keys differ per tenant");
}

#[tokio::test]
async fn reads_pass_through_and_coordinated_tools_cannot_be_forwarded() {
    let up = upstream().await;
    let gw = start("", &tools(&up.url, "")).await;
    for _ in 0..2 {
        let res = gw
            .post("/v1/tools/lookup/call", ACME)
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        assert!(header(&res, "idempotent-replayed").is_none());
    }
    assert_eq!(up.calls("ok"), 2);
    assert_eq!(up.seen.lock().unwrap().keys, vec![None, None]);
    problem(
        call(&gw, "not_configured", ACME, "k", "{}").await,
        404,
        "not-found",
    )
    .await;
}

/// Shadow mode at the gateway: `[server] mode = "observe"` forwards every call (the duplicate
/// and the reused key reach the upstream), `/metrics` counts what enforce mode would have
/// answered, the record's story holds it, and a tool's own `mode = "enforce"` wins over the door's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_mode_forwards_every_call_and_counts_what_enforce_would_have_done() {
    let up = upstream().await;
    let extra = format!(
        "[tools.charge]\nupstream = \"{0}/ok\"\n\n[tools.refund]\nupstream = \"{0}/ok\"\nmode = \"enforce\"\n\n[tools.declined]\nupstream = \"{0}/bad\"\n",
        up.url
    );
    let gw = start("mode = \"observe\"", &extra).await;
    for (n, body) in [r#"{"amount":5}"#, r#"{"amount":5}"#, r#"{"amount":6}"#]
        .into_iter()
        .enumerate()
    {
        let res = call(&gw, "charge", ACME, "order-1", body).await;
        assert_eq!(res.status().as_u16(), 200);
        // Each caller gets the upstream's own answer, as if the gateway were not there.
        let answer: Value = res.json().await.unwrap();
        assert_eq!(answer["n"], n + 1, "{answer}");
    }
    assert_eq!(up.calls("ok"), 3, "nothing suppressed in observe mode");
    // An upstream's refusal reaches its caller with its status, the duplicate's too.
    for _ in 0..2 {
        let res = call(&gw, "declined", ACME, "order-9", "{}").await;
        assert_eq!(res.status().as_u16(), 400);
    }
    assert_eq!(up.calls("bad"), 2);
    // Without a key: runs too (enforce would refuse it as key_required).
    let keyless = gw
        .post("/v1/tools/charge/call", ACME)
        .body(r#"{"amount":7}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(keyless.status().as_u16(), 200);
    assert_eq!(up.calls("ok"), 4);
    let text = gw.metrics().await;
    for (would, rule) in [
        ("replayed", "key"),
        ("key_reused", "key"),
        ("key_required", "none"),
    ] {
        let series = format!(
            "idemgate_observed_total{{tenant=\"acme\",tool=\"charge\",would=\"{would}\",rule=\"{rule}\"}} 1"
        );
        assert!(text.contains(&series), "{series} in\n{text}");
    }
    let shown = gw.get_json("/v1/tools/charge/records/order-1", ACME).await;
    let observed: Vec<&Value> = shown["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["what"] == "observed")
        .collect();
    assert_eq!(observed.len(), 2, "{shown}");

    // The tool that says enforce is enforced, whatever the door's default.
    for _ in 0..2 {
        let res = call(&gw, "refund", ACME, "refund-1", "{}").await;
        assert_eq!(res.status().as_u16(), 200);
    }
    assert_eq!(up.calls("ok"), 5);
    // The coordination API tells the program what enforce mode would have answered.
    let first = gw.begin("charge", "order-2", "{}").await;
    assert_eq!(first.status().as_u16(), 201);
    let lease = first.json::<Value>().await.unwrap()["lease"]
        .as_str()
        .unwrap()
        .to_owned();
    let duplicate: Value = gw
        .begin("charge", "order-2", "{}")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(duplicate["decision"], "pass_through", "{duplicate}");
    assert_eq!(duplicate["observed"], "in_flight", "{duplicate}");
    let done = gw
        .post("/v1/tools/charge/complete", ACME)
        .json(&serde_json::json!({"key": "order-2", "lease": lease, "outcome": {"kind": "success", "result": 1}}))
        .send()
        .await
        .unwrap();
    assert_eq!(done.status().as_u16(), 200);
}

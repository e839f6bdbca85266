//! Coordination: begin, heartbeat, complete, release, ambiguous.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::{header, problem, start, ACME, OTHER};

async fn lease_of(res: reqwest::Response) -> String {
    assert_eq!(res.status().as_u16(), 201);
    let b: Value = res.json().await.unwrap();
    assert_eq!(b["decision"], "execute");
    b["lease"].as_str().unwrap().to_owned()
}

/// A retry after the ttl is not run again: 410 `outcome-expired`, saying when the action ran,
/// until the record is reopened (then the key runs again); a tool with `tombstone = "0s"` runs it
/// again after its ttl, as before tombstones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_the_ttl_is_gone_until_reopened() {
    let gw = start(
        "",
        "[tools.charge]\nttl = \"300ms\"\n\n[tools.ping]\nttl = \"300ms\"\ntombstone = \"0s\"\n",
    )
    .await;
    for tool in ["charge", "ping"] {
        let lease = lease_of(gw.begin(tool, "order-1", "{}").await).await;
        let done = gw
            .post(&format!("/v1/tools/{tool}/complete"), ACME)
            .json(&json!({"key": "order-1", "lease": lease, "outcome": {"kind": "success", "result": 1}}))
            .send()
            .await
            .unwrap();
        assert_eq!(done.status(), 200);
    }
    tokio::time::sleep(Duration::from_millis(700)).await;

    let gone = problem(
        gw.begin("charge", "order-1", "{}").await,
        410,
        "outcome-expired",
    )
    .await;
    let detail = gone["detail"].as_str().unwrap();
    assert!(
        detail.contains("already ran at") && detail.contains("not run now"),
        "{gone}"
    );
    assert!(
        gone["executed_at"].is_string() && gone["retain_until"].is_string(),
        "{gone}"
    );
    let fence = gone["fence"].as_u64().unwrap();
    let shown: Value = gw
        .get("/v1/tools/charge/records/order-1", ACME)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(shown["state"], "expired", "{shown}");
    assert!(shown.get("outcome").is_none(), "{shown}");

    let reopened = gw
        .post("/v1/tools/charge/records/order-1/reopen", ACME)
        .json(&json!({"fence": fence, "reason": "the customer asked again"}))
        .send()
        .await
        .unwrap();
    assert_eq!(reopened.status(), 200);
    lease_of(gw.begin("charge", "order-1", "{}").await).await;

    // No tombstone: the key names a new action once the ttl is past.
    lease_of(gw.begin("ping", "order-1", "{}").await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn begin_complete_then_replay_verbatim() {
    let gw = start("", "").await;
    let res = gw.begin("ticket", "t-1", r#"{"title": "fire"}"#).await;
    assert_eq!(header(&res, "idempotent-replayed"), Some("false"));
    assert_eq!(header(&res, "idempotency-rule"), Some("explicit"));
    let b: Value = res.json().await.unwrap();
    assert_eq!(b["key"], "t-1");
    assert_eq!(b["rule"], "explicit");
    assert!(b["lease_until"].is_string());
    let lease = b["lease"].as_str().unwrap();

    let hb = gw
        .post("/v1/tools/ticket/heartbeat", ACME)
        .json(&json!({"key": "t-1", "lease": lease}))
        .send()
        .await
        .unwrap();
    assert_eq!(hb.status(), 200);
    assert!(hb.json::<Value>().await.unwrap()["lease_until"].is_string());

    // A result with an integer beyond 64 bits must come back exactly as written.
    let done = gw
        .post("/v1/tools/ticket/complete", ACME)
        .body(format!(
            r#"{{"key":"t-1","lease":"{lease}","outcome":{{"kind":"success","result":{{"id":123456789012345678901234567890}}}}}}"#
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(done.status(), 200);
    assert_eq!(header(&done, "idempotent-replayed"), Some("false"));
    assert!(header(&done, "idempotency-executed-at").is_some());
    assert!(header(&done, "idempotency-expires-at").is_some());
    let d: Value = done.json().await.unwrap();
    assert_eq!(d["decision"], "executed");
    assert_eq!(d["recording"], "stored");

    // Same arguments in another byte order: still the same call.
    let again = gw.begin("ticket", "t-1", r#"{ "title":"fire" }"#).await;
    assert_eq!(again.status(), 200);
    assert_eq!(header(&again, "idempotent-replayed"), Some("true"));
    assert_eq!(
        header(&again, "idempotency-executed-at"),
        d["executed_at"].as_str()
    );
    let text = again.text().await.unwrap();
    assert!(
        text.contains(r#""result":{"id":123456789012345678901234567890}"#),
        "{text}"
    );
    let r: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(r["decision"], "replayed");
    assert_eq!(r["outcome"]["kind"], "success");
    assert_eq!(r["rule"], "explicit");
}

#[tokio::test]
async fn refusals_are_problems() {
    let gw = start("", "[tools.search]\nkind = \"read\"\n").await;
    // No token, a wrong token, another scheme.
    let res = gw
        .http
        .post(format!("{}/v1/tools/t/begin", gw.url))
        .send()
        .await
        .unwrap();
    problem(res, 401, "unauthorized").await;
    let res = gw
        .post("/v1/tools/t/begin", "wrong-token")
        .send()
        .await
        .unwrap();
    problem(res, 401, "unauthorized").await;
    let res = gw
        .http
        .get(format!("{}/v1/records", gw.url))
        .header("authorization", format!("Basic {ACME}"))
        .send()
        .await
        .unwrap();
    problem(res, 401, "unauthorized").await;
    // A write without a key.
    let res = gw
        .post("/v1/tools/t/begin", ACME)
        .body("{}")
        .send()
        .await
        .unwrap();
    problem(res, 400, "key-required").await;
    // Invalid JSON, an invalid key.
    problem(gw.begin("t", "k", "{nope").await, 400, "bad-request").await;
    let res = gw
        .post("/v1/tools/t/begin", ACME)
        .header("idempotency-key", "k".repeat(256))
        .body("{}")
        .send()
        .await
        .unwrap();
    problem(res, 400, "bad-request").await;
    // Key reuse with other arguments.
    lease_of(gw.begin("t", "k", r#"{"a":1}"#).await).await;
    let body = problem(gw.begin("t", "k", r#"{"a":2}"#).await, 422, "key-reused").await;
    assert!(!body["detail"].as_str().unwrap().contains("acme/t/k"));
    // Reads pass through, without a key.
    let res = gw
        .post("/v1/tools/search/begin", ACME)
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(
        res.json::<Value>().await.unwrap()["decision"],
        "pass_through"
    );
    // Bad lease text.
    let res = gw
        .post("/v1/tools/t/complete", ACME)
        .json(&json!({"key": "k", "lease": "nope", "outcome": {"kind": "success", "result": 1}}))
        .send()
        .await
        .unwrap();
    problem(res, 400, "bad-request").await;
    // No such route.
    problem(
        gw.get("/v2/nothing", ACME).send().await.unwrap(),
        404,
        "not-found",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_duplicates_get_409_with_retry_after() {
    let gw = start("", "[tools.t]\nwait = \"100ms\"\n").await;
    lease_of(gw.begin("t", "k", "{}").await).await;
    let res = gw.begin("t", "k", "{}").await;
    let retry: u64 = header(&res, "retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry));
    assert_eq!(header(&res, "idempotent-replayed"), Some("false"));
    let body = problem(res, 409, "in-flight").await;
    assert!(body["since"].is_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_racing_begins_execute_once() {
    let gw = Arc::new(start("", "[tools.t]\nwait = \"50ms\"\n").await);
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let gw = gw.clone();
        tasks.push(tokio::spawn(async move {
            gw.begin("t", "race", r#"{"x":1}"#).await.status().as_u16()
        }));
    }
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    assert_eq!(
        statuses.iter().filter(|s| **s == 201).count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 409).count(),
        31,
        "{statuses:?}"
    );
}

#[tokio::test]
async fn release_frees_the_key() {
    let gw = start("", "").await;
    let lease = lease_of(gw.begin("t", "k", "{}").await).await;
    let res = gw
        .post("/v1/tools/t/release", ACME)
        .json(&json!({"key": "k", "lease": lease, "reason": "validation failed"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(
        res.json::<Value>().await.unwrap()["decision"],
        "not_applied"
    );
    lease_of(gw.begin("t", "k", "{}").await).await;
}

#[tokio::test]
async fn ambiguous_blocks_until_resolved() {
    let gw = start("", "").await;
    let lease = lease_of(gw.begin("t", "k", "{}").await).await;
    let res = gw
        .post("/v1/tools/t/ambiguous", ACME)
        .json(&json!({"key": "k", "lease": lease, "reason": "timeout after sending"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.json::<Value>().await.unwrap()["decision"], "unknown");
    let body = problem(gw.begin("t", "k", "{}").await, 409, "outcome-unknown").await;
    assert_eq!(body["fence"], 1);
    assert!(body["since"].is_string());
    // The operator says it happened.
    let res = gw
        .post("/v1/tools/t/records/k/resolve", ACME)
        .json(&json!({"fence": 1, "resolution": "completed", "outcome": {"kind": "success", "result": {"ok": true}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let rec: Value = res.json().await.unwrap();
    assert_eq!(rec["state"], "completed");
    let res = gw.begin("t", "k", "{}").await;
    assert_eq!(res.status(), 200);
    assert_eq!(header(&res, "idempotent-replayed"), Some("true"));
    assert_eq!(
        res.json::<Value>().await.unwrap()["outcome"]["result"],
        json!({"ok": true})
    );
}

/// The reason a caller gives with `ambiguous` is kept on the record's audit trail, and a later
/// call's outcome-unknown answer neither invents a cause (a call that stopped) nor hands out a
/// path template: it names the record's own resolve path, its key percent-encoded.
#[tokio::test]
async fn an_ambiguous_reason_is_audited_and_the_unknown_answer_names_the_resolve_path() {
    let gw = start("audit_log = \"AUDIT\"", "").await;
    let lease = lease_of(gw.begin("send_mail", "mail/1?x", "{}").await).await;
    let res = gw
        .post("/v1/tools/send_mail/ambiguous", ACME)
        .json(&json!({"key": "mail/1?x", "lease": lease, "reason": "smtp timeout"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);

    let audit = std::fs::read_to_string(gw.dir.path().join("audit.jsonl")).unwrap();
    let unknown: Value = audit
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|l| l["event"] == "unknown")
        .unwrap_or_else(|| panic!("no unknown line in {audit}"));
    assert_eq!(unknown["reason"], "smtp timeout", "{unknown}");
    assert_eq!(unknown["fence"], 1);

    let body = problem(
        gw.begin("send_mail", "mail/1?x", "{}").await,
        409,
        "outcome-unknown",
    )
    .await;
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.contains("`POST /v1/tools/send_mail/records/mail%2F1%3Fx/resolve`"),
        "{detail}"
    );
    assert!(
        !detail.contains("{tool}") && !detail.contains("{key}"),
        "{detail}"
    );
    assert!(!detail.contains("stopped before its outcome"), "{detail}");
    // The path it names is the one that resolves the record.
    let res = gw
        .post("/v1/tools/send_mail/records/mail%2F1%3Fx/resolve", ACME)
        .json(&json!({"fence": 1, "resolution": "release"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_over_lease_is_lost() {
    let gw = start("", "[tools.t]\nlease = \"200ms\"\non_unknown = \"retry\"\n").await;
    let first = lease_of(gw.begin("t", "k", "{}").await).await;
    tokio::time::sleep(Duration::from_millis(350)).await;
    // The first holder's lease ran out; under `retry` the duplicate takes the record over.
    let second = lease_of(gw.begin("t", "k", "{}").await).await;
    assert!(second.starts_with("2."), "{second}");
    let stale = json!({"key": "k", "lease": first});
    let stale_done =
        json!({"key": "k", "lease": first, "outcome": {"kind": "success", "result": 1}});
    for (path, body) in [
        ("heartbeat", &stale),
        ("complete", &stale_done),
        ("release", &stale),
        ("ambiguous", &stale),
    ] {
        let res = gw
            .post(&format!("/v1/tools/t/{path}"), ACME)
            .json(body)
            .send()
            .await
            .unwrap();
        problem(res, 409, "lease-lost").await;
    }
    // The new holder is untouched.
    let res = gw
        .post("/v1/tools/t/complete", ACME)
        .json(&json!({"key": "k", "lease": second, "outcome": {"kind": "failed", "result": "no"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
}

#[tokio::test]
async fn fallback_window_keys_calls_without_a_key() {
    let gw = start(
        "",
        "[tools.f]\nfallback_window = \"10s\"\nwait = \"50ms\"\n",
    )
    .await;
    let res = gw
        .post("/v1/tools/f/begin", ACME)
        .body(r#"{"to":"bob"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(header(&res, "idempotency-rule"), Some("fallback"));
    let b: Value = res.json().await.unwrap();
    let key = b["key"].as_str().unwrap().to_owned();
    assert!(key.starts_with("fallback-"));
    let res = gw
        .post("/v1/tools/f/complete", ACME)
        .json(&json!({"key": key, "lease": b["lease"], "outcome": {"kind": "success", "result": "sent"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(header(&res, "idempotency-rule"), Some("fallback"));
    let res = gw
        .post("/v1/tools/f/begin", ACME)
        .body(r#"{"to":"bob"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(header(&res, "idempotency-rule"), Some("fallback"));
    assert_eq!(header(&res, "idempotent-replayed"), Some("true"));
}

#[tokio::test]
async fn identity_fields_make_a_reworded_replan_the_same_action() {
    let gw = start(
        "",
        "[tools.mail]\nfallback_window = \"10s\"\nidentity = [\"to\", \"subject\"]\n",
    )
    .await;
    let begin = |body: &'static str| gw.post("/v1/tools/mail/begin", ACME).body(body).send();
    let res = begin(r#"{"to":"ann","subject":"Refund","body":"Hello Ann, it is on its way."}"#)
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    let b: Value = res.json().await.unwrap();
    let res = gw
        .post("/v1/tools/mail/complete", ACME)
        .json(&json!({"key": b["key"], "lease": b["lease"], "outcome": {"kind": "success", "result": "sent"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    // The body reworded: the same recipient and subject, the same action.
    let res = begin(r#"{"subject":"Refund","to":"ann","body":"Dear Ann, we refunded you."}"#)
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(header(&res, "idempotent-replayed"), Some("true"));
    assert_eq!(header(&res, "idempotency-rule"), Some("fallback"));
    // Another recipient: another action.
    let res = begin(r#"{"to":"bob","subject":"Refund","body":"Dear Ann, we refunded you."}"#)
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
}

#[tokio::test]
async fn tenants_never_meet_in_coordination() {
    let gw = start("", "").await;
    lease_of(gw.begin("t", "same", "{}").await).await;
    let res = gw
        .post("/v1/tools/t/begin", OTHER)
        .header("idempotency-key", "same")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(
        res.status(),
        201,
        "another tenant's identical key is another record"
    );
}

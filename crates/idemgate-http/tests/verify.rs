//! `on_unknown = "verify"`: the gateway asks the tool's `verify_url` whether an unknown call
//! happened, and answers the next call with the same key accordingly.

use serde_json::{json, Value};

use crate::support::{closed_port, header, problem, start, upstream, Gw, Upstream, ACME};

async fn call(gw: &Gw, key: &str) -> reqwest::Response {
    gw.post("/v1/tools/charge/call", ACME)
        .header("idempotency-key", key)
        .body(r#"{"amount":5}"#)
        .send()
        .await
        .unwrap()
}

/// A gateway forwarding `charge` to `up`'s `/flaky` (500 the first time), verified by
/// `verify_url`, after a first call with key `k` whose outcome is unknown.
async fn unknown_then(up: &Upstream, verify_url: &str, server: &str) -> Gw {
    let gw = start(
        server,
        &format!(
            "[tools.charge]\nupstream = \"{}/flaky\"\non_unknown = \"verify\"\nverify_url = \"{verify_url}\"\n",
            up.url
        ),
    )
    .await;
    let body = problem(call(&gw, "k").await, 409, "outcome-unknown").await;
    assert_eq!(body["fence"], 1);
    assert_eq!(up.calls("flaky"), 1);
    assert_eq!(up.calls("applied"), 0, "a first call is not verified");
    gw
}

#[tokio::test]
async fn an_applied_call_replays_the_verified_result() {
    let up = upstream().await;
    let gw = unknown_then(&up, &format!("{}/applied", up.url), "").await;
    let mut executed_at = None;
    for _ in 0..2 {
        let res = call(&gw, "k").await;
        assert_eq!(res.status(), 200, "{:?}", res.text().await);
        assert_eq!(header(&res, "idempotent-replayed"), Some("true"));
        assert_eq!(header(&res, "content-type"), Some("application/json"));
        let at = header(&res, "idempotency-executed-at").unwrap().to_owned();
        assert_eq!(executed_at.get_or_insert_with(|| at.clone()), &at);
        assert_eq!(
            res.json::<Value>().await.unwrap(),
            json!({"charge": "ch_verified"})
        );
    }
    assert_eq!(up.calls("flaky"), 1, "the upstream never ran again");
    assert_eq!(up.calls("applied"), 1, "asked once, then stored");
    // The verify URL got the downstream key the upstream got, in the header and the body.
    let (keys, bodies) = {
        let seen = up.seen.lock().unwrap();
        (seen.keys.clone(), seen.bodies.clone())
    };
    let key = keys[0].clone().unwrap();
    assert_eq!(key.len(), 64);
    assert_eq!(keys[1].as_deref(), Some(key.as_str()));
    let asked: Value = serde_json::from_str(&bodies[1]).unwrap();
    assert_eq!(asked, json!({"idempotency_key": key, "tool": "charge"}));
    // Stored as a JSON result, which a forwarded call replays as a 200 JSON answer.
    let rec = gw.get_json("/v1/tools/charge/records/k", ACME).await;
    assert_eq!(rec["state"], "completed");
    assert_eq!(rec["outcome"]["content"], "json");
    assert_eq!(rec["outcome"]["result"], json!({"charge": "ch_verified"}));
}

#[tokio::test]
async fn a_call_verified_not_applied_runs_again() {
    let up = upstream().await;
    let gw = unknown_then(&up, &format!("{}/not_applied", up.url), "").await;
    let res = call(&gw, "k").await;
    assert_eq!(res.status(), 200);
    assert_eq!(header(&res, "idempotent-replayed"), Some("false"));
    let first: Value = res.json().await.unwrap();
    assert_eq!(first["n"], 2, "a fresh execution");
    assert_eq!(up.calls("flaky"), 2);
    let res = call(&gw, "k").await;
    assert_eq!(header(&res, "idempotent-replayed"), Some("true"));
    assert_eq!(res.json::<Value>().await.unwrap(), first);
    assert_eq!(up.calls("flaky"), 2);
    assert_eq!(up.calls("not_applied"), 1);
}

#[tokio::test]
async fn a_verifier_that_cannot_tell_leaves_the_outcome_unknown() {
    let up = upstream().await;
    let gw = unknown_then(&up, &format!("{}/unknown", up.url), "").await;
    for asked in 1..=2 {
        let body = problem(call(&gw, "k").await, 409, "outcome-unknown").await;
        let detail = body["detail"].as_str().unwrap();
        assert!(detail.contains("could not tell"), "{detail}");
        assert_eq!(up.calls("unknown"), asked);
    }
    assert_eq!(up.calls("flaky"), 1, "never run again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_verifier_leaves_the_outcome_unknown() {
    let dead = closed_port().await;
    // The verify URL's path on the fake (None: a port nothing listens on).
    for (path, server, says) in [
        (Some("fail"), "", "answered 500"),
        (Some("ok"), "", "answer is not"),
        (None, "", "failed to ask"),
        // The probe gets half of the 2 s request timeout; /hang answers after 5 s.
        (Some("hang"), "request_timeout = \"2s\"", "failed to ask"),
    ] {
        let up = upstream().await;
        let verify_url = match path {
            Some(p) => format!("{}/{p}", up.url),
            None => format!("{dead}/v"),
        };
        let gw = unknown_then(&up, &verify_url, server).await;
        let body = problem(call(&gw, "k").await, 409, "outcome-unknown").await;
        let detail = body["detail"].as_str().unwrap();
        assert!(
            detail.contains("verifier failed") && detail.contains(says),
            "{path:?}: {detail}"
        );
        assert!(!detail.contains("127.0.0.1"), "no URL in answers: {detail}");
        assert_eq!(up.calls("flaky"), 1, "{path:?}: never run again");
    }
}

#[tokio::test]
async fn a_coordinated_call_verified_applied_replays_the_result() {
    let up = upstream().await;
    let gw = start(
        "",
        &format!(
            "[tools.t]\non_unknown = \"verify\"\nverify_url = \"{}/applied\"\n",
            up.url
        ),
    )
    .await;
    let begun: Value = gw.begin("t", "c", "{}").await.json().await.unwrap();
    let res = gw
        .post("/v1/tools/t/ambiguous", ACME)
        .json(&json!({"key": "c", "lease": begun["lease"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let res = gw.begin("t", "c", "{}").await;
    assert_eq!(res.status(), 200);
    assert_eq!(header(&res, "idempotent-replayed"), Some("true"));
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["decision"], "replayed");
    assert_eq!(
        body["outcome"],
        json!({"kind": "success", "content": "json", "result": {"charge": "ch_verified"}})
    );
}

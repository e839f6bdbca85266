//! The commerce protocols' idempotency contracts at the gateway (`[tools.NAME] profile`), against
//! the protocols' own examples (tests/fixtures).

use std::sync::Arc;

use serde_json::Value;

use crate::support::{header, start, upstream, Gw, Upstream, ACME};

/// The Agentic Commerce Protocol's examples: requests and the idempotency errors.
fn acp() -> Value {
    let text = include_str!("fixtures/acp-examples.json");
    serde_json::from_str(text).unwrap()
}

async fn post(gw: &Gw, tool: &str, key: Option<&str>, body: &Value) -> reqwest::Response {
    post_text(gw, tool, key, body.to_string()).await
}

async fn post_text(gw: &Gw, tool: &str, key: Option<&str>, body: String) -> reqwest::Response {
    let mut req = gw
        .post(&format!("/v1/tools/{tool}/call"), ACME)
        .header("content-type", "application/json")
        .header("api-version", "2026-04-17")
        .body(body);
    if let Some(key) = key {
        req = req.header("idempotency-key", key);
    }
    req.send().await.unwrap()
}

/// A request of `tool` (forwarded to the fake upstream's `/gate`) with `key` and `body` that
/// is still running, and the answer to the same request sent meanwhile, which carries a
/// `Retry-After`. The first answers once the test opens the gate.
async fn while_in_flight(
    gw: &Arc<Gw>,
    up: &Upstream,
    tool: &'static str,
    key: &'static str,
    body: &Value,
) -> (
    tokio::task::JoinHandle<reqwest::Response>,
    reqwest::Response,
) {
    let running = {
        let (gw, body) = (gw.clone(), body.clone());
        tokio::spawn(async move { post(&gw, tool, Some(key), &body).await })
    };
    up.wait_for_calls("gate", 1).await;
    let busy = post(gw, tool, Some(key), body).await;
    assert!(
        header(&busy, "retry-after").is_some(),
        "{:?}",
        busy.headers()
    );
    (running, busy)
}

/// What an ACP error answer holds: its status and its flat error object.
async fn acp_error(res: reqwest::Response) -> (u16, Value) {
    let status = res.status().as_u16();
    assert_eq!(
        header(&res, "content-type"),
        Some("application/json"),
        "ACP errors are plain JSON"
    );
    (status, res.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acp_profile_answers_as_the_agentic_commerce_protocol_says() {
    let up = upstream().await;
    let examples = acp();
    let config = format!(
        "[tools.create_checkout_session]\nupstream = \"{0}/ok\"\nprofile = \"acp\"\n\n\
         [tools.update_checkout_session]\nupstream = \"{0}/gate\"\nprofile = \"acp\"\nwait = \"200ms\"\n\n\
         [tools.complete_checkout_session]\nupstream = \"{0}/flaky\"\nprofile = \"acp\"\n",
        up.url
    );
    let gw = Arc::new(start("", &config).await);
    let create = &examples["create_checkout_session_request"];

    // 6.1: a POST without Idempotency-Key: 400 idempotency_key_required, nothing forwarded.
    let (status, error) = acp_error(post(&gw, "create_checkout_session", None, create).await).await;
    assert_eq!(status, 400);
    assert_eq!(error, examples["error_400_idempotency_key_required"]);
    assert_eq!(up.calls("ok"), 0);

    // 6.3: the same key and body (its members in another order, `7999.0` for `7999`): the
    // original answer, with its
    // status, and Idempotent-Replayed: true; the key echoed on every answer.
    let first = post(&gw, "create_checkout_session", Some("key_create_1"), create).await;
    assert_eq!(first.status().as_u16(), 200);
    assert_eq!(header(&first, "idempotency-key"), Some("key_create_1"));
    let first_body = first.text().await.unwrap();
    let members: Vec<String> = create
        .as_object()
        .unwrap()
        .iter()
        .rev()
        .map(|(k, v)| format!("{}: {v}", Value::String(k.clone())))
        .collect();
    let reordered = format!("{{ {} }}", members.join(", "));
    // 6.2: trailing zeros are the same number.
    assert_eq!(
        reordered.matches("\"amount\":7999,").count(),
        1,
        "{reordered}"
    );
    let reordered = reordered.replace("\"amount\":7999,", "\"amount\":7999.0,");
    assert_ne!(reordered, create.to_string());
    let again = post_text(
        &gw,
        "create_checkout_session",
        Some("key_create_1"),
        reordered,
    )
    .await;
    assert_eq!(again.status().as_u16(), 200);
    assert_eq!(header(&again, "idempotent-replayed"), Some("true"));
    assert_eq!(header(&again, "idempotency-key"), Some("key_create_1"));
    assert_eq!(again.text().await.unwrap(), first_body);
    assert_eq!(up.calls("ok"), 1, "a replay never re-executes");

    // 6.4: the same key with another body: 422 idempotency_conflict.
    let mut changed = create.clone();
    changed["order_notes"] = Value::String("Ring twice.".into());
    let (status, error) = acp_error(
        post(
            &gw,
            "create_checkout_session",
            Some("key_create_1"),
            &changed,
        )
        .await,
    )
    .await;
    assert_eq!(status, 422);
    assert_eq!(error, examples["error_422_idempotency_conflict"]);
    // 6.2: null is not absent.
    let mut cleared = create.clone();
    cleared["order_notes"] = Value::Null;
    let (status, _) = acp_error(
        post(
            &gw,
            "create_checkout_session",
            Some("key_create_1"),
            &cleared,
        )
        .await,
    )
    .await;
    assert_eq!(status, 422, "null clears a field: another body");

    // 6.4: the same key while the first request runs: 409 idempotency_in_flight, Retry-After.
    let update = &examples["update_checkout_session_request"];
    let (running, busy) =
        while_in_flight(&gw, &up, "update_checkout_session", "key_update_1", update).await;
    let (status, error) = acp_error(busy).await;
    assert_eq!(status, 409);
    assert_eq!(error, examples["error_409_idempotency_in_flight"]);
    up.open_gate();
    assert_eq!(running.await.unwrap().status().as_u16(), 200);
    assert_eq!(up.calls("gate"), 1);

    // 6.5: a 5xx is not kept: the caller gets it, and the retry with the key runs fresh.
    let complete = serde_json::json!({"payment_data": {"token": "spt_123", "provider": "stripe"}});
    let failed = post(
        &gw,
        "complete_checkout_session",
        Some("key_complete_1"),
        &complete,
    )
    .await;
    assert_eq!(failed.status().as_u16(), 500);
    assert_eq!(header(&failed, "idempotency-key"), Some("key_complete_1"));
    let retried = post(
        &gw,
        "complete_checkout_session",
        Some("key_complete_1"),
        &complete,
    )
    .await;
    assert_eq!(retried.status().as_u16(), 200);
    assert_eq!(header(&retried, "idempotent-replayed"), Some("false"));
    assert_eq!(up.calls("flaky"), 2);
    let replayed = post(
        &gw,
        "complete_checkout_session",
        Some("key_complete_1"),
        &complete,
    )
    .await;
    assert_eq!(header(&replayed, "idempotent-replayed"), Some("true"));
    assert_eq!(up.calls("flaky"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_acp_profile_refuses_a_configuration_that_breaks_its_contract() {
    for (extra, says) in [
        ("profile = \"acp\"\n", "set its upstream"),
        (
            "upstream = \"http://127.0.0.1:9/x\"\nprofile = \"acp\"\nfallback_window = \"10s\"\n",
            "names every request's action by its key",
        ),
        (
            "upstream = \"http://127.0.0.1:9/x\"\nprofile = \"acp\"\nttl = \"1h\"\n",
            "at least 24h",
        ),
        (
            "upstream = \"http://127.0.0.1:9/x\"\nprofile = \"stripe\"\n",
            "unknown variant",
        ),
        (
            "upstream = \"http://127.0.0.1:9/x\"\nprofile = \"ucp\"\nttl = \"12h\"\n",
            "profile \"ucp\" keeps a key's response at least 24h, not 12h",
        ),
        (
            "upstream = \"http://127.0.0.1:9/x\"\nprofile = \"x402\"\nfallback_window = \"10s\"\n",
            "profile \"x402\" names every request's action by its key",
        ),
        ("profile = \"x402\"\n", "set its upstream"),
        (
            "upstream = \"http://127.0.0.1:9/x\"\nprofile = \"ucp\"\nkind = \"read\"\n",
            "a tool of kind \"read\" would drop it",
        ),
        (
            "upstream = \"http://127.0.0.1:9/x\"\nprofile = \"x402\"\non_unknown = \"retry\"\n",
            "would send the signed payment again",
        ),
    ] {
        let text = crate::support::config_text("", &format!("[tools.checkout]\n{extra}"));
        let err = idemgate_http::Config::parse(&text).unwrap_err().to_string();
        assert!(err.contains(says), "{extra}: {err}");
    }
    // Under acp a key past its retention is a new request: no tombstone unless configured.
    let text = crate::support::config_text(
        "",
        "[tools.checkout]\nupstream = \"http://127.0.0.1:9/x\"\nprofile = \"acp\"\n",
    );
    let config = idemgate_http::Config::parse(&text).unwrap();
    assert_eq!(
        config.policy("checkout").tombstone,
        std::time::Duration::ZERO
    );
}

/// The Universal Commerce Protocol's examples: requests, and the answer UCP gives a key reused.
fn ucp() -> Value {
    serde_json::from_str(include_str!("fixtures/ucp-examples.json")).unwrap()
}

/// What a UCP protocol error holds: its status and its `{"code", "content"}`.
async fn ucp_error(res: reqwest::Response) -> (u16, Value) {
    let status = res.status().as_u16();
    assert_eq!(header(&res, "content-type"), Some("application/json"));
    let body: Value = res.json().await.unwrap();
    assert_eq!(
        body.as_object().unwrap().keys().collect::<Vec<_>>(),
        ["code", "content"],
        "UCP protocol errors are code and content: {body}"
    );
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ucp_profile_answers_as_the_universal_commerce_protocol_says() {
    let up = upstream().await;
    let examples = ucp();
    let config = format!(
        "[tools.create_checkout]\nupstream = \"{0}/ok\"\nprofile = \"ucp\"\n\n\
         [tools.complete_checkout]\nupstream = \"{0}/gate\"\nprofile = \"ucp\"\nwait = \"200ms\"\n",
        up.url
    );
    let gw = Arc::new(start("", &config).await);
    let create = examples["create_checkout_request_text"]
        .as_str()
        .unwrap()
        .to_owned();
    let key = examples["create_checkout_idempotency_key"]
        .as_str()
        .unwrap();

    // The OpenAPI requires the key on every state-changing operation: 400, nothing forwarded.
    let (status, error) =
        ucp_error(post_text(&gw, "create_checkout", None, create.clone()).await).await;
    assert_eq!(
        (status, &error["code"]),
        (400, &Value::from("idempotency_key_required"))
    );
    assert_eq!(up.calls("ok"), 0);

    // The same key and the same body bytes: the cached answer, not executed again.
    let first = post_text(&gw, "create_checkout", Some(key), create.clone()).await;
    assert_eq!(first.status().as_u16(), 200);
    let first_body = first.text().await.unwrap();
    let again = post_text(&gw, "create_checkout", Some(key), create.clone()).await;
    assert_eq!(again.status().as_u16(), 200);
    assert_eq!(header(&again, "idempotent-replayed"), Some("true"));
    assert_eq!(again.text().await.unwrap(), first_body);
    assert_eq!(up.calls("ok"), 1, "a replay never re-executes");

    // Compared by the SHA-256 of the raw body bytes: the same JSON written otherwise is a
    // mismatched body, 409, and nothing runs.
    let rewritten = r#"{"line_items": [{"quantity": 2, "item": {"id": "item_123"}}]}"#;
    assert_eq!(
        serde_json::from_str::<Value>(rewritten).unwrap(),
        serde_json::from_str::<Value>(&create).unwrap()
    );
    let (status, error) =
        ucp_error(post_text(&gw, "create_checkout", Some(key), rewritten.to_owned()).await).await;
    assert_eq!(status, 409);
    assert_eq!(error, examples["error_409_key_reused"]);
    assert_eq!(up.calls("ok"), 1);

    // The same key while the first request runs: 503 with Retry-After, which UCP's clients
    // retry (a 409 would tell them the body never matches).
    let complete = examples["complete_checkout_request"].clone();
    let (running, busy) = while_in_flight(
        &gw,
        &up,
        "complete_checkout",
        "complete-key-0001",
        &complete,
    )
    .await;
    let (status, error) = ucp_error(busy).await;
    assert_eq!(
        (status, &error["code"]),
        (503, &Value::from("idempotency_in_flight"))
    );
    up.open_gate();
    let done = running.await.unwrap();
    assert_eq!(done.status().as_u16(), 200);
    let done_body = done.text().await.unwrap();
    let retried = post(
        &gw,
        "complete_checkout",
        Some("complete-key-0001"),
        &complete,
    )
    .await;
    assert_eq!(header(&retried, "idempotent-replayed"), Some("true"));
    assert_eq!(retried.text().await.unwrap(), done_body);
    assert_eq!(up.calls("gate"), 1, "the order is placed once");
}

/// x402's examples: a payment, its demand and its receipts, as the spec decodes its headers.
fn x402() -> Value {
    serde_json::from_str(include_str!("fixtures/x402-examples.json")).unwrap()
}

fn base64(value: &Value) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(value.to_string())
}

fn unbase64(text: &str) -> Value {
    use base64::Engine as _;
    serde_json::from_slice(
        &base64::engine::general_purpose::STANDARD
            .decode(text)
            .unwrap(),
    )
    .unwrap()
}

/// What the x402 resource saw: the requests it served, all it got, and those whose downstream
/// key did not match their payment (one without the other).
#[derive(Default)]
struct Counts {
    served: usize,
    requests: usize,
    keyed_wrongly: usize,
}

/// A resource server paid with x402, as its middleware answers: 402 with `PAYMENT-REQUIRED`
/// without a payment; with one, verify, serve, settle: the resource and a `PAYMENT-RESPONSE`
/// receipt; 402 with a new demand (no receipt, nothing served) when the payment's signature is
/// `0xdeclined` (refused at verification); the resource served and then 402 with the failed
/// receipt when it is `0xunsettled` (settlement failed after the work). Counts the requests it
/// served and all it got.
async fn x402_resource(examples: Value) -> (String, Arc<std::sync::Mutex<Counts>>) {
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::IntoResponse;
    let counts = Arc::new(std::sync::Mutex::new(Counts::default()));
    let seen = counts.clone();
    let app = axum::Router::new().route(
        "/premium-data",
        axum::routing::post(move |headers: HeaderMap, body: String| {
            let (examples, seen) = (examples.clone(), seen.clone());
            async move {
                {
                    let mut c = seen.lock().unwrap();
                    c.requests += 1;
                    // A paid request carries the gate's downstream key, an unpaid one none.
                    if headers.contains_key("idempotency-key")
                        != headers.contains_key("payment-signature")
                    {
                        c.keyed_wrongly += 1;
                    }
                }
                let Some(payment) = headers.get("payment-signature") else {
                    let demand = base64(&examples["payment_required"]);
                    return (StatusCode::PAYMENT_REQUIRED, [("payment-required", demand)], "{}")
                        .into_response();
                };
                let payment = unbase64(payment.to_str().unwrap());
                if payment["payload"]["signature"] == "0xdeclined" {
                    let mut demand = examples["payment_required"].clone();
                    demand["error"] = Value::from("invalid_exact_evm_payload_signature");
                    let demand = base64(&demand);
                    return (StatusCode::PAYMENT_REQUIRED, [("payment-required", demand)], "{}")
                        .into_response();
                }
                let served = {
                    let mut c = seen.lock().unwrap();
                    c.served += 1;
                    c.served
                };
                if payment["payload"]["signature"] == "0xunsettled" {
                    let receipt = base64(&examples["settlement_failure"]);
                    return (StatusCode::PAYMENT_REQUIRED, [("payment-response", receipt)], "{}")
                        .into_response();
                }
                let receipt = base64(&examples["settlement_success"]);
                let answer = serde_json::json!({"data": "premium market data response", "query": serde_json::from_str::<Value>(&body).unwrap()["query"], "served": served});
                (
                    [("payment-response", receipt), ("content-type", "application/json".to_owned())],
                    answer.to_string(),
                )
                    .into_response()
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/premium-data", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, counts)
}

async fn pay(gw: &Gw, payment: Option<&Value>, body: &Value) -> reqwest::Response {
    let mut req = gw
        .post("/v1/tools/premium_data/call", ACME)
        .body(body.to_string());
    if let Some(payment) = payment {
        req = req.header("payment-signature", base64(payment));
    }
    req.send().await.unwrap()
}

/// What an x402 refusal holds: its status and its `{"error", "code"}`.
async fn x402_error(res: reqwest::Response) -> (u16, Value) {
    let status = res.status().as_u16();
    assert_eq!(header(&res, "content-type"), Some("application/json"));
    (status, res.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x402_profile_pays_once_per_payment_identifier() {
    let examples = x402();
    let (url, counts) = x402_resource(examples.clone()).await;
    let config = format!("[tools.premium_data]\nupstream = \"{url}\"\nprofile = \"x402\"\n");
    let gw = start("", &config).await;
    let body = &examples["request_body"];
    // The payment of the spec's example, echoing the extension with the identifier.
    let mut payment = examples["payment_payload"].clone();
    payment["extensions"] = examples["payment_identifier_echo"]["extensions"].clone();

    // Asking the price: no payment, no record; the demand comes back with its header.
    let demand = pay(&gw, None, body).await;
    assert_eq!(demand.status().as_u16(), 402);
    let required = header(&demand, "payment-required").expect("the demand is relayed");
    assert_eq!(unbase64(required), examples["payment_required"]);

    // Paid with an identifier: served, with the settlement receipt.
    let first = pay(&gw, Some(&payment), body).await;
    assert_eq!(first.status().as_u16(), 200);
    assert_eq!(header(&first, "idempotent-replayed"), Some("false"));
    let receipt = header(&first, "payment-response").unwrap().to_owned();
    assert_eq!(unbase64(&receipt), examples["settlement_success"]);
    let first_body = first.text().await.unwrap();

    // The same identifier, payment and body (the client's retry after a lost answer): the
    // cached answer and its receipt, and the resource is not paid for or served again.
    let again = pay(&gw, Some(&payment), body).await;
    assert_eq!(again.status().as_u16(), 200);
    assert_eq!(header(&again, "idempotent-replayed"), Some("true"));
    assert_eq!(header(&again, "payment-response"), Some(receipt.as_str()));
    assert_eq!(again.text().await.unwrap(), first_body);
    assert_eq!(counts.lock().unwrap().served, 1);

    // The same identifier with another payment (signed anew) or another body: 409.
    let mut resigned = payment.clone();
    resigned["payload"]["authorization"]["nonce"] = Value::from("0x01");
    let (status, error) = x402_error(pay(&gw, Some(&resigned), body).await).await;
    assert_eq!(
        (status, &error["code"]),
        (409, &Value::from("payment_identifier_conflict"))
    );
    let other = serde_json::json!({"query": "yesterday's market data"});
    let (status, _) = x402_error(pay(&gw, Some(&payment), &other).await).await;
    assert_eq!(status, 409);
    assert_eq!(counts.lock().unwrap().served, 1);

    // A payment without an identifier: refused, never sent upstream.
    let before = counts.lock().unwrap().requests;
    let (status, error) =
        x402_error(pay(&gw, Some(&examples["payment_payload"]), body).await).await;
    assert_eq!(
        (status, &error["code"]),
        (400, &Value::from("payment_identifier_required"))
    );
    // An identifier outside the extension's form: 16 to 128 letters, digits, - and _.
    let mut short = payment.clone();
    short["extensions"]["payment-identifier"]["info"]["id"] = Value::from("pay_1");
    let (status, error) = x402_error(pay(&gw, Some(&short), body).await).await;
    assert_eq!(
        (status, &error["code"]),
        (400, &Value::from("invalid_payload"))
    );
    assert!(
        error["error"].as_str().unwrap().contains("16-128"),
        "{error}"
    );
    assert_eq!(
        counts.lock().unwrap().requests,
        before,
        "nothing refused reached the upstream"
    );

    // A payment refused at verification (402 with a new demand, no receipt) did nothing and is
    // not kept: the client's next payment under the same identifier runs.
    let mut declined = payment.clone();
    declined["extensions"]["payment-identifier"]["info"]["id"] =
        Value::from("pay_second_action_0001");
    declined["payload"]["signature"] = Value::from("0xdeclined");
    let refused = pay(&gw, Some(&declined), body).await;
    assert_eq!(refused.status().as_u16(), 402);
    let demand = unbase64(header(&refused, "payment-required").unwrap());
    assert_eq!(demand["error"], "invalid_exact_evm_payload_signature");
    let mut topped_up = declined.clone();
    topped_up["payload"] = payment["payload"].clone();
    let paid = pay(&gw, Some(&topped_up), body).await;
    assert_eq!(paid.status().as_u16(), 200);
    assert_eq!(header(&paid, "idempotent-replayed"), Some("false"));
    assert_eq!(counts.lock().unwrap().served, 2);

    // A settlement that failed after the resource was served (402 with the failed receipt):
    // the caller gets that answer, and the outcome is unknown, so no payment under the
    // identifier serves it again until an operator resolves it.
    let mut unsettled = payment.clone();
    unsettled["extensions"]["payment-identifier"]["info"]["id"] =
        Value::from("pay_third_action_0001");
    unsettled["payload"]["signature"] = Value::from("0xunsettled");
    let failed = pay(&gw, Some(&unsettled), body).await;
    assert_eq!(failed.status().as_u16(), 402);
    let receipt_failed = header(&failed, "payment-response").unwrap();
    assert_eq!(unbase64(receipt_failed), examples["settlement_failure"]);
    assert_eq!(counts.lock().unwrap().served, 3);
    let mut paid_again = unsettled.clone();
    paid_again["payload"] = payment["payload"].clone();
    // The same payment again: unknown; a payment signed anew under the identifier: another
    // request under a used key.
    for (retry, code) in [
        (&unsettled, "outcome_unknown"),
        (&paid_again, "payment_identifier_conflict"),
    ] {
        let (status, error) = x402_error(pay(&gw, Some(retry), body).await).await;
        assert_eq!(
            (status, error["code"].as_str()),
            (409, Some(code)),
            "{error}"
        );
    }
    assert_eq!(counts.lock().unwrap().served, 3, "never served twice");

    assert_eq!(counts.lock().unwrap().keyed_wrongly, 0);

    // Version 1's header has no identifier: refused with the way to send one.
    let v1 = gw
        .post("/v1/tools/premium_data/call", ACME)
        .header("x-payment", base64(&payment))
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let (status, error) = x402_error(v1).await;
    assert_eq!(status, 400);
    assert!(
        error["error"]
            .as_str()
            .unwrap()
            .contains("PAYMENT-SIGNATURE"),
        "{error}"
    );
}

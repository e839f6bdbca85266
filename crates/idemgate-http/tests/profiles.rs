//! The commerce protocols' idempotency contracts at the gateway (`[tools.NAME] profile`), against
//! the protocols' own examples (tests/fixtures).

use std::sync::Arc;

use serde_json::Value;

use crate::support::{header, start, upstream, Gw, ACME};

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
    let update = examples["update_checkout_session_request"].clone();
    let running = {
        let (gw, update) = (gw.clone(), update.clone());
        tokio::spawn(async move {
            post(
                &gw,
                "update_checkout_session",
                Some("key_update_1"),
                &update,
            )
            .await
        })
    };
    up.wait_for_calls("gate", 1).await;
    let busy = post(
        &gw,
        "update_checkout_session",
        Some("key_update_1"),
        &update,
    )
    .await;
    assert!(
        header(&busy, "retry-after").is_some(),
        "{:?}",
        busy.headers()
    );
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
            "Idempotency-Key on every POST",
        ),
        (
            "upstream = \"http://127.0.0.1:9/x\"\nprofile = \"acp\"\nttl = \"1h\"\n",
            "at least 24h",
        ),
        (
            "upstream = \"http://127.0.0.1:9/x\"\nprofile = \"stripe\"\n",
            "unknown variant",
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

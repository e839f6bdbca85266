//! Requests the gateway cannot read unambiguously are refused before anything is reserved.

use crate::support::{problem, start, upstream, ACME};

#[tokio::test]
async fn two_idempotency_key_headers_are_refused_before_anything_runs() {
    let up = upstream().await;
    let gw = start(
        "",
        &format!("[tools.charge]\nupstream = \"{}/ok\"\n", up.url),
    )
    .await;
    for tool_path in ["/v1/tools/t/begin", "/v1/tools/charge/call"] {
        let res = gw
            .post(tool_path, ACME)
            .header("idempotency-key", "first")
            .header("idempotency-key", "second")
            .body("{}")
            .send()
            .await
            .unwrap();
        let body = problem(res, 400, "bad-request").await;
        assert!(
            body["detail"].as_str().unwrap().contains("only one"),
            "{body}"
        );
    }
    assert_eq!(up.calls("ok"), 0, "nothing was sent upstream");
    for (tool, key) in [("t", "first"), ("t", "second"), ("charge", "first")] {
        let res = gw
            .get(&format!("/v1/tools/{tool}/records/{key}"), ACME)
            .send()
            .await
            .unwrap();
        problem(res, 404, "not-found").await;
    }
    // One header is still fine.
    assert_eq!(gw.begin("t", "first", "{}").await.status(), 201);
}

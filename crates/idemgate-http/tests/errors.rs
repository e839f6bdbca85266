//! Every error the router gives is an RFC 9457 problem, and requests it cannot read unambiguously
//! are refused before anything is reserved.

use crate::support::{header, problem, start, upstream, ACME};

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

#[tokio::test]
async fn rejections_of_queries_paths_and_methods_are_problems() {
    let gw = start("", "").await;
    let body = problem(
        gw.get("/v1/records?limit=abc", ACME).send().await.unwrap(),
        400,
        "bad-request",
    )
    .await;
    assert!(body["detail"].as_str().unwrap().contains("limit"), "{body}");
    // A percent-encoded path segment that is not UTF-8.
    let res = gw
        .post("/v1/tools/%FF/begin", ACME)
        .header("idempotency-key", "k")
        .body("{}")
        .send()
        .await
        .unwrap();
    problem(res, 400, "bad-request").await;
    // A known route with the wrong method: 405 with the methods it takes.
    let res = gw.get("/v1/tools/t/begin", ACME).send().await.unwrap();
    assert_eq!(header(&res, "allow"), Some("POST"));
    problem(res, 405, "method-not-allowed").await;
    let res = gw
        .http
        .delete(format!("{}/healthz", gw.url))
        .send()
        .await
        .unwrap();
    assert_eq!(header(&res, "allow"), Some("GET,HEAD"));
    problem(res, 405, "method-not-allowed").await;
    // No such route.
    problem(
        gw.get("/v1/nothing/here", ACME).send().await.unwrap(),
        404,
        "not-found",
    )
    .await;
}

#[tokio::test]
async fn unauthorized_answers_carry_a_bearer_challenge() {
    let gw = start("", "").await;
    let url = format!("{}/v1/records", gw.url);
    let cases: [(Option<&str>, &str); 4] = [
        (None, r#"Bearer realm="idemgate""#),
        (
            Some("Basic YWxhZGRpbjpvcGVuc2VzYW1l"),
            r#"Bearer realm="idemgate""#,
        ),
        (
            Some("Bearer not-the-token"),
            r#"Bearer realm="idemgate", error="invalid_token""#,
        ),
        (
            Some("Bearer "),
            r#"Bearer realm="idemgate", error="invalid_request""#,
        ),
    ];
    for (authorization, challenge) in cases {
        let mut req = gw.http.get(&url);
        if let Some(a) = authorization {
            req = req.header("authorization", a);
        }
        let res = req.send().await.unwrap();
        assert_eq!(
            header(&res, "www-authenticate"),
            Some(challenge),
            "{authorization:?}"
        );
        problem(res, 401, "unauthorized").await;
    }
}

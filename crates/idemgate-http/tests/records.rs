//! The operator view: list, show and resolve, each scoped to the caller's tenant.

use serde_json::{json, Value};

use crate::support::{problem, start, ACME, OTHER};

#[tokio::test]
async fn records_are_listed_shown_and_scoped_to_the_tenant() {
    let gw = start("", "").await;
    for k in ["a", "b/with slash"] {
        let res = gw
            .post("/v1/tools/t/begin", ACME)
            .header("idempotency-key", k.replace(' ', "_"))
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 201);
    }
    let list: Vec<Value> = gw
        .get("/v1/records?state=in_flight&tool=t&limit=10", ACME)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!(list[0]["key"], "a");
    assert_eq!(list[0]["tenant"], "acme");
    assert_eq!(list[0]["state"], "in_flight");
    assert!(list[0]["lease_until"].is_string());
    assert_eq!(list[0]["fence"], 1);
    let empty: Vec<Value> = gw
        .get("/v1/records", OTHER)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(empty.is_empty(), "another tenant sees nothing");
    let none: Vec<Value> = gw
        .get("/v1/records?state=unknown", ACME)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(none.is_empty());
    problem(
        gw.get("/v1/records?state=bogus", ACME)
            .send()
            .await
            .unwrap(),
        400,
        "bad-request",
    )
    .await;

    let one: Value = gw
        .get("/v1/tools/t/records/b%2Fwith_slash", ACME)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(one["key"], "b/with_slash");
    problem(
        gw.get("/v1/tools/t/records/a", OTHER).send().await.unwrap(),
        404,
        "not-found",
    )
    .await;
    problem(
        gw.get("/v1/tools/t/records/zzz", ACME)
            .send()
            .await
            .unwrap(),
        404,
        "not-found",
    )
    .await;
}

#[tokio::test]
async fn resolve_refuses_records_that_are_not_unknown() {
    let gw = start("", "").await;
    let b: Value = gw.begin("t", "k", "{}").await.json().await.unwrap();
    let res = gw
        .post("/v1/tools/t/records/k/resolve", ACME)
        .json(&json!({"fence": 1, "resolution": "release"}))
        .send()
        .await
        .unwrap();
    let p = problem(res, 409, "not-resolvable").await;
    assert_eq!(p["state"], "in_flight");
    let res = gw
        .post("/v1/tools/t/records/nothing/resolve", ACME)
        .json(&json!({"fence": 1, "resolution": "release"}))
        .send()
        .await
        .unwrap();
    problem(res, 404, "not-found").await;
    // Mark it unknown, then release it: the next call runs.
    gw.post("/v1/tools/t/ambiguous", ACME)
        .json(&json!({"key": "k", "lease": b["lease"]}))
        .send()
        .await
        .unwrap();
    let res = gw
        .post("/v1/tools/t/records/k/resolve", ACME)
        .json(&json!({"fence": 1, "resolution": "release"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.json::<Value>().await.unwrap(), Value::Null);
    assert_eq!(gw.begin("t", "k", "{}").await.status(), 201);
}

//! The operator view: list, show and resolve, each scoped to the caller's tenant.

use serde_json::{json, Value};

use crate::support::{header, problem, start, upstream, ACME, OTHER};

/// The records of a list answer's page.
fn records(page: Value) -> Vec<Value> {
    page["records"]
        .as_array()
        .unwrap_or_else(|| panic!("a page of records: {page}"))
        .clone()
}

/// Following `next` (and the `Link` header, which must name the same page) from the first page
/// of `query` with pages of two reaches every record once, in order; the count is every record's,
/// not the page's, and a cursor that is not one is refused.
#[tokio::test]
async fn records_page_through_every_record_with_next_and_link() {
    let gw = start("", "").await;
    let mut keys = Vec::new();
    for i in 0..7 {
        let key = format!("{}-{i}", if i % 2 == 0 { "even" } else { "odd" });
        assert_eq!(gw.begin("t", &key, "{}").await.status(), 201);
        keys.push(key);
    }
    for (filter, mut wanted) in [
        ("", keys.clone()),
        (
            "key_prefix=even-",
            keys.iter()
                .filter(|k| k.starts_with("even-"))
                .cloned()
                .collect::<Vec<_>>(),
        ),
    ] {
        // The order is the listing's (creation time, then names): the whole listing says it.
        let whole: Vec<String> = records(
            gw.get_json(&format!("/v1/records?limit=1000&{filter}"), ACME)
                .await,
        )
        .iter()
        .map(|r| r["key"].as_str().unwrap().to_owned())
        .collect();
        let mut sorted = whole.clone();
        sorted.sort();
        wanted.sort();
        assert_eq!(sorted, wanted, "{filter}: the whole listing");
        let wanted = whole;
        let query = format!("limit=2&{filter}");
        let query = query.trim_end_matches('&');
        let mut seen = Vec::new();
        let mut url = format!("/v1/records?{query}");
        let mut pages = 0;
        loop {
            pages += 1;
            assert!(pages <= keys.len(), "{query}: the pages never end");
            let res = gw.get(&url, ACME).send().await.unwrap();
            assert_eq!(res.status(), 200);
            let link = res
                .headers()
                .get("link")
                .map(|v| v.to_str().unwrap().to_owned());
            let page: Value = res.json().await.unwrap();
            assert_eq!(page["count"], wanted.len(), "{query}: the count: {page}");
            assert_eq!(page["count_exact"], true);
            let got = records(page.clone());
            assert!(got.len() <= 2);
            seen.extend(got.iter().map(|r| r["key"].as_str().unwrap().to_owned()));
            match page["next"].as_str() {
                Some(next) => {
                    let link = link.expect("a Link header with a next page");
                    let target = link
                        .strip_prefix('<')
                        .and_then(|l| l.strip_suffix(">; rel=\"next\""))
                        .unwrap_or_else(|| panic!("a next link: {link}"));
                    assert!(target.starts_with("/v1/records?"), "{target}");
                    assert!(target.contains(&format!("cursor={next}")), "{target}");
                    for part in query.split('&') {
                        assert!(target.contains(part), "{target} keeps {part}");
                    }
                    url = target.to_owned();
                }
                None => {
                    assert!(link.is_none(), "no Link header on the last page");
                    break;
                }
            }
        }
        assert_eq!(seen, wanted, "{query}: every record once, in order");
    }
    problem(
        gw.get("/v1/records?cursor=not-a-cursor", ACME)
            .send()
            .await
            .unwrap(),
        400,
        "bad-request",
    )
    .await;
}

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
    let list = records(
        gw.get("/v1/records?state=in_flight&tool=t&limit=10", ACME)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap(),
    );
    assert_eq!(list.len(), 2);
    assert_eq!(list[0]["key"], "a");
    assert_eq!(list[0]["tenant"], "acme");
    assert_eq!(list[0]["state"], "in_flight");
    assert!(list[0]["lease_until"].is_string());
    assert_eq!(list[0]["fence"], 1);
    let empty = records(
        gw.get("/v1/records", OTHER)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap(),
    );
    assert!(empty.is_empty(), "another tenant sees nothing");
    let none = records(
        gw.get("/v1/records?state=unknown", ACME)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap(),
    );
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
        .get_json("/v1/tools/t/records/b%2Fwith_slash", ACME)
        .await;
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

/// A replay of an outcome an operator recorded says so, in the coordination API's body and in a
/// header of forwarded calls too, as the MCP proxy's `_meta` and `exec` say it; an outcome the
/// action itself returned says nothing of the kind.
#[tokio::test]
async fn a_replay_of_an_operators_resolution_says_an_operator_resolved_it() {
    let up = upstream().await;
    let gw = start(
        "",
        &format!("[tools.charge]\nupstream = \"{}/fail\"\n", up.url),
    )
    .await;
    let call = || {
        gw.post("/v1/tools/charge/call", ACME)
            .header("idempotency-key", "c-1")
            .body("{}")
            .send()
    };
    // The upstream's 500: the outcome is unknown.
    problem(call().await.unwrap(), 409, "outcome-unknown").await;
    let lease = gw
        .begin("t", "k", "{}")
        .await
        .json::<Value>()
        .await
        .unwrap()["lease"]
        .clone();
    gw.post("/v1/tools/t/ambiguous", ACME)
        .json(&json!({"key": "k", "lease": lease}))
        .send()
        .await
        .unwrap();
    for (tool, key) in [("charge", "c-1"), ("t", "k")] {
        let res = gw
            .post(&format!("/v1/tools/{tool}/records/{key}/resolve"), ACME)
            .json(
                &json!({"fence": 1, "resolution": "completed", "reason": "seen at the bank",
                "outcome": {"kind": "success", "result": {"charged": true}}}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
    }

    let replayed = call().await.unwrap();
    assert_eq!(replayed.status(), 200);
    assert_eq!(header(&replayed, "idempotent-replayed"), Some("true"));
    assert_eq!(
        header(&replayed, "idempotency-resolved-by"),
        Some("operator")
    );
    assert_eq!(
        replayed.json::<Value>().await.unwrap(),
        json!({"charged": true})
    );
    let replayed = gw.begin("t", "k", "{}").await;
    assert_eq!(
        header(&replayed, "idempotency-resolved-by"),
        Some("operator")
    );
    let body: Value = replayed.json().await.unwrap();
    assert_eq!(body["decision"], "replayed");
    assert_eq!(body["resolved_by"], "operator", "{body}");

    // An outcome the action returned is no operator's.
    let lease = gw
        .begin("t", "ran", "{}")
        .await
        .json::<Value>()
        .await
        .unwrap()["lease"]
        .clone();
    gw.post("/v1/tools/t/complete", ACME)
        .json(&json!({"key": "ran", "lease": lease, "outcome": {"kind": "success", "result": 1}}))
        .send()
        .await
        .unwrap();
    let replayed = gw.begin("t", "ran", "{}").await;
    assert_eq!(header(&replayed, "idempotent-replayed"), Some("true"));
    assert_eq!(header(&replayed, "idempotency-resolved-by"), None);
    let body: Value = replayed.json().await.unwrap();
    assert!(body.get("resolved_by").is_none(), "{body}");
}

#[tokio::test]
async fn reopen_lets_a_completed_call_run_again_and_is_audited() {
    let gw = start("audit_log = \"AUDIT\"", "").await;
    let b: Value = gw.begin("t", "k", "{}").await.json().await.unwrap();
    let reopen = |fence: u64, token| {
        gw.post("/v1/tools/t/records/k/reopen", token)
            .json(&json!({"fence": fence, "reason": "the charge bounced"}))
            .send()
    };
    // In flight: its call may be running the action now.
    let p = problem(reopen(1, ACME).await.unwrap(), 409, "not-resolvable").await;
    assert_eq!(p["state"], "in_flight");
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("wait until it finishes"),
        "{p}"
    );
    let res = gw
        .post("/v1/tools/t/complete", ACME)
        .json(
            &json!({"key": "k", "lease": b["lease"], "outcome": {"kind": "success", "result": 1}}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(gw.begin("t", "k", "{}").await.status(), 200, "a replay");

    problem(reopen(1, OTHER).await.unwrap(), 404, "not-found").await;
    let p = problem(reopen(2, ACME).await.unwrap(), 409, "not-resolvable").await;
    assert_eq!(
        (p["state"].as_str(), p["fence"].as_u64()),
        (Some("completed"), Some(1))
    );
    let res = gw
        .post("/v1/tools/t/records/k/reopen", ACME)
        .json(&json!({"fence": 1}))
        .send()
        .await
        .unwrap();
    problem(res, 400, "bad-request").await;

    let res = reopen(1, ACME).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(
        res.json::<Value>().await.unwrap(),
        json!({"reopened": true, "was": "completed", "fence": 1})
    );
    problem(
        gw.get("/v1/tools/t/records/k", ACME).send().await.unwrap(),
        404,
        "not-found",
    )
    .await;
    let again = gw.begin("t", "k", "{}").await;
    assert_eq!(again.status(), 201, "the call runs again");
    let again: Value = again.json().await.unwrap();
    assert!(
        again["lease"].as_str().unwrap().starts_with("2."),
        "at the next fence: {again}"
    );
    // A reopening retried at the old fence leaves the new record alone.
    let p = problem(reopen(1, ACME).await.unwrap(), 409, "not-resolvable").await;
    assert_eq!(p["fence"], 2);

    let audit = std::fs::read_to_string(gw.dir.path().join("audit.jsonl")).unwrap();
    let line: Value = audit
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|l| l["event"] == "reopened")
        .unwrap_or_else(|| panic!("no reopened line in {audit}"));
    assert_eq!(line["by"], "tenant:acme");
    assert_eq!(line["reason"], "the charge bounced");
    assert_eq!(line["was"], "completed");
    assert_eq!(line["fence"], 1);
}

#[tokio::test]
async fn records_list_by_scope() {
    let gw = start("", "").await;
    assert_eq!(gw.begin("t", "k", "{}").await.status(), 201);
    let all = records(gw.get_json("/v1/records", ACME).await);
    assert_eq!(all.len(), 1);
    assert!(
        all[0].get("scope").is_none(),
        "no scope, no member: {}",
        all[0]
    );
    let scoped = gw
        .get_json("/v1/records?scope=conversation%3A1", ACME)
        .await;
    assert_eq!(
        scoped,
        json!({"records": [], "next": null, "count": 0, "count_exact": true})
    );
}

/// A record carries its story: the reason `ambiguous` gave, the key the upstream got, and who
/// resolved it and why, read from the store by `GET …/records/{key}`.
#[tokio::test]
async fn a_record_shows_why_it_became_unknown_and_who_resolved_it() {
    let gw = start("", "").await;
    let b: Value = gw.begin("mail", "m-1", "{}").await.json().await.unwrap();
    let res = gw
        .post("/v1/tools/mail/ambiguous", ACME)
        .json(&json!({"key": "m-1", "lease": b["lease"], "reason": "smtp timeout"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200, "{}", res.text().await.unwrap());
    let view: Value = gw.get_json("/v1/tools/mail/records/m-1", ACME).await;
    assert_eq!(view["reason"], "smtp timeout", "{view}");
    let downstream = view["downstream_key"].as_str().unwrap();
    assert!(
        downstream.len() == 64 && downstream.bytes().all(|b| b.is_ascii_hexdigit()),
        "{view}"
    );
    let whats: Vec<&str> = view["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["what"].as_str().unwrap())
        .collect();
    assert_eq!(whats, ["reserved", "became_unknown"], "{view}");

    let res = gw
        .post("/v1/tools/mail/records/m-1/resolve", ACME)
        .json(&json!({"fence": 1, "resolution": "release", "reason": "bounced: never delivered"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    // Released, it counts as absent; the next call runs and its record continues the trail.
    assert_eq!(gw.begin("mail", "m-1", "{}").await.status(), 201);
    let view: Value = gw.get_json("/v1/tools/mail/records/m-1", ACME).await;
    let released = view["history"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["what"] == "resolved_released")
        .unwrap_or_else(|| panic!("{view}"));
    assert_eq!(released["by"], "tenant:acme", "{view}");
    assert_eq!(released["reason"], "bounced: never delivered", "{view}");
    assert!(view.get("reason").is_none(), "in flight now: {view}");
}

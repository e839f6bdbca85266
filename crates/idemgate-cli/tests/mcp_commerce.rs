//! `idemgate mcp` in front of servers that speak the commerce protocols' MCP bindings
//! (`profile = "acp" | "ucp" | "x402"`): a real proxy process over stdio before a fixture server
//! (tests/fixtures/mcp_commerce_server.py) that answers with the protocols' own examples
//! (tests/fixtures/commerce-mcp-examples.json), on a real SQLite file. Executions are counted on
//! the server's side.

use serde_json::{json, Value};

use crate::cli::Sandbox;
use crate::mcp::{verdict, Proxy};

const SERVER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/mcp_commerce_server.py"
);

fn examples() -> Value {
    serde_json::from_str(include_str!("fixtures/commerce-mcp-examples.json")).unwrap()
}

/// An initialized proxy with `profile` (and the `extra` configuration) before the commerce
/// fixture.
fn commerce(sb: &Sandbox, profile: &str, extra: &str) -> Proxy {
    let mut command = sb.idemgate();
    command.env("FIXTURE_LOG", sb.path("executed"));
    let config = format!("profile = \"{profile}\"\n{extra}");
    let mut p = Proxy::spawn(sb.mcp(command, &config, &["python3", SERVER]), sb);
    p.initialize();
    p
}

/// The `params` of an example request, with `edit` applied.
fn params_of(example: &Value, edit: impl FnOnce(&mut Value)) -> Value {
    let mut params = example["params"].clone();
    edit(&mut params);
    params
}

/// The JSON-RPC error -32000 the binding answers a refusal with: its `data`, and the proxy's
/// explanation in its message.
fn protocol_error(response: &Value) -> &Value {
    let error = &response["error"];
    assert_eq!(error["code"], -32000, "{response}");
    assert!(
        error["message"].as_str().unwrap().starts_with("idemgate: "),
        "the model is told why: {response}"
    );
    &error["data"]
}

/// The keys the server received, in order (the fixture logs "TOOL KEY" per execution).
fn keys_seen(sb: &Sandbox) -> Vec<String> {
    sb.executed()
        .iter()
        .map(|line| line.split_once(' ').unwrap().1.to_owned())
        .collect()
}

#[test]
fn mcp_acp_binding_keys_by_meta_and_refuses_in_acps_words() {
    let sb = Sandbox::new();
    let ex = examples();
    let mut p = commerce(&sb, "acp", "");
    let create = &ex["create_checkout_session_request"];
    let model_key = "idem_550e8400-e29b-41d4-a716-446655440000";

    // The example's create: run once, its result the server's. The server gets the record's
    // key in meta.idempotency_key, never the one the model wrote.
    let first = p.request("tools/call", params_of(create, |_| {}));
    assert_eq!(
        first["result"]["id"], ex["create_checkout_session_response"]["result"]["id"],
        "{first}"
    );
    let sent = keys_seen(&sb);
    assert_eq!(sent.len(), 1);
    assert!(
        sent[0].len() == 64
            && sent[0].bytes().all(|b| b.is_ascii_hexdigit())
            && sent[0] != model_key,
        "{sent:?}"
    );

    // Re-sent, and re-sent with other meta (meta is not the request body): the stored result.
    for edit in [
        Box::new(|_: &mut Value| {}) as Box<dyn FnOnce(&mut Value)>,
        Box::new(|p: &mut Value| p["arguments"]["meta"]["user_agent"] = json!("AgentShop/2.0")),
    ] {
        let again = p.request("tools/call", params_of(create, edit));
        assert_eq!(
            again["result"]["_meta"]["dev.idemgate/replayed"], true,
            "{again}"
        );
        assert_eq!(again["result"]["id"], first["result"]["id"], "{again}");
        assert_eq!(
            again["result"]["status"], first["result"]["status"],
            "{again}"
        );
    }
    assert_eq!(sb.executed().len(), 1, "a replay never re-executes");

    // The model's key names the action in its conversation only: another conversation with
    // the same key and body is another action, and the server gets another key for it.
    let other = p.request(
        "tools/call",
        params_of(create, |p| {
            p["_meta"] = json!({"dev.idemgate/conversation": "another-conversation"})
        }),
    );
    assert!(
        other["result"]["_meta"]["dev.idemgate/replayed"].is_null(),
        "{other}"
    );
    let sent = keys_seen(&sb);
    assert_eq!(sent.len(), 2);
    assert_ne!(
        sent[0], sent[1],
        "no conversation reaches another's action at the server"
    );

    // The same key with another body: ACP's idempotency_conflict, nothing run.
    let changed = params_of(create, |p| {
        p["arguments"]["payload"]["currency"] = json!("eur")
    });
    let conflict = p.request("tools/call", changed);
    let data = protocol_error(&conflict);
    assert_eq!(
        (&data["type"], &data["code"]),
        (&json!("invalid_request"), &json!("idempotency_conflict")),
        "{conflict}"
    );

    // The example's cancel carries no key: idempotency_key_required, and the model is told
    // where the binding puts it; nothing run.
    let cancel = p.request(
        "tools/call",
        params_of(&ex["cancel_checkout_session_request"], |_| {}),
    );
    assert_eq!(
        protocol_error(&cancel)["code"],
        "idempotency_key_required",
        "{cancel}"
    );
    assert!(
        cancel["error"]["message"]
            .as_str()
            .unwrap()
            .contains("meta.idempotency_key"),
        "{cancel}"
    );
    assert_eq!(sb.executed().len(), 2);

    // Named by a program's key instead: the server still gets the record's key in meta.
    let by_program = p.request(
        "tools/call",
        params_of(&ex["cancel_checkout_session_request"], |p| {
            p["_meta"] = json!({"dev.idemgate/idempotency-key": "order-42-cancel"})
        }),
    );
    assert_eq!(by_program["result"]["status"], "canceled", "{by_program}");
    let sent = keys_seen(&sb);
    assert_eq!(sent.len(), 3);
    assert!(
        sent[2].len() == 64 && sent[2] != "order-42-cancel",
        "{sent:?}"
    );

    // The binding's read passes without a key, and the listing offers no other key argument.
    let got = p.request(
        "tools/call",
        params_of(&ex["get_checkout_session_request"], |_| {}),
    );
    assert_eq!(got["result"]["id"], "checkout_session_123", "{got}");
    let listed = p.request("tools/list", json!({}));
    for tool in listed["result"]["tools"].as_array().unwrap() {
        let offered = !tool["inputSchema"]["properties"]["idempotency_key"].is_null();
        let binding = tool["name"]
            .as_str()
            .unwrap()
            .ends_with("_checkout_session");
        // Another write of the same server keeps the offer.
        assert_eq!(offered, !binding, "{tool}");
    }

    // A request the server refuses as invalid_request did nothing: its error goes back as the
    // server wrote it, and the key is free for the corrected request.
    let key = |p: &mut Value| p["arguments"]["meta"]["idempotency_key"] = json!("idem_second_0001");
    let invalid = p.request(
        "tools/call",
        params_of(create, |p| {
            key(p);
            p["arguments"]["payload"]
                .as_object_mut()
                .unwrap()
                .remove("currency");
        }),
    );
    assert_eq!(
        invalid["error"], ex["error_invalid_request"]["error"],
        "{invalid}"
    );
    let corrected = p.request("tools/call", params_of(create, key));
    assert_eq!(
        corrected["result"]["id"], first["result"]["id"],
        "{corrected}"
    );
    assert_eq!(sb.executed().len(), 4);
}

#[test]
fn mcp_ucp_binding_keys_by_meta_idempotency_key() {
    let sb = Sandbox::new();
    let ex = examples();
    let mut p = commerce(&sb, "ucp", "");
    let complete = &ex["ucp_complete_checkout_request"];

    let first = p.request("tools/call", params_of(complete, |_| {}));
    assert_eq!(
        first["result"]["structuredContent"]["status"], "completed",
        "{first}"
    );
    // Another platform profile in meta is the same request.
    let again = p.request(
        "tools/call",
        params_of(complete, |p| {
            p["arguments"]["meta"]["ucp-agent"]["profile"] = json!("https://platform.example/p2")
        }),
    );
    assert_eq!(
        again["result"]["_meta"]["dev.idemgate/replayed"], true,
        "{again}"
    );
    // The server got the record's key, written as the UUID its schema asks for.
    let sent = keys_seen(&sb);
    assert_eq!(sent.len(), 1);
    let uuid: Vec<usize> = sent[0].split('-').map(str::len).collect();
    assert_eq!(uuid, [8, 4, 4, 4, 12], "{sent:?}");
    assert_ne!(sent[0], "550e8400-e29b-41d4-a716-446655440000");

    // The key reused with another payment: the -32000 UCP's overview names for a 409.
    let conflict = p.request(
        "tools/call",
        params_of(complete, |p| {
            p["arguments"]["checkout"]["payment"]["instruments"][0]["id"] = json!("pi_other")
        }),
    );
    let data = protocol_error(&conflict);
    assert_eq!(
        data,
        &json!({"code": "idempotency_conflict", "content": "Idempotency key reused with different payload"})
    );

    // Without its key: refused (UCP names no error for it: the proxy's own answer), telling
    // the model where the binding puts it.
    let keyless = p.request(
        "tools/call",
        params_of(complete, |p| {
            p["arguments"]["meta"]
                .as_object_mut()
                .unwrap()
                .remove("idempotency-key");
        }),
    );
    assert_eq!(verdict(&keyless), "key_required", "{keyless}");
    assert!(
        keyless.to_string().contains(r#"meta[\"idempotency-key\"]"#),
        "{keyless}"
    );

    // The binding's read passes without a key; the example's cancel_cart runs under its own.
    let read = p.request(
        "tools/call",
        params_of(&ex["ucp_get_checkout_request"], |_| {}),
    );
    assert_eq!(
        read["result"]["structuredContent"]["id"], "checkout_abc123",
        "{read}"
    );
    let cancel = p.request(
        "tools/call",
        params_of(&ex["ucp_cancel_cart_request"], |_| {}),
    );
    assert_eq!(
        cancel["result"]["structuredContent"]["status"], "canceled",
        "{cancel}"
    );
    let tools: Vec<String> = sb
        .executed()
        .iter()
        .map(|l| l.split(' ').next().unwrap().to_owned())
        .collect();
    assert_eq!(tools, ["complete_checkout", "cancel_cart"]);
}

#[test]
fn mcp_x402_binding_pays_once_per_payment_identifier() {
    let sb = Sandbox::new();
    let ex = examples();
    let mut p = commerce(
        &sb,
        "x402",
        "[tools.financial_analysis]\non_unknown = \"block\"\n",
    );
    let paid = &ex["x402_paid_request"];
    let echo = ex["x402_payment_identifier_echo"]["extensions"].clone();
    let with_id = |id: &str| {
        params_of(paid, |p| {
            let mut ext = echo.clone();
            ext["payment-identifier"]["info"]["id"] = json!(id);
            p["_meta"]["x402/payment"]["extensions"] = ext;
        })
    };

    // Without a payment (the tool configured, its policy a write's): the server's payment
    // demand, as it wrote it; nothing kept or run, and asking again gets it again.
    for _ in 0..2 {
        let unpaid = p.request(
            "tools/call",
            params_of(paid, |p| {
                p.as_object_mut().unwrap().remove("_meta");
            }),
        );
        assert_eq!(
            unpaid["result"], ex["x402_payment_required_response"]["result"],
            "{unpaid}"
        );
    }

    // Paid under an identifier: run once; the retry gets the result and its receipt back.
    let first = p.request(
        "tools/call",
        with_id("pay_7d5d747be160e280504c099d984bcfe0"),
    );
    let receipt = &ex["x402_paid_response"]["result"]["_meta"]["x402/payment-response"];
    assert_eq!(
        &first["result"]["_meta"]["x402/payment-response"], receipt,
        "{first}"
    );
    let again = p.request(
        "tools/call",
        with_id("pay_7d5d747be160e280504c099d984bcfe0"),
    );
    assert_eq!(
        again["result"]["_meta"]["dev.idemgate/replayed"], true,
        "{again}"
    );
    assert_eq!(
        &again["result"]["_meta"]["x402/payment-response"], receipt,
        "{again}"
    );
    assert_eq!(
        sb.executed(),
        ["financial_analysis pay_7d5d747be160e280504c099d984bcfe0"]
    );

    // The identifier with a payment signed anew: another request under a used key.
    let mut resigned = with_id("pay_7d5d747be160e280504c099d984bcfe0");
    resigned["_meta"]["x402/payment"]["payload"]["authorization"]["nonce"] = json!("0x01");
    let conflict = p.request("tools/call", resigned);
    assert_eq!(verdict(&conflict), "key_reused", "{conflict}");

    // A payment without an identifier, or with one outside the extension's form: refused.
    let bare = p.request("tools/call", params_of(paid, |_| {}));
    assert_eq!(verdict(&bare), "key_required", "{bare}");
    let short = p.request("tools/call", with_id("pay_1"));
    assert_eq!(verdict(&short), "bad_request", "{short}");
    assert!(
        short["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("16-128"),
        "{short}"
    );

    // A paid call answered with a payment demand ("Settlement failed"): the binding answers a
    // refused payment and a settlement that failed after the tool ran alike, so the caller
    // gets the server's answer and the outcome is unknown: no payment under the identifier
    // runs the tool again.
    let mut declined = with_id("pay_second_action_0001");
    declined["_meta"]["x402/payment"]["payload"]["signature"] = json!("0xdeclined");
    let refused = p.request("tools/call", declined.clone());
    assert_eq!(
        refused["result"], ex["x402_settlement_failed_response"]["result"],
        "{refused}"
    );
    let same = p.request("tools/call", declined);
    assert_eq!(verdict(&same), "unknown", "{same}");
    let repaid = p.request("tools/call", with_id("pay_second_action_0001"));
    assert_ne!(verdict(&repaid), "", "refused, not run: {repaid}");
    assert_eq!(
        sb.executed(),
        ["financial_analysis pay_7d5d747be160e280504c099d984bcfe0"]
    );
}

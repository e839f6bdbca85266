//! `idemgate mcp --listen` with `[oauth]`: the proxy as an OAuth 2.1 resource server, in front of
//! the fixture server, against an authorization server run by the test
//! (tests/fixtures/oauth_server.py: authlib and joserfc, real RSA and EC keys), driven by raw
//! HTTP for every kind of token and by the Python SDK's OAuth client (discovery, dynamic
//! registration, authorization code with PKCE).

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::cli::Sandbox;
use crate::mcp::{mcp_deps, Reaped};
use crate::mcp_http::{http_to, replayed, Answer, Listening};

const DEADLINE: Duration = Duration::from_secs(60);
const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/mcp_server.py");
const AUTH_SERVER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/oauth_server.py"
);
const STATIC_TOKEN: &str = "a-static-token-of-the-ops-team";
const INIT: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;
const COUNT: &str = r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"count","arguments":{"label":"x"}}}"#;

/// The authorization server of a test: it grants the authorization code flow to `subject`, and
/// mints any token a test asks for.
struct AuthServer {
    _child: Reaped,
    issuer: String,
    addr: String,
}

impl AuthServer {
    fn start(subject: &str) -> AuthServer {
        let mut child = Reaped(
            Command::new(mcp_deps().join("venv/bin/python"))
                .arg(AUTH_SERVER)
                .arg(subject)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap(),
        );
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx
            .recv_timeout(DEADLINE)
            .expect("the authorization server never said where it listens");
        let issuer = serde_json::from_str::<Value>(&line)
            .unwrap_or_else(|e| panic!("{e}: {line:?} (run scripts/mcp-test-deps for authlib)"))
            ["issuer"]
            .as_str()
            .unwrap()
            .to_owned();
        let addr = issuer.trim_start_matches("http://").to_owned();
        AuthServer {
            _child: child,
            issuer,
            addr,
        }
    }

    fn post(&self, path: &str, body: &Value) -> Value {
        let a = http_to(&self.addr, "POST", path, &[], &body.to_string());
        assert_eq!(a.status, 200, "{path}: {}", a.body);
        a.json()
    }

    /// A token signed by the current key with `claims` over the defaults (iss, sub alice, iat,
    /// exp in 5 minutes); `extra` adds to the request (`key`, `kid`).
    fn mint(&self, claims: Value, extra: Value) -> String {
        let mut body = json!({ "claims": claims });
        if let Value::Object(extra) = extra {
            body.as_object_mut().unwrap().extend(extra);
        }
        self.post("/mint", &body)["token"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// A new signing key of `kind` ("EC" or "RSA") replaces the current one; its kid.
    fn rotate(&self, kind: &str) -> String {
        self.post("/rotate", &json!({ "type": kind }))["kid"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// How often the JWKS was fetched.
    fn jwks_fetches(&self) -> u64 {
        http_to(&self.addr, "GET", "/stats", &[], "").json()["jwks_fetches"]
            .as_u64()
            .unwrap()
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A free loopback port: the resource identifier (the audience) names the port, so it is
/// chosen before the proxy starts.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A proxy in front of the fixture whose `[oauth]` trusts `auth`, maps alice to team-a and bob
/// to team-b, requires the scope `mcp:tools`, and keeps one static tenant; and its resource.
fn oauth_proxy(sb: &Sandbox, auth: &AuthServer) -> (Listening, String) {
    oauth_proxy_with(sb, auth, "")
}

/// [`oauth_proxy`] with `extra` at the end of its configuration.
fn oauth_proxy_with(sb: &Sandbox, auth: &AuthServer, extra: &str) -> (Listening, String) {
    let port = free_port();
    let resource = format!("http://127.0.0.1:{port}/mcp");
    let config = format!(
        r#"
[oauth]
resource = "{resource}"
authorization_servers = ["{issuer}"]
required_scopes = ["mcp:tools"]
jwks_refetch_interval = "1h"

[oauth.tenants]
alice = "team-a"
bob = "team-b"

[[tenants]]
id = "ops"
token_sha256 = "{hash}"
{extra}"#,
        issuer = auth.issuer,
        hash = idemgate_http::token_sha256(STATIC_TOKEN),
    );
    let p = sb.listen_at(
        &format!("127.0.0.1:{port}"),
        &config,
        &["--", "python3", FIXTURE],
    );
    (p, resource)
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

fn init_with(p: &Listening, token: &str) -> Answer {
    p.http("POST", &[("authorization", &bearer(token))], INIT)
}

/// A keyed `count` in the session `sid` of `token`.
fn count(p: &Listening, token: &str, sid: &str, key: &str) -> Answer {
    let auth = bearer(token);
    p.http(
        "POST",
        &[
            ("authorization", &auth),
            ("mcp-session-id", sid),
            ("idempotency-key", key),
        ],
        COUNT,
    )
}

/// The tenants of the records of the sandbox's store, by key.
fn record_tenants(sb: &Sandbox) -> Vec<(String, String)> {
    let out = sb.run(&["keys", "list", "--all-tenants", "--json"]);
    assert!(out.status.success(), "{}", crate::cli::text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut seen: Vec<(String, String)> = v
        .as_array()
        .unwrap_or_else(|| panic!("{v}"))
        .iter()
        .map(|r| {
            let name = |field: &str| r["key"][field].as_str().unwrap().to_owned();
            (name("key"), name("tenant"))
        })
        .collect();
    seen.sort();
    seen
}

#[test]
fn mcp_oauth_publishes_its_metadata_and_challenges_with_it() {
    let auth = AuthServer::start("alice");
    let sb = Sandbox::new();
    let (p, resource) = oauth_proxy(&sb, &auth);
    let metadata = format!("http://{}/.well-known/oauth-protected-resource/mcp", p.addr);

    // No token: 401 naming the metadata and the scope, without an error (RFC 6750, 3.1).
    let none = p.http("POST", &[], INIT);
    assert_eq!(none.status, 401, "{}", none.body);
    assert_eq!(
        none.header("www-authenticate"),
        format!(r#"Bearer resource_metadata="{metadata}", scope="mcp:tools""#)
    );
    assert_eq!(none.json()["error"]["code"], -32000, "{}", none.body);

    // The metadata, at the path-suffixed well-known URL and the bare one, without a token.
    for path in [
        "/.well-known/oauth-protected-resource/mcp",
        "/.well-known/oauth-protected-resource",
    ] {
        let m = http_to(&p.addr, "GET", path, &[], "");
        assert_eq!(m.status, 200, "{path}: {}", m.body);
        let doc = m.json();
        assert_eq!(doc["resource"], resource.as_str(), "{doc}");
        assert_eq!(doc["authorization_servers"], json!([auth.issuer]), "{doc}");
        assert_eq!(doc["scopes_supported"], json!(["mcp:tools"]), "{doc}");
        assert_eq!(doc["bearer_methods_supported"], json!(["header"]), "{doc}");
    }
    assert!(sb.executed().is_empty());
}

#[test]
fn mcp_oauth_tokens_are_checked_and_name_their_tenant() {
    let auth = AuthServer::start("alice");
    let sb = Sandbox::new();
    let (p, resource) = oauth_proxy(&sb, &auth);
    let good = |sub: &str| {
        auth.mint(
            json!({"sub": sub, "aud": resource, "scope": "mcp:tools other"}),
            json!({}),
        )
    };
    let alice = good("alice");
    let bob = good("bob");

    // Every bad token is refused before any session starts, and says why.
    let refused = |token: &str, status: u16, error: &str, why: &str| {
        let a = init_with(&p, token);
        assert_eq!(a.status, status, "{why}: {}", a.body);
        let challenge = a.header("www-authenticate");
        assert!(
            challenge.starts_with("Bearer resource_metadata=\"http://")
                && challenge.contains(&format!("error=\"{error}\"")),
            "{why}: {challenge}"
        );
        let message = a.json()["error"]["message"].as_str().unwrap().to_owned();
        assert!(message.contains(why), "{message} should say {why:?}");
    };
    let other_audience = auth.mint(
        json!({"aud": "http://127.0.0.1:1/mcp", "scope": "mcp:tools"}),
        json!({}),
    );
    refused(&other_audience, 401, "invalid_token", "audience");
    let other_issuer = auth.mint(
        json!({"iss": "http://127.0.0.1:1", "aud": resource, "scope": "mcp:tools"}),
        json!({}),
    );
    refused(&other_issuer, 401, "invalid_token", "issuer");
    let expired = auth.mint(
        json!({"aud": resource, "scope": "mcp:tools", "exp": now() - 3600, "iat": now() - 7200}),
        json!({}),
    );
    refused(&expired, 401, "invalid_token", "expired");
    let early = auth.mint(
        json!({"aud": resource, "scope": "mcp:tools", "nbf": now() + 3600}),
        json!({}),
    );
    refused(&early, 401, "invalid_token", "not valid yet");
    let forged = auth.mint(
        json!({"aud": resource, "scope": "mcp:tools"}),
        json!({"key": "stranger"}),
    );
    refused(&forged, 401, "invalid_token", "signature");
    // A good token's claims swapped for bob's under alice's signature.
    let (head, rest) = alice.split_once('.').unwrap();
    let (_, sig) = rest.split_once('.').unwrap();
    let bobs_claims = bob.split('.').nth(1).unwrap();
    refused(
        &format!("{head}.{bobs_claims}.{sig}"),
        401,
        "invalid_token",
        "signature",
    );
    // alg none, with alice's claims.
    let none_header = "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0";
    let claims = alice.split('.').nth(1).unwrap();
    refused(
        &format!("{none_header}.{claims}."),
        401,
        "invalid_token",
        "algorithm",
    );
    refused("not-a-jwt", 401, "invalid_token", "not a JWT");
    let unscoped = auth.mint(json!({"aud": resource, "scope": "other"}), json!({}));
    refused(&unscoped, 403, "insufficient_scope", "mcp:tools");
    let a = init_with(&p, &unscoped);
    assert!(
        a.header("www-authenticate").contains("scope=\"mcp:tools\""),
        "{}",
        a.header("www-authenticate")
    );
    let stranger = auth.mint(
        json!({"sub": "mallory", "aud": resource, "scope": "mcp:tools"}),
        json!({}),
    );
    let a = init_with(&p, &stranger);
    assert_eq!(a.status, 403, "{}", a.body);
    assert!(a.body.contains("mallory"), "{}", a.body);
    assert!(sb.executed().is_empty(), "refused requests reach no server");

    // Good tokens: each subject in its mapped tenant, and the static token beside them.
    let sid_a = p.session(&alice);
    let sid_b = p.session(&bob);
    let sid_ops = p.session(STATIC_TOKEN);
    let a1 = count(&p, &alice, &sid_a, "order-1");
    assert_eq!(a1.status, 200, "{}", a1.body);
    assert!(!replayed(&a1.json()["result"]), "{}", a1.body);
    let a2 = count(&p, &alice, &sid_a, "order-1");
    assert!(replayed(&a2.json()["result"]), "{}", a2.body);
    // Bob's same key is another tenant's action: it runs, and never sees alice's result.
    let b1 = count(&p, &bob, &sid_b, "order-1");
    assert!(!replayed(&b1.json()["result"]), "{}", b1.body);
    let ops = count(&p, STATIC_TOKEN, &sid_ops, "order-9");
    assert!(!replayed(&ops.json()["result"]), "{}", ops.body);
    assert_eq!(sb.executed(), ["count x", "count x", "count x"]);
    // A session is its tenant's: bob's token cannot use alice's.
    let stolen = count(&p, &bob, &sid_a, "order-1");
    assert_eq!(stolen.status, 404, "{}", stolen.body);
    assert_eq!(
        record_tenants(&sb),
        [
            ("order-1".to_owned(), "team-a".to_owned()),
            ("order-1".to_owned(), "team-b".to_owned()),
            ("order-9".to_owned(), "ops".to_owned()),
        ]
    );
    assert_eq!(sb.executed().len(), 3);
}

#[test]
fn mcp_oauth_fetches_rotated_keys_once_for_an_unknown_kid() {
    let auth = AuthServer::start("alice");
    let sb = Sandbox::new();
    let (p, resource) = oauth_proxy(&sb, &auth);
    let claims = json!({"aud": resource, "scope": "mcp:tools"});
    let before = auth.mint(claims.clone(), json!({}));
    assert_eq!(init_with(&p, &before).status, 200);
    assert_eq!(auth.jwks_fetches(), 1);
    assert_eq!(init_with(&p, &before).status, 200);
    assert_eq!(auth.jwks_fetches(), 1, "the keys are kept");

    // The authorization server rotates to an EC key: its first token makes the proxy fetch the
    // keys again, and is taken (ES256).
    let kid = auth.rotate("EC");
    let after = auth.mint(claims.clone(), json!({}));
    let a = init_with(&p, &after);
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(auth.jwks_fetches(), 2, "fetched again for {kid}");

    // A made-up kid is refused without another fetch within jwks_refetch_interval, and so is a
    // token of the retired key.
    let made_up = auth.mint(claims.clone(), json!({"kid": "no-such-key"}));
    let a = init_with(&p, &made_up);
    assert_eq!(a.status, 401, "{}", a.body);
    assert!(a.body.contains("no-such-key"), "{}", a.body);
    let a = init_with(&p, &before);
    assert_eq!(a.status, 401, "{}", a.body);
    assert_eq!(auth.jwks_fetches(), 2, "bounded: no fetch per unknown kid");
}

#[test]
fn mcp_oauth_a_mapped_tenant_of_tenants_shares_its_rate_limit_with_its_static_token() {
    let auth = AuthServer::start("alice");
    let sb = Sandbox::new();
    // One request, then none for 100 s.
    let extra = format!(
        "[[tenants]]\nid = \"team-a\"\ntoken_sha256 = \"{}\"\nrate_limit_per_second = 0.01\n",
        idemgate_http::token_sha256("static-token-of-team-a")
    );
    let (p, resource) = oauth_proxy_with(&sb, &auth, &extra);
    let alice = auth.mint(json!({"aud": resource, "scope": "mcp:tools"}), json!({}));
    assert_eq!(init_with(&p, &alice).status, 200);
    let again = init_with(&p, "static-token-of-team-a");
    assert_eq!(again.status, 429, "{}", again.body);
    assert_eq!(init_with(&p, &alice).status, 429);
    // Bob's tenant has no limit.
    let bob = auth.mint(
        json!({"sub": "bob", "aud": resource, "scope": "mcp:tools"}),
        json!({}),
    );
    assert_eq!(init_with(&p, &bob).status, 200);
}

#[test]
fn mcp_oauth_python_sdk_client_authorizes_and_calls_through_the_proxy() {
    sdk_client_through_oauth("2025");
}

#[test]
fn mcp_oauth_python_sdk_client_authorizes_and_calls_sessionless_in_the_2026_era() {
    sdk_client_through_oauth("2026");
}

#[test]
fn mcp_oauth_an_unreachable_authorization_server_is_an_outage_not_a_bad_token() {
    let sb = Sandbox::new();
    // An issuer on a port nobody listens on: its keys cannot be fetched.
    let issuer = format!("http://127.0.0.1:{}", free_port());
    let port = free_port();
    let resource = format!("http://127.0.0.1:{port}/mcp");
    let config =
        format!("[oauth]\nresource = \"{resource}\"\nauthorization_servers = [\"{issuer}\"]\n");
    let p = sb.listen_at(
        &format!("127.0.0.1:{port}"),
        &config,
        &["--", "python3", FIXTURE],
    );
    let auth = AuthServer::start("alice");
    // Well signed, but by a server the proxy cannot reach to learn its keys.
    let token = auth.mint(json!({"iss": issuer, "aud": resource}), json!({}));
    let a = init_with(&p, &token);
    assert_eq!(a.status, 503, "{}", a.body);
    assert!(a.body.contains("could not be fetched"), "{}", a.body);
    assert_eq!(
        a.header("www-authenticate"),
        "",
        "no challenge: the token is not at fault"
    );
    assert!(sb.executed().is_empty());
}

/// The Python SDK's OAuth client in `era` through the whole flow against the proxy and the
/// test's authorization server; a keyed call and its replay.
fn sdk_client_through_oauth(era: &str) {
    let auth = AuthServer::start("alice");
    let sb = Sandbox::new();
    let (p, _resource) = oauth_proxy(&sb, &auth);
    let mut client = sb.python_client("mcp_oauth_client.py");
    client.arg(&p.url).env("MCP_ERA", era);
    let seen = sb.client_saw(client);
    assert_eq!(seen["authorize"], json!(["/authorize"]), "{seen}");
    assert_eq!(seen["registered"], true, "{seen}");
    assert_eq!(seen["scope"], "mcp:tools", "{seen}");
    assert!(
        seen["tools"].as_array().unwrap().contains(&json!("count")),
        "{seen}"
    );
    assert!(!replayed(&seen["first"]), "{seen}");
    assert!(replayed(&seen["again"]), "{seen}");
    assert_eq!(seen["first"]["content"][0], seen["again"]["content"][0]);
    assert_eq!(sb.executed(), ["count oauth"]);
    assert_eq!(
        record_tenants(&sb),
        [("oauth-1".to_owned(), "team-a".to_owned())]
    );
}

//! The console's OpenID Connect sign-in, end to end: `idemgate serve` with `[console.oidc]`
//! against an OpenID Connect provider run by the test (tests/fixtures/oidc_provider.py: PKCE
//! checked by authlib, ID tokens signed by joserfc with a real RSA key), driven by plain HTTP
//! that follows redirects with a cookie jar, as a browser would.

use std::collections::HashMap;
use std::io::{BufRead as _, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::cli::{announced, http, Sandbox};
use crate::mcp::Reaped;
use crate::mcp_http::Answer;

const PROVIDER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/oidc_provider.py"
);
const TENANT_TOKEN: &str = "tenant-token-of-acme-0123456789";
const CLIENT_ID: &str = "idemgate-console";
const CLIENT_SECRET: &str = "console-secret-0123456789";

/// The venv with the provider's pinned packages (authlib, joserfc).
fn provider_python() -> PathBuf {
    let venv = std::env::var_os("IDEMGATE_OIDC_VENV").map_or_else(
        || {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../target/oidc-venv"
            ))
        },
        PathBuf::from,
    );
    let python = venv.join("bin/python");
    let ready = Command::new(&python)
        .args(["-c", "import authlib, joserfc"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ready,
        "the OpenID Connect provider of this test needs authlib and joserfc in {}: run `scripts/python-test-deps {} oidc-provider` (or set IDEMGATE_OIDC_VENV to a venv that has them)",
        venv.display(),
        venv.display()
    );
    python
}

/// What the sign-in reads of an answer beyond `mcp_http::Answer`'s own.
impl Answer {
    /// The redirect's target, when the answer has one.
    fn location(&self) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == "location")
            .map(|(_, v)| v.as_str())
    }

    fn set_cookies(&self) -> impl Iterator<Item = &str> {
        self.headers
            .iter()
            .filter(|(k, _)| k == "set-cookie")
            .map(|(_, v)| v.as_str())
    }
}

/// `http://host:port/path?query` as (host:port, /path?query).
fn split_url(url: &str) -> (String, String) {
    let rest = url
        .strip_prefix("http://")
        .unwrap_or_else(|| panic!("not an http URL: {url}"));
    match rest.find('/') {
        Some(i) => (rest[..i].to_owned(), rest[i..].to_owned()),
        None => (rest.to_owned(), "/".to_owned()),
    }
}

/// Plain HTTP with a cookie jar per host, following redirects: what a browser does in a sign-in.
#[derive(Default)]
struct Browser {
    jar: HashMap<String, HashMap<String, String>>,
    /// The URLs visited, in order (redirects included).
    visited: Vec<String>,
}

impl Browser {
    fn send(&mut self, method: &str, url: &str, form: Option<&str>) -> Answer {
        let (addr, path) = split_url(url);
        let cookies: Vec<String> = self
            .jar
            .get(&addr)
            .map(|c| c.iter().map(|(k, v)| format!("{k}={v}")).collect())
            .unwrap_or_default();
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
        if !cookies.is_empty() {
            req.push_str(&format!("Cookie: {}\r\n", cookies.join("; ")));
        }
        let body = form.unwrap_or("");
        if form.is_some() {
            req.push_str(&format!(
                "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n",
                body.len()
            ));
        }
        req.push_str("\r\n");
        req.push_str(body);
        let answer = Answer::parse(&http(&addr, &req));
        for c in answer.set_cookies() {
            let pair = c.split(';').next().unwrap();
            let (name, value) = pair.split_once('=').unwrap();
            let jar = self.jar.entry(addr.clone()).or_default();
            // Max-Age=0 deletes.
            if c.contains("Max-Age=0") {
                jar.remove(name);
            } else {
                jar.insert(name.to_owned(), value.to_owned());
            }
        }
        self.visited.push(url.to_owned());
        answer
    }

    /// GET `url`, following redirects (to other hosts too) until an answer that is not one.
    fn navigate(&mut self, url: &str) -> Answer {
        let mut url = url.to_owned();
        for _ in 0..10 {
            let answer = self.send("GET", &url, None);
            if !matches!(answer.status, 301 | 302 | 303 | 307) {
                return answer;
            }
            let location = answer.location().expect("a redirect without Location");
            url = if location.starts_with('/') {
                format!("http://{}{location}", split_url(&url).0)
            } else {
                location.to_owned()
            };
        }
        panic!("more than 10 redirects: {:?}", self.visited);
    }

    fn cookie(&self, addr: &str, name: &str) -> Option<&str> {
        self.jar.get(addr)?.get(name).map(String::as_str)
    }
}

/// The value of `name="..." value="..."` in a page.
fn form_value(page: &str, name: &str) -> String {
    let marker = format!(r#"name="{name}" value=""#);
    let at = page
        .find(&marker)
        .unwrap_or_else(|| panic!("no {name} in {page}"))
        + marker.len();
    page[at..at + page[at..].find('"').unwrap()].to_owned()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The provider, started with the console's client (public without a secret); its process and
/// issuer URL.
fn start_provider(redirect_uri: &str, client_secret: Option<&str>) -> (Reaped, String) {
    let client = json!({
        "client_id": CLIENT_ID, "client_secret": client_secret, "redirect_uri": redirect_uri,
    });
    let mut child = Reaped(
        Command::new(provider_python())
            .arg(PROVIDER)
            .arg(client.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let stdout = child.0.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| {
            panic!("the OpenID Connect provider ({PROVIDER}) never said where it listens")
        });
    let issuer = serde_json::from_str::<Value>(&line)
        .unwrap_or_else(|e| panic!("{e}: {line:?} from {PROVIDER}"))["issuer"]
        .as_str()
        .unwrap()
        .to_owned();
    (child, issuer)
}

/// Sets the user the provider signs in next.
fn provider_user(issuer: &str, claims: &Value) {
    let (addr, _) = split_url(issuer);
    let body = claims.to_string();
    let answer = Answer::parse(&http(
        &addr,
        &format!(
            "POST /user HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    ));
    assert_eq!(answer.status, 200, "{}", answer.body);
}

/// An unknown record of tenant acme's, made through the HTTP API: `begin`, then `ambiguous`.
fn unknown_record(gateway: &str, key: &str) {
    let auth = format!("Authorization: Bearer {TENANT_TOKEN}");
    let call = |path: &str, headers: &str, body: &str| {
        Answer::parse(&http(
            gateway,
            &format!(
                "POST {path} HTTP/1.1\r\nHost: x\r\n{auth}\r\n{headers}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            ),
        ))
    };
    let begun = call(
        "/v1/tools/charge/begin",
        &format!("Idempotency-Key: {key}\r\n"),
        r#"{"amount":5}"#,
    );
    assert_eq!(begun.status, 201, "{}", begun.body);
    let lease = serde_json::from_str::<Value>(&begun.body).unwrap()["lease"]
        .as_str()
        .unwrap()
        .to_owned();
    let unknown = call(
        "/v1/tools/charge/ambiguous",
        "",
        &json!({"key": key, "lease": lease, "reason": "bank timed out"}).to_string(),
    );
    assert_eq!(unknown.status, 200, "{}", unknown.body);
}

/// A gateway whose console lets operators sign in at a provider started for it: the gateway's
/// process, its address, the provider's process and issuer. `client_secret` None: a public
/// client. `oidc` is added to `[console.oidc]`.
struct Rig {
    gateway: String,
    issuer: String,
    audit: PathBuf,
    _gateway: Reaped,
    _provider: Reaped,
}

fn rig(sb: &Sandbox, client_secret: Option<&str>, oidc: &str) -> Rig {
    let port = free_port();
    let gateway = format!("127.0.0.1:{port}");
    let redirect = format!("http://{gateway}/ui/oidc/callback");
    let (provider, issuer) = start_provider(&redirect, client_secret);
    let audit = sb.path("audit.jsonl");
    let config = sb.path("gateway.toml");
    let secret = client_secret
        .map(|s| format!("client_secret = \"{s}\"\n"))
        .unwrap_or_default();
    std::fs::write(
        &config,
        format!(
            r#"
[server]
listen = "{gateway}"
store = "sqlite://{db}"
audit_log = "{audit}"

[[tenants]]
id = "acme"
token_sha256 = "{tenant}"

[console.oidc]
issuer = "{issuer}"
client_id = "{CLIENT_ID}"
redirect_url = "{redirect}"
{secret}{oidc}
"#,
            db = sb.path("idem.db").display(),
            audit = audit.display(),
            tenant = idemgate_kit::tenants::token_sha256(TENANT_TOKEN),
        ),
    )
    .unwrap();
    let mut child = Reaped(
        sb.idemgate()
            .args(["serve", "--config"])
            .arg(&config)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    assert_eq!(
        announced(&mut child.0, "idemgate: listening on http://"),
        gateway
    );
    Rig {
        gateway,
        issuer,
        audit,
        _gateway: child,
        _provider: provider,
    }
}

/// What the provider counted: code exchanges, and the reasons of what it refused.
fn provider_stats(issuer: &str) -> Value {
    let (addr, _) = split_url(issuer);
    let stats = Answer::parse(&http(
        &addr,
        &format!("GET /stats HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"),
    ));
    serde_json::from_str(&stats.body).unwrap()
}

#[test]
fn console_oidc_sign_in_names_the_operator_in_the_audit_log() {
    let sb = Sandbox::new();
    let rig = rig(
        &sb,
        Some(CLIENT_SECRET),
        r#"allowed_emails = ["alice@example.com"]"#,
    );
    let (gateway, issuer, audit) = (&rig.gateway, &rig.issuer, &rig.audit);
    let redirect = format!("http://{gateway}/ui/oidc/callback");
    unknown_record(gateway, "order-7");
    let ui = |path: &str| format!("http://{gateway}{path}");

    // Alice, whose verified e-mail address is allowed, signs in at the provider.
    provider_user(
        issuer,
        &json!({"sub": "u-alice", "email": "alice@example.com", "email_verified": true,
                "preferred_username": "alice"}),
    );
    let mut alice = Browser::default();
    let login = alice.navigate(&ui("/ui/login"));
    assert!(
        login.body.contains(r#"href="/ui/login/oidc""#),
        "{}",
        login.body
    );
    let start = alice.send("GET", &ui("/ui/login/oidc"), None);
    assert_eq!(start.status, 303, "{}", start.body);
    let to_provider = start.location().unwrap().to_owned();
    assert!(
        to_provider.starts_with(&format!("{issuer}/authorize?"))
            && to_provider.contains("code_challenge_method=S256")
            && to_provider.contains("nonce=")
            && to_provider.contains("state="),
        "{to_provider}"
    );
    // The cookie binding the sign-in to this browser must come back with a cross-site redirect.
    let binding = start
        .set_cookies()
        .find(|c| c.starts_with("idemgate_console_oidc="))
        .unwrap()
        .to_owned();
    assert!(
        binding.contains("SameSite=Lax") && binding.contains("HttpOnly"),
        "{binding}"
    );
    // The provider redirects back to the callback; another browser (no binding cookie) bringing
    // that answer signs nobody in.
    let at_provider = alice.send("GET", &to_provider, None);
    assert_eq!(at_provider.status, 302, "{}", at_provider.body);
    let callback = at_provider.location().unwrap().to_owned();
    assert!(callback.starts_with(&redirect), "{callback}");
    let stranger = Browser::default().navigate(&callback);
    assert_eq!(stranger.status, 400, "{}", stranger.body);
    let signed_in = alice.navigate(&callback);
    assert_eq!(signed_in.status, 200, "{}", signed_in.body);
    assert!(
        signed_in.body.contains("alice@example.com")
            && signed_in.body.contains(r#"http-equiv="refresh""#),
        "{}",
        signed_in.body
    );
    assert!(alice.cookie(gateway, "idemgate_console").is_some());
    assert!(alice.cookie(gateway, "idemgate_console_oidc").is_none());
    // The same answer again: the sign-in was taken once.
    let mut replay = Browser {
        jar: alice.jar.clone(),
        visited: Vec::new(),
    };
    replay.jar.get_mut(gateway).unwrap().insert(
        "idemgate_console_oidc".to_owned(),
        form_value_of_state(&callback),
    );
    assert_eq!(replay.navigate(&callback).status, 400);

    // Signed in: alice resolves the unknown record, and the audit log names her.
    let list = alice.navigate(&ui("/ui"));
    assert_eq!(list.status, 200, "{}", list.body);
    assert!(
        list.body.contains("order-7") && list.body.contains("operator alice@example.com"),
        "{}",
        list.body
    );
    let csrf = form_value(&list.body, "csrf");
    let confirm = alice.navigate(&ui("/ui/resolve?tenant=acme&tool=charge&key=order-7"));
    let fence = form_value(&confirm.body, "fence");
    let resolved = alice.send(
        "POST",
        &ui("/ui/resolve"),
        Some(&format!(
            "csrf={csrf}&tenant=acme&tool=charge&key=order-7&fence={fence}&resolution=release&reason=the+bank+shows+no+charge"
        )),
    );
    assert_eq!(resolved.status, 200, "{}", resolved.body);
    let log = std::fs::read_to_string(audit).unwrap();
    let line: Value = log
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|l| l["event"] == "resolved")
        .unwrap_or_else(|| panic!("no resolution in {log}"));
    assert_eq!(line["by"], "console:alice@example.com", "{line}");
    assert_eq!(line["reason"], "the bank shows no charge", "{line}");

    // Mallory, whom the provider knows but the console does not allow: a 403 page saying so, and
    // no session.
    provider_user(
        issuer,
        &json!({"sub": "u-mallory", "email": "mallory@example.com", "email_verified": true}),
    );
    let mut mallory = Browser::default();
    mallory.navigate(&ui("/ui/login"));
    let refused = mallory.navigate(&ui("/ui/login/oidc"));
    assert_eq!(refused.status, 403, "{}", refused.body);
    assert!(
        refused.body.contains("mallory@example.com") && refused.body.contains("not allowed"),
        "{}",
        refused.body
    );
    assert!(mallory.cookie(gateway, "idemgate_console").is_none());
    assert_eq!(mallory.navigate(&ui("/ui")).status, 200);
    assert!(
        mallory.visited.last().unwrap().ends_with("/ui/login"),
        "{:?}",
        mallory.visited
    );
    // The provider exchanged a code twice (alice, mallory), refusing nothing: the console's
    // client secret, redirect URI and PKCE verifier were right each time, and the stranger's and
    // the replayed callbacks never reached it.
    assert_eq!(
        provider_stats(issuer),
        json!({"token_exchanges": 2, "refused": []})
    );
}

#[test]
fn console_oidc_public_client_signs_in_a_group_member_by_username() {
    let sb = Sandbox::new();
    let rig = rig(
        &sb,
        None,
        "allowed_claim = \"groups\"\nallowed_values = [\"idemgate-operators\"]\nname_claim = \"preferred_username\"",
    );
    let ui = |path: &str| format!("http://{}{path}", rig.gateway);
    // Bob has no verified e-mail address; his group lets him in, his username names him.
    provider_user(
        &rig.issuer,
        &json!({"sub": "u-bob", "preferred_username": "bob",
                "groups": ["dev", "idemgate-operators"]}),
    );
    let mut bob = Browser::default();
    let signed_in = bob.navigate(&ui("/ui/login/oidc"));
    assert_eq!(signed_in.status, 200, "{}", signed_in.body);
    let list = bob.navigate(&ui("/ui"));
    assert!(
        list.body.contains("operator bob (all tenants)"),
        "{}",
        list.body
    );
    // Carol is in another group only.
    provider_user(
        &rig.issuer,
        &json!({"sub": "u-carol", "preferred_username": "carol", "groups": ["dev"]}),
    );
    let refused = Browser::default().navigate(&ui("/ui/login/oidc"));
    assert_eq!(refused.status, 403, "{}", refused.body);
    assert!(
        refused.body.contains("carol") && refused.body.contains("groups"),
        "{}",
        refused.body
    );
    // Public client: the code was exchanged with the verifier and the client id alone.
    assert_eq!(
        provider_stats(&rig.issuer),
        json!({"token_exchanges": 2, "refused": []})
    );
}

/// The `state` of a callback URL.
fn form_value_of_state(callback: &str) -> String {
    let query = callback.split_once('?').unwrap().1;
    query
        .split('&')
        .find_map(|p| p.strip_prefix("state="))
        .unwrap()
        .to_owned()
}

//! The console's sessions, CSRF checks and tenant isolation, through its router, without a
//! browser (scripts/test-console drives a real one).

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Request, Response, StatusCode};
use axum::Router;
use http_body_util::BodyExt as _;
use idemgate::{
    AnyStore, Call, Effect, Engine, IdempotencyKey, Key, RecordState, TenantId, ToolName,
};
use idemgate_console::{Console, OidcConfig, OperatorConfig, Settings};
use idemgate_kit::tenants::{token_sha256, Tenant, TenantConfig};
use idemgate_kit::Instruments;
use tower::ServiceExt as _;

const ACME: &str = "acme-token-0123456789";
const GLOBEX: &str = "globex-token-0123456789";
const OPERATOR: &str = "operator-token-0123456789";
/// Operators by name, each with a token of its own.
const ALICE: &str = "alice-token-0123456789";
const BOB: &str = "bob-token-0123456789";

struct Rig {
    app: Router,
    engine: Arc<Engine<AnyStore>>,
    audit: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

async fn rig() -> Rig {
    rig_with_oidc(None).await
}

async fn rig_with_oidc(oidc: Option<OidcConfig>) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let store = AnyStore::connect("memory:").await.unwrap();
    let instruments = Instruments::open(Some(&audit), Vec::<String>::new()).unwrap();
    let engine = Arc::new(instruments.attach(Engine::new(store)));
    let tenants = [("acme", ACME), ("globex", GLOBEX)]
        .iter()
        .map(|(id, token)| {
            Arc::new(Tenant::new(&TenantConfig {
                id: TenantId::new(*id).unwrap(),
                token_sha256: token_sha256(token),
                rate_limit_per_second: None,
                max_live_keys: None,
            }))
        })
        .collect();
    let console = Console::new(Settings {
        engine: engine.clone(),
        tenants,
        operators: [
            ("operator", OPERATOR),
            ("alice@example.com", ALICE),
            ("bob", BOB),
        ]
        .iter()
        .map(|(name, token)| OperatorConfig {
            name: (*name).to_owned(),
            token_sha256: token_sha256(token),
        })
        .collect(),
        oidc,
        audit_log: Some(audit.clone()),
        tally: None,
        secure_cookie: false,
    })
    .unwrap();
    Rig {
        app: idemgate_console::router(console),
        engine,
        audit,
        _dir: dir,
    }
}

fn key(tenant: &str, k: &str) -> Key {
    Key::new(
        TenantId::new(tenant).unwrap(),
        ToolName::new("charge").unwrap(),
        IdempotencyKey::new(k).unwrap(),
    )
}

/// A record of `tenant`'s whose outcome is unknown (the tool reported an ambiguous outcome).
async fn unknown_record(engine: &Engine<AnyStore>, tenant: &str, k: &str) {
    let call = Call::new(
        TenantId::new(tenant).unwrap(),
        ToolName::new("charge").unwrap(),
    )
    .key(IdempotencyKey::new(k).unwrap())
    .args(&serde_json::json!({"amount": 5}));
    let _ = engine
        .call(call, || async {
            Effect::Ambiguous("timed out after sending".into())
        })
        .await;
    let r = engine.get(&key(tenant, k)).await.unwrap().unwrap();
    assert!(matches!(r.state, RecordState::Unknown { .. }), "{r:?}");
}

async fn text(res: Response<Body>) -> String {
    String::from_utf8(res.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap()
}

fn set_cookies(res: &Response<Body>) -> Vec<String> {
    res.headers()
        .get_all(header::SET_COOKIE)
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect()
}

/// The value of `name="..." value="..."` in a page.
fn field(page: &str, name: &str) -> String {
    let at = page
        .find(&format!(r#"name="{name}" value=""#))
        .unwrap_or_else(|| panic!("no field {name} in {page}"));
    let rest = &page[at + name.len() + 15..];
    rest[..rest.find('"').unwrap()].to_owned()
}

async fn get(app: &Router, uri: &str, cookie: Option<&str>) -> Response<Body> {
    let mut req = Request::get(uri);
    if let Some(c) = cookie {
        req = req.header(header::COOKIE, c);
    }
    app.clone()
        .oneshot(req.body(Body::empty()).unwrap())
        .await
        .unwrap()
}

async fn post(
    app: &Router,
    uri: &str,
    cookie: Option<&str>,
    form: &[(&str, &str)],
) -> Response<Body> {
    let body: Vec<String> = form
        .iter()
        .map(|(k, v)| format!("{k}={}", enc(v)))
        .collect();
    let mut req =
        Request::post(uri).header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
    if let Some(c) = cookie {
        req = req.header(header::COOKIE, c);
    }
    app.clone()
        .oneshot(req.body(Body::from(body.join("&"))).unwrap())
        .await
        .unwrap()
}

fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Signs in with `token`: the session cookie ("name=value") and the session's CSRF token.
async fn sign_in(app: &Router, token: &str) -> (String, String) {
    let res = get(app, "/ui/login", None).await;
    let login_cookie = set_cookies(&res)[0].split(';').next().unwrap().to_owned();
    let csrf = field(&text(res).await, "csrf");
    let res = post(
        app,
        "/ui/login",
        Some(&login_cookie),
        &[("csrf", &csrf), ("token", token)],
    )
    .await;
    assert_eq!(res.status(), StatusCode::SEE_OTHER, "{token}");
    let session = set_cookies(&res)
        .into_iter()
        .find(|c| c.starts_with("idemgate_console="))
        .unwrap();
    let cookie = session.split(';').next().unwrap().to_owned();
    let page = text(get(app, "/ui", Some(&cookie)).await).await;
    (cookie, field(&page, "csrf"))
}

#[tokio::test]
async fn pages_need_a_session_and_carry_a_strict_policy() {
    let r = rig().await;
    let res = get(&r.app, "/ui", None).await;
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    assert_eq!(res.headers()[header::LOCATION], "/ui/login");
    let res = get(&r.app, "/ui/login", None).await;
    assert_eq!(res.status(), StatusCode::OK);
    let csp = res.headers()[header::CONTENT_SECURITY_POLICY]
        .to_str()
        .unwrap();
    assert!(
        csp.contains("default-src 'none'") && csp.contains("script-src 'self'"),
        "{csp}"
    );
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    let page = text(res).await;
    assert!(
        !page.contains("<script>") && !page.contains("style="),
        "{page}"
    );
    let res = get(&r.app, "/ui/assets/console.js", None).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.headers()[header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .starts_with("text/javascript"));
}

#[tokio::test]
async fn sign_in_needs_a_valid_token_and_the_forms_csrf_token() {
    let r = rig().await;
    let res = get(&r.app, "/ui/login", None).await;
    let login_cookie = set_cookies(&res)[0].split(';').next().unwrap().to_owned();
    let csrf = field(&text(res).await, "csrf");
    // Without the cookie's token (a form posted from elsewhere).
    let res = post(
        &r.app,
        "/ui/login",
        None,
        &[("csrf", &csrf), ("token", ACME)],
    )
    .await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    let res = post(&r.app, "/ui/login", Some(&login_cookie), &[("token", ACME)]).await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    // A wrong token.
    let res = post(
        &r.app,
        "/ui/login",
        Some(&login_cookie),
        &[("csrf", &csrf), ("token", "nope-nope-nope-nope")],
    )
    .await;
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    assert!(set_cookies(&res)
        .iter()
        .all(|c| !c.starts_with("idemgate_console=")));
    // The right one: an HttpOnly, SameSite=Strict session cookie.
    let res = post(
        &r.app,
        "/ui/login",
        Some(&login_cookie),
        &[("csrf", &csrf), ("token", ACME)],
    )
    .await;
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    let session = set_cookies(&res)
        .into_iter()
        .find(|c| c.starts_with("idemgate_console="))
        .unwrap();
    assert!(
        session.contains("HttpOnly") && session.contains("SameSite=Strict"),
        "{session}"
    );
    assert!(session.contains("Path=/ui"), "{session}");
}

#[tokio::test]
async fn a_tenant_sees_and_resolves_only_its_own_records() {
    let r = rig().await;
    unknown_record(&r.engine, "acme", "order-1").await;
    unknown_record(&r.engine, "globex", "order-9").await;
    let (acme, acme_csrf) = sign_in(&r.app, ACME).await;
    let (globex, globex_csrf) = sign_in(&r.app, GLOBEX).await;

    let list = text(get(&r.app, "/ui", Some(&acme)).await).await;
    assert!(
        list.contains("order-1") && !list.contains("order-9"),
        "{list}"
    );
    let list = text(get(&r.app, "/ui", Some(&globex)).await).await;
    assert!(
        list.contains("order-9") && !list.contains("order-1"),
        "{list}"
    );
    // Asking for the other tenant's list or record: 404, as for one that does not exist.
    let res = get(&r.app, "/ui?tenant=acme", Some(&globex)).await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    let res = get(
        &r.app,
        "/ui/record?tenant=acme&tool=charge&key=order-1",
        Some(&globex),
    )
    .await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    let res = get(
        &r.app,
        "/ui/resolve?tenant=acme&tool=charge&key=order-1",
        Some(&globex),
    )
    .await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    // Posting the resolution with its own session and CSRF token: 404, and nothing changes.
    let res = post(
        &r.app,
        "/ui/resolve",
        Some(&globex),
        &[
            ("csrf", &globex_csrf),
            ("tenant", "acme"),
            ("tool", "charge"),
            ("key", "order-1"),
            ("fence", "1"),
            ("resolution", "release"),
            ("reason", "not mine"),
        ],
    )
    .await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    let rec = r
        .engine
        .get(&key("acme", "order-1"))
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(rec.state, RecordState::Unknown { .. }));

    // Its own tenant resolves it, with a reason that the audit log keeps with who.
    let page = text(
        get(
            &r.app,
            "/ui/resolve?tenant=acme&tool=charge&key=order-1",
            Some(&acme),
        )
        .await,
    )
    .await;
    let fence = field(&page, "fence");
    let res = post(
        &r.app,
        "/ui/resolve",
        Some(&acme),
        &[
            ("csrf", &acme_csrf),
            ("tenant", "acme"),
            ("tool", "charge"),
            ("key", "order-1"),
            ("fence", &fence),
            ("resolution", "completed"),
            ("result", r#"{"charged": true}"#),
            ("reason", "the bank shows the charge"),
        ],
    )
    .await;
    assert_eq!(res.status(), StatusCode::SEE_OTHER, "{}", text(res).await);
    let rec = r
        .engine
        .get(&key("acme", "order-1"))
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(rec.state, RecordState::Completed { .. }),
        "{rec:?}"
    );
    let audit = std::fs::read_to_string(&r.audit).unwrap();
    let resolved = audit
        .lines()
        .find(|l| l.contains(r#""event":"resolved""#))
        .unwrap();
    assert!(
        resolved.contains(r#""by":"console:tenant:acme""#),
        "{resolved}"
    );
    assert!(resolved.contains("the bank shows the charge"), "{resolved}");
    // The record's history (from the store, not the audit log) shows who and why.
    let page = text(
        get(
            &r.app,
            "/ui/record?tenant=acme&tool=charge&key=order-1",
            Some(&acme),
        )
        .await,
    )
    .await;
    assert!(
        page.contains("resolved as completed by <strong>console:tenant:acme</strong>: the bank shows the charge"),
        "{page}"
    );

    // The operator sees both tenants', and may narrow to one.
    let (op, _) = sign_in(&r.app, OPERATOR).await;
    let list = text(get(&r.app, "/ui", Some(&op)).await).await;
    assert!(
        list.contains("order-1") && list.contains("order-9"),
        "{list}"
    );
    let list = text(get(&r.app, "/ui?tenant=globex", Some(&op)).await).await;
    assert!(
        !list.contains("order-1") && list.contains("order-9"),
        "{list}"
    );
}

#[tokio::test]
async fn a_change_without_the_sessions_csrf_token_is_refused() {
    let r = rig().await;
    unknown_record(&r.engine, "acme", "order-2").await;
    let (acme, csrf) = sign_in(&r.app, ACME).await;
    let (_, other_csrf) = sign_in(&r.app, ACME).await;
    let form = |token: &'static str| {
        vec![
            ("csrf", token),
            ("tenant", "acme"),
            ("tool", "charge"),
            ("key", "order-2"),
            ("fence", "1"),
            ("resolution", "release"),
            ("reason", "test"),
        ]
    };
    let mut without = form("");
    without.remove(0);
    for (what, fields) in [("none", without), ("empty", form(""))] {
        let res = post(&r.app, "/ui/resolve", Some(&acme), &fields).await;
        assert_eq!(res.status(), StatusCode::FORBIDDEN, "{what}");
    }
    // Another session's token.
    let mut fields = form("");
    fields[0].1 = &other_csrf;
    let res = post(&r.app, "/ui/resolve", Some(&acme), &fields).await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    // No session at all.
    fields[0].1 = &csrf;
    let res = post(&r.app, "/ui/reopen", None, &fields).await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    let rec = r
        .engine
        .get(&key("acme", "order-2"))
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(rec.state, RecordState::Unknown { .. }));
    // Sign-out needs it too, and ends the session.
    let res = post(&r.app, "/ui/logout", Some(&acme), &[]).await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    let res = post(&r.app, "/ui/logout", Some(&acme), &[("csrf", &csrf)]).await;
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    let res = get(&r.app, "/ui", Some(&acme)).await;
    assert_eq!(res.headers()[header::LOCATION], "/ui/login");
    // And with the session gone, its token changes nothing.
    let res = post(&r.app, "/ui/resolve", Some(&acme), &fields).await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn reopen_forgets_a_record_and_says_who() {
    let r = rig().await;
    unknown_record(&r.engine, "acme", "order-3").await;
    let (op, csrf) = sign_in(&r.app, OPERATOR).await;
    let page = text(
        get(
            &r.app,
            "/ui/reopen?tenant=acme&tool=charge&key=order-3",
            Some(&op),
        )
        .await,
    )
    .await;
    assert!(page.contains("runs the action again"), "{page}");
    let fence = field(&page, "fence");
    let res = post(
        &r.app,
        "/ui/reopen",
        Some(&op),
        &[
            ("csrf", &csrf),
            ("tenant", "acme"),
            ("tool", "charge"),
            ("key", "order-3"),
            ("fence", &fence),
            ("reason", "customer asked again"),
        ],
    )
    .await;
    assert_eq!(res.status(), StatusCode::OK);
    assert!(r
        .engine
        .get(&key("acme", "order-3"))
        .await
        .unwrap()
        .is_none());
    let audit = std::fs::read_to_string(&r.audit).unwrap();
    assert!(audit.contains(r#""by":"console:operator""#), "{audit}");
    // A record in flight is not offered for reopening: its call may be running.
    let call = Call::new(
        TenantId::new("acme").unwrap(),
        ToolName::new("charge").unwrap(),
    )
    .key(IdempotencyKey::new("order-4").unwrap())
    .args(&serde_json::json!({}));
    let policy = r.engine.policies().get("charge").clone();
    assert!(matches!(
        r.engine.begin(call, &policy).await.unwrap(),
        idemgate::Begun::Execute(_)
    ));
    let res = get(
        &r.app,
        "/ui/reopen?tenant=acme&tool=charge&key=order-4",
        Some(&op),
    )
    .await;
    assert_eq!(res.status(), StatusCode::CONFLICT);
    // The operator must name the tenant of a record.
    let res = get(&r.app, "/ui/record?tool=charge&key=order-3", Some(&op)).await;
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
}

/// The posted form of a resolution of `k` (tenant acme) at `fence`.
fn resolution<'a>(csrf: &'a str, k: &'a str, fence: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("csrf", csrf),
        ("tenant", "acme"),
        ("tool", "charge"),
        ("key", k),
        ("fence", fence),
        ("resolution", "release"),
        ("reason", "checked the ledger"),
    ]
}

/// An operator who acts on a page that has gone stale is told so in the browser's terms: a
/// record that changed meanwhile links to the record as it is now (no command-line advice), one
/// released meanwhile is said to be released (not "no such record"), and the page after a
/// reopening names the record it reopened.
#[tokio::test]
async fn acting_on_a_stale_page_says_what_happened_in_the_browsers_terms() {
    let r = rig().await;
    let (op, csrf) = sign_in(&r.app, OPERATOR).await;
    for k in ["order-5", "order-6", "order-7"] {
        unknown_record(&r.engine, "acme", k).await;
    }
    let fence_of = |k: &'static str| {
        let app = r.app.clone();
        let op = op.clone();
        async move {
            let form = format!("/ui/resolve?tenant=acme&tool=charge&key={k}");
            field(&text(get(&app, &form, Some(&op)).await).await, "fence")
        }
    };

    // Another operator settles the record after this page showed it; this one then posts.
    let settled_meanwhile = |k: &'static str, resolution_of: fn() -> idemgate::Resolution| {
        let (app, op, csrf, engine) = (r.app.clone(), op.clone(), csrf.clone(), r.engine.clone());
        let fence = fence_of(k);
        async move {
            let fence = fence.await;
            engine
                .resolve(
                    &key("acme", k),
                    fence.parse().unwrap(),
                    resolution_of(),
                    None,
                    None,
                )
                .await
                .unwrap();
            let res = post(
                &app,
                "/ui/resolve",
                Some(&op),
                &resolution(&csrf, k, &fence),
            )
            .await;
            (res.status(), text(res).await)
        }
    };

    // Resolved as completed: it is no longer unknown at the fence this page showed.
    let (status, page) = settled_meanwhile("order-5", || idemgate::Resolution::Completed {
        outcome: idemgate_kit::Payload::json_text("true")
            .unwrap()
            .into_resolution(idemgate::OutcomeKind::Success),
        keep: idemgate::Keep {
            ttl: std::time::Duration::from_secs(60),
            tombstone: std::time::Duration::from_secs(60),
        },
    })
    .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(
        page.contains(r#"href="/ui/record?tenant=acme&amp;tool=charge&amp;key=order-5""#)
            && page.contains("Open the record as it is now"),
        "{page}"
    );
    assert!(
        !page.contains("keys show") && !page.contains("idemgate keys"),
        "{page}"
    );

    // Released.
    let (status, page) = settled_meanwhile("order-6", || idemgate::Resolution::Release).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(!page.contains("No such record"), "{page}");
    assert!(
        page.contains("order-6") && page.contains("released"),
        "{page}"
    );

    // A reopening names what it reopened.
    let fence = fence_of("order-7").await;
    let mut form = resolution(&csrf, "order-7", &fence);
    form.retain(|(name, _)| *name != "resolution");
    let res = post(&r.app, "/ui/reopen", Some(&op), &form).await;
    assert_eq!(res.status(), StatusCode::OK);
    let page = text(res).await;
    assert!(
        page.contains("<code>order-7</code> (tool charge, tenant acme)"),
        "{page}"
    );
}

/// Operators by name: each signs what it does with its own name, and one's CSRF token is no good
/// on another's session.
#[tokio::test]
async fn each_operator_signs_what_it_does_with_its_own_name() {
    let r = rig().await;
    unknown_record(&r.engine, "acme", "order-5").await;
    unknown_record(&r.engine, "globex", "order-6").await;
    let (alice, alice_csrf) = sign_in(&r.app, ALICE).await;
    let (bob, bob_csrf) = sign_in(&r.app, BOB).await;
    let list = text(get(&r.app, "/ui", Some(&alice)).await).await;
    // An operator by name sees every tenant, and the page says who is signed in.
    assert!(
        list.contains("order-5") && list.contains("order-6"),
        "{list}"
    );
    assert!(list.contains("alice@example.com"), "{list}");
    for (cookie, csrf, tenant, k, reason) in [
        (
            &alice,
            &alice_csrf,
            "acme",
            "order-5",
            "alice checked the bank",
        ),
        (&bob, &bob_csrf, "globex", "order-6", "bob found no charge"),
    ] {
        let form = format!("/ui/resolve?tenant={tenant}&tool=charge&key={k}");
        let fence = field(&text(get(&r.app, &form, Some(cookie)).await).await, "fence");
        let res = post(
            &r.app,
            "/ui/resolve",
            Some(cookie),
            &[
                ("csrf", csrf),
                ("tenant", tenant),
                ("tool", "charge"),
                ("key", k),
                ("fence", &fence),
                ("resolution", "release"),
                ("reason", reason),
            ],
        )
        .await;
        assert_eq!(res.status(), StatusCode::OK, "{}", text(res).await);
    }
    let audit = std::fs::read_to_string(&r.audit).unwrap();
    let by_of = |reason: &str| {
        let line = audit
            .lines()
            .find(|l| l.contains(r#""event":"resolved""#) && l.contains(reason))
            .unwrap_or_else(|| panic!("no resolution {reason:?} in {audit}"));
        serde_json::from_str::<serde_json::Value>(line).unwrap()["by"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(by_of("alice checked the bank"), "console:alice@example.com");
    assert_eq!(by_of("bob found no charge"), "console:bob");
    // A session's CSRF token is its own: bob's does not carry alice's session.
    let res = post(&r.app, "/ui/logout", Some(&alice), &[("csrf", &bob_csrf)]).await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn oidc_sign_in_is_offered_when_configured_and_finishes_only_what_this_browser_started() {
    let r = rig().await;
    let page = text(get(&r.app, "/ui/login", None).await).await;
    assert!(!page.contains("/ui/login/oidc"), "{page}");
    assert_eq!(
        get(&r.app, "/ui/login/oidc", None).await.status(),
        StatusCode::NOT_FOUND
    );

    // An issuer nothing listens at (port 1 on loopback refuses at once).
    let oidc: OidcConfig = toml::from_str(
        r#"
issuer = "http://127.0.0.1:1"
client_id = "console"
redirect_url = "http://127.0.0.1:8080/ui/oidc/callback"
allowed_emails = ["alice@example.com"]
"#,
    )
    .unwrap();
    let r = rig_with_oidc(Some(oidc)).await;
    let page = text(get(&r.app, "/ui/login", None).await).await;
    assert!(
        page.contains(r#"href="/ui/login/oidc""#) && page.contains("Sign in at 127.0.0.1"),
        "{page}"
    );
    // The provider cannot be reached: a page that says so, and no sign-in started.
    let res = get(&r.app, "/ui/login/oidc", None).await;
    assert_eq!(res.status(), StatusCode::BAD_GATEWAY);
    assert!(set_cookies(&res).is_empty());
    assert!(text(res).await.contains("could not be reached"));
    // A callback for no sign-in of this browser: refused, and no session.
    for cookie in [None, Some("idemgate_console_oidc=made-up-state")] {
        let res = get(
            &r.app,
            "/ui/oidc/callback?code=c&state=made-up-state",
            cookie,
        )
        .await;
        assert_eq!(res.status(), StatusCode::BAD_REQUEST);
        assert!(set_cookies(&res).is_empty());
    }
}

/// A browser asks for `/favicon.ico` whatever a page links: it gets the console's icon, which
/// every page also names.
#[tokio::test]
async fn the_favicon_is_served() {
    let r = rig().await;
    for path in ["/favicon.ico", "/ui/assets/favicon.svg"] {
        let res = get(&r.app, path, None).await;
        assert_eq!(res.status(), StatusCode::OK, "{path}");
        assert_eq!(res.headers()[header::CONTENT_TYPE], "image/svg+xml");
        assert!(text(res).await.starts_with("<svg"), "{path}");
    }
    let login = text(get(&r.app, "/ui/login", None).await).await;
    assert!(
        login.contains(r#"<link rel="icon" type="image/svg+xml" href="/ui/assets/favicon.svg">"#),
        "{login}"
    );
}

/// More records than a page holds: the unknown one heads the first page, each page links to the
/// next one until the last, every record is on exactly one page of the listing, the counts are
/// every page's (not the page's), and the key search box narrows to keys starting with it.
#[tokio::test]
async fn every_record_is_reachable_page_by_page() {
    let r = rig().await;
    let total = 230;
    for i in 0..total {
        let call = Call::new(
            TenantId::new("acme").unwrap(),
            ToolName::new("charge").unwrap(),
        )
        .key(IdempotencyKey::new(format!("order-{i:03}")).unwrap())
        .args(&serde_json::json!({"i": i}));
        engine_ok(&r.engine, call).await;
    }
    unknown_record(&r.engine, "acme", "stuck-1").await;
    let (acme, _) = sign_in(&r.app, ACME).await;
    let mut seen = std::collections::HashSet::new();
    let mut url = "/ui".to_owned();
    let mut pages = 0;
    loop {
        pages += 1;
        assert!(pages < 10, "the pages never end");
        let page = text(get(&r.app, &url, Some(&acme)).await).await;
        assert!(!page.contains("are shown"), "{page}");
        assert!(
            page.contains(&format!("1 unknown of {} record(s)", total + 1)),
            "the counts are every page's: {page}"
        );
        if pages == 1 {
            // What needs an operator first: the unknown record heads the first page.
            let first_row = &page[page.find("<tbody>").expect("a table")..];
            let first_row = &first_row[..first_row.find("</tr>").unwrap()];
            assert!(
                first_row.contains(">stuck-1<") && first_row.contains("unknown"),
                "{page}"
            );
        }
        // The pages' own table: every record, oldest first.
        let listed = &page[page.find("oldest first</caption>").expect("the records")..];
        for i in 0..total {
            let k = format!(">order-{i:03}<");
            if listed.contains(&k) {
                assert!(seen.insert(i), "order-{i:03} on two pages");
            }
        }
        if listed.contains(">stuck-1<") {
            assert!(seen.insert(total), "stuck-1 on two pages");
        }
        let Some(at) = page.find(r#"rel="next""#) else {
            break;
        };
        let href = &page[..at];
        let start = href.rfind("href=\"").unwrap() + 6;
        url = href[start..]
            .split('"')
            .next()
            .unwrap()
            .replace("&amp;", "&");
    }
    assert_eq!(pages, 3, "230 records and one more in pages of 100");
    assert_eq!(seen.len(), total + 1, "every record once");

    let found = text(get(&r.app, "/ui?key=order-12", Some(&acme)).await).await;
    assert!(found.contains(r#"name="key" value="order-12""#), "{found}");
    assert!(found.contains(">order-120<") && found.contains(">order-129<"));
    assert!(!found.contains(">order-130<") && !found.contains(">order-012<"));
    assert!(found.contains("0 unknown of 10 record(s)"), "{found}");
}

/// Runs `call` to a completion.
async fn engine_ok(engine: &Engine<AnyStore>, call: Call) {
    engine
        .call(call, || async { Effect::Success(b"ok".to_vec()) })
        .await
        .expect("the call runs");
}

/// A table squeezed by a narrow window broke its timestamps (and keys) at their hyphens,
/// mid-date: every time in the records table (created, and those in the detail) is a `<time>`
/// element and every key in a `key` cell, which the stylesheet keeps on one line.
/// (scripts/console-walk.py measures the lines in a browser.)
#[tokio::test]
async fn the_records_table_never_breaks_a_time() {
    let r = rig().await;
    unknown_record(&r.engine, "acme", "stuck-1").await;
    let (acme, _) = sign_in(&r.app, ACME).await;
    let page = text(get(&r.app, "/ui", Some(&acme)).await).await;
    let table = &page[page.find("<tbody>").expect("a table")..];
    let row = &table[..table.find("</tr>").unwrap()];
    let record = r
        .engine
        .get(&key("acme", "stuck-1"))
        .await
        .unwrap()
        .unwrap();
    let RecordState::Unknown { since } = record.state else {
        panic!("{record:?}")
    };
    for t in [record.created_at, since] {
        assert!(
            row.contains(&format!(r#"<time datetime="{t}">{t}</time>"#)),
            "{t} in {row}"
        );
    }
    let style = text(get(&r.app, "/ui/assets/console.css", None).await).await;
    assert!(
        style.contains("time, td.key { white-space: nowrap; }"),
        "{style}"
    );
    assert!(row.contains(r#"<td class="key"><a href="#), "{row}");
}

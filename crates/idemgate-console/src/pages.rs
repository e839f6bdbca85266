//! The console's pages and forms.

// A check that fails answers with the page to show instead: a whole `Response`, once per request,
// which is no cost worth boxing.
#![allow(clippy::result_large_err)]

use std::fmt::Write as _;

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Form, Router};
use idemgate::{
    EngineError, HistoryEntry, IdempotencyKey, Keep, Key, KeyRule, ListCursor, ListFilter,
    OutcomeKind, Record, RecordState, Resolution, State as RecordStateName, Timestamp, ToolName,
};
use idemgate_kit::{story, Door, Explanation, Payload, Resolve};
use serde::Deserialize;

use crate::html::{self, esc, page, query, see_other, Header};
use crate::session::{self, Role, Session};
use crate::{audit, chart, Console};

/// The script and stylesheet, embedded: the console needs nothing from the network.
const SCRIPT: &str = include_str!("../assets/console.js");
const STYLE: &str = include_str!("../assets/console.css");
const ICON: &str = include_str!("../assets/favicon.svg");

/// Records one page of the list shows; a link leads to the next page.
const PAGE: usize = 100;

/// How far the list's counts go: a count of a larger set stops there and says "at least", so
/// that a page over a table of millions does not count all of them.
const COUNT_UP_TO: usize = 10_000;

pub(crate) fn routes() -> Router<Console> {
    Router::new()
        .route("/ui", get(records))
        .route("/ui/", get(records))
        .route("/ui/login", get(login_form).post(login))
        .route("/ui/logout", post(logout))
        .route("/ui/login/oidc", get(oidc_start))
        .route(crate::oidc::CALLBACK_PATH, get(oidc_callback))
        .route("/ui/record", get(record))
        .route("/ui/resolve", get(resolve_form).post(resolve))
        .route("/ui/reopen", get(reopen_form).post(reopen))
        .route("/ui/charts", get(charts))
        .route("/ui/assets/console.js", get(script))
        .route("/ui/assets/console.css", get(style))
        .route("/ui/assets/favicon.svg", get(icon))
        // Browsers ask for it at the root whatever the page says (a bookmark, the history, a
        // tab restored): answered with the icon rather than a 404 in every console session.
        .route("/favicon.ico", get(icon))
}

async fn icon() -> Response {
    html::with_headers(StatusCode::OK, "image/svg+xml", ICON.as_bytes().to_vec())
}

async fn script() -> Response {
    html::with_headers(
        StatusCode::OK,
        "text/javascript; charset=utf-8",
        SCRIPT.as_bytes().to_vec(),
    )
}

async fn style() -> Response {
    html::with_headers(
        StatusCode::OK,
        "text/css; charset=utf-8",
        STYLE.as_bytes().to_vec(),
    )
}

/// The page header of a session.
fn header_of(s: &Session) -> Header<'_> {
    Header {
        who: s.role.label(),
        csrf: &s.csrf,
    }
}

/// The session of a page request, or the way to the sign-in page.
fn viewer(console: &Console, headers: &HeaderMap) -> Result<Session, Response> {
    console
        .0
        .sessions
        .find(headers)
        .ok_or_else(|| see_other("/ui/login"))
}

/// The session of a form post whose CSRF token matches it; 403 otherwise (no session included:
/// a post is never redirected to sign in, so nothing it asked for happens later by surprise).
fn actor(console: &Console, headers: &HeaderMap, csrf: Option<&str>) -> Result<Session, Response> {
    match console.0.sessions.find(headers) {
        Some(s) if s.csrf_matches(csrf) => Ok(s),
        Some(s) => Err(page(
            StatusCode::FORBIDDEN,
            "Refused",
            Some(header_of(&s)),
            "<p>The form's CSRF token is missing or does not belong to this session; nothing was changed. Open the page again and resubmit.</p>",
        )),
        None => Err(page(
            StatusCode::FORBIDDEN,
            "Refused",
            None,
            r#"<p>You are not signed in (or your session ended); nothing was changed. <a href="/ui/login">Sign in</a>.</p>"#,
        )),
    }
}

fn not_found(s: &Session) -> Response {
    page(
        StatusCode::NOT_FOUND,
        "No such record",
        Some(header_of(s)),
        r#"<p>There is no record under this tenant, tool and key that you may see. <a href="/ui">Back to the records</a>.</p>"#,
    )
}

fn bad_request(s: &Session, why: &str) -> Response {
    page(
        StatusCode::BAD_REQUEST,
        "Bad request",
        Some(header_of(s)),
        &format!("<p>{}</p>", esc(why)),
    )
}

/// The page of an engine error: its status, title and words from the kit's problem document, as
/// the gateway's problems have them.
fn engine_error(s: &Session, e: &EngineError) -> Response {
    if let EngineError::NotFound { .. } = e {
        return not_found(s);
    }
    explained_error(s, e, r#"<a href="/ui">Back to the records</a>"#)
}

/// As [`engine_error`], with `next` (HTML: what the operator can do in the console) after the
/// kit's words.
fn explained_error(s: &Session, e: &EngineError, next: &str) -> Response {
    let explanation = Explanation::of_error(e);
    let (record, resolve) = match &explanation.key {
        Some(k) => (
            format!("{} (tool {}, tenant {})", k.key, k.tool, k.tenant),
            format!("{} --tool {} --tenant {}", k.key, k.tool, k.tenant),
        ),
        None => (String::new(), String::new()),
    };
    let problem = explanation.problem(&Door {
        effect: "the action",
        record: &record,
        resolve: Resolve::Command(&resolve),
        repeat: "call it again with a new key",
        add_key: "send one",
        discreet: false,
    });
    let status =
        StatusCode::from_u16(problem.status()).expect("the verdict table holds valid status codes");
    page(
        status,
        problem.title(),
        Some(header_of(s)),
        &format!(r#"<p>{}</p><p>{next}</p>"#, esc(&problem.detail)),
    )
}

// ---- sign in and out ----

#[derive(Debug, Deserialize)]
struct LoginForm {
    token: Option<String>,
    csrf: Option<String>,
}

async fn login_form(State(console): State<Console>) -> Response {
    login_page(&console, StatusCode::OK, "")
}

/// The sign-in page, with a fresh CSRF token in the form and in its cookie.
fn login_page(console: &Console, status: StatusCode, error: &str) -> Response {
    let csrf = session::random_hex();
    let error = if error.is_empty() {
        String::new()
    } else {
        format!(r#"<p class="error" role="alert">{}</p>"#, esc(error))
    };
    let mut res = page(
        status,
        "Sign in",
        None,
        &format!(
            r#"{error}<form method="post" action="/ui/login">
<input type="hidden" name="csrf" value="{csrf}">
<p><label for="token">Token</label><br><input id="token" name="token" type="password" autocomplete="current-password" required size="70"></p>
<p class="hint">A tenant's bearer token shows that tenant's records; an operator's token shows every tenant's.</p>
<p><button type="submit">Sign in</button></p>
</form>{oidc}"#,
            oidc = match &console.0.oidc {
                Some(o) => format!(
                    r#"<p class="oidc"><a class="button" href="/ui/login/oidc">Sign in at {}</a></p>
<p class="hint">Operators may sign in at the identity provider instead of with a token.</p>"#,
                    esc(&issuer_host(&o.config.issuer))
                ),
                None => String::new(),
            }
        ),
    );
    if let Ok(v) = HeaderValue::from_str(&session::set_cookie(
        session::LOGIN_COOKIE,
        &csrf,
        600,
        console.0.secure_cookie,
    )) {
        res.headers_mut().append(header::SET_COOKIE, v);
    }
    res
}

async fn login(
    State(console): State<Console>,
    headers: HeaderMap,
    Form(f): Form<LoginForm>,
) -> Response {
    let expected = session::cookie(&headers, session::LOGIN_COOKIE);
    let csrf_ok = match (expected, f.csrf.as_deref()) {
        (Some(e), Some(p)) => !e.is_empty() && session::same(e, p),
        _ => false,
    };
    if !csrf_ok {
        return login_page(
            &console,
            StatusCode::FORBIDDEN,
            "The sign-in form expired or was not sent from this page; try again.",
        );
    }
    let Some(role) = f
        .token
        .as_deref()
        .map(str::trim)
        .and_then(|t| console.sign_in(t))
    else {
        tracing::warn!(
            "console sign-in refused: the token names no tenant and is not the operator's"
        );
        return login_page(
            &console,
            StatusCode::UNAUTHORIZED,
            "That token is not valid here.",
        );
    };
    signed_in(&console, role, see_other("/ui"))
}

/// The issuer as the sign-in button names it: its host.
fn issuer_host(issuer: &str) -> String {
    reqwest::Url::parse(issuer)
        .ok()
        .and_then(|u| u.host_str().map(str::to_owned))
        .unwrap_or_else(|| issuer.to_owned())
}

/// Opens a session for `role` and answers with its cookie set, by `then` (a response without
/// cookies yet); clears the cookies of the sign-in forms.
fn signed_in(console: &Console, role: Role, mut res: Response) -> Response {
    tracing::info!(who = %role.by(), "console sign-in");
    let (id, _) = console.0.sessions.open(role);
    let secure = console.0.secure_cookie;
    for c in [
        session::set_cookie(
            session::COOKIE,
            &id,
            crate::SESSION_LIFETIME.as_secs(),
            secure,
        ),
        session::set_cookie(session::LOGIN_COOKIE, "", 0, secure),
        session::set_lax_cookie(session::OIDC_COOKIE, "", 0, secure),
    ] {
        if let Ok(v) = HeaderValue::from_str(&c) {
            res.headers_mut().append(header::SET_COOKIE, v);
        }
    }
    res
}

/// Starts an OpenID Connect sign-in: the browser goes to the issuer, with the sign-in's state
/// bound to it in a cookie.
async fn oidc_start(State(console): State<Console>) -> Response {
    let Some(oidc) = &console.0.oidc else {
        return login_page(
            &console,
            StatusCode::NOT_FOUND,
            "Sign-in at an identity provider is not configured here; sign in with a token.",
        );
    };
    match oidc.start().await {
        Ok((location, state)) => {
            let mut res = see_other(&location);
            if let Ok(v) = HeaderValue::from_str(&session::set_lax_cookie(
                session::OIDC_COOKIE,
                &state,
                600,
                console.0.secure_cookie,
            )) {
                res.headers_mut().append(header::SET_COOKIE, v);
            }
            res
        }
        Err(e) => oidc_failure(&e),
    }
}

#[derive(Debug, Deserialize)]
struct Callback {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
    error_description: Option<String>,
}

/// The issuer's answer: a code to exchange for an ID token, or an error.
async fn oidc_callback(
    State(console): State<Console>,
    headers: HeaderMap,
    Query(q): Query<Callback>,
) -> Response {
    let Some(oidc) = &console.0.oidc else {
        return see_other("/ui/login");
    };
    let again = r#"<p><a href="/ui/login">Sign in again</a>.</p>"#;
    let bound = session::cookie(&headers, session::OIDC_COOKIE);
    let Some(pending) = oidc.pending.finish(q.state.as_deref().unwrap_or(""), bound) else {
        tracing::warn!("console sign-in refused: the identity provider's answer is for no sign-in this browser started (state)");
        return page(
            StatusCode::BAD_REQUEST,
            "Sign-in not recognized",
            None,
            &format!("<p>This answer of the identity provider belongs to no sign-in started in this browser, or the sign-in took longer than 10 minutes, or it was used already; nobody was signed in.</p>{again}"),
        );
    };
    if let Some(error) = &q.error {
        tracing::warn!(%error, "console sign-in refused by the identity provider");
        return page(
            StatusCode::FORBIDDEN,
            "Sign-in refused",
            None,
            &format!(
                "<p>The identity provider did not sign you in: {}{}.</p>{again}",
                esc(error),
                q.error_description
                    .as_deref()
                    .map(|d| format!(" ({})", esc(d)))
                    .unwrap_or_default()
            ),
        );
    }
    let Some(code) = q.code.as_deref().filter(|c| !c.is_empty()) else {
        return page(
            StatusCode::BAD_REQUEST,
            "Sign-in not recognized",
            None,
            &format!("<p>The identity provider's answer has no code.</p>{again}"),
        );
    };
    let claims = match oidc.finish(code, &pending).await {
        Ok(c) => c,
        Err(e) => return oidc_failure(&e),
    };
    match crate::oidc::admit(&oidc.config, &claims) {
        Ok(name) => signed_in(
            &console,
            Role::Operator(name.clone()),
            html::page_moving_on(
                StatusCode::OK,
                "Signed in",
                None,
                &format!(
                    r#"<p>Signed in as operator {}. <a href="/ui">Continue to the records</a>.</p>"#,
                    esc(&name)
                ),
                "/ui",
            ),
        ),
        Err(refused) => {
            tracing::warn!(who = %refused.who, "console sign-in refused: the identity provider's user is not allowed");
            page(
                StatusCode::FORBIDDEN,
                "Not allowed",
                None,
                &format!(
                    "<p>The identity provider signed you in as <strong>{}</strong>, but you may not use this console: {}</p>{again}",
                    esc(&refused.who),
                    esc(&refused.why)
                ),
            )
        }
    }
}

/// The page of a sign-in that failed at or with the issuer.
fn oidc_failure(e: &crate::oidc::Failure) -> Response {
    let again = r#"<p><a href="/ui/login">Back to sign-in</a>.</p>"#;
    match e {
        crate::oidc::Failure::Issuer(why) => {
            tracing::error!(error = %why, "console sign-in failed: the identity provider could not be reached");
            page(
                StatusCode::BAD_GATEWAY,
                "Identity provider unavailable",
                None,
                &format!(
                    "<p>The identity provider could not be reached or answered wrongly: {}. Try again later.</p>{again}",
                    esc(why)
                ),
            )
        }
        crate::oidc::Failure::Refused(why) => {
            tracing::warn!(error = %why, "console sign-in refused: the identity provider's answer did not check out");
            page(
                StatusCode::FORBIDDEN,
                "Sign-in refused",
                None,
                &format!(
                    "<p>The identity provider's answer did not check out, so nobody was signed in: {}.</p>{again}",
                    esc(why)
                ),
            )
        }
    }
}

#[derive(Debug, Deserialize)]
struct CsrfOnly {
    csrf: Option<String>,
}

async fn logout(
    State(console): State<Console>,
    headers: HeaderMap,
    Form(f): Form<CsrfOnly>,
) -> Response {
    if let Err(res) = actor(&console, &headers, f.csrf.as_deref()) {
        return res;
    }
    console.0.sessions.close(&headers);
    let mut res = see_other("/ui/login");
    if let Ok(v) = HeaderValue::from_str(&session::set_cookie(
        session::COOKIE,
        "",
        0,
        console.0.secure_cookie,
    )) {
        res.headers_mut().append(header::SET_COOKIE, v);
    }
    res
}

// ---- records ----

#[derive(Debug, Default, Deserialize)]
struct ListQuery {
    tenant: Option<String>,
    tool: Option<String>,
    state: Option<String>,
    /// Only records created in the last this many hours.
    hours: Option<String>,
    /// Only records whose key starts with this (an exact key is a prefix of itself).
    key: Option<String>,
    /// The page after this cursor (the last record of the page before).
    cursor: Option<String>,
    /// Only records whose history holds what observe mode (shadow mode) recorded.
    observed: Option<String>,
}

/// How many records one page of the observed filter reads the histories of, at most: the
/// filter is no store query (observations live in histories), so a page is the observed
/// records among the next this many, and "Next page" goes on from there.
const OBSERVED_SCAN: usize = 2_000;

/// A query value, trimmed, unless it is empty.
fn nonempty(v: &Option<String>) -> Option<&str> {
    v.as_deref().map(str::trim).filter(|v| !v.is_empty())
}

/// A count as the list says it: exact below [`COUNT_UP_TO`], "at least" from there.
fn counted(n: usize) -> String {
    if n >= COUNT_UP_TO {
        format!("{COUNT_UP_TO} or more")
    } else {
        n.to_string()
    }
}

async fn records(
    State(console): State<Console>,
    headers: HeaderMap,
    Query(q): Query<ListQuery>,
) -> Response {
    let s = match viewer(&console, &headers) {
        Ok(s) => s,
        Err(res) => return res,
    };
    let Ok(tenant) = s.role.scope(q.tenant.as_deref()) else {
        // Another tenant's list: as empty as one that does not exist.
        return not_found(&s);
    };
    let tool = match nonempty(&q.tool).map(ToolName::new).transpose() {
        Ok(t) => t,
        Err(e) => return bad_request(&s, &format!("tool: {e}")),
    };
    let state = match nonempty(&q.state)
        .map(str::parse::<RecordStateName>)
        .transpose()
    {
        Ok(st) => st,
        Err(e) => return bad_request(&s, &format!("state: {e}")),
    };
    let hours = match nonempty(&q.hours).map(str::parse::<u32>).transpose() {
        Ok(h) => h,
        Err(_) => return bad_request(&s, "hours: expected a whole number of hours"),
    };
    let after_given = nonempty(&q.cursor).is_some();
    let after = match nonempty(&q.cursor)
        .map(str::parse::<ListCursor>)
        .transpose()
    {
        Ok(c) => c,
        Err(e) => return bad_request(&s, &format!("cursor: {e}")),
    };
    let filter = ListFilter {
        tenant: tenant.clone(),
        tool,
        state,
        key_prefix: nonempty(&q.key).map(Into::into),
        created_from: hours.map(|h| {
            Timestamp::from_millis(Timestamp::now().as_millis() - i64::from(h) * 3_600_000)
        }),
        after,
        // One more than the page, to know whether a next page follows.
        limit: PAGE + 1,
        ..ListFilter::default()
    };
    if nonempty(&q.observed).is_some() {
        return observed_records(&console, &s, &q, filter).await;
    }
    let mut list = match console.0.engine.list(&filter).await {
        Ok(l) => l,
        Err(e) => return engine_error(&s, &e),
    };
    let next = (list.len() > PAGE).then(|| ListCursor::of(&list[PAGE - 1]));
    list.truncate(PAGE);
    // The counts are of every page, bounded by COUNT_UP_TO; the unknown ones need an operator,
    // so they are counted (and offered as a filter) whatever the page shows.
    let unknown_filter = ListFilter {
        state: Some(RecordStateName::Unknown),
        ..filter.clone()
    };
    let counts = async {
        let total = console.0.engine.count(&filter, COUNT_UP_TO).await?;
        let unknown = match filter.state {
            Some(RecordStateName::Unknown) => total,
            Some(_) => 0,
            None => console.0.engine.count(&unknown_filter, COUNT_UP_TO).await?,
        };
        Ok::<_, idemgate::EngineError>((total, unknown))
    };
    let (total, unknown) = match counts.await {
        Ok(c) => c,
        Err(e) => return engine_error(&s, &e),
    };
    let here = |cursor: &str, state: &str| {
        query(&[
            ("tenant", q.tenant.as_deref().unwrap_or("")),
            ("tool", q.tool.as_deref().unwrap_or("")),
            ("state", state),
            ("hours", q.hours.as_deref().unwrap_or("")),
            ("key", q.key.as_deref().unwrap_or("")),
            ("cursor", cursor),
        ])
    };

    let mut body = String::new();
    filters_form(&mut body, &s, &q);
    let _ = write!(
        body,
        r#"<p class="summary">{} unknown of {} record(s){}{}.</p>"#,
        counted(unknown),
        counted(total),
        if unknown > 0 && filter.state.is_none() {
            format!(
                r#"; <a href="/ui?{}">show the unknown ones</a>, which need an operator"#,
                esc(&here("", "unknown"))
            )
        } else {
            String::new()
        },
        if after_given || next.is_some() {
            format!("; {} shown on this page, oldest first", list.len())
        } else {
            String::new()
        }
    );
    // What needs an operator comes first: on the first page of a listing of every state, the
    // unknown records (the first page of them) stand in a table of their own above the rest.
    if filter.state.is_none() && !after_given && unknown > 0 {
        let first_unknown = ListFilter {
            after: None,
            limit: PAGE,
            ..unknown_filter.clone()
        };
        let stuck = match console.0.engine.list(&first_unknown).await {
            Ok(l) => l,
            Err(e) => return engine_error(&s, &e),
        };
        let caption = if unknown > PAGE {
            format!(
                r#"Unknown outcomes, which need an operator: the oldest {PAGE} (<a href="/ui?{}">all of them</a>)"#,
                esc(&here("", "unknown"))
            )
        } else {
            "Unknown outcomes, which need an operator".to_owned()
        };
        records_table(&mut body, &caption, &stuck, None);
    }
    if list.is_empty() {
        body.push_str("<p>No records match.</p>");
    } else {
        let caption = if filter.state.is_none() && !after_given && unknown > 0 {
            "All records, oldest first"
        } else {
            "Records, oldest first"
        };
        records_table(&mut body, caption, &list, None);
    }
    // Every record is reachable: each page links to the one after it (and back to the first).
    let mut links = Vec::new();
    if after_given {
        links.push(format!(
            r#"<a href="/ui?{}">First page</a>"#,
            esc(&here("", q.state.as_deref().unwrap_or("")))
        ));
    }
    if let Some(next) = &next {
        links.push(format!(
            r#"<a href="/ui?{}" rel="next">Next page</a>"#,
            esc(&here(&next.to_string(), q.state.as_deref().unwrap_or("")))
        ));
    }
    if !links.is_empty() {
        let _ = write!(
            body,
            r#"<nav class="pages" aria-label="Pages">{}</nav>"#,
            links.join(" ")
        );
    }
    page(StatusCode::OK, "Records", Some(header_of(&s)), &body)
}

/// The records page's filter form, its fields filled in from `q`.
fn filters_form(body: &mut String, s: &Session, q: &ListQuery) {
    let _ = write!(
        body,
        r#"<form method="get" action="/ui" class="filters" aria-label="Filter records">"#
    );
    if matches!(s.role, Role::Operator(_)) {
        let _ = write!(
            body,
            r#"<label for="f-tenant">Tenant</label> <input id="f-tenant" name="tenant" value="{}" size="12"> "#,
            esc(q.tenant.as_deref().unwrap_or(""))
        );
    }
    let _ = write!(
        body,
        r#"<label for="f-tool">Tool</label> <input id="f-tool" name="tool" value="{}" size="14">
<label for="f-state">State</label> <select id="f-state" name="state">"#,
        esc(q.tool.as_deref().unwrap_or(""))
    );
    for (value, label) in [
        ("", "any"),
        ("unknown", "unknown"),
        ("in_flight", "in flight"),
        ("completed", "completed"),
        ("expired", "expired"),
    ] {
        let selected = if q.state.as_deref().unwrap_or("") == value {
            " selected"
        } else {
            ""
        };
        let _ = write!(
            body,
            r#"<option value="{value}"{selected}>{label}</option>"#
        );
    }
    let _ = write!(
        body,
        r#"</select>
<label for="f-hours">Created in the last (hours)</label> <input id="f-hours" name="hours" value="{}" size="4" inputmode="numeric">
<label for="f-key">Key starts with</label> <input id="f-key" name="key" value="{}" size="16">
<label for="f-observed">Observed calls only</label> <input type="checkbox" id="f-observed" name="observed" value="1"{}>
<button type="submit">Filter</button></form>"#,
        esc(q.hours.as_deref().unwrap_or("")),
        esc(q.key.as_deref().unwrap_or("")),
        if nonempty(&q.observed).is_some() {
            " checked"
        } else {
            ""
        },
    );
}

/// A table of `records` under `caption` (HTML), one row each, each key linking to its record;
/// with `observed` (one per record), a column of what observe mode recorded on each.
fn records_table(
    body: &mut String,
    caption: &str,
    records: &[Record],
    observed: Option<&[story::Observed]>,
) {
    let _ = write!(
        body,
        r#"<div class="scroll"><table><caption>{caption}</caption><thead><tr><th scope="col">State</th><th scope="col">Tenant</th><th scope="col">Tool</th><th scope="col">Key</th><th scope="col">Fence</th><th scope="col">Created</th><th scope="col">Detail</th>{}</tr></thead><tbody>"#,
        if observed.is_some() {
            r#"<th scope="col">Observe mode</th>"#
        } else {
            ""
        }
    );
    for (i, r) in records.iter().enumerate() {
        let state = r.state_name().to_string();
        let seen = observed
            .and_then(|o| o.get(i))
            .map(|o| format!(r#"<td class="observed">{}</td>"#, esc(&o.to_string())))
            .unwrap_or_default();
        let _ = write!(
            body,
            r#"<tr class="row-{state}"><td><span class="state state-{state}">{state}</span></td><td>{}</td><td>{}</td><td class="key"><a href="/ui/record?{}">{}</a></td><td>{}</td><td>{}</td><td>{}</td>{seen}</tr>"#,
            esc(r.key.tenant.as_str()),
            esc(r.key.tool.as_str()),
            record_query(&r.key),
            esc(r.key.key.as_str()),
            r.fence,
            time_html(r.created_at),
            detail_with(r, time_html),
        );
    }
    body.push_str("</tbody></table></div>");
}

/// The records page filtered to what observe mode (shadow mode) recorded: the records whose
/// history holds observations, among at most [`OBSERVED_SCAN`] records from the page's cursor,
/// each with how many calls ran that enforce mode would not have run and its verdicts.
async fn observed_records(
    console: &Console,
    s: &Session,
    q: &ListQuery,
    mut filter: ListFilter,
) -> Response {
    let after_given = filter.after.is_some();
    let (mut kept, mut seen) = (Vec::new(), Vec::new());
    let mut scanned = 0usize;
    let mut next = None;
    loop {
        let list = match console.0.engine.list(&filter).await {
            Ok(l) => l,
            Err(e) => return engine_error(s, &e),
        };
        let more = list.len() > PAGE;
        let page: Vec<Record> = list.into_iter().take(PAGE).collect();
        scanned += page.len();
        if let Some(last) = page.last() {
            filter.after = Some(ListCursor::of(last));
        }
        match idemgate_kit::records::observed(&console.0.engine, page).await {
            Ok(found) => {
                for (r, o) in found {
                    kept.push(r);
                    seen.push(o);
                }
            }
            Err(e) => return engine_error(s, &e),
        }
        if !more {
            break;
        }
        if kept.len() >= PAGE || scanned >= OBSERVED_SCAN {
            next = filter.after.clone();
            break;
        }
    }
    let here = |cursor: &str| {
        query(&[
            ("tenant", q.tenant.as_deref().unwrap_or("")),
            ("tool", q.tool.as_deref().unwrap_or("")),
            ("state", q.state.as_deref().unwrap_or("")),
            ("hours", q.hours.as_deref().unwrap_or("")),
            ("key", q.key.as_deref().unwrap_or("")),
            ("observed", "1"),
            ("cursor", cursor),
        ])
    };
    let mut body = String::new();
    filters_form(&mut body, s, q);
    let calls: usize = seen.iter().map(|o| o.calls).sum();
    let _ = write!(
        body,
        r#"<p class="summary">Observe mode (shadow mode) runs every call, and records on the record a call duplicated what enforce mode would have done instead. {} record(s) of the {scanned} read hold {calls} such call(s).</p>"#,
        kept.len()
    );
    if kept.is_empty() {
        body.push_str("<p>No record holds an observation.</p>");
    } else {
        records_table(
            &mut body,
            "Records with calls that enforce mode would not have run, oldest first",
            &kept,
            Some(&seen),
        );
    }
    let mut links = Vec::new();
    if after_given {
        links.push(format!(
            r#"<a href="/ui?{}">First page</a>"#,
            esc(&here(""))
        ));
    }
    if let Some(next) = &next {
        links.push(format!(
            r#"<a href="/ui?{}" rel="next">Next page</a>"#,
            esc(&here(&next.to_string()))
        ));
    }
    if !links.is_empty() {
        let _ = write!(
            body,
            r#"<nav class="pages" aria-label="Pages">{}</nav>"#,
            links.join(" ")
        );
    }
    page(StatusCode::OK, "Observed calls", Some(header_of(s)), &body)
}

/// The query string naming one record.
fn record_query(key: &Key) -> String {
    query(&[
        ("tenant", key.tenant.as_str()),
        ("tool", key.tool.as_str()),
        ("key", key.key.as_str()),
    ])
}

/// A time as the records table shows it: a `<time>` element, which the stylesheet keeps on one
/// line (a table squeezed by a narrow window otherwise breaks it at its hyphens, mid-date).
fn time_html(t: Timestamp) -> String {
    format!(r#"<time datetime="{t}">{t}</time>"#)
}

/// One line about a record's state.
fn detail(r: &Record) -> String {
    detail_with(r, |t| t.to_string())
}

/// [`detail`] with each time written by `time` (its words are the console's own: with a time
/// written as HTML, it is HTML).
fn detail_with(r: &Record, time: impl Fn(Timestamp) -> String) -> String {
    match &r.state {
        RecordState::InFlight { lease_until } => format!("lease until {}", time(*lease_until)),
        RecordState::Completed {
            outcome,
            completed_at,
            expires_at,
            retain_until,
        } => {
            let by = if Payload::is_resolution(outcome) {
                ", resolved by an operator"
            } else {
                ""
            };
            let remembered = if retain_until > expires_at {
                format!(", then remembered as expired until {}", time(*retain_until))
            } else {
                String::new()
            };
            format!(
                "{} at {}{by}; kept until {}{remembered}",
                outcome.kind,
                time(*completed_at),
                time(*expires_at)
            )
        }
        RecordState::Unknown { since } => format!("outcome unknown since {}", time(*since)),
        RecordState::Expired {
            completed_at,
            expired_at,
            retain_until,
        } => format!(
            "ran at {}; its outcome expired at {} and is no longer kept; a retry is refused as expired until {}",
            time(*completed_at),
            time(*expired_at),
            time(*retain_until)
        ),
    }
}

#[derive(Debug, Default, Deserialize)]
struct RecordQuery {
    tenant: Option<String>,
    tool: Option<String>,
    key: Option<String>,
}

/// The key a request names, within what the session may see: `Err` is the answer to give.
fn named_key(
    s: &Session,
    tenant: Option<&str>,
    tool: Option<&str>,
    key: Option<&str>,
) -> Result<Key, Response> {
    let tenant = match s.role.scope(tenant) {
        Ok(Some(t)) => t,
        Ok(None) => return Err(bad_request(s, "tenant: required")),
        Err(()) => return Err(not_found(s)),
    };
    let tool =
        ToolName::new(tool.unwrap_or("")).map_err(|e| bad_request(s, &format!("tool: {e}")))?;
    let key =
        IdempotencyKey::new(key.unwrap_or("")).map_err(|e| bad_request(s, &format!("key: {e}")))?;
    Ok(Key::new(tenant, tool, key))
}

/// The session of a page request and the record its query names, or the page to answer
/// instead (sign in, 400, 404).
async fn shown(
    console: &Console,
    headers: &HeaderMap,
    q: &RecordQuery,
) -> Result<(Session, Record, Vec<HistoryEntry>), Response> {
    let s = viewer(console, headers)?;
    let key = named_key(&s, q.tenant.as_deref(), q.tool.as_deref(), q.key.as_deref())?;
    match console.0.engine.record_and_history(&key).await {
        Ok((Some(r), trail)) => Ok((s, r, trail)),
        Ok((None, _)) => Err(not_found(&s)),
        Err(e) => Err(engine_error(&s, &e)),
    }
}

/// The record's facts as a definition list; with its `trail`, why it is unknown.
fn facts(r: &Record, trail: &[HistoryEntry]) -> String {
    let state = r.state_name().to_string();
    let mut out = format!(
        r#"<dl class="facts"><dt>State</dt><dd><span class="state state-{state}">{state}</span></dd><dt>Tenant</dt><dd>{}</dd><dt>Tool</dt><dd>{}</dd><dt>Key</dt><dd><code>{}</code></dd><dt>Fence</dt><dd>{}</dd><dt>Reserved</dt><dd>{}</dd>"#,
        esc(r.key.tenant.as_str()),
        esc(r.key.tool.as_str()),
        esc(r.key.key.as_str()),
        r.fence,
        r.created_at
    );
    if let Some(scope) = &r.scope {
        let _ = write!(out, "<dt>Scope</dt><dd>{}</dd>", esc(scope));
    }
    let _ = write!(out, "<dt>Detail</dt><dd>{}</dd>", esc(&detail(r)));
    if let Some(reason) = story::unknown_reason(r, trail) {
        let _ = write!(out, "<dt>Why unknown</dt><dd>{}</dd>", esc(&reason));
    }
    let _ = write!(
        out,
        r#"<dt>Downstream key</dt><dd><code>{}</code> <span class="hint">(what the upstream got: search for it there)</span></dd>"#,
        story::downstream_key(&r.key)
    );
    if let RecordState::Completed { outcome, .. } = &r.state {
        let shown = match Payload::of(outcome) {
            Ok(p) => p.to_json().get().to_owned(),
            Err(e) => format!("(unreadable: {e})"),
        };
        let _ = write!(
            out,
            r#"<dt>Outcome</dt><dd><pre class="outcome">{}</pre></dd>"#,
            esc(&shown)
        );
    }
    out.push_str("</dl>");
    out
}

async fn record(
    State(console): State<Console>,
    headers: HeaderMap,
    Query(q): Query<RecordQuery>,
) -> Response {
    let s = match viewer(&console, &headers) {
        Ok(s) => s,
        Err(res) => return res,
    };
    let key = match named_key(&s, q.tenant.as_deref(), q.tool.as_deref(), q.key.as_deref()) {
        Ok(k) => k,
        Err(res) => return res,
    };
    let (r, trail) = match console.0.engine.record_and_history(&key).await {
        Ok(found) => found,
        Err(e) => return engine_error(&s, &e),
    };
    let Some(r) = r else {
        if trail.is_empty() {
            return not_found(&s);
        }
        // Released or reopened (perhaps by someone else meanwhile): no record counts, but its
        // trail says what became of it.
        let body = format!(
            "<p>No record counts under <code>{}</code> (tool {}, tenant {}) now: the next call with this key runs the action.</p>{}",
            esc(key.key.as_str()),
            esc(key.tool.as_str()),
            esc(key.tenant.as_str()),
            history(&story::story(None, &trail))
        );
        return page(StatusCode::OK, "Record", Some(header_of(&s)), &body);
    };
    let mut body = facts(&r, &trail);
    let q = record_query(&r.key);
    body.push_str(r#"<p class="actions">"#);
    if matches!(r.state, RecordState::Unknown { .. }) {
        let _ = write!(
            body,
            r#"<a class="button" href="/ui/resolve?{q}">Resolve…</a> "#
        );
    }
    if !matches!(r.state, RecordState::InFlight { .. }) {
        let _ = write!(
            body,
            r#"<a class="button" href="/ui/reopen?{q}">Reopen…</a>"#
        );
    }
    body.push_str("</p>");
    body.push_str(&history(&story::story(Some(&r), &trail)));
    page(StatusCode::OK, "Record", Some(header_of(&s)), &body)
}

/// The record's history from the store ([`idemgate_kit::story`]): the same trail every door
/// shows, whichever process or door wrote it.
fn history(steps: &[story::Step]) -> String {
    let mut out = String::from("<h2>History</h2>");
    if steps.is_empty() {
        out.push_str("<p>Nothing is on record.</p>");
        return out;
    }
    out.push_str(r#"<ol class="timeline">"#);
    for step in steps {
        let mut text = esc(&step.text);
        // The person, where one acted, stands out of the sentence.
        if let Some(by) = &step.by {
            let plain = format!(" by {}", esc(by));
            text = text.replacen(&plain, &format!(" by <strong>{}</strong>", esc(by)), 1);
        }
        let fence = step
            .fence
            .map(|f| format!(r#" <span class="fence">fence {f}</span>"#))
            .unwrap_or_default();
        let _ = write!(
            out,
            r#"<li><time datetime="{t}">{t}</time>{fence} <span class="event event-{e}">{text}</span></li>"#,
            t = step.at,
            e = esc(&step.what),
        );
    }
    out.push_str("</ol>");
    out
}

// ---- resolve and reopen ----

async fn resolve_form(
    State(console): State<Console>,
    headers: HeaderMap,
    Query(q): Query<RecordQuery>,
) -> Response {
    let (s, r, trail) = match shown(&console, &headers, &q).await {
        Ok(v) => v,
        Err(res) => return res,
    };
    let mut body = facts(&r, &trail);
    if !matches!(r.state, RecordState::Unknown { .. }) {
        body.push_str("<p>Only an unknown record can be resolved; this one is not.</p>");
        return page(StatusCode::CONFLICT, "Resolve", Some(header_of(&s)), &body);
    }
    let _ = write!(
        body,
        r#"<form method="post" action="/ui/resolve" class="confirm">
{hidden}
<fieldset><legend>What happened?</legend>
<p><input type="radio" id="r-completed" name="resolution" value="completed" required> <label for="r-completed">It happened: completed with this result (replayed to every retry)</label></p>
<p class="result-field"><label for="result">Result (JSON)</label><br><textarea id="result" name="result" rows="4" cols="60">null</textarea></p>
<p><input type="radio" id="r-release" name="resolution" value="release"> <label for="r-release">It did not happen: not applied (the next call runs it)</label></p>
</fieldset>
<p><label for="reason">Reason (written to the audit log with your name)</label><br><textarea id="reason" name="reason" rows="2" cols="60" required></textarea></p>
<p><button type="submit">Confirm resolution</button> <a href="/ui/record?{q}">Cancel</a></p>
</form>"#,
        hidden = hidden_fields(&s, &r),
        q = record_query(&r.key),
    );
    page(
        StatusCode::OK,
        "Resolve this record?",
        Some(header_of(&s)),
        &body,
    )
}

/// The hidden fields of a form that acts on a record at the fence shown.
fn hidden_fields(s: &Session, r: &Record) -> String {
    format!(
        r#"<input type="hidden" name="csrf" value="{}"><input type="hidden" name="tenant" value="{}"><input type="hidden" name="tool" value="{}"><input type="hidden" name="key" value="{}"><input type="hidden" name="fence" value="{}">"#,
        esc(&s.csrf),
        esc(r.key.tenant.as_str()),
        esc(r.key.tool.as_str()),
        esc(r.key.key.as_str()),
        r.fence
    )
}

#[derive(Debug, Deserialize)]
struct ActForm {
    csrf: Option<String>,
    tenant: Option<String>,
    tool: Option<String>,
    key: Option<String>,
    fence: Option<String>,
    resolution: Option<String>,
    result: Option<String>,
    reason: Option<String>,
}

impl ActForm {
    /// The session, the record's key, the fence and the reason, or the answer to give.
    fn check(
        &self,
        console: &Console,
        headers: &HeaderMap,
    ) -> Result<(Session, Key, u64, String), Response> {
        let s = actor(console, headers, self.csrf.as_deref())?;
        let key = named_key(
            &s,
            self.tenant.as_deref(),
            self.tool.as_deref(),
            self.key.as_deref(),
        )?;
        let fence = self
            .fence
            .as_deref()
            .and_then(|f| f.parse::<u64>().ok())
            .ok_or_else(|| bad_request(&s, "fence: expected the record's fence"))?;
        let reason = self.reason.as_deref().unwrap_or("").trim().to_owned();
        if reason.is_empty() {
            return Err(bad_request(&s, "reason: say why, for the audit log"));
        }
        Ok((s, key, fence, reason))
    }
}

async fn resolve(
    State(console): State<Console>,
    headers: HeaderMap,
    Form(f): Form<ActForm>,
) -> Response {
    let (s, key, fence, reason) = match f.check(&console, &headers) {
        Ok(v) => v,
        Err(res) => return res,
    };
    let resolution = match f.resolution.as_deref() {
        Some("completed") => {
            let text = f.result.as_deref().unwrap_or("null").trim();
            let text = if text.is_empty() { "null" } else { text };
            match Payload::json_text(text) {
                Ok(p) => Resolution::Completed {
                    outcome: p.into_resolution(OutcomeKind::Success),
                    keep: Keep::of(
                        KeyRule::Explicit,
                        console.0.engine.policies().get(key.tool.as_str()),
                    ),
                },
                Err(e) => return bad_request(&s, &format!("result: not JSON: {e}")),
            }
        }
        Some("release") => Resolution::Release,
        _ => return bad_request(&s, "resolution: choose completed or not applied"),
    };
    let by = s.role.by();
    match console
        .0
        .engine
        .resolve(&key, fence, resolution, Some(&by), Some(&reason))
        .await
    {
        Ok(Some(r)) => see_other(&format!("/ui/record?{}", record_query(&r.key))),
        Ok(None) => page(
            StatusCode::OK,
            "Resolved",
            Some(header_of(&s)),
            r#"<p>Resolved as not applied: the record is released, and the next call with its key runs. <a href="/ui">Back to the records</a>.</p>"#,
        ),
        Err(e) => settle_error(&s, &key, &e),
    }
}

async fn reopen_form(
    State(console): State<Console>,
    headers: HeaderMap,
    Query(q): Query<RecordQuery>,
) -> Response {
    let (s, r, trail) = match shown(&console, &headers, &q).await {
        Ok(v) => v,
        Err(res) => return res,
    };
    let mut body = facts(&r, &trail);
    if matches!(r.state, RecordState::InFlight { .. }) {
        body.push_str("<p>A record in flight is never reopened: its call may be running the action now. Once its lease ends it reads unknown.</p>");
        return page(StatusCode::CONFLICT, "Reopen", Some(header_of(&s)), &body);
    }
    let _ = write!(
        body,
        r#"<p class="warning">Reopening forgets this record: the next call with its key <strong>runs the action again</strong>. Do it only when you know the action did not take effect, or must be repeated.</p>
<form method="post" action="/ui/reopen" class="confirm">
{hidden}
<p><label for="reason">Reason (written to the audit log with your name)</label><br><textarea id="reason" name="reason" rows="2" cols="60" required></textarea></p>
<p><button type="submit">Confirm reopening</button> <a href="/ui/record?{q}">Cancel</a></p>
</form>"#,
        hidden = hidden_fields(&s, &r),
        q = record_query(&r.key),
    );
    page(
        StatusCode::OK,
        "Reopen this record?",
        Some(header_of(&s)),
        &body,
    )
}

async fn reopen(
    State(console): State<Console>,
    headers: HeaderMap,
    Form(f): Form<ActForm>,
) -> Response {
    let (s, key, fence, reason) = match f.check(&console, &headers) {
        Ok(v) => v,
        Err(res) => return res,
    };
    let by = s.role.by();
    match console
        .0
        .engine
        .reopen(&key, fence, Some(&by), Some(&reason))
        .await
    {
        Ok(was) => page(
            StatusCode::OK,
            "Reopened",
            Some(header_of(&s)),
            &format!(
                r#"<p>The record of {} (it was {was}) is reopened: the next call with its key runs the action again. <a href="/ui">Back to the records</a>.</p>"#,
                record_name(&key)
            ),
        ),
        Err(e) => settle_error(&s, &key, &e),
    }
}

/// The record, named in a sentence: its key, tool and tenant.
fn record_name(key: &Key) -> String {
    format!(
        "<code>{}</code> (tool {}, tenant {})",
        esc(key.key.as_str()),
        esc(key.tool.as_str()),
        esc(key.tenant.as_str())
    )
}

/// The page of a resolution or reopening the engine refused. The operator acted on the record as
/// a page showed it, so a record that is not there any more was released (or reopened) since,
/// and one that moved on is shown again, in the browser, before they decide again.
fn settle_error(s: &Session, key: &Key, e: &EngineError) -> Response {
    let page_of = |status, title, words: &str| {
        page(
            status,
            title,
            Some(header_of(s)),
            &format!(
                r#"<p>Nothing was changed: {words}</p><p><a href="/ui">Back to the records</a></p>"#
            ),
        )
    };
    match e {
        EngineError::NotFound { .. } => page_of(
            StatusCode::NOT_FOUND,
            "Record released",
            &format!(
                "the record of {} is no longer there. It was released (or reopened) since you looked at it, so the next call with its key runs the action.",
                record_name(key)
            ),
        ),
        // The kit's words say where the record stands; what to do next is the browser's.
        EngineError::NotResolvable { .. } | EngineError::NotReopenable { .. } => explained_error(
            s,
            e,
            &format!(
                r#"<a href="/ui/record?{}">Open the record as it is now</a> to see what changed since you looked at it, then decide again; or go <a href="/ui">back to the records</a>."#,
                esc(&record_query(key))
            ),
        ),
        _ => engine_error(s, e),
    }
}

// ---- charts ----

#[derive(Debug, Default, Deserialize)]
struct ChartQuery {
    hours: Option<String>,
    /// Only this tenant's calls (the operator's filter; a tenant sees its own anyway).
    tenant: Option<String>,
}

async fn charts(
    State(console): State<Console>,
    headers: HeaderMap,
    Query(q): Query<ChartQuery>,
) -> Response {
    let s = match viewer(&console, &headers) {
        Ok(s) => s,
        Err(res) => return res,
    };
    let hours = q
        .hours
        .as_deref()
        .and_then(|h| h.parse::<usize>().ok())
        .filter(|h| (2..=48).contains(h))
        .unwrap_or(24);
    // A tenant sees its own calls whatever it asks for; the operator every tenant's, or the
    // one the filter names.
    let only: Option<String> = match &s.role {
        Role::Operator(_) => nonempty(&q.tenant).map(str::to_owned),
        Role::Tenant(t) => Some(t.as_str().to_owned()),
    };
    let visible = |tenant: &str| only.as_deref().is_none_or(|t| t == tenant);
    let mut body = String::new();
    if matches!(s.role, Role::Operator(_)) {
        let _ = write!(
            body,
            r#"<form method="get" action="/ui/charts" class="filters"><label for="f-tenant">Tenant</label> <input id="f-tenant" name="tenant" value="{}" size="16"> <label for="f-hours">Hours</label> <input id="f-hours" name="hours" value="{hours}" size="3" inputmode="numeric"> <button type="submit">Show</button></form>"#,
            esc(only.as_deref().unwrap_or("")),
        );
    }
    let log = match &console.0.audit_log {
        Some(path) => match audit::read(path) {
            Ok(l) => l,
            Err(e) => {
                let _ = write!(
                    body,
                    "<p class=\"error\">Failed to read the audit log: {}</p>",
                    esc(&e.to_string())
                );
                audit::Log::default()
            }
        },
        None => {
            body.push_str(
                "<p class=\"error\">No audit log is configured: only refusals are counted, and what idemgate saved cannot be shown.</p>",
            );
            audit::Log::default()
        }
    };
    value_section(&mut body, &log, &visible);
    let window = chart::Window::ending(Timestamp::now(), hours);
    let _ = write!(
        body,
        r#"<h2>Calls per tool over time</h2><p>Over the last {hours} hours, one group of bars a {bucket} (times in UTC). <strong>Executed</strong>, <strong>replayed</strong> and <strong>unknown</strong> (records that turned unknown) come from the audit log, so they survive restarts and include every process that writes it. <strong>Refused</strong> calls (key missing or reused, in flight, over quota) change no record and are not in the audit log: they are counted by this process only, since it started{}.</p>
<ul class="legend">{}</ul>"#,
        if console.0.tally.is_none() {
            " (this process serves no calls, so there are none)"
        } else {
            ""
        },
        chart::SERIES
            .iter()
            .map(|n| format!(r#"<li><span class="swatch s-{n}"></span>{n}</li>"#))
            .collect::<String>(),
        bucket = window.bucket_words(),
    );
    let refused = console
        .0
        .tally
        .as_ref()
        .map(|t| t.snapshot())
        .unwrap_or_default();
    let tools = chart::count(&log, &refused, visible, &window);
    let duplicates = chart::duplicates_by_tenant(&log, visible, &window);
    if tools.is_empty() {
        body.push_str("<p>No calls in this window.</p>");
    }
    for (i, (tool, counts)) in tools.iter().enumerate() {
        let _ = write!(
            body,
            r#"<section class="tool"><h3>{}</h3>{}<table class="totals"><caption>Totals</caption><tr>{}</tr><tr>{}</tr></table>"#,
            esc(tool),
            chart::calls_svg(&format!("c{i}"), tool, counts, &window, hours),
            chart::SERIES
                .iter()
                .map(|n| format!(r#"<th scope="col">{n}</th>"#))
                .collect::<String>(),
            (0..chart::SERIES.len())
                .map(|n| format!("<td>{}</td>", counts.total(n)))
                .collect::<String>(),
        );
        if let Some(tenants) = duplicates.get(tool) {
            let series: Vec<chart::Series<'_>> = tenants
                .iter()
                .enumerate()
                .map(|(t, (tenant, per_bucket))| chart::Series {
                    name: tenant,
                    class: chart::tenant_class(t),
                    per_bucket,
                })
                .collect();
            let _ = write!(
                body,
                r#"<h4>Duplicates answered without running, by tenant</h4><ul class="legend">{}</ul>{}"#,
                series
                    .iter()
                    .map(|x| format!(
                        r#"<li><span class="swatch {}"></span>{}: {}</li>"#,
                        x.class,
                        esc(x.name),
                        x.per_bucket.iter().sum::<u64>()
                    ))
                    .collect::<String>(),
                chart::svg(
                    &format!("d{i}"),
                    &format!("{tool}: duplicates answered without running, by tenant, in the last {hours} hours"),
                    &series,
                    &window,
                ),
            );
        }
        body.push_str("</section>");
    }
    page(StatusCode::OK, "Charts", Some(header_of(&s)), &body)
}

/// What idemgate saved, from the whole audit log read (not only the chart's window): the
/// duplicates it answered without running, the records operators settled, and the time the
/// replays did not spend running the action again.
fn value_section(body: &mut String, log: &audit::Log, visible: &dyn Fn(&str) -> bool) {
    let value = crate::value::count(log, visible);
    let _ = write!(
        body,
        r#"<h2>What idemgate saved</h2><p>Counted from the audit log{}: every process that writes it, across restarts. <code>/metrics</code> has the same counts for this process since it started (<code>idemgate_duplicates_answered_total</code>, <code>idemgate_resolutions_total</code>).</p>"#,
        if log.truncated {
            " (its last 16 MiB: older lines are not counted)"
        } else {
            ""
        }
    );
    body.push_str(r#"<table class="value" id="duplicates"><caption>Duplicates answered without running the action</caption><tr><th scope="col">tenant</th><th scope="col">tool</th><th scope="col">rule</th><th scope="col">calls</th></tr>"#);
    if value.duplicates.is_empty() {
        body.push_str(r#"<tr><td colspan="4">None in the log.</td></tr>"#);
    }
    for ((tenant, tool, rule), n) in &value.duplicates {
        let _ = write!(
            body,
            r#"<tr><td>{}</td><td>{}</td><td>{}</td><td>{n}</td></tr>"#,
            esc(tenant),
            esc(tool),
            esc(rule)
        );
    }
    body.push_str(r#"</table><p class="note">Rules: <strong>key</strong> a replay of a record the caller's key named (the orchestration layer's or the program's), <strong>call_id</strong> one a framework's tool-call id named (in its conversation), <strong>model_key</strong> one the model's own <code>idempotency_key</code> named (in its conversation), <strong>window</strong> a replay of an identical call within the tool's window, <strong>expired</strong> a retry of an action that ran before and whose outcome is no longer kept, refused rather than run again.</p>"#);
    body.push_str(r#"<table class="value" id="saved"><caption>Time saved by replays</caption><tr><th scope="col">tenant</th><th scope="col">tool</th><th scope="col">replays timed</th><th scope="col">time not spent again</th><th scope="col">replays not timed</th></tr>"#);
    let mut pairs: std::collections::BTreeSet<&(String, String)> = value.saved.keys().collect();
    pairs.extend(value.untimed.keys());
    if pairs.is_empty() {
        body.push_str(r#"<tr><td colspan="5">No replays in the log.</td></tr>"#);
    }
    for pair in pairs {
        let (timed, ms) = value.saved.get(pair).copied().unwrap_or((0, 0));
        let _ = write!(
            body,
            r#"<tr><td>{}</td><td>{}</td><td>{timed}</td><td>{}</td><td>{}</td></tr>"#,
            esc(&pair.0),
            esc(&pair.1),
            crate::value::duration(ms),
            value.untimed.get(pair).copied().unwrap_or(0),
        );
    }
    body.push_str(r#"</table><p class="note">A record keeps when its outcome was recorded, not when its action started, so the time is read from the audit log: from the line that reserved the record to the line that recorded its outcome (the action's run plus idemgate's own store writes), counted once for each replay of it. A replay whose execution is not in the log (older than the log, an operator's resolution, a record reopened since) is counted as not timed.</p>"#);
    body.push_str(r#"<table class="value" id="resolutions"><caption>Records operators settled</caption><tr><th scope="col">tenant</th><th scope="col">tool</th><th scope="col">how</th><th scope="col">through</th><th scope="col">records</th></tr>"#);
    if value.resolutions.is_empty() {
        body.push_str(r#"<tr><td colspan="5">None in the log.</td></tr>"#);
    }
    for ((tenant, tool, how, door), n) in &value.resolutions {
        let _ = write!(
            body,
            r#"<tr><td>{}</td><td>{}</td><td>{how}</td><td>{door}</td><td>{n}</td></tr>"#,
            esc(tenant),
            esc(tool),
        );
    }
    body.push_str(r#"</table><p class="note"><strong>completed</strong>: resolved as "it happened" (retries get the operator's result); <strong>released</strong>: "it did not happen" (the next call runs); <strong>reopened</strong>: a stored or unknown outcome dropped so the next call runs again. Through: the console, the API (the gateway's records endpoints, signed by the tenant) or the CLI (<code>idemgate keys</code>, signed by the OS user).</p>"#);
}

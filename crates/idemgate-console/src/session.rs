//! Server-side sessions named by a random cookie, each with its CSRF token.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use axum::http::HeaderMap;
use idemgate::TenantId;
use subtle::ConstantTimeEq as _;

use crate::SESSION_LIFETIME;

/// The session cookie's name.
pub(crate) const COOKIE: &str = "idemgate_console";
/// The cookie that carries the sign-in form's CSRF token (double submit: there is no session
/// yet to hold it).
pub(crate) const LOGIN_COOKIE: &str = "idemgate_console_login";
/// The cookie that binds an OpenID Connect sign-in's `state` to the browser that started it.
pub(crate) const OIDC_COOKIE: &str = "idemgate_console_oidc";
/// Sessions one process keeps at most; the oldest go first when a sign-in would pass it.
const MAX_SESSIONS: usize = 10_000;

/// Who is signed in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// Sees and acts on every tenant's records; signs what it does with its name.
    Operator(String),
    /// Sees and acts on this tenant's records only.
    Tenant(TenantId),
}

impl Role {
    /// The tenant a request may look at: a tenant's own, whatever it asked for (`Err` when it
    /// asked for another: the caller answers 404, so that another tenant's records are never
    /// confirmed to exist); the operator's choice (`None`: every tenant; `Err` for a name that
    /// is no tenant's).
    pub(crate) fn scope(&self, asked: Option<&str>) -> Result<Option<TenantId>, ()> {
        match self {
            // A name no tenant can have names nothing: not every tenant.
            Role::Operator(_) => asked
                .filter(|t| !t.is_empty())
                .map(|t| TenantId::new(t).map_err(|_| ()))
                .transpose(),
            Role::Tenant(own) => match asked.filter(|t| !t.is_empty()) {
                Some(t) if t != own.as_str() => Err(()),
                _ => Ok(Some(own.clone())),
            },
        }
    }

    /// Who did it, for the audit log: `console:<operator's name>` or `console:tenant:<id>`.
    pub fn by(&self) -> String {
        match self {
            Role::Operator(name) => format!("console:{name}"),
            Role::Tenant(t) => format!("console:tenant:{t}"),
        }
    }

    /// How the page names the signed-in user.
    pub(crate) fn label(&self) -> String {
        match self {
            // The single shared token's operator is named "operator": said once.
            Role::Operator(name) if name == crate::DEFAULT_OPERATOR => {
                "operator (all tenants)".to_owned()
            }
            Role::Operator(name) => format!("operator {name} (all tenants)"),
            Role::Tenant(t) => format!("tenant {t}"),
        }
    }
}

/// One signed-in browser.
#[derive(Clone, Debug)]
pub(crate) struct Session {
    pub(crate) role: Role,
    pub(crate) csrf: String,
    expires: Instant,
}

impl Session {
    /// Whether `presented` is this session's CSRF token (compared in constant time).
    pub(crate) fn csrf_matches(&self, presented: Option<&str>) -> bool {
        presented.is_some_and(|p| same(p, &self.csrf))
    }
}

/// Two secrets compared in constant time (their lengths are not secret).
pub(crate) fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// The sessions of one process.
#[derive(Debug, Default)]
pub(crate) struct Sessions(Mutex<HashMap<String, Session>>);

impl Sessions {
    /// A new session for `role`: its id (the cookie's value) and the session.
    pub(crate) fn open(&self, role: Role) -> (String, Session) {
        let id = random_hex();
        let now = Instant::now();
        let session = Session {
            role,
            csrf: random_hex(),
            expires: now + SESSION_LIFETIME,
        };
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        all.retain(|_, s| s.expires > now);
        if all.len() >= MAX_SESSIONS {
            if let Some(oldest) = all
                .iter()
                .min_by_key(|(_, s)| s.expires)
                .map(|(k, _)| k.clone())
            {
                all.remove(&oldest);
            }
        }
        all.insert(id.clone(), session.clone());
        (id, session)
    }

    /// The live session the request's cookie names.
    pub(crate) fn find(&self, headers: &HeaderMap) -> Option<Session> {
        let id = cookie(headers, COOKIE)?;
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match all.get(id) {
            Some(s) if s.expires > Instant::now() => Some(s.clone()),
            Some(_) => {
                all.remove(id);
                None
            }
            None => None,
        }
    }

    /// Ends the session the request's cookie names.
    pub(crate) fn close(&self, headers: &HeaderMap) {
        if let Some(id) = cookie(headers, COOKIE) {
            self.0.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
        }
    }
}

/// 256 random bits in hex.
pub(crate) fn random_hex() -> String {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("failed to read randomness from the operating system");
    idemgate::key::hex(&bytes)
}

/// The value of cookie `name` in the request's `Cookie` headers.
pub(crate) fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v)
}

/// A `Set-Cookie` value for the console's path: HttpOnly, SameSite=Strict, Secure when asked;
/// `max_age` 0 deletes it.
pub(crate) fn set_cookie(name: &str, value: &str, max_age: u64, secure: bool) -> String {
    format!(
        "{name}={value}; Path=/ui; Max-Age={max_age}; HttpOnly; SameSite=Strict{}",
        if secure { "; Secure" } else { "" }
    )
}

/// As [`set_cookie`], but `SameSite=Lax`: for the cookie of an OpenID Connect sign-in, which
/// must come back with the issuer's redirect to the callback, a top-level navigation from
/// another site that a `Strict` cookie would not be sent with. It only names a pending sign-in
/// (no session), and the callback is a GET that changes nothing but that sign-in.
pub(crate) fn set_lax_cookie(name: &str, value: &str, max_age: u64, secure: bool) -> String {
    set_cookie(name, value, max_age, secure).replace("SameSite=Strict", "SameSite=Lax")
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    #[test]
    fn an_operator_signs_with_its_name() {
        let alice = Role::Operator("alice@example.com".to_owned());
        assert_eq!(alice.by(), "console:alice@example.com");
        assert_eq!(alice.label(), "operator alice@example.com (all tenants)");
        let shared = Role::Operator(crate::DEFAULT_OPERATOR.to_owned());
        assert_eq!(shared.by(), "console:operator");
        assert_eq!(shared.label(), "operator (all tenants)");
        assert_eq!(
            Role::Tenant(TenantId::new("acme").unwrap()).by(),
            "console:tenant:acme"
        );
    }

    #[test]
    fn a_tenant_is_kept_to_its_own_records() {
        let operator = Role::Operator("alice".to_owned());
        let acme = Role::Tenant(TenantId::new("acme").unwrap());
        assert_eq!(acme.scope(None).unwrap().unwrap().as_str(), "acme");
        assert_eq!(acme.scope(Some("")).unwrap().unwrap().as_str(), "acme");
        assert_eq!(acme.scope(Some("acme")).unwrap().unwrap().as_str(), "acme");
        assert!(acme.scope(Some("globex")).is_err());
        assert_eq!(operator.scope(None).unwrap(), None);
        assert_eq!(operator.scope(Some("")).unwrap(), None);
        assert!(operator.scope(Some("no such/tenant")).is_err());
        assert_eq!(
            operator.scope(Some("globex")).unwrap().unwrap().as_str(),
            "globex"
        );
    }

    #[test]
    fn sessions_are_found_by_their_cookie_and_end_at_logout() {
        let sessions = Sessions::default();
        let (id, s) = sessions.open(Role::Operator("alice".to_owned()));
        assert_eq!(id.len(), 64);
        let mut headers = HeaderMap::new();
        headers.insert(
            axum::http::header::COOKIE,
            HeaderValue::from_str(&format!("other=1; {COOKIE}={id}")).unwrap(),
        );
        let found = sessions.find(&headers).unwrap();
        assert_eq!(found.csrf, s.csrf);
        assert!(found.csrf_matches(Some(&s.csrf)));
        assert!(!found.csrf_matches(Some(&random_hex())));
        assert!(!found.csrf_matches(None));
        assert!(!found.csrf_matches(Some("")));
        sessions.close(&headers);
        assert!(sessions.find(&headers).is_none());
    }

    #[test]
    fn cookies_are_http_only_and_strict() {
        let c = set_cookie(COOKIE, "v", 60, false);
        assert!(c.contains("HttpOnly") && c.contains("SameSite=Strict"));
        assert!(!c.contains("Secure"));
        assert!(set_cookie(COOKIE, "v", 60, true).ends_with("; Secure"));
    }
}

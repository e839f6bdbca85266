//! The guard in front of every request to the endpoint: the `Origin` (the proxy's own loopback
//! address, or one of `http.allowed_origins`, against DNS rebinding), the bearer token (a static
//! tenant's, else an OAuth access token, see oauth.rs) and the tenant's rate. Apart from the
//! sessions because it needs none of them: it answers who is calling, or why nobody is.

use std::sync::Arc;

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use idemgate_core::TenantId;
use idemgate_kit::tenants::{authenticate, bearer, AuthError, Tenant};

use super::oauth::{OAuth, Rejection};
use super::reply::{refuse, Refused};
use crate::config::Config;

/// Who may call, and how that is told: the origins let in, the static tenants and their tokens,
/// the OAuth resource server, and the tenant of every request when neither is configured.
pub(super) struct Guard {
    /// `http.allowed_origins`.
    allowed_origins: Vec<String>,
    tenants: Vec<Arc<Tenant>>,
    /// The resource server's side of OAuth, when `[oauth]` is configured.
    pub(super) oauth: Option<Arc<OAuth>>,
    tenant: TenantId,
}

impl Guard {
    /// The guard `config` asks for; without `config.tenants` (nor `[oauth]`) every request is
    /// `tenant`'s.
    pub(super) fn new(config: &Config, tenant: TenantId) -> Self {
        let tenants = config
            .tenants
            .iter()
            .map(|t| Arc::new(Tenant::new(t)))
            .collect();
        let oauth = config.oauth.clone().map(|o| Arc::new(OAuth::new(o)));
        Guard {
            allowed_origins: config.http.allowed_origins.clone(),
            tenants,
            oauth,
            tenant,
        }
    }

    /// Checks `Origin`, the bearer token (a static tenant's, else an OAuth access token) and the
    /// tenant's rate; returns the caller's tenant.
    pub(super) async fn admit(&self, headers: &HeaderMap) -> Result<TenantId, Refused> {
        if let Some(origin) = headers.get(header::ORIGIN) {
            let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
            let allowed = origin.to_str().is_ok_and(|o| {
                let o = o.trim().trim_end_matches('/');
                same_loopback_origin(o, host)
                    || self
                        .allowed_origins
                        .iter()
                        .any(|a| a.trim_end_matches('/').eq_ignore_ascii_case(o))
            });
            if !allowed {
                return Err(refuse(
                    StatusCode::FORBIDDEN,
                    "the Origin of this request is not in http.allowed_origins",
                ));
            }
        }
        if self.tenants.is_empty() && self.oauth.is_none() {
            return Ok(self.tenant.clone());
        }
        let authorization = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let tenant = match (authenticate(&self.tenants, authorization), &self.oauth) {
            (Ok(tenant), _) => tenant,
            (Err(why), None) => {
                let mut res = refuse(StatusCode::UNAUTHORIZED, why.detail());
                res.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static(why.challenge()),
                );
                return Err(res);
            }
            (Err(why), Some(oauth)) => {
                let checked = match why {
                    AuthError::Missing => Err(Rejection::Missing),
                    AuthError::Empty => {
                        Err(Rejection::Invalid("the bearer token is empty".to_owned()))
                    }
                    AuthError::Invalid => {
                        let token = authorization.and_then(bearer).unwrap_or_default();
                        oauth.check(token).await
                    }
                };
                let grant = checked.map_err(|r| oauth_refusal(oauth, &r))?;
                tracing::debug!(tenant = %grant.tenant, "admitted an OAuth access token");
                // A tenant of `[[tenants]]` keeps its rate limit with either kind of token.
                match self.tenants.iter().find(|t| t.id == grant.tenant) {
                    Some(tenant) => Arc::clone(tenant),
                    None => return Ok(grant.tenant),
                }
            }
        };
        tenant.admit().map_err(|after| {
            let mut res = refuse(
                StatusCode::TOO_MANY_REQUESTS,
                "the tenant's request rate limit is exhausted; retry after the time given",
            );
            let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
            res.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
            res
        })?;
        Ok(tenant.id.clone())
    }
}

/// The answer to a request whose bearer token was not taken: 401 with a challenge that names
/// the Protected Resource Metadata, 403 for a missing scope or an unmapped tenant, 503 when the
/// keys could not be fetched.
fn oauth_refusal(oauth: &OAuth, rejection: &Rejection) -> Refused {
    let (status, message) = match rejection {
        Rejection::Missing => (
            StatusCode::UNAUTHORIZED,
            "an `Authorization: Bearer <token>` header is required: an access token of the authorization server the resource metadata names",
        ),
        Rejection::Invalid(why) => (StatusCode::UNAUTHORIZED, why.as_str()),
        Rejection::InsufficientScope(why) | Rejection::NoTenant(why) => {
            (StatusCode::FORBIDDEN, why.as_str())
        }
        Rejection::Unavailable(why) => (StatusCode::SERVICE_UNAVAILABLE, why.as_str()),
    };
    // Why a token was refused, never the token: what an operator setting up OAuth looks for.
    if !matches!(rejection, Rejection::Missing | Rejection::Unavailable(_)) {
        tracing::info!(
            status = status.as_u16(),
            reason = message,
            "refused a bearer token"
        );
    }
    let mut res = refuse(status, message);
    if !matches!(rejection, Rejection::Unavailable(_)) {
        if let Ok(v) = HeaderValue::from_str(&oauth.challenge(rejection)) {
            res.headers_mut().insert(header::WWW_AUTHENTICATE, v);
        }
    }
    res
}

/// Whether `origin` is the proxy's own origin on loopback: `http://` and the request's `Host`,
/// whose name is `localhost`, `127.0.0.1` or `[::1]`. Only a page loaded from this very address
/// sends it, and the proxy serves no pages; a DNS-rebinding page carries its own name in `Origin`
/// (and in `Host`), never a loopback one. Clients that send their target as `Origin` (the MCP
/// conformance suite does) are let in without listing it in `http.allowed_origins`.
fn same_loopback_origin(origin: &str, host: Option<&str>) -> bool {
    let Some(host) = host.map(str::trim) else {
        return false;
    };
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().map(|n| format!("[{n}]")),
        None => host.split(':').next().map(str::to_owned),
    };
    let loopback = name.is_some_and(|n| {
        ["localhost", "127.0.0.1", "[::1]"]
            .iter()
            .any(|l| n.eq_ignore_ascii_case(l))
    });
    loopback
        && origin
            .strip_prefix("http://")
            .is_some_and(|o| o.eq_ignore_ascii_case(host))
}

#[cfg(test)]
mod tests {
    use super::same_loopback_origin;

    #[test]
    fn own_loopback_origin_only() {
        let own = |o, h| same_loopback_origin(o, Some(h));
        assert!(own("http://127.0.0.1:8765", "127.0.0.1:8765"));
        assert!(own("http://localhost:8765", "localhost:8765"));
        assert!(own("http://LOCALHOST:8765", "localhost:8765"));
        assert!(own("http://[::1]:8765", "[::1]:8765"));
        assert!(own("http://127.0.0.1", "127.0.0.1"));
        // Another port, another name, or a non-loopback host is another origin.
        assert!(!own("http://127.0.0.1:3000", "127.0.0.1:8765"));
        assert!(!own("http://localhost:8765", "127.0.0.1:8765"));
        assert!(!own("http://evil.example:8765", "evil.example:8765"));
        assert!(!own(
            "http://localhost.evil.example:8765",
            "localhost.evil.example:8765"
        ));
        assert!(!own(
            "http://127.0.0.1.nip.io:8765",
            "127.0.0.1.nip.io:8765"
        ));
        assert!(!own("https://127.0.0.1:8765", "127.0.0.1:8765"));
        assert!(!own("null", "127.0.0.1:8765"));
        assert!(!same_loopback_origin("http://127.0.0.1:8765", None));
    }
}

//! Bearer tokens, tenants, and the per-tenant limits (rate and live keys).

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse as _, Response};
use idemgate::key::hex;
use idemgate::{TenantId, Verdict};
use idemgate_kit::{LiveKeys, RateLimit};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq as _;

use crate::config::TenantConfig;
use crate::error::Problem;
use crate::gateway::Gateway;

/// Lower-case hex SHA-256 of a bearer token, as `token_sha256` in the configuration wants it.
pub fn token_sha256(token: &str) -> String {
    hex(&Sha256::digest(token.as_bytes()))
}

/// A fresh random bearer token (256 bits, `igt_` and 64 hex digits).
///
/// # Panics
/// When the operating system has no randomness to give, which std also treats as fatal.
pub fn new_token() -> String {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("failed to read randomness from the operating system");
    format!("igt_{}", hex(&bytes))
}

/// One configured tenant with its limits' state.
#[derive(Debug)]
pub(crate) struct Tenant {
    pub(crate) id: TenantId,
    hash: [u8; 32],
    rate: Option<RateLimit>,
    pub(crate) live: LiveKeys,
}

impl Tenant {
    pub(crate) fn new(c: &TenantConfig) -> Self {
        let mut hash = [0u8; 32];
        for (i, b) in hash.iter_mut().enumerate() {
            // Validated as 64 hex digits when the configuration was loaded.
            *b = u8::from_str_radix(&c.token_sha256[2 * i..2 * i + 2], 16).unwrap_or(0);
        }
        Tenant {
            id: c.id.clone(),
            hash,
            rate: c.rate_limit_per_second.map(RateLimit::new),
            live: LiveKeys::new(c.max_live_keys),
        }
    }

    /// Takes one request from the tenant's rate budget, or says when to come back.
    fn admit(&self) -> Result<(), std::time::Duration> {
        self.rate.as_ref().map_or(Ok(()), RateLimit::admit)
    }
}

/// The tenant whose token a request carried (and that passed its rate limit).
#[derive(Clone, Debug)]
pub(crate) struct Caller(pub(crate) Arc<Tenant>);

/// The token of an `Authorization: Bearer <token>` header, trimmed (maybe empty); `None` without a
/// bearer header.
fn bearer(parts: &Parts) -> Option<&str> {
    let value = parts.headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    // A header of the scheme alone ("Bearer") carries an empty token.
    let (scheme, token) = value.split_once(' ').unwrap_or((value, ""));
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
}

/// Finds the tenant whose token hash matches, comparing against every tenant in constant time so
/// the answer's timing says nothing about which tenants exist or how close a guess was.
pub(crate) fn authenticate(tenants: &[Arc<Tenant>], parts: &Parts) -> Option<Arc<Tenant>> {
    let presented: [u8; 32] =
        Sha256::digest(bearer(parts).filter(|t| !t.is_empty())?.as_bytes()).into();
    let mut found = None;
    for t in tenants {
        if bool::from(t.hash.ct_eq(&presented)) {
            found = Some(t.clone());
        }
    }
    found
}

impl FromRequestParts<Gateway> for Caller {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, gw: &Gateway) -> Result<Self, Response> {
        let tenant = authenticate(gw.tenants(), parts).ok_or_else(|| unauthorized(parts))?;
        tenant.admit().map_err(|after| {
            gw.metrics()
                .call(tenant.id.as_str(), "-", Verdict::RateLimited);
            Problem::of(
                Verdict::RateLimited,
                "the tenant's request rate limit is exhausted; retry after the time given",
            )
            .with_retry_after(after)
            .into_response()
        })?;
        Ok(Caller(tenant))
    }
}

/// 401 with the RFC 6750 challenge: no error code when the request carried no bearer token (it
/// may not have known one is needed), `invalid_request` for an empty one, `invalid_token` for one
/// that matches no tenant.
fn unauthorized(parts: &Parts) -> Response {
    let (challenge, detail) = match bearer(parts) {
        None => (
            r#"Bearer realm="idemgate""#,
            "a valid `Authorization: Bearer <token>` header is required",
        ),
        Some("") => (
            r#"Bearer realm="idemgate", error="invalid_request""#,
            "the bearer token is empty",
        ),
        Some(_) => (
            r#"Bearer realm="idemgate", error="invalid_token""#,
            "the bearer token is not valid for any tenant",
        ),
    };
    let mut problem = Problem::unauthorized();
    problem.detail = detail.to_owned();
    let mut res = problem.into_response();
    res.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static(challenge),
    );
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_hash_is_sha256_hex() {
        assert_eq!(
            token_sha256("test"),
            "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
        );
        let t = new_token();
        assert!(t.starts_with("igt_") && t.len() == 68);
        assert_ne!(t, new_token());
    }
}

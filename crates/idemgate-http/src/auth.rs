//! Bearer tokens, tenants, and the per-tenant limits (rate and live keys).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse as _, Response};
use idemgate::key::hex;
use idemgate::TenantId;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq as _;
use tokio::time::Instant;

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
    bucket: Option<Mutex<Bucket>>,
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
            bucket: c.rate_limit_per_second.map(|r| Mutex::new(Bucket::new(r))),
            live: LiveKeys::new(c.max_live_keys),
        }
    }

    /// Takes one request from the tenant's rate budget, or says when to come back.
    fn admit(&self) -> Result<(), Duration> {
        match &self.bucket {
            Some(b) => b
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take(Instant::now()),
            None => Ok(()),
        }
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
            gw.metrics().call(tenant.id.as_str(), "-", "rate_limited");
            Problem::new(
                axum::http::StatusCode::TOO_MANY_REQUESTS,
                "rate-limited",
                "Rate limited",
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

/// A token bucket: `rate` tokens a second, holding at most twice that.
#[derive(Debug)]
struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Option<Instant>,
}

impl Bucket {
    fn new(rate: f64) -> Self {
        let burst = (2.0 * rate).max(1.0);
        Bucket {
            rate,
            burst,
            tokens: burst,
            last: None,
        }
    }

    fn take(&mut self, now: Instant) -> Result<(), Duration> {
        if let Some(last) = self.last {
            let refill = now.saturating_duration_since(last).as_secs_f64() * self.rate;
            self.tokens = (self.tokens + refill).min(self.burst);
        }
        self.last = Some(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.rate))
        }
    }
}

/// The records this gateway holds in flight for one tenant, by key digest, each until its lease
/// would run out (a coordinated caller that never reports back stops counting when its lease
/// ends).
#[derive(Debug)]
pub(crate) struct LiveKeys {
    max: Option<usize>,
    held: Mutex<HashMap<[u8; 32], Instant>>,
}

impl LiveKeys {
    fn new(max: Option<usize>) -> Self {
        LiveKeys {
            max,
            held: Mutex::new(HashMap::new()),
        }
    }

    /// The quota, if any.
    pub(crate) fn max(&self) -> Option<usize> {
        self.max
    }

    /// Counts `digest` as live until `until`; false when the tenant is at its quota.
    pub(crate) fn hold(&self, digest: [u8; 32], until: Instant) -> bool {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(max) = self.max {
            if held.len() >= max && !held.contains_key(&digest) {
                let now = Instant::now();
                held.retain(|_, t| *t > now);
                if held.len() >= max {
                    return false;
                }
            }
        }
        held.insert(digest, until);
        true
    }

    /// Extends a held key (after a heartbeat).
    pub(crate) fn extend(&self, digest: [u8; 32], until: Instant) {
        if let Some(t) = self
            .held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(&digest)
        {
            *t = until;
        }
    }

    /// Stops counting a key (its outcome was reported).
    pub(crate) fn release(&self, digest: &[u8; 32]) {
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(digest);
    }

    /// How many keys count now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.held.lock().unwrap().len()
    }
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

    #[test]
    fn bucket_allows_a_burst_then_paces() {
        let mut b = Bucket::new(2.0);
        let t0 = Instant::now();
        for _ in 0..4 {
            assert!(b.take(t0).is_ok());
        }
        let wait = b.take(t0).unwrap_err();
        assert!(wait <= Duration::from_millis(500) && wait > Duration::ZERO);
        assert!(b.take(t0 + Duration::from_millis(500)).is_ok());
    }

    #[test]
    fn live_keys_enforce_the_quota_and_forget_expired_ones() {
        let live = LiveKeys::new(Some(1));
        let now = Instant::now();
        assert!(live.hold([1; 32], now + Duration::from_secs(60)));
        assert!(!live.hold([2; 32], now + Duration::from_secs(60)));
        live.release(&[1; 32]);
        assert!(live.hold([2; 32], now));
        // [2] expires at `now`, so it no longer counts.
        assert!(live.hold([3; 32], now + Duration::from_secs(60)));
        assert_eq!(live.len(), 1);
    }
}

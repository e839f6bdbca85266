//! Tenants and their bearer tokens, shared by every front door that serves over the network (the
//! HTTP gateway and the MCP proxy's Streamable HTTP transport): the `[[tenants]]` table, the
//! token hashes, and finding the tenant a request's `Authorization` header names.

use std::sync::Arc;

use idemgate_core::key::hex;
use idemgate_core::TenantId;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq as _;

use crate::limits::{LiveKeys, RateLimit};

/// `[[tenants]]`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// The tenant's id; its records are named under it.
    pub id: TenantId,
    /// Lower-case hex SHA-256 of the tenant's bearer token (`idemgate token hash TOKEN`).
    pub token_sha256: String,
    /// Requests per second (token bucket, burst twice the rate); unlimited when absent.
    pub rate_limit_per_second: Option<f64>,
    /// Records this gateway may hold in flight for the tenant at once; unlimited when absent.
    pub max_live_keys: Option<usize>,
}

/// Checks what serde cannot: hashes are 64 hex digits, ids and tokens are unique, rates are
/// positive.
///
/// # Errors
/// The field at fault (`tenants[i].token_sha256`) and what is wrong with it.
pub fn validate(tenants: &[TenantConfig]) -> Result<(), (String, String)> {
    for (i, t) in tenants.iter().enumerate() {
        let h = &t.token_sha256;
        if h.len() != 64 || !h.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err((
                format!("tenants[{i}].token_sha256"),
                "expected 64 hex digits (`idemgate token hash TOKEN` prints them)".to_owned(),
            ));
        }
        if tenants[..i].iter().any(|o| o.id == t.id) {
            return Err((
                format!("tenants[{i}].id"),
                format!("tenant {:?} is listed twice", t.id.as_str()),
            ));
        }
        if tenants[..i]
            .iter()
            .any(|o| o.token_sha256.eq_ignore_ascii_case(h))
        {
            return Err((
                format!("tenants[{i}].token_sha256"),
                "two tenants share one token".to_owned(),
            ));
        }
        if let Some(r) = t.rate_limit_per_second {
            if !(r.is_finite() && r > 0.0) {
                return Err((
                    format!("tenants[{i}].rate_limit_per_second"),
                    "expected a positive number".to_owned(),
                ));
            }
        }
    }
    Ok(())
}

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
pub struct Tenant {
    /// The tenant's id.
    pub id: TenantId,
    hash: [u8; 32],
    rate: Option<RateLimit>,
    /// The records in flight it holds.
    pub live: LiveKeys,
}

impl Tenant {
    /// The tenant of a validated `[[tenants]]` entry.
    pub fn new(c: &TenantConfig) -> Self {
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
    ///
    /// # Errors
    /// How long until a request is allowed again.
    pub fn admit(&self) -> Result<(), std::time::Duration> {
        self.rate.as_ref().map_or(Ok(()), RateLimit::admit)
    }
}

/// Why a request names no tenant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthError {
    /// It carried no bearer token (it may not have known one is needed).
    Missing,
    /// Its bearer token is empty.
    Empty,
    /// Its bearer token matches no tenant.
    Invalid,
}

impl AuthError {
    /// The RFC 6750 `WWW-Authenticate` challenge that goes with the 401.
    pub fn challenge(self) -> &'static str {
        match self {
            AuthError::Missing => r#"Bearer realm="idemgate""#,
            AuthError::Empty => r#"Bearer realm="idemgate", error="invalid_request""#,
            AuthError::Invalid => r#"Bearer realm="idemgate", error="invalid_token""#,
        }
    }

    /// What the caller should be told.
    pub fn detail(self) -> &'static str {
        match self {
            AuthError::Missing => "a valid `Authorization: Bearer <token>` header is required",
            AuthError::Empty => "the bearer token is empty",
            AuthError::Invalid => "the bearer token is not valid for any tenant",
        }
    }
}

/// The token of an `Authorization: Bearer <token>` header value, trimmed (maybe empty); `None`
/// for another scheme.
pub fn bearer(authorization: &str) -> Option<&str> {
    // A header of the scheme alone ("Bearer") carries an empty token.
    let (scheme, token) = authorization.split_once(' ').unwrap_or((authorization, ""));
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
}

/// The tenant whose token the `Authorization` header value carries, compared against every
/// tenant in constant time so the answer's timing says nothing about which tenants exist or how
/// close a guess was.
///
/// # Errors
/// Why no tenant is named.
pub fn authenticate(
    tenants: &[Arc<Tenant>],
    authorization: Option<&str>,
) -> Result<Arc<Tenant>, AuthError> {
    let token = authorization.and_then(bearer).ok_or(AuthError::Missing)?;
    if token.is_empty() {
        return Err(AuthError::Empty);
    }
    let presented: [u8; 32] = Sha256::digest(token.as_bytes()).into();
    let mut found = None;
    for t in tenants {
        if bool::from(t.hash.ct_eq(&presented)) {
            found = Some(t.clone());
        }
    }
    found.ok_or(AuthError::Invalid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(id: &str, token: &str) -> TenantConfig {
        TenantConfig {
            id: TenantId::new(id).unwrap(),
            token_sha256: token_sha256(token),
            rate_limit_per_second: None,
            max_live_keys: None,
        }
    }

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
    fn bearer_tokens_name_their_tenant() {
        let tenants: Vec<_> = [tenant("a", "ta"), tenant("b", "tb")]
            .iter()
            .map(|c| Arc::new(Tenant::new(c)))
            .collect();
        let id = |h: Option<&str>| authenticate(&tenants, h).map(|t| t.id.to_string());
        assert_eq!(id(Some("Bearer ta")).unwrap(), "a");
        assert_eq!(id(Some("bearer  tb ")).unwrap(), "b");
        assert_eq!(id(None), Err(AuthError::Missing));
        assert_eq!(id(Some("Basic dGE=")), Err(AuthError::Missing));
        assert_eq!(id(Some("Bearer")), Err(AuthError::Empty));
        assert_eq!(id(Some("Bearer tc")), Err(AuthError::Invalid));
    }

    #[test]
    fn validation_names_the_field() {
        let mut bad = tenant("a", "t");
        bad.token_sha256 = "abc".to_owned();
        assert_eq!(validate(&[bad]).unwrap_err().0, "tenants[0].token_sha256");
        let e = validate(&[tenant("a", "t"), tenant("a", "u")]).unwrap_err();
        assert_eq!(e.0, "tenants[1].id");
        let e = validate(&[tenant("a", "t"), tenant("b", "t")]).unwrap_err();
        assert!(e.1.contains("share"), "{e:?}");
        assert!(validate(&[tenant("a", "t"), tenant("b", "u")]).is_ok());
    }
}

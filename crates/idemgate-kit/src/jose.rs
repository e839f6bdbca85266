//! The little of JOSE the network doors need: a JWS in compact form checked against the keys of
//! an issuer's JWKS (fetched by discovery, kept, fetched again on rotation). The MCP door's OAuth
//! checks JWT access tokens with it, the console's OpenID Connect sign-in checks ID tokens.
//!
//! Signatures are checked with `ring`, not a JWT library: what is needed is a table of a few
//! algorithms and a page of code, with nothing between the key and the check that could pick
//! `none` or HMAC-with-a-public-key.
//!
//! Keys are fetched from the issuer's metadata (the discovery URLs the caller names) or a
//! configured `jwks_uri`, kept for `max_age`, and fetched again when a token names a key not held
//! (the issuer rotated its keys), at most once per `refetch_interval`, so that tokens with
//! made-up key ids cannot make the door hammer the issuer.

use std::time::{Duration, Instant};

use base64::Engine as _;
use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey, VerificationAlgorithm};
use serde_json::Value;

/// How long a fetch of metadata or keys may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest metadata or key set read.
const MAX_DOCUMENT: usize = 256 * 1024;
/// The most keys kept of one issuer.
const MAX_KEYS: usize = 64;

/// The algorithms taken, as error messages list them.
pub const ALGORITHMS: &str = "RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384";

/// The JWS algorithms taken, each with its key type, curve and `ring` check.
fn algorithm(alg: &str) -> Option<(&'static str, Option<&'static str>, Verify)> {
    use signature::*;
    Some(match alg {
        "RS256" => ("RSA", None, Verify::Rsa(&RSA_PKCS1_2048_8192_SHA256)),
        "RS384" => ("RSA", None, Verify::Rsa(&RSA_PKCS1_2048_8192_SHA384)),
        "RS512" => ("RSA", None, Verify::Rsa(&RSA_PKCS1_2048_8192_SHA512)),
        "PS256" => ("RSA", None, Verify::Rsa(&RSA_PSS_2048_8192_SHA256)),
        "PS384" => ("RSA", None, Verify::Rsa(&RSA_PSS_2048_8192_SHA384)),
        "PS512" => ("RSA", None, Verify::Rsa(&RSA_PSS_2048_8192_SHA512)),
        "ES256" => ("EC", Some("P-256"), Verify::Ec(&ECDSA_P256_SHA256_FIXED)),
        "ES384" => ("EC", Some("P-384"), Verify::Ec(&ECDSA_P384_SHA384_FIXED)),
        _ => return None,
    })
}

#[derive(Clone, Copy)]
enum Verify {
    Rsa(&'static signature::RsaParameters),
    Ec(&'static dyn VerificationAlgorithm),
}

/// A public key of a JWKS.
pub struct Jwk {
    kid: Option<String>,
    /// The algorithm the key is for, when the set says.
    alg: Option<String>,
    key: PublicKey,
}

enum PublicKey {
    Rsa {
        n: Vec<u8>,
        e: Vec<u8>,
    },
    /// An uncompressed point (0x04, x, y) and its curve.
    Ec {
        crv: String,
        point: Vec<u8>,
    },
}

impl Jwk {
    /// A key of a JWKS entry; `None` for one that cannot be used (another type or curve, an
    /// encryption key).
    pub fn parse(v: &Value) -> Option<Jwk> {
        if v.get("use").is_some_and(|u| u != "sig") {
            return None;
        }
        let field = |name: &str| v.get(name).and_then(Value::as_str).and_then(b64);
        let key = match v.get("kty")?.as_str()? {
            "RSA" => PublicKey::Rsa {
                n: strip_zeros(field("n")?),
                e: strip_zeros(field("e")?),
            },
            "EC" => {
                let crv = v.get("crv")?.as_str()?.to_owned();
                let size = match crv.as_str() {
                    "P-256" => 32,
                    "P-384" => 48,
                    _ => return None,
                };
                let (x, y) = (field("x")?, field("y")?);
                if x.len() != size || y.len() != size {
                    return None;
                }
                let mut point = vec![4];
                point.extend(x);
                point.extend(y);
                PublicKey::Ec { crv, point }
            }
            _ => return None,
        };
        Some(Jwk {
            kid: v.get("kid").and_then(Value::as_str).map(str::to_owned),
            alg: v.get("alg").and_then(Value::as_str).map(str::to_owned),
            key,
        })
    }

    /// Whether this key checks signatures of `alg` named with `kid`.
    pub fn fits(&self, alg: &str, kid: Option<&str>) -> bool {
        let Some((kty, crv, _)) = algorithm(alg) else {
            return false;
        };
        let kind = match &self.key {
            PublicKey::Rsa { .. } => kty == "RSA",
            PublicKey::Ec { crv: c, .. } => kty == "EC" && crv == Some(c.as_str()),
        };
        kind && self.alg.as_deref().is_none_or(|a| a == alg)
            && (kid.is_none() || self.kid.as_deref() == kid)
    }

    fn verify(&self, alg: &str, message: &[u8], sig: &[u8]) -> bool {
        let Some((_, _, check)) = algorithm(alg) else {
            return false;
        };
        match (&self.key, check) {
            (PublicKey::Rsa { n, e }, Verify::Rsa(params)) => RsaPublicKeyComponents { n, e }
                .verify(params, message, sig)
                .is_ok(),
            (PublicKey::Ec { point, .. }, Verify::Ec(params)) => {
                UnparsedPublicKey::new(params, point)
                    .verify(message, sig)
                    .is_ok()
            }
            _ => false,
        }
    }
}

/// Base64url, with or without padding.
pub fn b64(text: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(text.trim_end_matches('='))
        .ok()
}

fn strip_zeros(mut bytes: Vec<u8>) -> Vec<u8> {
    let zeros = bytes.iter().take_while(|b| **b == 0).count();
    bytes.drain(..zeros.min(bytes.len().saturating_sub(1)));
    bytes
}

/// A JWS in compact form, decoded but not yet verified: its claims say nothing until
/// [`Keys::verify`] says the signature holds.
#[derive(Debug)]
pub struct Jws {
    /// The protected header's `alg`, one of [`ALGORITHMS`].
    pub alg: String,
    /// The protected header's `kid`.
    pub kid: Option<String>,
    /// The payload, a JSON object.
    pub claims: Value,
    /// What the signature covers: header and payload, as sent.
    message: Vec<u8>,
    signature: Vec<u8>,
}

impl Jws {
    /// Decodes `token` (header.payload.signature, base64url) whose payload is a JSON object (a
    /// JWT's claims), refusing algorithms not in [`ALGORITHMS`] and critical header parameters
    /// before any key is looked at.
    ///
    /// # Errors
    /// What is wrong with it, in words for a log or an error description.
    pub fn decode(token: &str) -> Result<Jws, String> {
        let mut parts = token.split('.');
        let (Some(h), Some(p), Some(s), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err("the token is not a JWT".to_owned());
        };
        let header: Value = b64(h)
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or("the token's header is not base64url JSON")?;
        let claims: Value = b64(p)
            .and_then(|b| serde_json::from_slice(&b).ok())
            .filter(Value::is_object)
            .ok_or("the token's claims are not a base64url JSON object")?;
        let signature = b64(s).ok_or("the token's signature is not base64url")?;
        let alg = header["alg"].as_str().unwrap_or_default();
        if algorithm(alg).is_none() {
            return Err(format!(
                "the token's algorithm {alg:?} is not taken ({ALGORITHMS})"
            ));
        }
        if header.get("crit").is_some() {
            return Err("the token has critical header parameters".to_owned());
        }
        Ok(Jws {
            alg: alg.to_owned(),
            kid: header["kid"].as_str().map(str::to_owned),
            claims,
            message: token.as_bytes()[..h.len() + 1 + p.len()].to_vec(),
            signature,
        })
    }
}

/// Why a signature could not be checked.
#[derive(Debug)]
pub enum KeyError {
    /// The issuer has no key for the token's `kid` and algorithm: the token is not its.
    NoSuchKey(String),
    /// The issuer's keys could not be had (and none are held): nothing can be said of the token.
    Unavailable(String),
}

/// An HTTP client for an issuer's metadata, keys and token endpoint: no proxy from the
/// environment (the issuer is configured: a proxy must not reroute the fetch of the keys that
/// decide who gets in), no redirects, a timeout.
///
/// # Panics
/// When the HTTP client cannot be built (no TLS roots at all), which no request could survive
/// either.
pub fn http_client() -> reqwest::Client {
    crate::tls::client_builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(FETCH_TIMEOUT)
        .build()
        .expect("failed to build the HTTP client for the issuer's keys")
}

/// An issuer's URLs are `https`, or `http` on a loopback host (OAuth 2.1, 1.5): tokens, codes
/// and keys never cross a network in clear. `at` names the field in the error.
///
/// # Errors
/// Which field, and what to write instead.
pub fn secure_url(at: &str, url: &reqwest::Url) -> Result<(), String> {
    let host = url.host_str().unwrap_or_default();
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    match url.scheme() {
        "https" if !host.is_empty() => Ok(()),
        "http" if loopback => Ok(()),
        _ => Err(format!(
            "{at} {:?} must be an https URL (http only on a loopback host)",
            url.as_str()
        )),
    }
}

/// A JSON document at `url`, at most 256 KiB.
///
/// # Errors
/// What failed, naming the URL.
pub async fn get_json(http: &reqwest::Client, url: &str) -> Result<Value, String> {
    let res = http
        .get(url)
        .header("accept", "application/json")
        .send()
        .await
        .map_err(|e| format!("GET {url}: {e}"))?;
    read_json(res, &format!("GET {url}")).await
}

/// The JSON body of a successful answer, at most 256 KiB; `what` names the request in errors.
///
/// # Errors
/// A status that is not success (with the body's `error` and `error_description` when it has
/// them), a larger body, or one that is not JSON.
pub async fn read_json(res: reqwest::Response, what: &str) -> Result<Value, String> {
    let status = res.status();
    if res
        .content_length()
        .is_some_and(|n| n > MAX_DOCUMENT as u64)
    {
        return Err(format!("{what}: larger than {MAX_DOCUMENT} bytes"));
    }
    let body = res.bytes().await.map_err(|e| format!("{what}: {e}"))?;
    if body.len() > MAX_DOCUMENT {
        return Err(format!("{what}: larger than {MAX_DOCUMENT} bytes"));
    }
    let json: Result<Value, _> = serde_json::from_slice(&body);
    if !status.is_success() {
        let said = json
            .ok()
            .map(|v| {
                let mut s = v["error"].as_str().unwrap_or_default().to_owned();
                if let Some(d) = v["error_description"].as_str() {
                    s = format!("{s}: {d}");
                }
                s
            })
            .filter(|s| !s.is_empty())
            .map(|s| format!(" ({s})"))
            .unwrap_or_default();
        return Err(format!("{what}: {status}{said}"));
    }
    json.map_err(|e| format!("{what}: not JSON: {e}"))
}

/// The URL of an issuer's RFC 8414 metadata (`/.well-known/oauth-authorization-server` inserted
/// before the issuer's path).
///
/// # Errors
/// When `issuer` is not a URL.
pub fn oauth_metadata_url(issuer: &str) -> Result<String, String> {
    let url = reqwest::Url::parse(issuer).map_err(|e| e.to_string())?;
    let origin = url.origin().ascii_serialization();
    let path = url.path().trim_end_matches('/');
    Ok(format!(
        "{origin}/.well-known/oauth-authorization-server{path}"
    ))
}

/// The URL of an issuer's OpenID Connect discovery document (`/.well-known/openid-configuration`
/// appended to the issuer).
pub fn openid_configuration_url(issuer: &str) -> String {
    format!(
        "{}/.well-known/openid-configuration",
        issuer.trim_end_matches('/')
    )
}

/// The first metadata document of `candidates` that can be had, which must name `issuer` as its
/// issuer (RFC 8414, 3.3; OpenID Connect Discovery, 4.3): another's would let that other issuer's
/// keys in.
///
/// # Errors
/// Each candidate's failure, or the mismatched issuer.
pub async fn issuer_metadata(
    http: &reqwest::Client,
    issuer: &str,
    candidates: &[String],
) -> Result<Value, String> {
    let mut errors = Vec::new();
    for at in candidates {
        match get_json(http, at).await {
            Ok(meta) => {
                if meta["issuer"].as_str() != Some(issuer) {
                    return Err(format!(
                        "the metadata at {at} names issuer {}, not {issuer:?}",
                        meta["issuer"]
                    ));
                }
                return Ok(meta);
            }
            Err(e) => errors.push(e),
        }
    }
    Err(errors.join("; "))
}

/// One issuer's signing keys, fetched when needed.
pub struct Keys {
    issuer: String,
    http: reqwest::Client,
    /// Where the metadata naming `jwks_uri` is looked for, in order.
    discovery: Vec<String>,
    max_age: Duration,
    refetch_interval: Duration,
    set: tokio::sync::Mutex<KeySet>,
}

#[derive(Default)]
struct KeySet {
    keys: Vec<Jwk>,
    /// The JWKS URL: configured, or read from the metadata.
    jwks_uri: Option<String>,
    fetched: Option<Instant>,
    /// The last fetch an unknown key id asked for.
    refetched: Option<Instant>,
}

impl Keys {
    /// The keys of `issuer`, at `jwks_uri` when known, else at the `jwks_uri` of the first
    /// metadata of `discovery` that can be had; kept for `max_age`, fetched again for an
    /// unknown key id at most once per `refetch_interval`.
    pub fn new(
        issuer: &str,
        http: reqwest::Client,
        jwks_uri: Option<String>,
        discovery: Vec<String>,
        max_age: Duration,
        refetch_interval: Duration,
    ) -> Keys {
        Keys {
            issuer: issuer.to_owned(),
            http,
            discovery,
            max_age,
            refetch_interval,
            set: tokio::sync::Mutex::new(KeySet {
                jwks_uri,
                ..KeySet::default()
            }),
        }
    }

    /// The issuer whose keys these are.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// Whether a key of the issuer signed `jws`. The keys are fetched when there are none, when
    /// they are old (a failure then keeps the old ones), and when none has the key id (at most
    /// once per `refetch_interval`).
    ///
    /// # Errors
    /// [`KeyError::NoSuchKey`] when the issuer has no key for the token,
    /// [`KeyError::Unavailable`] when its keys cannot be fetched and none are held.
    pub async fn verify(&self, jws: &Jws) -> Result<bool, KeyError> {
        let (alg, kid) = (jws.alg.as_str(), jws.kid.as_deref());
        let no_such_key = || {
            KeyError::NoSuchKey(format!(
                "the token's key {kid:?} ({alg}) is not in the issuer's key set"
            ))
        };
        let mut set = self.set.lock().await;
        let stale = set.fetched.is_none_or(|at| at.elapsed() >= self.max_age);
        if stale {
            if let Err(e) = self.fetch(&mut set).await {
                if set.keys.is_empty() {
                    return Err(e);
                }
                // The keys held still check tokens while the issuer is out of reach; the fetch
                // is tried again after `refetch_interval`.
                set.fetched =
                    Instant::now().checked_sub(self.max_age.saturating_sub(self.refetch_interval));
            }
        }
        if !set.keys.iter().any(|k| k.fits(alg, kid)) {
            let may = set
                .refetched
                .is_none_or(|at| at.elapsed() >= self.refetch_interval);
            if stale || !may {
                return Err(no_such_key());
            }
            set.refetched = Some(Instant::now());
            tracing::info!(issuer = %self.issuer, ?kid, "fetching the issuer's keys again for a key id it did not have");
            self.fetch(&mut set).await?;
        }
        let mut found = set.keys.iter().filter(|k| k.fits(alg, kid)).peekable();
        if found.peek().is_none() {
            return Err(no_such_key());
        }
        Ok(found.any(|k| k.verify(alg, &jws.message, &jws.signature)))
    }

    /// Fetches the keys into `set` (the metadata first, for the JWKS URL, unless configured or
    /// known). A failure keeps the keys held before.
    async fn fetch(&self, set: &mut KeySet) -> Result<(), KeyError> {
        let unavailable = |what: String| {
            tracing::error!(issuer = %self.issuer, error = %what, "failed to fetch the issuer's keys");
            KeyError::Unavailable(format!(
                "the issuer's keys could not be fetched ({what}); retry later"
            ))
        };
        if set.jwks_uri.is_none() {
            let meta = issuer_metadata(&self.http, &self.issuer, &self.discovery)
                .await
                .map_err(unavailable)?;
            let uri = meta["jwks_uri"]
                .as_str()
                .ok_or_else(|| unavailable("the issuer's metadata names no jwks_uri".to_owned()))?;
            set.jwks_uri = Some(uri.to_owned());
        }
        let uri = set.jwks_uri.clone().unwrap_or_default();
        let jwks = get_json(&self.http, &uri).await.map_err(unavailable)?;
        let Some(keys) = jwks["keys"].as_array() else {
            return Err(unavailable(format!("{uri} has no \"keys\" array")));
        };
        set.keys = keys.iter().filter_map(Jwk::parse).take(MAX_KEYS).collect();
        set.fetched = Some(Instant::now());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn tokens_of_no_taken_algorithm_are_refused_before_any_key() {
        let enc = |v: Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
        let token = |header: Value| format!("{}.{}.c2ln", enc(header), enc(json!({"sub": "a"})));
        assert!(Jws::decode("abc").unwrap_err().contains("not a JWT"));
        assert!(Jws::decode(&token(json!({"alg": "none"})))
            .unwrap_err()
            .contains("algorithm"));
        assert!(Jws::decode(&token(json!({"alg": "HS256"})))
            .unwrap_err()
            .contains("algorithm"));
        assert!(Jws::decode(&token(json!({"alg": "RS256", "crit": ["x"]})))
            .unwrap_err()
            .contains("critical"));
        let jws = Jws::decode(&token(json!({"alg": "ES256", "kid": "k"}))).unwrap();
        assert_eq!((jws.alg.as_str(), jws.kid.as_deref()), ("ES256", Some("k")));
        assert_eq!(jws.claims["sub"], "a");
    }

    #[test]
    fn jwks_keys_of_other_types_or_uses_are_left_out() {
        let ec = json!({"kty": "EC", "crv": "P-256", "kid": "e",
            "x": "ZPbitrRpHhsm0vDKFiwyHkX3lIBUFxd6uWLtKvsMFMg",
            "y": "etE1WtefjeUDhGE9OO4joutetCQAuF8eoh9-a_WqB4k"});
        let k = Jwk::parse(&ec).unwrap();
        assert!(k.fits("ES256", Some("e")) && k.fits("ES256", None));
        assert!(
            !k.fits("ES256", Some("f")) && !k.fits("RS256", Some("e")) && !k.fits("ES384", None)
        );
        let rsa = json!({"kty": "RSA", "n": "AQAB", "e": "AQAB", "alg": "RS256"});
        let k = Jwk::parse(&rsa).unwrap();
        assert!(k.fits("RS256", None) && !k.fits("PS256", None));
        assert!(Jwk::parse(&json!({"kty": "oct", "k": "AQAB"})).is_none());
        assert!(
            Jwk::parse(&json!({"kty": "RSA", "n": "AQAB", "e": "AQAB", "use": "enc"})).is_none()
        );
        assert!(
            Jwk::parse(&json!({"kty": "EC", "crv": "P-521", "x": "AQAB", "y": "AQAB"})).is_none()
        );
    }

    #[test]
    fn discovery_urls_follow_their_rfcs() {
        assert_eq!(
            oauth_metadata_url("https://auth.example.com/tenant/1").unwrap(),
            "https://auth.example.com/.well-known/oauth-authorization-server/tenant/1"
        );
        assert_eq!(
            openid_configuration_url("https://auth.example.com/tenant/1/"),
            "https://auth.example.com/tenant/1/.well-known/openid-configuration"
        );
    }
}

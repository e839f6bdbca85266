//! OAuth 2.1 at the Streamable HTTP endpoint (MCP 2025-06-18 and later, "Authorization"): the
//! proxy is a resource server. It publishes its Protected Resource Metadata (RFC 9728), names it
//! in every `WWW-Authenticate` challenge, and takes bearer JWTs (RFC 9068 access tokens) signed by
//! one of its authorization servers: the signature against that server's JWKS, the issuer, the
//! audience (this resource, RFC 8707), `exp` and `nbf`, and the required scopes; a claim of the
//! token names its tenant.
//!
//! Signatures are checked with `ring` (already in the tree for sealed records), not a JWT
//! library: the proxy needs one thing of JOSE, checking a JWS in compact form against a JWK, and
//! that is a table of a few algorithms and a page of code, with nothing between the key and the
//! check that could pick `none` or HMAC-with-a-public-key.
//!
//! Keys are fetched from the authorization server's metadata (RFC 8414, else OpenID Connect
//! discovery) or the configured `jwks_uri`, kept for `jwks_max_age`, and fetched again when a
//! token names a key the proxy does not hold (the server rotated its keys), at most once per
//! `jwks_refetch_interval`, so that tokens with made-up key ids cannot make the proxy hammer the
//! authorization server.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use idemgate_core::TenantId;
use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey, VerificationAlgorithm};
use serde_json::{json, Value};

use crate::config::OAuthConfig;

/// The well-known path of Protected Resource Metadata (RFC 9728, 3).
pub(crate) const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";
/// How long a fetch of metadata or keys may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest metadata or key set read.
const MAX_DOCUMENT: usize = 256 * 1024;
/// The most keys kept of one authorization server.
const MAX_KEYS: usize = 64;

/// Why a request's bearer token was not taken.
#[derive(Debug)]
pub(crate) enum Rejection {
    /// No token (the client may not know one is needed): 401 with the metadata's URL.
    Missing,
    /// Not a token of ours, badly signed, expired, for another resource: 401 `invalid_token`.
    Invalid(String),
    /// A good token without a required scope: 403 `insufficient_scope`.
    InsufficientScope(String),
    /// A good token whose tenant claim is mapped to no tenant: 403.
    NoTenant(String),
    /// The authorization server's keys could not be had: 503, nothing said of the token.
    Unavailable(String),
}

/// The resource server: the metadata it publishes and the keys it checks tokens with.
pub(crate) struct OAuth {
    config: OAuthConfig,
    /// The metadata's URL, named in every challenge.
    metadata_url: String,
    /// The path of the metadata under the resource's own path (RFC 9728, 3.1).
    metadata_path: String,
    http: reqwest::Client,
    issuers: Vec<Issuer>,
}

/// One authorization server, and the keys last fetched from it.
struct Issuer {
    issuer: String,
    keys: tokio::sync::Mutex<KeySet>,
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

/// A public key of a JWKS.
struct Jwk {
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

impl Jwk {
    /// A key of a JWKS entry; `None` for one the proxy cannot use (another type or curve, an
    /// encryption key).
    fn parse(v: &Value) -> Option<Jwk> {
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
    fn fits(&self, alg: &str, kid: Option<&str>) -> bool {
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

fn b64(text: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(text.trim_end_matches('='))
        .ok()
}

fn strip_zeros(mut bytes: Vec<u8>) -> Vec<u8> {
    let zeros = bytes.iter().take_while(|b| **b == 0).count();
    bytes.drain(..zeros.min(bytes.len().saturating_sub(1)));
    bytes
}

/// What a checked token says.
#[derive(Debug)]
pub(crate) struct Grant {
    /// The tenant its claim names.
    pub(crate) tenant: TenantId,
}

impl OAuth {
    /// The resource server of a validated `[oauth]` section.
    ///
    /// # Panics
    /// When the HTTP client cannot be built (no TLS roots at all), which no request could
    /// survive either.
    pub(crate) fn new(config: OAuthConfig) -> OAuth {
        let resource = reqwest::Url::parse(config.resource())
            .expect("oauth.resource was checked when the configuration was read");
        let path = resource.path().trim_end_matches('/');
        let metadata_path = format!("{METADATA_PATH}{path}");
        let metadata_url = format!("{}{metadata_path}", resource.origin().ascii_serialization());
        let http = reqwest::Client::builder()
            // The authorization server is configured: a proxy from the environment must not
            // reroute the fetch of the keys that decide who gets in, nor a redirect.
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(FETCH_TIMEOUT)
            .build()
            .expect("failed to build the HTTP client for the authorization server's keys");
        let issuers = config
            .authorization_servers
            .iter()
            .map(|issuer| Issuer {
                issuer: issuer.clone(),
                keys: tokio::sync::Mutex::new(KeySet {
                    jwks_uri: config.jwks_uri.clone(),
                    ..KeySet::default()
                }),
            })
            .collect();
        OAuth {
            config,
            metadata_url,
            metadata_path,
            http,
            issuers,
        }
    }

    /// The paths the metadata is served at: the one under the resource's path (RFC 9728, 3.1),
    /// and the bare well-known path, where clients of a resource at the root look.
    pub(crate) fn metadata_paths(&self) -> Vec<String> {
        let mut paths = vec![self.metadata_path.clone()];
        if self.metadata_path != METADATA_PATH {
            paths.push(METADATA_PATH.to_owned());
        }
        paths
    }

    /// The Protected Resource Metadata document (RFC 9728, 2).
    pub(crate) fn metadata(&self) -> Value {
        let mut doc = json!({
            "resource": self.config.resource(),
            "authorization_servers": self.config.authorization_servers,
            "bearer_methods_supported": ["header"],
            "resource_name": "idemgate MCP proxy",
        });
        if !self.config.scopes().is_empty() {
            doc["scopes_supported"] = json!(self.config.scopes());
        }
        doc
    }

    /// The `WWW-Authenticate` value for `rejection` (RFC 6750, 3; RFC 9728, 5.1): it names the
    /// metadata, and the scopes a token needs.
    pub(crate) fn challenge(&self, rejection: &Rejection) -> String {
        let mut c = format!("Bearer resource_metadata=\"{}\"", self.metadata_url);
        let scope = self.config.required_scopes.join(" ");
        let mut describe = |error: &str, description: &str| {
            c.push_str(&format!(
                ", error=\"{error}\", error_description=\"{}\"",
                quotable(description)
            ));
        };
        match rejection {
            Rejection::Missing | Rejection::Unavailable(_) | Rejection::NoTenant(_) => {}
            Rejection::Invalid(why) => describe("invalid_token", why),
            Rejection::InsufficientScope(why) => describe("insufficient_scope", why),
        }
        if !scope.is_empty() {
            c.push_str(&format!(", scope=\"{scope}\""));
        }
        c
    }

    /// Checks a bearer token: what it grants, or why not.
    pub(crate) async fn check(&self, token: &str) -> Result<Grant, Rejection> {
        let invalid = |why: &str| Rejection::Invalid(why.to_owned());
        let mut parts = token.split('.');
        let (Some(h), Some(p), Some(s), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(invalid(
                "the token is not a JWT (nor a configured static token)",
            ));
        };
        let header: Value = b64(h)
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or_else(|| invalid("the token's header is not base64url JSON"))?;
        let claims: Value = b64(p)
            .and_then(|b| serde_json::from_slice(&b).ok())
            .filter(Value::is_object)
            .ok_or_else(|| invalid("the token's claims are not a base64url JSON object"))?;
        let sig = b64(s).ok_or_else(|| invalid("the token's signature is not base64url"))?;
        let alg = header["alg"].as_str().unwrap_or_default();
        if algorithm(alg).is_none() {
            return Err(Rejection::Invalid(format!(
                "the token's algorithm {alg:?} is not taken (RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384)"
            )));
        }
        if header.get("crit").is_some() {
            return Err(invalid("the token has critical header parameters"));
        }
        let iss = claims["iss"].as_str().unwrap_or_default();
        let Some(issuer) = self.issuers.iter().find(|i| i.issuer == iss) else {
            return Err(Rejection::Invalid(format!(
                "the token's issuer {iss:?} is not one of oauth.authorization_servers"
            )));
        };
        let kid = header["kid"].as_str();
        let message = &token.as_bytes()[..h.len() + 1 + p.len()];
        if !self.signed(issuer, alg, kid, message, &sig).await? {
            return Err(invalid("the token's signature does not verify"));
        }
        self.check_claims(&claims)
    }

    /// Whether a key of `issuer` for `alg` and `kid` signed `message`; the keys are fetched
    /// when there are none, when they are old (a failure then keeps the old ones), and when none
    /// has the key id (at most once per `jwks_refetch_interval`).
    async fn signed(
        &self,
        issuer: &Issuer,
        alg: &str,
        kid: Option<&str>,
        message: &[u8],
        sig: &[u8],
    ) -> Result<bool, Rejection> {
        let mut set = issuer.keys.lock().await;
        let stale = set
            .fetched
            .is_none_or(|at| at.elapsed() >= self.config.jwks_max_age);
        if stale {
            if let Err(e) = self.fetch(issuer, &mut set).await {
                if set.keys.is_empty() {
                    return Err(e);
                }
                // The keys held still check tokens while the authorization server is out of
                // reach; the fetch is tried again after `jwks_refetch_interval`.
                let config = &self.config;
                set.fetched = Instant::now().checked_sub(
                    config
                        .jwks_max_age
                        .saturating_sub(config.jwks_refetch_interval),
                );
            }
        }
        if !set.keys.iter().any(|k| k.fits(alg, kid)) {
            let may = set
                .refetched
                .is_none_or(|at| at.elapsed() >= self.config.jwks_refetch_interval);
            if stale || !may {
                return Err(Rejection::Invalid(format!(
                    "the token's key {kid:?} ({alg}) is not in the authorization server's key set"
                )));
            }
            set.refetched = Some(Instant::now());
            tracing::info!(issuer = %issuer.issuer, ?kid, "fetching the authorization server's keys again for a key id it did not have");
            self.fetch(issuer, &mut set).await?;
        }
        let mut found = set.keys.iter().filter(|k| k.fits(alg, kid)).peekable();
        if found.peek().is_none() {
            return Err(Rejection::Invalid(format!(
                "the token's key {kid:?} ({alg}) is not in the authorization server's key set"
            )));
        }
        Ok(found.any(|k| k.verify(alg, message, sig)))
    }

    /// Fetches `issuer`'s keys into `set` (its metadata first, for the JWKS URL, unless
    /// configured or known). A failure keeps the keys held before.
    async fn fetch(&self, issuer: &Issuer, set: &mut KeySet) -> Result<(), Rejection> {
        let unavailable = |what: String| {
            tracing::error!(issuer = %issuer.issuer, error = %what, "failed to fetch the authorization server's keys");
            Rejection::Unavailable(format!(
                "the authorization server's keys could not be fetched ({what}); retry later"
            ))
        };
        if set.jwks_uri.is_none() {
            set.jwks_uri = Some(self.discover(&issuer.issuer).await.map_err(unavailable)?);
        }
        let uri = set.jwks_uri.clone().unwrap_or_default();
        let jwks = self.get_json(&uri).await.map_err(unavailable)?;
        let Some(keys) = jwks["keys"].as_array() else {
            return Err(unavailable(format!("{uri} has no \"keys\" array")));
        };
        set.keys = keys.iter().filter_map(Jwk::parse).take(MAX_KEYS).collect();
        set.fetched = Some(Instant::now());
        Ok(())
    }

    /// The `jwks_uri` of `issuer`'s metadata: RFC 8414 (`/.well-known/oauth-authorization-server`
    /// inserted before the issuer's path), else OpenID Connect discovery (appended). The
    /// metadata must name the same issuer (RFC 8414, 3.3).
    async fn discover(&self, issuer: &str) -> Result<String, String> {
        let url = reqwest::Url::parse(issuer).map_err(|e| e.to_string())?;
        let origin = url.origin().ascii_serialization();
        let path = url.path().trim_end_matches('/');
        let candidates = [
            format!("{origin}/.well-known/oauth-authorization-server{path}"),
            format!("{origin}{path}/.well-known/openid-configuration"),
        ];
        let mut errors = Vec::new();
        for at in candidates {
            match self.get_json(&at).await {
                Ok(meta) => {
                    if meta["issuer"].as_str() != Some(issuer) {
                        return Err(format!(
                            "the metadata at {at} names issuer {}, not {issuer:?}",
                            meta["issuer"]
                        ));
                    }
                    return meta["jwks_uri"]
                        .as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| format!("the metadata at {at} names no jwks_uri"));
                }
                Err(e) => errors.push(e),
            }
        }
        Err(errors.join("; "))
    }

    async fn get_json(&self, url: &str) -> Result<Value, String> {
        let res = self
            .http
            .get(url)
            .header("accept", "application/json")
            .send()
            .await
            .map_err(|e| format!("GET {url}: {e}"))?;
        if !res.status().is_success() {
            return Err(format!("GET {url}: {}", res.status()));
        }
        if res
            .content_length()
            .is_some_and(|n| n > MAX_DOCUMENT as u64)
        {
            return Err(format!("GET {url}: larger than {MAX_DOCUMENT} bytes"));
        }
        let body = res.bytes().await.map_err(|e| format!("GET {url}: {e}"))?;
        if body.len() > MAX_DOCUMENT {
            return Err(format!("GET {url}: larger than {MAX_DOCUMENT} bytes"));
        }
        serde_json::from_slice(&body).map_err(|e| format!("GET {url}: not JSON: {e}"))
    }

    /// The claims of a token whose signature verified: audience, times, scopes, tenant.
    fn check_claims(&self, claims: &Value) -> Result<Grant, Rejection> {
        let resource = self.config.resource();
        let aud = &claims["aud"];
        let audience = match aud {
            Value::String(a) => a == resource,
            Value::Array(a) => a.iter().any(|a| a.as_str() == Some(resource)),
            _ => false,
        };
        if !audience {
            return Err(Rejection::Invalid(format!(
                "the token's audience {aud} is not this resource ({resource})"
            )));
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        let leeway = self.config.leeway.as_secs_f64();
        let Some(exp) = claims["exp"].as_f64() else {
            return Err(Rejection::Invalid("the token has no exp".to_owned()));
        };
        if now > exp + leeway {
            return Err(Rejection::Invalid("the token has expired".to_owned()));
        }
        if claims["nbf"].as_f64().is_some_and(|nbf| now + leeway < nbf) {
            return Err(Rejection::Invalid(
                "the token is not valid yet (nbf)".to_owned(),
            ));
        }
        let granted: Vec<&str> = match (&claims["scope"], &claims["scp"]) {
            (Value::String(s), _) => s.split_whitespace().collect(),
            (_, Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
            (_, Value::String(s)) => s.split_whitespace().collect(),
            _ => Vec::new(),
        };
        let missing: Vec<&str> = self
            .config
            .required_scopes
            .iter()
            .map(String::as_str)
            .filter(|s| !granted.contains(s))
            .collect();
        if !missing.is_empty() {
            return Err(Rejection::InsufficientScope(format!(
                "the token lacks the scope {}",
                missing.join(" ")
            )));
        }
        let claim = &self.config.tenant_claim;
        let value = match &claims[claim.as_str()] {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            _ => {
                return Err(Rejection::Invalid(format!(
                    "the token has no claim {claim:?}, which names its tenant (oauth.tenant_claim)"
                )))
            }
        };
        let tenant = if self.config.tenants.is_empty() {
            TenantId::new(value.as_str()).map_err(|e| {
                Rejection::NoTenant(format!(
                    "the token's {claim} {value:?} is not a tenant id ({e}); map it in [oauth.tenants]"
                ))
            })?
        } else {
            self.config.tenants.get(&value).cloned().ok_or_else(|| {
                Rejection::NoTenant(format!(
                    "the token's {claim} {value:?} is mapped to no tenant in [oauth.tenants]"
                ))
            })?
        };
        Ok(Grant { tenant })
    }
}

/// `text` as it may stand in a quoted-string of a challenge (RFC 6750, 3: no `"` or `\`, and
/// printable ASCII).
fn quotable(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '"' => '\'',
            '\\' => '/',
            c if c == ' ' || c.is_ascii_graphic() => c,
            _ => '?',
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn oauth(extra: &str) -> OAuth {
        let c = Config::parse(&format!(
            "[oauth]\nresource = \"https://mcp.example.com/tools/mcp\"\nauthorization_servers = [\"https://auth.example.com\"]\nrequired_scopes = [\"mcp:tools\"]\n{extra}"
        ))
        .unwrap();
        OAuth::new(c.oauth.unwrap())
    }

    fn claims(extra: Value) -> Value {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let mut c = json!({
            "iss": "https://auth.example.com", "sub": "alice",
            "aud": ["other", "https://mcp.example.com/tools/mcp"],
            "exp": now + 60, "scope": "mcp:tools",
        });
        c.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        c
    }

    #[test]
    fn the_metadata_lives_under_the_resources_path_and_challenges_name_it() {
        let o = oauth("");
        assert_eq!(
            o.metadata_paths(),
            [
                "/.well-known/oauth-protected-resource/tools/mcp",
                "/.well-known/oauth-protected-resource"
            ]
        );
        assert_eq!(
            o.challenge(&Rejection::Missing),
            "Bearer resource_metadata=\"https://mcp.example.com/.well-known/oauth-protected-resource/tools/mcp\", scope=\"mcp:tools\""
        );
        let c = o.challenge(&Rejection::Invalid("a \"quoted\" \\ reason\n".to_owned()));
        assert!(
            c.contains("error=\"invalid_token\", error_description=\"a 'quoted' / reason?\""),
            "{c}"
        );
        let c = o.challenge(&Rejection::InsufficientScope("x".to_owned()));
        assert!(c.contains("error=\"insufficient_scope\""), "{c}");
        assert_eq!(o.metadata()["scopes_supported"], json!(["mcp:tools"]));
    }

    #[test]
    fn claims_name_the_audience_times_scopes_and_tenant() {
        let o = oauth("");
        assert_eq!(
            o.check_claims(&claims(json!({}))).unwrap().tenant.as_str(),
            "alice"
        );
        let refused = |o: &OAuth, extra: Value| o.check_claims(&claims(extra)).unwrap_err();
        assert!(
            matches!(refused(&o, json!({"aud": "https://mcp.example.com/tools"})), Rejection::Invalid(m) if m.contains("audience"))
        );
        assert!(matches!(
            refused(&o, json!({"aud": null})),
            Rejection::Invalid(_)
        ));
        assert!(
            matches!(refused(&o, json!({"exp": null})), Rejection::Invalid(m) if m.contains("exp"))
        );
        assert!(
            matches!(refused(&o, json!({"exp": 1000})), Rejection::Invalid(m) if m.contains("expired"))
        );
        assert!(
            matches!(refused(&o, json!({"nbf": 1e12})), Rejection::Invalid(m) if m.contains("nbf"))
        );
        assert!(matches!(
            refused(&o, json!({"scope": "mcp:toolsx"})),
            Rejection::InsufficientScope(_)
        ));
        // `scp` as an array is read when there is no `scope`.
        assert!(o
            .check_claims(&claims(json!({"scope": null, "scp": ["mcp:tools"]})))
            .is_ok());
        assert!(matches!(
            refused(&o, json!({"sub": "a b"})),
            Rejection::NoTenant(_)
        ));
        // Within the leeway, an expired token still counts.
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert!(o.check_claims(&claims(json!({"exp": now - 30}))).is_ok());

        let mapped = oauth("tenant_claim = \"org\"\n[oauth.tenants]\nacme = \"team-a\"\n");
        assert_eq!(
            mapped
                .check_claims(&claims(json!({"org": "acme"})))
                .unwrap()
                .tenant
                .as_str(),
            "team-a"
        );
        assert!(
            matches!(refused(&mapped, json!({"org": "other"})), Rejection::NoTenant(m) if m.contains("other"))
        );
        assert!(matches!(refused(&mapped, json!({})), Rejection::Invalid(m) if m.contains("org")));
    }

    #[tokio::test]
    async fn tokens_of_no_trusted_issuer_or_algorithm_are_refused_before_any_fetch() {
        let o = oauth("");
        let enc = |v: Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
        let token = |header: Value, claims: Value| format!("{}.{}.c2ln", enc(header), enc(claims));
        let why = |r: Result<Grant, Rejection>| match r {
            Err(Rejection::Invalid(m)) => m,
            other => panic!("{other:?}"),
        };
        assert!(why(o.check("abc").await).contains("not a JWT"));
        let none = token(json!({"alg": "none"}), claims(json!({})));
        assert!(why(o.check(&none).await).contains("algorithm"));
        let hmac = token(json!({"alg": "HS256"}), claims(json!({})));
        assert!(why(o.check(&hmac).await).contains("algorithm"));
        let other = token(
            json!({"alg": "RS256"}),
            claims(json!({"iss": "https://evil.example"})),
        );
        assert!(why(o.check(&other).await).contains("issuer"));
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
}

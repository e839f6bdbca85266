//! OAuth 2.1 at the Streamable HTTP endpoint (MCP 2025-06-18 and later, "Authorization"): the
//! proxy is a resource server. It publishes its Protected Resource Metadata (RFC 9728), names it
//! in every `WWW-Authenticate` challenge, and takes bearer JWTs (RFC 9068 access tokens) signed by
//! one of its authorization servers: the signature against that server's JWKS, the issuer, the
//! audience (this resource, RFC 8707), `exp` and `nbf`, and the required scopes; a claim of the
//! token names its tenant.
//!
//! The JWS check and the keys are the kit's (`idemgate_kit::jose`, shared with the console's
//! OpenID Connect sign-in): keys are fetched from the authorization server's metadata (RFC 8414,
//! else OpenID Connect discovery) or the configured `jwks_uri`, kept for `jwks_max_age`, and
//! fetched again when a token names a key the proxy does not hold (the server rotated its keys),
//! at most once per `jwks_refetch_interval`, so that tokens with made-up key ids cannot make the
//! proxy hammer the authorization server.

use std::time::{SystemTime, UNIX_EPOCH};

use idemgate_core::TenantId;
use idemgate_kit::jose::{self, Jws, KeyError, Keys};
use serde_json::{json, Value};

use crate::config::OAuthConfig;

/// The well-known path of Protected Resource Metadata (RFC 9728, 3).
pub(crate) const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";

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
    /// The keys of each authorization server.
    issuers: Vec<Keys>,
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
        let http = jose::http_client();
        let issuers = config
            .authorization_servers
            .iter()
            .map(|issuer| {
                // RFC 8414 first, else OpenID Connect discovery.
                let discovery = jose::oauth_metadata_url(issuer)
                    .into_iter()
                    .chain([jose::openid_configuration_url(issuer)])
                    .collect();
                Keys::new(
                    issuer,
                    http.clone(),
                    config.jwks_uri.clone(),
                    discovery,
                    config.jwks_max_age,
                    config.jwks_refetch_interval,
                )
            })
            .collect();
        OAuth {
            config,
            metadata_url,
            metadata_path,
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
        let jws = Jws::decode(token).map_err(|why| {
            Rejection::Invalid(if why.ends_with("not a JWT") {
                format!("{why} (nor a configured static token)")
            } else {
                why
            })
        })?;
        let iss = jws.claims["iss"].as_str().unwrap_or_default();
        let Some(issuer) = self.issuers.iter().find(|i| i.issuer() == iss) else {
            return Err(Rejection::Invalid(format!(
                "the token's issuer {iss:?} is not one of oauth.authorization_servers"
            )));
        };
        match issuer.verify(&jws).await {
            Ok(true) => self.check_claims(&jws.claims),
            Ok(false) => Err(Rejection::Invalid(
                "the token's signature does not verify".to_owned(),
            )),
            Err(KeyError::NoSuchKey(why)) => Err(Rejection::Invalid(why)),
            Err(KeyError::Unavailable(why)) => Err(Rejection::Unavailable(why)),
        }
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
    use base64::Engine as _;

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
}

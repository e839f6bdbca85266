//! OpenID Connect sign-in for operators: the authorization code flow with PKCE (S256), `state`
//! and `nonce`, against one configured issuer (OpenID Connect Core 1.0, 3.1; RFC 7636).
//!
//! `/ui/login/oidc` discovers the issuer (`/.well-known/openid-configuration`), keeps a pending
//! sign-in (nonce and code verifier) under a random `state`, binds that state to the browser in a
//! short-lived cookie, and sends the browser to the authorization endpoint. `/ui/oidc/callback`
//! takes the pending sign-in only when the returned `state` is the one its cookie holds (so
//! another site cannot finish a sign-in the browser never started, nor slip its own code in),
//! exchanges the code with the verifier at the token endpoint, and checks the ID token: its
//! signature against the issuer's JWKS (the kit's `jose`, as the MCP door checks access tokens),
//! `iss`, `aud` (and `azp`), `exp`, `iat` and the `nonce` of this sign-in. Then the claims decide:
//! an allowed user gets a session as the operator named by a claim; anyone else a 403 page saying
//! so.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use idemgate_kit::jose::{self, Jws, KeyError, Keys};
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use crate::session;

/// The path the issuer sends the browser back to; `redirect_url` must name it.
pub const CALLBACK_PATH: &str = "/ui/oidc/callback";
/// How long a started sign-in may take at the issuer.
const PENDING_LIFETIME: Duration = Duration::from_secs(10 * 60);
/// Started sign-ins one process keeps at most; the oldest go first.
const MAX_PENDING: usize = 10_000;
/// Clock difference tolerated between the issuer and this machine.
const LEEWAY: Duration = Duration::from_secs(60);
/// How long the issuer's keys are kept, and how often an unknown key id may fetch them again.
const KEYS_MAX_AGE: Duration = Duration::from_secs(60 * 60);
const KEYS_REFETCH_INTERVAL: Duration = Duration::from_secs(60);
/// The claims an operator's name is read from when `name_claim` is not set, in order.
const NAME_CLAIMS: [&str; 3] = ["email", "preferred_username", "sub"];

/// `[console.oidc]`: operators sign in at an OpenID Connect provider.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OidcConfig {
    /// The issuer, exactly as its ID tokens' `iss` and its discovery document name it
    /// (`https://login.example.com/realms/ops`).
    pub issuer: String,
    /// The console's client id at the issuer.
    pub client_id: String,
    /// The client's secret (sent with HTTP Basic authentication); none for a public client,
    /// which PKCE alone protects.
    #[serde(default)]
    pub client_secret: Option<String>,
    /// Where the issuer sends the browser back: the console's address as browsers reach it, with
    /// the path `/ui/oidc/callback` (`https://idemgate.example.com/ui/oidc/callback`), registered
    /// at the issuer for the client.
    pub redirect_url: String,
    /// The scopes asked for; `openid` is required.
    #[serde(default = "default_scopes")]
    pub scopes: Vec<String>,
    /// The claim that names the operator in the audit log (`console:<name>`). Default: `email`
    /// (when `email_verified` is true), else `preferred_username`, else `sub`.
    #[serde(default)]
    pub name_claim: Option<String>,
    /// Who may sign in, by verified e-mail address (`email`, with `email_verified` true).
    #[serde(default)]
    pub allowed_emails: Vec<String>,
    /// Who may sign in, by subject (`sub`).
    #[serde(default)]
    pub allowed_subjects: Vec<String>,
    /// A claim (`groups`, `roles`) whose value, or one of whose values, must be one of
    /// `allowed_values`.
    #[serde(default)]
    pub allowed_claim: Option<String>,
    /// The values of `allowed_claim` that let a user in (`idemgate-operators`).
    #[serde(default)]
    pub allowed_values: Vec<String>,
}

fn default_scopes() -> Vec<String> {
    ["openid", "email", "profile"].map(str::to_owned).to_vec()
}

impl std::fmt::Debug for OidcConfig {
    // The client secret stays out of logs and panics.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OidcConfig")
            .field("issuer", &self.issuer)
            .field("client_id", &self.client_id)
            .field("client_secret", &self.client_secret.as_ref().map(|_| "…"))
            .field("redirect_url", &self.redirect_url)
            .field("scopes", &self.scopes)
            .field("name_claim", &self.name_claim)
            .field("allowed_emails", &self.allowed_emails)
            .field("allowed_subjects", &self.allowed_subjects)
            .field("allowed_claim", &self.allowed_claim)
            .field("allowed_values", &self.allowed_values)
            .finish()
    }
}

impl OidcConfig {
    /// Checks what serde cannot.
    ///
    /// # Errors
    /// The field at fault (`console.oidc.redirect_url`) and what is wrong with it.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let field = |name: &str| format!("console.oidc.{name}");
        let issuer = reqwest::Url::parse(&self.issuer)
            .map_err(|e| (field("issuer"), format!("not a URL: {e}")))?;
        jose::secure_url("the issuer", &issuer).map_err(|why| (field("issuer"), why))?;
        if issuer.query().is_some() || issuer.fragment().is_some() {
            return Err((
                field("issuer"),
                "an issuer has no query or fragment".to_owned(),
            ));
        }
        if self.client_id.trim().is_empty() {
            return Err((field("client_id"), "required".to_owned()));
        }
        if self.client_secret.as_deref().is_some_and(str::is_empty) {
            return Err((
                field("client_secret"),
                "empty: leave it out for a public client".to_owned(),
            ));
        }
        let redirect = reqwest::Url::parse(&self.redirect_url)
            .map_err(|e| (field("redirect_url"), format!("not a URL: {e}")))?;
        jose::secure_url("the redirect URL", &redirect)
            .map_err(|why| (field("redirect_url"), why))?;
        if redirect.path() != CALLBACK_PATH || redirect.fragment().is_some() {
            return Err((
                field("redirect_url"),
                format!("its path must be {CALLBACK_PATH}, where the console takes the issuer's answer (and no fragment)"),
            ));
        }
        if !self.scopes.iter().any(|s| s == "openid") {
            return Err((field("scopes"), "must include \"openid\"".to_owned()));
        }
        if self.name_claim.as_deref().is_some_and(str::is_empty) {
            return Err((
                field("name_claim"),
                "empty: leave it out for email, then preferred_username, then sub".to_owned(),
            ));
        }
        match (&self.allowed_claim, self.allowed_values.is_empty()) {
            (Some(_), true) => {
                return Err((
                    field("allowed_values"),
                    "allowed_claim needs the values that let a user in".to_owned(),
                ))
            }
            (None, false) => {
                return Err((
                    field("allowed_claim"),
                    "allowed_values needs the claim they are values of (groups, roles…)".to_owned(),
                ))
            }
            _ => {}
        }
        if self.allowed_emails.is_empty()
            && self.allowed_subjects.is_empty()
            && self.allowed_values.is_empty()
        {
            return Err((
                field("allowed_emails"),
                "no one is allowed: list the operators in allowed_emails or allowed_subjects, or give allowed_claim and allowed_values (everyone the issuer knows is not a default)".to_owned(),
            ));
        }
        Ok(())
    }
}

/// What the issuer said about a user the console does not let in.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct NotAllowed {
    /// The user as the page names them (their e-mail address, name or subject).
    pub(crate) who: String,
    /// Why they may not sign in, and what would change that.
    pub(crate) why: String,
}

/// A claim as text: a string, or a number.
fn text_claim(claims: &Value, name: &str) -> Option<String> {
    match &claims[name] {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// The verified e-mail address of the claims: one the issuer says it checked.
fn verified_email(claims: &Value) -> Option<String> {
    (claims["email_verified"] == Value::Bool(true))
        .then(|| text_claim(claims, "email"))
        .flatten()
}

/// Whether the checked claims of an ID token let their user in, and under which operator name.
///
/// # Errors
/// Who they are and why they may not.
pub(crate) fn admit(config: &OidcConfig, claims: &Value) -> Result<String, NotAllowed> {
    let who = verified_email(claims)
        .or_else(|| text_claim(claims, "preferred_username"))
        .or_else(|| text_claim(claims, "sub"))
        .unwrap_or_else(|| "an unnamed user".to_owned());
    let by_email = verified_email(claims).is_some_and(|e| {
        config
            .allowed_emails
            .iter()
            .any(|a| a.eq_ignore_ascii_case(&e))
    });
    let by_subject =
        text_claim(claims, "sub").is_some_and(|s| config.allowed_subjects.contains(&s));
    let by_claim = config.allowed_claim.as_deref().is_some_and(|c| {
        let values: Vec<String> = match &claims[c] {
            Value::Array(items) => items
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect(),
            Value::String(s) => s.split_whitespace().map(str::to_owned).collect(),
            _ => Vec::new(),
        };
        values.iter().any(|v| config.allowed_values.contains(v))
    });
    if !(by_email || by_subject || by_claim) {
        let mut rules = Vec::new();
        if !config.allowed_emails.is_empty() {
            rules.push("a verified e-mail address in allowed_emails".to_owned());
        }
        if !config.allowed_subjects.is_empty() {
            rules.push("a subject (sub) in allowed_subjects".to_owned());
        }
        if let Some(c) = &config.allowed_claim {
            rules.push(format!("a {c} claim with one of allowed_values"));
        }
        return Err(NotAllowed {
            why: format!(
                "{who} is not allowed to use this console: it lets in {}, in [console.oidc] of the gateway's configuration. Ask its administrator to add you.",
                rules.join(", or ")
            ),
            who,
        });
    }
    let name = match &config.name_claim {
        Some(c) => text_claim(claims, c).ok_or_else(|| NotAllowed {
            who: who.clone(),
            why: format!(
                "the identity provider's token for {who} has no {c} claim, which names operators here (console.oidc.name_claim)"
            ),
        })?,
        None => NAME_CLAIMS
            .iter()
            .find_map(|c| match *c {
                "email" => verified_email(claims),
                c => text_claim(claims, c),
            })
            .ok_or_else(|| NotAllowed {
                who: who.clone(),
                why: "the identity provider's token has no email, preferred_username or sub to name you by".to_owned(),
            })?,
    };
    crate::operators::check_name(&name).map_err(|why| NotAllowed {
        who: who.clone(),
        why: format!("{why}: it cannot name you in the audit log"),
    })?;
    Ok(name)
}

/// Checks the claims of an ID token whose signature verified (OpenID Connect Core 1.0,
/// 3.1.3.7): the issuer, the audience (this client, and `azp` when given), the times, and the
/// nonce of this sign-in. `now` in seconds since the epoch.
///
/// # Errors
/// What is wrong, in words for the log and the page.
pub(crate) fn check_id_claims(
    claims: &Value,
    issuer: &str,
    client_id: &str,
    nonce: &str,
    now: f64,
) -> Result<(), String> {
    if claims["iss"].as_str() != Some(issuer) {
        return Err(format!(
            "the ID token's issuer {} is not {issuer:?}",
            claims["iss"]
        ));
    }
    let aud = &claims["aud"];
    let ours = match aud {
        Value::String(a) => a == client_id,
        Value::Array(a) => a.iter().any(|a| a.as_str() == Some(client_id)),
        _ => false,
    };
    if !ours {
        return Err(format!(
            "the ID token's audience {aud} is not this console's client id"
        ));
    }
    if claims
        .get("azp")
        .is_some_and(|azp| azp.as_str() != Some(client_id))
    {
        return Err("the ID token was issued to another client (azp)".to_owned());
    }
    let leeway = LEEWAY.as_secs_f64();
    let Some(exp) = claims["exp"].as_f64() else {
        return Err("the ID token has no exp".to_owned());
    };
    if now > exp + leeway {
        return Err("the ID token has expired".to_owned());
    }
    if claims["iat"].as_f64().is_none() {
        return Err("the ID token has no iat".to_owned());
    }
    if claims["nbf"].as_f64().is_some_and(|nbf| now + leeway < nbf) {
        return Err("the ID token is not valid yet (nbf)".to_owned());
    }
    // The nonce ties the token to this sign-in: a token replayed from another is refused.
    match claims["nonce"].as_str() {
        Some(n) if session::same(n, nonce) => Ok(()),
        Some(_) => Err("the ID token's nonce is not this sign-in's".to_owned()),
        None => Err("the ID token has no nonce".to_owned()),
    }
}

/// The PKCE code challenge of `verifier` (RFC 7636, 4.2: S256).
pub(crate) fn code_challenge(verifier: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()))
}

/// 256 random bits, base64url: a code verifier (43 characters, RFC 7636, 4.1).
fn code_verifier() -> String {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("failed to read randomness from the operating system");
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// A sign-in sent to the issuer and not back yet.
#[derive(Clone, Debug)]
pub(crate) struct Pending {
    pub(crate) nonce: String,
    pub(crate) verifier: String,
    expires: Instant,
}

/// The started sign-ins of one process, by `state`.
#[derive(Debug, Default)]
pub(crate) struct PendingSignIns(Mutex<HashMap<String, Pending>>);

impl PendingSignIns {
    /// A new sign-in: its state, and what the callback will need.
    pub(crate) fn start(&self) -> (String, Pending) {
        let state = session::random_hex();
        let now = Instant::now();
        let pending = Pending {
            nonce: session::random_hex(),
            verifier: code_verifier(),
            expires: now + PENDING_LIFETIME,
        };
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        all.retain(|_, p| p.expires > now);
        if all.len() >= MAX_PENDING {
            if let Some(oldest) = all
                .iter()
                .min_by_key(|(_, p)| p.expires)
                .map(|(k, _)| k.clone())
            {
                all.remove(&oldest);
            }
        }
        all.insert(state.clone(), pending.clone());
        (state, pending)
    }

    /// The sign-in `state` names, once: only when `bound` (the browser's cookie) is that same
    /// state, and it has not expired.
    pub(crate) fn finish(&self, state: &str, bound: Option<&str>) -> Option<Pending> {
        if state.is_empty() || !bound.is_some_and(|b| session::same(b, state)) {
            return None;
        }
        let pending = self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(state)?;
        (pending.expires > Instant::now()).then_some(pending)
    }
}

/// The issuer's endpoints, from its discovery document, and its keys.
struct Provider {
    authorization_endpoint: String,
    token_endpoint: String,
    keys: Keys,
}

/// Why a sign-in failed.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The issuer could not be reached, or answered nonsense: 502, try again later.
    Issuer(String),
    /// The issuer's answer did not check out: 403.
    Refused(String),
}

/// The console's OpenID Connect client.
pub(crate) struct Oidc {
    pub(crate) config: OidcConfig,
    http: reqwest::Client,
    provider: tokio::sync::Mutex<Option<Arc<Provider>>>,
    pub(crate) pending: PendingSignIns,
}

impl Oidc {
    /// The client of a validated configuration.
    pub(crate) fn new(config: OidcConfig) -> Oidc {
        Oidc {
            config,
            http: jose::http_client(),
            provider: tokio::sync::Mutex::new(None),
            pending: PendingSignIns::default(),
        }
    }

    /// The issuer's endpoints and keys, discovered on first use and kept (a failure is tried
    /// again on the next sign-in).
    async fn provider(&self) -> Result<Arc<Provider>, Failure> {
        let mut held = self.provider.lock().await;
        if let Some(p) = held.as_ref() {
            return Ok(p.clone());
        }
        let issuer = &self.config.issuer;
        let meta = jose::issuer_metadata(
            &self.http,
            issuer,
            &[jose::openid_configuration_url(issuer)],
        )
        .await
        .map_err(Failure::Issuer)?;
        let endpoint = |name: &str| -> Result<String, Failure> {
            let url = meta[name].as_str().ok_or_else(|| {
                Failure::Issuer(format!("the issuer's discovery document has no {name}"))
            })?;
            let parsed = reqwest::Url::parse(url)
                .map_err(|e| Failure::Issuer(format!("{name} {url:?}: {e}")))?;
            jose::secure_url(name, &parsed).map_err(Failure::Issuer)?;
            Ok(url.to_owned())
        };
        let provider = Arc::new(Provider {
            authorization_endpoint: endpoint("authorization_endpoint")?,
            token_endpoint: endpoint("token_endpoint")?,
            keys: Keys::new(
                issuer,
                self.http.clone(),
                Some(endpoint("jwks_uri")?),
                Vec::new(),
                KEYS_MAX_AGE,
                KEYS_REFETCH_INTERVAL,
            ),
        });
        *held = Some(provider.clone());
        Ok(provider)
    }

    /// Where to send the browser to start a sign-in, and the state to bind to it.
    pub(crate) async fn start(&self) -> Result<(String, String), Failure> {
        let provider = self.provider().await?;
        let (state, pending) = self.pending.start();
        let c = &self.config;
        let mut url = reqwest::Url::parse(&provider.authorization_endpoint)
            .map_err(|e| Failure::Issuer(e.to_string()))?;
        url.query_pairs_mut()
            .append_pair("response_type", "code")
            .append_pair("client_id", &c.client_id)
            .append_pair("redirect_uri", &c.redirect_url)
            .append_pair("scope", &c.scopes.join(" "))
            .append_pair("state", &state)
            .append_pair("nonce", &pending.nonce)
            .append_pair("code_challenge", &code_challenge(&pending.verifier))
            .append_pair("code_challenge_method", "S256");
        Ok((url.into(), state))
    }

    /// Exchanges the callback's `code` of the sign-in `pending` for an ID token, checks it, and
    /// returns its claims.
    pub(crate) async fn finish(&self, code: &str, pending: &Pending) -> Result<Value, Failure> {
        let provider = self.provider().await?;
        let c = &self.config;
        let enc = idemgate_kit::path_segment;
        let mut body = format!(
            "grant_type=authorization_code&code={}&redirect_uri={}&code_verifier={}",
            enc(code),
            enc(&c.redirect_url),
            enc(&pending.verifier)
        );
        let mut req = self
            .http
            .post(&provider.token_endpoint)
            .header("content-type", "application/x-www-form-urlencoded")
            .header("accept", "application/json");
        match &c.client_secret {
            // client_secret_basic, the default of OpenID Connect (Core 9): both parts
            // form-encoded first (RFC 6749, 2.3.1).
            Some(secret) => req = req.basic_auth(enc(&c.client_id), Some(enc(secret))),
            None => body.push_str(&format!("&client_id={}", enc(&c.client_id))),
        }
        let res = req
            .body(body)
            .send()
            .await
            .map_err(|e| Failure::Issuer(format!("POST {}: {e}", provider.token_endpoint)))?;
        let tokens = jose::read_json(res, &format!("POST {}", provider.token_endpoint))
            .await
            .map_err(Failure::Refused)?;
        let id_token = tokens["id_token"].as_str().ok_or_else(|| {
            Failure::Refused("the token endpoint's answer has no id_token".to_owned())
        })?;
        let jws =
            Jws::decode(id_token).map_err(|why| Failure::Refused(format!("ID token: {why}")))?;
        match provider.keys.verify(&jws).await {
            Ok(true) => {}
            Ok(false) => {
                return Err(Failure::Refused(
                    "the ID token's signature does not verify".to_owned(),
                ))
            }
            Err(KeyError::NoSuchKey(why)) => return Err(Failure::Refused(why)),
            Err(KeyError::Unavailable(why)) => return Err(Failure::Issuer(why)),
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        check_id_claims(&jws.claims, &c.issuer, &c.client_id, &pending.nonce, now)
            .map_err(Failure::Refused)?;
        Ok(jws.claims)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn config(extra: &str) -> OidcConfig {
        toml::from_str(&format!(
            "issuer = \"https://login.example.com\"\nclient_id = \"console\"\nredirect_url = \"https://idemgate.example.com/ui/oidc/callback\"\n{extra}"
        ))
        .unwrap()
    }

    #[test]
    fn the_code_challenge_is_s256_of_the_verifier() {
        // As authlib's create_s256_code_challenge computes it (the provider of the end-to-end
        // test checks verifiers with it): base64url of SHA-256, no padding.
        assert_eq!(
            code_challenge("dBjftJeZ4CVP-mJ92K1qMwkZX8NfHwQ3Yl1RVRUHojk"),
            "R5afIAbku034H8-V0JrqUcxvDPNUSRWtYEpHhKBeRFs"
        );
        let v = code_verifier();
        assert_eq!(v.len(), 43);
        assert!(v
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        assert_ne!(v, code_verifier());
    }

    #[test]
    fn a_sign_in_finishes_once_and_only_in_the_browser_that_started_it() {
        let pending = PendingSignIns::default();
        let (state, started) = pending.start();
        let (other, _) = pending.start();
        assert_ne!(state, other);
        // Without the cookie, or with another sign-in's state in it: nothing.
        assert!(pending.finish(&state, None).is_none());
        assert!(pending.finish(&state, Some(&other)).is_none());
        assert!(pending.finish("", Some("")).is_none());
        let done = pending.finish(&state, Some(&state)).unwrap();
        assert_eq!(done.nonce, started.nonce);
        assert_eq!(done.verifier, started.verifier);
        // A state is taken once: a replayed callback finds nothing.
        assert!(pending.finish(&state, Some(&state)).is_none());
        assert!(pending.finish(&other, Some(&other)).is_some());
    }

    fn id_claims(extra: Value) -> Value {
        let mut c = json!({
            "iss": "https://login.example.com", "aud": "console", "sub": "u-1",
            "exp": 1_000_300, "iat": 1_000_000, "nonce": "n-1",
        });
        c.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        c
    }

    #[test]
    fn the_id_token_must_be_this_issuers_for_this_client_and_this_sign_in() {
        let check = |extra: Value, now: f64| {
            check_id_claims(
                &id_claims(extra),
                "https://login.example.com",
                "console",
                "n-1",
                now,
            )
        };
        assert!(check(json!({}), 1_000_010.0).is_ok());
        assert!(check(json!({"aud": ["other", "console"], "azp": "console"}), 1e6).is_ok());
        let why = |extra: Value, now: f64| check(extra, now).unwrap_err();
        assert!(why(json!({"nonce": "n-2"}), 1e6).contains("nonce"));
        assert!(why(json!({"nonce": null}), 1e6).contains("no nonce"));
        assert!(why(json!({"iss": "https://evil.example"}), 1e6).contains("issuer"));
        assert!(why(json!({"aud": "other"}), 1e6).contains("audience"));
        assert!(why(json!({"aud": ["console"], "azp": "other"}), 1e6).contains("azp"));
        assert!(why(json!({}), 1_000_300.0 + 61.0).contains("expired"));
        // Within the leeway an expired token still counts.
        assert!(check(json!({}), 1_000_300.0 + 59.0).is_ok());
        assert!(why(json!({"exp": null}), 1e6).contains("exp"));
        assert!(why(json!({"iat": null}), 1e6).contains("iat"));
        assert!(why(json!({"nbf": 2e6}), 1e6).contains("nbf"));
    }

    #[test]
    fn claims_decide_who_is_let_in_and_under_which_name() {
        let by_email = config("allowed_emails = [\"Alice@Example.com\"]");
        let alice = json!({"sub": "u-1", "email": "alice@example.com", "email_verified": true,
            "preferred_username": "alice"});
        // The name: the verified e-mail address by default.
        assert_eq!(admit(&by_email, &alice).unwrap(), "alice@example.com");
        // An e-mail address the issuer did not verify lets no one in by it.
        let unverified = json!({"sub": "u-1", "email": "alice@example.com", "email_verified": false,
            "preferred_username": "mallory"});
        let refused = admit(&by_email, &unverified).unwrap_err();
        assert_eq!(refused.who, "mallory");
        assert!(
            refused.why.contains("not allowed") && refused.why.contains("allowed_emails"),
            "{refused:?}"
        );

        let by_sub = config("allowed_subjects = [\"u-2\"]");
        // Without a verified e-mail address: preferred_username, then sub.
        let bob = json!({"sub": "u-2", "preferred_username": "bob"});
        assert_eq!(admit(&by_sub, &bob).unwrap(), "bob");
        assert_eq!(admit(&by_sub, &json!({"sub": "u-2"})).unwrap(), "u-2");
        assert!(admit(&by_sub, &alice).is_err());

        let by_group = config("allowed_claim = \"groups\"\nallowed_values = [\"ops\"]\nname_claim = \"preferred_username\"");
        let carol = json!({"sub": "u-3", "preferred_username": "carol", "groups": ["dev", "ops"]});
        assert_eq!(admit(&by_group, &carol).unwrap(), "carol");
        let dave = json!({"sub": "u-4", "preferred_username": "dave", "groups": ["dev"]});
        let refused = admit(&by_group, &dave).unwrap_err();
        assert!(
            refused.who == "dave" && refused.why.contains("groups"),
            "{refused:?}"
        );
        // A configured name claim the token lacks: refused, saying which.
        let nameless = json!({"sub": "u-5", "groups": ["ops"]});
        assert!(admit(&by_group, &nameless)
            .unwrap_err()
            .why
            .contains("preferred_username"));
        // A name that cannot stand in the audit log is refused, not mangled.
        let spaced = json!({"sub": "u-6", "preferred_username": "eve smith", "groups": ["ops"]});
        assert!(admit(&by_group, &spaced).is_err());
    }

    #[test]
    fn the_configuration_says_what_is_wrong() {
        let ok = config("allowed_emails = [\"a@example.com\"]");
        assert!(ok.validate().is_ok());
        assert_eq!(ok.scopes, ["openid", "email", "profile"]);
        assert!(!format!("{:?}", config("client_secret = \"s3cret\"")).contains("s3cret"));
        let field = |extra: &str| config(extra).validate().unwrap_err().0;
        assert_eq!(field(""), "console.oidc.allowed_emails");
        assert_eq!(
            field("allowed_claim = \"groups\""),
            "console.oidc.allowed_values"
        );
        assert_eq!(
            field("allowed_values = [\"ops\"]"),
            "console.oidc.allowed_claim"
        );
        assert_eq!(
            field("allowed_subjects = [\"x\"]\nscopes = [\"email\"]"),
            "console.oidc.scopes"
        );
        let mut c = ok.clone();
        c.redirect_url = "https://idemgate.example.com/ui/callback".to_owned();
        assert_eq!(c.validate().unwrap_err().0, "console.oidc.redirect_url");
        c = ok.clone();
        c.issuer = "http://login.example.com".to_owned();
        assert_eq!(c.validate().unwrap_err().0, "console.oidc.issuer");
        c.issuer = "http://127.0.0.1:9000".to_owned();
        assert!(c.validate().is_ok());
    }
}

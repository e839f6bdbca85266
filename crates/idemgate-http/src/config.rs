//! The gateway's TOML configuration (see `docs/HTTP.md`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use idemgate::{Mode, ToolKind, ToolPolicy, UnknownPolicy};
use serde::{Deserialize, Deserializer};

pub use idemgate_console::ConsoleConfig;

use crate::error::Error;
use crate::profile::Profile;

/// The whole configuration file.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Listening, store and limits.
    #[serde(default)]
    pub server: ServerConfig,
    /// Who may call, each with a bearer token. At least one is required.
    #[serde(default)]
    pub tenants: Vec<TenantConfig>,
    /// Per-tool policies and upstreams; tools not listed are coordinated writes with the default
    /// policy.
    #[serde(default)]
    pub tools: BTreeMap<String, ToolConfig>,
    /// The web console at `/ui` (docs/OPERATIONS.md): the operator's token, the cookie's
    /// `Secure` flag, or none at all.
    #[serde(default)]
    pub console: ConsoleConfig,
}

/// `[server]`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// The address to listen on.
    pub listen: SocketAddr,
    /// The store URL: `sqlite://PATH`, `postgres://…`, `redis://…` or `memory:`. Required by the
    /// gateway; `idemgate serve` fills in its default SQLite file when it is left out.
    pub store: Option<String>,
    /// The journal directory of outcomes the store has not confirmed. Default: beside the SQLite
    /// file; required for server stores (`idemgate serve` fills one in).
    pub journal: Option<PathBuf>,
    /// Larger request bodies get 413 before they are read.
    pub max_body_bytes: u64,
    /// Time allowed to receive a request head.
    #[serde(deserialize_with = "duration")]
    pub header_timeout: Duration,
    /// Time allowed for a whole request, forwarding included.
    #[serde(deserialize_with = "duration")]
    pub request_timeout: Duration,
    /// Where to append one JSON line per record state transition.
    pub audit_log: Option<PathBuf>,
    /// A PEM file of root certificates trusted for `https://` upstreams besides the system's (an
    /// internal CA).
    pub upstream_ca_file: Option<PathBuf>,
    /// The mode of every tool whose `[tools.NAME]` sets none: `enforce` (the default) or
    /// `observe`, shadow mode, where every call runs and what enforce mode would have done is
    /// recorded (docs/OPERATIONS.md, "Adopting on a live agent: observe mode").
    pub mode: Mode,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            store: None,
            journal: None,
            max_body_bytes: 1024 * 1024,
            header_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(60),
            audit_log: None,
            upstream_ca_file: None,
            mode: Mode::Enforce,
        }
    }
}

pub use idemgate_kit::tenants::TenantConfig;

/// `[tools.NAME]`: the tool's policy, and its upstream if the gateway forwards calls to it.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolConfig {
    /// `write`, `read` or `natural_idempotent` (default `write`).
    pub kind: Option<ToolKind>,
    /// Where `POST /v1/tools/{tool}/call` forwards to (`http://…` or `https://…`); coordinated
    /// only when absent.
    pub upstream: Option<String>,
    /// How long outcomes are kept.
    #[serde(default, deserialize_with = "optional_duration")]
    pub ttl: Option<Duration>,
    /// How long after a call ran its record is remembered, so that a retry past the ttl is
    /// answered 410 "outcome expired" instead of running again (default 30 days; `"0s"`: none).
    #[serde(default, deserialize_with = "optional_duration")]
    pub tombstone: Option<Duration>,
    /// How long a reservation holds without a heartbeat.
    #[serde(default, deserialize_with = "optional_duration")]
    pub lease: Option<Duration>,
    /// How long a duplicate waits for an in-flight first call.
    #[serde(default, deserialize_with = "optional_duration")]
    pub wait: Option<Duration>,
    /// Calls without a key dedupe by (tool, arguments) for this long.
    #[serde(default, deserialize_with = "optional_duration")]
    pub fallback_window: Option<Duration>,
    /// The arguments that name the action (JSON pointers or top-level names): the fallback
    /// window compares only these, so a reworded re-plan within it is the same action.
    #[serde(default)]
    pub identity: Vec<String>,
    /// `block`, `verify` or `retry`.
    pub on_unknown: Option<UnknownPolicy>,
    /// Under `on_unknown = "verify"`, where the gateway asks whether an unknown outcome happened
    /// (`http://…` or `https://…`; see docs/HTTP.md, "Verifying unknown outcomes").
    pub verify_url: Option<String>,
    /// `enforce` or `observe` (shadow mode); default: `[server] mode`.
    pub mode: Option<Mode>,
    /// The idempotency contract the forwarded tool answers by: `idemgate` (the default), `acp`
    /// (the Agentic Commerce Protocol's), `ucp` (the Universal Commerce Protocol's) or `x402`
    /// (x402's payment identifier); docs/HTTP.md, "Commerce protocol profiles".
    pub profile: Option<Profile>,
}

impl ToolConfig {
    /// The engine policy this configures, defaults filled in (`mode` the door's when the tool
    /// sets none).
    pub fn policy(&self, mode: Mode) -> ToolPolicy {
        let d = ToolPolicy::default();
        ToolPolicy {
            kind: self.kind.unwrap_or(d.kind),
            ttl: self.ttl.unwrap_or(d.ttl),
            tombstone: self
                .tombstone
                .unwrap_or_else(|| self.profile.unwrap_or_default().tombstone(d.tombstone)),
            lease: self.lease.unwrap_or(d.lease),
            wait: self.wait.unwrap_or(d.wait),
            fallback_window: self.fallback_window,
            identity: self.identity.clone(),
            on_unknown: self.on_unknown.unwrap_or(d.on_unknown),
            mode: self.mode.unwrap_or(mode),
        }
    }
}

impl Config {
    /// Reads and checks a configuration file.
    ///
    /// # Errors
    /// [`Error::Config`] naming the file and the field at fault.
    pub fn load(path: &Path) -> Result<Self, Error> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::Config {
            origin: path.display().to_string(),
            message: format!("failed to read the file: {e}"),
        })?;
        Self::parse(&text).map_err(|e| match e {
            Error::Config { message, .. } => Error::Config {
                origin: path.display().to_string(),
                message,
            },
            other => other,
        })
    }

    /// Parses and checks configuration text.
    ///
    /// # Errors
    /// [`Error::Config`] naming the field at fault.
    pub fn parse(text: &str) -> Result<Self, Error> {
        let config: Config = toml::from_str(text).map_err(|e| Error::Config {
            origin: "configuration".to_owned(),
            // toml's message names the line, the column and the key.
            message: e.to_string().trim_end().to_owned(),
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Checks what serde cannot: hashes, uniqueness, limits, upstream URLs.
    ///
    /// # Errors
    /// [`Error::Config`] naming the field at fault.
    pub fn validate(&self) -> Result<(), Error> {
        let fail = |field: String, message: String| {
            Err(Error::Config {
                origin: "configuration".to_owned(),
                message: format!("{field}: {message}"),
            })
        };
        if self.tenants.is_empty() {
            return fail(
                "tenants".to_owned(),
                "at least one [[tenants]] entry is required: the gateway never serves without authentication".to_owned(),
            );
        }
        if let Err((field, message)) = idemgate_kit::tenants::validate(&self.tenants) {
            return fail(field, message);
        }
        let tenant_hashes: Vec<&str> = self
            .tenants
            .iter()
            .map(|t| t.token_sha256.as_str())
            .collect();
        if let Err((field, message)) = self.console.validate(&tenant_hashes) {
            return fail(field, message);
        }
        if self.server.max_body_bytes == 0 {
            return fail(
                "server.max_body_bytes".to_owned(),
                "expected a positive number".to_owned(),
            );
        }
        for (field, d) in [
            ("server.header_timeout", self.server.header_timeout),
            ("server.request_timeout", self.server.request_timeout),
        ] {
            if d.is_zero() {
                return fail(field.to_owned(), "expected a positive duration".to_owned());
            }
        }
        for (name, tool) in &self.tools {
            if let Err(e) = idemgate::ToolName::new(name.as_str()) {
                return fail(format!("tools.{name}"), e.to_string());
            }
            if let Some(up) = &tool.upstream {
                if let Err(e) = http_url(up) {
                    return fail(format!("tools.{name}.upstream"), e);
                }
            }
            let p = tool.policy(self.server.mode);
            match (&tool.verify_url, p.on_unknown) {
                (None, UnknownPolicy::Verify) => {
                    return fail(
                        format!("tools.{name}.verify_url"),
                        format!(
                            "tool {name:?} has on_unknown = \"verify\" but no verify_url to ask"
                        ),
                    )
                }
                (Some(_), policy) if policy != UnknownPolicy::Verify => {
                    return fail(
                        format!("tools.{name}.verify_url"),
                        format!(
                        "tool {name:?} has a verify_url, which only on_unknown = \"verify\" uses"
                    ),
                    )
                }
                (Some(url), _) => {
                    if let Err(e) = http_url(url) {
                        return fail(format!("tools.{name}.verify_url"), e);
                    }
                }
                (None, _) => {}
            }
            if p.lease.is_zero() {
                return fail(
                    format!("tools.{name}.lease"),
                    "expected a positive duration".to_owned(),
                );
            }
            if let Some(profile) = tool.profile.filter(|p| *p != Profile::Idemgate) {
                let name_of = profile.name();
                if tool.upstream.is_none() {
                    return fail(
                        format!("tools.{name}.profile"),
                        format!(
                            "profile \"{name_of}\" is the wire of a forwarded tool: set its upstream"
                        ),
                    );
                }
                if !profile.allows_kind(p.kind) {
                    return fail(
                        format!("tools.{name}.kind"),
                        format!("profile \"{name_of}\" is the contract of a write (a key required, its answers kept): a tool of kind \"{}\" would drop it", p.kind),
                    );
                }
                if profile == Profile::X402 && p.on_unknown == UnknownPolicy::Retry {
                    return fail(
                        format!("tools.{name}.on_unknown"),
                        "profile \"x402\" cannot retry an unknown outcome: the retry would send the signed payment again".to_owned(),
                    );
                }
                if p.fallback_window.is_some() && profile.keys_every_request() {
                    return fail(
                        format!("tools.{name}.fallback_window"),
                        format!("profile \"{name_of}\" names every request's action by its key, so a call without one is refused, never joined by a window"),
                    );
                }
                if let Some(min) = profile.min_ttl().filter(|min| p.ttl < *min) {
                    return fail(
                        format!("tools.{name}.ttl"),
                        format!(
                            "profile \"{name_of}\" keeps a key's response at least {}h, not {}",
                            min.as_secs() / 3600,
                            humantime::format_duration(p.ttl)
                        ),
                    );
                }
            }
        }
        self.server.upstream_roots()?;
        Ok(())
    }

    /// The policy of `tool` ([`Config::default_policy`] for tools not listed).
    pub fn policy(&self, tool: &str) -> ToolPolicy {
        self.tools
            .get(tool)
            .map_or_else(|| self.default_policy(), |t| t.policy(self.server.mode))
    }

    /// The policy of the tools not listed: the default write policy, in the door's mode.
    pub fn default_policy(&self) -> ToolPolicy {
        ToolPolicy {
            mode: self.server.mode,
            ..ToolPolicy::default()
        }
    }
}

impl ServerConfig {
    /// The certificates of `upstream_ca_file` (none when it is not set).
    ///
    /// # Errors
    /// [`Error::Config`] naming `server.upstream_ca_file` when the file cannot be read or holds
    /// no PEM certificate.
    pub(crate) fn upstream_roots(&self) -> Result<Vec<reqwest::Certificate>, Error> {
        let Some(path) = &self.upstream_ca_file else {
            return Ok(Vec::new());
        };
        let fail = |message: String| Error::Config {
            origin: "configuration".to_owned(),
            message: format!("server.upstream_ca_file: {message}"),
        };
        let pem = std::fs::read(path)
            .map_err(|e| fail(format!("failed to read {}: {e}", path.display())))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
            fail(format!(
                "failed to read PEM certificates from {}: {e}",
                path.display()
            ))
        })?;
        if certs.is_empty() {
            return Err(fail(format!(
                "{} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
                path.display()
            )));
        }
        Ok(certs)
    }
}

/// Checks that `url` is an absolute `http://` or `https://` URL with a host.
fn http_url(url: &str) -> Result<(), String> {
    match reqwest::Url::parse(url) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.has_host() => Ok(()),
        Ok(u) => Err(format!(
            "expected an http:// or https:// URL, found the scheme {:?} in {url:?}",
            u.scheme()
        )),
        Err(e) => Err(format!(
            "expected an http:// or https:// URL, found {url:?} ({e})"
        )),
    }
}

fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    humantime::parse_duration(&s).map_err(|e| {
        serde::de::Error::custom(format!(
            "failed to read duration {s:?}: {e} (write it like \"30s\", \"500ms\" or \"24h\")"
        ))
    })
}

fn optional_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    duration(d).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASH: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    #[test]
    fn the_documented_example_parses() {
        let text = format!(
            r#"
[server]
listen = "127.0.0.1:8080"
store = "sqlite://./idemgate.db"
journal = "./idemgate.db.journal"
max_body_bytes = 1048576
header_timeout = "5s"
request_timeout = "60s"
audit_log = "./audit.jsonl"

[[tenants]]
id = "acme"
token_sha256 = "{HASH}"
rate_limit_per_second = 200
max_live_keys = 10000

[tools.charge]
kind = "write"
upstream = "http://127.0.0.1:9000/charge"
ttl = "24h"
lease = "30s"
wait = "5s"
fallback_window = "10s"
on_unknown = "block"

[tools.create_ticket]
ttl = "1h"
"#
        );
        let c = Config::parse(&text).unwrap();
        assert_eq!(c.server.request_timeout, Duration::from_secs(60));
        assert_eq!(c.tenants[0].rate_limit_per_second, Some(200.0));
        assert_eq!(
            c.policy("charge").fallback_window,
            Some(Duration::from_secs(10))
        );
        assert_eq!(c.policy("create_ticket").ttl, Duration::from_secs(3600));
        assert_eq!(c.policy("anything").kind, ToolKind::Write);
    }

    #[test]
    fn the_console_section_is_checked() {
        let tenant = format!("[[tenants]]\nid = \"a\"\ntoken_sha256 = \"{HASH}\"\n");
        let c = Config::parse(&tenant).unwrap();
        assert_eq!(c.console, ConsoleConfig::default());
        let other = "0".repeat(64);
        let c = Config::parse(&format!(
            "{tenant}[console]\noperator_token_sha256 = \"{other}\"\nsecure_cookie = true\n"
        ))
        .unwrap();
        assert!(c.console.secure_cookie);
        let err = |text: &str| Config::parse(text).unwrap_err().to_string();
        let e = err(&format!(
            "{tenant}[console]\noperator_token_sha256 = \"abc\"\n"
        ));
        assert!(e.contains("console.operator_token_sha256"), "{e}");
        // The operator's token must not be a tenant's: the console could not tell who signed in.
        let e = err(&format!(
            "{tenant}[console]\noperator_token_sha256 = \"{HASH}\"\n"
        ));
        assert!(e.contains("also a tenant's"), "{e}");
        let e = err(&format!("{tenant}[console]\nenabled = true\n"));
        assert!(e.contains("enabled"), "{e}");
    }

    #[test]
    fn the_oidc_section_is_checked_at_start() {
        let tenant = format!("[[tenants]]\nid = \"a\"\ntoken_sha256 = \"{HASH}\"\n");
        let oidc = "[console.oidc]\nissuer = \"https://login.example.com\"\nclient_id = \"console\"\nredirect_url = \"https://idemgate.example.com/ui/oidc/callback\"\n";
        let c = Config::parse(&format!(
            "{tenant}{oidc}allowed_emails = [\"alice@example.com\"]\n"
        ))
        .unwrap();
        assert_eq!(c.console.oidc.unwrap().client_id, "console");
        // Nobody allowed is a mistake, said at start rather than at every sign-in.
        let e = Config::parse(&format!("{tenant}{oidc}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("console.oidc.allowed_emails"), "{e}");
        let e = Config::parse(&format!(
            "{tenant}{oidc}allowed_subjects = [\"x\"]\nclient_sercet = \"s\"\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("client_sercet"), "{e}");
    }

    #[test]
    fn operators_have_names_and_tokens_of_their_own() {
        let tenant = format!("[[tenants]]\nid = \"a\"\ntoken_sha256 = \"{HASH}\"\n");
        let (one, two) = ("1".repeat(64), "2".repeat(64));
        let c = Config::parse(&format!(
            "{tenant}[console]\noperator_token_sha256 = \"{one}\"\n[[console.operators]]\nname = \"alice\"\ntoken_sha256 = \"{two}\"\n"
        ))
        .unwrap();
        let names: Vec<String> = c
            .console
            .token_operators()
            .into_iter()
            .map(|o| o.name)
            .collect();
        assert_eq!(names, ["alice", "operator"]);
        let err = |text: &str| Config::parse(text).unwrap_err().to_string();
        let e = err(&format!(
            "{tenant}[[console.operators]]\nname = \"alice\"\ntoken_sha256 = \"{HASH}\"\n"
        ));
        assert!(
            e.contains("console.operators[0].token_sha256") && e.contains("also a tenant's"),
            "{e}"
        );
        let e = err(&format!(
            "{tenant}[console]\noperator_token_sha256 = \"{one}\"\n[[console.operators]]\nname = \"bob\"\ntoken_sha256 = \"{one}\"\n"
        ));
        assert!(e.contains("share one token"), "{e}");
        let e = err(&format!(
            "{tenant}[console]\noperator_token_sha256 = \"{one}\"\n[[console.operators]]\nname = \"operator\"\ntoken_sha256 = \"{two}\"\n"
        ));
        assert!(
            e.contains("console.operators") && e.contains("rename"),
            "{e}"
        );
        let e = err(&format!(
            "{tenant}[[console.operators]]\nname = \"alice smith\"\ntoken_sha256 = \"{two}\"\n"
        ));
        assert!(e.contains("console.operators[0].name"), "{e}");
        let e = err(&format!(
            "{tenant}[[console.operators]]\nname = \"alice\"\ntoken = \"{two}\"\n"
        ));
        assert!(e.contains("token"), "{e}");
    }

    #[test]
    fn errors_name_the_field() {
        let tenant = format!("[[tenants]]\nid = \"a\"\ntoken_sha256 = \"{HASH}\"\n");
        let err = |text: &str| Config::parse(text).unwrap_err().to_string();
        let e = err(&format!("{tenant}[tools.x]\nttl = \"soon\"\n"));
        assert!(e.contains("ttl") && e.contains("soon"), "{e}");
        let e = err(&format!("{tenant}[tools.x]\ntll = \"1h\"\n"));
        assert!(e.contains("tll"), "{e}");
        let e = err("[server]\nlisten = \"127.0.0.1:1\"\n");
        assert!(e.contains("tenants"), "{e}");
        let e = err("[[tenants]]\nid = \"a\"\ntoken_sha256 = \"abc\"\n");
        assert!(e.contains("tenants[0].token_sha256"), "{e}");
        // https:// is forwarded since upstreams may use TLS; other schemes are not.
        let e = err(&format!(
            "{tenant}[tools.x]\nupstream = \"ftp://example.invalid\"\n"
        ));
        assert!(e.contains("tools.x.upstream"), "{e}");
        assert!(e.contains("\"ftp\""), "{e}");
        let e = err(&format!(
            "{tenant}[tools.x]\nupstream = \"example.invalid/x\"\n"
        ));
        assert!(e.contains("tools.x.upstream"), "{e}");
        for ok in ["http://127.0.0.1:9000/x", "https://example.invalid/charge"] {
            Config::parse(&format!("{tenant}[tools.x]\nupstream = \"{ok}\"\n")).unwrap();
        }
        let e = err(&format!(
            "{tenant}[server]\nupstream_ca_file = \"/nonexistent/ca.pem\"\n"
        ));
        assert!(
            e.contains("server.upstream_ca_file") && e.contains("/nonexistent/ca.pem"),
            "{e}"
        );
        let e = err(&format!("{tenant}[tools.x]\non_unknown = \"verify\"\n"));
        assert!(
            e.contains("tools.x.verify_url") && e.contains("\"x\""),
            "{e}"
        );
        let e = err(&format!(
            "{tenant}[tools.x]\non_unknown = \"verify\"\nverify_url = \"file:///etc/x\"\n"
        ));
        assert!(
            e.contains("tools.x.verify_url") && e.contains("\"file\""),
            "{e}"
        );
        let e = err(&format!(
            "{tenant}[tools.x]\nverify_url = \"http://127.0.0.1:1/v\"\n"
        ));
        assert!(e.contains("tools.x.verify_url"), "{e}");
        Config::parse(&format!(
            "{tenant}[tools.x]\non_unknown = \"verify\"\nverify_url = \"https://127.0.0.1:1/v\"\n"
        ))
        .unwrap();
        let not_pem = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(not_pem.path(), "not a certificate\n").unwrap();
        let e = err(&format!(
            "{tenant}[server]\nupstream_ca_file = \"{}\"\n",
            not_pem.path().display()
        ));
        assert!(
            e.contains("server.upstream_ca_file") && e.contains("no PEM certificate"),
            "{e}"
        );
        let e = err(&format!("{tenant}[server]\nheader_timeout = \"0s\"\n"));
        assert!(e.contains("server.header_timeout"), "{e}");
    }
}

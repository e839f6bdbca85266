//! The proxy's TOML configuration (docs/MCP.md): who the server is, whether its annotations are
//! trusted, where records live, and per-tool policies in the gateway's vocabulary.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use idemgate_core::{Fingerprint, Mode, TenantId, ToolName, ToolPolicy};

pub use crate::gate::commerce::Profile;
use idemgate_kit::tenants::TenantConfig;
use serde::Deserialize;

use crate::error::Error;

/// Where a call's idempotency key may come from, in the order they are looked at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeySource {
    /// `params._meta["dev.idemgate/idempotency-key"]`.
    Meta,
    /// A tool argument `idempotency_key` or `idempotencyKey`.
    Argument,
    /// `params.idempotencyKey` of `tools/call`, where the MCP proposal SEP-3182 (Request
    /// Idempotency) puts it.
    Params,
}

/// The re-emission window `on_missing_key = "window"` gives a tool that sets no
/// `fallback_window` of its own: long enough for a model to re-emit a call it was unsure of
/// after a timeout or an error (seconds to a minute), short enough that a later identical call
/// is a new action.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(60);

/// The configuration of one proxied server.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// The server's name in record names (`<server>/<tool>`). Default: derived from the command.
    pub server_name: Option<String>,
    /// Whether the server's `readOnlyHint` and `idempotentHint` annotations are believed. An
    /// untrusted server's tools are all writes unless `[tools.NAME]` says otherwise.
    pub trusted: bool,
    /// The tenant records belong to. Default: `--tenant`, else "local".
    pub tenant: Option<String>,
    /// The store URL. Default: `--store`, else the default SQLite file every command uses.
    pub store: Option<String>,
    /// The journal directory. Default: `--journal`, else beside the store.
    pub journal: Option<PathBuf>,
    /// Where to append the audit log (JSON lines); none when unset.
    pub audit_log: Option<PathBuf>,
    /// Whether a replayed result gets one more text block saying the action was not repeated.
    pub replay_notice: bool,
    /// Whether a client's `notifications/cancelled` for a write in flight reaches the server (by
    /// default it does not: the write runs to its end and its outcome is stored for the retry).
    pub forward_cancel: bool,
    /// How long a forwarded call may go unanswered before its outcome counts as unknown.
    #[serde(with = "duration")]
    pub call_timeout: Duration,
    /// Where keys come from, in order.
    pub key_sources: Vec<KeySource>,
    /// The mode of every tool whose policy sets none (`[default]` and each `[tools.NAME]`):
    /// `enforce` (the default), or `observe`, shadow mode: every call runs, and what enforce
    /// mode would have done is recorded (docs/OPERATIONS.md, "Adopting on a live agent"). Spread
    /// into the policies when the file is read ([`Config::parse`]): a `Config` built in code
    /// sets each policy's `mode` itself.
    pub mode: Mode,
    /// The commerce protocol whose MCP binding the server speaks (`acp`, `ucp` or `x402`):
    /// where its calls carry their keys, and its words for the refusals it defines
    /// (docs/MCP.md, "Commerce protocol bindings"). None by default.
    pub profile: Option<Profile>,
    /// The policy of tools not named in `tools` (its kind yields to trusted annotations).
    pub default: ToolPolicy,
    /// Per-tool policies by the server's tool name; a table is the tool's whole policy.
    pub tools: BTreeMap<String, ToolPolicy>,
    /// Who may call over Streamable HTTP (`--listen`), each with a bearer token, as the HTTP
    /// gateway's `[[tenants]]`. None: no authentication, loopback only, tenant `tenant`.
    pub tenants: Vec<TenantConfig>,
    /// The Streamable HTTP transport (`--listen`).
    pub http: HttpConfig,
    /// OAuth 2.1 at the Streamable HTTP endpoint (`--listen`): bearer JWTs of an authorization
    /// server, mapped to tenants, beside the static tokens of `tenants`. None: static tokens only.
    pub oauth: Option<OAuthConfig>,
}

/// `[oauth]`: the proxy as an OAuth 2.1 resource server (MCP authorization, 2025-06-18 and
/// later): its Protected Resource Metadata (RFC 9728), and the bearer JWTs it takes, checked
/// against the authorization servers' JWKS. `docs/OPERATIONS.md`, "OAuth at the MCP HTTP door".
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OAuthConfig {
    /// This endpoint's URL as clients reach it (`https://mcp.example.com/mcp`): the resource
    /// identifier of the metadata, and the audience every token must name. Required.
    pub resource: Option<String>,
    /// The issuers whose tokens are taken (each an authorization server's `issuer`, whose
    /// metadata names its JWKS). Required, at least one.
    #[serde(default)]
    pub authorization_servers: Vec<String>,
    /// The JWKS URL, instead of the one the authorization server's metadata names (only with
    /// one authorization server).
    pub jwks_uri: Option<String>,
    /// The scopes every token must carry (`scope`, space-separated, or `scp`); a token without
    /// one of them gets 403 `insufficient_scope`.
    #[serde(default)]
    pub required_scopes: Vec<String>,
    /// The scopes the metadata lists (`scopes_supported`). Default: `required_scopes`.
    #[serde(default)]
    pub scopes_supported: Vec<String>,
    /// The claim that names a token's tenant. Default: `sub`.
    #[serde(default = "default_tenant_claim")]
    pub tenant_claim: String,
    /// The claim's values and the tenant each is mapped to; a value not listed is refused (403).
    /// Empty: the claim's value is the tenant id itself.
    #[serde(default)]
    pub tenants: BTreeMap<String, TenantId>,
    /// How far `exp` and `nbf` may be off the proxy's clock.
    #[serde(default = "default_leeway", with = "duration")]
    pub leeway: Duration,
    /// How long fetched keys are used before they are fetched again.
    #[serde(default = "default_jwks_max_age", with = "duration")]
    pub jwks_max_age: Duration,
    /// A token signed by a key the proxy does not hold fetches the keys again (the authorization
    /// server rotated them), at most once in this long per authorization server.
    #[serde(default = "default_jwks_refetch", with = "duration")]
    pub jwks_refetch_interval: Duration,
}

fn default_tenant_claim() -> String {
    "sub".to_owned()
}

fn default_leeway() -> Duration {
    Duration::from_secs(60)
}

fn default_jwks_max_age() -> Duration {
    Duration::from_secs(3600)
}

fn default_jwks_refetch() -> Duration {
    Duration::from_secs(10)
}

/// The longest clock leeway taken: more lets expired tokens in.
const MAX_LEEWAY: Duration = Duration::from_secs(300);

impl OAuthConfig {
    /// The resource identifier (checked when the configuration was read).
    pub fn resource(&self) -> &str {
        self.resource.as_deref().unwrap_or_default()
    }

    /// The scopes the metadata lists.
    pub fn scopes(&self) -> &[String] {
        if self.scopes_supported.is_empty() {
            &self.required_scopes
        } else {
            &self.scopes_supported
        }
    }

    /// Checks what serde cannot, naming the field at fault and what to write there.
    fn validate(&self) -> Result<(), String> {
        let Some(resource) = self.resource.as_deref() else {
            return Err("oauth.resource is required: this endpoint's URL as clients reach it (\"https://mcp.example.com/mcp\"), the audience every token must name".to_owned());
        };
        let url = reqwest::Url::parse(resource)
            .map_err(|e| format!("oauth.resource {resource:?} is not a URL: {e}"))?;
        secure_url("oauth.resource", &url)?;
        if url.fragment().is_some() {
            return Err(format!(
                "oauth.resource {resource:?} may not have a fragment (RFC 8707)"
            ));
        }
        if self.authorization_servers.is_empty() {
            return Err("oauth.authorization_servers is required: the issuer URL of at least one authorization server".to_owned());
        }
        for (i, issuer) in self.authorization_servers.iter().enumerate() {
            let at = format!("oauth.authorization_servers[{i}]");
            let url = reqwest::Url::parse(issuer)
                .map_err(|e| format!("{at} {issuer:?} is not a URL: {e}"))?;
            secure_url(&at, &url)?;
            if url.query().is_some() || url.fragment().is_some() {
                return Err(format!(
                    "{at} {issuer:?}: an issuer has no query or fragment (RFC 8414)"
                ));
            }
            if self.authorization_servers[..i].contains(issuer) {
                return Err(format!("{at} {issuer:?} is listed twice"));
            }
        }
        if let Some(jwks) = &self.jwks_uri {
            if self.authorization_servers.len() > 1 {
                return Err("oauth.jwks_uri names the keys of one authorization server: with several, each one's metadata names its own".to_owned());
            }
            let url = reqwest::Url::parse(jwks)
                .map_err(|e| format!("oauth.jwks_uri {jwks:?} is not a URL: {e}"))?;
            secure_url("oauth.jwks_uri", &url)?;
        }
        if self.tenant_claim.is_empty() {
            return Err("oauth.tenant_claim may not be empty".to_owned());
        }
        if let Some(s) = self
            .required_scopes
            .iter()
            .chain(&self.scopes_supported)
            .find(|s| {
                s.is_empty() || s.contains(|c: char| c.is_whitespace() || c == '"' || c == '\\')
            })
        {
            return Err(format!(
                "oauth scope {s:?}: a scope is a non-empty word without spaces, quotes or backslashes"
            ));
        }
        if !self.scopes_supported.is_empty() {
            if let Some(s) = self
                .required_scopes
                .iter()
                .find(|s| !self.scopes_supported.contains(s))
            {
                return Err(format!(
                    "oauth.required_scopes has {s:?}, which oauth.scopes_supported does not list"
                ));
            }
        }
        if self.leeway > MAX_LEEWAY {
            return Err(format!(
                "oauth.leeway may be at most {}",
                humantime::format_duration(MAX_LEEWAY)
            ));
        }
        if self.jwks_max_age.is_zero() {
            return Err("oauth.jwks_max_age must be positive".to_owned());
        }
        Ok(())
    }
}

/// An authorization server's URLs are `https`, or `http` on a loopback host (OAuth 2.1, 1.5).
fn secure_url(at: &str, url: &reqwest::Url) -> Result<(), String> {
    idemgate_kit::jose::secure_url(at, url)
}

/// `[http]`: the Streamable HTTP transport.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// Values of the `Origin` header that are let in (`"http://localhost:6274"`); a request with
    /// any other `Origin` gets 403. Requests without `Origin` (not from a browser) are let in.
    pub allowed_origins: Vec<String>,
    /// Sessions (each with its own server process) open at once; more get 503.
    pub max_sessions: usize,
    /// A session without requests for this long is ended (its server is stopped).
    #[serde(with = "duration")]
    pub idle_timeout: Duration,
    /// Larger request bodies get 413.
    pub max_body_bytes: usize,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            allowed_origins: Vec::new(),
            max_sessions: 32,
            idle_timeout: Duration::from_secs(30 * 60),
            max_body_bytes: 4 * 1024 * 1024,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            server_name: None,
            trusted: false,
            tenant: None,
            store: None,
            journal: None,
            audit_log: None,
            replay_notice: true,
            forward_cancel: false,
            call_timeout: Duration::from_secs(600),
            key_sources: vec![KeySource::Meta, KeySource::Params, KeySource::Argument],
            mode: Mode::Enforce,
            profile: None,
            default: ToolPolicy::default(),
            tools: BTreeMap::new(),
            tenants: Vec::new(),
            http: HttpConfig::default(),
            oauth: None,
        }
    }
}

/// Longest server name kept in record names, so that `<server>/<tool>` mostly fits a
/// [`ToolName`] (128 bytes).
const MAX_SERVER_NAME: usize = 40;

/// Programs that start a server named by their next argument.
const LAUNCHERS: &[&str] = &[
    "npx", "bunx", "pnpx", "uvx", "uv", "pipx", "node", "bun", "deno", "python", "python3", "run",
    "exec", "dlx", "pnpm", "yarn", "tool",
];

impl Config {
    /// Reads a TOML file.
    ///
    /// # Errors
    /// [`Error::Config`] when the file cannot be read or is not a valid configuration.
    pub fn load(path: &Path) -> Result<Self, Error> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Config(format!("failed to read {}: {e}", path.display())))?;
        Self::parse(&text).map_err(|e| match e {
            Error::Config(m) => Error::Config(format!("{}: {m}", path.display())),
            other => other,
        })
    }

    /// Reads TOML text.
    ///
    /// # Errors
    /// [`Error::Config`] when it is not a valid configuration.
    pub fn parse(text: &str) -> Result<Self, Error> {
        let mut table: toml::Table =
            toml::from_str(text).map_err(|e| Error::Config(e.to_string()))?;
        desugar_missing_key(&mut table)?;
        spread_mode(&mut table);
        let config: Config = toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| Error::Config(e.to_string()))?;
        if let Some(name) = &config.server_name {
            if sanitize(name) != *name || name.is_empty() {
                return Err(Error::Config(format!(
                    "server_name {name:?} must be 1 to {MAX_SERVER_NAME} of letters, digits, '.', '_' and '-'"
                )));
            }
        }
        if let Err((field, message)) = idemgate_kit::tenants::validate(&config.tenants) {
            return Err(Error::Config(format!("{field}: {message}")));
        }
        if let Some(i) = config
            .tenants
            .iter()
            .position(|t| t.max_live_keys.is_some())
        {
            return Err(Error::Config(format!(
                "tenants[{i}].max_live_keys: not supported by the MCP proxy (only by the HTTP gateway)"
            )));
        }
        if let Some(oauth) = &config.oauth {
            oauth.validate().map_err(Error::Config)?;
        }
        if config.profile == Some(Profile::X402) {
            let retried = std::iter::once(("default".to_owned(), &config.default))
                .chain(config.tools.iter().map(|(n, p)| (format!("tools.{n}"), p)))
                .find(|(_, p)| p.on_unknown == idemgate_core::UnknownPolicy::Retry);
            if let Some((at, _)) = retried {
                return Err(Error::Config(format!(
                    "{at}.on_unknown: profile \"x402\" cannot retry an unknown outcome: the retry would send the signed payment again"
                )));
            }
        }
        if config.http.max_sessions == 0 || config.http.max_body_bytes == 0 {
            return Err(Error::Config(
                "http.max_sessions and http.max_body_bytes must be positive".to_owned(),
            ));
        }
        if config.http.idle_timeout.is_zero() {
            return Err(Error::Config(
                "http.idle_timeout must be positive".to_owned(),
            ));
        }
        Ok(config)
    }

    /// The tenant: the file's, else `fallback`.
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid tenant id.
    pub fn tenant_or(&self, fallback: &str) -> Result<TenantId, Error> {
        let t = self.tenant.as_deref().unwrap_or(fallback);
        TenantId::new(t).map_err(|e| Error::Config(format!("invalid tenant: {e}")))
    }
}

/// `on_missing_key` in `[default]` and `[tools.NAME]`, the proxy's word for what a call without
/// a key gets, in the policy's own terms: `"refuse"` is no `fallback_window` (the call is
/// refused with a text that tells the model what to send), `"window"` a fallback window, the
/// tool's `fallback_window` or [`DEFAULT_WINDOW`], within which an identical call of the same
/// session or conversation is the same action (answered with the stored result and a text
/// that says so). Without it, a `fallback_window` says `"window"`, its absence `"refuse"`.
fn desugar_missing_key(config: &mut toml::Table) -> Result<(), Error> {
    let mut policies: Vec<(String, &mut toml::Table)> = Vec::new();
    for (section, value) in config.iter_mut() {
        match (section.as_str(), value) {
            ("default", toml::Value::Table(d)) => policies.push(("default".to_owned(), d)),
            ("tools", toml::Value::Table(tools)) => {
                for (name, policy) in tools.iter_mut() {
                    if let toml::Value::Table(p) = policy {
                        policies.push((format!("tools.{name}"), p));
                    }
                }
            }
            _ => {}
        }
    }
    for (at, policy) in policies {
        let Some(on_missing) = policy.remove("on_missing_key") else {
            continue;
        };
        match (on_missing.as_str(), policy.contains_key("fallback_window")) {
            (Some("window"), false) => {
                let window = humantime::format_duration(DEFAULT_WINDOW).to_string();
                policy.insert("fallback_window".to_owned(), toml::Value::String(window));
            }
            (Some("window"), true) | (Some("refuse"), false) => {}
            (Some("refuse"), true) => {
                return Err(Error::Config(format!(
                    "{at}: on_missing_key = \"refuse\" and a fallback_window exclude each other"
                )))
            }
            _ => {
                return Err(Error::Config(format!(
                    "{at}.on_missing_key: expected \"refuse\" or \"window\", got {on_missing}"
                )))
            }
        }
    }
    Ok(())
}

/// The top-level `mode`, the door's, into `[default]` and every `[tools.NAME]` that sets no mode
/// of its own (a tool's table is its whole policy, so it would otherwise be `enforce`). A value
/// that is no mode is left for the deserializer to refuse, naming it.
fn spread_mode(config: &mut toml::Table) {
    let Some(mode) = config.get("mode").cloned() else {
        return;
    };
    let default = config
        .entry("default")
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    if let toml::Value::Table(d) = default {
        d.entry("mode").or_insert_with(|| mode.clone());
    }
    if let Some(toml::Value::Table(tools)) = config.get_mut("tools") {
        for (_, policy) in tools.iter_mut() {
            if let toml::Value::Table(p) = policy {
                p.entry("mode").or_insert_with(|| mode.clone());
            }
        }
    }
}

/// The server's name: the configured one, else derived from the command line (the package or
/// script a launcher such as `npx` or `uvx` starts, without scope, version or extension).
pub fn server_name(config: &Config, command: &[String]) -> String {
    if let Some(n) = &config.server_name {
        return n.clone();
    }
    let program = command
        .iter()
        .map(|a| base(a))
        .find(|a| {
            // Windows names programs in any case (`Python.exe`, `NPX.CMD`).
            let program = a.to_ascii_lowercase();
            !a.starts_with('-') && !LAUNCHERS.contains(&program.as_str()) && !a.is_empty()
        })
        .unwrap_or_default();
    let name = sanitize(&program);
    if name.is_empty() {
        "server".to_owned()
    } else {
        name
    }
}

/// The last path segment of `arg` (after a `/`, or a `\` of a Windows path, on every
/// platform: an agent's configuration is often written on another), without a version
/// (`pkg@1.2`) or a script or program extension.
fn base(arg: &str) -> String {
    let last = arg.rsplit(['/', '\\']).next().unwrap_or(arg);
    let last = match last.find('@') {
        Some(at) if at > 0 => &last[..at],
        _ => last,
    };
    let last = [".py", ".js", ".mjs", ".cjs", ".ts", ".exe", ".cmd", ".bat"]
        .iter()
        .find_map(|ext| {
            let cut = last.len().checked_sub(ext.len())?;
            (last.is_char_boundary(cut) && last[cut..].eq_ignore_ascii_case(ext))
                .then(|| &last[..cut])
        })
        .unwrap_or(last);
    last.to_owned()
}

fn sanitize(s: &str) -> String {
    s.chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        .take(MAX_SERVER_NAME)
        .collect()
}

/// The record scope of a server's tool: `<server>/<tool>`, or, for a tool name that does not fit
/// a [`ToolName`] (too long, or characters outside its set), `<server>/sha256-<digest prefix>`.
pub fn record_tool(server: &str, tool: &str) -> ToolName {
    ToolName::new(format!("{server}/{tool}")).unwrap_or_else(|_| {
        let digest = Fingerprint::of_bytes(tool.as_bytes()).to_hex();
        ToolName::new(format!("{server}/sha256-{}", &digest[..32]))
            .expect("a sanitized server name and a hex digest make a tool name")
    })
}

/// Durations as human text ("30s", "10m").
mod duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use idemgate_core::ToolKind;

    use super::*;

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn server_names_come_from_the_package_or_script() {
        let c = Config::default();
        for (cmd, want) in [
            (
                "npx -y @modelcontextprotocol/server-memory",
                "server-memory",
            ),
            (
                "npx @modelcontextprotocol/server-memory@2025.4.25",
                "server-memory",
            ),
            ("uvx mcp-server-git --repository .", "mcp-server-git"),
            ("python3 /opt/tools/billing_server.py", "billing_server"),
            ("/usr/local/bin/my-server --flag", "my-server"),
            // Windows: a backslashed path, launchers with their extension, any case.
            (r"C:\tools\billing-server.exe --port 1", "billing-server"),
            (
                r"NPX.CMD -y @modelcontextprotocol/server-memory",
                "server-memory",
            ),
            (
                r"C:\Python312\python.exe C:\srv\Mail_Server.PY",
                "Mail_Server",
            ),
            ("npx", "server"),
        ] {
            assert_eq!(server_name(&c, &argv(cmd)), want, "{cmd}");
        }
        let named = Config::parse(r#"server_name = "billing""#).unwrap();
        assert_eq!(server_name(&named, &argv("npx x")), "billing");
        assert!(Config::parse(r#"server_name = "a b""#).is_err());
    }

    #[test]
    fn tool_names_fit_or_are_digested() {
        assert_eq!(
            record_tool("mem", "create_entities").as_str(),
            "mem/create_entities"
        );
        let long = "t".repeat(200);
        let scoped = record_tool("mem", &long);
        assert!(scoped.as_str().starts_with("mem/sha256-"), "{scoped}");
        assert_ne!(record_tool("mem", "a b"), record_tool("mem", "a c"));
    }

    #[test]
    fn on_missing_key_says_refuse_or_window_in_the_policys_terms() {
        let c = Config::parse(
            "[default]\non_missing_key = \"window\"\n[tools.a]\non_missing_key = \"window\"\nfallback_window = \"5s\"\n[tools.b]\non_missing_key = \"refuse\"\n",
        )
        .unwrap();
        assert_eq!(c.default.fallback_window, Some(DEFAULT_WINDOW));
        assert_eq!(c.tools["a"].fallback_window, Some(Duration::from_secs(5)));
        assert_eq!(c.tools["b"].fallback_window, None);
        for bad in [
            "[default]\non_missing_key = \"refuse\"\nfallback_window = \"5s\"\n",
            "[tools.x]\non_missing_key = \"sometimes\"\n",
            "[tools.x]\non_missing_key = 1\n",
        ] {
            let e = Config::parse(bad).unwrap_err().to_string();
            assert!(e.contains("on_missing_key"), "{bad}: {e}");
        }
        assert_eq!(
            Config::default().key_sources,
            [KeySource::Meta, KeySource::Params, KeySource::Argument]
        );
    }

    #[test]
    fn per_tool_tables_use_the_policy_vocabulary() {
        let c = Config::parse(
            r#"
            trusted = true
            call_timeout = "30s"
            key_sources = ["argument"]
            [default]
            ttl = "1h"
            [tools.send]
            fallback_window = "30s"
            on_unknown = "retry"
            [tools.search]
            kind = "read"
            "#,
        )
        .unwrap();
        assert_eq!(c.call_timeout, Duration::from_secs(30));
        assert_eq!(c.key_sources, vec![KeySource::Argument]);
        assert_eq!(
            c.policy("send", None).fallback_window,
            Some(Duration::from_secs(30))
        );
        assert_eq!(c.policy("search", None).kind, ToolKind::Read);
        assert_eq!(c.policy("other", None).ttl, Duration::from_secs(3600));
        assert!(Config::parse("[tools.x]\nkind = \"sometimes\"").is_err());
        assert!(Config::parse("replay_notise = false").is_err());
    }

    #[test]
    fn oauth_needs_a_resource_and_an_authorization_server_and_says_what_is_wrong() {
        let ok = "[oauth]\nresource = \"https://mcp.example.com/mcp\"\nauthorization_servers = [\"https://auth.example.com\"]\nrequired_scopes = [\"mcp:tools\"]\n[oauth.tenants]\nalice = \"team-a\"\n";
        let c = Config::parse(ok).unwrap();
        let o = c.oauth.unwrap();
        assert_eq!(o.resource(), "https://mcp.example.com/mcp");
        assert_eq!(o.tenant_claim, "sub");
        assert_eq!(o.scopes(), ["mcp:tools"]);
        assert_eq!(o.tenants["alice"].as_str(), "team-a");
        assert_eq!(o.leeway, Duration::from_secs(60));
        for (bad, says) in [
            ("[oauth]\nauthorization_servers = [\"https://a.example\"]\n", "oauth.resource is required"),
            ("[oauth]\nresource = \"https://m.example/mcp\"\n", "oauth.authorization_servers is required"),
            ("[oauth]\nresource = \"mcp\"\nauthorization_servers = [\"https://a.example\"]\n", "not a URL"),
            ("[oauth]\nresource = \"https://m.example/mcp#x\"\nauthorization_servers = [\"https://a.example\"]\n", "fragment"),
            ("[oauth]\nresource = \"https://m.example/mcp\"\nauthorization_servers = [\"http://a.example\"]\n", "https"),
            ("[oauth]\nresource = \"https://m.example/mcp\"\nauthorization_servers = [\"https://a.example\", \"https://b.example\"]\njwks_uri = \"https://a.example/jwks\"\n", "jwks_uri"),
            ("[oauth]\nresource = \"https://m.example/mcp\"\nauthorization_servers = [\"https://a.example\"]\nrequired_scopes = [\"x\"]\nscopes_supported = [\"y\"]\n", "scopes_supported does not list"),
            ("[oauth]\nresource = \"https://m.example/mcp\"\nauthorization_servers = [\"https://a.example\"]\nleeway = \"1h\"\n", "oauth.leeway"),
            ("[oauth]\nresource = \"https://m.example/mcp\"\nauthorization_servers = [\"https://a.example\"]\naudience = \"x\"\n", "audience"),
            ("[oauth]\nresource = \"https://m.example/mcp\"\nauthorization_servers = [\"https://a.example\"]\n[oauth.tenants]\nalice = \"a b\"\n", "tenant"),
        ] {
            let e = Config::parse(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
        // An authorization server on loopback may be plain http (OAuth 2.1, 1.5).
        assert!(Config::parse("[oauth]\nresource = \"http://127.0.0.1:8765/mcp\"\nauthorization_servers = [\"http://localhost:9000\"]\n").is_ok());
    }
}

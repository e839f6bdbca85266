//! `idemgate serve`: the HTTP gateway, configured by a file or by the environment.

use std::io::Write as _;

use anyhow::{bail, Context as _, Result};
use idemgate_http::{Config, TenantConfig};

use crate::args::{Cli, ServeArgs};

/// Shortest bearer token accepted from the environment: short secrets are guessable.
const MIN_TOKEN_LEN: usize = 16;

/// The token in the environment variable `var`, trimmed, at least [`MIN_TOKEN_LEN`] long; else
/// an error saying to set it (`what` it names, `how` to get one).
pub(crate) fn token_from_env(var: &str, what: &str, how: &str) -> Result<String> {
    let token = match std::env::var(var) {
        Ok(t) if !t.trim().is_empty() => t.trim().to_owned(),
        _ => bail!("failed to find {what}: set {var} to {how}"),
    };
    if token.len() < MIN_TOKEN_LEN {
        bail!("failed to accept the token in {var}: it has {} characters, at least {MIN_TOKEN_LEN} are required (`idemgate token new` makes one)", token.len());
    }
    Ok(token)
}

/// Runs the gateway until SIGTERM or Ctrl-C.
pub(crate) async fn run(cli: &Cli, args: &ServeArgs) -> Result<u8> {
    let _traces = idemgate_http::logging::init()?;
    let mut config = match &args.config {
        Some(_) if cli.tenant.is_some() => bail!(
            "--tenant names the one tenant of a gateway without --config; with a config file, the file's [[tenants]] say who may call"
        ),
        Some(path) => Config::load(path)?,
        None => env_config(args, cli.tenant.as_deref().unwrap_or("default"))?,
    };
    // A file without a store uses the store every other command uses, so `idemgate keys` sees
    // the gateway's records.
    let store = config.server.store.clone().or_else(|| cli.store.clone());
    let (url, journal) = crate::store_and_journal_for(
        store.as_deref(),
        config.server.journal.as_deref().or(cli.journal.as_deref()),
    )?;
    config.server.store = Some(url);
    config.server.journal = Some(journal);
    if config
        .server
        .store
        .as_deref()
        .is_some_and(|s| s.starts_with("memory:"))
    {
        eprintln!("idemgate: warning: store memory: keeps records only while this gateway runs: a restart forgets every key, and no other process sees them");
    }
    let server = match idemgate_http::bind(config).await {
        Ok(server) => server,
        // Nothing ran: the same exit code as a store that fails at reservation.
        Err(e @ idemgate_http::Error::Store(_)) => {
            eprintln!(
                "idemgate: failed to start the gateway: {}",
                crate::error_text(&anyhow::Error::new(e))
            );
            return Ok(crate::exit::STORE_UNAVAILABLE);
        }
        Err(e) => return Err(anyhow::Error::new(e).context("failed to start the gateway")),
    };
    // One plain line on stdout (logs go to stderr as JSON), so scripts can learn the port when
    // they listen on port 0.
    println!("idemgate: listening on http://{}", server.local_addr());
    let _ = std::io::stdout().flush();
    server
        .serve(idemgate_http::shutdown_signal())
        .await
        .context("failed to serve")?;
    Ok(0)
}

/// The configuration without a file: one tenant, "default", whose token is in the environment.
fn env_config(args: &ServeArgs, tenant: &str) -> Result<Config> {
    let token = token_from_env(
        &args.token_env,
        "a tenant",
        "a bearer token (`idemgate token new` makes one) or pass --config PATH; the gateway never serves without authentication",
    )?;
    let mut config = Config::default();
    config.server.listen = args.listen;
    config.tenants.push(TenantConfig {
        id: idemgate::TenantId::new(tenant).context("invalid --tenant")?,
        token_sha256: idemgate_http::token_sha256(&token),
        rate_limit_per_second: None,
        max_live_keys: None,
    });
    Ok(config)
}

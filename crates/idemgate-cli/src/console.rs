//! `idemgate console`: the web console over a store, where no gateway runs.

use std::io::Write as _;
use std::sync::Arc;

use anyhow::{bail, Context as _, Result};
use idemgate_console::{Console, Settings};
use idemgate_kit::Instruments;

use crate::args::{Cli, ConsoleArgs};

/// Shortest operator token accepted: short secrets are guessable.
const MIN_TOKEN_LEN: usize = 16;

/// Serves the console until SIGTERM or Ctrl-C.
pub(crate) async fn run(cli: &Cli, args: &ConsoleArgs) -> Result<u8> {
    idemgate_http::logging::init();
    let var = &args.token_env;
    let token = match std::env::var(var) {
        Ok(t) if !t.trim().is_empty() => t.trim().to_owned(),
        _ => bail!(
            "failed to find the operator's token: set {var} to one (`idemgate token new` makes one); the console never serves without sign-in"
        ),
    };
    if token.len() < MIN_TOKEN_LEN {
        bail!("failed to accept the token in {var}: it has {} characters, at least {MIN_TOKEN_LEN} are required (`idemgate token new` makes one)", token.len());
    }
    let ctx = match crate::Context::open(cli, "local").await? {
        Ok(ctx) => ctx,
        Err(code) => return Ok(code),
    };
    // The audit log hears the operator's resolutions and reopenings, with who and why.
    let instruments = Instruments::open(args.audit_log.as_deref(), Vec::<String>::new())
        .with_context(|| {
            format!(
                "failed to open the audit log {}",
                args.audit_log
                    .as_deref()
                    .unwrap_or(std::path::Path::new(""))
                    .display()
            )
        })?;
    let console = Console::new(Settings {
        engine: Arc::new(instruments.attach(ctx.engine)),
        tenants: Vec::new(),
        operator_token_sha256: Some(idemgate_http::token_sha256(&token)),
        audit_log: args.audit_log.clone(),
        // This process serves no calls: it has no refusals to count.
        tally: None,
        secure_cookie: args.secure_cookie,
    })
    .map_err(anyhow::Error::msg)?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("failed to listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    println!("idemgate: console on http://{addr}/ui");
    let _ = std::io::stdout().flush();
    let app: axum::Router = idemgate_console::router(console);
    axum::serve(listener, app)
        .with_graceful_shutdown(idemgate_http::shutdown_signal())
        .await
        .context("failed to serve")?;
    Ok(0)
}

//! `idemgate console`: the web console over a store, where no gateway runs.

use std::io::Write as _;
use std::sync::Arc;

use anyhow::{Context as _, Result};
use idemgate_console::{Console, Settings};
use idemgate_kit::Instruments;

use crate::args::{Cli, ConsoleArgs};

/// Serves the console until SIGTERM or Ctrl-C.
pub(crate) async fn run(cli: &Cli, args: &ConsoleArgs) -> Result<u8> {
    let _traces = idemgate_http::logging::init()?;
    let token = crate::serve::token_from_env(
        &args.token_env,
        "the operator's token",
        "one (`idemgate token new` makes one); the console never serves without sign-in",
    )?;
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
        // One token, so one operator, named as the gateway names the one of
        // `console.operator_token_sha256`.
        operators: vec![idemgate_console::OperatorConfig {
            name: idemgate_console::DEFAULT_OPERATOR.to_owned(),
            token_sha256: idemgate_http::token_sha256(&token),
        }],
        oidc: None,
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

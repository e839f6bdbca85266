//! `idemgate mcp`: the MCP proxy on stdio or Streamable HTTP, on the store every other command
//! uses.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use idemgate::{AnyStore, Engine, FileJournal, TenantId};
use idemgate_kit::Instruments;
use idemgate_mcp::config::record_tool;
use idemgate_mcp::{Config, HttpUpstream, Upstream};

use crate::args::{Cli, McpArgs, McpLintArgs};
use crate::{exit, out};

/// How often outcomes the store did not confirm are retried from the journal.
const JOURNAL_FLUSH_EVERY: Duration = Duration::from_secs(30);

/// Runs the proxy until the agent or the server closes; returns the server's exit code when it
/// exited by itself.
pub(crate) async fn run(cli: &Cli, args: &McpArgs) -> Result<u8> {
    // Logs go to stderr as JSON lines: stdout carries the protocol.
    let _traces = idemgate_http::logging::init()?;
    let upstream = upstream(args)?;
    let mut config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    if args.trust_annotations {
        config.trusted = true;
    }
    if let Some(listen) = args.listen {
        if !listen.ip().is_loopback() && config.tenants.is_empty() && config.oauth.is_none() {
            anyhow::bail!(
                "refusing to serve MCP on {listen} without authentication: a non-loopback address needs [[tenants]] with bearer tokens or [oauth] in --config (docs/MCP.md)"
            );
        }
    }
    let tenant = match (&config.tenant, &cli.tenant) {
        (None, Some(t)) => TenantId::new(t.as_str()).context("invalid --tenant")?,
        _ => config.tenant_or("local")?,
    };
    // Records live where every other command looks, so `idemgate keys` sees them and a proxy
    // started per call (stdio clients without a session) replays what an earlier one recorded.
    let store = config.store.clone().or_else(|| cli.store.clone());
    let (url, journal_dir) = crate::store_and_journal_for(
        store.as_deref(),
        config.journal.as_deref().or(cli.journal.as_deref()),
    )?;
    if url.starts_with("memory:") {
        eprintln!("idemgate: warning: store memory: keeps records only while this proxy runs: a client that starts a proxy per call gets no deduplication at all");
    }
    let store = match AnyStore::connect(&url).await {
        Ok(store) => store,
        Err(e) => {
            eprintln!(
                "idemgate: failed to open store {}, so the MCP server was not started: {e}",
                crate::redact(&url)
            );
            return Ok(exit::STORE_UNAVAILABLE);
        }
    };
    let journal = FileJournal::open(&journal_dir)
        .with_context(|| format!("failed to open journal {}", journal_dir.display()))?;
    let server = upstream.name(&config);
    config.server_name = Some(server.clone());
    let tools: Vec<String> = config
        .tools
        .keys()
        .map(|t| record_tool(&server, t).to_string())
        .collect();
    let instruments = Instruments::open(config.audit_log.as_deref(), tools)
        .context("failed to open the audit log")?;
    let engine = Arc::new(instruments.attach(Engine::new(store).with_journal(Arc::new(journal))));
    let _flusher = engine.spawn_journal_flusher(JOURNAL_FLUSH_EVERY);
    if let Some(listen) = args.listen {
        let proxy = idemgate_mcp::http::Proxy::with_upstream(engine, config, tenant, upstream);
        proxy.run(listen).await?;
        return Ok(0);
    }
    let code = idemgate_mcp::stdio::run_upstream(engine, config, tenant, &upstream).await?;
    Ok(u8::try_from(code.rem_euclid(256)).unwrap_or(exit::FAILURE))
}

/// `idemgate mcp lint -- CMD`: the server's tools as a gate sees them, and a starting
/// configuration. 0 when nothing is worse than a note, 1 on a warning.
pub(crate) fn lint(cli: &Cli, args: &McpLintArgs) -> Result<u8> {
    use idemgate_mcp::lint;

    if cli.json && args.print_config {
        eprintln!("idemgate: mcp lint: --json prints the whole report and --print-config only the configuration: give one of them");
        return Ok(exit::USAGE);
    }
    let listing = match lint::list_tools(&args.command, args.timeout) {
        Ok(listing) => listing,
        Err(e) => {
            eprintln!("idemgate: mcp lint: {e}");
            return Ok(exit::SERVER_UNAVAILABLE);
        }
    };
    let report = lint::Report {
        server_name: idemgate_mcp::config::server_name(&Config::default(), &args.command),
        tools: lint::inspect(&listing.tools),
        server: listing.server,
        protocol_version: listing.protocol_version,
    };
    if cli.json {
        out::line(format_args!("{}", serde_json::to_string_pretty(&report)?));
    } else if args.print_config {
        out::bytes(lint::starting_config(&report).as_bytes());
        // The configuration goes to a file; what is wrong still reaches the person running it.
        for t in &report.tools {
            for f in t
                .findings
                .iter()
                .filter(|f| f.severity == lint::Severity::Warning)
            {
                eprintln!(
                    "idemgate: mcp lint: warning: {} [{}]: {}",
                    t.name, f.code, f.message
                );
            }
        }
    } else {
        out::bytes(lint::render(&report).as_bytes());
        out::line(format_args!("\n{}", lint::starting_config(&report)));
    }
    Ok(match report.worst() {
        Some(lint::Severity::Warning) => exit::FAILURE,
        _ => 0,
    })
}

/// Where the server is: the command after `--`, or `--upstream-url` with its headers.
fn upstream(args: &McpArgs) -> Result<Upstream> {
    let Some(url) = &args.upstream_url else {
        anyhow::ensure!(
            args.upstream_header.is_empty(),
            "--upstream-header is for --upstream-url: a command's server gets no HTTP headers"
        );
        anyhow::ensure!(
            !args.command.is_empty(),
            "give the MCP server's command after --, or --upstream-url URL"
        );
        return Ok(Upstream::Command(args.command.clone()));
    };
    let headers = args
        .upstream_header
        .iter()
        .map(|h| expand_env(h, |v| std::env::var(v).ok()))
        .collect::<Result<Vec<_>>>()?;
    Ok(Upstream::Http(Arc::new(HttpUpstream::new(url, &headers)?)))
}

/// `text` with every `${VAR}` replaced by `lookup(VAR)`; an unset variable is an error that
/// names it (and never the text, which may hold a secret).
fn expand_env(text: &str, lookup: impl Fn(&str) -> Option<String>) -> Result<String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let Some(end) = rest[at..].find('}') else {
            anyhow::bail!("an --upstream-header has an unclosed ${{");
        };
        let name = &rest[at + 2..at + end];
        let value = lookup(name).with_context(|| {
            format!("--upstream-header names ${{{name}}}, but the environment has no {name}")
        })?;
        out.push_str(&value);
        rest = &rest[at + end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::expand_env;

    #[test]
    fn header_values_take_variables_from_the_environment() {
        let env = |v: &str| (v == "T").then(|| "s3cret".to_owned());
        assert_eq!(
            expand_env("Authorization: Bearer ${T}", env).unwrap(),
            "Authorization: Bearer s3cret"
        );
        assert_eq!(expand_env("X: plain", env).unwrap(), "X: plain");
        let e = expand_env("X: ${NOPE} s3cret", env)
            .unwrap_err()
            .to_string();
        assert!(e.contains("NOPE") && !e.contains("s3cret"), "{e}");
        assert!(expand_env("X: ${T", env).is_err());
    }
}

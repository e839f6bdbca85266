//! The client-side stdio transport (`idemgate mcp -- CMD ARGS…`): the client speaks
//! newline-delimited JSON-RPC on the proxy's own stdin and stdout, and the server is any
//! [`Upstream`] (a child process whose stdin and stdout carry the same, or a Streamable HTTP
//! URL). What is here is the proxy's own stdin and stdout, read and written on the runtime
//! without blocking when they are pipes or sockets; the frames move in the pump (`pump.rs`).

use std::io::BufRead as _;
use std::sync::Arc;

use idemgate_core::{Engine, Store, TenantId};
use tokio::sync::mpsc;

use super::pump::{frame_text, shutdown_signal};
pub use super::pump::{lines, serve, Ended};
use super::upstream::Upstream;
use crate::config::Config;
use crate::error::Error;
use crate::session::Session;

/// Runs `command` as the server and proxies the process's own stdin and stdout to it until the
/// client closes its side (or SIGTERM/SIGINT arrives) or the server exits. Calls in flight at
/// that moment run to their end and their outcomes are recorded before the proxy exits. Returns
/// the server's exit code when it exited by itself, else 0.
///
/// # Errors
/// [`Error::Spawn`] when the server cannot be started.
pub async fn run<S: Store>(
    engine: Arc<Engine<S>>,
    config: Config,
    tenant: TenantId,
    command: &[String],
) -> Result<i32, Error> {
    run_upstream(engine, config, tenant, &Upstream::Command(command.to_vec())).await
}

/// [`run`] in front of any [`Upstream`]: a command, or a server at a Streamable HTTP URL. When
/// an HTTP upstream goes away the proxy exits with 1, as when a child crashes without a code.
///
/// # Errors
/// [`Error::Spawn`] when a command cannot be started.
pub async fn run_upstream<S: Store>(
    engine: Arc<Engine<S>>,
    config: Config,
    tenant: TenantId,
    upstream: &Upstream,
) -> Result<i32, Error> {
    let server = upstream.name(&config);
    let started = upstream.start()?;
    let (session, outputs) = Session::new(engine, config, server, tenant);
    let ended = serve(
        session,
        outputs,
        stdin_lines(),
        client_output(),
        started.lines,
        started.input,
        shutdown_signal(),
    )
    .await;
    let status = started.end.wait().await;
    if let (Ended::ServerClosed, Some(s)) = (ended, status) {
        // What happened to it (an exit code, a signal): the unknown answers of calls in flight
        // could only say that its output closed.
        tracing::warn!(status = %s, "the MCP server exited before the client closed the session");
    }
    Ok(match ended {
        Ended::ServerClosed => status.and_then(|s| s.code()).unwrap_or(1),
        Ended::ClientClosed => 0,
    })
}

/// The process's stdin as lines.
///
/// A pipe or a socket, which is how agents start a stdio server, is read on the runtime itself,
/// without blocking ([`NonBlocking`]): a request then wakes the runtime's thread directly. A
/// reading thread of its own cost each request a hand-off between threads; with tokio's stdout
/// for the answers, a replay cost 5.5 context switches in the proxy, 1.0 without either, and 16
/// callers' replays over one pipe went from 1.7 ms added to 0.24 ms (`scripts/bench-mcp`).
/// Anything else (a terminal, a file) is read on a thread of its own: a
/// blocking read of stdin cannot be cancelled, and on the runtime's blocking pool it would keep
/// the runtime from shutting down after the server exits.
fn stdin_lines() -> mpsc::UnboundedReceiver<String> {
    if let Some(input) = client_input() {
        return lines(input);
    }
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match stdin.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if let Some(line) = frame_text(&buf) {
                        if tx.send(line).is_err() {
                            break;
                        }
                    }
                }
            }
        }
    });
    rx
}

#[cfg(unix)]
use super::nonblocking::{client_input, client_output};
#[cfg(not(unix))]
use tokio::io::{AsyncRead, AsyncWrite};

/// Elsewhere (Windows), stdin is read on a thread of its own ([`stdin_lines`]): a console or an
/// anonymous pipe there has no readiness the runtime could wait for.
#[cfg(not(unix))]
fn client_input() -> Option<Box<dyn AsyncRead + Unpin + Send>> {
    None
}

/// Elsewhere (Windows), tokio's stdout, which writes on its blocking pool.
#[cfg(not(unix))]
fn client_output() -> Box<dyn AsyncWrite + Unpin + Send> {
    Box::new(tokio::io::stdout())
}

//! The server as a child process: started with piped stdin and stdout (its stderr is the
//! proxy's), and reaped once its input is closed. Both transports start one per session
//! ([`crate::upstream::Upstream::Command`]); it is apart from the client-side stdio
//! ([`super::stdio`]) because the server's process is not the client's.

use std::process::Stdio;
use std::time::Duration;

use tokio::process::{ChildStdin, ChildStdout};

use crate::error::Error;

/// How long the server gets to exit on its own once its input is closed.
const EXIT_GRACE: Duration = Duration::from_secs(5);

/// Starts `command` as a server with piped stdin and stdout (its stderr is the proxy's).
///
/// # Errors
/// [`Error::Spawn`] when it cannot be started.
pub(crate) fn spawn(
    command: &[String],
) -> Result<(tokio::process::Child, ChildStdin, ChildStdout), Error> {
    let program = command.first().cloned().unwrap_or_default();
    let mut child = tokio::process::Command::new(&program)
        .args(command.iter().skip(1))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| Error::Spawn {
            command: program,
            source,
        })?;
    let (Some(server_in), Some(server_out)) = (child.stdin.take(), child.stdout.take()) else {
        unreachable!("both pipes were asked for")
    };
    Ok((child, server_in, server_out))
}

/// Waits for a server whose input is closed to exit, killing it after a grace period.
pub(crate) async fn reap(child: &mut tokio::process::Child) -> Option<std::process::ExitStatus> {
    match tokio::time::timeout(EXIT_GRACE, child.wait()).await {
        Ok(status) => status.ok(),
        Err(_) => {
            // Our own child, still unreaped: its pid cannot name another process yet.
            let _ = child.start_kill();
            child.wait().await.ok()
        }
    }
}

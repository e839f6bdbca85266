//! The client-side stdio transport (`idemgate mcp -- CMD ARGS…`): the client speaks
//! newline-delimited JSON-RPC on the proxy's own stdin and stdout, and the server is any
//! [`Upstream`] (a child process whose stdin and stdout carry the same, or a Streamable HTTP
//! URL). What is here is the proxy's own stdin and stdout, read and written on the runtime
//! without blocking when they are pipes or sockets; the frames move in the pump (`pump.rs`).

use std::io::BufRead as _;
use std::sync::Arc;

use idemgate_core::{Engine, Store, TenantId};
use tokio::io::{AsyncRead, AsyncWrite};
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

/// The process's stdin read on the runtime without blocking, when it is a pipe or a Unix socket
/// ([`NonBlocking`]).
fn client_input() -> Option<Box<dyn AsyncRead + Unpin + Send>> {
    let (fd, pipe, restore) = NonBlocking::open(Std::In)?;
    match pipe {
        // Checks that it is a pipe's read end and sets O_NONBLOCK.
        true => tokio::net::unix::pipe::Receiver::from_owned_fd(fd)
            .ok()
            .map(|r| Box::new(restore.around(r)) as _),
        false => unix_socket(fd).map(|s| Box::new(restore.around(s)) as _),
    }
}

/// The process's stdout for the client's frames: written on the runtime without blocking when
/// it is a pipe or a Unix socket ([`NonBlocking`]); else tokio's stdout, which hands every write
/// to a thread of its blocking pool (two hand-offs between threads per answer).
fn client_output() -> Box<dyn AsyncWrite + Unpin + Send> {
    let Some((fd, pipe, restore)) = NonBlocking::open(Std::Out) else {
        return Box::new(tokio::io::stdout());
    };
    let stream: Option<Box<dyn AsyncWrite + Unpin + Send>> = match pipe {
        // Checks that it is a pipe's write end and sets O_NONBLOCK.
        true => tokio::net::unix::pipe::Sender::from_owned_fd(fd)
            .ok()
            .map(|w| Box::new(restore.around(w)) as _),
        false => unix_socket(fd).map(|s| Box::new(restore.around(s)) as _),
    };
    stream.unwrap_or_else(|| Box::new(tokio::io::stdout()))
}

/// Which standard stream a [`NonBlocking`] is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Std {
    In,
    Out,
}

/// stdin or stdout, when it is a pipe or a Unix socket, to be switched to non-blocking I/O that
/// the runtime waits for; the switch is undone when the stream made of it
/// ([`NonBlocking::around`]) is dropped, and at once when none could be made. `O_NONBLOCK`
/// belongs to the open file, which a terminal shares with the shell, hence pipes and sockets
/// only: an agent's pipe (or socket pair, as Node's child processes get) to its server is the
/// agent's and this process's alone. Not stdout when stderr is the same pipe (`2>&1`): stderr,
/// which the server inherits, must stay blocking.
struct NonBlocking {
    std: Std,
    flags: nix::fcntl::OFlag,
}

impl NonBlocking {
    /// A duplicate of the stream's descriptor (so that dropping it leaves the standard one
    /// open), whether it is a pipe (else a socket), and what undoes the switch.
    fn open(std: Std) -> Option<(std::os::fd::OwnedFd, bool, NonBlocking)> {
        use nix::fcntl::{fcntl, FcntlArg, OFlag};
        use nix::sys::stat::{fstat, SFlag};
        let stat = std.with_fd(|fd| fstat(fd)).ok()?;
        let kind = SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT;
        if kind != SFlag::S_IFIFO && kind != SFlag::S_IFSOCK {
            return None;
        }
        if std == Std::Out {
            let err = fstat(std::io::stderr()).ok()?;
            if (err.st_dev, err.st_ino) == (stat.st_dev, stat.st_ino) {
                return None;
            }
        }
        let flags = OFlag::from_bits_truncate(std.with_fd(|fd| fcntl(fd, FcntlArg::F_GETFL)).ok()?);
        let fd = std.with_fd(|fd| nix::unistd::dup(fd)).ok()?;
        Some((fd, kind == SFlag::S_IFIFO, NonBlocking { std, flags }))
    }

    /// `stream`, made of the duplicate, with the switch undone when it is dropped.
    fn around<S>(self, stream: S) -> Restoring<S> {
        Restoring {
            stream,
            _restore: self,
        }
    }
}

impl Std {
    /// `f` of the stream's descriptor.
    fn with_fd<R>(self, f: impl FnOnce(std::os::fd::BorrowedFd<'_>) -> R) -> R {
        use std::os::fd::AsFd;
        match self {
            Std::In => f(std::io::stdin().as_fd()),
            Std::Out => f(std::io::stdout().as_fd()),
        }
    }
}

impl Drop for NonBlocking {
    fn drop(&mut self) {
        use nix::fcntl::{fcntl, FcntlArg};
        let _ = self
            .std
            .with_fd(|fd| fcntl(fd, FcntlArg::F_SETFL(self.flags)));
    }
}

/// A Unix socket made of `fd`, non-blocking for the runtime; `None` for another kind of socket
/// (a TCP one, say), left to blocking I/O.
fn unix_socket(fd: std::os::fd::OwnedFd) -> Option<tokio::net::UnixStream> {
    let socket = std::os::unix::net::UnixStream::from(fd);
    socket.peer_addr().ok()?;
    socket.set_nonblocking(true).ok()?;
    tokio::net::UnixStream::from_std(socket).ok()
}

/// A stream of a standard descriptor switched to non-blocking I/O, switched back when dropped.
struct Restoring<S> {
    stream: S,
    _restore: NonBlocking,
}

impl<S: AsyncRead + Unpin> AsyncRead for Restoring<S> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Restoring<S> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

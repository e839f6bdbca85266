//! The stdio transport: the server is a child process whose stdin and stdout carry
//! newline-delimited JSON-RPC, and the client speaks the same on the proxy's own stdin and
//! stdout. The server's stderr is the proxy's (the agent logs it).

use std::future::Future;
use std::io::BufRead as _;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use idemgate_core::{Engine, Store, TenantId};
use tokio::io::{AsyncBufReadExt as _, AsyncRead, AsyncWrite, AsyncWriteExt as _, BufReader};
use tokio::process::{ChildStdin, ChildStdout};
use tokio::sync::mpsc;

use crate::config::Config;
use crate::error::Error;
use crate::session::{CarriedKey, Outgoing, Outputs, Session};
use crate::upstream::Upstream;

/// How long the server gets to exit on its own once its input is closed.
const EXIT_GRACE: Duration = Duration::from_secs(5);

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

/// What a transport hands the session from the client.
pub(crate) trait FromClient: Send + 'static {
    fn deliver<S: Store>(self, session: &Session<S>);
}

/// A frame.
impl FromClient for String {
    fn deliver<S: Store>(self, session: &Session<S>) {
        session.from_client(self);
    }
}

/// A frame and the key its transport carried beside it.
impl FromClient for (String, CarriedKey) {
    fn deliver<S: Store>(self, session: &Session<S>) {
        session.from_client_keyed(self.0, self.1);
    }
}

/// Which side ended the session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// The client closed its input (or the proxy was told to stop).
    ClientClosed,
    /// The server closed its output.
    ServerClosed,
}

/// Relays frames between a client and a server, given as line channels and writers, until
/// either side closes or `stop` completes; then lets the calls in flight finish (still relaying
/// the server's frames), and returns once every answer is written.
pub async fn serve<S: Store>(
    session: Session<S>,
    outputs: Outputs,
    client_lines: mpsc::UnboundedReceiver<String>,
    client_out: impl AsyncWrite + Unpin + Send + 'static,
    server_lines: mpsc::UnboundedReceiver<String>,
    server_in: impl AsyncWrite + Unpin + Send + 'static,
    stop: impl Future<Output = ()>,
) -> Ended {
    let Outputs {
        mut to_client,
        to_server,
    } = outputs;
    let client_writer = tokio::spawn(async move {
        let mut out = client_out;
        while let Some(frame) = to_client.recv().await {
            // A client that went away must not stop calls from being recorded.
            let _ = write_line(&mut out, &frame).await;
        }
    });
    let ended = relay(
        session,
        to_server,
        client_lines,
        server_lines,
        server_in,
        stop,
    )
    .await;
    let _ = client_writer.await;
    ended
}

/// The heart of [`serve`] for transports that take the frames for the client themselves: feeds
/// the session from the client's lines and the server's, writes its frames for the server, and
/// once either side closes or `stop` completes lets the calls in flight finish.
pub(crate) async fn relay<S: Store, M: FromClient>(
    session: Session<S>,
    mut to_server: mpsc::UnboundedReceiver<Outgoing>,
    mut client_lines: mpsc::UnboundedReceiver<M>,
    mut server_lines: mpsc::UnboundedReceiver<String>,
    server_in: impl AsyncWrite + Unpin + Send + 'static,
    stop: impl Future<Output = ()>,
) -> Ended {
    let server_writer = tokio::spawn(async move {
        let mut input = server_in;
        let mut broken: Option<String> = None;
        while let Some(out) = to_server.recv().await {
            let written = match &broken {
                Some(why) => Err(std::io::Error::other(why.clone())),
                None => write_line(&mut input, &out.frame).await,
            };
            if let Err(e) = &written {
                broken.get_or_insert_with(|| e.to_string());
            }
            if let Some(tx) = out.sent {
                let _ = tx.send(written);
            }
        }
        // Dropping the writer closes the server's input: it exits once its answers are out.
    });
    let mut stop = std::pin::pin!(stop);
    let ended = loop {
        tokio::select! {
            line = client_lines.recv() => match line {
                Some(l) => l.deliver(&session),
                None => break Ended::ClientClosed,
            },
            line = server_lines.recv() => match line {
                Some(l) => session.from_server(l),
                None => break Ended::ServerClosed,
            },
            () = &mut stop => break Ended::ClientClosed,
        }
    };
    let closed = "the server closed its output before answering (it exited or crashed, or the connection to it was lost)";
    if ended == Ended::ServerClosed {
        session.server_closed(closed);
    }
    // Calls in flight run to their end: their answers may still come from the server.
    {
        let mut drain = std::pin::pin!(session.drain());
        let mut server_open = ended == Ended::ClientClosed;
        loop {
            tokio::select! {
                () = &mut drain => break,
                line = server_lines.recv(), if server_open => match line {
                    Some(l) => session.from_server(l),
                    None => {
                        server_open = false;
                        session.server_closed(closed);
                    }
                },
            }
        }
    }
    drop(session);
    let _ = server_writer.await;
    ended
}

async fn write_line(out: &mut (impl AsyncWrite + Unpin), frame: &str) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(frame.len() + 1);
    buf.extend_from_slice(frame.as_bytes());
    buf.push(b'\n');
    out.write_all(&buf).await?;
    out.flush().await
}

/// The lines of `reader`, without their newline, until it ends.
pub fn lines(reader: impl AsyncRead + Unpin + Send + 'static) -> mpsc::UnboundedReceiver<String> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut reader = BufReader::new(reader);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match reader.read_until(b'\n', &mut buf).await {
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

/// One frame's text: without the newline; blank lines are no frames.
fn frame_text(buf: &[u8]) -> Option<String> {
    let line = buf.strip_suffix(b"\n").unwrap_or(buf);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    Some(String::from_utf8_lossy(line).into_owned())
}

/// Completes at SIGTERM or SIGINT: the proxy stops reading the client and lets calls in flight
/// finish, so that their outcomes are recorded.
pub(crate) async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {},
                _ = int.recv() => {},
            }
        }
        _ => std::future::pending().await,
    }
}

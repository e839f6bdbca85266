//! The relay pump: moves frames between a client, a [`Session`] and a server given as line
//! channels and writers, whatever carries them, until either side closes; then lets the calls
//! in flight finish, so that their outcomes are recorded. Both transports run it: stdio with the
//! process's own stdin and stdout ([`super::stdio`]), Streamable HTTP with each session's
//! channels ([`super::http`]). It is apart from both because it knows neither stdin nor HTTP.

use std::future::Future;

use idemgate_core::Store;
use tokio::io::{AsyncBufReadExt as _, AsyncRead, AsyncWrite, AsyncWriteExt as _, BufReader};
use tokio::sync::mpsc;

use crate::gate::CarriedKey;
use crate::peer::Outgoing;
use crate::session::{Outputs, Session};

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
    to_server: mpsc::UnboundedReceiver<Outgoing>,
    mut client_lines: mpsc::UnboundedReceiver<M>,
    mut server_lines: mpsc::UnboundedReceiver<String>,
    server_in: impl AsyncWrite + Unpin + Send + 'static,
    stop: impl Future<Output = ()>,
) -> Ended {
    let server_writer = tokio::spawn(write_to_server(to_server, server_in));
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
    finish(&session, &mut server_lines, ended).await;
    drop(session);
    let _ = server_writer.await;
    ended
}

/// Writes the session's frames for the server into its input, telling whoever waits whether
/// each was written; once one write failed, later frames fail the same way. Dropping the writer
/// at the end closes the server's input: it exits once its answers are out.
async fn write_to_server(
    mut to_server: mpsc::UnboundedReceiver<Outgoing>,
    mut input: impl AsyncWrite + Unpin + Send + 'static,
) {
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
}

/// Once a side `ended` the session: calls in flight run to their end, their answers may still
/// come from the server (when it was the client that closed).
async fn finish<S: Store>(
    session: &Session<S>,
    server_lines: &mut mpsc::UnboundedReceiver<String>,
    ended: Ended,
) {
    let closed = "the server closed its output before answering (it exited or crashed, or the connection to it was lost)";
    if ended == Ended::ServerClosed {
        session.server_closed(closed);
    }
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

/// One frame's text: without the newline; blank lines are no frames.
pub(super) fn frame_text(buf: &[u8]) -> Option<String> {
    let line = buf.strip_suffix(b"\n").unwrap_or(buf);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    Some(String::from_utf8_lossy(line).into_owned())
}

/// Completes at SIGTERM or SIGINT: the proxy stops reading the client and lets calls in flight
/// finish, so that their outcomes are recorded.
#[cfg(unix)]
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

/// Completes at Ctrl-C, Ctrl-Break or the console closing (Windows has no SIGTERM: a service
/// manager or an agent ending the proxy closes its console or kills it outright), as the Unix
/// signals do there.
#[cfg(windows)]
pub(crate) async fn shutdown_signal() {
    use tokio::signal::windows::{ctrl_break, ctrl_close};
    match (ctrl_break(), ctrl_close()) {
        (Ok(mut brk), Ok(mut close)) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {},
                _ = brk.recv() => {},
                _ = close.recv() => {},
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

//! The client's stdin and stdout on Unix, read and written on the runtime without blocking when
//! they are pipes or Unix sockets (an agent's pipe to its server); see [`NonBlocking`].

use tokio::io::{AsyncRead, AsyncWrite};

/// The process's stdin read on the runtime without blocking, when it is a pipe or a Unix socket
/// ([`NonBlocking`]).
pub(super) fn client_input() -> Option<Box<dyn AsyncRead + Unpin + Send>> {
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
pub(super) fn client_output() -> Box<dyn AsyncWrite + Unpin + Send> {
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

//! A waiting caller's own connection: a plain blocking socket that the calling thread writes to
//! and reads from itself, for a thread that [`idemgate_core::caller::waiting`] marks (a Python
//! thread in a call, the GIL released). Through the shared multiplexed connection each round
//! trip is four thread hand-offs (the caller wakes the connection's driver task on a runtime
//! thread, which writes, waits in epoll, reads and wakes the caller back); here it is a `write`
//! and a `read` on the caller's thread, as a native client's.
//!
//! One connection per thread and store, kept in a thread-local; it goes with its thread. Only a
//! single server reached over TCP or a Unix socket with RESP2 gets one (no TLS, no Cluster, no
//! Sentinel, whose primary moves): those keep the shared connection.
//!
//! A connection idle since its last use may have been closed by the server (its `timeout`, a
//! restart). Sent a command, it would fail with the outcome unknown, so each use first peeks at
//! the socket without blocking (one `recv` that finds nothing to read), and a closed or
//! desynchronised connection is replaced before anything is sent: nothing sent, nothing unknown.
//! Any error on a connection in use drops it, as a multiplexed connection's driver reconnects.
//!
//! A process forked from a thread that has one inherits its socket, which the parent still
//! uses: replies could cross between the two. So a connection is used only by the process that
//! opened it, and a child opens its own.

use std::cell::RefCell;
use std::io::{BufReader, Read, Write};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use redis::{ConnectionAddr, ConnectionInfo, ErrorKind, Parser, ProtocolVersion, RedisError};

use super::*;
use crate::carried::Address;

/// What a connection of the caller's own needs to reach the server, when the store's URL allows
/// one: this module's, and the one an event loop carries (carried.rs).
#[derive(Debug)]
pub(crate) struct Target {
    pub(crate) address: Address,
    pub(crate) info: ConnectionInfo,
    pub(crate) connect_timeout: Option<Duration>,
    pub(crate) response_timeout: Option<Duration>,
}

impl Target {
    /// The target of `info`, or `None` when its connection must stay the shared one (TLS,
    /// RESP3, an address kind this module does not speak).
    pub(crate) fn of(
        info: &ConnectionInfo,
        connect_timeout: Option<Duration>,
        response_timeout: Option<Duration>,
    ) -> Option<Target> {
        let address = match info.addr() {
            ConnectionAddr::Tcp(host, port) => Address::Tcp {
                host: host.clone(),
                port: *port,
            },
            #[cfg(unix)]
            ConnectionAddr::Unix(path) => Address::Unix(path.clone()),
            _ => return None,
        };
        let resp2 = info.redis_settings().protocol() == ProtocolVersion::RESP2;
        resp2.then(|| Target {
            address,
            info: info.clone(),
            connect_timeout,
            response_timeout,
        })
    }
}

/// The socket of one direct connection.
enum Socket {
    Tcp(std::net::TcpStream),
    #[cfg(unix)]
    Unix(std::os::unix::net::UnixStream),
}

impl Read for Socket {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Socket::Tcp(s) => s.read(buf),
            #[cfg(unix)]
            Socket::Unix(s) => s.read(buf),
        }
    }
}

impl Socket {
    fn write_all(&self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            Socket::Tcp(s) => (&*s).write_all(bytes),
            #[cfg(unix)]
            Socket::Unix(s) => (&*s).write_all(bytes),
        }
    }

    fn set_timeouts(&self, t: Option<Duration>) -> std::io::Result<()> {
        match self {
            Socket::Tcp(s) => s.set_read_timeout(t).and_then(|()| s.set_write_timeout(t)),
            #[cfg(unix)]
            Socket::Unix(s) => s.set_read_timeout(t).and_then(|()| s.set_write_timeout(t)),
        }
    }

    /// Whether the idle socket can take a command: nothing to read (a closed connection reads
    /// its end, a desynchronised one a stray reply), checked without blocking.
    #[cfg(unix)]
    fn idle(&self) -> bool {
        use std::os::fd::AsRawFd;
        let fd = match self {
            Socket::Tcp(s) => s.as_raw_fd(),
            Socket::Unix(s) => s.as_raw_fd(),
        };
        use nix::sys::socket::{recv, MsgFlags};
        let peeked = recv(fd, &mut [0u8], MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT);
        peeked == Err(nix::errno::Errno::EAGAIN)
    }

    #[cfg(not(unix))]
    fn idle(&self) -> bool {
        let Socket::Tcp(s) = self;
        if s.set_nonblocking(true).is_err() {
            return false;
        }
        let idle =
            matches!(s.peek(&mut [0u8]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
        s.set_nonblocking(false).is_ok() && idle
    }
}

/// One direct connection: its socket, read through a buffer (and written to past it), and its
/// reply parser.
pub(crate) struct Direct {
    reader: BufReader<Socket>,
    parser: Parser,
    db: i64,
    /// Set by any error: the stream may hold half a reply, so the connection is not used again.
    broken: bool,
    /// The process that opened it (see the module docs on forks).
    pid: u32,
}

impl Direct {
    /// Connects and sets the connection up as the URL says (`AUTH`, `SELECT`).
    fn open(target: &Target) -> RedisResult<Direct> {
        let socket = match &target.address {
            Address::Tcp { host, port } => {
                let stream = match target.connect_timeout {
                    None => std::net::TcpStream::connect((host.as_str(), *port))?,
                    Some(timeout) => connect_tcp(host, *port, timeout)?,
                };
                stream.set_nodelay(true)?;
                Socket::Tcp(stream)
            }
            #[cfg(unix)]
            Address::Unix(path) => Socket::Unix(std::os::unix::net::UnixStream::connect(path)?),
            // `Target::of` makes no Unix address where there are no Unix sockets.
            #[cfg(not(unix))]
            Address::Unix(_) => {
                return Err(RedisError::from((
                    ErrorKind::InvalidClientConfig,
                    "no direct connection for this address",
                )))
            }
        };
        socket.set_timeouts(target.response_timeout)?;
        let settings = target.info.redis_settings();
        let mut direct = Direct {
            reader: BufReader::new(socket),
            parser: Parser::new(),
            db: settings.db(),
            broken: false,
            pid: std::process::id(),
        };
        for command in crate::carried::setup_commands(&target.info) {
            direct.request(&command)?.extract_error()?;
        }
        Ok(direct)
    }

    /// Sends `bytes` (one or more packed commands) and reads `replies` replies.
    fn exchange(&mut self, bytes: &[u8], replies: usize) -> RedisResult<Vec<Value>> {
        let result = (|| {
            self.reader.get_ref().write_all(bytes)?;
            (0..replies)
                .map(|_| self.parser.parse_value(&mut self.reader))
                .collect::<RedisResult<Vec<Value>>>()
        })();
        if result.is_err() {
            self.broken = true;
        }
        result
    }

    fn request(&mut self, bytes: &[u8]) -> RedisResult<Value> {
        Ok(self.exchange(bytes, 1)?.remove(0))
    }

    /// Whether this connection may take the next command (see the module docs).
    fn usable(&self) -> bool {
        !self.broken
            && self.pid == std::process::id()
            && self.reader.buffer().is_empty()
            && self.reader.get_ref().idle()
    }
}

/// Connects to `host:port` trying each of its addresses within `timeout`.
fn connect_tcp(host: &str, port: u16, timeout: Duration) -> std::io::Result<std::net::TcpStream> {
    use std::net::ToSocketAddrs;
    let mut last = None;
    for addr in (host, port).to_socket_addrs()? {
        match std::net::TcpStream::connect_timeout(&addr, timeout) {
            Ok(stream) => return Ok(stream),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("no address for {host}"),
        )
    }))
}

/// A direct connection as the store's code uses any connection (`Conn::Direct`).
#[derive(Clone)]
pub(crate) struct DirectConn(Arc<Mutex<Direct>>);

impl DirectConn {
    fn with<T>(&self, f: impl FnOnce(&mut Direct) -> RedisResult<T>) -> RedisResult<T> {
        let mut direct = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if direct.broken {
            return Err(RedisError::from((
                ErrorKind::Io,
                "the connection was dropped after an earlier error",
            )));
        }
        f(&mut direct)
    }
}

impl ConnectionLike for DirectConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let reply = self.with(|d| d.request(&cmd.get_packed_command()));
        Box::pin(std::future::ready(reply))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let replies = self.with(|d| {
            let mut replies = d.exchange(&cmd.get_packed_pipeline(), offset + count)?;
            Ok(replies.split_off(offset))
        });
        Box::pin(std::future::ready(replies))
    }

    fn get_db(&self) -> i64 {
        self.0.lock().map_or(0, |d| d.db)
    }
}

thread_local! {
    /// This thread's direct connections, one per store still alive.
    static MINE: RefCell<Vec<(Weak<Inner>, DirectConn)>> = const { RefCell::new(Vec::new()) };
}

/// This thread's direct connection to `store`'s server, opened (or opened again, when the last
/// one was closed or broken) now. `Err` when it cannot be opened: nothing was sent.
pub(crate) fn mine(store: &Arc<Inner>, target: &Target) -> RedisResult<DirectConn> {
    MINE.with(|mine| {
        let mut mine = mine.borrow_mut();
        mine.retain(|(s, _)| s.strong_count() > 0);
        let at = mine
            .iter()
            .position(|(s, _)| std::ptr::eq(s.as_ptr(), Arc::as_ptr(store)));
        if let Some(at) = at {
            let usable = mine[at].1 .0.lock().is_ok_and(|d| d.usable());
            if usable {
                return Ok(mine[at].1.clone());
            }
            mine.swap_remove(at);
        }
        let conn = DirectConn(Arc::new(Mutex::new(Direct::open(target)?)));
        mine.push((Arc::downgrade(store), conn.clone()));
        Ok(conn)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> Target {
        let url = std::env::var("IDEMGATE_TEST_REDIS_URL")
            .unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
        let client = redis::Client::open(url.as_str()).expect("redis url");
        let timeout = Some(Duration::from_secs(5));
        Target::of(client.get_connection_info(), timeout, timeout).expect("a plain target")
    }

    #[test]
    fn a_connection_serves_only_the_process_that_opened_it_and_only_while_idle_and_whole() {
        let mut direct = Direct::open(&target())
            .unwrap_or_else(|e| panic!("failed to reach the test redis ({e})"));
        let ping = redis::cmd("PING").get_packed_command();
        assert_eq!(
            direct.request(&ping).unwrap(),
            Value::SimpleString("PONG".into())
        );
        assert!(direct.usable());
        // What a forked child would see: another process's connection.
        direct.pid += 1;
        assert!(!direct.usable(), "a child never uses its parent's socket");
        direct.pid -= 1;
        // A reply nobody read yet (a desynchronised stream) makes it unusable too.
        direct.reader.get_ref().write_all(&ping).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while direct.reader.get_ref().idle() {
            assert!(
                std::time::Instant::now() < deadline,
                "the stray reply never came"
            );
            std::thread::yield_now();
        }
        assert!(!direct.usable(), "a stray reply on the socket");
        direct.broken = true;
        assert!(!direct.usable());
    }

    #[test]
    fn tls_and_resp3_keep_the_shared_connection() {
        for url in [
            "rediss://127.0.0.1:6379",
            "redis://127.0.0.1:6379?protocol=resp3",
        ] {
            let Ok(client) = redis::Client::open(url) else {
                continue; // no TLS in this build of redis-rs: nothing to route
            };
            assert!(
                Target::of(client.get_connection_info(), None, None).is_none(),
                "{url}"
            );
        }
    }
}

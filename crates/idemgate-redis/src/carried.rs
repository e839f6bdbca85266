//! A connection whose bytes the caller's event loop carries: Node's thread owns the socket (a
//! `net.Socket` of the package's), the store queues commands here and takes the replies back
//! from it. Through the shared multiplexed connection each round trip is two hand-offs between
//! Node's thread and a runtime thread (the command to the connection's driver task, the answer
//! back to Node's loop), and on a busy machine each waits for a core; here a round trip is the
//! loop's own `write`, its wake-up and its `read`, as a JavaScript client's.
//!
//! The store uses the link only for a future polled under [`idemgate_core::caller::on_loop`]
//! while the loop has a connection up; everything else (tasks on the runtime, a call polled
//! while the loop reconnects) keeps the shared connection. A command is queued while the loop's
//! thread polls, so the loop writes it as soon as the poll returns (`take_output`); its reply
//! (`input`) wakes the waiting future, which the loop polls again. Replies come in the order
//! commands were written, so each one completes the oldest command still waiting.
//!
//! When the loop's socket fails, or a reply is not RESP, every command the loop took to write
//! and still waiting fails as a lost connection does (its outcome unknown: it may have run); one
//! still queued here, never handed to the loop, fails as a refused connection (it did not run),
//! as does a command asked of a link that is down (the next step of an operation that began on
//! it). The link is down until the loop connects again (`connected`), which queues the
//! connection's setup (`AUTH`, `SELECT`) ahead of any command.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use redis::{ConnectionInfo, RedisError};

use crate::direct::Target;

use super::*;

/// Where the loop connects to, as the store's URL says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Address {
    /// A TCP host and port.
    Tcp {
        /// The host name or address.
        host: String,
        /// The port.
        port: u16,
    },
    /// A Unix socket's path.
    Unix(std::path::PathBuf),
}

/// One command (or pipeline) whose replies the link waits for.
struct Waiting {
    replies: usize,
    got: Vec<Value>,
    /// None for the connection's own setup: its error breaks the link.
    to: Option<Arc<Slot>>,
}

/// Where a command's replies go: the future that waits for them.
#[derive(Default)]
struct Slot {
    state: Mutex<SlotState>,
}

#[derive(Default)]
struct SlotState {
    result: Option<RedisResult<Vec<Value>>>,
    waker: Option<Waker>,
}

impl Slot {
    fn fill(&self, result: RedisResult<Vec<Value>>) {
        let waker = {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            state.result = Some(result);
            state.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// The replies of one command, when the loop hands them in.
struct Replies(Arc<Slot>);

impl Future for Replies {
    type Output = RedisResult<Vec<Value>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(result) = state.result.take() {
            return Poll::Ready(result);
        }
        if !state
            .waker
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
        {
            state.waker = Some(cx.waker().clone());
        }
        idemgate_core::caller::awaits_loop();
        Poll::Pending
    }
}

#[derive(Default)]
struct State {
    /// A socket of the loop's is connected (and its setup queued).
    up: bool,
    /// Bytes to write, in order.
    output: Vec<u8>,
    /// Bytes read and not yet a whole reply.
    input: Vec<u8>,
    /// The commands written or queued, oldest first.
    waiting: VecDeque<Waiting>,
    /// How many of `waiting`, from the front, the loop took to write (`take_output`): those may
    /// have run when the connection is lost; the rest never left.
    sent: usize,
}

/// The error of a command that never reached the server: refused, so the store knows it did not
/// run.
fn not_sent(why: &str) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::ConnectionRefused,
        format!("the command was not sent: {why}"),
    ))
}

/// A connection carried by the caller's event loop (see the module docs); the store holds one
/// when its URL names a single server reached over plain TCP or a Unix socket with RESP2.
pub struct CarriedLink {
    address: Address,
    /// `AUTH` and `SELECT`, as the URL asks, queued first on every new connection.
    setup: Vec<Vec<u8>>,
    db: i64,
    response_timeout: Option<Duration>,
    connect_timeout: Option<Duration>,
    state: Mutex<State>,
}

impl fmt::Debug for CarriedLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CarriedLink")
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

impl CarriedLink {
    /// The link to `target`: a URL that allows a connection of the caller's own (direct.rs)
    /// allows one the loop carries, and for the same reasons.
    pub(crate) fn of(target: &Target) -> CarriedLink {
        CarriedLink {
            address: target.address.clone(),
            setup: setup_commands(&target.info),
            db: target.info.redis_settings().db(),
            response_timeout: target.response_timeout,
            connect_timeout: target.connect_timeout,
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Where the loop connects to.
    pub fn address(&self) -> &Address {
        &self.address
    }

    /// How long the loop waits for a reply before it gives the connection up (none: forever).
    pub fn response_timeout(&self) -> Option<Duration> {
        self.response_timeout
    }

    /// How long the loop tries to connect.
    pub fn connect_timeout(&self) -> Option<Duration> {
        self.connect_timeout
    }

    /// Whether the loop has a connection up: only then does the store queue commands here.
    pub fn is_up(&self) -> bool {
        self.state().up
    }

    /// The loop connected a new socket: its setup is queued, and calls may use it.
    pub fn connected(&self) {
        let mut state = self.state();
        if state.up {
            return;
        }
        state.up = true;
        state.output.clear();
        state.input.clear();
        state.sent = 0;
        for command in &self.setup {
            state.output.extend_from_slice(command);
            state.waiting.push_back(Waiting {
                replies: 1,
                got: Vec::new(),
                to: None,
            });
        }
    }

    /// The bytes to write now, if any.
    pub fn take_output(&self) -> Option<Vec<u8>> {
        let mut state = self.state();
        if state.output.is_empty() {
            return None;
        }
        state.sent = state.waiting.len();
        Some(std::mem::take(&mut state.output))
    }

    /// How many commands wait for their replies (the loop keeps its socket referenced, and a
    /// reply timeout armed, while any do).
    pub fn outstanding(&self) -> usize {
        self.state().waiting.len()
    }

    /// Bytes the loop read: each whole reply goes to the oldest command still waiting. Bytes
    /// that are not RESP break the link (`Err` says why; the loop closes its socket).
    pub fn input(&self, bytes: &[u8]) -> std::result::Result<(), String> {
        let mut done = Vec::new();
        let outcome = {
            let mut state = self.state();
            if !state.up {
                return Err("the connection is down".to_owned());
            }
            state.input.extend_from_slice(bytes);
            let outcome = replies(&mut state, &mut done);
            if let Err(why) = &outcome {
                broken(&mut state, why, &mut done);
            }
            outcome
        };
        // Woken outside the lock: a waker may poll at once.
        for (slot, result) in done {
            slot.fill(result);
        }
        outcome
    }

    /// The loop's socket failed or closed: every command still waiting fails as over a lost
    /// connection (it may have run), and the link is down until `connected`.
    pub fn broken(&self, why: &str) {
        let mut done = Vec::new();
        broken(&mut self.state(), why, &mut done);
        for (slot, result) in done {
            slot.fill(result);
        }
    }

    /// Queues `bytes`, a command or a pipeline of `replies` replies, and waits for them.
    fn request(&self, bytes: &[u8], replies: usize) -> RedisFuture<'static, Vec<Value>> {
        let slot = Arc::new(Slot::default());
        {
            let mut state = self.state();
            if !state.up {
                // A later step of an operation that began on the link (a script loaded after
                // NOSCRIPT, the next page of a scan) after it broke: nothing is sent.
                return Box::pin(std::future::ready(Err(not_sent(
                    "the event loop's connection is down",
                ))));
            }
            state.output.extend_from_slice(bytes);
            state.waiting.push_back(Waiting {
                replies,
                got: Vec::with_capacity(replies),
                to: Some(Arc::clone(&slot)),
            });
        }
        Box::pin(Replies(slot))
    }
}

/// The commands that set a new connection up as `info` says, packed: `AUTH` with the URL's
/// credentials, `SELECT` of its database.
pub(crate) fn setup_commands(info: &ConnectionInfo) -> Vec<Vec<u8>> {
    let settings = info.redis_settings();
    let mut setup = Vec::new();
    if let Some(password) = settings.password() {
        let mut auth = redis::cmd("AUTH");
        if let Some(user) = settings.username() {
            auth.arg(user);
        }
        auth.arg(password);
        setup.push(auth.get_packed_command());
    }
    if settings.db() != 0 {
        setup.push(redis::cmd("SELECT").arg(settings.db()).get_packed_command());
    }
    setup
}

/// Takes every whole reply off `state.input`, completing the commands they answer.
fn replies(
    state: &mut State,
    done: &mut Vec<(Arc<Slot>, RedisResult<Vec<Value>>)>,
) -> std::result::Result<(), String> {
    let mut at = 0;
    let outcome = loop {
        let end = match frame(&state.input, at) {
            Ok(Some(end)) => end,
            Ok(None) => break Ok(()),
            Err(why) => break Err(why),
        };
        let value = match redis::parse_redis_value(&state.input[at..end]) {
            Ok(v) => v,
            Err(e) => break Err(format!("a reply redis sent cannot be read: {e}")),
        };
        at = end;
        let Some(first) = state.waiting.front_mut() else {
            break Err("redis sent a reply no command waited for".to_owned());
        };
        first.got.push(value);
        if first.got.len() < first.replies {
            continue;
        }
        let Some(whole) = state.waiting.pop_front() else {
            continue;
        };
        state.sent = state.sent.saturating_sub(1);
        match whole.to {
            Some(slot) => done.push((slot, Ok(whole.got))),
            None => {
                if let Some(Err(e)) = whole.got.into_iter().next().map(Value::extract_error) {
                    break Err(format!("redis refused the connection's setup: {e}"));
                }
            }
        }
    };
    state.input.drain(..at);
    outcome
}

/// Fails every waiting command and takes the link down.
fn broken(state: &mut State, why: &str, done: &mut Vec<(Arc<Slot>, RedisResult<Vec<Value>>)>) {
    state.up = false;
    state.output.clear();
    state.input.clear();
    let sent = std::mem::take(&mut state.sent);
    for (at, waiting) in state.waiting.drain(..).enumerate() {
        if let Some(slot) = waiting.to {
            let e = if at < sent {
                RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::ConnectionAborted,
                    format!("the connection was lost before the reply came: {why}"),
                ))
            } else {
                not_sent(why)
            };
            done.push((slot, Err(e)));
        }
    }
}

/// Where the RESP2 reply that starts at `at` ends: `Ok(None)` while it is not all there.
fn frame(buf: &[u8], at: usize) -> std::result::Result<Option<usize>, String> {
    let Some(&kind) = buf.get(at) else {
        return Ok(None);
    };
    let Some(cr) = buf[at..]
        .windows(2)
        .position(|w| w == b"\r\n")
        .map(|p| at + p)
    else {
        return Ok(None);
    };
    let line = cr + 2;
    let length = || -> std::result::Result<i64, String> {
        std::str::from_utf8(&buf[at + 1..cr])
            .ok()
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| "redis sent a length that is not a number".to_owned())
    };
    match kind {
        b'+' | b'-' | b':' => Ok(Some(line)),
        b'$' => match usize::try_from(length()?) {
            Err(_) => Ok(Some(line)), // a null bulk string
            Ok(n) => {
                let end = line
                    .checked_add(n)
                    .and_then(|e| e.checked_add(2))
                    .ok_or_else(|| "redis sent a length too large to hold".to_owned())?;
                Ok((buf.len() >= end).then_some(end))
            }
        },
        b'*' => match usize::try_from(length()?) {
            Err(_) => Ok(Some(line)), // a null array
            Ok(n) => {
                let mut end = line;
                for _ in 0..n {
                    match frame(buf, end)? {
                        Some(next) => end = next,
                        None => return Ok(None),
                    }
                }
                Ok(Some(end))
            }
        },
        other => Err(format!(
            "redis sent a reply of an unknown kind {:?}",
            char::from(other)
        )),
    }
}

/// The carried link as the store's code uses any connection (`Conn::Carried`).
#[derive(Clone)]
pub(crate) struct CarriedConn(pub(crate) Arc<CarriedLink>);

impl ConnectionLike for CarriedConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let replies = self.0.request(&cmd.get_packed_command(), 1);
        Box::pin(async move { replies.await.map(|mut v| v.remove(0)) })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let replies = self.0.request(&cmd.get_packed_pipeline(), offset + count);
        Box::pin(async move { replies.await.map(|mut v| v.split_off(offset)) })
    }

    fn get_db(&self) -> i64 {
        self.0.db
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link() -> CarriedLink {
        let client = redis::Client::open("redis://127.0.0.1:6379/2").expect("url");
        let target = Target::of(client.get_connection_info(), None, None).expect("a plain URL");
        CarriedLink::of(&target)
    }

    #[test]
    fn a_reply_is_framed_only_when_all_of_it_is_there() {
        let whole = b"*3\r\n$3\r\nabc\r\n:7\r\n*2\r\n+OK\r\n$-1\r\n";
        for cut in 0..whole.len() {
            assert_eq!(frame(&whole[..cut], 0), Ok(None), "cut at {cut}");
        }
        assert_eq!(frame(whole, 0), Ok(Some(whole.len())));
        assert_eq!(frame(b"-ERR no\r\n:1\r\n", 0), Ok(Some(9)));
        assert_eq!(frame(b"*-1\r\n", 0), Ok(Some(5)));
        assert!(frame(b"?x\r\n", 0).is_err());
        assert!(frame(b"$x\r\n", 0).is_err());
        assert!(
            frame(b"$18446744073709551615\r\n", 0).is_err(),
            "no overflow"
        );
    }

    #[test]
    fn replies_complete_commands_in_order_across_reads_and_the_setup_goes_first() {
        let link = link();
        assert!(!link.is_up());
        link.connected();
        let select = link.take_output().expect("the setup");
        assert_eq!(select, redis::cmd("SELECT").arg(2).get_packed_command());
        let link = Arc::new(link);
        let mut conn = CarriedConn(Arc::clone(&link));
        let ping = redis::cmd("PING");
        let mut first = link.request(&ping.get_packed_command(), 1);
        let mut pipe = redis::pipe();
        pipe.cmd("GET").arg("a").cmd("GET").arg("b");
        let mut second = conn.req_packed_commands(&pipe, 1, 1);
        assert_eq!(link.outstanding(), 3);
        let mut cx = Context::from_waker(Waker::noop());
        assert!(first.as_mut().poll(&mut cx).is_pending());
        link.input(b"+OK\r\n+PO").unwrap();
        assert!(first.as_mut().poll(&mut cx).is_pending());
        link.input(b"NG\r\n$1\r\nx\r\n$").unwrap();
        match first.as_mut().poll(&mut cx) {
            Poll::Ready(Ok(v)) => assert_eq!(v, vec![Value::SimpleString("PONG".into())]),
            other => panic!("{other:?}"),
        }
        assert!(second.as_mut().poll(&mut cx).is_pending());
        link.input(b"-1\r\n").unwrap();
        match second.as_mut().poll(&mut cx) {
            Poll::Ready(Ok(v)) => assert_eq!(v, vec![Value::Nil], "the pipeline's last reply"),
            other => panic!("{other:?}"),
        }
        assert_eq!(link.outstanding(), 0);
    }

    #[test]
    fn a_lost_connection_fails_what_waits_and_a_refused_setup_or_stray_reply_breaks_the_link() {
        let link = Arc::new(link());
        link.connected();
        let mut waiting = link.request(b"PING\r\n", 1);
        assert!(link.take_output().is_some(), "the loop takes it to write");
        let mut queued = link.request(b"PING\r\n", 1);
        link.broken("reset by peer");
        assert!(!link.is_up());
        let mut cx = Context::from_waker(Waker::noop());
        let class = |e: &RedisError| crate::error::classify(e, "ping");
        match waiting.as_mut().poll(&mut cx) {
            Poll::Ready(Err(e)) => assert!(
                matches!(class(&e), StoreError::Indeterminate(_)),
                "a written command may have run: {e}"
            ),
            other => panic!("{other:?}"),
        }
        match queued.as_mut().poll(&mut cx) {
            Poll::Ready(Err(e)) => assert!(
                matches!(class(&e), StoreError::Unavailable(_)),
                "one never handed to the loop did not: {e}"
            ),
            other => panic!("{other:?}"),
        }
        let mut refused = link.request(b"PING\r\n", 1);
        match refused.as_mut().poll(&mut cx) {
            Poll::Ready(Err(e)) => assert!(
                matches!(class(&e), StoreError::Unavailable(_)),
                "nothing is sent on a link that is down: {e}"
            ),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            link.take_output(),
            None,
            "nothing is queued on a link that is down"
        );

        link.connected();
        let mut after = link.request(b"PING\r\n", 1);
        let why = link.input(b"-ERR invalid DB index\r\n").unwrap_err();
        assert!(why.contains("setup"), "{why}");
        assert!(matches!(after.as_mut().poll(&mut cx), Poll::Ready(Err(_))));

        link.connected();
        link.input(b"+OK\r\n").unwrap();
        assert!(link.input(b"+OK\r\n").is_err(), "a reply nobody asked for");
        assert!(!link.is_up());
    }
}

//! One proxied MCP session, independent of the transport: frames from the client and from the
//! server go in, frames for each side come out of two channels. Everything but `tools/call`
//! passes through as it came; `tools/list` answers are read on the way to learn the tools; a
//! client and a server of different protocol eras are translated for each other.
//!
//! A session owns four parts, each from a room of its own, and is what joins them:
//!
//! - the [`Judge`]: the engine, the configuration, whose calls these are;
//! - the [`Tools`]: what the server said of its tools;
//! - the [`Handshake`]: the eras of the two sides, and the client's frames held while they are
//!   learned;
//! - the [`Peer`]: the link with the server, its requests waiting for answers.
//!
//! Its own files follow a frame's way: [`client`] (frames from the client, routed by the eras),
//! [`server`] (frames from the server, to their requests or to the client), [`call`] (one
//! `tools/call`, from the gate's reading to the engine's answer).

mod call;
mod client;
mod server;
#[cfg(test)]
mod tests;

use std::future::Future;
use std::sync::{Arc, Mutex};

use idemgate_core::{Engine, Store, TenantId};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::config::Config;
use crate::gate::judge::Judge;
use crate::gate::tools::Tools;
use crate::gate::CarriedKey;
use crate::handshake::Handshake;
use crate::peer::{Outgoing, Peer};
use crate::sync::lock;
use crate::wire::mirror::ParamHeaders;

/// One MCP session through the proxy.
pub struct Session<S> {
    inner: Arc<Inner<S>>,
}

/// What a session owns; shared with the tasks it runs.
struct Inner<S> {
    judge: Judge<S>,
    tools: Tools,
    handshake: Handshake,
    peer: Peer,
    to_client: mpsc::UnboundedSender<String>,
    /// The tasks the session runs: judged calls, task requests across the eras, and the opening
    /// that learns the eras.
    tasks: Mutex<JoinSet<()>>,
}

/// The two channels a transport drains: frames for the client and frames for the server.
#[derive(Debug)]
pub struct Outputs {
    /// Frames for the client, without newline.
    pub to_client: mpsc::UnboundedReceiver<String>,
    /// Frames for the server.
    pub to_server: mpsc::UnboundedReceiver<Outgoing>,
}

impl<S: Store> Session<S> {
    /// A session of `server` (its name in record names) for `tenant`: one client's.
    pub fn new(
        engine: Arc<Engine<S>>,
        config: Config,
        server: String,
        tenant: TenantId,
    ) -> (Self, Outputs) {
        Self::open(engine, config, server, tenant, false)
    }

    /// The session that sessionless (MCP 2026-07-28) requests of every client of `tenant`
    /// share: it has no scope of its own, so a request that names no conversation is a scope
    /// of its own (a model's key and the window never join two clients' calls).
    pub fn shared(
        engine: Arc<Engine<S>>,
        config: Config,
        server: String,
        tenant: TenantId,
    ) -> (Self, Outputs) {
        Self::open(engine, config, server, tenant, true)
    }

    fn open(
        engine: Arc<Engine<S>>,
        config: Config,
        server: String,
        tenant: TenantId,
        shared: bool,
    ) -> (Self, Outputs) {
        let (to_client, client_rx) = mpsc::unbounded_channel();
        let (to_server, server_rx) = mpsc::unbounded_channel();
        let inner = Arc::new(Inner {
            judge: Judge::new(engine, config, server, tenant, shared),
            tools: Tools::new(),
            handshake: Handshake::new(),
            peer: Peer::new(to_server),
            to_client,
            tasks: Mutex::new(JoinSet::new()),
        });
        let outputs = Outputs {
            to_client: client_rx,
            to_server: server_rx,
        };
        (Session { inner }, outputs)
    }

    /// What the session knows of the tool parameters mirrored in headers: the HTTP transport
    /// checks sessionless requests by it.
    pub(crate) fn param_headers(&self) -> Arc<Mutex<ParamHeaders>> {
        self.inner.tools.param_headers()
    }

    /// A frame from the client. `tools/call` requests are judged in a task of their own; a
    /// cancellation of a write in flight is held back unless configured; the rest goes on.
    pub fn from_client(&self, line: String) {
        self.from_client_keyed(line, None);
    }

    /// A frame from the client, with the key its transport carried beside it (the
    /// `Idempotency-Key` header of Streamable HTTP), which a `tools/call` uses before any key
    /// of its own: a different key in the frame itself is refused.
    pub fn from_client_keyed(&self, line: String, key: CarriedKey) {
        self.inner.client_frame(line, key);
    }

    /// A frame from the server: answers to the proxy's requests go to their callers; everything
    /// else goes to the client as it came.
    pub fn from_server(&self, line: String) {
        self.inner.server_frame(line);
    }

    /// The server is gone: every request waiting on it learns so, and later calls are not sent.
    pub fn server_closed(&self, why: &str) {
        self.inner.peer.closed(why);
    }

    /// Waits until every call taken so far has been answered (and its outcome recorded).
    pub async fn drain(&self) {
        loop {
            let mut tasks = std::mem::take(&mut *lock(&self.inner.tasks));
            if tasks.is_empty() {
                return;
            }
            while tasks.join_next().await.is_some() {}
        }
    }
}

impl<S> Inner<S> {
    fn send_client(&self, frame: String) {
        let _ = self.to_client.send(frame);
    }

    /// Runs `task` as one of the session's tasks, which [`Session::drain`] waits for.
    fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        let mut tasks = lock(&self.tasks);
        // Finished tasks are reaped as new ones come, so a long session stays small.
        while tasks.try_join_next().is_some() {}
        tasks.spawn(task);
    }
}

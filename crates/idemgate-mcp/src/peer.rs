//! The peer: the proxy's side of the link with the server. The frames it sends (the client's,
//! and requests of its own under ids the client never uses), what became of each request that
//! waits for an answer (the answer, or why none will come), and the writes in flight.
//!
//! It is a room apart because the handshake, the gate and the session all send the server
//! requests and wait for answers, and none of them should know how the waiting is kept. What an
//! answer means for a tool's side effect is the gate's to say, not the peer's.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use serde_json::value::RawValue;
use tokio::sync::{mpsc, oneshot};

use crate::sync::lock;
use crate::wire::era;
use crate::wire::frame::{self, Frame, Object};

/// A frame for the server, with a way to learn whether it was written.
#[derive(Debug)]
pub struct Outgoing {
    /// The frame, without its newline.
    pub frame: String,
    /// Told whether the frame was written, when somebody waits for that.
    pub sent: Option<oneshot::Sender<std::io::Result<()>>>,
}

/// What became of a request the proxy sent to the server.
#[derive(Debug)]
pub(crate) enum Reply {
    /// The server answered with this frame.
    Answer {
        frame: String,
        result: Option<Box<RawValue>>,
        error: Option<Box<RawValue>>,
    },
    /// No answer will come: the server closed, or did not answer in time.
    Closed(String),
}

/// What became of a call the proxy forwarded ([`Peer::forward`]).
#[derive(Debug)]
pub(crate) enum Forwarded {
    /// It never reached the server's input, for this reason: nothing can have happened.
    NotSent(String),
    /// It was sent, and this is what came of it; `refused` names a request of the server's that
    /// the proxy refused while the call was in flight ([`Peer::refused`]).
    Sent {
        reply: Reply,
        refused: Option<String>,
    },
}

/// Whose an answer from the server is ([`Peer::claim`]).
pub(crate) enum Claim {
    /// A request of the proxy's own, or a call it forwards: tell this.
    Waiting(oneshot::Sender<Reply>),
    /// A request the proxy stopped waiting for: the late answer is dropped.
    Abandoned,
    /// None of the proxy's: the answer is the client's.
    Client,
}

#[derive(Debug, Default)]
struct Pending {
    /// Requests sent to the server, by id, with whom to tell.
    waiting: HashMap<String, oneshot::Sender<Reply>>,
    /// Requests answered already without the server (timed out): their late answers are dropped.
    abandoned: HashSet<String>,
    /// Why the server is gone, once it is.
    closed: Option<String>,
}

/// The link with the server, as one session holds it.
pub(crate) struct Peer {
    to_server: mpsc::UnboundedSender<Outgoing>,
    pending: Mutex<Pending>,
    next_id: AtomicU64,
    /// Ids of writes sent to the server and not answered yet (their cancellations are held).
    writes: Mutex<HashSet<String>>,
    /// Writes in flight while the proxy refused one of the server's requests (a modern client
    /// takes none), with the method refused: a failure they answer may be the proxy's doing,
    /// so it is never stored as what the tool did ([`Forwarded::Sent`]).
    refused_during: Mutex<HashMap<String, String>>,
    /// The envelope every legacy request gets on its way to a modern server, once the handshake
    /// found a legacy client in front of one ([`Peer::upgrade`]).
    envelope: OnceLock<Object>,
}

impl Peer {
    /// The link that writes the server's frames into `to_server`.
    pub(crate) fn new(to_server: mpsc::UnboundedSender<Outgoing>) -> Self {
        Peer {
            to_server,
            pending: Mutex::new(Pending::default()),
            next_id: AtomicU64::new(1),
            writes: Mutex::new(HashSet::new()),
            refused_during: Mutex::new(HashMap::new()),
            envelope: OnceLock::new(),
        }
    }

    /// From now on, a legacy client's requests go to the (modern) server with `envelope`: the
    /// one the client's `initialize` implied.
    pub(crate) fn upgrade(&self, envelope: Object) {
        let _ = self.envelope.set(envelope);
    }

    /// A request for the server as the server's era needs it: a legacy client's request to a
    /// modern server gets the envelope the client's `initialize` implied.
    fn to_upstream(&self, frame: String) -> String {
        let Some(envelope) = self.envelope.get() else {
            return frame;
        };
        // A request the proxy already put in the modern era's words (a task request, whose
        // envelope declares the tasks extension) keeps its own envelope.
        let legacy_request = Frame::parse(&frame).is_some_and(|f| {
            f.method.is_some()
                && f.id.is_some()
                && era::modern_version_of(f.params.as_deref()).is_none()
        });
        if !legacy_request {
            return frame;
        }
        era::with_envelope(&frame, envelope).unwrap_or(frame)
    }

    /// Sends a frame to the server, nobody waiting to learn whether it was written.
    pub(crate) fn send(&self, frame: String) {
        let frame = self.to_upstream(frame);
        let _ = self.to_server.send(Outgoing { frame, sent: None });
    }

    /// Whose the server's answer to the request `id` is; a waiting request stops waiting.
    pub(crate) fn claim(&self, id: &str) -> Claim {
        let mut pending = lock(&self.pending);
        if let Some(tx) = pending.waiting.remove(id) {
            return Claim::Waiting(tx);
        }
        if pending.abandoned.remove(id) {
            return Claim::Abandoned;
        }
        Claim::Client
    }

    /// The server is gone: every request waiting on it learns so, and later ones are not sent.
    pub(crate) fn closed(&self, why: &str) {
        let waiting = {
            let mut pending = lock(&self.pending);
            pending.closed = Some(why.to_owned());
            std::mem::take(&mut pending.waiting)
        };
        for (_, tx) in waiting {
            let _ = tx.send(Reply::Closed(why.to_owned()));
        }
    }

    /// Whether the request `id` is a write sent to the server and not answered yet.
    pub(crate) fn writing(&self, id: &str) -> bool {
        lock(&self.writes).contains(id)
    }

    /// The proxy refused the server's request `method`: every write in flight learns that it
    /// did, for what its failure may mean.
    pub(crate) fn refused(&self, method: &str) {
        let writes: Vec<String> = lock(&self.writes).iter().cloned().collect();
        lock(&self.refused_during).extend(writes.into_iter().map(|w| (w, method.to_owned())));
    }

    /// Waits for the answer to the request `id` from now on; the reason the server is gone
    /// instead, when it is.
    fn expect(&self, id: &str) -> Result<oneshot::Receiver<Reply>, String> {
        let (tx, rx) = oneshot::channel();
        let mut pending = lock(&self.pending);
        if let Some(why) = &pending.closed {
            return Err(why.clone());
        }
        pending.waiting.insert(id.to_owned(), tx);
        Ok(rx)
    }

    /// Stops waiting for the answer to `id`, which came too late: it is dropped if it comes.
    fn abandon(&self, id: String) {
        let mut pending = lock(&self.pending);
        pending.waiting.remove(&id);
        pending.abandoned.insert(id);
    }

    /// Sends a call (`frame`, whose id is `id`; a write when `write`) to the server and waits
    /// for its answer, at most `timeout`.
    pub(crate) async fn forward(
        &self,
        id: String,
        frame: String,
        write: bool,
        timeout: Duration,
    ) -> Forwarded {
        let rx = match self.expect(&id) {
            Ok(rx) => rx,
            Err(why) => return Forwarded::NotSent(format!("the server is not running ({why})")),
        };
        if write {
            lock(&self.writes).insert(id.clone());
        }
        let (sent_tx, sent_rx) = oneshot::channel();
        let _ = self.to_server.send(Outgoing {
            frame: self.to_upstream(frame),
            sent: Some(sent_tx),
        });
        let sent = sent_rx
            .await
            .unwrap_or_else(|_| Err(std::io::Error::other("the server's input is closed")));
        let reply = match sent {
            // The frame never reached the server's input: nothing can have happened.
            Err(e) => {
                lock(&self.pending).waiting.remove(&id);
                lock(&self.writes).remove(&id);
                return Forwarded::NotSent(format!("failed to send the call to the server: {e}"));
            }
            Ok(()) => match tokio::time::timeout(timeout, rx).await {
                Ok(Ok(reply)) => reply,
                Ok(Err(_)) => Reply::Closed("the proxy lost track of the call".to_owned()),
                Err(_) => {
                    self.abandon(id.clone());
                    Reply::Closed(format!(
                        "the server did not answer within {}",
                        humantime::format_duration(timeout)
                    ))
                }
            },
        };
        lock(&self.writes).remove(&id);
        let refused = lock(&self.refused_during).remove(&id);
        Forwarded::Sent { reply, refused }
    }

    /// Sends a request of the proxy's own (an id the client never uses) and waits for its
    /// answer; see [`Peer::ask_frame`].
    pub(crate) async fn ask(
        &self,
        method: &str,
        params: serde_json::Value,
        timeout: Duration,
    ) -> Option<Reply> {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let id = format!("dev.idemgate/{method}-{n}");
        let request =
            serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.ask_frame(
            frame::id_key(&frame::raw(&id)),
            request.to_string(),
            timeout,
        )
        .await
    }

    /// Sends the request `frame` whose id is `key` and waits for its answer, which goes to the
    /// proxy, not the client: `Reply::Closed` when the server is gone, `None` when no answer came
    /// within `timeout` (a late one is dropped).
    pub(crate) async fn ask_frame(
        &self,
        key: String,
        frame: String,
        timeout: Duration,
    ) -> Option<Reply> {
        let rx = match self.expect(&key) {
            Ok(rx) => rx,
            Err(why) => return Some(Reply::Closed(why)),
        };
        self.send(frame);
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(reply)) => Some(reply),
            Ok(Err(_)) => Some(Reply::Closed(
                "the proxy lost track of its request".to_owned(),
            )),
            Err(_) => {
                self.abandon(key);
                None
            }
        }
    }
}

//! Frames from the client: held while the eras are learned, routed by them once they are
//! known ([`Handshake::route`](crate::handshake::Handshake::route)), then relayed as every era
//! relays them: `tools/call` judged in a task of its own, the rest on to the server.

use std::sync::Arc;

use idemgate_core::Store;

use super::Inner;
use crate::gate::CarriedKey;
use crate::handshake::open::{self, Era};
use crate::handshake::{Admitted, Route};
use crate::wire::frame::{self, Frame};

impl<S: Store> Inner<S> {
    /// A frame from the client. Until the eras are known, the frame that decides them (a
    /// legacy `initialize`, or a modern client's first request) starts the opening that learns
    /// them, and later frames wait for it, in order; then frames go to [`Inner::dispatch`].
    pub(super) fn client_frame(self: &Arc<Self>, line: String, key: CarriedKey) {
        let Some(f) = Frame::parse(&line) else {
            self.refuse_unreadable(&line);
            return;
        };
        if self.handshake.same_era() {
            self.relay(line, f, key);
            return;
        }
        match self.handshake.admit(line, f, key) {
            Admitted::Now(line, f, key) => self.dispatch(line, f, key),
            Admitted::Held => {}
            Admitted::Opens(opening) => {
                let inner = Arc::clone(self);
                self.spawn(async move {
                    let opened = open::open(&inner.peer, opening).await;
                    if let Some(answer) = opened.answer {
                        inner.send_client(answer);
                    }
                    inner.release(opened.era);
                });
            }
        }
    }

    /// Text from the client that is not one JSON-RPC message: never relayed (the server could
    /// read a tool call in it that the proxy did not judge); the client is told why.
    fn refuse_unreadable(&self, line: &str) {
        tracing::warn!("refused a client message that is not one JSON-RPC message");
        if let Some(answer) = frame::refusal_of_unreadable(line) {
            self.send_client(answer);
        }
    }

    /// Settles the eras and lets the held frames go, in the order they came (frames that come
    /// while they go wait behind them).
    fn release(self: &Arc<Self>, era: Era) {
        self.handshake.settle(era, &self.peer);
        while let Some(batch) = self.handshake.next_held() {
            for (line, key) in batch {
                match Frame::parse(&line) {
                    Some(f) => self.dispatch(line, f, key),
                    None => self.refuse_unreadable(&line),
                }
            }
        }
    }

    /// A client frame once the eras are known: what the eras change, then [`Inner::relay`].
    fn dispatch(self: &Arc<Self>, line: String, f: Frame, key: CarriedKey) {
        match self.handshake.route(&f) {
            Route::Relay => self.relay(line, f, key),
            Route::Answer(answer) => self.send_client(answer),
            Route::Swallow => {}
            Route::Task(request) => {
                let inner = Arc::clone(self);
                self.spawn(async move {
                    let answer = request.answer(&inner.peer).await;
                    inner.send_client(answer);
                });
            }
        }
    }

    /// A client frame as every era relays it: `tools/call` judged in a task of its own, a
    /// cancellation of a write in flight held back unless configured, the rest on to the server.
    fn relay(self: &Arc<Self>, line: String, f: Frame, key: CarriedKey) {
        match (f.method.as_deref(), f.id) {
            (Some("tools/call"), Some(id)) => {
                let inner = Arc::clone(self);
                let params = f.params;
                self.spawn(async move {
                    let answer = inner.call(&id, line, params.as_deref(), key).await;
                    inner.send_client(answer);
                });
            }
            // A tool call without an id would run with no answer to store or replay: it is
            // never sent (a notification gets no answer, so the client is not told).
            (Some("tools/call"), None) => {
                tracing::warn!("dropped a tools/call without an id: it cannot be judged");
            }
            (Some("tools/list"), Some(id)) => {
                self.tools.listed_by_client(frame::id_key(&id));
                self.peer.send(line);
            }
            (Some("notifications/cancelled"), None) if !self.judge.config().forward_cancel => {
                let request = f
                    .params
                    .as_deref()
                    .and_then(frame::object)
                    .and_then(|p| p.get("requestId").map(|id| frame::id_key(id)));
                // A started write runs to its end, so that its outcome is stored and the retry
                // that follows replays it instead of finding it unknown.
                if request.is_some_and(|r| self.peer.writing(&r)) {
                    tracing::info!("held back the cancellation of a write in flight");
                    return;
                }
                self.peer.send(line);
            }
            _ => self.peer.send(line),
        }
    }
}

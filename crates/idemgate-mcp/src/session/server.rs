//! Frames from the server: answers to the proxy's own requests go to whoever waits for them,
//! `tools/list` answers teach the session the tools on their way, a modern client's requests
//! get what a modern result has, and requests of the server's own are answered by the proxy
//! when the client takes none.

use idemgate_core::{Store, ToolKind};
use serde_json::value::RawValue;

use super::Inner;
use crate::peer::{Claim, Reply};
use crate::wire::frame::{self, Frame};

impl<S: Store> Inner<S> {
    /// A frame from the server: answers to the proxy's requests go to their callers; everything
    /// else goes to the client as it came.
    pub(super) fn server_frame(&self, mut line: String) {
        let frame = Frame::parse(&line);
        if frame
            .as_ref()
            .is_some_and(|f| f.method.as_deref() == Some("notifications/tools/list_changed"))
        {
            self.tools.changed();
        }
        if let Some(Frame {
            method: Some(method),
            id: Some(id),
            ..
        }) = &frame
        {
            if self.answers_for_a_modern_client(method, id) {
                return;
            }
        }
        if let Some(f) = frame.filter(Frame::is_response) {
            let id = frame::id_key(f.id.as_deref().expect("responses have ids"));
            line = self.handshake.answer_for_client(&id, line);
            match self.peer.claim(&id) {
                Claim::Waiting(tx) => {
                    let _ = tx.send(Reply::Answer {
                        frame: line,
                        result: f.result,
                        error: f.error,
                    });
                    return;
                }
                Claim::Abandoned => return,
                Claim::Client => {
                    if self.tools.answered(&id, f.result.as_deref()) {
                        line = self.listing_for_client(line);
                    }
                }
            }
        }
        self.send_client(line);
    }

    /// The server's answer `line` to the client's `tools/list`, with the model's
    /// `idempotency_key` offered by every write the proxy gates that declares no key of its own.
    fn listing_for_client(&self, line: String) -> String {
        let result = Frame::parse(&line).and_then(|f| Some((f.id?, f.result?)));
        let Some((id, result)) = result else {
            return line;
        };
        let config = self.judge.config();
        // A commerce binding's own tools carry their key in its place (`meta`): the model is not
        // offered another for them.
        match self.tools.shown(&result, |name, tool| {
            !config.profile.is_some_and(|p| p.binds(name))
                && config.policy(name, tool).kind == ToolKind::Write
        }) {
            Some(shown) => frame::response(&id, &shown),
            None => line,
        }
    }

    /// A request of the server's own (sampling, elicitation, roots, ping) when the client is a
    /// modern one in front of a legacy server, which takes none
    /// ([`Handshake::client_takes_no_server_requests`](crate::handshake::Handshake::client_takes_no_server_requests)).
    /// The proxy answers as a legacy client without the capability would: `ping` with an empty
    /// result, anything else with -32601; the writes in flight learn that it did
    /// ([`Peer::refused`](crate::peer::Peer::refused)). Whether it answered.
    fn answers_for_a_modern_client(&self, method: &str, id: &RawValue) -> bool {
        if !self.handshake.client_takes_no_server_requests() {
            return false;
        }
        if method == "ping" {
            self.peer
                .send(frame::response(id, &frame::raw(&serde_json::json!({}))));
            return true;
        }
        tracing::info!(%method, "refused a server request: the client speaks the 2026-07-28 era, which takes none");
        self.peer.refused(method);
        self.peer.send(frame::error_response(
            Some(id),
            -32601,
            &format!(
                "{method}: the client speaks MCP 2026-07-28, which takes no requests from a server"
            ),
        ));
        true
    }
}

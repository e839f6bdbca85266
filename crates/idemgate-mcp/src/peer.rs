//! The peer: the proxy's side of the link with the server. The frames it sends (the client's,
//! and requests of its own under ids the client never uses), and what became of each request
//! that waits for an answer: the answer, or why none will come.
//!
//! It is a room apart because the handshake, the gate and the session all send the server
//! requests and wait for answers, and none of them should know how the waiting is kept.

use std::collections::{HashMap, HashSet};

use idemgate_core::Effect;
use idemgate_kit::Payload;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::sync::oneshot;

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

impl Reply {
    /// What the answer says about the side effect.
    pub(crate) fn effect(&self) -> Effect {
        #[derive(Deserialize)]
        struct Shape {
            #[serde(rename = "isError", default)]
            is_error: bool,
            #[serde(rename = "resultType", default)]
            result_type: Option<String>,
        }
        match self {
            Reply::Answer {
                result: Some(r), ..
            } => {
                let shape = serde_json::from_str::<Shape>(r.get()).ok();
                // A 2026-era interim answer: the tool asks for input before it acts. It is never
                // stored; the key is released so that the continuation (the same call with
                // `inputResponses`/`requestState`, which are not part of the fingerprint) runs
                // under the same key and its final result is the one stored.
                if shape
                    .as_ref()
                    .and_then(|s| s.result_type.as_deref())
                    .is_some_and(|t| t == "input_required")
                {
                    return Effect::not_applied("the tool asked for input before acting");
                }
                let failed = shape.is_some_and(|s| s.is_error);
                let body = Payload::McpToolResult(r.clone()).encode();
                if failed {
                    Effect::Failed(body)
                } else {
                    Effect::Success(body)
                }
            }
            // A JSON-RPC error does not prove that nothing happened: servers of the TypeScript
            // SDK answer some failures after acting, and others raise errors midway (issue 9).
            Reply::Answer { error: Some(e), .. } => Effect::Ambiguous(format!(
                "the server answered with a JSON-RPC error {}",
                e.get()
            )),
            Reply::Answer { .. } => {
                Effect::Ambiguous("the server's answer had neither result nor error".to_owned())
            }
            Reply::Closed(why) => Effect::Ambiguous(why.clone()),
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct Pending {
    /// Requests sent to the server, by id, with whom to tell.
    pub(crate) waiting: HashMap<String, oneshot::Sender<Reply>>,
    /// Requests answered already without the server (timed out): their late answers are dropped.
    pub(crate) abandoned: HashSet<String>,
    /// Why the server is gone, once it is.
    pub(crate) closed: Option<String>,
}

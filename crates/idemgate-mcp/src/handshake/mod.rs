//! The handshake: how a session learns the protocol eras of its two sides ([`crate::wire::era`])
//! and what it does differently when they differ. The client's first request tells the proxy
//! the client's era, and its answer (or a probe of the proxy's own) the server's
//! ([`open`]). Until both are known, the client's later frames wait, in order. When they differ,
//! the proxy holds the handshake the other side lacks (an `initialize` of its own for a legacy
//! server, or a `server/discover` for a modern one) and translates what must be translated for
//! each request ([`Handshake::route`], [`tasks`]); when they agree, frames pass as they came.
//!
//! It is a room apart from the session because it is one of the things a session owns, with
//! state of its own (the eras, the held frames), and apart from the gate because the eras
//! concern every request, not only calls. It imports the peer to ask the server, and the gate
//! only for the words of a call (its carried key, its tool's task support).

pub(crate) mod open;
pub(crate) mod tasks;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use serde_json::value::RawValue;

use self::open::{Era, Open};
use self::tasks::TaskRequest;
use crate::gate::catalog::TaskSupport;
use crate::gate::CarriedKey;
use crate::peer::Peer;
use crate::sync::lock;
use crate::wire::era;
use crate::wire::frame::{self, Frame, Object};

/// The era, and the client's frames held while the proxy learns it.
#[derive(Debug)]
struct Eras {
    era: Era,
    /// While the era is being learned: the client's frames that came meanwhile, in order.
    held: Option<VecDeque<(String, CarriedKey)>>,
}

/// The client frames held while the eras were learned, to go on in order.
pub(crate) type Held = VecDeque<(String, CarriedKey)>;

/// What becomes of a client frame before the eras are settled ([`Handshake::admit`]).
pub(crate) enum Admitted {
    /// It goes on now, to [`Handshake::route`].
    Now(String, Frame, CarriedKey),
    /// It waits for the eras, behind the frames that came before it.
    Held,
    /// It opens the session: the eras are learned from it ([`open::open`]), and the frames that
    /// come meanwhile are held.
    Opens(Open),
}

/// What the eras make of a client frame once they are known ([`Handshake::route`]).
pub(crate) enum Route {
    /// The proxy answers it itself, with this frame for the client.
    Answer(String),
    /// The proxy answers it from requests of its own in the other era's words.
    Task(TaskRequest),
    /// The proxy swallows it: the server has had it already, or has no such thing.
    Swallow,
    /// It goes on as every era relays a frame.
    Relay,
}

/// The eras of one session's two sides, as far as they are known.
pub(crate) struct Handshake {
    eras: Mutex<Eras>,
    /// Set once the eras are settled as the same and no frame is held: from then on frames pass
    /// without a look at the eras (the common case costs an atomic load, not three locks).
    same_era: AtomicBool,
    /// Ids of a modern client's requests (other than `tools/call`) sent to a legacy server and
    /// not answered yet, with whether their method's result is cacheable: their results get
    /// what a modern result has ([`era::completed_response`]).
    modern_ids: Mutex<HashMap<String, bool>>,
}

impl Handshake {
    /// Nothing known yet.
    pub(crate) fn new() -> Self {
        Handshake {
            eras: Mutex::new(Eras {
                era: Era::Unknown,
                held: None,
            }),
            same_era: AtomicBool::new(false),
            modern_ids: Mutex::new(HashMap::new()),
        }
    }

    /// Whether both sides are known to speak the same era, and no frame is held: frames pass.
    pub(crate) fn same_era(&self) -> bool {
        self.same_era.load(Ordering::Acquire)
    }

    /// A client frame while the eras may not be settled: the frame that decides them (a legacy
    /// `initialize`, or a modern client's first request) opens the session, and later frames
    /// wait for it, in order.
    pub(crate) fn admit(&self, line: String, f: Frame, key: CarriedKey) -> Admitted {
        let mut eras = lock(&self.eras);
        if let Some(held) = &mut eras.held {
            held.push_back((line, key));
            return Admitted::Held;
        }
        if !matches!(eras.era, Era::Unknown) {
            return Admitted::Now(line, f, key);
        }
        let Some(opening) = open::opening(&f) else {
            return Admitted::Now(line, f, key);
        };
        let (open, first) = Open::new(opening, line, f, key);
        eras.held = Some(first.into_iter().collect());
        Admitted::Opens(open)
    }

    /// Settles the eras as `era`; the peer learns the envelope of a legacy client before a
    /// modern server.
    pub(crate) fn settle(&self, era: Era, peer: &Peer) {
        tracing::debug!(?era, "protocol eras settled");
        if let Era::Upgraded { envelope } = &era {
            peer.upgrade(envelope.clone());
        }
        lock(&self.eras).era = era;
    }

    /// The frames held while the eras were learned, the next batch of them (frames that come
    /// while a batch goes wait behind it); `None` once none is left, and from then on frames
    /// are no longer held.
    pub(crate) fn next_held(&self) -> Option<Held> {
        let mut eras = lock(&self.eras);
        match eras.held.as_mut() {
            Some(held) if !held.is_empty() => Some(std::mem::take(held)),
            _ => {
                eras.held = None;
                if matches!(eras.era, Era::Same) {
                    self.same_era.store(true, Ordering::Release);
                }
                None
            }
        }
    }

    /// What the eras make of a client frame once they are known.
    pub(crate) fn route(&self, f: &Frame) -> Route {
        let method = f.method.as_deref();
        let mut eras = lock(&self.eras);
        match (&eras.era, method, f.id.as_deref()) {
            // A modern client before a legacy server: the proxy holds the handshake.
            (Era::Legacy { initialized }, Some("server/discover"), Some(id)) => {
                let params = f
                    .params
                    .as_deref()
                    .and_then(frame::object)
                    .unwrap_or_default();
                Route::Answer(open::discovered(id, &params, initialized))
            }
            // The tasks extension's words for a legacy server's tasks.
            (Era::Legacy { .. }, Some(m @ ("tasks/get" | "tasks/cancel")), Some(id))
                if era::modern_version_of(f.params.as_deref()).is_some() =>
            {
                Route::Task(TaskRequest::modern(id, m, f.params.clone()))
            }
            // A legacy client's task requests before a server of the tasks extension.
            (
                Era::Upgraded { envelope },
                Some(m @ ("tasks/get" | "tasks/result" | "tasks/cancel" | "tasks/list")),
                Some(id),
            ) => Route::Task(TaskRequest::legacy(
                id,
                m,
                f.params.clone(),
                era::with_tasks_extension(envelope),
            )),
            // The client fell back to a handshake the proxy already made: from now on it is
            // a legacy client, which takes the server's requests.
            (Era::Legacy { initialized }, Some("initialize"), Some(id)) => {
                let answer = frame::response(id, initialized);
                eras.era = Era::FellBack;
                Route::Answer(answer)
            }
            (Era::FellBack, Some("notifications/initialized"), None) => {
                eras.era = Era::Same;
                self.same_era.store(true, Ordering::Release);
                Route::Swallow
            }
            (
                Era::Legacy { .. } | Era::Upgraded { .. },
                Some("notifications/initialized"),
                None,
            ) => Route::Swallow,
            (Era::Legacy { .. }, Some(m), Some(id))
                if m != "tools/call" && era::modern_version_of(f.params.as_deref()).is_some() =>
            {
                lock(&self.modern_ids).insert(frame::id_key(id), era::is_cacheable(m));
                Route::Relay
            }
            // The modern era has no ping; the proxy answers it for a legacy client.
            (Era::Upgraded { .. }, Some("ping"), Some(id)) => {
                Route::Answer(frame::response(id, &frame::raw(&serde_json::json!({}))))
            }
            _ => Route::Relay,
        }
    }

    /// Whether the client is a modern one in front of a legacy server, which takes no requests
    /// from the server: that era has none (MCP 2026-07-28, "stdio" and "Streamable HTTP"), so
    /// its clients refuse them (the Python SDK) or never answer (the TypeScript SDK, and the
    /// server waits for ever). (A client that declares it takes such requests was kept in the
    /// legacy era: [`open::discovered`].)
    pub(crate) fn client_takes_no_server_requests(&self) -> bool {
        !self.same_era() && matches!(lock(&self.eras).era, Era::Legacy { .. })
    }

    /// The server's answer `line` to the request `id`, with what a modern result has when it
    /// answers a modern client's request to a legacy server.
    pub(crate) fn answer_for_client(&self, id: &str, line: String) -> String {
        match lock(&self.modern_ids).remove(id) {
            Some(cacheable) => era::completed_response(&line, cacheable).unwrap_or(line),
            None => line,
        }
    }

    /// A `tools/call` (`frame`, with `params`, request `id`, tool `name` whose task support is
    /// `support`) as the server's era takes it, or the answer that refuses it. A legacy server
    /// runs a tool as a task only when the call asks (2025-11-25 `params.task`); a modern client
    /// asks by declaring the tasks extension, and the handle the server answers goes back in the
    /// extension's words (`era::mark_complete`).
    pub(crate) fn call_frame(
        &self,
        id: &RawValue,
        name: &str,
        mut frame: String,
        params: &Object,
        result_type: bool,
        support: TaskSupport,
    ) -> Result<String, String> {
        let legacy_server = {
            let eras = lock(&self.eras);
            // A legacy client's task-augmented call before a modern server: the tasks
            // extension's request, and its handle back in the client's words (`answer::relayed`).
            if let Era::Upgraded { envelope } = &eras.era {
                if params.contains_key("task") {
                    frame = era::modern_task_call(&frame, envelope).unwrap_or(frame);
                }
            }
            result_type && matches!(eras.era, Era::Legacy { .. })
        };
        if legacy_server && support != TaskSupport::Forbidden {
            if era::takes_tasks(params) {
                frame = frame::with_param(&frame, "task", &frame::raw(&serde_json::json!({})))
                    .unwrap_or(frame);
            } else if support == TaskSupport::Required {
                return Err(era::missing_tasks_extension(id, name));
            }
        }
        Ok(frame)
    }
}

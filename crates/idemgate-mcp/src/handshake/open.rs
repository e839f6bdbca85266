//! Opening a session: learning the eras from how the client opened (a legacy `initialize`, or a
//! modern client's first request) and from how the server answers it, or a probe of the
//! proxy's own; answering the opening request when it is `initialize` or `server/discover`.
//! Apart from [`super`] because it is one task that runs once, before any frame of the client's
//! goes on, and holds no state: the [`Era`] it learns is what it returns, and what the session
//! keeps.

use std::time::Duration;

use serde_json::value::RawValue;

use crate::gate::CarriedKey;
use crate::peer::{Peer, Reply};
use crate::wire::era;
use crate::wire::frame::{self, Frame, Object};

/// How long the proxy waits for the answer to a `server/discover` probe before it takes the
/// server for a legacy one (as long as the Python SDK client waits for its own).
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the proxy waits for a legacy server to answer the `initialize` it sends itself (a
/// server started by `npx` may still be downloading).
const INITIALIZE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the proxy waits for the answer to a client's own `initialize`: as long as the client
/// does (a relay sets no deadline of its own; a server that exits ends the wait).
const CLIENT_INITIALIZE_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);

/// What the session knows of the protocol eras of its two sides (see [`crate::wire::era`]).
#[derive(Debug)]
pub(crate) enum Era {
    /// Nothing yet: frames pass as they came.
    Unknown,
    /// Both sides speak the same era (the server took the client's `initialize`, or answered a
    /// modern probe as a modern server): frames pass as they came.
    Same,
    /// A modern client in front of a legacy server, which the proxy initialized itself and which
    /// answered with this `initialize` result.
    Legacy { initialized: Box<RawValue> },
    /// A legacy client in front of a modern server: every request it sends gets this envelope.
    Upgraded { envelope: Object },
    /// A client that opened in the modern era and fell back to `initialize` (it was told the
    /// legacy server's requests reach it only there) after the proxy had initialized the server
    /// for it: frames pass as they came, but its `notifications/initialized` is not sent twice.
    FellBack,
}

/// How a client opened the session, when that decides the eras.
pub(crate) enum Opening {
    /// A legacy client: `initialize`.
    Initialize,
    /// A modern client's first request, with its envelope; `server/discover` or another.
    Modern { envelope: Object, discover: bool },
}

/// How a frame opens the session, when it is a request that decides the eras.
pub(crate) fn opening(f: &Frame) -> Option<Opening> {
    f.id.as_ref()?;
    let method = f.method.as_deref()?;
    if method == "initialize" {
        return Some(Opening::Initialize);
    }
    let params = f.params.as_deref().and_then(frame::object)?;
    Some(Opening::Modern {
        envelope: era::envelope(&params)?,
        discover: method == "server/discover",
    })
}

/// The request that opens a session, to learn the eras from ([`open`]).
pub(crate) struct Open {
    opening: Opening,
    id: Box<RawValue>,
    params: Option<Box<RawValue>>,
    /// The request itself when the opening answers it (`initialize`, `server/discover`).
    line: Option<String>,
}

/// What the opening learned: the era the session keeps, and the answer to the client's opening
/// request, when the proxy has one.
pub(crate) struct Opened {
    pub(crate) era: Era,
    pub(crate) answer: Option<String>,
}

impl Open {
    /// The opening of `f` (whose text is `line`), and the frame to hold first when it is not
    /// the opening's to answer: any other first request waits for the eras like the frames
    /// after it.
    pub(crate) fn new(
        opening: Opening,
        line: String,
        f: Frame,
        key: CarriedKey,
    ) -> (Self, Option<(String, CarriedKey)>) {
        let id = f.id.expect("an opening is a request");
        let (line, first) = match &opening {
            Opening::Initialize | Opening::Modern { discover: true, .. } => (Some(line), None),
            Opening::Modern { .. } => (None, Some((line, key))),
        };
        let open = Open {
            opening,
            id,
            params: f.params,
            line,
        };
        (open, first)
    }
}

/// Learns the eras from how the client opened: answers the opening request when it is
/// `initialize` or `server/discover`, and returns the era the session keeps.
pub(crate) async fn open(peer: &Peer, open: Open) -> Opened {
    let Open {
        opening,
        id,
        params,
        line,
    } = open;
    let params = params
        .as_deref()
        .and_then(frame::object)
        .unwrap_or_default();
    match opening {
        Opening::Initialize => {
            let line = line.expect("initialize is consumed");
            legacy_client(peer, &id, &params, line).await
        }
        Opening::Modern { envelope, discover } => {
            modern_client(
                peer,
                &id,
                &params,
                envelope,
                discover.then_some(line).flatten(),
            )
            .await
        }
    }
}

/// A legacy client's `initialize`: passed to the server; if the server refuses it and answers a
/// modern `server/discover`, it is a modern-only server, and the client gets an `initialize`
/// result made from the discovery (MCP 2026-07-28, "Versioning").
async fn legacy_client(peer: &Peer, id: &RawValue, params: &Object, line: String) -> Opened {
    let same = |answer| Opened {
        era: Era::Same,
        answer,
    };
    let reply = peer
        .ask_frame(frame::id_key(id), line, CLIENT_INITIALIZE_TIMEOUT)
        .await;
    let Some(Reply::Answer {
        frame: answer,
        error: Some(_),
        ..
    }) = reply
    else {
        return same(match reply {
            Some(Reply::Answer { frame, .. }) => Some(frame),
            _ => None,
        });
    };
    let envelope = era::envelope_from_initialize(params);
    let discover_params = serde_json::json!({ "_meta": &envelope });
    match peer
        .ask("server/discover", discover_params, PROBE_TIMEOUT)
        .await
    {
        Some(Reply::Answer {
            result: Some(discovered),
            ..
        }) => {
            let requested = frame::string(params, "protocolVersion");
            let result = era::initialize_from_discover(&discovered, requested.as_deref());
            tracing::info!(
                "the server speaks only the modern era: the proxy translates for a legacy client"
            );
            Opened {
                era: Era::Upgraded { envelope },
                answer: Some(frame::response(id, &result)),
            }
        }
        // Not a modern server either: the client gets the server's refusal.
        _ => same(Some(answer)),
    }
}

/// A modern client's first request: probes the server with `server/discover` (the client's own
/// when that is the request, `discover`). A discovery, or an error only a modern server sends,
/// means a modern server: frames pass as they came. Any other error, or no answer in time, means
/// a legacy server (MCP 2026-07-28, "stdio: Backward Compatibility": the fallback is not keyed
/// to one error code, servers answer -32601, -32602 or nothing): the proxy initializes it with
/// the client's capabilities and identity and answers `server/discover` itself from the
/// `initialize` result.
async fn modern_client(
    peer: &Peer,
    id: &RawValue,
    params: &Object,
    envelope: Object,
    discover: Option<String>,
) -> Opened {
    let answers_discover = discover.is_some();
    let probe = match discover {
        Some(line) => peer.ask_frame(frame::id_key(id), line, PROBE_TIMEOUT).await,
        None => {
            let probe_params = serde_json::json!({ "_meta": &envelope });
            peer.ask("server/discover", probe_params, PROBE_TIMEOUT)
                .await
        }
    };
    let legacy = match &probe {
        Some(Reply::Answer { error: Some(e), .. }) => !era::is_modern_error(e),
        Some(Reply::Answer { .. } | Reply::Closed(_)) => false,
        None => true,
    };
    let era = if legacy {
        initialize_legacy_server(peer, &envelope).await
    } else {
        Era::Same
    };
    let answer = match (answers_discover, &era, probe) {
        (false, ..) => None,
        (true, Era::Legacy { initialized }, _) => Some(discovered(id, params, initialized)),
        (true, _, Some(Reply::Answer { frame, .. })) => Some(frame),
        (true, ..) => None,
    };
    Opened { era, answer }
}

/// Initializes a legacy server for a modern client whose envelope is `envelope`; the session's
/// era after it.
async fn initialize_legacy_server(peer: &Peer, envelope: &Object) -> Era {
    let reply = peer
        .ask(
            "initialize",
            era::initialize_params(envelope),
            INITIALIZE_TIMEOUT,
        )
        .await;
    let Some(Reply::Answer {
        result: Some(initialized),
        ..
    }) = reply
    else {
        tracing::warn!("the server refused the proxy's initialize: frames pass untranslated");
        return Era::Same;
    };
    peer.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.to_owned());
    tracing::info!(
        "the server speaks only the legacy era: the proxy translates for a modern client"
    );
    Era::Legacy { initialized }
}

/// The answer to a modern client's `server/discover` in front of a legacy server: the discovery
/// made from the server's `initialize` result, unless the client takes requests from the
/// server, which only the legacy era carries: then it is told to use that era.
pub(crate) fn discovered(id: &RawValue, params: &Object, initialized: &RawValue) -> String {
    match era::modern_version(params) {
        Some(v) if !era::MODERN_VERSIONS.contains(&v.as_str()) => era::unsupported_version(id, &v),
        Some(v) if era::takes_server_requests(params) => {
            tracing::info!(
                "a client that takes server requests is kept in the legacy era of the server"
            );
            era::legacy_only(id, &v, initialized)
        }
        _ => frame::response(id, &era::discover_from_initialize(initialized)),
    }
}

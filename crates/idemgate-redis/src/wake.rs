//! The one subscriber connection of a store, which wakes waiting duplicates.
//!
//! A duplicate that finds its record in flight flags the record as waited for (`wait.lua`); the
//! write that settles a flagged record publishes its name on [`CHANGED`] (`wake` in
//! `common.lua`). This task stays subscribed to that channel and turns each name into a wake-up
//! of the store's [`Changes`]. A classic `PUBLISH` reaches the subscribers of every node: on a
//! cluster it crosses the cluster bus, behind Sentinel it is replicated to the replicas, so one
//! subscription on any node hears every record's settling.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use idemgate_core::Changes;
use redis::aio::PubSub;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::ConnectionInfo;
use tokio::sync::{oneshot, watch};

/// The channel the scripts publish settled records on (`CHANGED` in `common.lua`).
pub(crate) const CHANGED: &str = "idemgate:changed";

/// How often a quiet subscription is pinged, so that a connection that died without a word
/// (a partition, a primary gone) is noticed and replaced.
const PING_EVERY: Duration = Duration::from_secs(5);

/// Where the subscriber connects.
pub(crate) enum Source {
    /// One server (its URL), or the nodes of a cluster, tried in turn.
    Nodes(Vec<String>),
    /// The primary the sentinels name.
    Sentinel {
        sentinels: Vec<ConnectionInfo>,
        service: String,
        node: SentinelNodeConnectionInfo,
    },
}

impl Source {
    /// A subscription to [`CHANGED`] on the first node that takes one.
    async fn subscribe(&self, connect_timeout: Duration) -> Option<PubSub> {
        let clients = match self {
            Source::Nodes(urls) => urls
                .iter()
                .filter_map(|url| redis::Client::open(url.as_str()).ok())
                .collect(),
            Source::Sentinel {
                sentinels,
                service,
                node,
            } => {
                let mut client = SentinelClient::build(
                    sentinels.clone(),
                    service.clone(),
                    Some(node.clone()),
                    SentinelServerType::Master,
                )
                .ok()?;
                let found = tokio::time::timeout(connect_timeout, client.async_get_client());
                vec![found.await.ok()?.ok()?]
            }
        };
        for client in clients {
            let subscribed = tokio::time::timeout(connect_timeout, async {
                let mut pubsub = client.get_async_pubsub().await?;
                pubsub.subscribe(CHANGED).await?;
                redis::RedisResult::Ok(pubsub)
            });
            if let Ok(Ok(pubsub)) = subscribed.await {
                return Some(pubsub);
            }
        }
        None
    }
}

/// Keeps a subscription to [`CHANGED`] and wakes the waiters of each record named on it,
/// resubscribing with backoff, until `shutdown` fires or its sender is dropped. `listening` says
/// whether the subscription is in effect now (waiters poll while it is not).
pub(crate) async fn run(
    source: Source,
    changes: Arc<Changes>,
    listening: watch::Sender<bool>,
    connect_timeout: Duration,
    mut shutdown: oneshot::Receiver<()>,
) {
    let mut backoff = Duration::from_millis(50);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            subscribed = source.subscribe(connect_timeout) => if let Some(pubsub) = subscribed {
                backoff = Duration::from_millis(50);
                tokio::select! {
                    _ = &mut shutdown => return,
                    () = session(pubsub, &changes, &listening) => {}
                }
            }
        }
        listening.send_replace(false);
        // Whatever settled while nobody listened: every waiter looks again.
        changes.notify_all();
        tokio::select! {
            _ = &mut shutdown => return,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// One subscription, until its connection fails or stops answering pings.
async fn session(pubsub: PubSub, changes: &Changes, listening: &watch::Sender<bool>) {
    let (mut sink, mut messages) = pubsub.split();
    // Records that settled before the subscription took effect were missed.
    changes.notify_all();
    // Only after that wake-up: a waiter that saw `listening` is woken by changes alone.
    listening.send_replace(true);
    loop {
        match tokio::time::timeout(PING_EVERY, messages.next()).await {
            Ok(Some(msg)) => {
                if let Ok(name) = msg.get_payload::<String>() {
                    changes.notify(name.as_str());
                }
            }
            Ok(None) => return,
            Err(_quiet) => {
                let pong = tokio::time::timeout(PING_EVERY, sink.ping::<String>()).await;
                if !matches!(pong, Ok(Ok(_))) {
                    return;
                }
            }
        }
    }
}

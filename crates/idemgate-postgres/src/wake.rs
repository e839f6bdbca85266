//! The one LISTEN connection of a store, which wakes waiting duplicates.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{broadcast, oneshot, watch};
use tokio_postgres::{AsyncMessage, NoTls};

/// The notification channel every write that ends an in-flight record notifies.
pub(crate) const CHANNEL: &str = "idemgate";

/// Sent to every waiter when notifications may have been missed (the listener reconnected).
pub(crate) const WAKE_ALL: &str = "*";

/// Keeps a dedicated connection listening on [`CHANNEL`] and forwards each payload (a key digest)
/// to `tx`, reconnecting with backoff, until `shutdown` fires or its sender is dropped. `listening`
/// says whether `LISTEN` is in effect now.
pub(crate) async fn run(
    config: tokio_postgres::Config,
    tx: broadcast::Sender<Arc<str>>,
    listening: watch::Sender<bool>,
    mut shutdown: oneshot::Receiver<()>,
) {
    let mut backoff = Duration::from_millis(50);
    loop {
        let session = session(&config, &tx, &listening);
        tokio::select! {
            _ = &mut shutdown => return,
            connected = session => {
                if connected {
                    backoff = Duration::from_millis(50);
                }
            }
        }
        listening.send_replace(false);
        // Whatever happened while we were not listening, waiters look again.
        let _ = tx.send(Arc::from(WAKE_ALL));
        tokio::select! {
            _ = &mut shutdown => return,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// One listening session; returns whether it got as far as listening.
async fn session(
    config: &tokio_postgres::Config,
    tx: &broadcast::Sender<Arc<str>>,
    listening: &watch::Sender<bool>,
) -> bool {
    let Ok((client, mut conn)) = config.connect(NoTls).await else {
        return false;
    };
    let forward = {
        let tx = tx.clone();
        async move {
            let mut messages = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
            while let Some(Ok(msg)) = messages.next().await {
                if let AsyncMessage::Notification(n) = msg {
                    let _ = tx.send(Arc::from(n.payload()));
                }
            }
        }
    };
    let mut forward = std::pin::pin!(forward);
    let listen_sql = format!("LISTEN {CHANNEL}");
    let listen = client.batch_execute(&listen_sql);
    tokio::select! {
        () = &mut forward => return false,
        res = listen => if res.is_err() { return false },
    }
    // Notifications sent before LISTEN took effect were missed.
    let _ = tx.send(Arc::from(WAKE_ALL));
    // Only after that wake-up: a waiter that saw `listening` is woken by changes alone.
    listening.send_replace(true);
    forward.await;
    drop(client);
    true
}

//! Reads of one record shared by the callers that ask for it at once: the duplicates of a storm
//! that a notification wakes together each look at the record, and one read can answer them all.
//!
//! A caller never gets the answer of a read that started before its own call (that read may
//! predate a write the caller made or heard of): it joins the *next* read of the record, which
//! starts once the one under way has ended. So every answer is of a read that started after the
//! call did, as if the caller had sent it itself.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use idemgate_core::transition::StoredRecord;
use idemgate_core::{Key, StoreError, Timestamp};
use tokio::sync::oneshot;

/// A read of a record: the row as stored, with the server's clock at the read, or none.
pub(crate) type Answer = Result<Option<(StoredRecord, Timestamp)>, StoreError>;

/// Callers waiting for the next read of a record.
type Waiting = Vec<oneshot::Sender<Turn>>;
type Records = Arc<Mutex<HashMap<Key, Waiting>>>;

/// What a waiting caller is handed.
enum Turn {
    /// The answer of a read that started after it asked.
    Answer(Answer),
    /// It reads next, for itself and the callers in it, who asked before that read starts.
    Lead(Leading),
}

/// The records being read now, and the callers waiting for the next read of each.
#[derive(Default)]
pub(crate) struct SharedReads {
    records: Records,
}

impl SharedReads {
    /// `read(key)`'s answer, from a read that starts after this call: this caller's own, or one
    /// it shares with the callers that asked for the same record meanwhile.
    pub(crate) async fn read<F, Fut>(&self, key: &Key, read: F) -> Answer
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Answer>,
    {
        let waiting = {
            let mut records = lock(&self.records);
            match records.get_mut(key) {
                None => {
                    records.insert(key.clone(), Vec::new());
                    None
                }
                Some(next) => {
                    let (tx, rx) = oneshot::channel();
                    next.push(tx);
                    Some(rx)
                }
            }
        };
        let mut lead = match waiting {
            None => Leading {
                records: Arc::clone(&self.records),
                key: key.clone(),
                followers: Vec::new(),
                handed_on: false,
            },
            Some(rx) => match rx.await {
                Ok(Turn::Answer(answer)) => return answer,
                Ok(Turn::Lead(lead)) => lead,
                // Not handed on (a lead is handed on even when dropped): read alone.
                Err(_) => return read().await,
            },
        };
        let answer = read().await;
        for follower in std::mem::take(&mut lead.followers) {
            let _ = follower.send(Turn::Answer(answer.clone()));
        }
        answer
    }
}

fn lock(records: &Records) -> std::sync::MutexGuard<'_, HashMap<Key, Waiting>> {
    records.lock().unwrap_or_else(|p| p.into_inner())
}

/// The right to read a record next, for the caller that holds it and its followers. When it is
/// dropped (its read ended, or its caller went away, even before it took the lead over), the
/// callers still owed a read get one: its followers, whose read did not end, or else those that
/// asked meanwhile. The first of them whose call still waits leads it; with nobody left, the
/// record is no longer being read.
struct Leading {
    records: Records,
    key: Key,
    followers: Waiting,
    /// Passed on as a whole (its followers moved to another lead): nothing left to do.
    handed_on: bool,
}

impl Drop for Leading {
    fn drop(&mut self) {
        if self.handed_on {
            return;
        }
        let mut owed = std::mem::take(&mut self.followers);
        loop {
            if owed.is_empty() {
                let mut records = lock(&self.records);
                owed = records
                    .get_mut(&self.key)
                    .map(std::mem::take)
                    .unwrap_or_default();
                if owed.is_empty() {
                    records.remove(&self.key);
                    return;
                }
            }
            // No lock held while handing on: a lead that comes back is dropped here.
            while !owed.is_empty() {
                let next = owed.remove(0);
                let lead = Leading {
                    records: Arc::clone(&self.records),
                    key: self.key.clone(),
                    followers: std::mem::take(&mut owed),
                    handed_on: false,
                };
                match next.send(Turn::Lead(lead)) {
                    Ok(()) => return,
                    // That caller went away: the next one leads.
                    Err(Turn::Lead(mut lead)) => {
                        owed = std::mem::take(&mut lead.followers);
                        lead.handed_on = true;
                    }
                    Err(Turn::Answer(_)) => unreachable!("a lead was sent"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use idemgate_core::{TenantId, ToolName};
    use std::future::Future as _;
    use tokio::sync::Notify;

    use super::*;

    fn key() -> Key {
        Key::new(
            TenantId::new("t").unwrap(),
            ToolName::new("tool").unwrap(),
            idemgate_core::IdempotencyKey::explicit("k").unwrap(),
        )
    }

    /// Yields to the other tasks until `ready()` holds; fails naming `what` past `deadline`.
    async fn until(deadline: std::time::Instant, what: &str, mut ready: impl FnMut() -> bool) {
        while !ready() {
            assert!(std::time::Instant::now() < deadline, "{what}");
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn callers_that_ask_during_a_read_share_the_next_one_not_that_one() {
        let reads = Arc::new(SharedReads::default());
        let started = Arc::new(AtomicUsize::new(0));
        let release = Arc::new(Notify::new());
        let first_started = Arc::new(Notify::new());
        // Each read answers with its own number (as an error's text), once let go.
        let read = {
            let (started, release, first_started) =
                (started.clone(), release.clone(), first_started.clone());
            move || {
                let (started, release, first_started) =
                    (started.clone(), release.clone(), first_started.clone());
                async move {
                    let n = started.fetch_add(1, Ordering::SeqCst) + 1;
                    if n == 1 {
                        first_started.notify_one();
                    }
                    release.notified().await;
                    Err(StoreError::unavailable(format!("read {n}")))
                }
            }
        };
        let first = {
            let (reads, read) = (reads.clone(), read.clone());
            tokio::spawn(async move { reads.read(&key(), read).await })
        };
        first_started.notified().await;
        let later: Vec<_> = (0..5)
            .map(|_| {
                let (reads, read) = (reads.clone(), read.clone());
                tokio::spawn(async move { reads.read(&key(), read).await })
            })
            .collect();
        // The five are queued behind the first read before it is let go.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        until(deadline, "the callers never queued", || {
            lock(&reads.records).get(&key()).map_or(0, Vec::len) >= 5
        })
        .await;
        release.notify_one();
        let text = |a: Answer| a.unwrap_err().to_string();
        assert!(text(first.await.unwrap()).contains("read 1"));
        // The second read starts once the first ended; let it go when it has.
        until(deadline, "no second read", || {
            started.load(Ordering::SeqCst) >= 2
        })
        .await;
        release.notify_one();
        for t in later {
            assert!(text(t.await.unwrap()).contains("read 2"));
        }
        assert_eq!(started.load(Ordering::SeqCst), 2, "one read for the five");
        assert!(lock(&reads.records).is_empty(), "nothing is left behind");
    }

    #[tokio::test]
    async fn a_leader_that_goes_away_hands_the_read_on() {
        let reads = Arc::new(SharedReads::default());
        let never = || std::future::pending::<Answer>();
        // The leader's read never ends; its caller gives up.
        let leader = {
            let reads = reads.clone();
            tokio::spawn(async move { reads.read(&key(), never).await })
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        until(deadline, "the leader never started", || {
            lock(&reads.records).contains_key(&key())
        })
        .await;
        let follower = {
            let reads = reads.clone();
            tokio::spawn(async move { reads.read(&key(), || async { Ok(None) }).await })
        };
        until(deadline, "the follower never queued", || {
            lock(&reads.records).get(&key()).map_or(0, Vec::len) >= 1
        })
        .await;
        leader.abort();
        let answer = tokio::time::timeout(std::time::Duration::from_secs(30), follower)
            .await
            .expect("the follower was left waiting")
            .unwrap();
        assert!(matches!(answer, Ok(None)));
        assert!(lock(&reads.records).is_empty(), "nothing is left behind");
    }

    #[tokio::test]
    async fn a_lead_handed_to_a_caller_that_then_goes_away_passes_to_the_next() {
        let reads = Arc::new(SharedReads::default());
        let release = Arc::new(Notify::new());
        let leader = {
            let (reads, release) = (reads.clone(), release.clone());
            tokio::spawn(async move {
                let read = || {
                    let release = release.clone();
                    async move {
                        release.notified().await;
                        Ok(None)
                    }
                };
                reads.read(&key(), read).await
            })
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        until(deadline, "the leader never started", || {
            lock(&reads.records).contains_key(&key())
        })
        .await;
        // Queued, then never polled again: it is handed the lead and goes away holding it.
        let k = key();
        let mut gone = Box::pin(reads.read(&k, || async { Ok(None) }));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(gone.as_mut().poll(&mut cx).is_pending());
        let next = {
            let reads = reads.clone();
            tokio::spawn(async move { reads.read(&key(), || async { Ok(None) }).await })
        };
        until(deadline, "the callers never queued", || {
            lock(&reads.records).get(&key()).map_or(0, Vec::len) >= 2
        })
        .await;
        release.notify_one();
        assert!(matches!(leader.await.unwrap(), Ok(None)));
        drop(gone);
        let answer = tokio::time::timeout(std::time::Duration::from_secs(30), next)
            .await
            .expect("the next caller was left waiting")
            .unwrap();
        assert!(matches!(answer, Ok(None)));
        assert!(lock(&reads.records).is_empty(), "nothing is left behind");
    }
}

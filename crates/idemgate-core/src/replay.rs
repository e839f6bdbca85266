//! Completed records this engine has seen, so that a replay needs no store round trip.
//!
//! A completed record changes in two ways only: it expires, and an operator reopens it
//! ([`crate::Engine::reopen`]: it is deleted, so that the next call runs the action again).
//! Completing again under its lease changes nothing, takeovers and resolutions apply only to
//! unknown records, and purging removes only expired ones. So a copy answers as the store would
//! until the record expires or is reopened:
//! - expiry: the copy is dropped a little before it (judged by the local clock, with a margin for
//!   skew against the store's clock);
//! - a reopening by this engine drops the copy at once;
//! - a reopening by another process (several proxies or workers on one store) cannot be heard
//!   here, so a copy answers only for [`crate::Settings::replay_cache_fresh`] after it was read
//!   from the store; then the store is asked again. A record reopened elsewhere is therefore
//!   replayed here for at most that long, and then runs again.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::canonical::Fingerprint;
use crate::key::Key;
use crate::record::Outcome;
use crate::time::Timestamp;

/// How long before a record's expiry its copy stops answering.
pub(crate) const EXPIRY_MARGIN: Duration = Duration::from_secs(2);

/// One completed record, as the store reported it.
#[derive(Clone, Debug)]
pub(crate) struct Completed {
    pub(crate) fingerprint: Fingerprint,
    pub(crate) created_at: Timestamp,
    pub(crate) outcome: Outcome,
    pub(crate) completed_at: Timestamp,
    pub(crate) expires_at: Timestamp,
}

impl Completed {
    /// The replay answer of this record.
    pub(crate) fn into_replay(self, verified: bool) -> crate::answer::Decision {
        crate::answer::Decision::Replayed {
            outcome: self.outcome,
            executed_at: self.completed_at,
            expires_at: self.expires_at,
            verified,
        }
    }
}

/// A bounded map of completed records, oldest insertion evicted first.
#[derive(Debug)]
pub(crate) struct ReplayCache {
    capacity: usize,
    /// How long after it was read from the store a copy answers.
    fresh: Duration,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Each record, with when it was read from the store (tokio's clock: monotonic, and paused
    /// in tests).
    records: HashMap<Key, (Completed, Instant)>,
    /// Insertion order for eviction; may name keys already dropped, which eviction skips.
    order: VecDeque<Key>,
}

impl ReplayCache {
    /// A cache of at most `capacity` records, each answering for `fresh` after it was read; a
    /// capacity of 0 turns it off.
    pub(crate) fn new(capacity: usize, fresh: Duration) -> Self {
        ReplayCache {
            capacity,
            fresh,
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Every change is one insert or remove: a poisoned map is still consistent.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The completed record of `key`, unless it is unknown here, close to its expiry at `now`, or
    /// read from the store longer ago than the freshness bound.
    pub(crate) fn get(&self, key: &Key, now: Timestamp) -> Option<Completed> {
        if self.capacity == 0 {
            return None;
        }
        let mut inner = self.lock();
        let (found, read_at) = inner.records.get(key)?;
        if now.plus(EXPIRY_MARGIN) < found.expires_at && read_at.elapsed() < self.fresh {
            return Some(found.clone());
        }
        inner.records.remove(key);
        None
    }

    /// Forgets the record of `key` (this engine reopened it).
    pub(crate) fn remove(&self, key: &Key) {
        if self.capacity == 0 {
            return;
        }
        // Its place in `order` stays until eviction skips it.
        self.lock().records.remove(key);
    }

    /// Remembers the completed record of `key`, read from the store just now.
    pub(crate) fn put(&self, key: &Key, record: Completed) {
        if self.capacity == 0 {
            return;
        }
        let mut inner = self.lock();
        if inner
            .records
            .insert(key.clone(), (record, Instant::now()))
            .is_none()
        {
            inner.order.push_back(key.clone());
        }
        while inner.records.len() > self.capacity {
            let Some(oldest) = inner.order.pop_front() else {
                break;
            };
            inner.records.remove(&oldest);
        }
        // Keys dropped at expiry stay in `order` until evicted; keep that list bounded too.
        if inner.order.len() > 2 * self.capacity {
            let Inner { records, order } = &mut *inner;
            order.retain(|k| records.contains_key(k));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{IdempotencyKey, TenantId, ToolName};

    fn key(k: &str) -> Key {
        Key::new(
            TenantId::new("t").unwrap(),
            ToolName::new("x").unwrap(),
            IdempotencyKey::new(k).unwrap(),
        )
    }

    fn completed(expires_at: i64) -> Completed {
        Completed {
            fingerprint: Fingerprint::of_bytes(b""),
            created_at: Timestamp::EPOCH,
            outcome: Outcome::success(b"x".to_vec()),
            completed_at: Timestamp::EPOCH,
            expires_at: Timestamp::from_millis(expires_at),
        }
    }

    const FRESH: Duration = Duration::from_secs(3600);

    #[test]
    fn answers_until_shortly_before_expiry() {
        let cache = ReplayCache::new(8, FRESH);
        cache.put(&key("a"), completed(10_000));
        assert!(cache
            .get(&key("a"), Timestamp::from_millis(7_000))
            .is_some());
        assert!(cache
            .get(&key("a"), Timestamp::from_millis(8_000))
            .is_none());
        assert!(
            cache
                .get(&key("a"), Timestamp::from_millis(1_000))
                .is_none(),
            "dropped"
        );
    }

    #[test]
    fn evicts_the_oldest_and_stays_bounded() {
        let cache = ReplayCache::new(2, FRESH);
        for k in ["a", "b", "c"] {
            cache.put(&key(k), completed(i64::MAX));
        }
        assert!(cache.get(&key("a"), Timestamp::EPOCH).is_none());
        assert!(cache.get(&key("b"), Timestamp::EPOCH).is_some());
        assert!(cache.get(&key("c"), Timestamp::EPOCH).is_some());
        for i in 0..100 {
            cache.put(&key(&format!("e{i}")), completed(3_000));
            cache.get(&key(&format!("e{i}")), Timestamp::from_millis(2_000));
        }
        let inner = cache.lock();
        assert!(
            inner.records.len() <= 2 && inner.order.len() <= 4,
            "{inner:?}"
        );
    }

    #[test]
    fn capacity_zero_turns_it_off() {
        let cache = ReplayCache::new(0, FRESH);
        cache.put(&key("a"), completed(i64::MAX));
        assert!(cache.get(&key("a"), Timestamp::EPOCH).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_copy_answers_only_while_fresh_and_until_removed() {
        let cache = ReplayCache::new(8, Duration::from_secs(2));
        cache.put(&key("a"), completed(i64::MAX));
        tokio::time::advance(Duration::from_millis(1_999)).await;
        assert!(cache.get(&key("a"), Timestamp::EPOCH).is_some());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(
            cache.get(&key("a"), Timestamp::EPOCH).is_none(),
            "stale: the store decides again"
        );
        cache.put(&key("a"), completed(i64::MAX));
        assert!(
            cache.get(&key("a"), Timestamp::EPOCH).is_some(),
            "read again"
        );
        cache.remove(&key("a"));
        assert!(cache.get(&key("a"), Timestamp::EPOCH).is_none());
    }
}

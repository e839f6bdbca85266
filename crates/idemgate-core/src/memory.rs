//! The in-process store, for tests and single-process use.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;

use crate::key::Key;
use crate::record::{Fence, Lease, Outcome, Record};
use crate::store::{Claim, Completion, ListFilter, Reservation, Result, Store};
use crate::time::{Clock, SystemClock, Timestamp};
use crate::transition::{self, Change, StoredRecord};

/// Records in a hash map behind one lock, judged by an injectable [`Clock`]. Clones share the map.
#[derive(Clone, Debug)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    records: Mutex<HashMap<Key, StoredRecord>>,
    clock: Arc<dyn Clock>,
    changed: Notify,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An empty store on the system clock.
    pub fn new() -> Self {
        Self::with_clock(Arc::new(SystemClock))
    }

    /// An empty store on `clock` (tests pass a [`crate::ManualClock`]).
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        MemoryStore {
            inner: Arc::new(Inner {
                records: Mutex::new(HashMap::new()),
                clock,
                changed: Notify::new(),
            }),
        }
    }

    /// How many records are held, expired ones included.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no record is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Key, StoredRecord>> {
        // A panic while holding the lock cannot leave a record half written (every change is one
        // insert or remove), so a poisoned map is still consistent.
        self.inner
            .records
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs one transition under the lock and applies its change.
    fn apply<T>(
        &self,
        key: &Key,
        f: impl FnOnce(Option<&StoredRecord>, Timestamp) -> Result<(T, Change)>,
    ) -> Result<T> {
        let mut map = self.lock();
        let now = self.inner.clock.now();
        let (out, change) = f(map.get(key), now)?;
        match change {
            Change::Keep => return Ok(out),
            Change::Put(rec) => {
                map.insert(key.clone(), rec);
            }
            Change::Delete => {
                map.remove(key);
            }
        }
        drop(map);
        self.inner.changed.notify_waiters();
        Ok(out)
    }
}

impl Store for MemoryStore {
    async fn reserve(&self, r: &Reservation) -> Result<Claim> {
        self.apply(&r.key, |cur, now| Ok(transition::reserve(cur, r, now)))
    }

    async fn takeover(&self, r: &Reservation, stale: Fence) -> Result<Claim> {
        self.apply(&r.key, |cur, now| {
            Ok(transition::takeover(cur, r, stale, now))
        })
    }

    async fn heartbeat(&self, key: &Key, lease: Lease, lease_for: Duration) -> Result<Timestamp> {
        self.apply(key, |cur, now| {
            transition::heartbeat(cur, lease, lease_for, now)
        })
    }

    async fn complete(
        &self,
        key: &Key,
        lease: Lease,
        outcome: &Outcome,
        ttl: Duration,
    ) -> Result<Completion> {
        self.apply(key, |cur, now| {
            transition::complete(cur, lease, outcome, ttl, now)
        })
    }

    async fn release(&self, key: &Key, lease: Lease) -> Result<()> {
        self.apply(key, |cur, _| Ok(((), transition::release(cur, lease)?)))
    }

    async fn mark_unknown(&self, key: &Key, lease: Lease) -> Result<()> {
        self.apply(key, |cur, now| {
            Ok(((), transition::mark_unknown(cur, lease, now)?))
        })
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>> {
        let now = self.inner.clock.now();
        Ok(self.lock().get(key).and_then(|c| c.view(now)))
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>> {
        let now = self.inner.clock.now();
        let mut out: Vec<Record> = self
            .lock()
            .values()
            .filter_map(|c| c.view(now))
            .filter(|r| filter.matches(r))
            .collect();
        out.sort_by(|a, b| (a.created_at, &a.key).cmp(&(b.created_at, &b.key)));
        if filter.limit > 0 {
            out.truncate(filter.limit);
        }
        Ok(out)
    }

    async fn purge_expired(&self) -> Result<u64> {
        let now = self.inner.clock.now();
        let mut map = self.lock();
        let before = map.len();
        map.retain(|_, c| !transition::is_purgeable(c, now));
        Ok((before - map.len()) as u64)
    }

    async fn wait_changed(&self, _key: &Key, timeout: Duration) {
        // Woken by any change; the caller looks at its own key again either way.
        let _ = tokio::time::timeout(timeout, self.inner.changed.notified()).await;
    }
}

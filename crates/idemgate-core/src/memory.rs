//! The in-process store, for tests and single-process use.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
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
    records: Mutex<HashMap<Key, StoredRecord, SeededState>>,
    clock: Arc<dyn Clock>,
    changed: Notify,
    /// How many callers are in `wait_changed`.
    waiters: AtomicUsize,
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
                records: Mutex::new(HashMap::with_hasher(SeededState::new())),
                clock,
                changed: Notify::new(),
                waiters: AtomicUsize::new(0),
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

    fn lock(&self) -> MutexGuard<'_, HashMap<Key, StoredRecord, SeededState>> {
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
        // Look up by reference first: the key is cloned only when a new record is inserted.
        let out = match map.get_mut(key) {
            Some(slot) => match f(Some(slot), now)? {
                (out, Change::Keep) => return Ok(out),
                (out, Change::Put(rec)) => {
                    *slot = rec;
                    out
                }
                (out, Change::SetState(state)) => {
                    slot.state = state;
                    out
                }
                (out, Change::Delete) => {
                    map.remove(key);
                    out
                }
            },
            None => match f(None, now)? {
                (out, Change::Put(rec)) => {
                    map.insert(key.clone(), rec);
                    out
                }
                (out, Change::Keep | Change::SetState(_) | Change::Delete) => return Ok(out),
            },
        };
        drop(map);
        // Waking is a lock of its own; skip it when nobody waits (the common case).
        if self.inner.waiters.load(Ordering::Acquire) > 0 {
            self.inner.changed.notify_waiters();
        }
        Ok(out)
    }
}

/// A fast keyed hash for the record map, seeded per store from the OS. Names are validated,
/// short ASCII; SipHash would be a fifth of a fresh call's cost here. The random seed keeps
/// colliding names from being precomputed.
#[derive(Clone, Debug)]
struct SeededState(u64);

impl SeededState {
    fn new() -> Self {
        let mut b = [0u8; 8];
        getrandom::fill(&mut b).expect("failed to read randomness from the operating system");
        SeededState(u64::from_le_bytes(b) | 1)
    }
}

impl BuildHasher for SeededState {
    type Hasher = SeededHasher;
    fn build_hasher(&self) -> SeededHasher {
        SeededHasher(self.0)
    }
}

struct SeededHasher(u64);

impl SeededHasher {
    fn mix(&mut self, word: u64) {
        self.0 = (self.0 ^ word)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(29);
    }
}

impl Hasher for SeededHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.mix(u64::from_le_bytes(c.try_into().unwrap_or_default()));
        }
        let rest = chunks.remainder();
        let mut last = [0u8; 8];
        last[..rest.len()].copy_from_slice(rest);
        self.mix(u64::from_le_bytes(last) ^ (bytes.len() as u64) << 56);
    }

    fn write_u8(&mut self, b: u8) {
        self.mix(u64::from(b));
    }

    fn finish(&self) -> u64 {
        // A final avalanche (from MurmurHash3's fmix64) so every input bit reaches the low bits
        // the table indexes by.
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ (h >> 33)
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
        // Woken by any change; the caller looks at its own key again either way. The count is
        // raised before the `Notified` is enabled, so a change after it is never missed by a
        // writer that read a zero count.
        struct Waiting<'a>(&'a AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        self.inner.waiters.fetch_add(1, Ordering::AcqRel);
        let _waiting = Waiting(&self.inner.waiters);
        let notified = self.inner.changed.notified();
        let _ = tokio::time::timeout(timeout, notified).await;
    }
}

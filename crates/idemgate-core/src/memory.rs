//! The in-process store, for tests and single-process use.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::change::{ChangeMark, Changes};
use crate::history::HistoryEntry;
use crate::key::Key;
use crate::record::{Fence, Lease, Outcome, Record};
use crate::store::{Claim, Completion, Keep, ListFilter, Reopened, Reservation, Result, Store};
use crate::time::{Clock, SystemClock, Timestamp};
use crate::transition::{self, Change, StoredRecord};

/// Records in a hash map behind one lock, judged by an injectable [`Clock`]. Clones share the map.
#[derive(Clone, Debug)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    records: Mutex<Records>,
    clock: Arc<dyn Clock>,
    changes: Changes,
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
                records: Mutex::new(Records::new()),
                clock,
                changes: Changes::new(),
            }),
        }
    }

    /// How many records are held, expired ones included.
    pub fn len(&self) -> usize {
        self.lock().len
    }

    /// Whether no record is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> MutexGuard<'_, Records> {
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
        let hash = map.hash(key);
        let out = match map.get_mut(hash, key) {
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
                    map.remove(hash, key);
                    out
                }
            },
            None => match f(None, now)? {
                (out, Change::Put(rec)) => {
                    map.insert(hash, rec);
                    out
                }
                (out, Change::Keep | Change::SetState(_) | Change::Delete) => return Ok(out),
            },
        };
        drop(map);
        self.inner.changes.notify(key);
        Ok(out)
    }
}

/// The records, by a hash of their key computed once per operation. The map's own hashing is a
/// pass-through of that hash, so growing the table never hashes names again; the rare colliding
/// keys share a bucket and are told apart by the full key each record holds.
#[derive(Debug)]
struct Records {
    seed: SeededState,
    map: HashMap<u64, Bucket, BuildHasherDefault<PassThrough>>,
    len: usize,
    /// The histories of the records that have one (few: they are written on rare paths only),
    /// removed with their record.
    history: HashMap<Key, Vec<HistoryEntry>>,
}

#[derive(Debug)]
enum Bucket {
    One(StoredRecord),
    Many(Vec<StoredRecord>),
}

impl Records {
    fn new() -> Self {
        Records {
            seed: SeededState::new(),
            map: HashMap::default(),
            len: 0,
            history: HashMap::new(),
        }
    }

    fn hash(&self, key: &Key) -> u64 {
        self.seed.hash_one(key)
    }

    fn get(&self, key: &Key) -> Option<&StoredRecord> {
        match self.map.get(&self.hash(key))? {
            Bucket::One(r) => (r.key == *key).then_some(r),
            Bucket::Many(rs) => rs.iter().find(|r| r.key == *key),
        }
    }

    fn get_mut(&mut self, hash: u64, key: &Key) -> Option<&mut StoredRecord> {
        match self.map.get_mut(&hash)? {
            Bucket::One(r) => (r.key == *key).then_some(r),
            Bucket::Many(rs) => rs.iter_mut().find(|r| r.key == *key),
        }
    }

    /// Inserts a record whose key is not present.
    fn insert(&mut self, hash: u64, rec: StoredRecord) {
        use std::collections::hash_map::Entry;
        self.len += 1;
        match self.map.entry(hash) {
            Entry::Vacant(v) => {
                v.insert(Bucket::One(rec));
            }
            Entry::Occupied(mut o) => {
                let bucket = o.get_mut();
                match std::mem::replace(bucket, Bucket::Many(Vec::new())) {
                    Bucket::One(first) => *bucket = Bucket::Many(vec![first, rec]),
                    Bucket::Many(mut rs) => {
                        rs.push(rec);
                        *bucket = Bucket::Many(rs);
                    }
                }
            }
        }
    }

    fn remove(&mut self, hash: u64, key: &Key) {
        use std::collections::hash_map::Entry;
        if !self.history.is_empty() {
            self.history.remove(key);
        }
        let Entry::Occupied(mut o) = self.map.entry(hash) else {
            return;
        };
        match o.get_mut() {
            Bucket::One(r) if r.key == *key => {
                o.remove();
                self.len -= 1;
            }
            Bucket::One(_) => {}
            Bucket::Many(rs) => {
                let before = rs.len();
                rs.retain(|r| r.key != *key);
                self.len -= before - rs.len();
                if rs.is_empty() {
                    o.remove();
                }
            }
        }
    }

    fn values(&self) -> impl Iterator<Item = &StoredRecord> {
        self.map.values().flat_map(|b| match b {
            Bucket::One(r) => std::slice::from_ref(r).iter(),
            Bucket::Many(rs) => rs.iter(),
        })
    }

    fn retain(&mut self, mut keep: impl FnMut(&mut StoredRecord) -> bool) {
        let mut len = 0;
        let history = &mut self.history;
        // A record that goes takes its history with it.
        let mut keep = |r: &mut StoredRecord| {
            let kept = keep(r);
            if !kept && !history.is_empty() {
                history.remove(&r.key);
            }
            kept
        };
        self.map.retain(|_, b| match b {
            Bucket::One(r) => {
                let kept = keep(r);
                len += usize::from(kept);
                kept
            }
            Bucket::Many(rs) => {
                rs.retain_mut(|r| keep(r));
                len += rs.len();
                !rs.is_empty()
            }
        });
        self.len = len;
    }
}

/// The identity hash for keys that are hashes already.
#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn write(&mut self, bytes: &[u8]) {
        // Only `u64` keys are hashed with it; this keeps it correct for anything else.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }

    fn finish(&self) -> u64 {
        self.0
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

    async fn complete_at(
        &self,
        key: &Key,
        lease: Lease,
        outcome: &Outcome,
        keep: Keep,
        executed_at: Option<Timestamp>,
    ) -> Result<Completion> {
        self.apply(key, |cur, now| {
            transition::complete(cur, lease, outcome, keep, executed_at, now)
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

    async fn reopen(&self, key: &Key, fence: Fence) -> Result<Reopened> {
        self.apply(key, |cur, now| Ok(transition::reopen(cur, fence, now)))
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>> {
        let now = self.inner.clock.now();
        Ok(self.lock().get(key).and_then(|c| c.view(now)))
    }

    async fn append_history(&self, key: &Key, entry: &HistoryEntry) -> Result<bool> {
        let mut map = self.lock();
        if map.get(key).is_none() {
            return Ok(false);
        }
        map.history
            .entry(key.clone())
            .or_default()
            .push(entry.clone());
        Ok(true)
    }

    async fn history(&self, key: &Key) -> Result<Vec<HistoryEntry>> {
        Ok(self.lock().history.get(key).cloned().unwrap_or_default())
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
        let before = map.len;
        map.retain(|c| match transition::purge(c, now) {
            Change::Delete => false,
            Change::SetState(state) => {
                c.state = state;
                true
            }
            Change::Keep | Change::Put(_) => true,
        });
        Ok((before - map.len) as u64)
    }

    fn change_mark(&self, key: &Key) -> ChangeMark {
        self.inner.changes.mark(key)
    }

    async fn wait_changed(&self, key: &Key, since: ChangeMark, timeout: Duration) {
        // Every write notifies its key's waiters after it let go of the map, so a look that saw
        // the record unchanged was taken before the notification: the mark catches it.
        self.inner.changes.wait(key, since, timeout).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Fingerprint, IdempotencyKey, LeaseToken, RecordState, TenantId, ToolName};

    fn rec(k: &str) -> StoredRecord {
        StoredRecord {
            key: Key::new(
                TenantId::new("t").unwrap(),
                ToolName::new("x").unwrap(),
                IdempotencyKey::new(k).unwrap(),
            ),
            fingerprint: Fingerprint::of_bytes(b""),
            fence: 1,
            token: LeaseToken(1),
            created_at: Timestamp::EPOCH,
            scope: None,
            state: RecordState::Unknown {
                since: Timestamp::EPOCH,
            },
        }
    }

    #[test]
    fn colliding_hashes_keep_records_apart() {
        let mut records = Records::new();
        let (a, b, c) = (rec("a"), rec("b"), rec("c"));
        // Force all three into one bucket, as a 64-bit collision would.
        for r in [&a, &b, &c] {
            records.insert(7, r.clone());
        }
        assert_eq!(records.len, 3);
        assert_eq!(
            records.get_mut(7, &b.key).map(|r| r.key.clone()),
            Some(b.key.clone())
        );
        records.remove(7, &b.key);
        assert!(records.get_mut(7, &b.key).is_none());
        assert!(records.get_mut(7, &a.key).is_some() && records.get_mut(7, &c.key).is_some());
        assert_eq!(records.values().count(), 2);
        records.retain(|r| r.key == a.key);
        assert_eq!(records.len, 1);
        assert!(records.get_mut(7, &c.key).is_none());
        records.remove(7, &a.key);
        assert_eq!((records.len, records.map.len()), (0, 0));
    }
}

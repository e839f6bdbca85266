//! Change notifications of a store, per record, that a waiter cannot miss.
//!
//! A waiting duplicate looks at its record and, still in flight, waits for a change. A wake-up
//! sent between that look and the start of the wait must not be lost (a caller would then
//! sleep a whole polling interval past the completion). So a waiter takes a [`ChangeMark`]
//! *before* its look and waits for a change *since the mark*: a change that lands between the
//! look and the wait has already moved the mark on, and the wait returns at once.

use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

/// Where a record's change notifications stood, taken before a look at it (see
/// [`crate::Store::change_mark`]). The default mark is one no store moves: a store without
/// notifications of its own only polls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChangeMark(pub u64);

/// How many slots the records share: records in one slot wake each other's waiters, which then
/// look at their own record again, nothing worse.
const SLOTS: usize = 64;

/// Change counters and wake-ups of records, shared by slots (a record's slot is a hash of its
/// name). The stores that notify their own waiters (memory, SQLite) and the ones that hear of
/// changes from their server (Redis pub/sub) keep one each.
#[derive(Debug)]
pub struct Changes {
    slots: Box<[Slot]>,
    hasher: std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher>,
}

#[derive(Debug, Default)]
struct Slot {
    /// Raised by every change of a record of the slot.
    seq: AtomicU64,
    /// How many callers wait on the slot, so that a change nobody waits for wakes nobody.
    waiters: AtomicUsize,
    woken: Notify,
}

impl Default for Changes {
    fn default() -> Self {
        Self::new()
    }
}

impl Changes {
    /// Counters at zero, nobody waiting.
    pub fn new() -> Self {
        Changes {
            slots: (0..SLOTS).map(|_| Slot::default()).collect(),
            hasher: Default::default(),
        }
    }

    fn slot(&self, record: &(impl Hash + ?Sized)) -> &Slot {
        // Truncation keeps the low bits, which is all the index needs.
        #[expect(clippy::cast_possible_truncation, reason = "only the low bits index")]
        let i = self.hasher.hash_one(record) as usize % SLOTS;
        &self.slots[i]
    }

    /// The mark of `record` now: take it before looking at the record.
    pub fn mark(&self, record: &(impl Hash + ?Sized)) -> ChangeMark {
        ChangeMark(self.slot(record).seq.load(Ordering::SeqCst))
    }

    /// Tells the waiters of `record` that it changed. Call it after the change is visible to a
    /// look (committed).
    pub fn notify(&self, record: &(impl Hash + ?Sized)) {
        let slot = self.slot(record);
        slot.seq.fetch_add(1, Ordering::SeqCst);
        // Waking takes a lock of its own; skip it when nobody waits (the common case). A waiter
        // raises the count before it reads the counter, so a notifier that reads zero here raised
        // the counter before that read (both sequentially consistent), and the waiter sees it.
        if slot.waiters.load(Ordering::SeqCst) > 0 {
            slot.woken.notify_waiters();
        }
    }

    /// Whether anyone waits on any record now (a store's watcher of changes it cannot hear of
    /// otherwise may rest while nobody does).
    pub fn waiting(&self) -> bool {
        self.slots
            .iter()
            .any(|slot| slot.waiters.load(Ordering::SeqCst) > 0)
    }

    /// Tells every waiter to look again (notifications may have been missed: a subscription was
    /// lost and taken up again).
    pub fn notify_all(&self) {
        for slot in self.slots.iter() {
            slot.seq.fetch_add(1, Ordering::SeqCst);
            slot.woken.notify_waiters();
        }
    }

    /// Waits until `record` changed since `since`, or `timeout` passed; returns whether it
    /// changed (or may have: records share slots). Returns at once when the change landed before
    /// the wait began.
    pub async fn wait(
        &self,
        record: &(impl Hash + ?Sized),
        since: ChangeMark,
        timeout: Duration,
    ) -> bool {
        struct Waiting<'a>(&'a AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let slot = self.slot(record);
        slot.waiters.fetch_add(1, Ordering::SeqCst);
        let _waiting = Waiting(&slot.waiters);
        // A `Notified` receives every `notify_waiters` from its creation on, before it is polled;
        // created before the counter is read, it misses no change the read did not see.
        let woken = slot.woken.notified();
        if slot.seq.load(Ordering::SeqCst) != since.0 {
            return true;
        }
        tokio::time::timeout(timeout, woken).await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_change_between_the_mark_and_the_wait_is_not_missed() {
        let changes = Changes::new();
        let mark = changes.mark("a");
        changes.notify("a");
        // Paused clock: a wait that timed out would have auto-advanced an hour.
        let start = tokio::time::Instant::now();
        assert!(changes.wait("a", mark, Duration::from_secs(3600)).await);
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_during_the_wait_wakes_it() {
        let changes = std::sync::Arc::new(Changes::new());
        let mark = changes.mark("a");
        let waiter = tokio::spawn({
            let changes = changes.clone();
            async move { changes.wait("a", mark, Duration::from_secs(3600)).await }
        });
        // Let the waiter start waiting, then change the record.
        while changes.slot("a").waiters.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        let start = tokio::time::Instant::now();
        changes.notify("a");
        assert!(waiter.await.unwrap());
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_change_the_wait_times_out() {
        let changes = Changes::new();
        let mark = changes.mark("a");
        assert!(!changes.wait("a", mark, Duration::from_millis(5)).await);
        changes.notify_all();
        assert!(changes.wait("a", mark, Duration::from_millis(5)).await);
    }
}

//! A store wrapper that injects faults, for failpoint tests of the engine and the front doors.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::change::ChangeMark;
use crate::error::StoreError;
use crate::history::HistoryEntry;
use crate::key::Key;
use crate::record::{Fence, Lease, Outcome, Record};
use crate::store::{Claim, Completion, Keep, ListFilter, Reopened, Reservation, Result, Store};
use crate::time::Timestamp;

/// Which operation a fault applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// [`Store::reserve`].
    Reserve,
    /// [`Store::takeover`].
    Takeover,
    /// [`Store::heartbeat`].
    Heartbeat,
    /// [`Store::complete`].
    Complete,
    /// [`Store::release`].
    Release,
    /// [`Store::mark_unknown`].
    MarkUnknown,
    /// [`Store::get`].
    Get,
    /// [`Store::reopen`].
    Reopen,
    /// [`Store::append_history`].
    AppendHistory,
}

/// What goes wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The operation fails with [`StoreError::Unavailable`] without reaching the store.
    Refuse,
    /// The operation reaches the store and takes effect, but its answer is lost
    /// ([`StoreError::Indeterminate`]).
    LoseAnswer,
}

/// Wraps a store and injects scripted faults: each armed fault hits the next matching operation
/// (or every one, for permanent faults) until disarmed. Clones share the script.
#[derive(Clone, Debug)]
pub struct FaultyStore<S> {
    inner: S,
    script: Arc<Mutex<Script>>,
}

#[derive(Debug, Default)]
struct Script {
    once: VecDeque<(Op, Fault)>,
    always: Vec<(Op, Fault)>,
    hits: Vec<(Op, Fault)>,
}

impl<S: Store> FaultyStore<S> {
    /// Wraps `inner` with no faults armed.
    pub fn new(inner: S) -> Self {
        FaultyStore {
            inner,
            script: Arc::new(Mutex::new(Script::default())),
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Arms `fault` for the next `op` only.
    pub fn once(&self, op: Op, fault: Fault) {
        self.script().once.push_back((op, fault));
    }

    /// Arms `fault` for every `op` until [`FaultyStore::heal`].
    pub fn always(&self, op: Op, fault: Fault) {
        self.script().always.push((op, fault));
    }

    /// Disarms every fault.
    pub fn heal(&self) {
        let mut s = self.script();
        s.once.clear();
        s.always.clear();
    }

    /// The faults that fired, in order.
    pub fn hits(&self) -> Vec<(Op, Fault)> {
        self.script().hits.clone()
    }

    fn script(&self) -> std::sync::MutexGuard<'_, Script> {
        self.script.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn fault_for(&self, op: Op) -> Option<Fault> {
        let mut s = self.script();
        let fault = if let Some(i) = s.once.iter().position(|(o, _)| *o == op) {
            s.once.remove(i).map(|(_, f)| f)
        } else {
            s.always
                .iter()
                .find(|(o, _)| *o == op)
                .map(|(_, f)| f.clone())
        };
        if let Some(f) = &fault {
            s.hits.push((op, f.clone()));
        }
        fault
    }

    async fn run<T>(&self, op: Op, fut: impl std::future::Future<Output = Result<T>>) -> Result<T> {
        match self.fault_for(op) {
            None => fut.await,
            Some(Fault::Refuse) => Err(StoreError::unavailable(format!(
                "injected fault: {op:?} refused"
            ))),
            Some(Fault::LoseAnswer) => {
                let _ = fut.await;
                Err(StoreError::indeterminate(format!(
                    "injected fault: {op:?} answer lost"
                )))
            }
        }
    }
}

impl<S: Store> Store for FaultyStore<S> {
    async fn reserve(&self, r: &Reservation) -> Result<Claim> {
        self.run(Op::Reserve, self.inner.reserve(r)).await
    }
    async fn takeover(&self, r: &Reservation, stale: Fence) -> Result<Claim> {
        self.run(Op::Takeover, self.inner.takeover(r, stale)).await
    }
    async fn heartbeat(&self, key: &Key, lease: Lease, lease_for: Duration) -> Result<Timestamp> {
        self.run(Op::Heartbeat, self.inner.heartbeat(key, lease, lease_for))
            .await
    }
    async fn complete_at(
        &self,
        key: &Key,
        lease: Lease,
        outcome: &Outcome,
        keep: Keep,
        executed_at: Option<Timestamp>,
    ) -> Result<Completion> {
        self.run(
            Op::Complete,
            self.inner
                .complete_at(key, lease, outcome, keep, executed_at),
        )
        .await
    }
    async fn release(&self, key: &Key, lease: Lease) -> Result<()> {
        self.run(Op::Release, self.inner.release(key, lease)).await
    }
    async fn mark_unknown(&self, key: &Key, lease: Lease) -> Result<()> {
        self.run(Op::MarkUnknown, self.inner.mark_unknown(key, lease))
            .await
    }
    async fn reopen(&self, key: &Key, fence: Fence) -> Result<Reopened> {
        self.run(Op::Reopen, self.inner.reopen(key, fence)).await
    }
    async fn get(&self, key: &Key) -> Result<Option<Record>> {
        self.run(Op::Get, self.inner.get(key)).await
    }
    async fn append_history(&self, key: &Key, entry: &HistoryEntry) -> Result<bool> {
        self.run(Op::AppendHistory, self.inner.append_history(key, entry))
            .await
    }
    async fn history(&self, key: &Key) -> Result<Vec<HistoryEntry>> {
        self.inner.history(key).await
    }
    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>> {
        self.inner.list(filter).await
    }
    async fn count(&self, filter: &ListFilter, at_most: usize) -> Result<usize> {
        self.inner.count(filter, at_most).await
    }
    async fn purge_expired(&self) -> Result<u64> {
        self.inner.purge_expired().await
    }
    fn change_mark(&self, key: &Key) -> ChangeMark {
        self.inner.change_mark(key)
    }

    async fn wait_changed(&self, key: &Key, since: ChangeMark, timeout: Duration) {
        self.inner.wait_changed(key, since, timeout).await
    }
}

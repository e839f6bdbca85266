//! A store whose records are sealed: every key is stored as its HMAC and every outcome sealed.

use std::time::Duration;

use idemgate_core::store::Result;
use idemgate_core::{
    ChangeMark, Claim, Completion, Fence, HistoryEntry, Keep, Key, Lease, ListFilter, Outcome,
    Record, RecordState, Reopened, Reservation, Store, StoreError, Timestamp,
};

use crate::seal::{Seal, SealError};

/// A store of sealed records: `S` keeps each record under [`Seal::stored_name`] of its key, with
/// its outcome's body sealed for that record and fence ([`Seal::seal_outcome`]); this wrapper
/// names, seals and opens on every operation, so the engine above sees the store as if nothing
/// were sealed. Tenants, tools, scopes, fingerprints, fences, states and times stay in clear; so
/// does what a history entry is and when, while its `by` and `reason` (people's names, the words
/// of a tool's error) are sealed for the record and fence like an outcome.
///
/// A record found by its key comes back under that key; a listed record under its stored name
/// (the store cannot say which key it was named from), which operators pass back as it is
/// ([`crate::is_stored_name`]). An outcome that does not open (sealed under a key the keyring
/// no longer holds, altered, copied from another record, or never sealed) is
/// [`StoreError::Corrupt`] naming the record and why.
#[derive(Clone, Debug)]
pub struct Sealed<S> {
    inner: S,
    seal: Seal,
}

impl<S> Sealed<S> {
    /// `inner`, sealed by `seal`.
    pub fn new(inner: S, seal: Seal) -> Self {
        Sealed { inner, seal }
    }

    /// The store underneath.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The seal.
    pub fn seal(&self) -> &Seal {
        &self.seal
    }

    fn name(&self, key: &Key) -> Key {
        self.seal.stored_name(key)
    }

    fn reservation(&self, r: &Reservation) -> Reservation {
        Reservation {
            key: self.name(&r.key),
            ..r.clone()
        }
    }

    /// `rec` as the engine sees it: its outcome opened, and named `key` when the caller named it.
    fn open(&self, mut rec: Record, key: Option<&Key>) -> Result<Record> {
        if let RecordState::Completed { outcome, .. } = &mut rec.state {
            outcome.body = self
                .seal
                .open_outcome(&rec.key, rec.fence, &outcome.body)
                .map_err(|e| corrupt(&rec.key, key, &e))?;
        }
        if let Some(key) = key {
            rec.key = key.clone();
        }
        Ok(rec)
    }

    /// `entry` with its `by` and `reason` sealed for the record stored as `name`, as hex text.
    fn seal_entry(&self, name: &Key, entry: &HistoryEntry) -> HistoryEntry {
        let fence = entry.fence.to_be_bytes();
        let seal = |field: &str, text: &Option<String>| {
            text.as_ref().map(|t| {
                let sealed = self
                    .seal
                    .seal(&history_context(name, &fence, field), t.as_bytes());
                idemgate_core::key::hex(&sealed)
            })
        };
        HistoryEntry {
            by: seal("by", &entry.by),
            reason: seal("reason", &entry.reason),
            ..entry.clone()
        }
    }

    /// Opens what [`Sealed::seal_entry`] sealed.
    fn open_entry(&self, name: &Key, key: &Key, entry: HistoryEntry) -> Result<HistoryEntry> {
        let fence = entry.fence.to_be_bytes();
        let open = |field: &str, text: Option<String>| -> Result<Option<String>> {
            let Some(hex) = text else { return Ok(None) };
            let broken = |why: String| {
                StoreError::corrupt(format!(
                    "record {key}: the {field} of a history entry at fence {} {why}",
                    entry.fence
                ))
            };
            let sealed = idemgate_core::key::unhex(&hex)
                .ok_or_else(|| broken("is not sealed".to_owned()))?;
            let plain = self
                .seal
                .open(&history_context(name, &fence, field), &sealed)
                .map_err(|e| broken(format!("does not open: {e}")))?;
            String::from_utf8(plain)
                .map(Some)
                .map_err(|_| broken("is not text".to_owned()))
        };
        Ok(HistoryEntry {
            by: open("by", entry.by.clone())?,
            reason: open("reason", entry.reason.clone())?,
            ..entry
        })
    }

    fn claim(&self, claim: Claim, key: &Key) -> Result<Claim> {
        Ok(match claim {
            Claim::Acquired(lease) => Claim::Acquired(lease),
            Claim::Existing(rec) => Claim::Existing(self.open(rec, Some(key))?),
        })
    }
}

fn corrupt(stored: &Key, key: Option<&Key>, e: &SealError) -> StoreError {
    let name = match key {
        Some(k) if k.key != stored.key => format!("{k} (stored as {})", stored.key),
        _ => stored.to_string(),
    };
    StoreError::corrupt(format!("record {name}: {e}"))
}

/// What a history entry's `by` or `reason` is sealed for: the record, the fence, the field.
fn history_context<'a>(stored: &'a Key, fence: &'a [u8; 8], field: &'a str) -> [&'a [u8]; 6] {
    [
        b"idemgate history v1",
        stored.tenant.as_str().as_bytes(),
        stored.tool.as_str().as_bytes(),
        stored.key.as_str().as_bytes(),
        fence,
        field.as_bytes(),
    ]
}

/// A sealed store keeps every key as its HMAC, so what a key starts with is not in the store:
/// listing by a key prefix is refused rather than answered with nothing.
fn refuse_key_prefix(filter: &ListFilter) -> Result<()> {
    match filter.key_prefix {
        Some(_) => Err(StoreError::misconfigured(
            "a sealed store keeps keys as their HMACs: it cannot list records by what their key \
             starts with"
                .to_owned(),
        )),
        None => Ok(()),
    }
}

impl<S: Store> Store for Sealed<S> {
    async fn reserve(&self, r: &Reservation) -> Result<Claim> {
        let claim = self.inner.reserve(&self.reservation(r)).await?;
        self.claim(claim, &r.key)
    }

    async fn takeover(&self, r: &Reservation, stale: Fence) -> Result<Claim> {
        let claim = self.inner.takeover(&self.reservation(r), stale).await?;
        self.claim(claim, &r.key)
    }

    async fn heartbeat(&self, key: &Key, lease: Lease, lease_for: Duration) -> Result<Timestamp> {
        self.inner
            .heartbeat(&self.name(key), lease, lease_for)
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
        let name = self.name(key);
        let sealed = Outcome {
            kind: outcome.kind,
            body: self.seal.seal_outcome(&name, lease.fence, &outcome.body),
        };
        self.inner
            .complete_at(&name, lease, &sealed, keep, executed_at)
            .await
    }

    async fn release(&self, key: &Key, lease: Lease) -> Result<()> {
        self.inner.release(&self.name(key), lease).await
    }

    async fn mark_unknown(&self, key: &Key, lease: Lease) -> Result<()> {
        self.inner.mark_unknown(&self.name(key), lease).await
    }

    async fn reopen(&self, key: &Key, fence: Fence) -> Result<Reopened> {
        Ok(match self.inner.reopen(&self.name(key), fence).await? {
            Reopened::Expired => Reopened::Expired,
            Reopened::Kept(rec) => {
                Reopened::Kept(rec.map(|r| self.open(r, Some(key))).transpose()?)
            }
        })
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>> {
        self.inner
            .get(&self.name(key))
            .await?
            .map(|r| self.open(r, Some(key)))
            .transpose()
    }

    async fn append_history(&self, key: &Key, entry: &HistoryEntry) -> Result<bool> {
        let name = self.name(key);
        let sealed = self.seal_entry(&name, entry);
        self.inner.append_history(&name, &sealed).await
    }

    async fn history(&self, key: &Key) -> Result<Vec<HistoryEntry>> {
        let name = self.name(key);
        self.inner
            .history(&name)
            .await?
            .into_iter()
            .map(|e| self.open_entry(&name, key, e))
            .collect()
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>> {
        refuse_key_prefix(filter)?;
        // The store's seal marker is the store's, not a call's record: operators never see it.
        // One more than the page, so that leaving the marker out never makes a page shorter
        // than its limit while records follow (a caller would take it for the last page).
        let marker = crate::marker::marker_key();
        let mut inner = filter.clone();
        if inner.limit > 0 {
            inner.limit = inner.limit.saturating_add(1);
        }
        let mut page = self
            .inner
            .list(&inner)
            .await?
            .into_iter()
            .filter(|r| r.key != marker)
            .map(|r| self.open(r, None))
            .collect::<Result<Vec<_>>>()?;
        if filter.limit > 0 {
            page.truncate(filter.limit);
        }
        Ok(page)
    }

    async fn count(&self, filter: &ListFilter, at_most: usize) -> Result<usize> {
        refuse_key_prefix(filter)?;
        // The marker is one record of the inner store's that operators never see: count one more
        // and take it off when it is among them.
        let inner = self.inner.count(filter, at_most.saturating_add(1)).await?;
        let marker = crate::marker::marker_key();
        let marked = self
            .inner
            .get(&marker)
            .await?
            .is_some_and(|m| filter.whole().matches(&m));
        Ok(inner.saturating_sub(usize::from(marked)).min(at_most))
    }

    async fn purge_expired(&self) -> Result<u64> {
        self.inner.purge_expired().await
    }

    fn change_mark(&self, key: &Key) -> ChangeMark {
        self.inner.change_mark(&self.name(key))
    }

    async fn wait_changed(&self, key: &Key, since: ChangeMark, timeout: Duration) {
        self.inner
            .wait_changed(&self.name(key), since, timeout)
            .await;
    }

    async fn probe_write(&self) -> Result<()> {
        self.inner.probe_write().await
    }
}

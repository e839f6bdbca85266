//! The store contract: a handful of atomic operations on one record each.
//!
//! Every store (memory, SQLite, Postgres, Redis) implements [`Store`] and passes the one conformance
//! suite in `idemgate-conformance`. The engine builds every decision of the contract from these
//! operations and nothing else.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::canonical::Fingerprint;
use crate::change::ChangeMark;
use crate::error::StoreError;
use crate::history::HistoryEntry;
use crate::key::{Key, KeyRule, TenantId, ToolName};
use crate::policy::ToolPolicy;
use crate::record::{Fence, Lease, LeaseToken, Outcome, Record, State};
use crate::time::Timestamp;

/// The result type of store operations.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// A request to hold a record while a side effect runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    /// Which record.
    pub key: Key,
    /// The fingerprint of the call's canonical arguments.
    pub fingerprint: Fingerprint,
    /// The caller's random token; a retried reservation with the same token that finds its own
    /// in-flight record acquires it again, so a lost acknowledgement does not strand the record.
    pub token: LeaseToken,
    /// How long the lease lasts without a heartbeat.
    pub lease_for: Duration,
    /// Where the call was made (a conversation, an MCP session: [`crate::Call::scope`]), kept on
    /// the record it creates so that operators can find a conversation's records. A takeover
    /// keeps the scope of the record it takes over.
    pub scope: Option<Arc<str>>,
}

impl Reservation {
    /// A reservation with a fresh token and no scope.
    pub fn new(key: Key, fingerprint: Fingerprint, lease_for: Duration) -> Self {
        Reservation {
            key,
            fingerprint,
            token: LeaseToken::mint(),
            lease_for,
            scope: None,
        }
    }

    /// The same reservation, made in `scope`.
    pub fn with_scope(mut self, scope: Option<Arc<str>>) -> Self {
        self.scope = scope;
        self
    }
}

/// What a reservation or takeover found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// The caller now holds the record, in flight, with this lease.
    Acquired(Lease),
    /// Someone else's record stands (in flight, completed or unknown); nothing was written.
    Existing(Record),
}

/// The store's confirmation of a completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Completion {
    /// When the outcome was recorded (store clock).
    pub completed_at: Timestamp,
    /// When the record stops counting.
    pub expires_at: Timestamp,
}

/// How long a completed record counts, in two stages: its outcome is replayed for `ttl`; after
/// that, until `tombstone` after its completion, the record is remembered as
/// [`crate::RecordState::Expired`] (a retry is told the action ran and that its result is no
/// longer kept, instead of running again); then it is as if absent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Keep {
    /// How long the outcome is replayed.
    pub ttl: Duration,
    /// How long the record is remembered, counted from its completion like `ttl`; no longer
    /// than `ttl` (zero, say) keeps no tombstone.
    pub tombstone: Duration,
}

impl Keep {
    /// An outcome replayed for `ttl`, with no tombstone after.
    pub fn replay(ttl: Duration) -> Self {
        Keep {
            ttl,
            tombstone: Duration::ZERO,
        }
    }

    /// How a tool's policy keeps a record named by `rule`: the policy's ttl and tombstone for a
    /// key, the window and no tombstone for a record the fallback window named (its arguments
    /// repeated after the window are a new action, which is what a window means).
    pub fn of(rule: KeyRule, policy: &ToolPolicy) -> Self {
        match (rule, policy.fallback_window) {
            (KeyRule::Fallback, Some(window)) => Keep::replay(window),
            _ => Keep {
                ttl: policy.ttl,
                tombstone: policy.tombstone,
            },
        }
    }

    /// When a record completed at `now` stops counting.
    pub fn retain_until(self, now: Timestamp) -> Timestamp {
        now.plus(self.ttl.max(self.tombstone))
    }
}

/// What [`Store::reopen`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reopened {
    /// The completed record at the fence expired now: it counts as absent, and the next
    /// reservation acquires it at the next fence.
    Expired,
    /// Nothing changed: this record counts (in another state, or at another fence), or none does.
    Kept(Option<Record>),
}

/// Which records an operator lists, and from where: one page of a listing.
///
/// Every store lists in one total order, the records' [`ListCursor`] order: creation time, then
/// tenant, tool and key (byte-wise). A page is asked for with [`ListFilter::after`] set to the
/// cursor of the last record of the page before ([`ListCursor::of`]), so that each record that
/// stands for the whole listing is on exactly one page, and a record created meanwhile comes
/// after every record that was there (it is created later) instead of shifting the pages.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListFilter {
    /// Only this tenant's.
    pub tenant: Option<TenantId>,
    /// Only this tool's.
    pub tool: Option<ToolName>,
    /// Only records in this state (expired leases count as unknown, completed records past
    /// their ttl as expired).
    pub state: Option<State>,
    /// Only records reserved in this scope ([`Reservation::scope`]).
    pub scope: Option<Arc<str>>,
    /// Only records whose key starts with this (byte-wise; an empty prefix is every key).
    pub key_prefix: Option<Arc<str>>,
    /// Only records created at or after this.
    pub created_from: Option<Timestamp>,
    /// Only records created before this.
    pub created_before: Option<Timestamp>,
    /// Only records after this one in the listing order: the next page.
    pub after: Option<ListCursor>,
    /// At most this many (0: no limit).
    pub limit: usize,
}

impl ListFilter {
    /// Whether `r` passes the filter (stores that cannot filter on the server use it).
    pub fn matches(&self, r: &Record) -> bool {
        self.tenant.as_ref().is_none_or(|t| *t == r.key.tenant)
            && self.tool.as_ref().is_none_or(|t| *t == r.key.tool)
            && self.state.is_none_or(|s| s == r.state_name())
            && self
                .scope
                .as_ref()
                .is_none_or(|s| r.scope.as_ref() == Some(s))
            && self
                .key_prefix
                .as_deref()
                .is_none_or(|p| r.key.key.as_str().starts_with(p))
            && self.created_from.is_none_or(|t| r.created_at >= t)
            && self.created_before.is_none_or(|t| r.created_at < t)
            && self
                .after
                .as_ref()
                .is_none_or(|c| ListCursor::of(r).sort_key() > c.sort_key())
    }

    /// The same filter without the page: every record it selects, from the first.
    pub fn whole(&self) -> ListFilter {
        ListFilter {
            after: None,
            limit: 0,
            ..self.clone()
        }
    }
}

/// Where a listing stands: the sort key of the last record a page held. Opaque to callers, who
/// pass it back as text (its `Display`, read back by [`str::parse`]) to get the page after.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ListCursor {
    /// The record's creation time.
    pub created_at: Timestamp,
    /// The record's name.
    pub key: Key,
}

impl ListCursor {
    /// The cursor just after `r`: the next page starts with the record after it.
    pub fn of(r: &Record) -> Self {
        ListCursor {
            created_at: r.created_at,
            key: r.key.clone(),
        }
    }

    /// What the listing order compares: creation time, then tenant, tool and key byte-wise.
    pub fn sort_key(&self) -> (Timestamp, &str, &str, &str) {
        (
            self.created_at,
            self.key.tenant.as_str(),
            self.key.tool.as_str(),
            self.key.key.as_str(),
        )
    }
}

/// The text of a cursor: `c1.<created ms>.<tenant>.<tool>.<key>`, each name in hex, so that it
/// travels in a URL's query and a shell argument as it is, whatever characters a key has.
impl std::fmt::Display for ListCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "c1.{}.{}.{}.{}",
            self.created_at.as_millis(),
            crate::key::hex(self.key.tenant.as_str().as_bytes()),
            crate::key::hex(self.key.tool.as_str().as_bytes()),
            crate::key::hex(self.key.key.as_str().as_bytes()),
        )
    }
}

impl std::str::FromStr for ListCursor {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let bad =
            || format!("not a listing cursor: {s:?} (pass back the `next` of a page as it is)");
        let mut parts = s.split('.');
        if parts.next() != Some("c1") {
            return Err(bad());
        }
        let mut next = || parts.next().ok_or_else(bad);
        let created: i64 = next()?.parse().map_err(|_| bad())?;
        let mut name = || -> std::result::Result<String, String> {
            let bytes = crate::key::unhex(next()?).ok_or_else(bad)?;
            String::from_utf8(bytes).map_err(|_| bad())
        };
        let (tenant, tool, key) = (name()?, name()?, name()?);
        if parts.next().is_some() {
            return Err(bad());
        }
        let key = Key::new(
            TenantId::new(tenant).map_err(|_| bad())?,
            ToolName::new(tool).map_err(|_| bad())?,
            crate::key::IdempotencyKey::new(key).map_err(|_| bad())?,
        );
        Ok(ListCursor {
            created_at: Timestamp::from_millis(created),
            key,
        })
    }
}

/// A key-value store of idempotency records.
///
/// Each operation is atomic on its one record. Records are judged by the store's clock: a
/// completed record past `expires_at` is reported as [`crate::RecordState::Expired`] (its
/// tombstone) until `retain_until`, and counts as absent after; an in-flight record past
/// `lease_until` is reported as [`crate::RecordState::Unknown`] (since the lease's end) but keeps
/// its lease, so its holder can still complete it truthfully until somebody takes it over.
///
/// # Concurrent calls on the same key
/// Exactly one of any number of racing [`Store::reserve`] calls acquires an absent record; the
/// others see it. Every write that names a [`Lease`] is a compare-and-set on the record's current
/// fence and token, so a holder whose record was taken over, released or resolved gets
/// [`StoreError::LeaseLost`] and changes nothing.
///
/// # Cancellation
/// Dropping any returned future leaves the record either untouched or fully written, never half
/// written: each operation is one atomic step on the store.
///
/// # Errors
/// [`StoreError::Unavailable`] when the write certainly did not happen, [`StoreError::Indeterminate`]
/// when it may have; the engine fails closed on both at reservation time.
pub trait Store: Send + Sync + 'static {
    /// Inserts an in-flight record if none counts (absent, or completed and past its tombstone).
    /// A tombstone counts: it is returned as [`Claim::Existing`].
    ///
    /// Returns [`Claim::Acquired`] when it inserted one, and also when the record is already in
    /// flight under this reservation's token (a retried reservation whose answer was lost).
    fn reserve(&self, r: &Reservation) -> impl Future<Output = Result<Claim>> + Send;

    /// Takes over an unknown record (lease expired, or marked unknown) whose fence is `stale` and
    /// whose fingerprint is the reservation's: it becomes in flight with fence `stale + 1` under the
    /// reservation's token. A record in any other state is returned as [`Claim::Existing`]; an
    /// absent one is reserved as by [`Store::reserve`].
    fn takeover(&self, r: &Reservation, stale: Fence)
        -> impl Future<Output = Result<Claim>> + Send;

    /// Extends the lease of an in-flight record held under `lease` to `lease_for` from now, and
    /// returns the new end of the lease.
    fn heartbeat(
        &self,
        key: &Key,
        lease: Lease,
        lease_for: Duration,
    ) -> impl Future<Output = Result<Timestamp>> + Send;

    /// Stores the outcome of the record held under `lease` (in flight, or unknown under the same
    /// lease), replayed for `ttl`, with no tombstone after. Completing again with the same lease
    /// is a no-op that returns the first completion, so a retry after a lost answer is safe.
    fn complete(
        &self,
        key: &Key,
        lease: Lease,
        outcome: &Outcome,
        ttl: Duration,
    ) -> impl Future<Output = Result<Completion>> + Send {
        self.complete_at(key, lease, outcome, Keep::replay(ttl), None)
    }

    /// As [`Store::complete`], kept as `keep` says (with a tombstone after the ttl when it has
    /// one), for an outcome the side effect reported at `executed_at` when given and that is
    /// stored only now (a journaled completion flushed after the store was back): the record's
    /// completion time is `executed_at` (never later than now, by the store's clock), so replays
    /// say when the side effect ran, not when the journal was flushed. It is still kept from now:
    /// a late flush never shortens how long duplicates are answered.
    fn complete_at(
        &self,
        key: &Key,
        lease: Lease,
        outcome: &Outcome,
        keep: Keep,
        executed_at: Option<Timestamp>,
    ) -> impl Future<Output = Result<Completion>> + Send;

    /// Removes the record held under `lease` (the side effect did not happen). Removing an absent
    /// record succeeds, so a retry after a lost answer is safe.
    fn release(&self, key: &Key, lease: Lease) -> impl Future<Output = Result<()>> + Send;

    /// Marks the record held under `lease` unknown now (the tool said the outcome is ambiguous).
    fn mark_unknown(&self, key: &Key, lease: Lease) -> impl Future<Output = Result<()>> + Send;

    /// Makes the completed record of `key` count as absent now if its fence is `fence` (a
    /// compare-and-set on the fence an operator looked at), so that the next call runs the action
    /// again: the record expires now, and so does its tombstone (a record already reported
    /// expired is reopened the same way). It is not deleted, so that it keeps its fence: the next
    /// reservation takes the next fence, as after any expiry, and a reopening retried at this
    /// fence can never meet the record of the call that ran again. (Until a purge deletes the row:
    /// a record reserved after that starts at fence 1 again, so a reopening retried that late at
    /// fence 1 could meet it. Operators act on what they just looked at; a purge runs on records
    /// whose time is up.) Anything else (a record in
    /// flight or unknown, another fence, an expired or absent record) is left as it is and
    /// returned as [`Reopened::Kept`]. Stores with change notifications wake the record's
    /// waiters, as on a release. (The engine reopens unknown records with a takeover and a
    /// completion that expires at once: see [`crate::Engine::reopen`].)
    fn reopen(&self, key: &Key, fence: Fence) -> impl Future<Output = Result<Reopened>> + Send;

    /// The record, if one counts.
    fn get(&self, key: &Key) -> impl Future<Output = Result<Option<Record>>> + Send;

    /// Appends `entry` to the history of the record stored under `key` ([`crate::history`]), in
    /// whatever state it is, also one that counts as absent and is not purged yet. Returns
    /// whether a record was there to take it. One atomic append: concurrent appends all land,
    /// in some order.
    fn append_history(
        &self,
        key: &Key,
        entry: &HistoryEntry,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// The history of the record stored under `key`, oldest first: empty when it has none, or
    /// when no record is stored (a purge deletes a record's history with it). A record that
    /// counts as absent but is still stored (reopened, released by an operator, expired past
    /// its tombstone and not purged yet) still has its history; so does the record a later
    /// reservation of the same key makes there, which continues it.
    fn history(&self, key: &Key) -> impl Future<Output = Result<Vec<HistoryEntry>>> + Send;

    /// Records that pass `filter`, oldest first. Tombstones are listed (as expired); completed
    /// records past their tombstone are left out.
    fn list(&self, filter: &ListFilter) -> impl Future<Output = Result<Vec<Record>>> + Send;

    /// How many records pass `filter` (its page ignored: [`ListFilter::whole`]), counting at most
    /// `at_most` of them, so that a count over a large table stays bounded. The default lists
    /// them; stores that can count on the server do.
    fn count(
        &self,
        filter: &ListFilter,
        at_most: usize,
    ) -> impl Future<Output = Result<usize>> + Send {
        let mut whole = filter.whole();
        whole.limit = at_most;
        async move {
            if at_most == 0 {
                return Ok(0);
            }
            Ok(self.list(&whole).await?.len().min(at_most))
        }
    }

    /// Deletes completed records past their tombstone and returns how many went; drops the
    /// outcomes of those past their ttl whose tombstone stays (they are never read again).
    /// Unknown records are never purged: they wait for an operator.
    fn purge_expired(&self) -> impl Future<Output = Result<u64>> + Send;

    /// Where the change notifications of `key` stand now. A waiting duplicate takes the mark
    /// *before* it looks at the record and hands it to [`Store::wait_changed`], so that a change
    /// landing between its look and its wait is not missed. The default, for stores
    /// without notifications of their own, is a mark that never moves.
    fn change_mark(&self, key: &Key) -> ChangeMark {
        let _ = key;
        ChangeMark::default()
    }

    /// Waits until the record may have changed since `since` (a [`Store::change_mark`] taken
    /// before the caller's last look), or `timeout` passed. Waiting duplicates call it between
    /// looks; stores with change notifications wake early (at once when the change landed
    /// before the wait began), others poll.
    fn wait_changed(
        &self,
        key: &Key,
        since: ChangeMark,
        timeout: Duration,
    ) -> impl Future<Output = ()> + Send {
        let _ = (key, since);
        tokio::time::sleep(timeout.min(DEFAULT_POLL))
    }

    /// Checks that the store takes writes now, for readiness probes: a store that answers reads
    /// may still refuse every write (read-only files, a full disk, a replica).
    ///
    /// The default reserves [`probe_key`] under this process's own token and releases it: two
    /// real writes, through the same path as every call. A probe whose release failed leaves its
    /// record in flight until this process's next probe acquires it again (same token) and
    /// releases it; no other process ever meets that record.
    ///
    /// # Errors
    /// The store's error for either write.
    fn probe_write(&self) -> impl Future<Output = Result<()>> + Send {
        async move {
            let (key, token) = probe_key();
            let r = Reservation {
                key: key.clone(),
                fingerprint: Fingerprint::of_bytes(b"idemgate write probe"),
                token,
                lease_for: Duration::from_secs(60),
                scope: None,
            };
            match self.reserve(&r).await? {
                Claim::Acquired(lease) => self.release(&key, lease).await,
                Claim::Existing(rec) => Err(StoreError::unavailable(format!(
                    "failed to probe a write: the probe record is held by another lease (fence {})",
                    rec.fence
                ))),
            }
        }
    }
}

/// The record [`Store::probe_write`] writes, and the token it holds it with: one per process
/// (tenant `idemgate`, tool `readyz`, key `probe-<random>`), so that the probes of several
/// gateways on one store never meet.
pub fn probe_key() -> (Key, LeaseToken) {
    static PROBE: std::sync::OnceLock<(Key, LeaseToken)> = std::sync::OnceLock::new();
    PROBE
        .get_or_init(|| {
            let token = LeaseToken::mint();
            let key = Key::new(
                TenantId::new("idemgate").expect("a valid tenant id"),
                ToolName::new("readyz").expect("a valid tool name"),
                crate::key::IdempotencyKey::new(format!("probe-{}", token.to_hex()))
                    .expect("a valid key"),
            );
            (key, token)
        })
        .clone()
}

/// How often a waiting duplicate looks again on stores without change notifications.
pub const DEFAULT_POLL: Duration = Duration::from_millis(20);

impl<S: Store> Store for std::sync::Arc<S> {
    fn reserve(&self, r: &Reservation) -> impl Future<Output = Result<Claim>> + Send {
        (**self).reserve(r)
    }
    fn takeover(
        &self,
        r: &Reservation,
        stale: Fence,
    ) -> impl Future<Output = Result<Claim>> + Send {
        (**self).takeover(r, stale)
    }
    fn heartbeat(
        &self,
        key: &Key,
        lease: Lease,
        lease_for: Duration,
    ) -> impl Future<Output = Result<Timestamp>> + Send {
        (**self).heartbeat(key, lease, lease_for)
    }
    fn complete_at(
        &self,
        key: &Key,
        lease: Lease,
        outcome: &Outcome,
        keep: Keep,
        executed_at: Option<Timestamp>,
    ) -> impl Future<Output = Result<Completion>> + Send {
        (**self).complete_at(key, lease, outcome, keep, executed_at)
    }
    fn release(&self, key: &Key, lease: Lease) -> impl Future<Output = Result<()>> + Send {
        (**self).release(key, lease)
    }
    fn mark_unknown(&self, key: &Key, lease: Lease) -> impl Future<Output = Result<()>> + Send {
        (**self).mark_unknown(key, lease)
    }
    fn reopen(&self, key: &Key, fence: Fence) -> impl Future<Output = Result<Reopened>> + Send {
        (**self).reopen(key, fence)
    }
    fn get(&self, key: &Key) -> impl Future<Output = Result<Option<Record>>> + Send {
        (**self).get(key)
    }
    fn append_history(
        &self,
        key: &Key,
        entry: &HistoryEntry,
    ) -> impl Future<Output = Result<bool>> + Send {
        (**self).append_history(key, entry)
    }
    fn history(&self, key: &Key) -> impl Future<Output = Result<Vec<HistoryEntry>>> + Send {
        (**self).history(key)
    }
    fn list(&self, filter: &ListFilter) -> impl Future<Output = Result<Vec<Record>>> + Send {
        (**self).list(filter)
    }
    fn count(
        &self,
        filter: &ListFilter,
        at_most: usize,
    ) -> impl Future<Output = Result<usize>> + Send {
        (**self).count(filter, at_most)
    }
    fn purge_expired(&self) -> impl Future<Output = Result<u64>> + Send {
        (**self).purge_expired()
    }
    fn change_mark(&self, key: &Key) -> ChangeMark {
        (**self).change_mark(key)
    }
    fn wait_changed(
        &self,
        key: &Key,
        since: ChangeMark,
        timeout: Duration,
    ) -> impl Future<Output = ()> + Send {
        (**self).wait_changed(key, since, timeout)
    }
    fn probe_write(&self) -> impl Future<Output = Result<()>> + Send {
        (**self).probe_write()
    }
}

/// How a store that has two exact ways of reserving a record (Postgres, Redis) picks one. The
/// ways give the same answers and differ only in cost: inserting first (one atomic statement or
/// script that reads the record and writes only where none counts) costs a fresh call one round
/// trip, while reading first (a plain read, then that write only where no record counts) costs a
/// duplicate a plain read that writes nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReservePath {
    /// Insert first while recent reservations mostly found no record, read first while they
    /// mostly found one (a retry storm): see [`ReserveHistory`].
    #[default]
    Adaptive,
    /// Always insert first.
    InsertFirst,
    /// Always read first.
    ReadFirst,
}

/// What recent reservations found, for [`ReservePath::Adaptive`]: a count within `0..=16` that
/// each reservation finding a record standing moves up and each finding none moves down; past the
/// middle, reservations read first. About eight reservations in a row switch it.
#[derive(Debug, Default)]
pub struct ReserveHistory {
    found: std::sync::atomic::AtomicU32,
}

impl ReserveHistory {
    const MAX: u32 = 16;

    /// Whether the next reservation reads first, on `path`.
    pub fn read_first(&self, path: ReservePath) -> bool {
        match path {
            ReservePath::Adaptive => {
                self.found.load(std::sync::atomic::Ordering::Relaxed) > Self::MAX / 2
            }
            ReservePath::InsertFirst => false,
            ReservePath::ReadFirst => true,
        }
    }

    /// Counts a reservation that found a record standing (`true`) or none.
    pub fn record(&self, found: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        let _ = self.found.fetch_update(Relaxed, Relaxed, |n| match found {
            true => (n < Self::MAX).then(|| n + 1),
            false => n.checked_sub(1),
        });
    }
}

#[cfg(test)]
mod reserve_history_tests {
    use super::*;

    #[test]
    fn adaptive_reads_first_after_a_run_of_duplicates_and_inserts_first_after_fresh_calls() {
        let h = ReserveHistory::default();
        assert!(
            !h.read_first(ReservePath::Adaptive),
            "starts inserting first"
        );
        for _ in 0..8 {
            h.record(true);
        }
        assert!(
            !h.read_first(ReservePath::Adaptive),
            "eight duplicates are not yet a run"
        );
        h.record(true);
        assert!(h.read_first(ReservePath::Adaptive));
        // Saturates: a long storm is left after as few fresh calls as a short one.
        for _ in 0..1000 {
            h.record(true);
        }
        for _ in 0..8 {
            h.record(false);
        }
        assert!(!h.read_first(ReservePath::Adaptive));
        for _ in 0..1000 {
            h.record(false);
        }
        h.record(true);
        assert!(
            !h.read_first(ReservePath::Adaptive),
            "saturates at zero too"
        );
        assert!(h.read_first(ReservePath::ReadFirst));
        assert!(!h.read_first(ReservePath::InsertFirst));
    }
}

#[cfg(test)]
mod list_cursor_tests {
    use super::*;
    use crate::key::IdempotencyKey;

    fn cursor(key: &str) -> ListCursor {
        ListCursor {
            created_at: Timestamp::from_millis(1_800_000_000_123),
            key: Key::new(
                TenantId::new("acme").unwrap(),
                ToolName::new("charge").unwrap(),
                IdempotencyKey::new(key).unwrap(),
            ),
        }
    }

    #[test]
    fn a_cursor_reads_back_from_its_text_whatever_its_key_holds() {
        for key in ["order-1", "a.b.c", "with/slash?&=#%", "~!\"'`"] {
            let c = cursor(key);
            let text = c.to_string();
            assert!(
                text.chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || ch == '.'),
                "travels in a URL as it is: {text}"
            );
            assert_eq!(text.parse::<ListCursor>(), Ok(c), "{text}");
        }
    }

    #[test]
    fn text_that_is_no_cursor_is_refused() {
        let good = cursor("k").to_string();
        for bad in [
            String::new(),
            "nonsense".to_owned(),
            good.replacen("c1.", "c2.", 1),
            format!("{good}.00"),
            good[..good.len() - 1].to_owned(),
            good.replacen(".61636d65.", ".zz.", 1),
            // An empty tenant is no tenant.
            good.replacen(".61636d65.", "..", 1),
        ] {
            assert!(bad.parse::<ListCursor>().is_err(), "{bad:?} was read");
        }
    }

    #[test]
    fn the_filter_keeps_only_records_after_the_cursor_in_the_listing_order() {
        let at = cursor("m");
        let filter = ListFilter {
            after: Some(at.clone()),
            ..ListFilter::default()
        };
        let record = |ms: i64, key: &str| {
            let c = cursor(key);
            Record {
                key: c.key,
                fingerprint: crate::Fingerprint::of_bytes(b""),
                fence: 1,
                created_at: Timestamp::from_millis(ms),
                scope: None,
                state: crate::RecordState::Unknown {
                    since: Timestamp::from_millis(ms),
                },
            }
        };
        let ms = at.created_at.as_millis();
        assert!(!filter.matches(&record(ms, "m")), "the cursor's own record");
        assert!(
            !filter.matches(&record(ms, "a")),
            "earlier in the same millisecond"
        );
        assert!(
            filter.matches(&record(ms, "z")),
            "later in the same millisecond"
        );
        assert!(filter.matches(&record(ms + 1, "a")), "a later millisecond");
        assert!(
            !filter.matches(&record(ms - 1, "z")),
            "an earlier millisecond"
        );
    }
}

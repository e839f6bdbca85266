//! The record state machine as pure functions: current stored record in, answer and change out.
//!
//! Stores that can read and write a record atomically (the memory store under its lock, SQLite in
//! one write transaction) apply these functions and write the [`Change`], so they cannot drift
//! apart. Stores that must run the logic on the server (Postgres statements, Redis scripts) mirror
//! it, and the conformance suite holds them to it.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::canonical::Fingerprint;
use crate::error::StoreError;
use crate::key::Key;
use crate::record::{Fence, Lease, LeaseToken, Outcome, Record, RecordState};
use crate::store::{Claim, Completion, Keep, Reopened, Reservation, Result};
use crate::time::Timestamp;

/// A record as a store keeps it: the public [`Record`] plus the holder's token.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredRecord {
    /// The record's name.
    pub key: Key,
    /// The fingerprint of the reserving call's arguments.
    pub fingerprint: Fingerprint,
    /// The current fence.
    pub fence: Fence,
    /// The current holder's token.
    pub token: LeaseToken,
    /// When this incarnation was reserved.
    pub created_at: Timestamp,
    /// Where the reserving call was made, if it said ([`Reservation::scope`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<Arc<str>>,
    /// The state as written (an in-flight record stays in flight when its lease ends; only its view
    /// changes).
    pub state: RecordState,
}

/// What the store must write after an operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Nothing.
    Keep,
    /// Insert or replace the record.
    Put(StoredRecord),
    /// Keep the record, with this state (its other fields are unchanged).
    SetState(RecordState),
    /// Delete the record.
    Delete,
}

impl Change {
    /// The change with [`Change::SetState`] spelled out as a whole record, for stores that write
    /// whole rows; `cur` is the record the change was computed from.
    pub fn into_put(self, cur: Option<&StoredRecord>) -> Change {
        match (self, cur) {
            (Change::SetState(state), Some(c)) => Change::Put(StoredRecord { state, ..c.clone() }),
            // The transitions only set the state of a record they found.
            (Change::SetState(_), None) => Change::Keep,
            (other, _) => other,
        }
    }
}

impl StoredRecord {
    /// The record as callers see it at `now`: `None` when it no longer counts (completed and
    /// past its tombstone), expired when completed and past its ttl, unknown when an in-flight
    /// lease has run out.
    pub fn view(&self, now: Timestamp) -> Option<Record> {
        let state = match &self.state {
            RecordState::Completed {
                completed_at,
                expires_at,
                retain_until,
                ..
            } if *expires_at <= now => {
                if *retain_until <= now {
                    return None;
                }
                RecordState::Expired {
                    completed_at: *completed_at,
                    expired_at: *expires_at,
                    retain_until: *retain_until,
                }
            }
            // Stores write completed records, never this view; one read back counts as such.
            RecordState::Expired { retain_until, .. } if *retain_until <= now => return None,
            RecordState::InFlight { lease_until } if *lease_until <= now => RecordState::Unknown {
                since: *lease_until,
            },
            other => other.clone(),
        };
        Some(Record {
            key: self.key.clone(),
            fingerprint: self.fingerprint,
            fence: self.fence,
            created_at: self.created_at,
            scope: self.scope.clone(),
            state,
        })
    }

    fn holds(&self, lease: Lease) -> bool {
        self.fence == lease.fence && self.token == lease.token
    }

    fn lease(&self) -> Lease {
        Lease {
            fence: self.fence,
            token: self.token,
        }
    }

    fn fresh(
        r: &Reservation,
        fence: Fence,
        created_at: Timestamp,
        scope: Option<Arc<str>>,
        now: Timestamp,
    ) -> Self {
        StoredRecord {
            key: r.key.clone(),
            fingerprint: r.fingerprint,
            fence,
            token: r.token,
            created_at,
            scope,
            state: RecordState::InFlight {
                lease_until: now.plus(r.lease_for),
            },
        }
    }
}

/// See [`crate::Store::reserve`].
pub fn reserve(cur: Option<&StoredRecord>, r: &Reservation, now: Timestamp) -> (Claim, Change) {
    match cur.and_then(|c| c.view(now).map(|v| (c, v))) {
        None => {
            // A record replaced after expiry keeps counting its fence up, so fences only grow.
            let fence = cur.map_or(1, |c| c.fence + 1);
            let rec = StoredRecord::fresh(r, fence, now, r.scope.clone(), now);
            (Claim::Acquired(rec.lease()), Change::Put(rec))
        }
        Some((c, _)) if c.token == r.token && matches!(c.state, RecordState::InFlight { .. }) => {
            (Claim::Acquired(c.lease()), Change::Keep)
        }
        Some((_, view)) => (Claim::Existing(view), Change::Keep),
    }
}

/// See [`crate::Store::takeover`].
pub fn takeover(
    cur: Option<&StoredRecord>,
    r: &Reservation,
    stale: Fence,
    now: Timestamp,
) -> (Claim, Change) {
    let Some((c, view)) = cur.and_then(|c| c.view(now).map(|v| (c, v))) else {
        return reserve(cur, r, now);
    };
    if c.token == r.token && matches!(c.state, RecordState::InFlight { .. }) {
        // Our own takeover, retried after a lost answer.
        return (Claim::Acquired(c.lease()), Change::Keep);
    }
    let unknown = matches!(view.state, RecordState::Unknown { .. });
    if unknown && c.fence == stale && c.fingerprint == r.fingerprint {
        // The same action, run again: it keeps when and where it was first reserved.
        let rec = StoredRecord::fresh(r, stale + 1, c.created_at, c.scope.clone(), now);
        return (Claim::Acquired(rec.lease()), Change::Put(rec));
    }
    (Claim::Existing(view), Change::Keep)
}

/// See [`crate::Store::heartbeat`].
pub fn heartbeat(
    cur: Option<&StoredRecord>,
    lease: Lease,
    lease_for: Duration,
    now: Timestamp,
) -> Result<(Timestamp, Change)> {
    match cur {
        Some(c) if c.holds(lease) && matches!(c.state, RecordState::InFlight { .. }) => {
            let lease_until = now.plus(lease_for);
            Ok((
                lease_until,
                Change::SetState(RecordState::InFlight { lease_until }),
            ))
        }
        _ => Err(StoreError::LeaseLost),
    }
}

/// See [`crate::Store::complete_at`].
pub fn complete(
    cur: Option<&StoredRecord>,
    lease: Lease,
    outcome: &Outcome,
    keep: Keep,
    executed_at: Option<Timestamp>,
    now: Timestamp,
) -> Result<(Completion, Change)> {
    match cur {
        Some(c) if c.holds(lease) => match &c.state {
            RecordState::Completed {
                completed_at,
                expires_at,
                ..
            }
            | RecordState::Expired {
                completed_at,
                expired_at: expires_at,
                ..
            } => Ok((
                Completion {
                    completed_at: *completed_at,
                    expires_at: *expires_at,
                },
                Change::Keep,
            )),
            RecordState::InFlight { .. } | RecordState::Unknown { .. } => {
                let (done, state) = completed(outcome, keep, executed_at, now);
                Ok((done, Change::SetState(state)))
            }
        },
        _ => Err(StoreError::LeaseLost),
    }
}

/// The state a completion at `now` gives a record in flight or unknown that its lease holds (see
/// [`complete`]), and what the completion answers. A store that can write it under that
/// condition in one statement does so without reading the record first.
pub fn completed(
    outcome: &Outcome,
    keep: Keep,
    executed_at: Option<Timestamp>,
    now: Timestamp,
) -> (Completion, RecordState) {
    let done = Completion {
        completed_at: executed_at.map_or(now, |at| at.min(now)),
        expires_at: now.plus(keep.ttl),
    };
    let state = RecordState::Completed {
        outcome: outcome.clone(),
        completed_at: done.completed_at,
        expires_at: done.expires_at,
        retain_until: keep.retain_until(now),
    };
    (done, state)
}

/// See [`crate::Store::release`].
pub fn release(cur: Option<&StoredRecord>, lease: Lease) -> Result<Change> {
    match cur {
        None => Ok(Change::Keep),
        Some(c)
            if c.holds(lease)
                && matches!(
                    c.state,
                    RecordState::InFlight { .. } | RecordState::Unknown { .. }
                ) =>
        {
            Ok(Change::Delete)
        }
        Some(_) => Err(StoreError::LeaseLost),
    }
}

/// See [`crate::Store::reopen`].
pub fn reopen(cur: Option<&StoredRecord>, fence: Fence, now: Timestamp) -> (Reopened, Change) {
    let Some((c, view)) = cur.and_then(|c| c.view(now).map(|v| (c, v))) else {
        return (Reopened::Kept(None), Change::Keep);
    };
    match &c.state {
        // A completed record that still counts, replayed or remembered as expired.
        RecordState::Completed {
            outcome,
            completed_at,
            expires_at,
            ..
        } if c.fence == fence => {
            // Expired now, tombstone and all, rather than deleted: the row keeps its fence, so
            // the next reservation takes the next one, and a retried reopening at this fence
            // never meets the new record (which a fence starting over at 1 would let it remove).
            let state = RecordState::Completed {
                outcome: outcome.clone(),
                completed_at: *completed_at,
                expires_at: (*expires_at).min(now),
                retain_until: now,
            };
            (Reopened::Expired, Change::SetState(state))
        }
        _ => (Reopened::Kept(Some(view)), Change::Keep),
    }
}

/// See [`crate::Store::mark_unknown`].
pub fn mark_unknown(cur: Option<&StoredRecord>, lease: Lease, now: Timestamp) -> Result<Change> {
    match cur {
        Some(c) if c.holds(lease) => match c.state {
            RecordState::InFlight { .. } => {
                Ok(Change::SetState(RecordState::Unknown { since: now }))
            }
            RecordState::Unknown { .. } => Ok(Change::Keep),
            RecordState::Completed { .. } | RecordState::Expired { .. } => {
                Err(StoreError::LeaseLost)
            }
        },
        _ => Err(StoreError::LeaseLost),
    }
}

/// Whether a stored record should be purged at `now` (completed, and past its tombstone).
pub fn is_purgeable(c: &StoredRecord, now: Timestamp) -> bool {
    matches!(c.state, RecordState::Completed { retain_until, .. } if retain_until <= now)
}

/// What purging does to a stored record at `now`: deletes it past its tombstone
/// ([`is_purgeable`]); drops the outcome of one past its ttl whose tombstone stays (nothing
/// reads it any more, and a tombstone should cost its name and a few numbers, not a result);
/// else nothing.
pub fn purge(c: &StoredRecord, now: Timestamp) -> Change {
    match &c.state {
        _ if is_purgeable(c, now) => Change::Delete,
        RecordState::Completed {
            outcome,
            completed_at,
            expires_at,
            retain_until,
        } if *expires_at <= now && !outcome.body.is_empty() => {
            Change::SetState(RecordState::Completed {
                outcome: Outcome {
                    kind: outcome.kind,
                    body: Vec::new(),
                },
                completed_at: *completed_at,
                expires_at: *expires_at,
                retain_until: *retain_until,
            })
        }
        _ => Change::Keep,
    }
}

//! Rows of `idemgate_record` to and from [`StoredRecord`]s.

use idemgate_core::transition::{Change, StoredRecord};
use idemgate_core::{
    Fence, Fingerprint, HostInstant, IdempotencyKey, Key, Lease, LeaseToken, Now, Outcome,
    OutcomeKind, RecordState, StoreError, TenantId, Timestamp, ToolName,
};
use rusqlite::{params, Connection, OptionalExtension, Row};

use crate::error::{corrupt, write_stage, Context, Stage};

/// The `state` column of an in-flight record.
pub(crate) const IN_FLIGHT: i64 = 0;
/// The `state` column of a completed record.
pub(crate) const COMPLETED: i64 = 1;
/// The `state` column of an unknown record.
pub(crate) const UNKNOWN: i64 = 2;

const SUCCESS: i64 = 0;
const FAILED: i64 = 1;

/// The columns [`decode`] reads, in its order.
macro_rules! columns {
    () => {
        "tenant, tool, key, fingerprint, fence, token, created_at, state, lease_until, since, \
         completed_at, expires_at, outcome_kind, outcome_body, scope, retain_until, lease_boot, \
         lease_steady"
    };
}
pub(crate) use columns;

const SELECT_ONE: &str = concat!(
    "SELECT ",
    columns!(),
    " FROM idemgate_record WHERE tenant = ?1 AND tool = ?2 AND key = ?3"
);

// A write that read the row first in the same transaction knows whether it exists: a new row is a
// plain INSERT and an existing one an UPDATE in place. (An upsert would try the insert first, find
// the key taken and only then update, on every completion.) A fresh call's two writes skip the
// read: `insert_new` tries the INSERT and reports a taken key, `set_state_if_held` updates the
// state of a row its lease holds.
const INSERT: &str = concat!(
    "INSERT INTO idemgate_record (",
    columns!(),
    ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18)"
);

const UPDATE: &str = "UPDATE idemgate_record SET fingerprint = ?4, fence = ?5, token = ?6, \
     created_at = ?7, state = ?8, lease_until = ?9, since = ?10, completed_at = ?11, \
     expires_at = ?12, outcome_kind = ?13, outcome_body = ?14, scope = ?15, \
     retain_until = ?16, lease_boot = ?17, lease_steady = ?18 \
     WHERE tenant = ?1 AND tool = ?2 AND key = ?3";

/// The state columns of a row that the lease (`?4`, `?5`) holds, in flight or unknown.
const SET_STATE_IF_HELD: &str = "UPDATE idemgate_record SET state = ?6, lease_until = ?7, \
     since = ?8, completed_at = ?9, expires_at = ?10, outcome_kind = ?11, outcome_body = ?12, \
     retain_until = ?13, lease_boot = ?14, lease_steady = ?15 \
     WHERE tenant = ?1 AND tool = ?2 AND key = ?3 AND fence = ?4 AND token = ?5 \
     AND state IN (0, 2)";

const DELETE: &str = "DELETE FROM idemgate_record WHERE tenant = ?1 AND tool = ?2 AND key = ?3";

/// Reads the stored record under `key`, if a row exists (expired or not), as seen at the time
/// `now` reads once the row is read.
pub(crate) fn load(
    conn: &Connection,
    key: &Key,
    stage: Stage,
    now: impl FnOnce() -> Now,
) -> Result<Option<StoredRecord>, StoreError> {
    let what = || format!("read record {key}");
    let mut stmt = conn.prepare_cached(SELECT_ONE).during(stage, what)?;
    let found = stmt
        .query_row(
            params![key.tenant.as_str(), key.tool.as_str(), key.key.as_str()],
            |row| Ok(decode(row, now())),
        )
        .optional()
        .during(stage, what)?;
    found.transpose()
}

/// Writes `change` (computed from `cur`, the row as read at `now`) to the row of `key`; returns
/// whether anything was written.
pub(crate) fn apply(
    conn: &Connection,
    key: &Key,
    cur: Option<&StoredRecord>,
    change: Change,
    now: Now,
) -> Result<bool, StoreError> {
    match change.into_put(cur) {
        Change::Keep | Change::SetState(_) => Ok(false),
        Change::Put(rec) => {
            put(conn, &rec, cur.is_some(), now)?;
            Ok(true)
        }
        Change::Delete => {
            conn.prepare_cached(DELETE)
                .and_then(|mut stmt| {
                    stmt.execute(params![
                        key.tenant.as_str(),
                        key.tool.as_str(),
                        key.key.as_str()
                    ])
                })
                .during(Stage::Write, || format!("delete record {key}"))?;
            Ok(true)
        }
    }
}

/// The columns that say a record's state, as [`decode`] reads them back.
struct StateColumns<'a> {
    state: i64,
    lease_until: Option<i64>,
    since: Option<i64>,
    completed_at: Option<i64>,
    expires_at: Option<i64>,
    kind: Option<i64>,
    body: Option<&'a [u8]>,
    retain_until: Option<i64>,
    lease_boot: Option<[u8; 16]>,
    lease_steady: Option<i64>,
}

impl<'a> StateColumns<'a> {
    /// The columns of `state`, written at `now`; `what` names the write in an error.
    fn of(state: &'a RecordState, now: Now, what: &dyn Fn() -> String) -> Result<Self, StoreError> {
        let mut c = StateColumns {
            state: IN_FLIGHT,
            lease_until: None,
            since: None,
            completed_at: None,
            expires_at: None,
            kind: None,
            body: None,
            retain_until: None,
            lease_boot: None,
            lease_steady: None,
        };
        match state {
            RecordState::InFlight { lease_until } => {
                c.lease_until = Some(lease_until.as_millis());
                // The lease's end on the boot clock too, which judges it on this boot (see
                // `decode`).
                if let Some(d) = now.steady_deadline(*lease_until) {
                    c.lease_boot = Some(d.boot.to_be_bytes());
                    c.lease_steady = Some(d.millis);
                }
            }
            RecordState::Completed {
                outcome,
                completed_at,
                expires_at,
                retain_until,
            } => {
                c.state = COMPLETED;
                c.completed_at = Some(completed_at.as_millis());
                c.expires_at = Some(expires_at.as_millis());
                // Always written, also when it equals `expires_at`: NULL is left to rows
                // completed before version 4 of the schema.
                c.retain_until = Some(retain_until.as_millis());
                c.kind = Some(match outcome.kind {
                    OutcomeKind::Success => SUCCESS,
                    OutcomeKind::Failed => FAILED,
                });
                c.body = Some(outcome.body.as_slice());
            }
            RecordState::Unknown { since } => {
                c.state = UNKNOWN;
                c.since = Some(since.as_millis());
            }
            // The view of a completed row past its ttl, which `decode` never returns and the
            // transitions never write back: a completed row is what holds it. Refused rather
            // than guessed (its outcome's kind is not in it); the transaction writes nothing.
            RecordState::Expired { .. } => {
                return Err(StoreError::unavailable(format!(
                    "failed to {}: it is an expired view, which is never stored",
                    what()
                )))
            }
        }
        Ok(c)
    }
}

/// Writes `rec`, judged at `now`: over the row that `exists` (read in this transaction), or as a
/// new one.
fn put(conn: &Connection, rec: &StoredRecord, exists: bool, now: Now) -> Result<(), StoreError> {
    let what = || format!("write record {}", rec.key);
    let written = write_row(conn, rec, exists, now)?.during(write_stage(conn), what)?;
    if written != 1 {
        // The row read a moment ago in the same transaction is gone: nothing else writes while
        // this transaction holds the write lock, so the file is not what the store believes.
        return Err(corrupt(
            what(),
            format!("{written} rows changed where the row read before was 1"),
        ));
    }
    Ok(())
}

/// Inserts `rec`, judged at `now`, as a new row, unless its key has a row already: then writes
/// nothing and answers false (the caller reads that row and decides again).
pub(crate) fn insert_new(
    conn: &Connection,
    rec: &StoredRecord,
    now: Now,
) -> Result<bool, StoreError> {
    match write_row(conn, rec, false, now)? {
        Ok(_) => Ok(true),
        Err(e) if is_key_taken(&e) => Ok(false),
        Err(e) => Err(e).during(write_stage(conn), || format!("write record {}", rec.key)),
    }
}

/// Writes every column of `rec` at `now`, as an update of the existing row or an insert; answers
/// SQLite's own result, how many rows changed, for the caller to judge.
fn write_row(
    conn: &Connection,
    rec: &StoredRecord,
    exists: bool,
    now: Now,
) -> Result<rusqlite::Result<usize>, StoreError> {
    let what = || format!("write record {}", rec.key);
    let fence = fence_column(rec.fence, &what)?;
    let c = StateColumns::of(&rec.state, now, &what)?;
    let token = rec.token.0.to_be_bytes();
    Ok(conn
        .prepare_cached(if exists { UPDATE } else { INSERT })
        .and_then(|mut stmt| {
            stmt.execute(params![
                rec.key.tenant.as_str(),
                rec.key.tool.as_str(),
                rec.key.key.as_str(),
                rec.fingerprint.as_bytes().as_slice(),
                fence,
                token.as_slice(),
                rec.created_at.as_millis(),
                c.state,
                c.lease_until,
                c.since,
                c.completed_at,
                c.expires_at,
                c.kind,
                c.body,
                rec.scope.as_deref(),
                c.retain_until,
                c.lease_boot.as_ref().map(<[u8; 16]>::as_slice),
                c.lease_steady,
            ])
        }))
}

/// A fence as its column holds it; `what` names the write in an error.
fn fence_column(fence: Fence, what: &dyn Fn() -> String) -> Result<i64, StoreError> {
    i64::try_from(fence).map_err(|_| corrupt(what(), format!("fence {fence} is out of range")))
}

/// Whether an insert failed because its key has a row.
fn is_key_taken(e: &rusqlite::Error) -> bool {
    matches!(
        e,
        rusqlite::Error::SqliteFailure(f, _)
            if f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY
                || f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
    )
}

/// Sets the state of the row of `key` to `state` (judged at `now`) if `lease` holds it and it is
/// in flight or unknown, as a completion finds it; answers whether it did. Every other column is
/// kept, as [`Change::SetState`] keeps them.
pub(crate) fn set_state_if_held(
    conn: &Connection,
    key: &Key,
    lease: Lease,
    state: &RecordState,
    now: Now,
) -> Result<bool, StoreError> {
    let what = || format!("write record {key}");
    let fence = fence_column(lease.fence, &what)?;
    let c = StateColumns::of(state, now, &what)?;
    let token = lease.token.0.to_be_bytes();
    let written = conn
        .prepare_cached(SET_STATE_IF_HELD)
        .and_then(|mut stmt| {
            stmt.execute(params![
                key.tenant.as_str(),
                key.tool.as_str(),
                key.key.as_str(),
                fence,
                token.as_slice(),
                c.state,
                c.lease_until,
                c.since,
                c.completed_at,
                c.expires_at,
                c.kind,
                c.body,
                c.retain_until,
                c.lease_boot.as_ref().map(<[u8; 16]>::as_slice),
                c.lease_steady,
            ])
        })
        .during(write_stage(conn), what)?;
    Ok(written == 1)
}

/// Decodes a row selected with `columns!()`, as seen at `now`.
///
/// An in-flight row whose lease was written on this boot is judged by the boot clock: its
/// `lease_until` is read as `now`'s wall clock plus what is left of the lease on the boot clock,
/// so that the transitions, which judge by the wall clock, see a lease that no wall-clock step
/// moved. A row written on another boot, or by a version before schema 5, keeps its wall-clock
/// `lease_until`.
pub(crate) fn decode(row: &Row<'_>, now: Now) -> Result<StoredRecord, StoreError> {
    let tenant: String = row
        .get(0)
        .during(Stage::Read, || "read a record's tenant")?;
    let tool: String = row.get(1).during(Stage::Read, || "read a record's tool")?;
    let name: String = row.get(2).during(Stage::Read, || "read a record's key")?;
    let shown = format!("{tenant}/{tool}/{name}");
    let what = || format!("read record {shown}");
    let key = Key::new(
        TenantId::new(tenant).map_err(|e| corrupt(what(), e))?,
        ToolName::new(tool).map_err(|e| corrupt(what(), e))?,
        IdempotencyKey::new(name).map_err(|e| corrupt(what(), e))?,
    );
    let fingerprint: Vec<u8> = row.get(3).during(Stage::Read, what)?;
    let fingerprint = <[u8; 32]>::try_from(fingerprint.as_slice())
        .map_err(|_| corrupt(what(), "the fingerprint is not 32 bytes"))?;
    let fence: i64 = row.get(4).during(Stage::Read, what)?;
    let fence = u64::try_from(fence).map_err(|_| corrupt(what(), "the fence is negative"))?;
    let token: Vec<u8> = row.get(5).during(Stage::Read, what)?;
    let token = <[u8; 16]>::try_from(token.as_slice())
        .map_err(|_| corrupt(what(), "the lease token is not 16 bytes"))?;
    let created_at: i64 = row.get(6).during(Stage::Read, what)?;
    let state: i64 = row.get(7).during(Stage::Read, what)?;
    let time = |i: usize, name: &str| -> Result<Timestamp, StoreError> {
        let v: Option<i64> = row.get(i).during(Stage::Read, what)?;
        v.map(Timestamp::from_millis)
            .ok_or_else(|| corrupt(what(), format!("{name} is missing")))
    };
    let state = match state {
        IN_FLIGHT => {
            let boot: Option<Vec<u8>> = row.get(16).during(Stage::Read, what)?;
            let steady: Option<i64> = row.get(17).during(Stage::Read, what)?;
            let deadline = match (boot, steady) {
                (Some(boot), Some(millis)) => Some(HostInstant {
                    boot: u128::from_be_bytes(
                        <[u8; 16]>::try_from(boot.as_slice())
                            .map_err(|_| corrupt(what(), "lease_boot is not 16 bytes"))?,
                    ),
                    millis,
                }),
                (None, None) => None,
                _ => {
                    return Err(corrupt(
                        what(),
                        "only one of lease_boot and lease_steady is set",
                    ))
                }
            };
            let wall = time(8, "lease_until")?;
            RecordState::InFlight {
                lease_until: deadline.and_then(|d| now.wall_deadline(d)).unwrap_or(wall),
            }
        }
        UNKNOWN => RecordState::Unknown {
            since: time(9, "since")?,
        },
        COMPLETED => {
            let kind: Option<i64> = row.get(12).during(Stage::Read, what)?;
            let kind = match kind {
                Some(SUCCESS) => OutcomeKind::Success,
                Some(FAILED) => OutcomeKind::Failed,
                other => {
                    return Err(corrupt(
                        what(),
                        format!("outcome kind {other:?} is unknown"),
                    ))
                }
            };
            let body: Option<Vec<u8>> = row.get(13).during(Stage::Read, what)?;
            let body = body.ok_or_else(|| corrupt(what(), "outcome_body is missing"))?;
            let expires_at = time(11, "expires_at")?;
            // NULL on rows completed before schema version 4, which kept no tombstone: they
            // counted until `expires_at`, and still do.
            let retain_until: Option<i64> = row.get(15).during(Stage::Read, what)?;
            RecordState::Completed {
                outcome: Outcome { kind, body },
                completed_at: time(10, "completed_at")?,
                expires_at,
                retain_until: retain_until.map_or(expires_at, Timestamp::from_millis),
            }
        }
        other => return Err(corrupt(what(), format!("state {other} is unknown"))),
    };
    let scope: Option<String> = row.get(14).during(Stage::Read, what)?;
    Ok(StoredRecord {
        key,
        fingerprint: Fingerprint::from_bytes(fingerprint),
        fence,
        token: LeaseToken(u128::from_be_bytes(token)),
        created_at: Timestamp::from_millis(created_at),
        scope: scope.map(Into::into),
        state,
    })
}

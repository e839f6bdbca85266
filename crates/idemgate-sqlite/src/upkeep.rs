//! The bookkeeping of schema version 8 (schema_v8.sql) that answers the operator's frequent
//! questions without an index that every call writes: the settled mark, under which every row is
//! completed unless the log of unsettled rows names it, and the purge horizon, before which no
//! row is due for a purge.

use rusqlite::{params, Connection, OptionalExtension as _};

/// Writes of this process between two settlings: the rows a listing of unsettled records reads
/// above the mark are about the rows inserted since (a reservation and a completion are two
/// writes), a few milliseconds of reading at most.
pub(crate) const SETTLE_EVERY: u64 = 4096;

/// Rows a settling at the store's opening leaves above the mark without reading them: a store
/// opened many times (every `idemgate` command opens it) settles only when there is work.
const SETTLE_AT_OPEN_BEYOND: i64 = 1024;

/// The mark in force: `settled_below`, or 0 (every row is read) when the row it names is no
/// longer just below it, because the file's rows were numbered anew. A subquery, so that a
/// listing reads it in its own statement.
pub(crate) const SETTLED_BELOW: &str = "(SELECT CASE WHEN u.mark_key IS NULL \
     OR (SELECT r.rowid FROM idemgate_record r WHERE r.tenant = u.mark_tenant \
         AND r.tool = u.mark_tool AND r.key = u.mark_key) = u.settled_below - 1 \
     THEN u.settled_below ELSE 0 END FROM idemgate_upkeep u WHERE u.id = 1)";

/// The rows that may not be completed: those from the mark on, and those the log names.
pub(crate) fn unsettled_rows() -> String {
    format!("(rowid >= {SETTLED_BELOW} OR rowid IN (SELECT row FROM idemgate_unsettled))")
}

/// Moves the mark to just above the newest row, logging every row below it that is not
/// completed and forgetting the logged rows that are, within the caller's write transaction.
/// Reads the rows above the old mark (every row when it no longer holds) and the log.
pub(crate) fn settle(conn: &Connection) -> rusqlite::Result<()> {
    let below: i64 = conn.query_row(&format!("SELECT {SETTLED_BELOW}"), [], |r| r.get(0))?;
    conn.prepare_cached(
        "INSERT OR IGNORE INTO idemgate_unsettled (row) \
         SELECT rowid FROM idemgate_record WHERE rowid >= ?1 AND state <> 1",
    )?
    .execute([below])?;
    conn.prepare_cached(
        "DELETE FROM idemgate_unsettled WHERE NOT EXISTS (SELECT 1 FROM idemgate_record r \
         WHERE r.rowid = idemgate_unsettled.row AND r.state <> 1)",
    )?
    .execute([])?;
    let newest: Option<(i64, String, String, String)> = conn
        .prepare_cached(
            "SELECT rowid, tenant, tool, key FROM idemgate_record ORDER BY rowid DESC LIMIT 1",
        )?
        .query_row([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .optional()?;
    let (row, tenant, tool, key) = match newest {
        Some((row, tenant, tool, key)) => (row, Some(tenant), Some(tool), Some(key)),
        None => (0, None, None, None),
    };
    conn.prepare_cached(
        "UPDATE idemgate_upkeep SET settled_below = ?1, mark_tenant = ?2, mark_tool = ?3, \
         mark_key = ?4 WHERE id = 1",
    )?
    .execute(params![row + 1, tenant, tool, key])?;
    Ok(())
}

/// [`settle`] at the store's opening, when more than a few rows are above the mark (or it no
/// longer holds): a file written by many short-lived processes, or by hand, is settled once.
/// A mark that no longer holds (the rows were numbered anew) is settled at once, whatever the
/// number of rows: until then every listing reads every row.
pub(crate) fn settle_at_open(conn: &Connection) -> rusqlite::Result<()> {
    let (above, holds): (i64, bool) = conn.query_row(
        &format!(
            "SELECT coalesce((SELECT max(rowid) FROM idemgate_record), 0) - {SETTLED_BELOW}, \
             {SETTLED_BELOW} = (SELECT settled_below FROM idemgate_upkeep WHERE id = 1)"
        ),
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    if above >= SETTLE_AT_OPEN_BEYOND || !holds {
        settle(conn)?;
    }
    Ok(())
}

/// When a purge next has work on a completed row: its expiry while it holds an outcome, else the
/// end of its tombstone (a row completed before schema version 4 has no `retain_until` and goes
/// at its expiry). The triggers of schema_v8.sql compute the same.
pub(crate) const PURGE_DUE: &str = "(CASE WHEN length(outcome_body) > 0 THEN expires_at \
                                    ELSE coalesce(retain_until, expires_at) END)";

/// How long a purge's pass owns the pending horizon without renewing it (each batch renews it):
/// past it, another pass takes over, and the first one finishes without moving the horizon.
pub(crate) const PURGE_OWNER_FOR_MS: i64 = 60_000;

/// Whether a purge may find work at `now` (milliseconds): the one read of a purge with nothing
/// due.
pub(crate) fn purge_due(conn: &Connection, now: i64) -> rusqlite::Result<bool> {
    conn.prepare_cached(PURGE_DUE_NOW_SQL)?
        .query_row([now], |r| r.get(0))
}

/// Starts a pass: takes the pending horizon when no live pass owns it, and answers the pass's
/// id, or `None` when another pass owns it (this one then purges without moving the horizon).
pub(crate) fn purge_begin(conn: &Connection, now: i64) -> rusqlite::Result<Option<Vec<u8>>> {
    conn.prepare_cached(
        "UPDATE idemgate_upkeep SET purge_pending = 9223372036854775807, \
         purge_owner = randomblob(16), purge_owner_until = ?1 + ?2 \
         WHERE id = 1 AND (purge_owner IS NULL OR purge_owner_until <= ?1) RETURNING purge_owner",
    )?
    .query_row([now, PURGE_OWNER_FOR_MS], |r| r.get(0))
    .optional()
}

/// Renews the pass's hold on the pending horizon; false when another pass took it over.
pub(crate) fn purge_renew(conn: &Connection, owner: &[u8], now: i64) -> rusqlite::Result<bool> {
    let n = conn
        .prepare_cached(
            "UPDATE idemgate_upkeep SET purge_owner_until = ?2 + ?3 \
             WHERE id = 1 AND purge_owner = ?1",
        )?
        .execute(params![owner, now, PURGE_OWNER_FOR_MS])?;
    Ok(n == 1)
}

/// Ends the pass that owns the pending horizon: the horizon becomes the earliest due time the
/// pass saw (`seen`), or one written since it began, whichever is earlier. The mark is settled
/// too, since a purge may have removed the row it names.
pub(crate) fn purge_end(conn: &Connection, owner: &[u8], seen: i64) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "UPDATE idemgate_upkeep SET purge_horizon = min(?2, purge_pending), \
         purge_pending = NULL, purge_owner = NULL, purge_owner_until = NULL \
         WHERE id = 1 AND purge_owner = ?1",
    )?
    .execute(params![owner, seen])?;
    settle(conn)
}

/// The row ids of the next purge batch: the last of up to `batch` rows after `after`, or `None`
/// past the last row.
pub(crate) fn purge_batch_end(
    conn: &Connection,
    after: i64,
    batch: i64,
) -> rusqlite::Result<Option<i64>> {
    conn.prepare_cached(
        "SELECT max(rowid) FROM (SELECT rowid FROM idemgate_record WHERE rowid > ?1 \
         ORDER BY rowid LIMIT ?2)",
    )?
    .query_row([after, batch], |r| r.get(0))
}

/// Deletes the completed rows in `(?1, ?2]` past their tombstone at `?3`.
pub(crate) fn purge_delete_sql() -> String {
    format!(
        "DELETE FROM idemgate_record WHERE rowid > ?1 AND rowid <= ?2 AND state = 1 \
         AND {PURGE_DUE} <= ?3 AND coalesce(retain_until, expires_at) <= ?3"
    )
}

/// Drops the outcomes of the tombstones in `(?1, ?2]` past their ttl at `?3`.
pub(crate) fn purge_compact_sql() -> String {
    format!(
        "UPDATE idemgate_record SET outcome_body = x'' WHERE rowid > ?1 AND rowid <= ?2 \
         AND state = 1 AND {PURGE_DUE} <= ?3 AND expires_at <= ?3 AND length(outcome_body) > 0"
    )
}

/// The earliest due time among the completed rows in `(?1, ?2]`, NULL when none.
pub(crate) fn purge_earliest_sql() -> String {
    format!(
        "SELECT min({PURGE_DUE}) FROM idemgate_record WHERE rowid > ?1 AND rowid <= ?2 \
         AND state = 1"
    )
}

/// Whether a purge may find work at `?1`: the one read of a purge with nothing due.
pub(crate) const PURGE_DUE_NOW_SQL: &str =
    "SELECT purge_horizon <= ?1 FROM idemgate_upkeep WHERE id = 1";

/// Purges the rows in `(after, last]` at `now`: deletes the completed rows past their tombstone
/// and drops the outcomes of the tombstones past their ttl (nothing reads them again: they are
/// reported expired, without an outcome). Answers how many rows went, and the earliest due time
/// among the completed rows left there (`i64::MAX` when none).
pub(crate) fn purge_range(
    conn: &Connection,
    after: i64,
    last: i64,
    now: i64,
) -> rusqlite::Result<(usize, i64)> {
    let deleted = conn
        .prepare_cached(&purge_delete_sql())?
        .execute([after, last, now])?;
    // After the deletion, every row due that is left is a tombstone that stays and still holds
    // its outcome.
    conn.prepare_cached(&purge_compact_sql())?
        .execute([after, last, now])?;
    let earliest: Option<i64> = conn
        .prepare_cached(&purge_earliest_sql())?
        .query_row([after, last], |r| r.get(0))?;
    Ok((deleted, earliest.unwrap_or(i64::MAX)))
}

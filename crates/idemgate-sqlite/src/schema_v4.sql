-- Version 4 of the idemgate SQLite schema: a completed record keeps a tombstone after its ttl.
-- Past `expires_at` its outcome is no longer replayed, but until `retain_until` the record still
-- counts and is reported expired (a retry is told the action ran instead of running it again);
-- past `retain_until` it counts as absent and purging deletes it. Set on every completed row
-- written from now on, equal to `expires_at` when the tool keeps no tombstone. NULL for rows
-- completed before, which read as `retain_until = expires_at` (they were kept that long), so the
-- upgrade rewrites no row; and NULL for rows in any other state.
ALTER TABLE idemgate_record ADD COLUMN retain_until INTEGER
    CHECK (state = 1 OR retain_until IS NULL);

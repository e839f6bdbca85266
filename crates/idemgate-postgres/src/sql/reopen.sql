-- Reopen: a completed row at the fence that still counts (its outcome replayed, or a tombstone)
-- expires now, tombstone and all, so that it counts as absent and the next reservation renews it
-- at the next fence (`renew.sql`). $1 tenant, $2 tool, $3 key, $4 fence, $5 notification payload
-- (key digest, sent only when a process waits for the row).
--
-- A compare-and-set that Postgres re-checks on the newest committed version. No row: nothing was
-- reopened, and the caller reads the row as it stands (`get.sql`). A row counts until
-- GREATEST(expires_at, retain_until) (GREATEST skips the NULL of a row completed before migration
-- 6); a tombstone keeps the expires_at it had, as `transition::reopen` does.
WITH clock AS (
    SELECT {schema}.idemgate_now_ms() AS now
)
UPDATE {schema}.idemgate_records r SET
    expires_at = LEAST(r.expires_at, c.now),
    retain_until = c.now
FROM clock c
WHERE r.tenant = $1 AND r.tool = $2 AND r.key = $3
  AND r.fence = $4 AND r.state = 1 AND GREATEST(r.expires_at, r.retain_until) > c.now
RETURNING (CASE WHEN r.waiters THEN pg_notify('idemgate', $5) END) IS NOT NULL AS notified

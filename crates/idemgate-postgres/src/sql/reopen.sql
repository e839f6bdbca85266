-- Reopen: a completed row at the fence that still counts expires now, so that it counts as absent
-- and the next reservation renews it at the next fence (`renew.sql`). $1 tenant, $2 tool, $3 key,
-- $4 fence, $5 notification payload (key digest, sent only when a process waits for the row).
--
-- A compare-and-set that Postgres re-checks on the newest committed version. No row: nothing was
-- reopened, and the caller reads the row as it stands (`get.sql`).
UPDATE {schema}.idemgate_records r SET
    expires_at = {schema}.idemgate_now_ms()
WHERE r.tenant = $1 AND r.tool = $2 AND r.key = $3
  AND r.fence = $4 AND r.state = 1 AND r.expires_at > {schema}.idemgate_now_ms()
RETURNING (CASE WHEN r.waiters THEN pg_notify('idemgate', $5) END) IS NOT NULL AS notified

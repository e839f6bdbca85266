-- Reserve, the other second step: replace a completed row that no longer counts (as `get.sql`
-- found it: past its expiry and past its tombstone) with a new reservation at the next fence.
-- $1 tenant, $2 tool, $3 key, $4 fingerprint, $5 token, $6 lease in ms, $7 scope (NULL: none).
--
-- A row counts until GREATEST(expires_at, retain_until), as `StoredRecord::view` judges it:
-- GREATEST skips a NULL, so a row completed before migration 6 counts until expires_at; a
-- tombstone (past expires_at, before retain_until) is the caller's answer and is not replaced.
--
-- A compare-and-set: Postgres re-checks the WHERE on the newest committed version, so of two
-- racing renewals one writes. No row returned: the row changed or went away since it was read,
-- and the caller reads again.
WITH clock AS (
    SELECT {schema}.idemgate_now_ms() AS now
)
UPDATE {schema}.idemgate_records r SET
    fingerprint = $4,
    fence = r.fence + 1,
    token = $5,
    created_at = c.now,
    state = 0,
    lease_until = c.now + $6::bigint,
    since = NULL,
    completed_at = NULL,
    expires_at = NULL,
    retain_until = NULL,
    outcome_kind = NULL,
    outcome_body = NULL,
    waiters = false,
    scope = $7::text
FROM clock c
WHERE r.tenant = $1 AND r.tool = $2 AND r.key = $3
  AND r.state = 1 AND GREATEST(r.expires_at, r.retain_until) <= c.now
RETURNING r.fence

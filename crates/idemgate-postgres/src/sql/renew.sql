-- Reserve, the other second step: replace a completed row past its expiry (as `get.sql` found
-- it) with a new reservation at the next fence. $1 tenant, $2 tool, $3 key, $4 fingerprint,
-- $5 token, $6 lease in ms, $7 scope (NULL: none).
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
    outcome_kind = NULL,
    outcome_body = NULL,
    waiters = false,
    scope = $7::text
FROM clock c
WHERE r.tenant = $1 AND r.tool = $2 AND r.key = $3
  AND r.state = 1 AND r.expires_at <= c.now
RETURNING r.fence

-- Complete: store the outcome of a row held under the lease (in flight or unknown). $1 tenant,
-- $2 tool, $3 key, $4 fence, $5 token, $6 ttl in ms, $7 outcome kind, $8 outcome body,
-- $9 notification payload (key digest, sent only when a process waits for the row), $10 when the
-- side effect ran in ms (NULL: now; a journaled completion flushed later keeps its own time, never
-- later than now).
--
-- A plain compare-and-set on (fence, token), which Postgres re-checks on the newest committed
-- version. No row: `completed.sql` tells a completion under the same lease that committed first
-- (a retry after a lost answer) from a lost lease.
WITH clock AS (
    SELECT {schema}.idemgate_now_ms() AS now
)
UPDATE {schema}.idemgate_records r SET
    state = 1,
    completed_at = LEAST(COALESCE($10::bigint, c.now), c.now),
    expires_at = c.now + $6::bigint,
    outcome_kind = $7,
    outcome_body = $8,
    lease_until = NULL,
    since = NULL
FROM clock c
WHERE r.tenant = $1 AND r.tool = $2 AND r.key = $3
  AND r.fence = $4 AND r.token = $5 AND r.state IN (0, 2)
-- The notification goes out with the commit, and only when a process flagged the row as waited
-- for (the count keeps the volatile call from being optimized away).
RETURNING r.completed_at, r.expires_at,
          (SELECT count(*) FROM (SELECT pg_notify('idemgate', $9) WHERE r.waiters) n) AS notified

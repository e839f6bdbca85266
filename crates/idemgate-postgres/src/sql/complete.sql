-- Complete: store the outcome of a row held under the lease (in flight or unknown). $1 tenant,
-- $2 tool, $3 key, $4 fence, $5 token, $6 ttl in ms, $7 outcome kind, $8 outcome body,
-- $9 notification payload (key digest, sent only when a process waits for the row), $10 when the side effect ran in ms (NULL: now; a journaled
-- completion flushed later keeps its own time, never later than now).
--
-- A row already completed under the same lease answers with its first completion (a retry after a
-- lost answer). No row: the lease is lost, unless a concurrent completion under the same lease
-- committed after this statement's snapshot, which the caller settles by running it again.
WITH clock AS (
    SELECT {schema}.idemgate_now_ms() AS now
), upd AS (
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
    RETURNING r.completed_at, r.expires_at, r.waiters
)
SELECT true AS written, upd.completed_at, upd.expires_at
FROM upd LEFT JOIN LATERAL (SELECT pg_notify('idemgate', $9) WHERE upd.waiters) n ON true
UNION ALL
SELECT false AS written, r.completed_at, r.expires_at
FROM {schema}.idemgate_records r
WHERE r.tenant = $1 AND r.tool = $2 AND r.key = $3
  AND r.fence = $4 AND r.token = $5 AND r.state = 1
  AND NOT EXISTS (SELECT 1 FROM upd)

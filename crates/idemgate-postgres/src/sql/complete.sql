-- Complete: store the outcome of a row held under the lease (in flight or unknown). $1 tenant,
-- $2 tool, $3 key, $4 fence, $5 token, $6 ttl in ms, $7 outcome kind, $8 outcome body,
-- $9 notification payload (key digest, sent only when a process waits for the row), $10 when the
-- side effect ran in ms (NULL: now; a journaled completion flushed later keeps its own time, never
-- later than now), $11 tombstone in ms (how long the record is remembered from now, as expired once
-- past the ttl; no longer than the ttl: none).
--
-- A plain compare-and-set on (fence, token), which Postgres re-checks on the newest committed
-- version. No row: `completed.sql` tells a completion under the same lease that committed first
-- (a retry after a lost answer) from a lost lease. idemgate_now_ms() is the transaction's start,
-- one instant for the whole statement.
UPDATE {schema}.idemgate_records r SET
    state = 1,
    completed_at = LEAST(COALESCE($10::bigint, {schema}.idemgate_now_ms()),
                         {schema}.idemgate_now_ms()),
    expires_at = {schema}.idemgate_now_ms() + $6::bigint,
    -- Keep::retain_until: the longer of the two, so a tombstone no longer than the ttl is none.
    retain_until = {schema}.idemgate_now_ms() + GREATEST($6::bigint, $11::bigint),
    outcome_kind = $7,
    outcome_body = $8,
    lease_until = NULL,
    since = NULL
WHERE r.tenant = $1 AND r.tool = $2 AND r.key = $3
  AND r.fence = $4 AND r.token = $5 AND r.state IN (0, 2)
-- The notification goes out with the commit, and only when a process flagged the row as waited
-- for: a CASE evaluates pg_notify for such a row alone (a row's RETURNING list is always
-- computed, so the call is never optimized away; a subquery here cost a twentieth of the call).
RETURNING r.completed_at, r.expires_at,
          (CASE WHEN r.waiters THEN pg_notify('idemgate', $9) END) IS NOT NULL AS notified

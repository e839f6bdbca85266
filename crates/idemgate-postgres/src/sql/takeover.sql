-- Takeover of an unknown row (marked unknown, or in flight with its lease run out) whose fence is
-- the stale one and whose fingerprint matches. $1 tenant, $2 tool, $3 key, $4 fingerprint,
-- $5 token, $6 lease in ms, $7 stale fence, $8 notification payload (key digest, sent only when a process waits for the row).
--
-- The UPDATE is a compare-and-set: under concurrent writers Postgres re-checks its WHERE on the
-- newest committed version. A row in flight under the caller's own token is not rewritten (a
-- retried takeover acquires it as it stands); `cur` gives the caller the row as it stands. The row
-- keeps its scope and creation time: a takeover runs the same action again.
WITH clock AS (
    SELECT {schema}.idemgate_now_ms() AS now
), cur AS (
    SELECT r.fingerprint, r.fence, r.token, r.created_at, r.state, r.lease_until, r.since,
           r.completed_at, r.expires_at, r.retain_until, r.outcome_kind, r.outcome_body,
           r.scope, c.now
    FROM {schema}.idemgate_records r, clock c
    WHERE r.tenant = $1 AND r.tool = $2 AND r.key = $3
), upd AS (
    UPDATE {schema}.idemgate_records r SET
        fence = r.fence + 1,
        token = $5,
        state = 0,
        lease_until = c.now + $6::bigint,
        since = NULL
    FROM clock c
    WHERE r.tenant = $1 AND r.tool = $2 AND r.key = $3
      AND r.fence = $7 AND r.fingerprint = $4
      AND (r.state = 2 OR (r.state = 0 AND r.lease_until <= c.now))
      AND NOT (r.state = 0 AND r.token = $5)
    RETURNING r.fingerprint, r.fence, r.token, r.created_at, r.state, r.lease_until, r.since,
              r.completed_at, r.expires_at, r.retain_until, r.outcome_kind, r.outcome_body,
              r.scope, r.waiters
)
SELECT true AS written, upd.fingerprint, upd.fence, upd.token, upd.created_at, upd.state,
       upd.lease_until, upd.since, upd.completed_at, upd.expires_at, upd.retain_until,
       upd.outcome_kind, upd.outcome_body, upd.scope, c.now
FROM upd CROSS JOIN clock c
    LEFT JOIN LATERAL (SELECT pg_notify('idemgate', $8) WHERE upd.waiters) n ON true
UNION ALL
SELECT false AS written, cur.* FROM cur WHERE NOT EXISTS (SELECT 1 FROM upd)

-- Reserve: insert an in-flight row unless one counts. $1 tenant, $2 tool, $3 key, $4 fingerprint,
-- $5 token, $6 lease in ms.
--
-- `cur` reads the row in the statement's snapshot. Only when no row counts there (absent, or
-- completed and expired) is an insert attempted, so a duplicate (the hot path of replays) writes
-- nothing and commits nothing. The ON CONFLICT arm replaces a row that does not count any more,
-- judged again on the newest committed version; a row inserted by a concurrent reservation after
-- our snapshot makes the whole statement return no row, and the caller runs it again.
WITH clock AS (
    SELECT {schema}.idemgate_now_ms() AS now
), cur AS (
    SELECT r.fingerprint, r.fence, r.token, r.created_at, r.state, r.lease_until, r.since,
           r.completed_at, r.expires_at, r.outcome_kind, r.outcome_body, c.now
    FROM {schema}.idemgate_records r, clock c
    WHERE r.tenant = $1 AND r.tool = $2 AND r.key = $3
), ins AS (
    INSERT INTO {schema}.idemgate_records AS r
        (tenant, tool, key, fingerprint, fence, token, created_at, state, lease_until)
    SELECT $1, $2, $3, $4, 1, $5, c.now, 0, c.now + $6::bigint
    FROM clock c
    WHERE NOT EXISTS (SELECT 1 FROM cur WHERE NOT (cur.state = 1 AND cur.expires_at <= cur.now))
    ON CONFLICT (tenant, tool, key) DO UPDATE SET
        fingerprint = excluded.fingerprint,
        fence = r.fence + 1,
        token = excluded.token,
        created_at = excluded.created_at,
        state = 0,
        lease_until = excluded.lease_until,
        since = NULL,
        completed_at = NULL,
        expires_at = NULL,
        outcome_kind = NULL,
        outcome_body = NULL,
        waiters = false
    WHERE r.state = 1 AND r.expires_at <= excluded.created_at
    RETURNING r.fingerprint, r.fence, r.token, r.created_at, r.state, r.lease_until, r.since,
              r.completed_at, r.expires_at, r.outcome_kind, r.outcome_body
)
SELECT true AS written, ins.*, c.now FROM ins, clock c
UNION ALL
SELECT false AS written, cur.* FROM cur
WHERE NOT EXISTS (SELECT 1 FROM ins) AND NOT (cur.state = 1 AND cur.expires_at <= cur.now)

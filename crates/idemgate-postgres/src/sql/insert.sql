-- Reserve, after `get.sql` found no row: insert an in-flight row. $1 tenant, $2 tool, $3 key,
-- $4 fingerprint, $5 token, $6 lease in ms. No row returned: a concurrent reservation inserted
-- it since (Postgres waited for that one to commit or roll back), and the caller looks again.
WITH clock AS (
    SELECT {schema}.idemgate_now_ms() AS now
)
INSERT INTO {schema}.idemgate_records AS r
    (tenant, tool, key, fingerprint, fence, token, created_at, state, lease_until)
SELECT $1, $2, $3, $4, 1, $5, c.now, 0, c.now + $6::bigint
FROM clock c
ON CONFLICT DO NOTHING
RETURNING true AS written, r.fingerprint, r.fence, r.token, r.created_at, r.state,
          r.lease_until, r.since, r.completed_at, r.expires_at, r.outcome_kind, r.outcome_body,
          r.created_at AS now

-- Rows that count, oldest first. $1 tenant or NULL, $2 tool or NULL, $3 state or NULL (0 in flight
-- with a live lease, 1 completed and replayed, 2 unknown including in flight with an expired
-- lease, 3 expired: completed, past its ttl and within its tombstone; `row::state_code`), $4 limit
-- or NULL, $5 scope or NULL.
--
-- A completed row counts until GREATEST(expires_at, retain_until) (migration 6: GREATEST skips
-- the NULL of a row completed before, and judges as `StoredRecord::view` does).
WITH clock AS (
    SELECT {schema}.idemgate_now_ms() AS now
)
SELECT r.tenant, r.tool, r.key,
       r.fingerprint, r.fence, r.token, r.created_at, r.state, r.lease_until, r.since,
       r.completed_at, r.expires_at, r.retain_until, r.outcome_kind, r.outcome_body, r.scope,
       c.now
FROM {schema}.idemgate_records r, clock c
WHERE ($1::text IS NULL OR r.tenant = $1)
  AND ($2::text IS NULL OR r.tool = $2)
  AND ($5::text IS NULL OR r.scope = $5)
  AND NOT (r.state = 1 AND GREATEST(r.expires_at, r.retain_until) <= c.now)
  AND ($3::smallint IS NULL
       OR ($3 = 0 AND r.state = 0 AND r.lease_until > c.now)
       OR ($3 = 1 AND r.state = 1 AND r.expires_at > c.now)
       OR ($3 = 2 AND (r.state = 2 OR (r.state = 0 AND r.lease_until <= c.now)))
       OR ($3 = 3 AND r.state = 1 AND r.expires_at <= c.now))
ORDER BY r.created_at, r.tenant COLLATE "C", r.tool COLLATE "C", r.key COLLATE "C"
LIMIT $4

-- The completion standing under a lease: a completion that found no row to update asks whether
-- the row is completed under its own lease already (a retry after a lost answer, or a journal
-- flush racing the call's own write), its outcome still replayed or a tombstone by now (state 1
-- either way), as `transition::complete` answers. $1 tenant, $2 tool, $3 key, $4 fence, $5 token.
--
-- It runs after the UPDATE, in a newer snapshot: a completion under the same lease that made the
-- UPDATE miss had committed by then (the UPDATE waits for a concurrent writer of the row).
SELECT r.completed_at, r.expires_at
FROM {schema}.idemgate_records r
WHERE r.tenant = $1 AND r.tool = $2 AND r.key = $3
  AND r.fence = $4 AND r.token = $5 AND r.state = 1

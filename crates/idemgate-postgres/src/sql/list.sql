-- Rows that count, in the listing order (creation time, then tenant, tool and key byte-wise),
-- followed by `{conditions}`: the filter's conditions, which `list_query` in lib.rs writes per
-- filter (its state in particular as constants, never as a parameter, so that the planner can
-- prove a partial index's predicate from them; see migration 7), and `{limit}`.
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
WHERE NOT (r.state = 1 AND GREATEST(r.expires_at, r.retain_until) <= c.now)
  {conditions}
ORDER BY r.created_at, r.tenant COLLATE "C", r.tool COLLATE "C", r.key COLLATE "C"
{limit}

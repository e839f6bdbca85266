-- The row, with the server clock to judge it by. $1 tenant, $2 tool, $3 key. The row is returned
-- as stored (retain_until NULL for a row completed before migration 6): `row.rs` decodes it and
-- `StoredRecord::view` judges it, as the statements' GREATEST(expires_at, retain_until) does.
SELECT r.fingerprint, r.fence, r.token, r.created_at, r.state, r.lease_until, r.since,
       r.completed_at, r.expires_at, r.retain_until, r.outcome_kind, r.outcome_body, r.scope,
       {schema}.idemgate_now_ms() AS now
FROM {schema}.idemgate_records r
WHERE r.tenant = $1 AND r.tool = $2 AND r.key = $3

-- Heartbeat: extend the lease of a row in flight under the lease. $1 tenant, $2 tool, $3 key,
-- $4 fence, $5 token, $6 lease in ms. No row: the lease is lost.
UPDATE {schema}.idemgate_records
SET lease_until = {schema}.idemgate_now_ms() + $6::bigint
WHERE tenant = $1 AND tool = $2 AND key = $3 AND fence = $4 AND token = $5 AND state = 0
RETURNING lease_until

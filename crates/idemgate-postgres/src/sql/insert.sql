-- Reserve: insert an in-flight row unless a row stands. $1 tenant, $2 tool, $3 key,
-- $4 fingerprint, $5 token, $6 lease in ms, $7 scope (NULL: none). A plain insert, so a fresh call is one round trip
-- and the cheapest statement the server can run for it (a statement that also read the row
-- standing, in a CTE, cost a fifth more). No row returned: a row stands (Postgres waited for a
-- concurrent reservation of it to commit or roll back), and the caller reads it (`get.sql`).
-- idemgate_now_ms() is the transaction's start, one instant for the whole statement. Only the
-- fence comes back: the rest of the lease is the caller's own token.
INSERT INTO {schema}.idemgate_records AS r
    (tenant, tool, key, fingerprint, fence, token, created_at, state, lease_until, scope)
VALUES ($1, $2, $3, $4, 1, $5, {schema}.idemgate_now_ms(), 0,
        {schema}.idemgate_now_ms() + $6::bigint, $7::text)
ON CONFLICT DO NOTHING
RETURNING r.fence

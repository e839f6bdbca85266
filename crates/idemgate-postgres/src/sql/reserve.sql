-- Reserve: insert an in-flight row unless a row stands, and answer with the row that stands.
-- $1 tenant, $2 tool, $3 key, $4 fingerprint, $5 token, $6 lease in ms.
--
-- `cur` reads the row in the statement's snapshot; only when there is none is an insert tried.
-- `written` rows are the new reservation; otherwise `cur` is returned for the caller to judge
-- (a completed row past its expiry is renewed by `renew.sql`). No row at all: a concurrent
-- reservation inserted it after this statement's snapshot (Postgres waited for that one to
-- commit or roll back), and the caller runs the reservation again.
--
-- The store runs this first while reservations mostly find no row (the common case: every call
-- a fresh action), and `get.sql` first while they mostly find one (a retry storm): a duplicate
-- then costs one plain read, which writes and commits nothing (src/lib.rs, `Inner::found`).
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
    WHERE NOT EXISTS (SELECT 1 FROM cur)
    ON CONFLICT DO NOTHING
    RETURNING r.fingerprint, r.fence, r.token, r.created_at, r.state, r.lease_until, r.since,
              r.completed_at, r.expires_at, r.outcome_kind, r.outcome_body
)
SELECT true AS written, ins.*, c.now FROM ins, clock c
UNION ALL
SELECT false AS written, cur.* FROM cur

-- Mark unknown: a row in flight under the lease becomes unknown now. $1 tenant, $2 tool, $3 key,
-- $4 fence, $5 token, $6 notification payload (key digest, sent only when a process waits for the row).
--
-- A row already unknown under the lease is left as it is (`already`, read in the snapshot).
WITH upd AS (
    UPDATE {schema}.idemgate_records SET
        state = 2,
        since = {schema}.idemgate_now_ms(),
        lease_until = NULL
    WHERE tenant = $1 AND tool = $2 AND key = $3
      AND fence = $4 AND token = $5 AND state = 0
    RETURNING waiters
)
SELECT
    (SELECT count(*) FROM upd LEFT JOIN LATERAL (SELECT pg_notify('idemgate', $6) WHERE upd.waiters) n
        ON true) AS updated,
    EXISTS (SELECT 1 FROM {schema}.idemgate_records
            WHERE tenant = $1 AND tool = $2 AND key = $3
              AND fence = $4 AND token = $5 AND state = 2) AS already

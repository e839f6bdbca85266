-- Release: delete a row held under the lease that is not completed. $1 tenant, $2 tool, $3 key,
-- $4 fence, $5 token, $6 notification payload (key digest, sent only when a process waits for the row).
--
-- `present` is read in the statement's snapshot: an absent row is released already (Ok); a
-- present row that was not deleted is somebody else's, or completed (the lease is lost), unless it
-- changed after the snapshot, which the caller settles by running the statement again.
WITH del AS (
    DELETE FROM {schema}.idemgate_records
    WHERE tenant = $1 AND tool = $2 AND key = $3
      AND fence = $4 AND token = $5 AND state IN (0, 2)
    RETURNING waiters
)
SELECT
    (SELECT count(*) FROM del LEFT JOIN LATERAL (SELECT pg_notify('idemgate', $6) WHERE del.waiters) n
        ON true) AS deleted,
    EXISTS (SELECT 1 FROM {schema}.idemgate_records
            WHERE tenant = $1 AND tool = $2 AND key = $3) AS present

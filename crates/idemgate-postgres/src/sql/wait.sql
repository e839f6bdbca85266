-- Wait: mark a row that is not settled (in flight or unknown) as waited for, so that the write
-- that settles it notifies. $1 tenant, $2 tool, $3 key.
--
-- `watched` is true when the row is unsettled and flagged: flagged now, or already flagged in the
-- statement's snapshot (then unchanged, as the UPDATE only skips flagged rows). False when the
-- row settled or went away, before or during the statement: the caller looks again at once.
WITH upd AS (
    UPDATE {schema}.idemgate_records SET waiters = true
    WHERE tenant = $1 AND tool = $2 AND key = $3 AND state IN (0, 2) AND NOT waiters
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM upd)
    OR EXISTS (SELECT 1 FROM {schema}.idemgate_records
               WHERE tenant = $1 AND tool = $2 AND key = $3 AND state IN (0, 2) AND waiters)
    AS watched

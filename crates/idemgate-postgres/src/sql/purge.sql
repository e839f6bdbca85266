-- The reaper: delete completed rows past their expiry (server clock). Unknown rows stay for an
-- operator. A row replaced by a reservation meanwhile is re-checked by Postgres and kept.
-- No index serves this scan: an index on expires_at would make every completion a non-HOT update
-- (migrations/0003); a sweep reads the table once.
WITH purged AS (
    DELETE FROM {schema}.idemgate_records
    WHERE state = 1 AND expires_at <= {schema}.idemgate_now_ms()
    RETURNING 1
)
SELECT count(*) AS purged FROM purged

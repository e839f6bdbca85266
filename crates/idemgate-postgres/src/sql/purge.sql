-- The reaper (server clock): deletes completed rows past their tombstone (past their expiry, for
-- a row without one), and drops the outcome of each row past its expiry whose tombstone stays
-- (nothing reads it again: a tombstone is reported without it), as `transition::purge` does.
-- Returns how many rows went. Unknown rows stay for an operator.
--
-- No index serves this scan: an index on expires_at or retain_until would make every completion
-- a non-HOT update (migrations 3 and 6). So `due` reads the table once per sweep, and the two
-- writes find their rows by ctid (a TID scan of the rows it kept, not another pass over the
-- table). Each write re-checks its row's state and times: a row replaced, reopened or purged by
-- another sweep since `due` read it is re-checked by Postgres on its newest version (or, moved
-- by that write, no longer under its ctid) and kept. The tombstone's new version, its body
-- emptied, is a HOT update (outcome_body is not indexed) and frees the body's TOAST chunks.
-- A row counts until GREATEST(expires_at, retain_until) (migration 6: GREATEST skips the NULL of
-- a row completed before). octet_length reads a TOASTed body's size without fetching it.
WITH clock AS (
    SELECT {schema}.idemgate_now_ms() AS now
), due AS (
    SELECT r.ctid, GREATEST(r.expires_at, r.retain_until) <= c.now AS gone
    FROM {schema}.idemgate_records r, clock c
    WHERE r.state = 1 AND r.expires_at <= c.now
      AND (GREATEST(r.expires_at, r.retain_until) <= c.now OR octet_length(r.outcome_body) > 0)
), purged AS (
    DELETE FROM {schema}.idemgate_records r
    USING clock c
    WHERE r.ctid = ANY (ARRAY(SELECT d.ctid FROM due d WHERE d.gone))
      AND r.state = 1 AND GREATEST(r.expires_at, r.retain_until) <= c.now
    RETURNING 1
), compacted AS (
    UPDATE {schema}.idemgate_records r SET outcome_body = ''::bytea
    FROM clock c
    WHERE r.ctid = ANY (ARRAY(SELECT d.ctid FROM due d WHERE NOT d.gone))
      AND r.state = 1 AND r.expires_at <= c.now AND r.retain_until > c.now
      AND octet_length(r.outcome_body) > 0
)
SELECT count(*) AS purged FROM purged

-- The reaper (server clock): deletes completed rows past their tombstone (past their expiry, for
-- a row without one), and drops the outcome of each row past its expiry whose tombstone stays
-- (nothing reads it again: a tombstone is reported without it), as `transition::purge` does.
-- Returns how many rows went. Unknown rows stay for an operator.
--
-- `due` finds its rows through the index `idemgate_records_purge_due` (migration 7): each
-- completed row by when a purge next has work on it, the expression written here exactly as in
-- the index, compared with idemgate_now_ms() itself (a value the planner can search the index
-- by). A sweep with nothing to do is one probe of that index. The two writes find their rows by
-- ctid (a TID scan of the rows `due` kept). Each write re-checks its row's state and times: a
-- row replaced, reopened or purged by another sweep since `due` read it is re-checked by
-- Postgres on its newest version (or, moved by that write, no longer under its ctid) and kept.
-- A row counts until GREATEST(expires_at, retain_until) (migration 6: GREATEST skips the NULL of
-- a row completed before). octet_length reads a TOASTed body's size without fetching it.
WITH clock AS (
    SELECT {schema}.idemgate_now_ms() AS now
), due AS (
    SELECT r.ctid, GREATEST(r.expires_at, r.retain_until) <= c.now AS gone
    FROM {schema}.idemgate_records r, clock c
    WHERE r.state = 1
      AND (CASE WHEN octet_length(r.outcome_body) > 0 THEN r.expires_at
                ELSE GREATEST(r.expires_at, r.retain_until) END) <= {schema}.idemgate_now_ms()
      AND r.expires_at <= c.now
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

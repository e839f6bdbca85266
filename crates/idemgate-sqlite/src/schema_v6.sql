-- Version 6 of the idemgate SQLite schema: the operator's two frequent questions, "which outcomes
-- are unknown?" (`keys list --state unknown`) and "what has expired?" (`keys purge --expired`),
-- are answered from small partial indexes instead of a scan of every record (issue 31).
--
-- Version 2 dropped a full index on (state, expires_at) because every call wrote it twice. These
-- hold only what they serve:
--
-- `idemgate_record_unsettled`: the rows not completed, in flight or unknown. An in-flight row is
-- unknown once its lease ends, which no index can say in advance, so both states are in it; they
-- are few at any moment (the calls running now and those waiting for an operator), so the index
-- stays a page or two that every reservation and completion touches. The listing asks
-- `state = 2 OR (state = 0 AND <lease ended>)`, which SQLite serves with one search of this index
-- per branch (its predicate is two OR-ed terms so that each branch matches one of them).
CREATE INDEX idemgate_record_unsettled ON idemgate_record (state, created_at)
    WHERE state = 0 OR state = 2;
-- `idemgate_record_purge_due`: each completed row by when a purge next has work on it: at its
-- expiry while it still holds an outcome (the purge deletes it, or drops the outcome of a
-- tombstone), else at the end of its tombstone (a row completed before version 4 has no
-- `retain_until` and goes at its expiry). A purge reads only the rows due, and finds none in one
-- probe when nothing is. The expression is written exactly so in the purge's statements
-- (`PURGE_DUE` in lib.rs), which SQLite needs in order to use it.
CREATE INDEX idemgate_record_purge_due ON idemgate_record (
    (CASE WHEN length(outcome_body) > 0 THEN expires_at ELSE coalesce(retain_until, expires_at) END)
) WHERE state = 1;

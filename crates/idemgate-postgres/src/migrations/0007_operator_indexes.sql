-- The operator's two frequent questions, "which outcomes are unknown?" (`keys list --state
-- unknown`) and "what has expired?" (`keys purge --expired`, and the reaper's sweeps), are
-- answered from two partial indexes instead of a read of the whole table (issue 31).
--
-- Their price: migration 3 dropped the reaper's index so that a completion could be a HOT update.
-- Any index that tells completed rows from the others names `state`, which a completion changes,
-- so a completion is again a non-HOT update: a new entry in the primary key and one in
-- `idemgate_records_purge_due`. Heartbeats and waits stay HOT (no index names the columns they
-- change); a purge that empties a tombstone's body moves its entry in the purge index, once.
-- Built inside the migration's transaction: writes to the table wait for the build (seconds per
-- million rows).
--
-- `idemgate_records_unsettled`: the rows in flight or unknown, by creation time (the listing's
-- order). An in-flight row is unknown once its lease ends, which no index can say in advance, so
-- both are in it; they are few at any moment. The listing states the state as constants
-- (`ListQuery` in lib.rs), from which the planner proves `state <> 1`.
CREATE INDEX idemgate_records_unsettled ON {schema}.idemgate_records (created_at)
    WHERE state <> 1;
-- `idemgate_records_purge_due`: each completed row by when a purge next has work on it: at its
-- expiry while it holds an outcome (it is deleted, or its outcome dropped as a tombstone), else
-- at the end of its tombstone (GREATEST skips the NULL `retain_until` of rows completed before
-- migration 6). purge.sql writes the expression exactly so, which the planner needs to use it.
CREATE INDEX idemgate_records_purge_due ON {schema}.idemgate_records (
    (CASE WHEN octet_length(outcome_body) > 0 THEN expires_at
          ELSE GREATEST(expires_at, retain_until) END)
) WHERE state = 1;

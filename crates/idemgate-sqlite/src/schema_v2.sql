-- Version 2 of the idemgate SQLite schema: the index on (state, expires_at) goes.
--
-- Every reservation inserted an entry into it and every completion moved that entry (state 0 to
-- state 1), so each call wrote two more pages to the log than the row and its key needed: 6.5
-- pages a fresh call instead of 3.4, and twice the checkpoint work. What it served is rare and
-- can scan: `list` sorts by creation time anyway, and `purge_expired` (an operator's command)
-- now deletes in ranges of row ids, one short write transaction each.
DROP INDEX IF EXISTS idemgate_record_state_expiry;

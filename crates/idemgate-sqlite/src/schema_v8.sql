-- Version 8 of the idemgate SQLite schema: the operator's two frequent questions keep their answers
-- off the call path (issue 31, part 3).
--
-- The partial indexes of version 6 answered them, but every fresh call paid for them: a
-- reservation inserted its row into `idemgate_record_unsettled` and its completion took it out
-- again and put it into `idemgate_record_purge_due`, so a lone caller's fresh call wrote 6.5
-- pages to the log instead of 3.5, and ran at two thirds of the speed. Both questions are now
-- answered from bookkeeping that a call does not write:
--
-- "Which outcomes are unknown?" (and which calls are in flight): rows are numbered in the order
-- they are inserted (rowid), and the rows not completed are nearly always the newest. Every row
-- below `settled_below` is completed unless its rowid is in `idemgate_unsettled`, so a listing
-- reads the rows from `settled_below` on, and those. The store moves the mark up to its newest
-- row every few thousand writes (`upkeep::settle`, in the transaction of a batch of writes,
-- and when the store opens), logging the rows below it that are not completed. A row below the
-- mark that leaves the completed state later (a key reserved again) is logged by the triggers
-- below, as is a row inserted below the mark (a rowid freed by a purge at the top and reused).
-- The log may name rows completed since; the listing filters by state, and the next settling
-- drops them.
--
-- Row ids are not promised to survive every copy of a file (a `.dump` read back numbers rows
-- anew), so the mark also names its row: `mark_tenant`, `mark_tool`, `mark_key` are the key of
-- the row just below it. Where that key is no longer at that row id, the mark counts as 0 (every
-- row is read) until the next settling, which then reads every row.
--
-- "What has expired?": `purge_horizon` is a time before which no completed row is due for a
-- purge (its expiry while it holds an outcome, else the end of its tombstone). A completion due
-- earlier lowers it (trigger below; the common completion is due later and writes nothing), and
-- only a purge's pass over the rows raises it, to the earliest due time it saw. While a pass
-- runs, `purge_pending` gathers the due times written meanwhile, since the pass may have read
-- those rows before; `purge_owner` is the pass that reset it (a random id), until
-- `purge_owner_until` (milliseconds, renewed each batch), after which another pass may take over.
-- A purge with nothing due reads this one row.
DROP INDEX idemgate_record_unsettled;
DROP INDEX idemgate_record_purge_due;

CREATE TABLE idemgate_upkeep (
    id                INTEGER PRIMARY KEY CHECK (id = 1),
    settled_below     INTEGER NOT NULL,
    mark_tenant       TEXT,
    mark_tool         TEXT,
    mark_key          TEXT,
    purge_horizon     INTEGER NOT NULL,
    purge_pending     INTEGER,
    purge_owner       BLOB,
    purge_owner_until INTEGER
) STRICT;

-- The row ids below the mark of records that may not be completed.
CREATE TABLE idemgate_unsettled (row INTEGER PRIMARY KEY) STRICT;

-- Mark 0 until the first settling (which the store runs right after this migration, in its
-- transaction): every row is read meanwhile. The horizon starts at the earliest due time.
INSERT INTO idemgate_upkeep (id, settled_below, purge_horizon)
SELECT 1, 0, coalesce(min(
    CASE WHEN length(outcome_body) > 0 THEN expires_at ELSE coalesce(retain_until, expires_at) END
), 9223372036854775807)
FROM idemgate_record WHERE state = 1;

CREATE TRIGGER idemgate_record_unsettled_insert AFTER INSERT ON idemgate_record
WHEN NEW.state <> 1 AND NEW.rowid < (SELECT settled_below FROM idemgate_upkeep WHERE id = 1)
BEGIN
    INSERT OR IGNORE INTO idemgate_unsettled (row) VALUES (NEW.rowid);
END;

CREATE TRIGGER idemgate_record_unsettled_update AFTER UPDATE OF state ON idemgate_record
WHEN NEW.state <> 1 AND NEW.rowid < (SELECT settled_below FROM idemgate_upkeep WHERE id = 1)
BEGIN
    INSERT OR IGNORE INTO idemgate_unsettled (row) VALUES (NEW.rowid);
END;

-- The row the mark names, deleted (a call released, a purge, an operator): the mark moves to the
-- newest row left, logging the rows from the old mark on that are not completed, so that it
-- keeps holding (rather than counting as 0, which makes every listing read every row). No row
-- was numbered anew, so the rows below the old mark are as the log says.
CREATE TRIGGER idemgate_record_mark_deleted AFTER DELETE ON idemgate_record
WHEN OLD.rowid = (SELECT settled_below - 1 FROM idemgate_upkeep WHERE id = 1)
    AND OLD.key IS (SELECT mark_key FROM idemgate_upkeep WHERE id = 1)
    AND OLD.tool IS (SELECT mark_tool FROM idemgate_upkeep WHERE id = 1)
    AND OLD.tenant IS (SELECT mark_tenant FROM idemgate_upkeep WHERE id = 1)
BEGIN
    INSERT OR IGNORE INTO idemgate_unsettled (row)
        SELECT rowid FROM idemgate_record
        WHERE rowid >= (SELECT settled_below FROM idemgate_upkeep WHERE id = 1) AND state <> 1;
    UPDATE idemgate_upkeep SET
        settled_below = coalesce((SELECT max(rowid) FROM idemgate_record), 0) + 1,
        mark_tenant = (SELECT tenant FROM idemgate_record ORDER BY rowid DESC LIMIT 1),
        mark_tool = (SELECT tool FROM idemgate_record ORDER BY rowid DESC LIMIT 1),
        mark_key = (SELECT key FROM idemgate_record ORDER BY rowid DESC LIMIT 1)
    WHERE id = 1;
END;

CREATE TRIGGER idemgate_record_due_insert AFTER INSERT ON idemgate_record
WHEN NEW.state = 1
BEGIN
    UPDATE idemgate_upkeep SET
        purge_horizon = min(purge_horizon, CASE WHEN length(NEW.outcome_body) > 0
            THEN NEW.expires_at ELSE coalesce(NEW.retain_until, NEW.expires_at) END),
        purge_pending = min(purge_pending, CASE WHEN length(NEW.outcome_body) > 0
            THEN NEW.expires_at ELSE coalesce(NEW.retain_until, NEW.expires_at) END)
    WHERE id = 1 AND (
        purge_horizon > CASE WHEN length(NEW.outcome_body) > 0
            THEN NEW.expires_at ELSE coalesce(NEW.retain_until, NEW.expires_at) END
        OR purge_pending > CASE WHEN length(NEW.outcome_body) > 0
            THEN NEW.expires_at ELSE coalesce(NEW.retain_until, NEW.expires_at) END);
END;

CREATE TRIGGER idemgate_record_due_update
AFTER UPDATE OF state, expires_at, retain_until, outcome_body ON idemgate_record
WHEN NEW.state = 1
BEGIN
    UPDATE idemgate_upkeep SET
        purge_horizon = min(purge_horizon, CASE WHEN length(NEW.outcome_body) > 0
            THEN NEW.expires_at ELSE coalesce(NEW.retain_until, NEW.expires_at) END),
        purge_pending = min(purge_pending, CASE WHEN length(NEW.outcome_body) > 0
            THEN NEW.expires_at ELSE coalesce(NEW.retain_until, NEW.expires_at) END)
    WHERE id = 1 AND (
        purge_horizon > CASE WHEN length(NEW.outcome_body) > 0
            THEN NEW.expires_at ELSE coalesce(NEW.retain_until, NEW.expires_at) END
        OR purge_pending > CASE WHEN length(NEW.outcome_body) > 0
            THEN NEW.expires_at ELSE coalesce(NEW.retain_until, NEW.expires_at) END);
END;

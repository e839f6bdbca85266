-- Version 7 of the idemgate SQLite schema: a record's history (issue 33), what happened to it that
-- its state does not say (why its outcome became unknown, a refused late outcome, a verifier's
-- finding, who resolved or reopened it and why): one JSON object per line, appended on those rare
-- paths only (`idemgate_core::history`). NULL for a record that has none, which is nearly every
-- one, so a fresh call writes nothing more. Record writes never name the column: an update in
-- place (a takeover, a completion, the next reservation of a reopened key) keeps it; it goes when
-- the row is deleted.
ALTER TABLE idemgate_record ADD COLUMN history TEXT;

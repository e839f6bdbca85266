-- A record's history (issue 33): what happened to it that its state does not say (why its outcome
-- became unknown, a refused late outcome, a verifier's finding, who resolved or reopened it and
-- why), one JSON object per line, appended on those rare paths only (`idemgate_core::history`).
-- NULL for nearly every record, so a fresh call writes nothing more; adding a nullable column with
-- no default rewrites no row. No statement that writes a record names it: an update in place (a
-- takeover, a completion, `renew.sql` reserving a reopened key again) keeps it, and it goes with
-- the row.
ALTER TABLE {schema}.idemgate_records ADD COLUMN history text;

-- Completions, heartbeats, waits and unknown marks rewrite a row in place (a HOT update) only when
-- no indexed column changes. The reaper's partial index on (expires_at) WHERE state = 1 changed
-- with every completion, so each completion wrote a new entry into every index of the table; under
-- concurrent callers that made the table about a third slower than the same writes without it.
-- A purge (`idemgate keys purge`, or `PgStore::spawn_reaper`'s sweeps) now reads the whole table,
-- once per sweep rather than a little on every call. The free space fillfactor leaves on each page is where a row's
-- completed version goes, beside the in-flight one.
DROP INDEX {schema}.idemgate_records_expiry;
ALTER TABLE {schema}.idemgate_records SET (fillfactor = 90);

-- What a fresh call costs the server beyond the plain statements it needs (pgbench, 16 clients,
-- an insert and an update per call), paid for checks made elsewhere:
--
-- The index on created_at: a reservation inserted an entry into it besides the primary key's,
-- for operators' listings only. A listing (`idemgate keys list`) now reads the table and sorts
-- what it keeps, as a purge reads it once per sweep; the SQLite store has no such index either.
DROP INDEX {schema}.idemgate_records_created;
-- The CHECK constraints, each about a twentieth of the call (the server evaluates them against
-- the whole new row on every insert and every update). The store writes rows through its own
-- fixed statements only, with a token and a fingerprint of fixed size in the code, and decodes
-- every row it reads against the same rules (src/row.rs: a row that breaks one is reported
-- corrupt, for its key alone), so a bad row is still caught where it would do harm.
ALTER TABLE {schema}.idemgate_records
    DROP CONSTRAINT idemgate_records_state_fields,
    DROP CONSTRAINT idemgate_records_token_len,
    DROP CONSTRAINT idemgate_records_fingerprint_len;

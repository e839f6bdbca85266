-- Version 1 of the idemgate SQLite schema.
--
-- Applied once by the migration runner (`schema.rs`), inside the transaction that also sets
-- `PRAGMA user_version = 1`. Never edit it once released: a later version goes in a file of its own
-- that migrates version 1 to version 2.

-- One row per record, named by (tenant, tool, key). Times are milliseconds since the Unix epoch by
-- the store's clock. STRICT so that a stray write with the wrong type fails instead of being kept.
CREATE TABLE idemgate_record (
    tenant       TEXT    NOT NULL,
    tool         TEXT    NOT NULL,
    key          TEXT    NOT NULL,
    fingerprint  BLOB    NOT NULL CHECK (length(fingerprint) = 32),
    fence        INTEGER NOT NULL CHECK (fence >= 0),
    -- The holder's 128-bit token, big-endian.
    token        BLOB    NOT NULL CHECK (length(token) = 16),
    created_at   INTEGER NOT NULL,
    -- 0 in flight, 1 completed, 2 unknown. Each state has exactly its own columns set.
    state        INTEGER NOT NULL CHECK (state IN (0, 1, 2)),
    lease_until  INTEGER CHECK ((state = 0) = (lease_until IS NOT NULL)),
    since        INTEGER CHECK ((state = 2) = (since IS NOT NULL)),
    completed_at INTEGER CHECK ((state = 1) = (completed_at IS NOT NULL)),
    expires_at   INTEGER CHECK ((state = 1) = (expires_at IS NOT NULL)),
    -- 0 success, 1 failed.
    outcome_kind INTEGER CHECK ((state = 1) = (outcome_kind IS NOT NULL) AND outcome_kind IN (0, 1)),
    outcome_body BLOB    CHECK ((state = 1) = (outcome_body IS NOT NULL)),
    PRIMARY KEY (tenant, tool, key)
) STRICT;

-- Serves `list` filtered by state (its prefix) and `purge_expired` (state = 1 AND expires_at <= now).
CREATE INDEX idemgate_record_state_expiry ON idemgate_record (state, expires_at);

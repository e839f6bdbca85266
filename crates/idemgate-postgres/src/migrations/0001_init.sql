-- One row per record, named by (tenant, tool, key). Times are milliseconds since the Unix epoch
-- by the server's clock (idemgate_now_ms), never the client's.
--
-- state: 0 in flight (lease_until), 1 completed (completed_at, expires_at, outcome), 2 unknown (since).
-- An in-flight row whose lease_until has passed is reported as unknown but not rewritten.
CREATE TABLE {schema}.idemgate_records (
    tenant       text     NOT NULL,
    tool         text     NOT NULL,
    key          text     NOT NULL,
    fingerprint  bytea    NOT NULL,
    fence        bigint   NOT NULL,
    token        bytea    NOT NULL,
    created_at   bigint   NOT NULL,
    state        smallint NOT NULL,
    lease_until  bigint,
    since        bigint,
    completed_at bigint,
    expires_at   bigint,
    outcome_kind smallint,
    outcome_body bytea,
    PRIMARY KEY (tenant, tool, key),
    CONSTRAINT idemgate_records_state_fields CHECK (
        (state = 0 AND lease_until IS NOT NULL)
        OR (state = 1 AND completed_at IS NOT NULL AND expires_at IS NOT NULL
            AND outcome_kind IS NOT NULL AND outcome_body IS NOT NULL)
        OR (state = 2 AND since IS NOT NULL)
    ),
    CONSTRAINT idemgate_records_token_len CHECK (octet_length(token) = 16),
    CONSTRAINT idemgate_records_fingerprint_len CHECK (octet_length(fingerprint) = 32)
);

-- The reaper's scan.
CREATE INDEX idemgate_records_expiry ON {schema}.idemgate_records (expires_at) WHERE state = 1;
-- Operators' listings, oldest first.
CREATE INDEX idemgate_records_created ON {schema}.idemgate_records (created_at);

-- The server clock in milliseconds. now() is the start of the (single-statement) transaction, so
-- every judgment within one statement uses one instant.
CREATE FUNCTION {schema}.idemgate_now_ms() RETURNS bigint
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT floor(extract(epoch FROM now()) * 1000)::bigint $$;

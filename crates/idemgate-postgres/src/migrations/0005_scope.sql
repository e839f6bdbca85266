-- A record keeps the scope of the call that reserved it (the conversation or session it was made
-- in, `Reservation::scope`), so that operators can list a conversation's records. NULL for rows
-- written before, and for calls that name no scope. Not indexed: listings read the table anyway
-- (migration 4), and an index would cost every reservation an entry.
ALTER TABLE {schema}.idemgate_records ADD COLUMN scope text;

-- Version 3 of the idemgate SQLite schema: a record keeps the scope of the call that reserved it
-- (the conversation or session it was made in, `Reservation::scope`), so that operators can list
-- a conversation's records. NULL for records written before, and for calls that name no scope.
ALTER TABLE idemgate_record ADD COLUMN scope TEXT;

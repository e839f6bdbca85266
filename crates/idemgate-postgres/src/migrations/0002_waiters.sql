-- waiters: set by a process about to wait for the row to settle (the wait.sql statement); the
-- writes that settle a row (complete, release, mark unknown, takeover) notify the `idemgate`
-- channel only when it is set. A NOTIFY serializes commits on the server's notification queue,
-- so commits nobody waits for no longer pay for one. A new record starts without waiters.
ALTER TABLE {schema}.idemgate_records ADD COLUMN waiters boolean NOT NULL DEFAULT false;

-- Version 5 of the idemgate SQLite schema: an in-flight record's lease is judged by the host's
-- boot clock. The processes sharing a file share no server whose clock could judge their leases,
-- and a wall-clock step (NTP, a VM resumed, `date -s`) or one process's skewed clock must never
-- end a live call's lease. `lease_boot` is the kernel's boot id (16 bytes) and `lease_steady` the
-- lease's end on that boot's CLOCK_BOOTTIME, in milliseconds; a reader on the same boot judges
-- the lease by them, and one on another boot (or without a boot clock) by `lease_until`, the wall
-- clock's reading kept beside them. NULL on rows written before, and on any row not in flight, so
-- the upgrade rewrites no row.
ALTER TABLE idemgate_record ADD COLUMN lease_boot BLOB
    CHECK (lease_boot IS NULL OR (state = 0 AND length(lease_boot) = 16));
ALTER TABLE idemgate_record ADD COLUMN lease_steady INTEGER
    CHECK ((lease_steady IS NULL) = (lease_boot IS NULL));

//! Connection settings and the schema's versions.
//!
//! The schema's version lives in `PRAGMA user_version`. Each entry of [`MIGRATIONS`] takes the
//! database from the version before it to its own; [`migrate`] applies the missing ones inside one
//! `BEGIN IMMEDIATE` transaction, so two processes opening a fresh file at once cannot both run
//! them, and a crash halfway leaves the old version intact. A database written by a newer version of
//! idemgate is refused rather than misread.

use std::path::Path;

use idemgate_core::StoreError;
use rusqlite::{Connection, OpenFlags};

use crate::error::{Context, Stage};
use crate::{Durability, SqliteOptions};

/// One step of the schema.
struct Migration {
    /// The `user_version` after this step.
    version: i64,
    /// The statements of the step.
    sql: &'static str,
}

/// Every step, oldest first. A new version adds a file (`schema_v2.sql`, ...) and a line here;
/// released files are never edited.
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        sql: include_str!("schema.sql"),
    },
    Migration {
        version: 2,
        sql: include_str!("schema_v2.sql"),
    },
    Migration {
        version: 3,
        sql: include_str!("schema_v3.sql"),
    },
    Migration {
        version: 4,
        sql: include_str!("schema_v4.sql"),
    },
    Migration {
        version: 5,
        sql: include_str!("schema_v5.sql"),
    },
    Migration {
        version: 6,
        sql: include_str!("schema_v6.sql"),
    },
    Migration {
        version: 7,
        sql: include_str!("schema_v7.sql"),
    },
    Migration {
        version: 8,
        sql: include_str!("schema_v8.sql"),
    },
];

/// The statements that make a new file of schema `version`, for tests of the upgrades.
#[cfg(test)]
pub(crate) fn migrations_to(version: i64) -> impl Iterator<Item = &'static str> {
    MIGRATIONS
        .iter()
        .take_while(move |m| m.version <= version)
        .map(|m| m.sql)
}

/// The schema version this code writes and reads (`PRAGMA user_version`).
pub const SCHEMA_VERSION: i64 = 8;

/// `PRAGMA application_id` of idemgate databases ("IDMG"), so that another program's SQLite file
/// is not mistaken for one of ours.
pub const APPLICATION_ID: i64 = 0x4944_4D47;

/// Applies the connection settings the store uses on every connection it opens.
///
/// In order:
/// - `busy_timeout` = [`SqliteOptions::busy_timeout`]: how long a statement waits for another
///   connection's (or process's) lock before failing with `SQLITE_BUSY`;
/// - `PRAGMA journal_mode = WAL`: readers never block the writer and one file serves many
///   processes on one machine (WAL needs shared memory, so not on a network file system);
/// - `PRAGMA synchronous = FULL` ([`Durability::Full`], the default: each commit is on disk when
///   it returns, even across a power cut) or `NORMAL` ([`Durability::Normal`]: survives a crash of
///   the process, but a power cut may lose the last commits);
/// - `PRAGMA wal_autocheckpoint` = [`SqliteOptions::wal_limit`] in pages, and
///   `PRAGMA journal_size_limit` = `wal_limit`: the log is checkpointed once it holds that much and
///   cut back to that size afterwards, so it stays bounded.
///
/// The store writes in `BEGIN IMMEDIATE` transactions and has no foreign keys. A benchmark
/// baseline that opens a raw connection and calls this function runs with identical settings.
///
/// # Errors
/// Whatever SQLite reports while setting them.
pub fn apply_pragmas(conn: &Connection, opts: &SqliteOptions) -> rusqlite::Result<()> {
    conn.busy_timeout(opts.busy_timeout)?;
    // Returns the journal mode in force; `open` checks it, since a file system without shared
    // memory silently keeps another mode.
    let _mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))?;
    let synchronous = match opts.durability {
        Durability::Full => "FULL",
        Durability::Normal => "NORMAL",
    };
    conn.pragma_update(None, "synchronous", synchronous)?;
    let page_size: i64 = conn.pragma_query_value(None, "page_size", |row| row.get(0))?;
    let wal_limit = i64::try_from(opts.wal_limit).unwrap_or(i64::MAX);
    conn.pragma_update(
        None,
        "wal_autocheckpoint",
        (wal_limit / page_size.max(1)).max(1),
    )?;
    // Returns the limit in force, like journal_mode.
    let _limit: i64 = conn.query_row(
        &format!("PRAGMA journal_size_limit = {wal_limit}"),
        [],
        |row| row.get(0),
    )?;
    Ok(())
}

/// Whether SQLite refused for a lock another connection holds.
fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// Creates the database file readable by its owner only, when it does not exist: it holds the
/// stored results (in clear unless sealed), and SQLite gives its log and shared-memory files the
/// database file's mode. An empty file is an empty database; any failure here is left for the
/// open that follows to report.
fn create_private(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path);
    }
    #[cfg(not(unix))]
    let _ = path;
}

/// Opens one connection to `path` with the store's settings; `reader` connections refuse writes.
pub(crate) fn connect(
    path: &Path,
    opts: &SqliteOptions,
    reader: bool,
) -> Result<Connection, StoreError> {
    let what = || format!("open the sqlite store {}", path.display());
    create_private(path);
    // No SQLITE_OPEN_URI: the path is a path, never a `file:` URI with options.
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).during(Stage::Open, what)?;
    // Switching a new file to WAL takes a lock that SQLite does not wait for with the busy
    // handler: a process opening the file while another one creates it gets SQLITE_BUSY at once
    // ("database is locked"). Tried again, within the busy timeout, as every other lock is.
    let deadline = std::time::Instant::now() + opts.busy_timeout;
    let mut pause = std::time::Duration::from_millis(1);
    loop {
        match apply_pragmas(&conn, opts) {
            Err(e) if is_busy(&e) && std::time::Instant::now() < deadline => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(std::time::Duration::from_millis(50));
            }
            other => break other.during(Stage::Open, what)?,
        }
    }
    let mode: String = conn
        .pragma_query_value(None, "journal_mode", |row| row.get(0))
        .during(Stage::Open, what)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::misconfigured(format!(
            "failed to open the sqlite store {}: it runs in journal mode {mode:?}, not WAL (is it \
             on a file system without shared memory?)",
            path.display()
        )));
    }
    if reader {
        conn.pragma_update(None, "query_only", true)
            .during(Stage::Open, what)?;
    }
    Ok(conn)
}

/// Brings the schema of `conn`'s database to [`SCHEMA_VERSION`], or refuses a database it does not
/// know.
pub(crate) fn migrate(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let what = || format!("migrate the schema of {}", path.display());
    conn.execute_batch("BEGIN IMMEDIATE")
        .during(Stage::Open, what)?;
    // The mark of schema version 8 is settled in the same transaction: a file whose rows were
    // written by many short-lived processes or by hand (or just migrated) is read once here,
    // not by every listing (upkeep.rs).
    let result = migrate_in_transaction(conn, path).and_then(|()| {
        crate::upkeep::settle_at_open(conn).during(Stage::Open, || {
            format!("settle the unsettled records' mark of {}", path.display())
        })
    });
    let end = if result.is_ok() { "COMMIT" } else { "ROLLBACK" };
    let ended = conn.execute_batch(end).during(Stage::Open, what);
    result.and(ended)
}

fn migrate_in_transaction(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let what = || format!("migrate the schema of {}", path.display());
    let refuse = |why: String| {
        StoreError::misconfigured(format!(
            "failed to open the sqlite store {}: {why}",
            path.display()
        ))
    };
    let found: i64 = conn
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .during(Stage::Open, what)?;
    let app: i64 = conn
        .pragma_query_value(None, "application_id", |row| row.get(0))
        .during(Stage::Open, what)?;
    if app != APPLICATION_ID && app != 0 {
        return Err(refuse(format!(
            "it belongs to another application (application_id {app:#x})"
        )));
    }
    if found > SCHEMA_VERSION {
        return Err(refuse(format!(
            "its schema version {found} is newer than this version of idemgate knows \
             ({SCHEMA_VERSION}); upgrade idemgate or use another file"
        )));
    }
    if found < 0 {
        return Err(refuse(format!("its schema version {found} is invalid")));
    }
    if found == 0 {
        // A file with tables but no version is someone else's database; adding ours to it would
        // mix two programs' data.
        let tables: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table'",
                [],
                |row| row.get(0),
            )
            .during(Stage::Open, what)?;
        if tables > 0 {
            return Err(refuse(format!(
                "it already holds {tables} tables but no idemgate schema version"
            )));
        }
        conn.pragma_update(None, "application_id", APPLICATION_ID)
            .during(Stage::Open, what)?;
    }
    for m in MIGRATIONS.iter().filter(|m| m.version > found) {
        conn.execute_batch(m.sql).during(Stage::Open, || {
            format!("{} to version {}", what(), m.version)
        })?;
        conn.pragma_update(None, "user_version", m.version)
            .during(Stage::Open, what)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_numbered_in_order_and_end_at_the_schema_version() {
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version, i as i64 + 1);
        }
        assert_eq!(MIGRATIONS.last().map(|m| m.version), Some(SCHEMA_VERSION));
    }

    #[test]
    fn migrate_is_idempotent_and_refuses_unknown_databases() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let opts = SqliteOptions::default();
        let conn = connect(&path, &opts, false).unwrap();
        migrate(&conn, &path).unwrap();
        migrate(&conn, &path).unwrap();
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);

        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .unwrap();
        let e = migrate(&conn, &path).unwrap_err();
        assert!(
            matches!(&e, StoreError::Misconfigured(m) if m.contains("newer")),
            "{e}"
        );

        let other = dir.path().join("other");
        let conn = connect(&other, &opts, false).unwrap();
        conn.execute_batch("CREATE TABLE notes (body TEXT)")
            .unwrap();
        let e = migrate(&conn, &other).unwrap_err();
        assert!(
            matches!(&e, StoreError::Misconfigured(m) if m.contains("no idemgate schema version")),
            "{e}"
        );
        conn.pragma_update(None, "application_id", 7).unwrap();
        let e = migrate(&conn, &other).unwrap_err();
        assert!(
            matches!(&e, StoreError::Misconfigured(m) if m.contains("another application")),
            "{e}"
        );
    }
}

//! How SQLite's errors become [`StoreError`]s.
//!
//! The engine acts on the class of an error, not its text: [`StoreError::Unavailable`] means the
//! write certainly did not happen (the reservation is refused, nothing runs), and
//! [`StoreError::Indeterminate`] means it may have (the record is treated as unknown). So the class
//! depends on the stage at which SQLite failed, not only on its code: a disk error while running a
//! statement inside an open transaction loses nothing (the transaction is rolled back), while the
//! same error during `COMMIT` may leave the commit on disk or not.

use std::fmt;

use idemgate_core::{Cause, StoreError};
use rusqlite::ErrorCode;

/// Where in an operation SQLite failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Opening, setting up or migrating the database.
    Open,
    /// A read on a read connection.
    Read,
    /// Before `COMMIT` of a write transaction: whatever happened is rolled back.
    Write,
    /// The `COMMIT` itself.
    Commit,
}

/// Classifies `e`, met at `stage` while trying to `what` (text that fits "failed to ..."); `e`
/// stays the error's source.
pub(crate) fn classify(stage: Stage, what: impl fmt::Display, e: rusqlite::Error) -> StoreError {
    let class = class_of(stage, &e);
    class(Cause::new(format!("failed to {what}: {e}"), e))
}

/// Which [`StoreError`] `e` is, met at `stage`.
fn class_of(stage: Stage, e: &rusqlite::Error) -> fn(Cause) -> StoreError {
    match e {
        rusqlite::Error::SqliteFailure(f, _) => match f.code {
            ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase => StoreError::Corrupt,
            // Lock waits beyond busy_timeout, files that cannot be opened, read-only files: the
            // statement did not run, and a COMMIT that met them left the transaction uncommitted.
            ErrorCode::DatabaseBusy
            | ErrorCode::DatabaseLocked
            | ErrorCode::CannotOpen
            | ErrorCode::PermissionDenied
            | ErrorCode::ReadOnly => StoreError::Unavailable,
            // The WAL may hold part or all of the commit; only a later read can tell.
            ErrorCode::DiskFull | ErrorCode::SystemIoFailure if stage == Stage::Commit => {
                StoreError::Indeterminate
            }
            _ if stage == Stage::Commit => StoreError::Indeterminate,
            _ => StoreError::Unavailable,
        },
        rusqlite::Error::FromSqlConversionFailure(..)
        | rusqlite::Error::IntegralValueOutOfRange(..)
        | rusqlite::Error::Utf8Error(..)
        | rusqlite::Error::InvalidColumnType(..) => StoreError::Corrupt,
        _ if stage == Stage::Commit => StoreError::Indeterminate,
        _ => StoreError::Unavailable,
    }
}

/// The stage of a write statement on `conn`: [`Stage::Write`] inside a transaction (whatever it
/// did is rolled back on an error), [`Stage::Commit`] when it runs alone and commits by itself.
pub(crate) fn write_stage(conn: &rusqlite::Connection) -> Stage {
    if conn.is_autocommit() {
        Stage::Commit
    } else {
        Stage::Write
    }
}

/// Whether `e` comes from SQLite refusing to write a read-only database.
pub(crate) fn is_read_only(e: &StoreError) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(e) = s.downcast_ref::<rusqlite::Error>() {
            return e.sqlite_error_code() == Some(ErrorCode::ReadOnly);
        }
        source = s.source();
    }
    false
}

/// Attaches the stage and the action to a rusqlite result.
pub(crate) trait Context<T> {
    /// The result, its error classified by [`classify`]; `what` is only called on an error.
    fn during<D: fmt::Display>(
        self,
        stage: Stage,
        what: impl FnOnce() -> D,
    ) -> Result<T, StoreError>;
}

impl<T> Context<T> for rusqlite::Result<T> {
    fn during<D: fmt::Display>(
        self,
        stage: Stage,
        what: impl FnOnce() -> D,
    ) -> Result<T, StoreError> {
        self.map_err(|e| classify(stage, what(), e))
    }
}

/// A stored value this version cannot read.
pub(crate) fn corrupt(what: impl fmt::Display, why: impl fmt::Display) -> StoreError {
    StoreError::corrupt(format!("failed to {what}: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sqlite(code: std::ffi::c_int) -> rusqlite::Error {
        rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None)
    }

    #[test]
    fn classes_follow_the_stage() {
        use rusqlite::ffi;
        let busy = || sqlite(ffi::SQLITE_BUSY);
        let io = || sqlite(ffi::SQLITE_IOERR);
        assert!(matches!(
            classify(Stage::Commit, "commit", busy()),
            StoreError::Unavailable(_)
        ));
        assert!(matches!(
            classify(Stage::Write, "write", io()),
            StoreError::Unavailable(_)
        ));
        assert!(matches!(
            classify(Stage::Commit, "commit", io()),
            StoreError::Indeterminate(_)
        ));
        assert!(matches!(
            classify(Stage::Commit, "commit", sqlite(ffi::SQLITE_FULL)),
            StoreError::Indeterminate(_)
        ));
        assert!(matches!(
            classify(Stage::Open, "open", sqlite(ffi::SQLITE_CANTOPEN)),
            StoreError::Unavailable(_)
        ));
        assert!(matches!(
            classify(Stage::Read, "read", sqlite(ffi::SQLITE_NOTADB)),
            StoreError::Corrupt(_)
        ));
        let decode = rusqlite::Error::IntegralValueOutOfRange(1, -1);
        assert!(matches!(
            classify(Stage::Read, "read", decode),
            StoreError::Corrupt(_)
        ));
        let e = classify(Stage::Read, "read record a/b/c", busy());
        assert!(
            e.to_string().contains("failed to read record a/b/c: "),
            "{e}"
        );
    }

    #[test]
    fn the_driver_error_is_the_source() {
        let e = classify(Stage::Commit, "commit", sqlite(rusqlite::ffi::SQLITE_IOERR));
        let source = std::error::Error::source(&e).expect("a source");
        let driver = source
            .downcast_ref::<rusqlite::Error>()
            .expect("rusqlite's error");
        assert_eq!(driver.sqlite_error_code(), Some(ErrorCode::SystemIoFailure));
        assert_eq!(
            e.to_string(),
            format!("store answer lost, the write may have happened: failed to commit: {driver}"),
            "the text is unchanged"
        );
    }
}

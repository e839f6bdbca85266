//! How driver and pool errors become [`StoreError`]s.
//!
//! The one question that matters to the engine is whether a write may have happened:
//! - the pool could not hand out a connection (refused, timed out, closed): nothing was sent, so
//!   [`StoreError::Unavailable`];
//! - the server answered with an error: the single-statement transaction was rolled back, so
//!   [`StoreError::Unavailable`] (or [`StoreError::Misconfigured`] for a missing table or a
//!   permission, [`StoreError::Corrupt`] for a broken row);
//! - the connection broke, or the answer did not come in time, after the statement was sent: the
//!   commit may have happened, so [`StoreError::Indeterminate`].
//!
//! Serialization failures and deadlocks are retried by the caller ([`is_retryable`]).

use std::fmt;

use deadpool_postgres::PoolError;
use idemgate_core::{Cause, StoreError};
use tokio_postgres::error::SqlState;

/// An error while getting a connection from the pool: nothing was sent.
pub(crate) fn pool(e: PoolError) -> StoreError {
    match e {
        PoolError::Timeout(kind) => StoreError::unavailable(format!(
            "failed to get a Postgres connection in time ({kind:?} timeout)"
        )),
        PoolError::Backend(e) => StoreError::Unavailable(Cause::new(
            format!("failed to connect to Postgres: {}", chain(&e)),
            e,
        )),
        PoolError::Closed => StoreError::unavailable("failed to use a closed pool"),
        PoolError::NoRuntimeSpecified => {
            StoreError::misconfigured("failed to use a pool without a runtime")
        }
        PoolError::PostCreateHook(e) => StoreError::Unavailable(Cause::new(
            format!("failed to set up a new Postgres connection: {e}"),
            e,
        )),
    }
}

/// An error before the statement was sent (preparing it): nothing was written.
pub(crate) fn before_send(e: tokio_postgres::Error) -> StoreError {
    match e.as_db_error() {
        Some(_) => server(e),
        None => StoreError::Unavailable(Cause::new(
            format!("failed to reach Postgres: {}", chain(&e)),
            e,
        )),
    }
}

/// An error after the statement was sent.
pub(crate) fn after_send(e: tokio_postgres::Error) -> StoreError {
    if e.as_db_error().is_some() {
        return server(e);
    }
    // Closed connection, I/O error, protocol error: the commit may have happened.
    StoreError::Indeterminate(Cause::new(
        format!("failed to read the Postgres answer: {}", chain(&e)),
        e,
    ))
}

/// An error the server reported: the statement (its own transaction) did not commit, except when
/// the server ended the session, which may have happened after a commit whose answer was lost.
fn server(e: tokio_postgres::Error) -> StoreError {
    let code = e.code().map(SqlState::code).unwrap_or("");
    let class = match code {
        // admin_shutdown, crash_shutdown, and connection exceptions: the session ended under us.
        "57P01" | "57P02" => StoreError::Indeterminate,
        c if c.starts_with("08") => StoreError::Indeterminate,
        // Missing tables or schemas, permissions: the database is not set up for this version.
        "3F000" | "42501" | "42P01" | "42883" | "42703" => StoreError::Misconfigured,
        // Our own constraints refused a row: somebody wrote rows this version does not make.
        "23514" | "23502" | "22P02" => StoreError::Corrupt,
        _ => StoreError::Unavailable,
    };
    class(Cause::new(
        format!("Postgres said: {} (SQLSTATE {code})", chain(&e)),
        e,
    ))
}

/// Whether the statement failed for a transient concurrency reason and may simply run again.
pub(crate) fn is_retryable(e: &tokio_postgres::Error) -> bool {
    matches!(
        e.code(),
        Some(c) if *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED
    )
}

/// A row this version cannot read.
pub(crate) fn corrupt(what: impl fmt::Display) -> StoreError {
    StoreError::corrupt(unreadable_row(what))
}

/// A column of a row that the driver could not read as its type.
pub(crate) fn corrupt_column(col: &str, e: tokio_postgres::Error) -> StoreError {
    let message = unreadable_row(format_args!("column {col}: {}", chain(&e)));
    StoreError::Corrupt(Cause::new(message, e))
}

fn unreadable_row(what: impl fmt::Display) -> String {
    format!("failed to read a record row: {what}")
}

/// The error and its sources on one line.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(inner) = cur {
        let next = inner.to_string();
        if !s.contains(&next) {
            s.push_str(": ");
            s.push_str(&next);
        }
        cur = inner.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_errors_are_unavailable() {
        let e = pool(PoolError::Timeout(deadpool_postgres::TimeoutType::Wait));
        assert!(matches!(e, StoreError::Unavailable(_)), "{e:?}");
        assert!(matches!(
            pool(PoolError::Closed),
            StoreError::Unavailable(_)
        ));
    }

    #[test]
    fn the_driver_error_is_the_source() {
        let driver = || "port=x".parse::<tokio_postgres::Config>().unwrap_err();
        let e = after_send(driver());
        assert!(matches!(e, StoreError::Indeterminate(_)), "{e:?}");
        let source = std::error::Error::source(&e).expect("a source");
        assert!(source.is::<tokio_postgres::Error>(), "{source:?}");
        assert_eq!(source.to_string(), driver().to_string());
        assert_eq!(
            e.to_string(),
            format!(
                "store answer lost, the write may have happened: failed to read the Postgres \
                 answer: {}",
                chain(&driver())
            ),
            "the text is unchanged"
        );
    }
}

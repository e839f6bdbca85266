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

use deadpool_postgres::PoolError;
use idemgate_core::StoreError;
use tokio_postgres::error::SqlState;

/// An error while getting a connection from the pool: nothing was sent.
pub(crate) fn pool(e: PoolError) -> StoreError {
    match e {
        PoolError::Timeout(kind) => StoreError::Unavailable(format!(
            "failed to get a Postgres connection in time ({kind:?} timeout)"
        )),
        PoolError::Backend(e) => {
            StoreError::Unavailable(format!("failed to connect to Postgres: {}", chain(&e)))
        }
        PoolError::Closed => StoreError::Unavailable("failed to use a closed pool".to_owned()),
        PoolError::NoRuntimeSpecified => {
            StoreError::Misconfigured("failed to use a pool without a runtime".to_owned())
        }
        PoolError::PostCreateHook(e) => {
            StoreError::Unavailable(format!("failed to set up a new Postgres connection: {e}"))
        }
    }
}

/// An error before the statement was sent (preparing it): nothing was written.
pub(crate) fn before_send(e: &tokio_postgres::Error) -> StoreError {
    match e.as_db_error() {
        Some(_) => server(e),
        None => StoreError::Unavailable(format!("failed to reach Postgres: {}", chain(e))),
    }
}

/// An error after the statement was sent.
pub(crate) fn after_send(e: &tokio_postgres::Error) -> StoreError {
    if e.as_db_error().is_some() {
        return server(e);
    }
    // Closed connection, I/O error, protocol error: the commit may have happened.
    StoreError::Indeterminate(format!("failed to read the Postgres answer: {}", chain(e)))
}

/// An error the server reported: the statement (its own transaction) did not commit, except when
/// the server ended the session, which may have happened after a commit whose answer was lost.
fn server(e: &tokio_postgres::Error) -> StoreError {
    let code = e.code().map(SqlState::code).unwrap_or("");
    let msg = format!("Postgres said: {} (SQLSTATE {code})", chain(e));
    match code {
        // admin_shutdown, crash_shutdown, and connection exceptions: the session ended under us.
        "57P01" | "57P02" => StoreError::Indeterminate(msg),
        c if c.starts_with("08") => StoreError::Indeterminate(msg),
        // Missing tables or schemas, permissions: the database is not set up for this version.
        "3F000" | "42501" | "42P01" | "42883" | "42703" => StoreError::Misconfigured(msg),
        // Our own constraints refused a row: somebody wrote rows this version does not make.
        "23514" | "23502" | "22P02" => StoreError::Corrupt(msg),
        _ => StoreError::Unavailable(msg),
    }
}

/// Whether the statement failed for a transient concurrency reason and may simply run again.
pub(crate) fn is_retryable(e: &tokio_postgres::Error) -> bool {
    matches!(
        e.code(),
        Some(c) if *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED
    )
}

/// A row this version cannot read.
pub(crate) fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("failed to read a record row: {what}"))
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
}

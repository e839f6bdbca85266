//! How Redis errors become [`StoreError`]s.
//!
//! What the engine does next depends on whether a write may have happened, so the mapping follows
//! what redis-rs can tell about where the failure struck:
//!
//! - our own scripts' `LEASE_LOST` error reply is [`StoreError::LeaseLost`];
//! - a refused connection (the manager could not reconnect, so nothing was sent) and server errors
//!   that Redis raises before running a script (`LOADING`, `BUSY`, `READONLY`, `OOM`, `NOSCRIPT`,
//!   `MASTERDOWN`, `NOPERM`, ...) are [`StoreError::Unavailable`]: the write certainly did not
//!   happen;
//! - a timeout, a dropped connection or any other I/O error is [`StoreError::Indeterminate`]: the
//!   request may have reached the server. redis-rs cannot say whether a command on a multiplexed
//!   connection that broke was written to the socket, so a broken connection is always treated as
//!   "may have happened";
//! - an answer that cannot be parsed, or an error the client does not know, is
//!   [`StoreError::Indeterminate`] too (the script may have run); a record that cannot be decoded
//!   is [`StoreError::Corrupt`].

use idemgate_core::{Cause, StoreError};
use redis::{ErrorKind, RedisError, ServerErrorKind};

/// The error code our scripts reply with when the caller's lease is not the record's current one.
pub(crate) const LEASE_LOST: &str = "LEASE_LOST";

/// Maps a redis-rs error of operation `what` ("reserve", "complete", ...) to a [`StoreError`],
/// whose source `e` stays.
pub(crate) fn classify(e: &RedisError, what: &str) -> StoreError {
    // Redis 7 keeps the code of `redis.error_reply('LEASE_LOST ...')`; some versions and proxies
    // put a generic `ERR` in front of a reply without one.
    let ours = e.code() == Some(LEASE_LOST)
        || (e.code() == Some("ERR") && e.detail().is_some_and(|d| d.starts_with(LEASE_LOST)));
    if ours {
        return StoreError::LeaseLost;
    }
    let class = class_of(e);
    class(Cause::new(
        format!("failed to {what} on redis: {e}"),
        e.clone(),
    ))
}

/// Which [`StoreError`] `e` is, when it is not our own `LEASE_LOST`.
fn class_of(e: &RedisError) -> fn(Cause) -> StoreError {
    // Checked first: a refused connection also counts as "dropped" for redis-rs.
    if e.is_connection_refusal() {
        return StoreError::Unavailable;
    }
    if e.is_timeout() || e.is_connection_dropped() || e.is_io_error() {
        return StoreError::Indeterminate;
    }
    match e.kind() {
        // The server refused the command before running it.
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::NoScript
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::MasterDown
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::CrossSlot
            | ServerErrorKind::Moved
            | ServerErrorKind::Ask
            | ServerErrorKind::NoPerm
            | ServerErrorKind::NotBusy,
        ) => StoreError::Unavailable,
        // A generic `ERR` may come from a script that failed half way (Redis does not roll
        // scripts back), so it may have written.
        ErrorKind::Server(_) => StoreError::Indeterminate,
        ErrorKind::AuthenticationFailed
        | ErrorKind::InvalidClientConfig
        | ErrorKind::Client
        | ErrorKind::ClusterConnectionNotFound
        | ErrorKind::RESP3NotSupported => StoreError::Unavailable,
        ErrorKind::Extension => match e.code() {
            // Redis refuses commands with these before running them.
            Some("BUSY" | "OOM" | "LOADING" | "NOAUTH" | "WRONGPASS" | "MISCONF") => {
                StoreError::Unavailable
            }
            _ => StoreError::Indeterminate,
        },
        _ => StoreError::Indeterminate,
    }
}

/// A record or reply that this version cannot read.
pub(crate) fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::corrupt(what.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io(kind: std::io::ErrorKind) -> RedisError {
        RedisError::from(std::io::Error::from(kind))
    }

    #[test]
    fn refused_connection_is_unavailable() {
        let e = classify(&io(std::io::ErrorKind::ConnectionRefused), "reserve");
        assert!(matches!(e, StoreError::Unavailable(_)), "{e:?}");
    }

    #[test]
    fn dropped_or_timed_out_is_indeterminate() {
        for kind in [
            std::io::ErrorKind::TimedOut,
            std::io::ErrorKind::BrokenPipe,
            std::io::ErrorKind::ConnectionReset,
            std::io::ErrorKind::UnexpectedEof,
        ] {
            let e = classify(&io(kind), "complete");
            assert!(matches!(e, StoreError::Indeterminate(_)), "{kind:?}: {e:?}");
        }
    }

    #[test]
    fn messages_fit_failed_to() {
        let e = classify(&io(std::io::ErrorKind::ConnectionRefused), "reserve");
        assert!(e.to_string().contains("failed to reserve on redis"), "{e}");
    }

    #[test]
    fn the_driver_error_is_the_source() {
        let driver = io(std::io::ErrorKind::ConnectionReset);
        let e = classify(&driver, "complete");
        let source = std::error::Error::source(&e).expect("a source");
        let kept = source
            .downcast_ref::<RedisError>()
            .expect("redis-rs's error");
        assert!(kept.is_connection_dropped(), "{kept:?}");
        assert_eq!(
            e.to_string(),
            format!(
                "store answer lost, the write may have happened: failed to complete on redis: \
                 {driver}"
            ),
            "the text is unchanged"
        );
    }
}

//! Errors of the proxy itself (not of calls: those are answers).

/// Why the proxy could not start or run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration is invalid.
    #[error("failed to read the configuration: {0}")]
    Config(String),
    /// The server could not be started.
    #[error("failed to start the server {command:?}: {source}")]
    Spawn {
        /// The program.
        command: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The upstream URL or one of its headers is invalid.
    #[error("{0}")]
    Upstream(String),
    /// Reading or writing a stream failed.
    #[error("failed to relay frames: {0}")]
    Io(#[from] std::io::Error),
}

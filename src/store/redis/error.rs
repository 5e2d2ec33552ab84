//! [`MirrorError`]: why the mirror could not start or flush.

use crate::redis_conn::{ConnectFailure, ConnectFailureKind};

/// Why the mirror could not start or flush. URLs are always shown without their password.
#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    /// The URL does not parse as a Redis URL.
    #[error("invalid Redis URL {url}: {reason}")]
    BadUrl {
        /// URL without its password.
        url: String,
        /// Why it does not parse.
        reason: String,
    },
    /// Redis did not answer (refused, unreachable, timed out, TLS failure).
    #[error("cannot connect to Redis at {url}: {reason}")]
    Connect {
        /// URL without its password.
        url: String,
        /// What the connection attempt reported.
        reason: String,
    },
    /// Redis refused the credentials (or wants some and got none).
    #[error("Redis at {url} refused authentication: {reason}")]
    Auth {
        /// URL without its password.
        url: String,
        /// What Redis answered.
        reason: String,
    },
    /// The writer task has stopped.
    #[error("the Redis mirror for {url} has stopped")]
    Stopped {
        /// URL without its password.
        url: String,
    },
    /// A Redis command failed (dump, offline tools).
    #[error("Redis command failed at {url}: {reason}")]
    Command {
        /// URL without its password.
        url: String,
        /// What Redis answered.
        reason: String,
    },
}

impl From<ConnectFailure> for MirrorError {
    fn from(f: ConnectFailure) -> Self {
        let ConnectFailure { kind, url, reason } = f;
        match kind {
            ConnectFailureKind::BadUrl => MirrorError::BadUrl { url, reason },
            ConnectFailureKind::Auth => MirrorError::Auth { url, reason },
            ConnectFailureKind::Unreachable => MirrorError::Connect { url, reason },
        }
    }
}

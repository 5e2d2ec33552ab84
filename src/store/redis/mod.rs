//! The Redis mirror of the index in kthena's exact layout (DESIGN.md §6).
//!
//! API CONTRACT (skeleton; issue 3 fills in the bodies — the daemon codes against these
//! signatures, so keep them).

use std::time::Duration;

use crate::index::{Delta, Index};
use crate::medium::TierWeights;

/// How field values are written.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    serde::Serialize,
    serde::Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum ValueFormat {
    /// `"{ts}"` without a medium, `"{ts}|{MEDIUM}"` with one (default).
    #[default]
    Tiered,
    /// Always a bare `"{ts}"`, for kthena routers that predate tier support.
    Timestamp,
}

/// Settings of the mirror.
#[derive(Debug, Clone, PartialEq)]
pub struct RedisConfig {
    /// `redis://[user:pass@]host:port/db` or `rediss://…` for TLS.
    pub url: String,
    /// Field value format.
    pub value_format: ValueFormat,
    /// Write the engine-hash mapping keys (kthena compatibility; default on).
    pub mapping_keys: bool,
    /// Flush once this many commands are pending.
    pub flush_max_commands: usize,
    /// Flush at least this often while commands are pending.
    pub flush_interval: Duration,
    /// Delta batches queued before ingest waits (backpressure).
    pub queue_capacity: usize,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            url: "redis://127.0.0.1:6379/0".to_owned(),
            value_format: ValueFormat::Tiered,
            mapping_keys: true,
            flush_max_commands: 1000,
            flush_interval: Duration::from_millis(5),
            queue_capacity: 1024,
        }
    }
}

/// Why the mirror could not start or flush.
#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    /// Placeholder until issue 3 defines the real kinds.
    #[error("redis mirror for {url}: {what}")]
    Other {
        /// URL without its password.
        url: String,
        /// What went wrong.
        what: String,
    },
}

/// Figures of a running mirror.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct MirrorStats {
    /// Redis commands written.
    pub commands: u64,
    /// Pipelines sent.
    pub pipelines: u64,
    /// Flush latency p50, microseconds.
    pub flush_p50_us: u64,
    /// Flush latency p99, microseconds.
    pub flush_p99_us: u64,
    /// Delta batches waiting in the queue.
    pub queue_depth: usize,
    /// Redis unreachable: writes are pending a reconcile.
    pub dirty: bool,
    /// A reconcile is running.
    pub reconciling: bool,
}

/// A cloneable handle for ingest tasks to send deltas through.
#[derive(Debug, Clone)]
pub struct MirrorSender {
    _private: (),
}

impl MirrorSender {
    /// Queues one batch of deltas; waits when the queue is full (backpressure).
    pub async fn send(&self, _deltas: Vec<Delta>) {
        unimplemented!("issue 3")
    }
}

/// The running mirror task.
#[derive(Debug)]
pub struct MirrorHandle {
    _private: (),
}

impl MirrorHandle {
    /// Connects (failing fast on a bad URL or failed auth) and starts the writer task.
    ///
    /// # Errors
    /// [`MirrorError`] naming the URL without its password.
    pub async fn start(
        _config: RedisConfig,
        _index: Index,
        _weights: TierWeights,
    ) -> Result<MirrorHandle, MirrorError> {
        unimplemented!("issue 3")
    }

    /// A sender for ingest tasks.
    pub fn sender(&self) -> MirrorSender {
        unimplemented!("issue 3")
    }

    /// Waits until every delta sent before this call is written to Redis.
    ///
    /// # Errors
    /// [`MirrorError`] when the writer task is gone.
    pub async fn flush(&self) -> Result<(), MirrorError> {
        unimplemented!("issue 3")
    }

    /// Current figures.
    pub fn stats(&self) -> MirrorStats {
        unimplemented!("issue 3")
    }

    /// Whether Redis answered the last write or ping.
    pub fn is_healthy(&self) -> bool {
        unimplemented!("issue 3")
    }

    /// Flushes what is queued (bounded by `deadline`) and stops the writer.
    pub async fn shutdown(self, _deadline: Duration) {
        unimplemented!("issue 3")
    }
}

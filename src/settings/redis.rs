//! The Redis mirror's settings ([`RedisConfig`]) and the bounds of the HA lease's ttl: what
//! `config` validates the file into and `store` runs with.

use std::time::Duration;

use crate::redis_conn::RedisTarget;
use crate::redis_layout::ValueFormat;
use crate::shard::Shard;

/// Shortest lease a config may ask for: renewals every ttl/3 must fit a Redis round trip.
pub const MIN_LEASE_TTL: Duration = Duration::from_millis(200);
/// Longest lease a config may ask for: a dead leader's pods go unwritten this long.
pub const MAX_LEASE_TTL: Duration = Duration::from_secs(60);
/// Default lease: a dead leader is replaced within about this long.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(3);

/// The writer's connections to a single Redis unless the config says otherwise: one
/// connection's pipelines are already large enough for Redis to batch, and every further
/// connection costs kvindex CPU (docs/benchmarks.md, `redis_ingest`).
pub const DEFAULT_CONNECTIONS: usize = 1;
/// Connections a config may ask for at most: past a few, Redis's one thread is the limit.
pub const MAX_CONNECTIONS: usize = 16;

/// Settings of the mirror.
#[derive(Debug, Clone, PartialEq)]
pub struct RedisConfig {
    /// Where Redis is: one server (`redis://[user:pass@]host:port/db`, `rediss://…` for
    /// TLS) or a Redis Cluster's seed URLs.
    pub target: RedisTarget,
    /// Field value format.
    pub value_format: ValueFormat,
    /// Write the engine-hash mapping keys (kthena compatibility; default on).
    pub mapping_keys: bool,
    /// Flush once this many commands are pending (at most one pipeline's bound).
    /// While no pipeline is in flight the writer flushes at once, whatever is pending.
    pub flush_max_commands: usize,
    /// Flush at least this often while commands are pending.
    pub flush_interval: Duration,
    /// Connections the writer spreads its flushes over, each key always on the same one (a
    /// single Redis; a cluster connection routes per master on its own and uses one).
    pub connections: usize,
    /// Delta batches queued before ingest waits (backpressure); the queue also holds at most
    /// `MAX_QUEUED_DELTAS` deltas.
    pub queue_capacity: usize,
    /// Keep kvindex's checkpoint (`kvindex:` keys: per-source watermarks and engine-block
    /// state) in the same pipelines, and rebuild the index from it at start: what lets a
    /// restarted daemon go on where the previous one stopped. On for `serve`, off for
    /// offline tools, whose writes are kthena's layout alone.
    pub checkpoint: bool,
    /// Run anti-entropy verify passes: compare Redis with the index for the pods of the
    /// registered sources and delete what the index does not hold. On for `serve`; off for
    /// offline tools (`replay --redis`), whose short-lived index is not those pods' truth and
    /// must never delete a live pod's fields.
    pub verify: bool,
    /// The replica's shard: a warm start restores (and so later verifies, rewrites or
    /// forgets) only the checkpointed sources of pods this shard owns, never another
    /// replica's.
    pub shard: Shard,
    /// A periodic anti-entropy pass starts at most this often.
    pub anti_entropy_interval: Duration,
    /// Commands per second a periodic anti-entropy pass may send (reads and repairs).
    pub anti_entropy_max_commands_per_s: u32,
    /// A resident field is rewritten with the current time before it is this old (seconds),
    /// and its mapping keys' TTL renewed, so kthena's 24 h GC never drops it.
    pub refresh_after_s: u32,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            target: RedisTarget::Single("redis://127.0.0.1:6379/0".to_owned()),
            value_format: ValueFormat::Tiered,
            mapping_keys: true,
            flush_max_commands: 1000,
            flush_interval: Duration::from_millis(5),
            connections: DEFAULT_CONNECTIONS,
            queue_capacity: 1024,
            checkpoint: false,
            verify: true,
            shard: Shard::SINGLE,
            anti_entropy_interval: Duration::from_secs(60),
            anti_entropy_max_commands_per_s: 1000,
            refresh_after_s: 43_200,
        }
    }
}

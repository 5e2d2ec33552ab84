//! The config file as written ([`RawConfig`]): what serde reads, every section optional and
//! unknown keys rejected; [`super::validate()`] turns it into a [`super::Config`].

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_saphyr::Spanned;

use super::kubernetes::RawDiscovery;
use crate::redis_layout::ValueFormat;

/// The file as written: every section optional, unknown keys rejected.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// Redis mirror; absent = in-memory index only (embedded default).
    #[serde(default)]
    pub redis: Option<RawRedis>,
    /// HTTP query API; absent = not served.
    #[serde(default)]
    pub api: Option<RawApi>,
    /// Prometheus `/metrics`, `/healthz`, `/readyz` listener.
    #[serde(default)]
    pub metrics: Option<RawMetrics>,
    /// Score weights per storage tier, each in [0.0, 1.0].
    #[serde(default)]
    pub tier_weights: Option<BTreeMap<String, Spanned<f64>>>,
    /// Weight of tiers `tier_weights` does not name (default 1.0, kthena's rule).
    #[serde(default)]
    pub unknown_medium_weight: Option<Spanned<f64>>,
    /// Engine pods to subscribe to.
    #[serde(default)]
    pub targets: Vec<Spanned<RawTarget>>,
    /// Engine pods found at run time (`discovery.kubernetes`).
    #[serde(default)]
    pub discovery: Option<RawDiscovery>,
    /// Limits on what engines may send (every target).
    #[serde(default)]
    pub ingest: Option<RawIngest>,
    /// This replica's share of the targets (sharded replicas); absent = it owns them all.
    #[serde(default)]
    pub shard: Option<RawShard>,
    /// Routers' placements (`POST /v1/routed`) counted by `prefix` scoring until confirmed.
    #[serde(default)]
    pub speculative: Option<RawSpeculative>,
    /// High availability: replicas share a lease, one writes Redis; absent = this replica
    /// always writes.
    #[serde(default)]
    pub ha: Option<RawHa>,
}

/// `ha:` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHa {
    /// The writer lease's time to live, milliseconds (default 3000; 200 … 60000).
    pub lease_ttl_ms: Option<Spanned<u64>>,
}

/// `speculative:` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSpeculative {
    /// How long a placement counts unconfirmed, ms (default 2000; 0 turns it off).
    pub ttl_ms: Option<Spanned<u64>>,
    /// Placed blocks kept at most (default 1,048,576); the oldest make room.
    pub max_entries: Option<Spanned<usize>>,
}

/// `shard:` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawShard {
    /// This replica's shard number, `0..count` (env `KVINDEX_SHARD_INDEX`, which also takes
    /// a StatefulSet pod name such as `kvindex-2`).
    pub index: Option<Spanned<u32>>,
    /// Replicas sharing the targets, at least 1 (env `KVINDEX_SHARD_COUNT`).
    pub count: Option<Spanned<u32>>,
}

/// `ingest:` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawIngest {
    /// Largest ZMQ frame accepted, bytes (default 64 MiB); larger ones are dropped, counted.
    pub max_frame_bytes: Option<Spanned<usize>>,
    /// Distinct models (base + LoRA adapters) one source may hold (default 1024).
    pub max_models_per_source: Option<Spanned<usize>>,
    /// Whether to compute kthena's std hashes and keep their layer (default true; `false`
    /// makes the in-memory index `prefix`-only, and needs no `redis:`).
    pub std_hashes: Option<Spanned<bool>>,
}

/// `redis:` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRedis {
    /// `redis://host:port/db` or `rediss://…`.
    pub url: Option<Spanned<String>>,
    /// Seed URLs of a Redis Cluster (instead of `url`): same credentials and TLS for all.
    pub cluster_nodes: Option<Spanned<Vec<String>>>,
    /// `tiered` (default) or `timestamp` (for kthena routers that predate tiers).
    pub value_format: Option<ValueFormat>,
    /// Write kthena's engine-hash mapping keys (default true).
    pub mapping_keys: Option<bool>,
    /// Flush after this many pending commands (default 1000).
    pub flush_max_commands: Option<Spanned<usize>>,
    /// Flush at least this often, milliseconds (default 5; 0 is refused).
    pub flush_interval_ms: Option<Spanned<u64>>,
    /// Delta batches queued before ingest waits (default 1024).
    pub queue_capacity: Option<Spanned<usize>>,
    /// Connections the writer spreads its flushes over (default 1, 1 … 16).
    pub connections: Option<Spanned<usize>>,
    /// A periodic anti-entropy pass starts at most this often, seconds (default 60).
    pub anti_entropy_interval_s: Option<Spanned<u64>>,
    /// Commands per second a periodic anti-entropy pass may send (default 1000).
    pub anti_entropy_max_commands_per_s: Option<Spanned<u32>>,
    /// A resident field is rewritten with the current time before it is this old, seconds
    /// (default 43200 = 12 h; 1 … 86399, below kthena's 24 h GC).
    pub refresh_after_s: Option<Spanned<u32>>,
}

/// `api:` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawApi {
    /// Listen address (default 127.0.0.1:8080).
    pub listen: Option<Spanned<String>>,
    /// Bearer token required by the API (none = open; empty is refused).
    pub token: Option<Spanned<String>>,
    /// Time to deliver a request head after accept or the previous response, ms
    /// (default 30 000): also the keep-alive idle timeout.
    pub header_read_timeout_ms: Option<Spanned<u64>>,
    /// Open API connections at most (default 4096, less when the fd limit is low).
    pub max_connections: Option<Spanned<usize>>,
    /// Prompt blocks `prefix` scoring looks at, at most (default 8192).
    pub max_blocks: Option<Spanned<usize>>,
    /// Prompt blocks `kthena` scoring looks at, at most (default 128, kthena's router's).
    pub kthena_max_blocks: Option<Spanned<usize>>,
}

/// `metrics:` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMetrics {
    /// Listen address (default 127.0.0.1:9090).
    pub listen: Option<Spanned<String>>,
}

/// One `targets:` entry as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTarget {
    /// Pod name.
    pub pod: Option<String>,
    /// Namespace (default `default`).
    pub namespace: Option<String>,
    /// Served model name.
    pub model: Option<String>,
    /// `vllm`, `sglang` or `trtllm`.
    pub engine: Option<String>,
    /// `tcp://host:port` of DP rank 0's PUB socket.
    pub endpoint: Option<String>,
    /// `tcp://host:port` of DP rank 0's replay ROUTER.
    pub replay_endpoint: Option<String>,
    /// Subscription filter (`""` = everything).
    pub topic: Option<String>,
    /// DP ranks: rank r publishes on port + r (default 1).
    pub dp_ranks: Option<u32>,
    /// This target's cap on one ZMQ frame (default `ingest.max_frame_bytes`).
    pub max_frame_bytes: Option<usize>,
}

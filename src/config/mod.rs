//! The YAML config file: serde [`RawConfig`] (typos rejected) → validated [`Config`].
//!
//! Every problem is collected and reported at once, each naming the field and its line,
//! before anything is bound. Environment variables override the common fields
//! (`KVINDEX_REDIS_URL`, `KVINDEX_REDIS_VALUE_FORMAT`, `KVINDEX_API_LISTEN`,
//! `KVINDEX_API_TOKEN`, `KVINDEX_METRICS_LISTEN`, `KVINDEX_SHARD_INDEX`,
//! `KVINDEX_SHARD_COUNT`), read through [`Env`] so tests need no real environment.
//!
//! Here the validated types, loading and the resolved JSON `check-config` prints; the file
//! as written in `raw`, its checks in `validate`, Kubernetes discovery's section in
//! [`kubernetes`].

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use crate::index::SpeculativeOptions;
use crate::medium::TierWeights;
/// Replica sharding, set by the `shard:` section.
pub use crate::shard::Shard;
use crate::store::redis::{RedisConfig, RedisTarget};

pub use crate::ingest::{Target, TcpEndpoint, MAX_DP_RANKS};

pub mod kubernetes;
mod raw;
mod validate;

pub use raw::{
    RawApi, RawConfig, RawHa, RawIngest, RawMetrics, RawRedis, RawShard, RawSpeculative, RawTarget,
};
pub use validate::validate;

use kubernetes::KubernetesConfig;

/// The validated config.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Redis mirror settings, when one is configured.
    pub redis: Option<RedisConfig>,
    /// HTTP API settings, when configured.
    pub api: Option<ApiConfig>,
    /// Metrics listener.
    pub metrics_listen: SocketAddr,
    /// Tier weights.
    pub weights: TierWeights,
    /// Targets, in file order.
    pub targets: Vec<Target>,
    /// Kubernetes discovery of more targets, when configured.
    pub discovery: Option<KubernetesConfig>,
    /// Limits on what engines may send.
    pub ingest: IngestLimits,
    /// This replica's shard: it owns the targets that rendezvous hashing maps to it.
    pub shard: Shard,
    /// Routers' placements: their lifetime and how many are kept.
    pub speculative: SpeculativeOptions,
    /// High availability, when configured (it takes effect only with `redis:`).
    pub ha: Option<HaConfig>,
}

/// `ha:`: replicas with the same config (and shard) share a lease in Redis; its holder
/// alone writes Redis, the others keep their index and serve the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HaConfig {
    /// The lease's time to live: a dead leader is replaced about this long after it died.
    pub lease_ttl: Duration,
}

/// Limits on what engines may send, applied to every target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IngestLimits {
    /// Largest ZMQ frame accepted, bytes.
    pub max_frame_bytes: usize,
    /// Distinct models one source (target DP rank) may hold at once.
    pub max_models_per_source: usize,
    /// Whether the index computes kthena's std hashes and keeps their layer
    /// ([`crate::index::IndexOptions::std_layer`]).
    pub std_hashes: bool,
}

impl Default for IngestLimits {
    fn default() -> Self {
        IngestLimits {
            max_frame_bytes: crate::ingest::DEFAULT_MAX_FRAME_BYTES,
            max_models_per_source: crate::index::DEFAULT_MAX_MODELS_PER_SOURCE,
            std_hashes: true,
        }
    }
}

/// HTTP API settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiConfig {
    /// Listen address.
    pub listen: SocketAddr,
    /// Bearer token.
    pub token: Option<String>,
    /// Time to deliver a request head after accept or the previous response (so also the
    /// keep-alive idle timeout).
    pub header_read_timeout: Duration,
    /// Open connections at most (before the fd budget lowers it).
    pub max_connections: usize,
    /// Prompt blocks `prefix` scoring looks at, at most.
    pub max_blocks: usize,
    /// Prompt blocks `kthena` scoring looks at, at most.
    pub kthena_max_blocks: usize,
}

/// Default of `api.header_read_timeout_ms` (hyper's own default).
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Default of `api.max_connections`.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;

/// One problem in a config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigIssue {
    /// Dotted field path (`targets[1].endpoint`).
    pub field: String,
    /// 1-based line, when known.
    pub line: Option<u64>,
    /// What is wrong.
    pub what: String,
}

impl fmt::Display for ConfigIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{} (line {line}): {}", self.field, self.what),
            None => write!(f, "{}: {}", self.field, self.what),
        }
    }
}

/// Why a config could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {path}: {source}")]
    Io {
        /// Path.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// Not YAML of the expected shape (the parser's message names the line).
    #[error("config is not valid: {0}")]
    Syntax(String),
    /// Valid YAML, invalid values: every issue at once.
    #[error("config is not valid:\n{}", .0.iter().map(|i| format!("  - {i}")).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<ConfigIssue>),
}

/// Where environment overrides come from.
pub trait Env {
    /// The variable's value, if set.
    fn get(&self, name: &str) -> Option<String>;
}

/// The process environment.
#[derive(Debug, Default, Clone, Copy)]
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn get(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

/// No environment (tests, `from_str`).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoEnv;

impl Env for NoEnv {
    fn get(&self, _name: &str) -> Option<String> {
        None
    }
}

impl<S: std::hash::BuildHasher> Env for std::collections::HashMap<String, String, S> {
    fn get(&self, name: &str) -> Option<String> {
        std::collections::HashMap::get(self, name).cloned()
    }
}

impl Config {
    /// The index this config asks for: the ingest limits, and freed model names kept only
    /// for a mirror (only the mirror resolves a delta's model after the fact).
    pub fn index_options(&self) -> crate::index::IndexOptions {
        crate::index::IndexOptions {
            max_models_per_source: self.ingest.max_models_per_source,
            std_layer: self.ingest.std_hashes,
            freed_model_names: if self.redis.is_some() {
                crate::index::DEFAULT_FREED_MODEL_NAMES
            } else {
                0
            },
            speculative: self.speculative,
        }
    }

    /// Reads and validates a config file, with environment overrides.
    ///
    /// # Errors
    /// [`ConfigError`] naming every bad field.
    pub fn from_path(path: &Path, env: &impl Env) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Config::from_str_with_env(&text, env)
    }

    /// Parses and validates config text without environment overrides.
    ///
    /// # Errors
    /// [`ConfigError`] naming every bad field.
    #[allow(clippy::should_implement_trait)] // The ripgrep-style name the style guide asks for.
    pub fn from_str(text: &str) -> Result<Config, ConfigError> {
        Config::from_str_with_env(text, &NoEnv)
    }

    /// Parses and validates config text, then applies environment overrides.
    ///
    /// # Errors
    /// [`ConfigError`] naming every bad field.
    pub fn from_str_with_env(text: &str, env: &impl Env) -> Result<Config, ConfigError> {
        // An empty file is an empty config (no targets), not a syntax error.
        let raw: RawConfig = if text.trim().is_empty() {
            RawConfig::default()
        } else {
            serde_saphyr::from_str(text).map_err(|e| ConfigError::Syntax(e.to_string()))?
        };
        validate(raw, env)
    }
}

impl Config {
    /// The resolved config as JSON, for `check-config` (the API token shows only as `set`
    /// or `not set`, after the environment override).
    pub fn to_json(&self) -> serde_json::Value {
        let redis = self.redis.as_ref().map(|r| {
            serde_json::json!({
                "url": (!r.target.is_cluster()).then(|| r.target.shown()),
                "cluster_nodes": match &r.target {
                    RedisTarget::Cluster(urls) => Some(urls.iter().map(|u| crate::redis_layout::redact_url(u)).collect::<Vec<_>>()),
                    RedisTarget::Single(_) => None,
                },
                "value_format": r.value_format,
                "mapping_keys": r.mapping_keys,
                "flush_max_commands": r.flush_max_commands,
                "flush_interval_ms": r.flush_interval.as_millis() as u64,
                "queue_capacity": r.queue_capacity,
                "anti_entropy_interval_s": r.anti_entropy_interval.as_secs(),
                "anti_entropy_max_commands_per_s": r.anti_entropy_max_commands_per_s,
                "refresh_after_s": r.refresh_after_s,
            })
        });
        let api = self.api.as_ref().map(|a| {
            serde_json::json!({
                "listen": a.listen.to_string(),
                "token": if a.token.is_some() { "set" } else { "not set" },
                "header_read_timeout_ms": a.header_read_timeout.as_millis() as u64,
                "max_connections": a.max_connections,
                "max_blocks": a.max_blocks,
                "kthena_max_blocks": a.kthena_max_blocks,
            })
        });
        let weights: BTreeMap<&str, f64> = self.weights.entries().collect();
        serde_json::json!({
            "redis": redis,
            "api": api,
            "metrics": {"listen": self.metrics_listen.to_string()},
            "tier_weights": weights,
            "unknown_medium_weight": self.weights.unknown_medium_weight(),
            "targets": self.targets.iter().map(|t| serde_json::json!({
                "pod": t.pod,
                "namespace": t.namespace,
                "model": t.model,
                "engine": t.engine,
                "endpoints": (0..t.dp_ranks).filter_map(|r| t.endpoint.for_rank(r)).collect::<Vec<_>>(),
                "replay_endpoints": t.replay_endpoint.as_ref().map(|e| (0..t.dp_ranks).filter_map(|r| e.for_rank(r)).collect::<Vec<_>>()),
                "topic": t.topic,
                "dp_ranks": t.dp_ranks,
                "max_frame_bytes": t.max_frame_bytes.unwrap_or(self.ingest.max_frame_bytes),
                "shard": self.shard.owner_of(&t.pod_id()),
            })).collect::<Vec<_>>(),
            "discovery": {"kubernetes": self.discovery.as_ref().map(KubernetesConfig::to_json)},
            "ingest": {
                "max_frame_bytes": self.ingest.max_frame_bytes,
                "max_models_per_source": self.ingest.max_models_per_source,
                "std_hashes": self.ingest.std_hashes,
            },
            "speculative": {
                "ttl_ms": self.speculative.ttl.as_millis() as u64,
                "max_entries": self.speculative.max_entries,
            },
            "ha": self.ha.map(|h| serde_json::json!({
                "lease_ttl_ms": h.lease_ttl.as_millis() as u64,
                "effective": self.redis.is_some(),
            })),
            "shard": {
                "index": self.shard.index,
                "count": self.shard.count,
                "owned_targets": self.targets.iter().filter(|t| self.shard.owns(&t.pod_id())).count(),
            },
        })
    }
}

#[cfg(test)]
mod tests;

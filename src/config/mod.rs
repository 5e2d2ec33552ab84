//! The YAML config file: serde [`RawConfig`] (typos rejected) → validated [`Config`].
//!
//! Every problem is collected and reported at once, each naming the field and its line,
//! before anything is bound. Environment variables override the common fields
//! (`KVINDEX_REDIS_URL`, `KVINDEX_REDIS_VALUE_FORMAT`, `KVINDEX_API_LISTEN`,
//! `KVINDEX_API_TOKEN`, `KVINDEX_METRICS_LISTEN`, `KVINDEX_SHARD_INDEX`,
//! `KVINDEX_SHARD_COUNT`), read through [`Env`] so tests need no real environment.
//!
//! | file | job |
//! | --- | --- |
//! | `mod.rs` | loading ([`Config::from_path`]) and the resolved JSON `check-config` prints |
//! | `types.rs` | the validated [`Config`] and its sections, [`ConfigError`], [`Env`]: the bottom |
//! | `raw.rs` | the file as written ([`RawConfig`]) |
//! | `validate.rs` | [`validate()`]: raw → validated, section by section |
//! | `kubernetes.rs` | the `discovery.kubernetes` section as written, and its checks |
//!
//! The settings the sections resolve to (targets, the Redis mirror's, discovery's) are
//! vocabulary of the layers that run with them, defined below `config`: it imports none of
//! their code, and only the daemon and the commands import `config`.

use std::collections::BTreeMap;
use std::path::Path;

use crate::redis_conn::RedisTarget;
use crate::settings::kubernetes::KubernetesConfig;
/// Replica sharding, set by the `shard:` section.
pub use crate::shard::Shard;

pub mod kubernetes;
mod raw;
mod types;
mod validate;

pub use raw::{
    RawApi, RawConfig, RawHa, RawIngest, RawMetrics, RawRedis, RawShard, RawSpeculative, RawTarget,
};
pub use types::{
    ApiConfig, Config, ConfigError, ConfigIssue, Env, HaConfig, IngestLimits, NoEnv, ProcessEnv,
    DEFAULT_HEADER_READ_TIMEOUT, DEFAULT_MAX_CONNECTIONS,
};
pub use validate::validate;

impl Config {
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
                "connections": r.connections,
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

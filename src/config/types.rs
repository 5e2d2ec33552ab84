//! The validated config ([`Config`]) and its parts, the errors, and where environment
//! overrides come from ([`Env`]): the bottom of `config`, which every other file of it reads.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use crate::index::SpeculativeOptions;
use crate::medium::TierWeights;
use crate::settings::kubernetes::KubernetesConfig;
use crate::settings::redis::RedisConfig;
use crate::settings::target::{Target, DEFAULT_MAX_FRAME_BYTES};
use crate::shard::Shard;

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
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
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

/// Every problem found so far, in the order the file is read.
#[derive(Debug, Default)]
pub(super) struct Issues(pub(super) Vec<ConfigIssue>);

impl Issues {
    pub(super) fn add(
        &mut self,
        field: impl Into<String>,
        line: Option<u64>,
        what: impl Into<String>,
    ) {
        self.0.push(ConfigIssue {
            field: field.into(),
            line,
            what: what.into(),
        });
    }

    pub(super) fn count(&self) -> usize {
        self.0.len()
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
}

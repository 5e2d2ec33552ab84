//! The YAML config file: serde [`RawConfig`] (typos rejected) → validated [`Config`].
//!
//! Every problem is collected and reported at once, each naming the field and its line,
//! before anything is bound. Environment variables override the common fields
//! (`KVINDEX_REDIS_URL`, `KVINDEX_REDIS_VALUE_FORMAT`, `KVINDEX_API_LISTEN`,
//! `KVINDEX_API_TOKEN`, `KVINDEX_METRICS_LISTEN`, `KVINDEX_SHARD_INDEX`,
//! `KVINDEX_SHARD_COUNT`), read through [`Env`] so tests need no real environment.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use serde_saphyr::Spanned;

use crate::medium::{TierWeights, WeightError};
use crate::shard::{Shard, MAX_SHARDS};
use crate::store::redis::{RedisConfig, RedisTarget, ValueFormat};
use crate::wire::Engine;

pub use crate::ingest::{Target, TcpEndpoint, MAX_DP_RANKS};

pub mod kubernetes;

use kubernetes::{validate_kubernetes, KubernetesConfig, RawDiscovery};

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

/// Every problem found so far, in the order the file is read.
#[derive(Debug, Default)]
struct Issues(Vec<ConfigIssue>);

impl Issues {
    fn add(&mut self, field: impl Into<String>, line: Option<u64>, what: impl Into<String>) {
        self.0.push(ConfigIssue {
            field: field.into(),
            line,
            what: what.into(),
        });
    }

    fn count(&self) -> usize {
        self.0.len()
    }
}

/// The 1-based line a value was written on.
fn line_of<T>(spanned: &Spanned<T>) -> Option<u64> {
    Some(spanned.referenced.line())
}

/// A value from the environment (no line), else from the file (its line), else the default.
fn env_file_or<T: Clone>(
    env_value: Option<T>,
    file_value: Option<&Spanned<T>>,
    default: T,
) -> (T, Option<u64>) {
    match (env_value, file_value) {
        (Some(v), _) => (v, None),
        (None, Some(s)) => (s.value.clone(), line_of(s)),
        (None, None) => (default, None),
    }
}

fn parse_addr(
    field: &str,
    line: Option<u64>,
    text: &str,
    issues: &mut Issues,
) -> Option<SocketAddr> {
    let parsed = text.parse::<SocketAddr>().ok();
    if parsed.is_none() {
        issues.add(
            field,
            line,
            format!("`{text}` is not an ip:port listen address"),
        );
    }
    parsed
}

/// Turns a raw config into a validated one, collecting every issue.
///
/// # Errors
/// [`ConfigError::Invalid`] with all issues.
pub fn validate(raw: RawConfig, env: &impl Env) -> Result<Config, ConfigError> {
    let mut issues = Issues::default();
    // Checked even without an `api:` section: an empty token signals a broken deployment.
    if raw.api.is_none() && env.get(API_TOKEN_VAR).is_some_and(|t| t.trim().is_empty()) {
        validate_token(None, env, &mut issues);
    }
    let redis = validate_redis(raw.redis, env, &mut issues);
    let api = validate_api(raw.api, env, &mut issues);
    let metrics_listen = validate_metrics(raw.metrics, env, &mut issues);
    let weights = validate_weights(raw.tier_weights, raw.unknown_medium_weight, &mut issues);
    let targets = validate_targets(raw.targets, &mut issues);
    let discovery = raw
        .discovery
        .and_then(|d| d.kubernetes)
        .and_then(|k| validate_kubernetes(k, env, &mut issues));
    let ingest = validate_ingest(raw.ingest.unwrap_or_default(), redis.is_some(), &mut issues);
    let shard = validate_shard(raw.shard, env, redis.is_some(), &mut issues);
    if issues.0.is_empty() {
        Ok(Config {
            redis,
            api,
            metrics_listen,
            weights,
            targets,
            discovery,
            ingest,
            shard,
        })
    } else {
        Err(ConfigError::Invalid(issues.0))
    }
}

/// `redis:` (or `KVINDEX_REDIS_URL` alone): absent = no mirror.
fn validate_redis(
    section: Option<RawRedis>,
    env: &impl Env,
    issues: &mut Issues,
) -> Option<RedisConfig> {
    let env_url = env.get("KVINDEX_REDIS_URL");
    if section.is_none() && env_url.is_none() {
        return None;
    }
    let section = section.unwrap_or_default();
    let mut c = RedisConfig::default();
    if let Some(target) = validate_redis_target(&section, env_url, issues) {
        c.target = target;
    }
    if let Some(v) = section.value_format {
        c.value_format = v;
    }
    if let Some(v) = env_value_format(env, issues) {
        c.value_format = v;
    }
    if let Some(v) = section.mapping_keys {
        c.mapping_keys = v;
    }
    if let Some(v) = at_least_one(
        "redis.flush_max_commands",
        section.flush_max_commands,
        issues,
    ) {
        c.flush_max_commands = v;
    }
    // 0 would make the writer flush in a busy loop; it is refused, never rounded up.
    if let Some(v) = at_least_one("redis.flush_interval_ms", section.flush_interval_ms, issues) {
        c.flush_interval = Duration::from_millis(v);
    }
    if let Some(v) = at_least_one("redis.queue_capacity", section.queue_capacity, issues) {
        c.queue_capacity = v;
    }
    let upkeep = (
        section.anti_entropy_interval_s,
        section.anti_entropy_max_commands_per_s,
        section.refresh_after_s,
    );
    validate_upkeep(upkeep, &mut c, issues);
    Some(c)
}

/// `redis.url` (or `KVINDEX_REDIS_URL`) or `redis.cluster_nodes`, never both.
fn validate_redis_target(
    section: &RawRedis,
    env_url: Option<String>,
    issues: &mut Issues,
) -> Option<RedisTarget> {
    let is_url = |u: &str| u.starts_with("redis://") || u.starts_with("rediss://");
    let Some(nodes) = &section.cluster_nodes else {
        let default = RedisConfig::default().target.urls()[0].clone();
        let (url, line) = env_file_or(env_url, section.url.as_ref(), default);
        if !is_url(&url) {
            issues.add("redis.url", line, "must start with redis:// or rediss://");
        }
        return Some(RedisTarget::Single(url));
    };
    let line = line_of(nodes);
    if section.url.is_some() || env_url.is_some() {
        issues.add(
            "redis.cluster_nodes",
            line,
            "cannot be combined with redis.url (or KVINDEX_REDIS_URL): give one or the other",
        );
        return None;
    }
    if nodes.value.is_empty() {
        issues.add(
            "redis.cluster_nodes",
            line,
            "must list at least one node URL",
        );
        return None;
    }
    let mut ok = true;
    for (i, url) in nodes.value.iter().enumerate() {
        if !is_url(url) {
            let field = format!("redis.cluster_nodes[{i}]");
            issues.add(field, line, "must start with redis:// or rediss://");
            ok = false;
        }
    }
    ok.then(|| RedisTarget::Cluster(nodes.value.clone()))
}

/// `anti_entropy_interval_s`, `anti_entropy_max_commands_per_s`, `refresh_after_s`.
type UpkeepFields = (
    Option<Spanned<u64>>,
    Option<Spanned<u32>>,
    Option<Spanned<u32>>,
);

/// The background passes' settings: 0 would stop a pass (or spin it), and a refresh at or
/// past kthena's 24 h GC would come too late.
fn validate_upkeep(
    (interval, rate, refresh): UpkeepFields,
    c: &mut RedisConfig,
    issues: &mut Issues,
) {
    if let Some(v) = at_least_one("redis.anti_entropy_interval_s", interval, issues) {
        c.anti_entropy_interval = Duration::from_secs(v);
    }
    if let Some(v) = at_least_one("redis.anti_entropy_max_commands_per_s", rate, issues) {
        c.anti_entropy_max_commands_per_s = v;
    }
    if let Some(v) = at_least_one("redis.refresh_after_s", refresh.clone(), issues) {
        if u64::from(v) >= crate::redis_layout::MAPPING_TTL_SECS {
            let line = refresh.as_ref().and_then(line_of);
            issues.add(
                "redis.refresh_after_s",
                line,
                "must be below 86400 (kthena drops fields older than 24 h)",
            );
        } else {
            c.refresh_after_s = v;
        }
    }
}

/// `KVINDEX_REDIS_VALUE_FORMAT`, when set and valid.
fn env_value_format(env: &impl Env, issues: &mut Issues) -> Option<ValueFormat> {
    match env.get("KVINDEX_REDIS_VALUE_FORMAT")?.as_str() {
        "tiered" => Some(ValueFormat::Tiered),
        "timestamp" => Some(ValueFormat::Timestamp),
        other => {
            issues.add(
                "KVINDEX_REDIS_VALUE_FORMAT",
                None,
                format!("`{other}` is neither tiered nor timestamp"),
            );
            None
        }
    }
}

/// A count that must be at least 1: the value when it is, an issue when it is 0.
fn at_least_one<T: Copy + PartialEq + Default>(
    field: &str,
    value: Option<Spanned<T>>,
    issues: &mut Issues,
) -> Option<T> {
    let value = value?;
    if value.value == T::default() {
        issues.add(field, line_of(&value), "must be at least 1");
        return None;
    }
    Some(value.value)
}

/// `api:` (or `KVINDEX_API_LISTEN` alone): absent = not served.
fn validate_api(section: Option<RawApi>, env: &impl Env, issues: &mut Issues) -> Option<ApiConfig> {
    let env_listen = env.get("KVINDEX_API_LISTEN");
    if section.is_none() && env_listen.is_none() {
        return None;
    }
    let section = section.unwrap_or_default();
    let (text, line) = env_file_or(
        env_listen,
        section.listen.as_ref(),
        "127.0.0.1:8080".to_owned(),
    );
    let listen = parse_addr("api.listen", line, &text, issues)?;
    let token = validate_token(section.token, env, issues);
    let header_read_timeout = at_least_one(
        "api.header_read_timeout_ms",
        section.header_read_timeout_ms,
        issues,
    )
    .map_or(DEFAULT_HEADER_READ_TIMEOUT, Duration::from_millis);
    let max_connections = at_least_one("api.max_connections", section.max_connections, issues)
        .unwrap_or(DEFAULT_MAX_CONNECTIONS);
    Some(ApiConfig {
        listen,
        token,
        header_read_timeout,
        max_connections,
    })
}

/// The variable that overrides `shard.index`.
const SHARD_INDEX_VAR: &str = "KVINDEX_SHARD_INDEX";
/// The variable that overrides `shard.count`.
const SHARD_COUNT_VAR: &str = "KVINDEX_SHARD_COUNT";

/// `shard:` with its environment overrides: `count` in `1..=MAX_SHARDS`, `index < count`,
/// an explicit index whenever `count > 1` (a default of 0 on every replica would leave the
/// other shards' pods unowned), and Redis, which sharded replicas share.
fn validate_shard(
    section: Option<RawShard>,
    env: &impl Env,
    redis: bool,
    issues: &mut Issues,
) -> Shard {
    let section = section.unwrap_or_default();
    let count = ShardValue::read(SHARD_COUNT_VAR, "shard.count", section.count, env, issues);
    let index = ShardValue::read(SHARD_INDEX_VAR, "shard.index", section.index, env, issues);
    let (Some(count), Some(index)) = (count, index) else {
        return Shard::SINGLE;
    };
    let n = count.value.unwrap_or(1);
    if n == 0 || n > MAX_SHARDS {
        count.refuse(issues, format!("must lie in 1..={MAX_SHARDS}"));
        return Shard::SINGLE;
    }
    let i = match index.value {
        Some(i) => i,
        None if n > 1 => {
            let what = format!("is required when shard.count is {n} (or set {SHARD_INDEX_VAR})");
            index.refuse(issues, what);
            return Shard::SINGLE;
        }
        None => 0,
    };
    if i >= n {
        index.refuse(issues, format!("{i} must be below shard.count ({n})"));
        return Shard::SINGLE;
    }
    if n > 1 && !redis {
        let what = "more than one replica needs `redis:` (the replicas share it, and the API scores from it)";
        count.refuse(issues, what);
    }
    Shard { index: i, count: n }
}

/// One `shard:` number and where it was given (the variable, or the field and its line).
struct ShardValue {
    value: Option<u32>,
    field: String,
    line: Option<u64>,
}

impl ShardValue {
    /// The number from `var` (for the index also a pod name ending in `-N`, a StatefulSet
    /// ordinal), else from the file; `None` when the variable is not a number.
    fn read(
        var: &str,
        field: &str,
        file: Option<Spanned<u32>>,
        env: &impl Env,
        issues: &mut Issues,
    ) -> Option<ShardValue> {
        let Some(text) = env.get(var) else {
            return Some(ShardValue {
                value: file.as_ref().map(|s| s.value),
                field: field.to_owned(),
                line: file.as_ref().and_then(line_of),
            });
        };
        let text = text.trim();
        let ordinal = || {
            let (name, n) = text.rsplit_once('-')?;
            (!name.is_empty() && var == SHARD_INDEX_VAR)
                .then_some(n)?
                .parse()
                .ok()
        };
        let Some(value) = text.parse::<u32>().ok().or_else(ordinal) else {
            let what = if var == SHARD_INDEX_VAR {
                "is neither a number nor a pod name ending in -N (a StatefulSet ordinal)"
            } else {
                "is not a number"
            };
            issues.add(var, None, format!("`{text}` {what}; it overrides {field}"));
            return None;
        };
        Some(ShardValue {
            value: Some(value),
            field: var.to_owned(),
            line: None,
        })
    }

    fn refuse(&self, issues: &mut Issues, what: impl Into<String>) {
        issues.add(self.field.clone(), self.line, what);
    }
}

/// `ingest:`: every limit at least 1.
fn validate_ingest(section: RawIngest, redis: bool, issues: &mut Issues) -> IngestLimits {
    let mut limits = IngestLimits::default();
    if let Some(std_hashes) = section.std_hashes {
        if !std_hashes.value && redis {
            let what = "false needs no `redis:`: the mirror writes kthena's std hashes";
            issues.add("ingest.std_hashes", line_of(&std_hashes), what);
        }
        limits.std_hashes = std_hashes.value;
    }
    if let Some(v) = at_least_one("ingest.max_frame_bytes", section.max_frame_bytes, issues) {
        limits.max_frame_bytes = v;
    }
    let models = section.max_models_per_source;
    if let Some(v) = at_least_one("ingest.max_models_per_source", models, issues) {
        limits.max_models_per_source = v;
    }
    limits
}

/// The API token (the environment's over the file's). An empty one is an error, never
/// "auth off": `KVINDEX_API_TOKEN=` left in a manifest must not open the API.
fn validate_token(
    file: Option<Spanned<String>>,
    env: &impl Env,
    issues: &mut Issues,
) -> Option<String> {
    const EMPTY: &str = "is empty; remove it to serve the API without auth, or give a token";
    if let Some(token) = env.get(API_TOKEN_VAR) {
        if token.trim().is_empty() {
            issues.add(API_TOKEN_VAR, None, EMPTY);
            return None;
        }
        return Some(token);
    }
    let token = file?;
    if token.value.trim().is_empty() {
        issues.add("api.token", line_of(&token), EMPTY);
        return None;
    }
    Some(token.value)
}

/// The variable that overrides `api.token`.
const API_TOKEN_VAR: &str = "KVINDEX_API_TOKEN";

/// `metrics.listen`, defaulting to 127.0.0.1:9090.
fn validate_metrics(
    section: Option<RawMetrics>,
    env: &impl Env,
    issues: &mut Issues,
) -> SocketAddr {
    let default = SocketAddr::from(([127, 0, 0, 1], 9090));
    let file = section.and_then(|m| m.listen);
    let (text, line) = env_file_or(
        env.get("KVINDEX_METRICS_LISTEN"),
        file.as_ref(),
        default.to_string(),
    );
    parse_addr("metrics.listen", line, &text, issues).unwrap_or(default)
}

/// `tier_weights` and `unknown_medium_weight`, each in [0.0, 1.0].
fn validate_weights(
    configured: Option<BTreeMap<String, Spanned<f64>>>,
    unknown: Option<Spanned<f64>>,
    issues: &mut Issues,
) -> TierWeights {
    let configured = configured.unwrap_or_default();
    let unknown_value = unknown.as_ref().map_or(1.0, |s| s.value);
    let pairs = configured.iter().map(|(k, v)| (k.as_str(), v.value));
    let errors = match TierWeights::new(pairs, unknown_value) {
        Ok(weights) => return weights,
        Err(errors) => errors,
    };
    for e in errors {
        let (field, line) = match &e {
            WeightError::OutOfRange { tier, .. } if tier == "unknown_medium_weight" => (
                "unknown_medium_weight".to_owned(),
                unknown.as_ref().and_then(line_of),
            ),
            WeightError::OutOfRange { tier, .. } => (
                format!("tier_weights.{tier}"),
                configured.get(tier).and_then(line_of),
            ),
            WeightError::EmptyName => ("tier_weights".to_owned(), None),
        };
        issues.add(field, line, e.to_string());
    }
    TierWeights::default()
}

/// Every `targets:` entry; a pod identifier may appear once.
fn validate_targets(raw: Vec<Spanned<RawTarget>>, issues: &mut Issues) -> Vec<Target> {
    let mut targets = Vec::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for (i, spanned) in raw.into_iter().enumerate() {
        let line = line_of(&spanned);
        let before = issues.count();
        let target = validate_target(&TargetAt { index: i, line }, spanned.value, issues);
        let id = target.id();
        if let Some(first) = seen.insert(id.clone(), i) {
            issues.add(
                format!("targets[{i}].pod"),
                line,
                format!("`{id}` is already targets[{first}]"),
            );
        }
        if issues.count() == before {
            targets.extend(target.complete());
        }
    }
    targets
}

/// Where a target entry is: its index in `targets:` and its line.
struct TargetAt {
    index: usize,
    line: Option<u64>,
}

impl TargetAt {
    fn field(&self, name: &str) -> String {
        format!("targets[{}].{name}", self.index)
    }

    fn add(&self, issues: &mut Issues, name: &str, what: impl Into<String>) {
        issues.add(self.field(name), self.line, what);
    }
}

/// A target's fields after validation; `engine` and `endpoint` are `None` when invalid.
struct CheckedTarget {
    pod: String,
    namespace: String,
    model: String,
    engine: Option<Engine>,
    endpoint: Option<TcpEndpoint>,
    replay_endpoint: Option<TcpEndpoint>,
    topic: String,
    dp_ranks: u32,
    max_frame_bytes: Option<usize>,
}

impl CheckedTarget {
    fn id(&self) -> String {
        format!("{}.{}", self.pod, self.namespace)
    }

    fn complete(self) -> Option<Target> {
        Some(Target {
            engine: self.engine?,
            endpoint: self.endpoint?,
            pod: self.pod,
            namespace: self.namespace,
            model: self.model,
            replay_endpoint: self.replay_endpoint,
            topic: self.topic,
            dp_ranks: self.dp_ranks,
            max_frame_bytes: self.max_frame_bytes,
        })
    }
}

/// One target's fields, then what they must satisfy together (ports).
fn validate_target(at: &TargetAt, t: RawTarget, issues: &mut Issues) -> CheckedTarget {
    let pod = required(at, "pod", t.pod, issues);
    let namespace = t.namespace.unwrap_or_else(|| "default".to_owned());
    let model = required(at, "model", t.model, issues);
    let engine = match t.engine.as_deref().map(str::parse::<Engine>) {
        Some(Ok(e)) => Some(e),
        Some(Err(what)) => {
            at.add(issues, "engine", what);
            None
        }
        None => {
            at.add(issues, "engine", "is required (vllm, sglang or trtllm)");
            None
        }
    };
    let endpoint = match t.endpoint {
        Some(text) => parse_endpoint(at, "endpoint", &text, issues),
        None => {
            at.add(issues, "endpoint", "is required");
            None
        }
    };
    let replay_endpoint = t
        .replay_endpoint
        .and_then(|text| parse_endpoint(at, "replay_endpoint", &text, issues));
    let dp_ranks = t.dp_ranks.unwrap_or(1);
    if dp_ranks == 0 || dp_ranks > MAX_DP_RANKS {
        at.add(
            issues,
            "dp_ranks",
            format!("must lie in 1..={MAX_DP_RANKS}"),
        );
    }
    check_ports(
        at,
        endpoint.as_ref(),
        replay_endpoint.as_ref(),
        dp_ranks,
        issues,
    );
    if t.max_frame_bytes == Some(0) {
        at.add(issues, "max_frame_bytes", "must be at least 1");
    }
    CheckedTarget {
        pod,
        namespace,
        model,
        engine,
        endpoint,
        replay_endpoint,
        topic: t.topic.unwrap_or_default(),
        dp_ranks,
        max_frame_bytes: t.max_frame_bytes,
    }
}

/// A string field that must be present and non-empty.
fn required(at: &TargetAt, name: &str, value: Option<String>, issues: &mut Issues) -> String {
    let value = value.unwrap_or_default();
    if value.is_empty() {
        at.add(issues, name, "is required");
    }
    value
}

fn parse_endpoint(
    at: &TargetAt,
    name: &str,
    text: &str,
    issues: &mut Issues,
) -> Option<TcpEndpoint> {
    TcpEndpoint::parse(text)
        .map_err(|what| at.add(issues, name, what))
        .ok()
}

/// Rank r uses `endpoint` port + r and `replay_endpoint` port + r: both ranges must fit
/// under 65535 and, on one host, must not share a port (rank 1's PUB socket would be
/// rank 0's replay ROUTER).
fn check_ports(
    at: &TargetAt,
    endpoint: Option<&TcpEndpoint>,
    replay: Option<&TcpEndpoint>,
    dp_ranks: u32,
    issues: &mut Issues,
) {
    let last_rank = dp_ranks.saturating_sub(1);
    for (name, ep) in [("endpoint", endpoint), ("replay_endpoint", replay)] {
        if ep.is_some_and(|ep| ep.for_rank(last_rank).is_none()) {
            at.add(issues, name, "port + dp_ranks passes 65535");
        }
    }
    let (Some(endpoint), Some(replay)) = (endpoint, replay) else {
        return;
    };
    if !endpoint.host.eq_ignore_ascii_case(&replay.host) || dp_ranks == 0 {
        return;
    }
    let ports = |ep: &TcpEndpoint| u32::from(ep.port)..u32::from(ep.port) + dp_ranks;
    let (pub_ports, replay_ports) = (ports(endpoint), ports(replay));
    if pub_ports.start < replay_ports.end && replay_ports.start < pub_ports.end {
        at.add(
            issues,
            "replay_endpoint",
            format!(
                "ports {}..={} (one per DP rank) overlap the endpoint's ports {}..={}; \
                 rank r uses port + r on both, so space them at least dp_ranks apart",
                replay_ports.start,
                replay_ports.end - 1,
                pub_ports.start,
                pub_ports.end - 1
            ),
        );
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
            "shard": {
                "index": self.shard.index,
                "count": self.shard.count,
                "owned_targets": self.targets.iter().filter(|t| self.shard.owns(&t.pod_id())).count(),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ISSUE_SHAPE: &str = r#"
redis:
  url: redis://127.0.0.1:6379/0
  value_format: tiered          # or: timestamp
api:
  listen: 127.0.0.1:8080
metrics:
  listen: 127.0.0.1:9090
targets:
  - pod: vllm-0
    namespace: default
    model: meta-llama/Llama-3.1-8B-Instruct
    engine: vllm
    endpoint: tcp://vllm-0.vllm.default.svc:5557
    replay_endpoint: tcp://vllm-0.vllm.default.svc:5559   # optional; rank r: port + r
    topic: ""                                             # optional; "" = all
    dp_ranks: 2                                           # optional; default 1
"#;

    #[test]
    fn the_issue_shape_parses_as_written() {
        let c = Config::from_str(ISSUE_SHAPE).unwrap();
        let t = &c.targets[0];
        assert_eq!(t.pod_id(), "vllm-0.default");
        assert_eq!(t.dp_ranks, 2);
        assert_eq!(
            t.endpoint.for_rank(1).as_deref(),
            Some("tcp://vllm-0.vllm.default.svc:5558")
        );
        assert_eq!(c.redis.unwrap().value_format, ValueFormat::Tiered);
        assert_eq!(c.api.unwrap().listen.port(), 8080);
    }

    #[test]
    fn no_sections_means_embedded_defaults() {
        let c = Config::from_str("targets: []\n").unwrap();
        assert!(c.redis.is_none() && c.api.is_none());
        assert_eq!(c.metrics_listen.to_string(), "127.0.0.1:9090");
    }

    #[test]
    fn unknown_keys_are_rejected_with_their_line() {
        let err = Config::from_str("metrics:\n  listn: 1.2.3.4:5\n").unwrap_err();
        let text = err.to_string();
        assert!(text.contains("listn"), "{text}");
        assert!(text.contains('2'), "{text}");
    }

    #[test]
    fn every_issue_is_reported_at_once_with_lines() {
        let text = "tier_weights:\n  gpu: 1.5\ntargets:\n  - pod: a\n    model: m\n    engine: nope\n    endpoint: http://x\n  - pod: b\n    model: m\n    engine: vllm\n    endpoint: tcp://h:1\n    dp_ranks: 0\n";
        let ConfigError::Invalid(issues) = Config::from_str(text).unwrap_err() else {
            panic!("expected validation issues");
        };
        let fields: Vec<_> = issues.iter().map(|i| i.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "tier_weights.gpu",
                "targets[0].engine",
                "targets[0].endpoint",
                "targets[1].dp_ranks"
            ]
        );
        assert_eq!(issues[1].line, Some(4));
        assert_eq!(issues[3].line, Some(8));
    }

    #[test]
    fn a_targets_frame_cap_overrides_the_ingest_one_and_must_be_at_least_1() {
        let target = |cap: &str| {
            format!("ingest:\n  max_frame_bytes: 2048\ntargets:\n  - pod: a\n    model: m\n    engine: vllm\n    endpoint: tcp://h:1\n{cap}")
        };
        let config = Config::from_str(&target("    max_frame_bytes: 512\n")).unwrap();
        assert_eq!(config.targets[0].max_frame_bytes, Some(512));
        let shown = config.to_json();
        assert_eq!(shown["targets"][0]["max_frame_bytes"], 512, "{shown}");
        let inherited = Config::from_str(&target("")).unwrap();
        assert_eq!(inherited.targets[0].max_frame_bytes, None);
        assert_eq!(inherited.to_json()["targets"][0]["max_frame_bytes"], 2048);
        let ConfigError::Invalid(issues) =
            Config::from_str(&target("    max_frame_bytes: 0\n")).unwrap_err()
        else {
            panic!("expected validation issues");
        };
        assert_eq!(issues[0].field, "targets[0].max_frame_bytes");
        assert_eq!(issues[0].line, Some(4));
    }

    #[test]
    fn environment_overrides_the_file() {
        let env: std::collections::HashMap<String, String> = [
            (
                "KVINDEX_REDIS_URL".to_owned(),
                "redis://127.0.0.1:6380/2".to_owned(),
            ),
            (
                "KVINDEX_METRICS_LISTEN".to_owned(),
                "127.0.0.1:0".to_owned(),
            ),
        ]
        .into();
        let c = Config::from_str_with_env(ISSUE_SHAPE, &env).unwrap();
        assert_eq!(
            c.redis.unwrap().target,
            RedisTarget::Single("redis://127.0.0.1:6380/2".into())
        );
        assert_eq!(c.metrics_listen.port(), 0);
    }

    fn env(pairs: &[(&str, &str)]) -> std::collections::HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn an_empty_token_is_an_error_never_auth_off() {
        let file = "api:\n  token: secret\n";
        for empty in ["", "  "] {
            let vars = env(&[("KVINDEX_API_TOKEN", empty)]);
            let err = Config::from_str_with_env(file, &vars).unwrap_err();
            assert!(err.to_string().contains("KVINDEX_API_TOKEN"), "{err}");
            // Without an `api:` section too.
            let err = Config::from_str_with_env("", &vars).unwrap_err();
            assert!(err.to_string().contains("KVINDEX_API_TOKEN"), "{err}");
        }
        let err = Config::from_str("api:\n  token: ''\n").unwrap_err();
        assert!(err.to_string().contains("api.token (line 2)"), "{err}");
    }

    #[test]
    fn check_config_shows_whether_a_token_is_set_never_its_value() {
        let shown = |text: &str, vars: &[(&str, &str)]| {
            let c = Config::from_str_with_env(text, &env(vars)).unwrap();
            let json = c.to_json();
            assert!(!json.to_string().contains("secret"), "{json}");
            json["api"]["token"].as_str().unwrap().to_owned()
        };
        assert_eq!(shown("api: {}\n", &[]), "not set");
        assert_eq!(shown("api:\n  token: secret\n", &[]), "set");
        assert_eq!(
            shown("api: {}\n", &[("KVINDEX_API_TOKEN", "secret2")]),
            "set"
        );
    }

    #[test]
    fn shard_defaults_to_one_replica_and_shows_in_check_config() {
        let c = Config::from_str("targets: []\n").unwrap();
        assert_eq!(c.shard, Shard::SINGLE);
        let text = "redis: {}\nshard: {index: 2, count: 3}\ntargets:\n  - {pod: vllm-0, model: m, engine: vllm, endpoint: 'tcp://h:1'}\n";
        let c = Config::from_str(text).unwrap();
        assert_eq!(c.shard, Shard { index: 2, count: 3 });
        let json = c.to_json();
        assert_eq!(json["shard"]["index"], 2);
        assert_eq!(json["shard"]["count"], 3);
        // vllm-0.default belongs to shard 0 of 3 (golden value in shard.rs).
        assert_eq!(json["targets"][0]["shard"], 0);
        assert_eq!(json["shard"]["owned_targets"], 0);
    }

    #[test]
    fn bad_shard_settings_name_their_field() {
        let issue = |text: &str, vars: &[(&str, &str)]| {
            Config::from_str_with_env(text, &env(vars))
                .unwrap_err()
                .to_string()
        };
        let got = issue("redis: {}\nshard: {index: 3, count: 3}\n", &[]);
        assert!(
            got.contains("shard.index (line 2): 3 must be below shard.count (3)"),
            "{got}"
        );
        let got = issue("redis: {}\nshard:\n  count: 0\n", &[]);
        assert!(
            got.contains("shard.count (line 3): must lie in 1..=1024"),
            "{got}"
        );
        let got = issue("redis: {}\nshard: {count: 2}\n", &[]);
        assert!(
            got.contains("shard.index: is required when shard.count is 2"),
            "{got}"
        );
        let got = issue("shard: {index: 0, count: 2}\n", &[]);
        assert!(
            got.contains("shard.count (line 1): more than one replica needs `redis:`"),
            "{got}"
        );
        let got = issue("redis: {}\n", &[("KVINDEX_SHARD_COUNT", "three")]);
        assert!(
            got.contains("KVINDEX_SHARD_COUNT: `three` is not a number"),
            "{got}"
        );
        let got = issue(
            "redis: {}\nshard: {count: 4}\n",
            &[("KVINDEX_SHARD_INDEX", "4")],
        );
        assert!(
            got.contains("KVINDEX_SHARD_INDEX: 4 must be below shard.count (4)"),
            "{got}"
        );
        let got = issue(
            "redis: {}\nshard: {count: 4}\n",
            &[("KVINDEX_SHARD_INDEX", "kvindex-x")],
        );
        assert!(
            got.contains("KVINDEX_SHARD_INDEX: `kvindex-x` is neither a number"),
            "{got}"
        );
        let got = issue("redis: {}\nshard: {index: 0, count: 1, size: 2}\n", &[]);
        assert!(got.contains("size"), "{got}");
    }

    #[test]
    fn the_environment_sets_the_shard_and_takes_a_statefulset_pod_name() {
        let file = "redis: {}\nshard: {index: 0, count: 2}\n";
        let vars = env(&[
            ("KVINDEX_SHARD_INDEX", "kvindex-2"),
            ("KVINDEX_SHARD_COUNT", "3"),
        ]);
        let c = Config::from_str_with_env(file, &vars).unwrap();
        assert_eq!(c.shard, Shard { index: 2, count: 3 });
        let vars = env(&[("KVINDEX_SHARD_INDEX", "1"), ("KVINDEX_SHARD_COUNT", "2")]);
        let c = Config::from_str_with_env("redis: {}\n", &vars).unwrap();
        assert_eq!(c.shard, Shard { index: 1, count: 2 });
    }

    #[test]
    fn duplicate_pods_are_an_error() {
        let t = "  - {pod: a, model: m, engine: vllm, endpoint: 'tcp://h:1'}\n";
        let err = Config::from_str(&format!("targets:\n{t}{t}")).unwrap_err();
        assert!(err.to_string().contains("already targets[0]"), "{err}");
    }
}

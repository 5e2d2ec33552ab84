//! [`validate`]: a [`RawConfig`] checked section by section into a [`Config`], every
//! problem collected with its field and line, environment overrides applied.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use serde_saphyr::Spanned;

use super::kubernetes::validate_kubernetes;
use super::raw::{
    RawApi, RawConfig, RawHa, RawIngest, RawMetrics, RawRedis, RawShard, RawSpeculative, RawTarget,
};
use super::types::{
    ApiConfig, Config, ConfigError, Env, HaConfig, IngestLimits, Issues,
    DEFAULT_HEADER_READ_TIMEOUT, DEFAULT_MAX_CONNECTIONS,
};
use crate::index::SpeculativeOptions;
use crate::medium::{TierWeights, WeightError};
use crate::redis_conn::RedisTarget;
use crate::redis_layout::ValueFormat;
use crate::settings::redis::{
    RedisConfig, DEFAULT_LEASE_TTL, MAX_CONNECTIONS, MAX_LEASE_TTL, MIN_LEASE_TTL,
};
use crate::settings::target::{Target, TcpEndpoint, MAX_DP_RANKS};
use crate::shard::{Shard, MAX_SHARDS};
use crate::wire::Engine;

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
    let speculative = validate_speculative(raw.speculative.unwrap_or_default(), &mut issues);
    let ha = raw.ha.and_then(|h| validate_ha(h, &mut issues));
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
            speculative,
            ha,
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
    if let Some(v) = at_least_one("redis.connections", section.connections.clone(), issues) {
        if v > MAX_CONNECTIONS {
            let what = format!("must be at most {MAX_CONNECTIONS}");
            issues.add(
                "redis.connections",
                section.connections.as_ref().and_then(line_of),
                &what,
            );
        } else {
            c.connections = v;
        }
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

/// `ha:`: the lease's ttl within [`MIN_LEASE_TTL`] … [`MAX_LEASE_TTL`]. Without `redis:` it is
/// accepted and has no effect (the daemon says so at start): replicas are independent.
fn validate_ha(section: RawHa, issues: &mut Issues) -> Option<HaConfig> {
    let mut ha = HaConfig {
        lease_ttl: DEFAULT_LEASE_TTL,
    };
    if let Some(ttl) = section.lease_ttl_ms {
        let (min, max) = (MIN_LEASE_TTL.as_millis(), MAX_LEASE_TTL.as_millis());
        if !(min..=max).contains(&u128::from(ttl.value)) {
            let what = format!(
                "must lie in {min} … {max} ms (renewed every ttl/3; a dead leader is replaced after about ttl)"
            );
            issues.add("ha.lease_ttl_ms", line_of(&ttl), what);
            return None;
        }
        ha.lease_ttl = Duration::from_millis(ttl.value);
    }
    Some(ha)
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
    let max_blocks = blocks_cap("api.max_blocks", section.max_blocks, issues)
        .unwrap_or(crate::api::DEFAULT_PREFIX_MAX_BLOCKS);
    let kthena_max_blocks = blocks_cap("api.kthena_max_blocks", section.kthena_max_blocks, issues)
        .unwrap_or(crate::hash::DEFAULT_MAX_BLOCKS);
    Some(ApiConfig {
        listen,
        token,
        header_read_timeout,
        max_connections,
        max_blocks,
        kthena_max_blocks,
    })
}

/// Most prompt blocks a cap may allow: 16 M tokens at 16 per block.
const MAX_BLOCKS_CAP: usize = 1 << 20;

/// A cap on the prompt blocks scored: 1 to [`MAX_BLOCKS_CAP`].
fn blocks_cap(field: &str, value: Option<Spanned<usize>>, issues: &mut Issues) -> Option<usize> {
    let line = value.as_ref().and_then(line_of);
    let cap = at_least_one(field, value, issues)?;
    if cap > MAX_BLOCKS_CAP {
        issues.add(field, line, format!("must be at most {MAX_BLOCKS_CAP}"));
        return None;
    }
    Some(cap)
}

/// Longest `speculative.ttl_ms`: a placement lives for a prefill, not a session.
const MAX_SPECULATIVE_TTL_MS: u64 = 600_000;

/// `speculative:`: defaults when absent.
fn validate_speculative(section: RawSpeculative, issues: &mut Issues) -> SpeculativeOptions {
    let mut options = SpeculativeOptions::default();
    if let Some(ttl) = section.ttl_ms {
        if ttl.value > MAX_SPECULATIVE_TTL_MS {
            let what =
                format!("must be at most {MAX_SPECULATIVE_TTL_MS} (0 turns speculation off)");
            issues.add("speculative.ttl_ms", line_of(&ttl), what);
        } else {
            options.ttl = Duration::from_millis(ttl.value);
        }
    }
    let max = at_least_one("speculative.max_entries", section.max_entries, issues);
    if let Some(max) = max {
        options.max_entries = max;
    }
    options
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

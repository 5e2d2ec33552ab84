//! Prometheus metrics: one typed function per counter, labels from small fixed sets. A
//! layer's label enums live in that layer (ingest's reset and discovery reasons), which
//! passes their `&'static str` spelling here, so this module imports no layer above it.
//!
//! The recorder is installed once per process ([`install`]); before that every function is
//! a no-op, so library users and tests that do not install it pay nothing.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use parking_lot::Mutex;

use metrics::{counter, gauge, histogram, Counter, Histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::wire::{Engine, EventKind};

/// How a source restored from the checkpoint went on after a warm start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WarmStart {
    /// The first message followed the watermark: nothing was missed.
    Resumed,
    /// Seqs published while kvindex was down were filled by the engine's replay.
    Replayed,
    /// The gap could not be filled: the inherited blocks were dropped.
    Reset,
    /// The engine restarted while kvindex was down: the inherited blocks were dropped.
    Restarted,
}

impl WarmStart {
    /// Every outcome, in declaration order (the order of their counters).
    pub const ALL: [WarmStart; 4] = [
        WarmStart::Resumed,
        WarmStart::Replayed,
        WarmStart::Reset,
        WarmStart::Restarted,
    ];

    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            WarmStart::Resumed => "resumed",
            WarmStart::Replayed => "replayed",
            WarmStart::Reset => "reset",
            WarmStart::Restarted => "restarted",
        }
    }
}

/// The API latency histogram (rendered with buckets, so dashboards can take quantiles
/// across replicas and routes).
const API_DURATION: &str = "kvindex_api_request_duration_seconds";
/// Its buckets, in seconds: scoring answers in well under a millisecond, the timeout is 5 s.
const API_DURATION_BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 5.0,
];

/// How far a routed request's prediction was from the engine's reported reuse, in blocks.
const PREDICTION_ERROR: &str = "kvindex_route_prediction_error_blocks";
/// Its buckets: exact, off by a block or two, by a share of a long prompt.
const PREDICTION_ERROR_BUCKETS: [f64; 10] =
    [0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 64.0, 256.0, 1024.0, 8192.0];

/// The mirror's write latency histogram: from ingest handing deltas over to Redis answering.
const MIRROR_WRITE_LATENCY: &str = "kvindex_mirror_write_latency_seconds";
/// Its buckets, in seconds: a flush interval is 5 ms, a Redis response timeout 3 s.
const MIRROR_WRITE_LATENCY_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The HA lease's renewal latency histogram.
const HA_RENEW: &str = "kvindex_ha_lease_renew_seconds";
/// The time from a lease's end to the new leader's first write.
const HA_TAKEOVER: &str = "kvindex_ha_takeover_seconds";
/// Buckets of both, in seconds: a renewal is a round trip, a takeover about a poll.
const HA_BUCKETS: [f64; 13] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the global Prometheus recorder (once; later calls return the same handle).
/// `None` when another recorder was installed first.
pub fn install() -> Option<PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let handle = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full(API_DURATION.to_owned()),
                    &API_DURATION_BUCKETS,
                )
                .ok()?
                .set_buckets_for_metric(
                    Matcher::Full(MIRROR_WRITE_LATENCY.to_owned()),
                    &MIRROR_WRITE_LATENCY_BUCKETS,
                )
                .ok()?
                .set_buckets_for_metric(
                    Matcher::Full(PREDICTION_ERROR.to_owned()),
                    &PREDICTION_ERROR_BUCKETS,
                )
                .ok()?
                .set_buckets_for_metric(Matcher::Full(HA_RENEW.to_owned()), &HA_BUCKETS)
                .ok()?
                .set_buckets_for_metric(Matcher::Full(HA_TAKEOVER.to_owned()), &HA_BUCKETS)
                .ok()?
                .install_recorder()
                .ok()?;
            describe();
            Some(handle)
        })
        .clone()
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!("kvindex_messages_total", "ZMQ messages received.");
    describe_counter!("kvindex_batches_total", "Batches decoded.");
    describe_counter!(
        "kvindex_events_total",
        "Events decoded, by type and engine."
    );
    describe_counter!(
        "kvindex_decode_errors_total",
        "Messages rejected, by reason."
    );
    describe_counter!(
        "kvindex_invalid_events_total",
        "Events rejected alone, by reason."
    );
    describe_counter!("kvindex_unknown_tags_total", "Events with an unknown tag.");
    describe_counter!("kvindex_seq_gaps_total", "Seq gaps seen.");
    describe_counter!(
        "kvindex_duplicates_total",
        "Messages dropped as already applied."
    );
    describe_counter!("kvindex_replays_requested_total", "Replays requested.");
    describe_counter!(
        "kvindex_replays_succeeded_total",
        "Replays that filled their gap."
    );
    describe_counter!(
        "kvindex_replays_failed_total",
        "Replays that failed, by reason."
    );
    describe_counter!("kvindex_source_resets_total", "Sources reset, by reason.");
    describe_counter!(
        "kvindex_restarts_detected_total",
        "Engine restarts detected."
    );
    describe_counter!(
        "kvindex_connects_total",
        "Subscriber connections established."
    );
    describe_gauge!("kvindex_targets_connected", "DP-rank sockets connected.");
    describe_gauge!("kvindex_targets", "Running targets, by source.");
    describe_gauge!(
        "kvindex_shard_owned_targets",
        "Targets this replica owns and runs (rendezvous hashing of pod.namespace)."
    );
    describe_gauge!(
        "kvindex_shard_other_targets",
        "Known targets (config or discovery) that other replicas own."
    );
    describe_gauge!(
        "kvindex_shard_info",
        "1, labelled with this replica's shard index and the shard count."
    );
    describe_discovery();
    describe_counter!(
        "kvindex_reloads_refused_total",
        "Config reloads refused because the new file was invalid."
    );
    describe_gauge!(
        "kvindex_resident_blocks",
        "Resident (block, pod) entries per medium."
    );
    describe_gauge!(
        "kvindex_mirror_queue_depth",
        "Delta batches waiting for Redis."
    );
    describe_gauge!(
        "kvindex_mirror_dirty",
        "1 while Redis writes are pending a reconcile."
    );
    describe_gauge!("kvindex_mirror_reconciling", "1 while a reconcile runs.");
    describe_counter!(
        "kvindex_mirror_commands_total",
        "Redis commands the mirror has written."
    );
    describe_gauge!(
        "kvindex_mirror_flush_p99_seconds",
        "Redis flush latency p99."
    );
    describe_counter!(
        "kvindex_api_requests_total",
        "API requests answered, by route and status code."
    );
    describe_histogram!(API_DURATION, "API request latency, by route.");
    describe_mirror_upkeep();
    describe_routing();
    describe_histogram!(
        MIRROR_WRITE_LATENCY,
        "Time from ingest handing a message's deltas to the Redis mirror to Redis answering the pipeline that wrote them."
    );
    describe_histogram!(
        "kvindex_pipeline_seconds",
        "Time from receiving a message to its deltas being queued."
    );
}

/// Counter handles of one source, registered once so the hot path does no lookups.
#[derive(Clone)]
pub struct SourceMetrics {
    engine: &'static str,
    messages: Counter,
    batches: Counter,
    stored: Counter,
    removed: Counter,
    cleared: Counter,
    unknown_tags: Counter,
    seq_gaps: Counter,
    duplicates: Counter,
    restarts: Counter,
    connects: Counter,
    /// Per [`WarmStart`] outcome, registered up front so the series exist (at 0) from start.
    warm_starts: [Counter; 4],
    /// Registered at its first sample, so the series appears with the first message.
    pipeline: OnceLock<Histogram>,
}

impl SourceMetrics {
    /// Handles for a source of `engine`.
    pub fn new(engine: Engine) -> SourceMetrics {
        let e = engine.as_str();
        let ev = |kind: EventKind| counter!("kvindex_events_total", "engine" => e, "type" => kind.as_str());
        SourceMetrics {
            engine: e,
            messages: counter!("kvindex_messages_total", "engine" => e),
            batches: counter!("kvindex_batches_total", "engine" => e),
            stored: ev(EventKind::BlockStored),
            removed: ev(EventKind::BlockRemoved),
            cleared: ev(EventKind::AllBlocksCleared),
            unknown_tags: counter!("kvindex_unknown_tags_total", "engine" => e),
            seq_gaps: counter!("kvindex_seq_gaps_total", "engine" => e),
            duplicates: counter!("kvindex_duplicates_total", "engine" => e),
            restarts: counter!("kvindex_restarts_detected_total", "engine" => e),
            connects: counter!("kvindex_connects_total", "engine" => e),
            warm_starts: WarmStart::ALL.map(
                |o| counter!("kvindex_warm_starts_total", "engine" => e, "outcome" => o.as_str()),
            ),
            pipeline: OnceLock::new(),
        }
    }

    /// A message arrived.
    pub fn message(&self) {
        self.messages.increment(1);
    }

    /// A batch decoded, with its event counts.
    pub fn batch(&self, stored: u64, removed: u64, cleared: u64, unknown_tags: u64) {
        self.batches.increment(1);
        self.stored.increment(stored);
        self.removed.increment(removed);
        self.cleared.increment(cleared);
        self.unknown_tags.increment(unknown_tags);
    }

    /// A message was rejected (`reason` is a fixed wire label).
    pub fn decode_error(&self, reason: &'static str) {
        counter!("kvindex_decode_errors_total", "engine" => self.engine, "reason" => reason)
            .increment(1);
    }

    /// An event was rejected alone (`reason` is a fixed wire label).
    pub fn invalid_event(&self, reason: &'static str) {
        counter!("kvindex_invalid_events_total", "engine" => self.engine, "reason" => reason)
            .increment(1);
    }

    /// `n` events were dropped alone (`reason` is a fixed label, e.g. `too_many_models`).
    pub fn invalid_events(&self, reason: &'static str, n: u64) {
        counter!("kvindex_invalid_events_total", "engine" => self.engine, "reason" => reason)
            .increment(n);
    }

    /// A seq gap was seen.
    pub fn seq_gap(&self) {
        self.seq_gaps.increment(1);
    }

    /// A duplicate was dropped.
    pub fn duplicate(&self) {
        self.duplicates.increment(1);
    }

    /// An engine restart was detected.
    pub fn restart(&self) {
        self.restarts.increment(1);
    }

    /// The socket connected.
    pub fn connected(&self) {
        self.connects.increment(1);
        gauge!("kvindex_targets_connected").increment(1.0);
    }

    /// The socket disconnected (after having connected).
    pub fn disconnected(&self) {
        gauge!("kvindex_targets_connected").decrement(1.0);
    }

    /// A replay was requested.
    pub fn replay_requested(&self) {
        counter!("kvindex_replays_requested_total", "engine" => self.engine).increment(1);
    }

    /// A replay filled its gap.
    pub fn replay_succeeded(&self) {
        counter!("kvindex_replays_succeeded_total", "engine" => self.engine).increment(1);
    }

    /// A replay failed (`reason` is a fixed replay-error label).
    pub fn replay_failed(&self, reason: &'static str) {
        counter!("kvindex_replays_failed_total", "engine" => self.engine, "reason" => reason)
            .increment(1);
    }

    /// A source was reset (`reason` is a fixed ingest label).
    pub fn source_reset(&self, reason: &'static str) {
        counter!("kvindex_source_resets_total", "engine" => self.engine, "reason" => reason)
            .increment(1);
    }

    /// How a source restored from the checkpoint went on (`resumed`, `replayed`, `reset`,
    /// `restarted`).
    pub fn warm_start(&self, outcome: WarmStart) {
        self.warm_starts[outcome as usize].increment(1);
    }

    /// Time from receive to deltas queued.
    pub fn pipeline(&self, seconds: f64) {
        let histogram = self
            .pipeline
            .get_or_init(|| histogram!("kvindex_pipeline_seconds"));
        histogram.record(seconds);
    }
}

/// What the warm start rebuilt from the checkpoint: engine blocks and how long it took.
pub fn restored(engine_blocks: u64, took_ms: u64) {
    gauge!("kvindex_warm_start_engine_blocks").set(engine_blocks as f64);
    gauge!("kvindex_warm_start_seconds").set(took_ms as f64 / 1000.0);
}

/// The number of running targets from `source` (`static`, `kubernetes`).
pub fn targets(source: &'static str, n: usize) {
    gauge!("kvindex_targets", "source" => source).set(n as f64);
}

/// Targets this replica owns (runs) and targets other replicas own, and its shard.
pub fn shard_targets(shard: crate::shard::Shard, owned: usize, others: usize) {
    gauge!("kvindex_shard_owned_targets").set(owned as f64);
    gauge!("kvindex_shard_other_targets").set(others as f64);
    // Two small numbers fixed for the life of the process: a bounded label set.
    gauge!(
        "kvindex_shard_info",
        "index" => shard.index.to_string(),
        "count" => shard.count.to_string()
    )
    .set(1.0);
}

/// Per-target gauges, kept here rather than in the recorder: the recorder cannot delete one
/// series, and a forgotten target must vanish, not read as "just heard from".
static TARGETS: Mutex<BTreeMap<String, TargetGauges>> = Mutex::new(BTreeMap::new());

/// The gauges of one target.
#[derive(Debug, Clone, Copy)]
struct TargetGauges {
    source: &'static str,
    age: Option<f64>,
    ranks: Option<(u32, u32)>,
}

fn with_target(pod: &str, source: &'static str, f: impl FnOnce(&mut TargetGauges)) {
    let mut targets = TARGETS.lock();
    let gauges = targets.entry(pod.to_owned()).or_insert(TargetGauges {
        source,
        age: None,
        ranks: None,
    });
    gauges.source = source;
    f(gauges);
}

/// Seconds since the last message of target `pod` (label bounded by the target list).
pub fn last_message_age(pod: &str, source: &'static str, seconds: f64) {
    with_target(pod, source, |g| g.age = Some(seconds));
}

/// DP ranks of target `pod` connected now, out of its `dp_ranks`.
pub fn target_ranks(pod: &str, source: &'static str, connected: u32, dp_ranks: u32) {
    with_target(pod, source, |g| g.ranks = Some((connected, dp_ranks)));
}

/// Removes the per-target series of a removed target.
pub fn forget_target(pod: &str) {
    TARGETS.lock().remove(pod);
}

/// A config reload was refused (the new file was invalid; the running targets stay).
pub fn reload_refused() {
    counter!("kvindex_reloads_refused_total").increment(1);
}

/// The Prometheus text of every metric, the per-target gauges included.
pub fn render(handle: &PrometheusHandle) -> String {
    let mut text = handle.render();
    let targets = TARGETS.lock();
    type Pick = fn(&TargetGauges) -> Option<f64>;
    let families: [(&str, &str, Pick); 3] = [
        (
            "kvindex_last_message_age_seconds",
            "Seconds since the last message of a target.",
            |g| g.age,
        ),
        (
            "kvindex_target_ranks_connected",
            "DP ranks of a target connected now.",
            |g| g.ranks.map(|(c, _)| f64::from(c)),
        ),
        (
            "kvindex_target_dp_ranks",
            "DP ranks a target has (subscribed or trying to).",
            |g| g.ranks.map(|(_, n)| f64::from(n)),
        ),
    ];
    for (name, help, pick) in families {
        let series: Vec<(&String, &'static str, f64)> = targets
            .iter()
            .filter_map(|(pod, g)| pick(g).map(|v| (pod, g.source, v)))
            .collect();
        if series.is_empty() {
            continue;
        }
        text.push_str(&format!("# HELP {name} {help}\n# TYPE {name} gauge\n"));
        for (pod, source, value) in series {
            let pod = pod
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n");
            text.push_str(&format!(
                "{name}{{pod=\"{pod}\",source=\"{source}\"}} {value}\n"
            ));
        }
    }
    text
}

/// One API request answered: its route (a fixed path, or `other`), status and latency.
pub fn api_request(route: &'static str, status: u16, seconds: f64) {
    counter!("kvindex_api_requests_total", "route" => route, "status" => status.to_string())
        .increment(1);
    histogram!(API_DURATION, "route" => route).record(seconds);
}

fn describe_routing() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "kvindex_route_predictions_total",
        "Routed requests whose engine reported its reuse, by how the prediction compared: exact, over (a false hit), under."
    );
    describe_histogram!(
        PREDICTION_ERROR,
        "|predicted - reported| reused blocks of a routed request."
    );
    describe_counter!(
        "kvindex_route_feedback_unknown_total",
        "Feedback for a request id with no prediction (never routed with it, judged already, or expired)."
    );
    describe_gauge!(
        "kvindex_speculative_entries",
        "Routers' placements live now: chain blocks counted as held by a pod until its engine confirms them."
    );
    describe_counter!(
        "kvindex_speculative_total",
        "Speculative entries by what happened: placed, confirmed (by the engine's store), expired (TTL), dropped (remove, clear, restart, reset, removal), evicted (over max_entries)."
    );
}

/// A routed request's prediction judged against the engine's report: its outcome
/// (`exact`, `over`, `under`) and error in blocks.
pub fn route_prediction(outcome: &'static str, error_blocks: u64) {
    counter!("kvindex_route_predictions_total", "outcome" => outcome).increment(1);
    histogram!(PREDICTION_ERROR).record(error_blocks as f64);
}

/// Feedback for a request id with no prediction.
pub fn route_feedback_unknown() {
    counter!("kvindex_route_feedback_unknown_total").increment(1);
}

/// The speculative overlay's figures ([`crate::index::SpeculativeStats`]).
pub fn speculative(stats: &crate::index::SpeculativeStats) {
    gauge!("kvindex_speculative_entries").set(stats.live as f64);
    let events = [
        ("placed", stats.placed),
        ("confirmed", stats.confirmed),
        ("expired", stats.expired),
        ("dropped", stats.dropped),
        ("evicted", stats.evicted),
    ];
    for (event, n) in events {
        counter!("kvindex_speculative_total", "event" => event).absolute(n);
    }
}

/// Resident (block, pod) entries on `medium` (`""` = none reported).
pub fn resident_blocks(medium: &str, n: usize) {
    let medium = if medium.is_empty() { "none" } else { medium };
    gauge!("kvindex_resident_blocks", "medium" => medium.to_owned()).set(n as f64);
}

/// Ranks connected now (set from the target list; connects and disconnects move it between
/// refreshes).
pub fn targets_connected(n: usize) {
    gauge!("kvindex_targets_connected").set(n as f64);
}

/// Mirror figures.
pub fn mirror(queue_depth: usize, dirty: bool, reconciling: bool, flush_p99_us: u64) {
    gauge!("kvindex_mirror_queue_depth").set(queue_depth as f64);
    gauge!("kvindex_mirror_dirty").set(f64::from(u8::from(dirty)));
    gauge!("kvindex_mirror_reconciling").set(f64::from(u8::from(reconciling)));
    gauge!("kvindex_mirror_flush_p99_seconds").set(flush_p99_us as f64 / 1e6);
}

/// The mirror's write latency histogram, looked up once by the writer (seconds).
pub fn mirror_write_latency() -> metrics::Histogram {
    histogram!(MIRROR_WRITE_LATENCY)
}

/// Redis commands the mirror wrote in one successful pipeline.
pub fn mirror_commands(n: u64) {
    counter!("kvindex_mirror_commands_total").increment(n);
}

fn describe_mirror_upkeep() {
    use metrics::{describe_counter, describe_gauge};
    describe_counter!(
        "kvindex_mirror_adopted_removes_total",
        "Removes of engine hashes the index did not know, resolved through Redis's mapping keys."
    );
    describe_counter!(
        "kvindex_anti_entropy_repairs_total",
        "Anti-entropy repairs, by direction (deleted: Redis held what the index does not; written: Redis lacked or differed)."
    );
    describe_counter!(
        "kvindex_redis_resets_detected_total",
        "Redis restarts or flushes noticed by the mirror's watchdog, by kind."
    );
    describe_counter!(
        "kvindex_mirror_refreshes_total",
        "Fields rewritten with the current time before kthena's GC would drop them."
    );
    describe_gauge!(
        "kvindex_anti_entropy_pass_seconds",
        "Duration of the last completed anti-entropy pass (bounds a field's age past refresh_after_s)."
    );
}

/// Registers the mirror's upkeep series at 0, one per repair direction and reset kind (the
/// store's label values), so dashboards and alerts see them (and their rates) from the start
/// rather than from their first event.
pub fn mirror_upkeep_series(directions: &[&'static str], kinds: &[&'static str]) {
    mirror_adopted_removes(0);
    mirror_refreshes(0);
    for &d in directions {
        counter!("kvindex_anti_entropy_repairs_total", "direction" => d).increment(0);
    }
    for &k in kinds {
        counter!("kvindex_redis_resets_detected_total", "kind" => k).increment(0);
    }
}

/// Removes of unknown engine hashes the mirror resolved through Redis's mapping keys.
pub fn mirror_adopted_removes(n: u64) {
    counter!("kvindex_mirror_adopted_removes_total").increment(n);
}

/// One anti-entropy repair, labelled with its direction.
pub fn anti_entropy_repair(direction: &'static str) {
    counter!("kvindex_anti_entropy_repairs_total", "direction" => direction).increment(1);
}

/// The watchdog saw Redis lose kvindex's keys, labelled with what it saw.
pub fn redis_reset_detected(kind: &'static str) {
    counter!("kvindex_redis_resets_detected_total", "kind" => kind).increment(1);
}

/// Fields refreshed.
pub fn mirror_refreshes(n: u64) {
    counter!("kvindex_mirror_refreshes_total").increment(n);
}

/// A completed anti-entropy pass.
pub fn anti_entropy_pass(seconds: f64) {
    gauge!("kvindex_anti_entropy_pass_seconds").set(seconds);
}

fn describe_discovery() {
    use metrics::{describe_counter, describe_gauge};
    describe_counter!(
        "kvindex_discovery_pods_skipped_total",
        "Discovered pods skipped for an invalid or missing annotation, by annotation."
    );
    describe_gauge!(
        "kvindex_discovery_pods_skipped",
        "Discovered pods currently skipped."
    );
    describe_counter!(
        "kvindex_discovery_watch_errors_total",
        "Kubernetes list/watch errors, by reason (retried with backoff)."
    );
    describe_gauge!(
        "kvindex_discovery_healthy",
        "1 while the Kubernetes watch is synced and without error."
    );
    describe_counter!(
        "kvindex_discovery_identity_restarts_total",
        "Engine restarts detected from pod identity, by what changed."
    );
    describe_gauge!(
        "kvindex_discovery_conflicts",
        "Pods both in targets: and discovered (the static target wins)."
    );
}

/// A discovered pod was skipped (counted once per pod and reason change; `reason` is a
/// fixed discovery label, the annotation at fault).
pub fn discovery_pod_skipped(reason: &'static str) {
    counter!("kvindex_discovery_pods_skipped_total", "reason" => reason).increment(1);
}

/// Pods skipped right now.
pub fn discovery_pods_skipped(n: usize) {
    gauge!("kvindex_discovery_pods_skipped").set(n as f64);
}

/// A list or watch failed (`reason` is a fixed discovery label).
pub fn discovery_watch_error(reason: &'static str) {
    counter!("kvindex_discovery_watch_errors_total", "reason" => reason).increment(1);
}

/// Whether the watch is synced and without error.
pub fn discovery_healthy(healthy: bool) {
    gauge!("kvindex_discovery_healthy").set(f64::from(u8::from(healthy)));
}

/// An engine restart was detected from pod identity (`change` is a fixed discovery label).
pub fn discovery_identity_restart(change: &'static str) {
    counter!("kvindex_discovery_identity_restarts_total", "change" => change).increment(1);
}

/// Pods both static and discovered.
pub fn discovery_conflicts(n: usize) {
    gauge!("kvindex_discovery_conflicts").set(n as f64);
}

fn describe_ha() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_gauge!(
        "kvindex_ha_leader",
        "1 while this replica holds its shard's HA lease and writes Redis, else 0."
    );
    describe_counter!(
        "kvindex_ha_takeovers_total",
        "Times this replica took its shard's HA lease."
    );
    describe_histogram!(
        HA_RENEW,
        "Round trip of a successful HA lease renewal, seconds."
    );
    describe_counter!(
        "kvindex_ha_lease_renew_failures_total",
        "HA lease renewals that failed, timed out or found another holder."
    );
    describe_histogram!(
        HA_TAKEOVER,
        "From the previous HA lease's end to this replica's first write as the new leader, seconds."
    );
}

/// Whether this replica holds its shard's lease (the series exists only with `ha:`).
pub fn ha_leader(shard: u32, leader: bool) {
    describe_ha();
    gauge!("kvindex_ha_leader", "shard" => shard.to_string()).set(f64::from(u8::from(leader)));
    counter!("kvindex_ha_takeovers_total").increment(0);
    counter!("kvindex_ha_lease_renew_failures_total").increment(0);
}

/// This replica took the lease.
pub fn ha_takeover() {
    counter!("kvindex_ha_takeovers_total").increment(1);
}

/// A lease renewal succeeded after `seconds`.
pub fn ha_renew_latency(seconds: f64) {
    histogram!(HA_RENEW).record(seconds);
}

/// A lease renewal failed.
pub fn ha_renew_failed() {
    counter!("kvindex_ha_lease_renew_failures_total").increment(1);
}

/// The new leader's first write went out `seconds` after the previous lease ended.
pub fn ha_first_write(seconds: f64) {
    histogram!(HA_TAKEOVER).record(seconds);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forgotten_target_has_no_age_series() {
        // No recorder in unit tests: render from a handle of a recorder that is not global.
        let handle = PrometheusBuilder::new().build_recorder().handle();
        last_message_age("gone.ns", "static", 3.5);
        last_message_age("kept.ns", "kubernetes", 1.0);
        let text = render(&handle);
        let gone = "kvindex_last_message_age_seconds{pod=\"gone.ns\",source=\"static\"} 3.5";
        assert!(text.contains(gone), "{text}");
        forget_target("gone.ns");
        let text = render(&handle);
        assert!(!text.contains("gone.ns"), "{text}");
        let kept = "kvindex_last_message_age_seconds{pod=\"kept.ns\",source=\"kubernetes\"} 1";
        assert!(text.contains(kept), "{text}");
        forget_target("kept.ns");
    }
}

//! The writer task: coalesces deltas per flush, one pipeline per flush, and outage handling
//! (dirty mode, capped backoff, reconcile on reconnect).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::anti_entropy::{Entropy, EntropySettings, EntropyStats};
use super::checkpoint::{
    engine_field, engine_value, source_field, state_key, Watermark, WATERMARKS_KEY,
};
use super::{MirrorError, RedisConfig};
use crate::index::{Checkpoint, Delta, EngineState, Index, ModelId, PodId, SourceId};
use crate::medium::TierWeights;
use crate::redis_conn::{ClusterConn, ClusterSettings, RedisConn, RedisTarget};
use crate::redis_layout::{block_key, field_value, mapping_key, mapping_value, MAPPING_TTL_SECS};
use crate::wire::{BlockHash, Engine};

/// First retry after a failure; doubles up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(50);
/// Retry interval cap while Redis stays down.
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// A command that takes longer than this counts as a failed write.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(3);
/// A connection attempt that takes longer than this counts as Redis being down.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Retries of one cluster request by the client: enough to follow a `MOVED` and an `ASK`,
/// few enough that a dead master makes the mirror dirty at once (ingest goes on, and the
/// reconcile after the failover rewrites what failed) rather than stalling the writer while
/// a replica is promoted.
const CLUSTER_RETRIES: u32 = 3;
/// Flush latencies kept for the percentiles.
const LATENCY_SAMPLES: usize = 4096;

/// What ingest and the handle send to the writer, in one ordered queue.
#[derive(Debug)]
pub(super) enum Msg {
    /// Deltas of one applied message, and the checkpoint of its source that covers them.
    Deltas(Vec<Delta>, Option<Checkpoint>),
    /// Answer once everything queued before is in Redis.
    Flush(oneshot::Sender<()>),
    /// Write what is queued, answer, and stop.
    Shutdown(oneshot::Sender<()>),
}

/// Which Redis field or key a [`Delta`] writes: the coalescing key of one flush and the
/// record of writes that may not have landed. The wanted state is the [`Delta`] itself, so a
/// key kind and a state kind can never be paired wrongly.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum Key {
    /// Field `pod` of block key `(model, std)`.
    Field {
        /// Model.
        model: ModelId,
        /// Standardized hash.
        std: u64,
        /// Pod.
        pod: PodId,
    },
    /// Mapping key of `pod`'s engine hash.
    Mapping {
        /// Pod.
        pod: PodId,
        /// Engine (key prefix).
        engine: Engine,
        /// Engine hash.
        hash: BlockHash,
    },
    /// Checkpoint entry of one engine block of source `(pod, rank)`.
    Engine {
        /// Pod.
        pod: PodId,
        /// DP rank.
        rank: u8,
        /// Model.
        model: ModelId,
        /// Engine hash.
        hash: BlockHash,
    },
    /// The checkpoint of source `(pod, rank)` as a whole (written only to delete it).
    Source {
        /// Pod.
        pod: PodId,
        /// DP rank.
        rank: u8,
    },
}

impl Key {
    /// The key `delta` writes.
    pub(super) fn of(delta: &Delta) -> Key {
        match delta {
            Delta::Field {
                model,
                std_hash,
                pod,
                ..
            } => Key::Field {
                model: *model,
                std: *std_hash,
                pod: *pod,
            },
            Delta::Mapping {
                pod,
                engine,
                engine_hash,
                ..
            }
            | Delta::UnknownRemove {
                pod,
                engine,
                engine_hash,
                ..
            } => Key::Mapping {
                pod: *pod,
                engine: *engine,
                hash: engine_hash.clone(),
            },
            Delta::Engine {
                pod,
                rank,
                model,
                engine_hash,
                ..
            } => Key::Engine {
                pod: *pod,
                rank: *rank,
                model: *model,
                hash: engine_hash.clone(),
            },
            Delta::SourceGone { pod, rank } => Key::Source {
                pod: *pod,
                rank: *rank,
            },
        }
    }

    /// The write that deletes this key (HDEL of the field, DEL of the mapping key).
    pub(super) fn deletion(self) -> Delta {
        match self {
            Key::Field { model, std, pod } => Delta::Field {
                model,
                std_hash: std,
                pod,
                value: None,
            },
            Key::Mapping { pod, engine, hash } => Delta::Mapping {
                pod,
                engine,
                engine_hash: hash,
                std_hash: None,
            },
            Key::Engine {
                pod,
                rank,
                model,
                hash,
            } => Delta::Engine {
                pod,
                rank,
                model,
                engine_hash: hash,
                state: None,
            },
            Key::Source { pod, rank } => Delta::SourceGone { pod, rank },
        }
    }
}

/// State shared between the writer and the handle.
#[derive(Debug, Default)]
pub(super) struct Shared {
    pub(super) commands: AtomicU64,
    pub(super) pipelines: AtomicU64,
    pub(super) reconciles: AtomicU64,
    pub(super) healthy: AtomicBool,
    pub(super) dirty: AtomicBool,
    pub(super) reconciling: AtomicBool,
    /// Counters of the background passes and adopted removes.
    pub(super) entropy: EntropyStats,
    latencies: Mutex<Latencies>,
}

#[derive(Debug, Default)]
struct Latencies {
    ring: Vec<u32>,
    next: usize,
}

impl Shared {
    fn record_latency(&self, took: Duration) {
        let us = u32::try_from(took.as_micros()).unwrap_or(u32::MAX);
        let mut l = self.latencies.lock();
        if l.ring.len() < LATENCY_SAMPLES {
            l.ring.push(us);
        } else {
            let i = l.next;
            l.ring[i] = us;
        }
        l.next = (l.next + 1) % LATENCY_SAMPLES;
    }

    /// p50 and p99 of the recent flush latencies, microseconds.
    pub(super) fn latency_percentiles(&self) -> (u64, u64) {
        let mut v = self.latencies.lock().ring.clone();
        if v.is_empty() {
            return (0, 0);
        }
        v.sort_unstable();
        let at = |q: f64| u64::from(v[((v.len() - 1) as f64 * q).round() as usize]);
        (at(0.50), at(0.99))
    }
}

/// Opens a managed connection (or a cluster connection) and checks it with a PING, so a bad
/// URL, refused connection or failed auth is a start-up error.
///
/// # Errors
/// [`MirrorError`] naming the URL without its password.
pub(super) async fn connect(target: &RedisTarget) -> Result<RedisConn, MirrorError> {
    let shown = target.shown();
    let scrub = |e: &redis::RedisError| target.scrub(&e.to_string());
    let classify = |e: redis::RedisError| {
        let reason = scrub(&e);
        if is_auth_error(&e) {
            MirrorError::Auth {
                url: shown.clone(),
                reason,
            }
        } else if e.kind() == redis::ErrorKind::InvalidClientConfig {
            MirrorError::BadUrl {
                url: shown.clone(),
                reason,
            }
        } else {
            MirrorError::Connect {
                url: shown.clone(),
                reason,
            }
        }
    };
    let mut conn = match target {
        RedisTarget::Single(url) => {
            let client = redis::Client::open(url.as_str()).map_err(|e| MirrorError::BadUrl {
                url: shown.clone(),
                reason: scrub(&e),
            })?;
            // No push sender: it needs RESP3, and kthena's Redis may speak only RESP2. A
            // dropped connection shows up as a failed command instead, which makes the
            // mirror dirty.
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(CONNECT_TIMEOUT))
                .set_response_timeout(Some(RESPONSE_TIMEOUT))
                .set_number_of_retries(1)
                .set_max_delay(MAX_BACKOFF);
            let manager = ConnectionManager::new_with_config(client, config)
                .await
                .map_err(classify)?;
            RedisConn::Single(manager)
        }
        RedisTarget::Cluster(urls) => {
            let settings = ClusterSettings {
                connect_timeout: CONNECT_TIMEOUT,
                response_timeout: RESPONSE_TIMEOUT,
                retries: CLUSTER_RETRIES,
                commit_key: Some(WATERMARKS_KEY.to_owned()),
            };
            RedisConn::Cluster(
                ClusterConn::connect(urls, settings)
                    .await
                    .map_err(classify)?,
            )
        }
    };
    redis::cmd("PING")
        .query_async::<()>(&mut conn)
        .await
        .map_err(classify)?;
    Ok(conn)
}

/// Whether Redis refused the credentials (or wants some and got none).
pub(super) fn is_auth_error(e: &redis::RedisError) -> bool {
    let text = e.to_string().to_ascii_uppercase();
    e.kind() == redis::ErrorKind::AuthenticationFailed
        || text.contains("WRONGPASS")
        || text.contains("NOAUTH")
        || text.contains("INVALID PASSWORD")
        || text.contains("INVALID USERNAME")
}

/// The writer task's state.
pub(super) struct Writer {
    pub(super) config: RedisConfig,
    pub(super) index: Index,
    pub(super) weights: TierWeights,
    pub(super) conn: RedisConn,
    pub(super) shared: Arc<Shared>,
    /// Wanted state per key since the last flush (coalescing: the last delta wins).
    pub(super) pending: HashMap<Key, Delta>,
    /// How many of `pending` are checkpoint entries: they become one command per state key,
    /// so they do not count towards `flush_max_commands`.
    pub(super) pending_entries: usize,
    /// Keys whose last write may not have reached Redis (failed pipeline or dropped while
    /// dirty): the record the reconcile checks for fields that must be deleted.
    pub(super) touched: HashSet<Key>,
    pub(super) dirty: bool,
    backoff: Duration,
    retry_at: Instant,
    pub(super) flush_at: Instant,
    waiters: Vec<oneshot::Sender<()>>,
    pub(super) names: Names,
    /// The checkpoint's watermarks: every live source's latest, and which are not written yet.
    pub(super) marks: Marks,
    /// Background passes (reconcile, anti-entropy, refresh), the watchdog, adopted removes.
    pub(super) entropy: Entropy,
}

/// Watermarks of the sources the mirror checkpoints. Only the seq is recorded per message;
/// the rest of a watermark entry (names, models, engine run) is read when it is written, once
/// per flush, so a 1-block message costs one map update here.
#[derive(Default)]
pub(super) struct Marks {
    /// Per source `(pod, rank)`: its id and the latest seq handed over.
    pub(super) latest: HashMap<(PodId, u8), (SourceId, u64)>,
    /// Sources whose latest watermark is not in Redis yet.
    pub(super) unwritten: HashSet<(PodId, u8)>,
    /// Model ids per source, so a watermark lists every state key of its source.
    models: HashMap<(PodId, u8), BTreeSet<ModelId>>,
    /// Source ids resolved to `(pod, rank)` (ids are never reused).
    sources: HashMap<SourceId, Option<(PodId, u8)>>,
}

/// Caches of interned names (they never change once interned).
#[derive(Default)]
pub(super) struct Names {
    models: Vec<Option<Arc<str>>>,
    pods: Vec<Option<Arc<str>>>,
}

impl Names {
    pub(super) fn model(&mut self, index: &Index, id: ModelId) -> Arc<str> {
        cached(&mut self.models, id.0, || index.model_name(id))
    }
    pub(super) fn pod(&mut self, index: &Index, id: PodId) -> Arc<str> {
        cached(&mut self.pods, id.0, || index.pod_name(id))
    }
}

fn cached(cache: &mut Vec<Option<Arc<str>>>, id: u32, load: impl FnOnce() -> Arc<str>) -> Arc<str> {
    let i = id as usize;
    if cache.len() <= i {
        cache.resize(i + 1, None);
    }
    cache[i].get_or_insert_with(load).clone()
}

impl Writer {
    /// A writer that starts dirty, so its first act is a reconcile with the index.
    pub(super) fn new(
        config: RedisConfig,
        index: Index,
        weights: TierWeights,
        conn: RedisConn,
        shared: Arc<Shared>,
    ) -> Writer {
        shared.healthy.store(true, Ordering::Relaxed);
        shared.dirty.store(true, Ordering::Relaxed);
        let now = Instant::now();
        let entropy = Entropy::new(EntropySettings {
            interval: config.anti_entropy_interval,
            max_commands_per_s: config.anti_entropy_max_commands_per_s,
            refresh_after_s: config.refresh_after_s,
        });
        Writer {
            config,
            index,
            weights,
            conn,
            shared,
            pending: HashMap::new(),
            pending_entries: 0,
            touched: HashSet::new(),
            dirty: true,
            backoff: MIN_BACKOFF,
            retry_at: now,
            flush_at: now,
            waiters: Vec::new(),
            names: Names::default(),
            marks: Marks::default(),
            entropy,
        }
    }

    /// Seeds the watermarks a warm start restored, so later ones keep their model lists and a
    /// reconcile writes them back.
    pub(super) fn seed_marks(&mut self, restored: Vec<(SourceId, Watermark)>) {
        for (source, mark) in restored {
            let Some(key) = self.resolve_source(source) else {
                continue;
            };
            let models = self.marks.models.entry(key).or_default();
            for name in &mark.models {
                if let Some(id) = self.index.model_id(name) {
                    models.insert(id);
                }
            }
            self.marks.latest.insert(key, (source, mark.seq));
        }
    }

    fn resolve_source(&mut self, source: SourceId) -> Option<(PodId, u8)> {
        let index = &self.index;
        *self.marks.sources.entry(source).or_insert_with(|| {
            let spec = index.source_spec(source)?;
            Some((index.pod_id(&spec.pod)?, spec.dp_rank))
        })
    }

    /// Records a source's checkpoint: its watermark is written after the data it covers.
    fn absorb_checkpoint(&mut self, checkpoint: Checkpoint) {
        let Some(key) = self.resolve_source(checkpoint.source) else {
            return;
        };
        self.marks
            .latest
            .insert(key, (checkpoint.source, checkpoint.seq));
        self.marks.unwritten.insert(key);
    }

    /// The watermark entry of source `key` as it stands now, `None` once it is unregistered.
    fn watermark(&mut self, key: (PodId, u8)) -> Option<Watermark> {
        let (source, seq) = *self.marks.latest.get(&key)?;
        let spec = self.index.source_spec(source)?;
        let models = self.marks.models.entry(key).or_default();
        if let Some(base) = self.index.model_id(&spec.model) {
            models.insert(base);
        }
        let models = models
            .iter()
            .map(|m| self.names.model(&self.index, *m).to_string())
            .collect();
        Some(Watermark {
            seq,
            engine: spec.engine,
            model: spec.model,
            models,
            run: self.index.source_run(source),
        })
    }

    pub(super) fn index(&self) -> &Index {
        &self.index
    }

    pub(super) fn config(&self) -> &RedisConfig {
        &self.config
    }

    /// The task body: runs until shutdown or until every sender is gone.
    pub(super) async fn run(mut self, mut rx: mpsc::Receiver<Msg>) {
        loop {
            let wake = if self.dirty {
                Some(self.retry_at)
            } else if !self.has_pending() {
                None
            } else {
                Some(self.flush_at)
            };
            tokio::select! {
                biased;
                () = sleep_until(wake) => {
                    if self.dirty {
                        self.try_reconcile().await;
                    } else {
                        self.flush_all().await;
                    }
                }
                () = sleep_until(self.entropy_wake()) => self.entropy_tick().await,
                msg = rx.recv() => match msg {
                    Some(Msg::Deltas(deltas, checkpoint)) => {
                        self.absorb(deltas, checkpoint);
                        let commands = self.pending.len() - self.pending_entries;
                        if !self.dirty && commands >= self.config.flush_max_commands {
                            self.flush_now().await;
                        }
                    }
                    Some(Msg::Flush(done)) => {
                        self.waiters.push(done);
                        if !self.dirty {
                            self.flush_all().await;
                        }
                        self.answer_waiters();
                    }
                    Some(Msg::Shutdown(done)) => {
                        self.waiters.push(done);
                        self.drain_before_exit().await;
                        return;
                    }
                    None => {
                        self.drain_before_exit().await;
                        return;
                    }
                },
            }
        }
    }

    /// Writes what is pending, retrying through an outage (the caller bounds the wait).
    async fn drain_before_exit(&mut self) {
        loop {
            if self.dirty {
                tokio::time::sleep_until(self.retry_at).await;
                self.try_reconcile().await;
            } else {
                self.flush_all().await;
                self.finish_rewrite().await;
                if !self.dirty {
                    break;
                }
            }
        }
        self.answer_waiters();
    }

    fn absorb(&mut self, deltas: Vec<Delta>, checkpoint: Option<Checkpoint>) {
        for delta in deltas {
            if matches!(delta, Delta::UnknownRemove { .. }) {
                self.queue_adopt(delta);
                continue;
            }
            let wanted = match &delta {
                Delta::Mapping { .. } => self.config.mapping_keys,
                Delta::Engine { .. } => self.config.checkpoint,
                Delta::SourceGone { pod, rank } => {
                    self.marks.unwritten.remove(&(*pod, *rank));
                    self.marks.latest.remove(&(*pod, *rank));
                    self.marks.models.remove(&(*pod, *rank));
                    self.config.checkpoint
                }
                Delta::Field { .. } | Delta::UnknownRemove { .. } => true,
            };
            if !wanted {
                continue;
            }
            let key = Key::of(&delta);
            if self.dirty {
                // Not written now: the reconcile writes the index's state of this key.
                self.touched.insert(key);
            } else {
                if self.pending.is_empty() {
                    self.flush_at = Instant::now() + self.config.flush_interval;
                }
                let entry = matches!(key, Key::Engine { .. });
                if self.pending.insert(key, delta).is_none() && entry {
                    self.pending_entries += 1;
                }
            }
        }
        if let (Some(checkpoint), true) = (checkpoint, self.config.checkpoint) {
            self.absorb_checkpoint(checkpoint);
            if !self.dirty && self.pending.is_empty() {
                self.flush_at = Instant::now() + self.config.flush_interval;
            }
        }
        self.cap_touched();
    }

    pub(super) fn answer_waiters(&mut self) {
        if !self.dirty && !self.has_pending() && !self.entropy.rewriting() {
            for done in self.waiters.drain(..) {
                let _ = done.send(());
            }
        }
    }

    /// Appends the command that brings Redis to `delta`'s key's current state to `pipe`. The
    /// value is read from the index now, not taken from the delta: DP ranks of one pod queue
    /// their deltas independently, so only the index knows the pod's latest value, and a
    /// mapping key is kept while any rank of the pod still holds its engine hash.
    pub(super) fn push_command(&mut self, pipe: &mut redis::Pipeline, delta: &Delta) {
        match delta {
            Delta::Field {
                model,
                std_hash,
                pod,
                ..
            } => {
                let bk = block_key(&self.names.model(&self.index, *model), *std_hash);
                let field = self.names.pod(&self.index, *pod);
                match self.index.field_value(*model, *std_hash, *pod) {
                    Some(v) => {
                        let v = field_value(v, self.config.value_format, &self.weights);
                        pipe.hset(bk, &*field, v).ignore();
                    }
                    None => {
                        pipe.hdel(bk, &*field).ignore();
                    }
                }
            }
            Delta::Mapping {
                pod,
                engine,
                engine_hash,
                std_hash,
            } => {
                let mk = mapping_key(*engine, &self.names.pod(&self.index, *pod), engine_hash);
                let std = std_hash.or_else(|| self.index.pod_engine_std(*pod, engine_hash));
                match std {
                    Some(std) => {
                        pipe.set_ex(mk, mapping_value(std), MAPPING_TTL_SECS)
                            .ignore();
                    }
                    None => {
                        pipe.del(mk).ignore();
                    }
                }
            }
            Delta::Engine { .. } | Delta::SourceGone { .. } => {
                self.push_commands(pipe, std::iter::once(delta));
            }
            // Resolved through Redis by the adoption step, never written as such.
            Delta::UnknownRemove { .. } => {}
        }
    }

    /// Appends the commands for `deltas` in the order that keeps the checkpoint behind the
    /// data: kthena's fields and mapping keys first, then checkpoint entries grouped into one
    /// `HSET`/`HDEL` per state key, then the watermarks of unregistered sources deleted.
    /// Returns the number of commands.
    pub(super) fn push_commands<'d>(
        &mut self,
        pipe: &mut redis::Pipeline,
        deltas: impl IntoIterator<Item = &'d Delta>,
    ) -> usize {
        let mut commands = 0;
        let mut states: BTreeMap<(PodId, u8, ModelId), StateOps> = BTreeMap::new();
        let mut gone: Vec<String> = Vec::new();
        for delta in deltas {
            match delta {
                Delta::Engine {
                    pod,
                    rank,
                    model,
                    engine_hash,
                    state,
                } => {
                    let ops = states.entry((*pod, *rank, *model)).or_default();
                    ops.push(engine_hash, state.as_ref());
                }
                Delta::SourceGone { pod, rank } => {
                    gone.push(source_field(&self.names.pod(&self.index, *pod), *rank));
                }
                data => {
                    self.push_command(pipe, data);
                    commands += 1;
                }
            }
        }
        for ((pod, rank, model), ops) in states {
            if !ops.set.is_empty() {
                // Once per state key and flush: the watermark lists every state key.
                let models = self.marks.models.entry((pod, rank)).or_default();
                models.insert(model);
            }
            let key = state_key(
                &self.names.pod(&self.index, pod),
                rank,
                &self.names.model(&self.index, model),
            );
            if !ops.del.is_empty() {
                pipe.hdel(&key, ops.del).ignore();
                commands += 1;
            }
            if !ops.set.is_empty() {
                pipe.hset_multiple(&key, &ops.set).ignore();
                commands += 1;
            }
        }
        if !gone.is_empty() {
            pipe.hdel(WATERMARKS_KEY, gone).ignore();
            commands += 1;
        }
        commands
    }

    /// Appends one `HSET` of the watermarks of `sources` (after their data). Returns the
    /// number of commands.
    fn push_watermarks(&mut self, pipe: &mut redis::Pipeline, sources: &[(PodId, u8)]) -> usize {
        let mut fields: Vec<(String, String)> = Vec::with_capacity(sources.len());
        for key in sources {
            let Some(mark) = self.watermark(*key) else {
                continue;
            };
            let Ok(json) = serde_json::to_string(&mark) else {
                continue;
            };
            fields.push((
                source_field(&self.names.pod(&self.index, key.0), key.1),
                json,
            ));
        }
        if fields.is_empty() {
            return 0;
        }
        pipe.hset_multiple(WATERMARKS_KEY, &fields).ignore();
        1
    }

    /// Appends every live source's watermark: the end of a reconcile, which rewrote all the
    /// data they cover.
    pub(super) fn push_all_watermarks(&mut self, pipe: &mut redis::Pipeline) -> usize {
        self.marks.unwritten.clear();
        let all: Vec<(PodId, u8)> = self.marks.latest.keys().copied().collect();
        self.push_watermarks(pipe, &all)
    }

    /// Sends one pipeline; records figures and health.
    pub(super) async fn send(
        &mut self,
        pipe: &redis::Pipeline,
        commands: usize,
    ) -> Result<(), redis::RedisError> {
        let started = std::time::Instant::now();
        let result = pipe.query_async::<()>(&mut self.conn).await;
        if result.is_ok() {
            self.shared.record_latency(started.elapsed());
            self.shared.pipelines.fetch_add(1, Ordering::Relaxed);
            self.shared
                .commands
                .fetch_add(commands as u64, Ordering::Relaxed);
            crate::metrics::mirror_commands(commands as u64);
            self.shared.healthy.store(true, Ordering::Relaxed);
        }
        result
    }

    pub(super) async fn flush_now(&mut self) {
        if self.pending.is_empty() && !self.watermarks_due() {
            return;
        }
        let batch: Vec<(Key, Delta)> = self.pending.drain().collect();
        self.pending_entries = 0;
        let mut pipe = redis::pipe();
        let mut commands = self.push_commands(&mut pipe, batch.iter().map(|(_, d)| d));
        let marks: Vec<(PodId, u8)> = if self.watermarks_due() {
            self.marks.unwritten.drain().collect()
        } else {
            Vec::new()
        };
        commands += self.push_watermarks(&mut pipe, &marks);
        if let Err(err) = self.send(&pipe, commands).await {
            self.touched.extend(batch.into_iter().map(|(k, _)| k));
            self.marks.unwritten.extend(marks);
            self.go_dirty(&err);
        }
    }

    /// Whether watermarks wait to be written. Not while a reconcile rewrites Redis (after an
    /// outage, a restart or a FLUSHALL): the data they cover may not be back yet, and the
    /// rewrite writes every watermark when it ends.
    pub(super) fn watermarks_due(&self) -> bool {
        !self.marks.unwritten.is_empty() && !self.entropy.rewriting()
    }

    /// Stops writing until a reconcile succeeds; pending keys join the record. The driver's
    /// message is logged without the URL's password.
    pub(super) fn go_dirty(&mut self, err: &redis::RedisError) {
        let reason = self.config.target.scrub(&err.to_string());
        if self.dirty {
            self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
            tracing::debug!(
                url = %self.config.target,
                reason = %reason,
                backoff_ms = self.backoff.as_millis() as u64,
                "Redis still fails; the mirror retries its reconcile after the backoff."
            );
        } else {
            tracing::warn!(
                url = %self.config.target,
                reason = %reason,
                "Redis writes failed; the mirror pauses and will reconcile from the index once Redis answers."
            );
            self.backoff = MIN_BACKOFF;
        }
        self.dirty = true;
        self.shared.dirty.store(true, Ordering::Relaxed);
        self.shared.healthy.store(false, Ordering::Relaxed);
        let keys: Vec<Key> = self.pending.drain().map(|(k, _)| k).collect();
        self.pending_entries = 0;
        self.touched.extend(keys);
        self.retry_at = Instant::now() + self.backoff;
        self.on_dirty();
    }

    /// Resumes writing once Redis answers; the reconcile pass itself then runs in the
    /// background and counts itself when done.
    pub(super) fn go_clean(&mut self) {
        self.dirty = false;
        self.backoff = MIN_BACKOFF;
        self.shared.dirty.store(false, Ordering::Relaxed);
        self.shared.healthy.store(true, Ordering::Relaxed);
        self.answer_waiters();
    }

    /// When the background passes want a tick (never while dirty: the reconcile's retries
    /// probe Redis then).
    fn entropy_wake(&self) -> Option<Instant> {
        (!self.dirty).then(|| self.entropy.wake())
    }
}

/// The checkpoint entries of one state key written by one flush.
#[derive(Default)]
pub(super) struct StateOps {
    set: Vec<(String, String)>,
    del: Vec<String>,
}

impl StateOps {
    fn push(&mut self, hash: &BlockHash, state: Option<&EngineState>) {
        match state {
            Some(state) => self.set.push((engine_field(hash), engine_value(state))),
            None => self.del.push(engine_field(hash)),
        }
    }
}

async fn sleep_until(wake: Option<Instant>) {
    match wake {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

//! The writer task: coalesces deltas per flush, one bounded pipeline per flush with several
//! in flight (see `inflight.rs` for why that keeps each key's writes in order), and outage
//! handling (dirty mode, capped backoff, reconcile on reconnect).
//!
//! Memory stays bounded under any load: a flush holds at most [`MAX_PIPELINE_COMMANDS`]
//! commands (a message with more deltas, such as a clear of a large cache, is absorbed in
//! slices, each flushed before the next is read), at most [`MAX_IN_FLIGHT`] pipelines are on
//! the wire, the coalescing map is shrunk after a spike, and while all pipelines are in flight
//! the writer stops reading its queue, so ingest waits (backpressure) and nothing is dropped.
//! The queue itself holds at most [`super::MAX_QUEUED_DELTAS`] deltas whatever the number of
//! chunks, and ingest hands a clear's blocks over whole (expanded here as they are read).
//!
//! | file | job |
//! | --- | --- |
//! | `mod.rs` | the task: its queue, coalescing, flushes, answers, dirty mode and backoff |
//! | `key.rs` | [`Key`]: which field or key a delta writes (the coalescing key) |
//! | `encode.rs` | deltas as Redis commands, values read from the index at flush time |
//! | `connect.rs` | opening and checking the connection, auth errors told apart |

mod connect;
mod encode;
mod key;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::anti_entropy::{Entropy, EntropySettings, EntropyStats, TOUCHED_CAP};
use super::checkpoint::Watermark;
use super::inflight::{Batch, InFlight, LatencyHistogram, MarkAt, MAX_IN_FLIGHT};
use super::lease::{LeaseGate, Role};
use super::RedisConfig;
use crate::index::{Checkpoint, Delta, DeltaChunk, Index, ModelId, PodId, SourceId};
use crate::medium::TierWeights;
use crate::redis_conn::RedisConn;
pub(super) use connect::{connect, is_auth_error};
use encode::{Names, Scratch};
pub(super) use key::Key;

/// First retry after a failure; doubles up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(50);
/// Retry interval cap while Redis stays down.
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// Flush latencies kept for the percentiles.
const LATENCY_SAMPLES: usize = 4096;
/// Commands one pipeline holds at most, whatever `flush_max_commands` says: what bounds the
/// writer's memory (the coalescing map, the encoded pipeline and its replies) in a spike.
pub(super) const MAX_PIPELINE_COMMANDS: usize = 16_384;
/// The coalescing map is shrunk back once its capacity passes this many times the flush size.
const SHRINK_FACTOR: usize = 4;

/// What ingest and the handle send to the writer, in one ordered queue.
#[derive(Debug)]
pub(super) enum Msg {
    /// A chunk of one applied message's deltas (a clear's blocks whole, expanded here slice
    /// by slice), the checkpoint of its source that covers it and every chunk before it, and
    /// when ingest handed it over (for the write-latency histogram).
    /// The chunk's room in the queue, given back when the writer has absorbed it.
    Deltas(
        DeltaChunk,
        Option<Checkpoint>,
        std::time::Instant,
        tokio::sync::OwnedSemaphorePermit,
    ),
    /// Answer once everything queued before is in Redis.
    Flush(oneshot::Sender<()>),
    /// Write what is queued, answer, and stop.
    Shutdown(oneshot::Sender<()>),
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
    /// From ingest handing deltas over to Redis answering the pipeline that wrote them.
    pub(super) write_latency: LatencyHistogram,
    /// The most pipelines that were in flight at once.
    pub(super) in_flight_peak: AtomicU64,
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

/// The writer task's state.
pub(super) struct Writer {
    pub(super) config: RedisConfig,
    pub(super) index: Index,
    pub(super) weights: TierWeights,
    pub(super) conn: RedisConn,
    pub(super) shared: Arc<Shared>,
    /// Wanted state per key since the last flush (coalescing: the last delta wins).
    pub(super) pending: hashbrown::HashMap<Key, Delta>,
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
    /// Pipelines sent and not yet answered, oldest first.
    pub(super) inflight: InFlight,
    /// When ingest handed over each message absorbed since the last flush.
    stamps: Vec<std::time::Instant>,
    /// Text buffers reused by every command encoded.
    scratch: Scratch,
    /// `kvindex_mirror_write_latency_seconds`, looked up once.
    write_metric: metrics::Histogram,
    /// With `ha:`: the lease this replica must hold to write, and its role changes.
    lease: Option<(Arc<LeaseGate>, watch::Receiver<Role>)>,
    /// A standby writes nothing: its deltas are dropped (the index keeps the truth), and
    /// it waits for the lease.
    pub(super) standby: bool,
    /// The lease term the writer last took over in.
    term: u64,
    /// After a takeover, when the previous lease ended, until the first write is sent.
    first_write_due: Option<std::time::Instant>,
    /// A standby's keys touched in the window before the current one (see
    /// [`Writer::standby_touch`]); `touched` holds the current window's.
    touched_before: HashSet<Key>,
    /// When the standby's current window of touched keys ends.
    window_ends: Instant,
}

/// How far back a standby remembers the keys its deltas touched, at least: what a leader
/// that just died may not have written yet (its last ttl, and whatever its queue held).
const STANDBY_WINDOW: Duration = Duration::from_secs(10);

/// Watermarks of the sources the mirror checkpoints. Only the seq is recorded per message;
/// the rest of a watermark entry (names, models, engine run) is read when it is written, once
/// per flush, so a 1-block message costs one map update here.
#[derive(Default)]
pub(super) struct Marks {
    /// Per source `(pod, rank)`: its id and the latest seq handed over.
    pub(super) latest: HashMap<(PodId, u8), (SourceId, u64)>,
    /// Sources whose latest watermark is not in Redis yet.
    pub(super) unwritten: HashSet<(PodId, u8)>,
    /// Watermarks whose data Redis has answered for, to be written by the next pipeline.
    confirmed: HashMap<(PodId, u8), (SourceId, u64)>,
    /// Model ids per source, so a watermark lists every state key of its source.
    models: HashMap<(PodId, u8), BTreeSet<ModelId>>,
    /// Source ids resolved to `(pod, rank)` (ids are never reused).
    sources: HashMap<SourceId, Option<(PodId, u8)>>,
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
            pending: hashbrown::HashMap::new(),
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
            inflight: InFlight::default(),
            stamps: Vec::new(),
            scratch: Scratch::new(),
            write_metric: crate::metrics::mirror_write_latency(),
            lease: None,
            standby: false,
            term: 0,
            first_write_due: None,
            touched_before: HashSet::new(),
            window_ends: now,
        }
    }

    /// Makes the writer a standby behind `gate`: it writes only once the lease is taken,
    /// after a full reconcile.
    pub(super) fn behind_lease(&mut self, gate: Arc<LeaseGate>) {
        let rx = gate.subscribe();
        self.lease = Some((gate, rx));
        self.standby = true;
        self.shared.dirty.store(false, Ordering::Relaxed);
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

    /// The watermark entry of source `key` at `seq`, `None` once it is unregistered (or
    /// registered again as another source).
    fn watermark(&mut self, key: (PodId, u8), source: SourceId, seq: u64) -> Option<Watermark> {
        let (latest, _) = *self.marks.latest.get(&key)?;
        if latest != source {
            return None;
        }
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
            let wake = if self.standby {
                None
            } else if self.dirty {
                Some(self.retry_at)
            } else if !self.has_pending() {
                None
            } else {
                Some(self.flush_at)
            };
            let answers = !self.inflight.is_empty();
            let background = self.entropy_wake();
            tokio::select! {
                biased;
                () = role_changed(&mut self.lease) => self.on_role(),
                (result, batch) = self.inflight.next(), if answers => {
                    self.answered(result, batch);
                    self.flush_if_idle().await;
                }
                () = sleep_until(wake) => {
                    if self.dirty {
                        self.try_reconcile().await;
                    } else {
                        self.flush_all().await;
                    }
                }
                () = sleep_until(background) => {
                    // Deltas of events the index already applied must be pending before a
                    // pass compares Redis with the index: otherwise it "repairs" (and
                    // counts) what a queued delta is about to write anyway.
                    while let Ok(msg) = rx.try_recv() {
                        if self.on_msg(Some(msg)).await {
                            return;
                        }
                    }
                    if self.lease_lost() {
                        self.lease_expired();
                    } else if !self.dirty {
                        self.entropy_tick().await;
                    }
                }
                msg = rx.recv() => {
                    if self.on_msg(msg).await {
                        return;
                    }
                }
            }
        }
    }

    /// Handles one message from ingest (`None`: every sender is gone); true when the task
    /// must end.
    async fn on_msg(&mut self, msg: Option<Msg>) -> bool {
        match msg {
            Some(Msg::Deltas(deltas, checkpoint, stamp, room)) => {
                self.take_deltas(deltas, checkpoint, stamp).await;
                drop(room);
                false
            }
            Some(Msg::Flush(done)) => {
                self.waiters.push(done);
                self.flush_everything().await;
                self.answer_waiters();
                false
            }
            Some(Msg::Shutdown(done)) => {
                self.waiters.push(done);
                self.drain_before_exit().await;
                true
            }
            None => {
                self.drain_before_exit().await;
                true
            }
        }
    }

    /// Writes what is pending, retrying through an outage (the caller bounds the wait).
    async fn drain_before_exit(&mut self) {
        while !self.standby {
            if self.dirty {
                tokio::time::sleep_until(self.retry_at).await;
                self.try_reconcile().await;
            } else {
                self.flush_everything().await;
                self.finish_rewrite().await;
                self.flush_everything().await;
                if !self.dirty {
                    break;
                }
            }
        }
        self.answer_waiters();
    }

    /// Flushes until nothing is pending or in flight (watermarks take a second round: they
    /// are written once the data they cover is answered), or until Redis fails.
    pub(super) async fn flush_everything(&mut self) {
        while !self.dirty {
            self.flush_all().await;
            self.drain_inflight().await;
            if !self.has_pending() {
                break;
            }
        }
    }

    /// Waits for every pipeline in flight to be answered.
    pub(super) async fn drain_inflight(&mut self) {
        while !self.inflight.is_empty() {
            let (result, batch) = self.inflight.next().await;
            self.answered(result, batch);
        }
    }

    /// Absorbs one chunk's deltas, in slices of at most one flush each: a chunk larger than a
    /// pipeline (a clear of a large cache, whose deltas are built as they are read) is flushed
    /// as it is read, so neither the coalescing map nor a pipeline grows with it.
    async fn take_deltas(
        &mut self,
        chunk: DeltaChunk,
        checkpoint: Option<Checkpoint>,
        stamp: std::time::Instant,
    ) {
        let mut rest = chunk.into_deltas().peekable();
        while rest.peek().is_some() {
            self.absorb(&mut rest);
            if !self.dirty && self.flush_due() {
                self.flush_now().await;
            }
        }
        if let (Some(checkpoint), true) = (checkpoint, self.config.checkpoint) {
            self.absorb_checkpoint(checkpoint);
            if !self.dirty && self.pending.is_empty() {
                self.flush_at = Instant::now() + self.config.flush_interval;
            }
        }
        if !self.dirty {
            // While dirty nothing is written; the dirty gauge shows the outage instead.
            self.stamps.push(stamp);
        }
        if !self.dirty && self.flush_due() {
            self.flush_now().await;
        }
        self.flush_if_idle().await;
    }

    /// Flushes at once while nothing is in flight: Redis is idle, so waiting for a fuller
    /// pipeline would only add latency. Under load some pipeline is always in flight and
    /// deltas gather until a flush fills up or the oldest answer comes.
    async fn flush_if_idle(&mut self) {
        if !self.dirty && self.inflight.is_empty() && !self.pending.is_empty() {
            self.flush_now().await;
        }
    }

    /// Commands a flush of what is pending holds: checkpoint entries become one command per
    /// state key, so they count apart.
    fn flush_size(&self) -> usize {
        self.config
            .flush_max_commands
            .clamp(1, MAX_PIPELINE_COMMANDS)
    }

    /// Whether the pending commands fill a flush.
    fn flush_due(&self) -> bool {
        let size = self.flush_size();
        self.pending.len() - self.pending_entries >= size || self.pending_entries >= size
    }

    /// Absorbs deltas from `rest` until they run out or a flush is due.
    fn absorb(&mut self, rest: &mut impl Iterator<Item = Delta>) {
        for delta in rest.by_ref() {
            if self.standby {
                self.standby_touch(&delta);
                continue;
            }
            if matches!(delta, Delta::UnknownRemove { .. }) {
                self.queue_adopt(delta);
                continue;
            }
            let wanted = match &delta {
                Delta::Mapping { .. } => self.config.mapping_keys,
                Delta::Engine { .. } => self.config.checkpoint,
                Delta::SourceGone { pod, rank } => {
                    self.forget_marks(*pod, *rank);
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
                if self.flush_due() {
                    break;
                }
            }
        }
        self.cap_touched();
    }

    /// A standby writes nothing but remembers which keys its recent deltas touched: on a
    /// takeover those the index no longer holds are deleted, as after an outage, since the
    /// previous leader may have died before writing their deletion (checkpoint entries
    /// included, which the verify pass does not scan). Two windows of [`STANDBY_WINDOW`]
    /// (or the ttl) are kept, each capped: keys past the cap are left to the takeover's
    /// verify pass (fields and mapping keys).
    fn standby_touch(&mut self, delta: &Delta) {
        let wanted = match delta {
            Delta::Mapping { .. } => self.config.mapping_keys,
            Delta::Engine { .. } => self.config.checkpoint,
            Delta::SourceGone { pod, rank } => {
                self.forget_marks(*pod, *rank);
                self.config.checkpoint
            }
            Delta::Field { .. } => true,
            // Resolved through Redis by a leader; a takeover's verify pass covers it.
            Delta::UnknownRemove { .. } => false,
        };
        if !wanted {
            return;
        }
        let now = Instant::now();
        if now >= self.window_ends {
            let ttl = self.lease.as_ref().map_or(Duration::ZERO, |(g, _)| g.ttl());
            self.window_ends = now + STANDBY_WINDOW.max(ttl);
            self.touched_before = std::mem::take(&mut self.touched);
        }
        if self.touched.len() < TOUCHED_CAP {
            self.touched.insert(Key::of(delta));
        }
    }

    /// Drops the watermarks of a source that is gone.
    fn forget_marks(&mut self, pod: PodId, rank: u8) {
        self.marks.unwritten.remove(&(pod, rank));
        self.marks.latest.remove(&(pod, rank));
        self.marks.models.remove(&(pod, rank));
        self.marks.confirmed.remove(&(pod, rank));
    }

    pub(super) fn answer_waiters(&mut self) {
        if self.standby {
            // Nothing is written here: there is nothing to wait for.
            for done in self.waiters.drain(..) {
                let _ = done.send(());
            }
            return;
        }
        let written = self.inflight.is_empty() && !self.has_pending();
        if !self.dirty && written && !self.entropy.rewriting() {
            for done in self.waiters.drain(..) {
                let _ = done.send(());
            }
        }
    }

    /// Hands what is pending to Redis as one pipeline, once one of the [`MAX_IN_FLIGHT`]
    /// slots is free (waiting for the oldest answer otherwise). Its watermarks are those
    /// confirmed by earlier answers; the ones it completes are confirmed by its own.
    pub(super) async fn flush_now(&mut self) {
        if self.dirty || (self.pending.is_empty() && !self.watermarks_due()) {
            self.settle_stamps();
            return;
        }
        while self.inflight.len() >= self.conn.pipelines_in_flight(MAX_IN_FLIGHT) {
            let (result, batch) = self.inflight.next().await;
            self.answered(result, batch);
            if self.dirty {
                return;
            }
        }
        let mut pipe = self.inflight.pipeline();
        let mut batch = Batch::default();
        let drained: Vec<(Key, Delta)> = self.pending.drain().collect();
        self.pending_entries = 0;
        self.shrink_pending();
        let mut commands = self.push_commands(&mut pipe, drained.iter().map(|(_, d)| d));
        batch.keys = drained.into_iter().map(|(k, _)| k).collect();
        if self.watermarks_due() {
            let confirmed: Vec<MarkAt> = self
                .marks
                .confirmed
                .drain()
                .map(|(key, (source, seq))| (key, source, seq))
                .collect();
            commands += self.push_watermarks(&mut pipe, &confirmed);
            batch.marks = confirmed.into_iter().map(|(key, ..)| key).collect();
            let latest = &self.marks.latest;
            batch.covers = self
                .marks
                .unwritten
                .drain()
                .filter_map(|key| latest.get(&key).map(|(source, seq)| (key, *source, *seq)))
                .collect();
        }
        if commands == 0 {
            // The data of these watermarks and messages is all in earlier pipelines.
            self.inflight.spare(pipe);
            self.settle(batch.covers);
            return;
        }
        batch.stamps = std::mem::take(&mut self.stamps);
        batch.commands = commands;
        if self.lease_lost() {
            self.inflight.spare(pipe);
            self.unsent(batch);
            return self.lease_expired();
        }
        self.note_first_write();
        self.inflight.submit(&self.conn, pipe, batch).await;
        let peak = self.inflight.len() as u64;
        self.shared
            .in_flight_peak
            .fetch_max(peak, Ordering::Relaxed);
    }

    /// Confirms `covers` and the stamps absorbed so far against the newest pipeline in
    /// flight, or at once when none is.
    fn settle(&mut self, covers: Vec<MarkAt>) {
        match self.inflight.newest() {
            Some(newest) => newest.covers.extend(covers),
            None => self.confirm(covers),
        }
        self.settle_stamps();
    }

    /// Stamps of messages with nothing left to write: answered with the newest pipeline in
    /// flight, or now.
    fn settle_stamps(&mut self) {
        if self.stamps.is_empty() {
            return;
        }
        let stamps = std::mem::take(&mut self.stamps);
        match self.inflight.newest() {
            Some(newest) => newest.stamps.extend(stamps),
            None => self.record_stamps(&stamps),
        }
    }

    fn confirm(&mut self, covers: Vec<MarkAt>) {
        if covers.is_empty() {
            return;
        }
        if self.pending.is_empty() && self.marks.confirmed.is_empty() {
            self.flush_at = Instant::now() + self.config.flush_interval;
        }
        for (key, source, seq) in covers {
            self.marks.confirmed.insert(key, (source, seq));
        }
    }

    fn record_stamps(&self, stamps: &[std::time::Instant]) {
        let now = std::time::Instant::now();
        for stamp in stamps {
            let took = now.saturating_duration_since(*stamp);
            let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
            self.shared.write_latency.record(us);
            self.write_metric.record(took.as_secs_f64());
        }
    }

    /// Handles the oldest pipeline's answer: figures, latencies and confirmed watermarks, or
    /// on failure the outage (see `inflight.rs` for why every pipeline in flight then counts
    /// as failed).
    pub(super) fn answered(&mut self, result: Result<(), redis::RedisError>, batch: Batch) {
        match result {
            Ok(()) => {
                if let Some(sent) = batch.sent {
                    self.shared.record_latency(sent.elapsed());
                }
                self.shared.pipelines.fetch_add(1, Ordering::Relaxed);
                let commands = batch.commands as u64;
                self.shared.commands.fetch_add(commands, Ordering::Relaxed);
                crate::metrics::mirror_commands(commands);
                self.shared.healthy.store(true, Ordering::Relaxed);
                self.record_stamps(&batch.stamps);
                self.confirm(batch.covers);
            }
            Err(err) => {
                self.unsent(batch);
                self.go_dirty(&err);
            }
        }
    }

    /// A pipeline that may not have landed: its keys join the outage record and its
    /// watermarks wait for the reconcile.
    fn unsent(&mut self, batch: Batch) {
        self.touched.extend(batch.keys);
        let marks = batch.covers.into_iter().map(|(key, ..)| key);
        self.marks.unwritten.extend(marks.chain(batch.marks));
    }

    /// Gives the coalescing map's memory back after a spike.
    fn shrink_pending(&mut self) {
        let size = self.flush_size();
        if self.pending.capacity() > SHRINK_FACTOR * size {
            self.pending.shrink_to(size);
        }
    }

    /// Whether watermarks wait to be written. Not while a reconcile rewrites Redis (after an
    /// outage, a restart or a FLUSHALL): the data they cover may not be back yet, and the
    /// rewrite writes every watermark when it ends.
    pub(super) fn watermarks_due(&self) -> bool {
        let marks = &self.marks;
        (!marks.unwritten.is_empty() || !marks.confirmed.is_empty()) && !self.entropy.rewriting()
    }

    /// Stops writing until a reconcile succeeds; pending keys join the record. The driver's
    /// message is logged without the URL's password.
    pub(super) fn go_dirty(&mut self, err: &redis::RedisError) {
        if self.lease_lost() {
            // Not an outage to reconcile after: another replica writes now.
            return self.lease_expired();
        }
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
        self.shrink_pending();
        self.touched.extend(keys);
        // Every pipeline in flight may now land or not, and in any order (inflight.rs).
        for batch in self.inflight.abandon() {
            self.unsent(batch);
        }
        self.stamps.clear();
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

/// Resolves when the lease's role changed (never without `ha:`, or once the lease task ended).
async fn role_changed(lease: &mut Option<(Arc<LeaseGate>, watch::Receiver<Role>)>) {
    match lease {
        Some((_, rx)) => {
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

impl Writer {
    /// Whether this writer runs behind a lease it does not hold now (or held too long ago
    /// without renewal): every write is checked against it just before it is sent.
    pub(super) fn lease_lost(&self) -> bool {
        self.lease.as_ref().is_some_and(|(gate, _)| !gate.is_open())
    }

    /// Follows the lease task's news: a new term takes over (after stepping down from an
    /// older one the writer may have missed), a lost lease stands by.
    fn on_role(&mut self) {
        let Some((_, rx)) = &mut self.lease else {
            return;
        };
        let role = *rx.borrow_and_update();
        match role {
            Role::Leader { term, lost_at } if term != self.term => {
                if !self.standby {
                    self.step_down();
                }
                self.term = term;
                self.take_over(lost_at);
            }
            Role::Standby if !self.standby => self.step_down(),
            _ => {}
        }
    }

    /// Starts writing: first a full reconcile of the owned pods against the index, both
    /// ways and unthrottled (the rewrite, then a fast verify that deletes what the index
    /// does not hold, such as late writes of a deposed leader), then normal flushes.
    fn take_over(&mut self, lost_at: Option<std::time::Instant>) {
        self.standby = false;
        self.first_write_due = Some(lost_at.unwrap_or_else(std::time::Instant::now));
        // The reconcile's stale phase checks what the standby's recent deltas touched.
        let before = std::mem::take(&mut self.touched_before);
        self.touched.extend(before);
        // Redis as the previous leader left it: the watchdog starts over.
        self.entropy.armed = false;
        self.entropy.run_id = None;
        self.entropy.overflowed = false;
        self.entropy.verify_after = Some(true);
        // Late bytes of the deposed leader land within its last ttl or so: one more
        // (throttled) pass two ttls after the takeover's finds what landed after it.
        let ttl = self.lease.as_ref().map_or(Duration::ZERO, |(g, _)| g.ttl());
        self.entropy.verify_again_after = Some(2 * ttl);
        self.dirty = true;
        self.retry_at = Instant::now();
        tracing::info!(url = %self.config.target, "HA: this replica leads; reconciling Redis with its index before its first write.");
    }

    /// Stops writing at once: what is pending is dropped (the index keeps the truth and the
    /// next takeover rewrites it), pipelines in flight are abandoned, background passes end.
    pub(super) fn step_down(&mut self) {
        if self.standby {
            return;
        }
        self.standby = true;
        self.dirty = true;
        self.pending.clear();
        self.pending_entries = 0;
        self.shrink_pending();
        for batch in self.inflight.abandon() {
            self.unsent(batch);
        }
        self.stamps.clear();
        self.on_dirty();
        self.touched.clear();
        self.touched_before.clear();
        self.window_ends = Instant::now();
        self.entropy.overflowed = false;
        self.entropy.verify_after = None;
        self.entropy.verify_again_after = None;
        self.entropy.adopt.clear();
        self.first_write_due = None;
        self.shared.dirty.store(false, Ordering::Relaxed);
        self.shared.healthy.store(true, Ordering::Relaxed);
        self.answer_waiters();
        tracing::info!(url = %self.config.target, "HA: this replica stands by; its mirror writes nothing.");
    }

    /// Stands by because the gate closed under the writer (no renewal within ttl/2): the
    /// lease task is told, so the writer writes again only after a new acquisition.
    pub(super) fn lease_expired(&mut self) {
        if self.standby {
            return;
        }
        if let Some((gate, _)) = &self.lease {
            gate.abandon();
        }
        self.step_down();
    }

    /// Counts the time from the previous lease's end to the first write after a takeover.
    pub(super) fn note_first_write(&mut self) {
        if let Some(from) = self.first_write_due.take() {
            let took = from.elapsed();
            crate::metrics::ha_first_write(took.as_secs_f64());
            tracing::info!(
                since_lease_end_ms = took.as_millis() as u64,
                "HA: the new leader's first write is on its way."
            );
        }
    }
}

async fn sleep_until(wake: Option<Instant>) {
    match wake {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

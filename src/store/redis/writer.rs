//! [`Writer`]: the writer task's loop. It coalesces deltas per flush, sends each flush as one
//! bounded pipeline per lane with several flushes in flight (see `inflight.rs` for why that
//! keeps each key's writes in order), handles outages (dirty mode, capped backoff, a repair
//! or a rewrite once Redis answers) and the lease, and owns the background roles, giving
//! each a turn through the [`Link`]:
//!
//! | role | file | job |
//! | --- | --- | --- |
//! | [`Reconcile`] | `reconcile.rs` | the outage record; the rewrite after an outage |
//! | [`AntiEntropy`] | `anti_entropy/` | the rewrite and verify passes over the index and Redis |
//! | [`Refresh`] | `refresh.rs` | rewriting fields before kthena's GC would drop them |
//! | [`Watchdog`] | `watchdog.rs` | noticing a Redis restart or FLUSHALL while idle |
//! | [`Adoption`] | `adopt.rs` | removes of unknown engine hashes, through Redis's mapping keys |
//!
//! Memory stays bounded under any load: a flush holds at most [`MAX_PIPELINE_COMMANDS`]
//! commands (a message with more deltas, such as a clear of a large cache, is absorbed in
//! slices, each flushed before the next is read), at most [`MAX_IN_FLIGHT`] flushes are on
//! the wire, the coalescing map is shrunk after a spike, and while all pipelines are in flight
//! the writer stops reading its queue, so ingest waits (backpressure) and nothing is dropped.
//! The queue itself holds at most [`super::MAX_QUEUED_DELTAS`] deltas whatever the number of
//! chunks, and ingest hands a clear's blocks over whole (expanded here as they are read).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::adopt::Adoption;
use super::anti_entropy::{AntiEntropy, PassSettings, Step};
use super::checkpoint::Watermark;
use super::compact;
use super::connect::MAX_BACKOFF;
use super::inflight::{Batch, Failure, InFlight, MarkAt, MAX_IN_FLIGHT};
use super::key::Key;
use super::labels::RedisReset;
use super::lease::{LeaseGate, Role};
use super::link::Link;
use super::reconcile::Reconcile;
use super::refresh::Refresh;
use super::shared::{Msg, Shared};
use super::watchdog::Watchdog;
use crate::index::{Checkpoint, Delta, DeltaChunk, Index, PodId, SourceId};
use crate::medium::TierWeights;
use crate::redis_conn::{is_auth_error, RedisConn};
use crate::settings::redis::RedisConfig;

/// First retry after a failure; doubles up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(50);
/// Commands one pipeline holds at most, whatever `flush_max_commands` says: what bounds the
/// writer's memory (the coalescing map, the encoded pipeline and its replies) in a spike.
pub(super) const MAX_PIPELINE_COMMANDS: usize = 16_384;
/// Queued messages the loop takes in one turn at most, so answers and timers still get
/// their turn under a steady stream.
const MAX_MESSAGES_PER_TURN: usize = 256;
/// The coalescing map is shrunk back once its capacity passes this many times the flush size.
const SHRINK_FACTOR: usize = 4;

/// The writer task's state.
pub(super) struct Writer {
    /// The connection, the index, the encoder and the watermarks, lent to the roles.
    link: Link,
    /// Wanted state per key since the last flush (coalescing: the last delta wins).
    pending: hashbrown::HashMap<Key, Delta>,
    /// How many of `pending` are checkpoint entries: they become one command per state key,
    /// so they do not count towards `flush_max_commands`.
    pending_entries: usize,
    dirty: bool,
    /// Lanes whose pipeline failed since the last reconcile (only while dirty): every key
    /// they carry until then may be wrong.
    broken: Vec<bool>,
    backoff: Duration,
    retry_at: Instant,
    flush_at: Instant,
    waiters: Vec<oneshot::Sender<()>>,
    /// Pipelines sent and not yet answered, oldest first.
    inflight: InFlight,
    /// When ingest handed over each message absorbed since the last flush.
    stamps: Vec<std::time::Instant>,
    /// `kvindex_mirror_write_latency_seconds`, looked up once.
    write_metric: metrics::Histogram,
    /// The outage record, and the rewrite it starts.
    reconcile: Reconcile,
    /// The rewrite and verify passes.
    anti_entropy: AntiEntropy,
    /// The refresh riding on the passes.
    refresh: Refresh,
    /// Restarts and flushes of Redis.
    watchdog: Watchdog,
    /// Unknown removes resolved through Redis.
    adoption: Adoption,
    /// With `ha:`: the lease's role changes.
    roles: Option<watch::Receiver<Role>>,
    /// A standby writes nothing: its deltas are dropped (the index keeps the truth), and
    /// it waits for the lease.
    standby: bool,
    /// The lease term the writer last took over in.
    term: u64,
}

impl Writer {
    /// A writer that starts dirty, so its first act is a reconcile with the index.
    pub(super) fn new(
        config: RedisConfig,
        index: Index,
        weights: TierWeights,
        lanes: (RedisConn, Vec<RedisConn>),
        shared: Arc<Shared>,
    ) -> Writer {
        shared.healthy.store(true, Ordering::Relaxed);
        shared.dirty.store(true, Ordering::Relaxed);
        let now = Instant::now();
        let anti_entropy = AntiEntropy::new(PassSettings {
            interval: config.anti_entropy_interval,
            max_commands_per_s: config.anti_entropy_max_commands_per_s,
        });
        let refresh = Refresh::new(config.refresh_after_s, config.anti_entropy_interval);
        let link = Link::new(config, index, weights, lanes, shared);
        Writer {
            broken: vec![false; link.lanes()],
            link,
            pending: hashbrown::HashMap::new(),
            pending_entries: 0,
            dirty: true,
            backoff: MIN_BACKOFF,
            retry_at: now,
            flush_at: now,
            waiters: Vec::new(),
            inflight: InFlight::default(),
            stamps: Vec::new(),
            write_metric: crate::metrics::mirror_write_latency(),
            reconcile: Reconcile::new(),
            anti_entropy,
            refresh,
            watchdog: Watchdog::new(),
            adoption: Adoption::default(),
            roles: None,
            standby: false,
            term: 0,
        }
    }

    /// Makes the writer a standby behind `gate`: it writes only once the lease is taken,
    /// after a full reconcile.
    pub(super) fn behind_lease(&mut self, gate: Arc<LeaseGate>) {
        self.roles = Some(gate.subscribe());
        self.link.behind(gate);
        self.standby = true;
        self.link.shared.dirty.store(false, Ordering::Relaxed);
    }

    /// Seeds the watermarks a warm start restored, so later ones keep their model lists and a
    /// reconcile writes them back.
    pub(super) fn seed_marks(&mut self, restored: Vec<(SourceId, Watermark)>) {
        let link = &mut self.link;
        link.marks.seed(&link.index, restored);
    }

    fn config(&self) -> &RedisConfig {
        &self.link.config
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
            let background = self.upkeep_wake();
            tokio::select! {
                biased;
                () = role_changed(&mut self.roles) => self.on_role(),
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
                    if self.take_queued(&mut rx, usize::MAX).await {
                        return;
                    }
                    if self.link.lease_lost() {
                        self.lease_expired();
                    } else if !self.dirty {
                        self.upkeep_tick().await;
                    }
                }
                msg = rx.recv() => {
                    let more = MAX_MESSAGES_PER_TURN;
                    if self.on_msg(msg).await || self.take_queued(&mut rx, more).await {
                        return;
                    }
                }
            }
        }
    }

    /// Handles up to `most` messages already queued. After a message, the loop takes the
    /// rest (up to [`MAX_MESSAGES_PER_TURN`]) before it arms its timers again: per message,
    /// arming them would cost more than the message. True when the task must end.
    async fn take_queued(&mut self, rx: &mut mpsc::Receiver<Msg>, most: usize) -> bool {
        for _ in 0..most {
            let Ok(msg) = rx.try_recv() else {
                return false;
            };
            if self.on_msg(Some(msg)).await {
                return true;
            }
        }
        false
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
    async fn flush_everything(&mut self) {
        while !self.dirty {
            self.flush_all().await;
            self.drain_inflight().await;
            if !self.has_pending() {
                break;
            }
        }
    }

    /// Waits for every pipeline in flight to be answered.
    async fn drain_inflight(&mut self) {
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
        if let (Some(checkpoint), true) = (checkpoint, self.config().checkpoint) {
            let link = &mut self.link;
            link.marks.absorb(&link.index, checkpoint);
            if !self.dirty && self.pending.is_empty() {
                self.flush_at = Instant::now() + self.config().flush_interval;
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
        (self.config().flush_max_commands).clamp(1, MAX_PIPELINE_COMMANDS)
    }

    /// Whether the pending commands fill a flush.
    fn flush_due(&self) -> bool {
        let size = self.flush_size();
        self.pending.len() - self.pending_entries >= size || self.pending_entries >= size
    }

    /// Whether the mirror writes what `delta` changes (mapping keys and the checkpoint are
    /// optional); a source gone drops its watermarks on the way.
    fn wanted(&mut self, delta: &Delta) -> bool {
        let config = &self.link.config;
        match delta {
            Delta::Mapping { .. } => config.mapping_keys,
            Delta::Engine { .. } => config.checkpoint,
            Delta::SourceGone { pod, rank } => {
                let checkpoint = config.checkpoint;
                self.forget_marks(*pod, *rank);
                checkpoint
            }
            Delta::Field { .. } => true,
            // Resolved through Redis by a leader; a takeover's verify pass covers it.
            Delta::UnknownRemove { .. } => false,
        }
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
            if !self.wanted(&delta) {
                continue;
            }
            let key = Key::of(&delta);
            if self.dirty {
                // Not written now: the reconcile writes the index's state of this key.
                self.reconcile.record(key);
            } else {
                if self.pending.is_empty() {
                    self.flush_at = Instant::now() + self.config().flush_interval;
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
        self.reconcile.cap();
    }

    /// A standby writes nothing but remembers which keys its recent deltas touched (see
    /// [`Reconcile::standby_touch`]).
    fn standby_touch(&mut self, delta: &Delta) {
        if !self.wanted(delta) {
            return;
        }
        let ttl = self.link.gate().map_or(Duration::ZERO, |g| g.ttl());
        self.reconcile.standby_touch(Key::of(delta), ttl);
    }

    /// Queues a remove the index could not resolve, for the next flush.
    fn queue_adopt(&mut self, delta: Delta) {
        let was_pending = self.has_pending();
        if self.adoption.queue(delta) && !was_pending {
            self.flush_at = Instant::now() + self.config().flush_interval;
        }
    }

    /// Drops the watermarks of a source that is gone.
    fn forget_marks(&mut self, pod: PodId, rank: u8) {
        self.link.marks.forget(pod, rank);
    }

    /// Whether deltas, watermarks or unknown removes wait for the next flush.
    fn has_pending(&self) -> bool {
        !self.pending.is_empty() || !self.adoption.is_empty() || self.watermarks_due()
    }

    fn answer_waiters(&mut self) {
        if self.standby {
            // Nothing is written here: there is nothing to wait for.
            for done in self.waiters.drain(..) {
                let _ = done.send(());
            }
            return;
        }
        let written = self.inflight.is_empty() && !self.has_pending();
        if !self.dirty && written && !self.anti_entropy.rewriting() {
            for done in self.waiters.drain(..) {
                let _ = done.send(());
            }
        }
    }

    /// The flush of the writer's loop: the pending deltas, then the queued unknown removes.
    async fn flush_all(&mut self) {
        self.flush_now().await;
        if !self.adoption.is_empty() {
            // Adoption reads mapping keys that pipelines in flight may still write.
            self.drain_inflight().await;
        }
        if !self.dirty && !self.adoption.is_empty() {
            if let Err(err) = self.adoption.resolve(&mut self.link).await {
                self.go_dirty(&err);
            }
        }
    }

    /// Hands what is pending to Redis as one pipeline, once one of the [`MAX_IN_FLIGHT`]
    /// slots is free (waiting for the oldest answer otherwise). Its watermarks are those
    /// confirmed by earlier answers; the ones it completes are confirmed by its own.
    async fn flush_now(&mut self) {
        if self.dirty || (self.pending.is_empty() && !self.watermarks_due()) {
            self.settle_stamps();
            return;
        }
        while self.inflight.len() >= self.link.conn.pipelines_in_flight(MAX_IN_FLIGHT) {
            let (result, batch) = self.inflight.next().await;
            self.answered(result, batch);
            if self.dirty {
                return;
            }
        }
        let mut batch = Batch::default();
        let mut pipes = Vec::with_capacity(self.link.lanes());
        let mut commands = 0;
        for deltas in self.drain_by_lane() {
            let mut pipe = self.inflight.pipeline();
            commands += (self.link).push_commands(&mut pipe, deltas.iter().map(|(_, d)| d));
            batch
                .keys
                .push(deltas.into_iter().map(|(k, _)| k).collect());
            pipes.push(pipe);
        }
        if self.watermarks_due() {
            let confirmed = self.link.marks.take_confirmed();
            if let Some(first) = pipes.first_mut() {
                commands += self.link.push_watermarks(first, &confirmed);
            }
            batch.marks = confirmed.into_iter().map(|(key, ..)| key).collect();
            batch.covers = self.link.marks.take_covered();
        }
        if commands == 0 {
            // The data of these watermarks and messages is all in earlier flushes.
            pipes.into_iter().for_each(|pipe| self.inflight.spare(pipe));
            self.settle(batch.covers);
            return;
        }
        batch.stamps = std::mem::take(&mut self.stamps);
        batch.commands = commands;
        if self.link.lease_lost() {
            pipes.into_iter().for_each(|pipe| self.inflight.spare(pipe));
            self.unsent(batch);
            return self.lease_expired();
        }
        self.link.note_first_write();
        let mut parts = Vec::with_capacity(pipes.len());
        for (lane, pipe) in pipes.into_iter().enumerate() {
            if pipe.is_empty() {
                self.inflight.spare(pipe);
            } else {
                parts.push((lane, self.link.lane(lane).clone(), pipe));
            }
        }
        batch.pipelines = parts.len();
        self.inflight.submit(parts, batch).await;
        let peak = self.inflight.len() as u64;
        (self.link.shared.in_flight_peak).fetch_max(peak, Ordering::Relaxed);
    }

    /// Takes what is pending, split by lane (one list per lane, in lane order).
    fn drain_by_lane(&mut self) -> Vec<Vec<(Key, Delta)>> {
        let lanes = self.link.lanes();
        // Sized up front: a flush's deltas would otherwise grow each list by doubling.
        let each = self.pending.len().div_ceil(lanes);
        let mut by_lane: Vec<Vec<(Key, Delta)>> =
            (0..lanes).map(|_| Vec::with_capacity(each)).collect();
        for (key, delta) in self.pending.drain() {
            by_lane[self.link.lane_of(&key)].push((key, delta));
        }
        self.pending_entries = 0;
        self.shrink_pending();
        by_lane
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
        if self.pending.is_empty() && !self.link.marks.any_confirmed() {
            self.flush_at = Instant::now() + self.config().flush_interval;
        }
        self.link.marks.confirm(covers);
    }

    fn record_stamps(&self, stamps: &[std::time::Instant]) {
        let now = std::time::Instant::now();
        for stamp in stamps {
            let took = now.saturating_duration_since(*stamp);
            let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
            self.link.shared.write_latency.record(us);
            self.write_metric.record(took.as_secs_f64());
        }
    }

    /// Handles the oldest flush's answer: figures, latencies and confirmed watermarks, or
    /// on failure the outage. While the writer is dirty (this or an earlier flush failed),
    /// an answer only tells which of its keys may be wrong (see `inflight.rs`).
    fn answered(&mut self, result: Result<(), Failure>, batch: Batch) {
        match result {
            Ok(()) if !self.dirty => self.written(batch),
            Ok(()) => self.unsent_on_broken_lanes(batch),
            Err(failure) => {
                for &lane in &failure.lanes {
                    self.broken[lane] = true;
                }
                self.unsent_on_broken_lanes(batch);
                if !self.dirty {
                    self.go_dirty(&failure.error);
                }
            }
        }
    }

    /// A flush that landed whole: its figures, latencies and watermarks.
    fn written(&mut self, batch: Batch) {
        let shared = &self.link.shared;
        if let Some(sent) = batch.sent {
            shared.record_latency(sent.elapsed());
        }
        (shared.pipelines).fetch_add(batch.pipelines as u64, Ordering::Relaxed);
        let commands = batch.commands as u64;
        shared.commands.fetch_add(commands, Ordering::Relaxed);
        crate::metrics::mirror_commands(commands);
        shared.healthy.store(true, Ordering::Relaxed);
        self.record_stamps(&batch.stamps);
        self.confirm(batch.covers);
    }

    /// A flush answered after a lane failed: the keys of every failed lane join the outage
    /// record (they may not have landed, or landed out of order), those of healthy lanes
    /// landed in order. Its watermarks wait for the reconcile either way.
    fn unsent_on_broken_lanes(&mut self, mut batch: Batch) {
        let keys = std::mem::take(&mut batch.keys);
        for (lane, keys) in keys.into_iter().enumerate() {
            if self.broken[lane] {
                self.reconcile.record_all(keys);
            }
        }
        self.unsent(batch);
    }

    /// A flush that may not have landed: its keys join the outage record and its
    /// watermarks wait for the reconcile.
    fn unsent(&mut self, batch: Batch) {
        self.reconcile.record_all(batch.keys.into_iter().flatten());
        let marks = batch.covers.into_iter().map(|(key, ..)| key);
        self.link.marks.unwritten_again(marks.chain(batch.marks));
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
    fn watermarks_due(&self) -> bool {
        self.link.marks.waiting() && !self.anti_entropy.rewriting()
    }

    /// Stops writing until a reconcile succeeds; pending keys join the record. The driver's
    /// message is logged without the URL's password.
    fn go_dirty(&mut self, err: &redis::RedisError) {
        if self.link.lease_lost() {
            // Not an outage to reconcile after: another replica writes now.
            return self.lease_expired();
        }
        let target = &self.link.config.target;
        let reason = target.scrub(&err.to_string());
        if self.dirty {
            self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
            tracing::debug!(
                url = %target,
                reason = %reason,
                backoff_ms = self.backoff.as_millis() as u64,
                "Redis still fails; the mirror retries its reconcile after the backoff."
            );
        } else {
            tracing::warn!(
                url = %target,
                reason = %reason,
                "Redis writes failed; the mirror pauses and will reconcile from the index once Redis answers."
            );
            self.backoff = MIN_BACKOFF;
        }
        self.dirty = true;
        self.link.shared.dirty.store(true, Ordering::Relaxed);
        self.link.shared.healthy.store(false, Ordering::Relaxed);
        let keys: Vec<Key> = self.pending.drain().map(|(k, _)| k).collect();
        self.pending_entries = 0;
        self.shrink_pending();
        self.reconcile.record_all(keys);
        // Flushes still in flight are answered while dirty: each tells which of its keys
        // may be wrong (inflight.rs); the reconcile waits for them.
        self.stamps.clear();
        self.retry_at = Instant::now() + self.backoff;
        self.on_dirty();
    }

    /// Resumes writing once Redis answers; the reconcile pass itself then runs in the
    /// background and counts itself when done.
    fn go_clean(&mut self) {
        self.dirty = false;
        self.broken.fill(false);
        self.backoff = MIN_BACKOFF;
        self.link.shared.dirty.store(false, Ordering::Relaxed);
        self.link.shared.healthy.store(true, Ordering::Relaxed);
        self.answer_waiters();
    }

    /// On going dirty: a rewrite in progress gives its unchecked keys back to the outage
    /// record and starts over once Redis answers again.
    fn on_dirty(&mut self) {
        let unchecked = self.anti_entropy.interrupt(&self.link);
        self.reconcile.record_all(unchecked);
        self.reconcile.cap();
    }

    /// One reconcile attempt: once Redis answers a PING on every lane, writes resume and the
    /// reconcile starts; on failure the writer stays dirty and retries after backoff.
    async fn try_reconcile(&mut self) {
        if self.standby {
            return;
        }
        // Every flush still in flight is answered first: its keys that may be wrong must be
        // in the record the reconcile takes, and nothing may race the reconcile's writes.
        self.drain_inflight().await;
        // Redis must answer on every lane before the background rewrite starts.
        if let Err(err) = Reconcile::probe(&mut self.link).await {
            self.go_dirty(&err);
            if is_auth_error(&err) {
                Reconcile::renew_connection(&mut self.link).await;
            }
            return;
        }
        // Segments from here on sort after anything written before, by any writer.
        if let Err(err) = self.link.new_generation().await {
            return self.go_dirty(&err);
        }
        match self.redis_kept_its_keys().await {
            Ok(true) => self.start_repair(),
            Ok(false) => self.start_rewrite(),
            Err(err) => return self.go_dirty(&err),
        }
        self.go_clean();
    }

    /// Whether Redis provably kept every key the writer wrote before the outage, so the
    /// reconcile may write back the outage record alone: the watchdog knew this Redis
    /// before and finds the same `run_id` and its sentinel now, no earlier rewrite is owed,
    /// and the record is whole. A Redis that lost keys is counted as the watchdog would.
    async fn redis_kept_its_keys(&mut self) -> Result<bool, redis::RedisError> {
        let knew = self.watchdog.knows_redis();
        if let Some(kind) = self.watchdog.check(&mut self.link).await? {
            self.on_reset(kind);
            return Ok(false);
        }
        let whole = !self.reconcile.overflowed() && !self.anti_entropy.rewrite_owed();
        Ok(knew && whole)
    }

    /// Starts the rewrite of the outage record and the index.
    fn start_rewrite(&mut self) {
        let stale = self.reconcile.take();
        let overflowed = self.reconcile.take_overflowed();
        self.anti_entropy
            .start_rewrite(&self.link, stale, overflowed);
    }

    /// Starts the repair of the outage record alone.
    fn start_repair(&mut self) {
        let stale = self.reconcile.take();
        self.anti_entropy.start_repair(&self.link, stale);
    }

    /// Runs a reconcile in progress to its end, unthrottled (shutdown drain).
    async fn finish_rewrite(&mut self) {
        while self.anti_entropy.rewriting() && !self.dirty {
            self.pass_step().await;
        }
    }

    /// When the background roles want a tick (never while dirty: the reconcile's retries
    /// probe Redis then).
    fn upkeep_wake(&self) -> Option<Instant> {
        (!self.dirty).then(|| self.anti_entropy.wake(self.watchdog.due_at()))
    }

    /// One tick of background work: the watchdog when due, the checkpoint log's compaction
    /// when a state key is due, then one step of the current pass (starting a periodic one
    /// when due).
    async fn upkeep_tick(&mut self) {
        if self.dirty {
            // The reconcile's own retries probe Redis meanwhile.
            self.watchdog.postpone();
            return;
        }
        // The watchdog and a step read Redis: they see every pipeline in flight answered.
        self.drain_inflight().await;
        if self.dirty {
            return;
        }
        let now = Instant::now();
        if self.watchdog.due(now) {
            self.watch().await;
            if self.dirty {
                return;
            }
        }
        if let Err(err) = compact::step(&mut self.link).await {
            return self.go_dirty(&err);
        }
        self.anti_entropy.start_due(now, self.config().verify);
        if self.anti_entropy.running() {
            self.pass_step().await;
        }
        self.anti_entropy.stepped();
    }

    /// One watchdog check; a Redis that lost kvindex's keys is rewritten from the index.
    async fn watch(&mut self) {
        let kind = match self.watchdog.check(&mut self.link).await {
            Ok(Some(kind)) => kind,
            Ok(None) => return,
            Err(err) => return self.go_dirty(&err),
        };
        self.on_reset(kind);
        // Redis may have lost the generation counter with the keys.
        if let Err(err) = self.link.new_generation().await {
            return self.go_dirty(&err);
        }
        let overflowed = self.reconcile.take_overflowed();
        (self.anti_entropy).start_rewrite(&self.link, Default::default(), overflowed);
    }

    /// Counts and logs a Redis that lost kvindex's keys, and wants the verify that follows
    /// its rewrite: after a restart Redis may hold an old snapshot, so that verify deletes
    /// what the index no longer holds unthrottled.
    fn on_reset(&mut self, kind: RedisReset) {
        (self.anti_entropy).verify_after(kind == RedisReset::Restart);
        let shared = &self.link.shared;
        shared.upkeep.redis_resets.fetch_add(1, Ordering::Relaxed);
        crate::metrics::redis_reset_detected(kind.as_str());
        tracing::warn!(
            url = %self.link.config.target,
            kind = kind.as_str(),
            "Redis lost kvindex's keys (restart, flush or failover); rewriting the mirror from the index."
        );
    }

    /// One bounded step of the current pass, once what it must see is written.
    async fn pass_step(&mut self) {
        let budget = self.anti_entropy.budget();
        if budget == 0 || !self.anti_entropy.running() {
            return;
        }
        if self.anti_entropy.compares() && !self.pending.is_empty() {
            // Compare against Redis only after what ingest already produced is written.
            self.flush_now().await;
        }
        // A step reads or writes Redis on its own: nothing of ingest's may be in flight.
        self.drain_inflight().await;
        if self.dirty {
            self.on_dirty();
            return;
        }
        let step = self
            .anti_entropy
            .step(&mut self.link, &mut self.refresh, budget);
        match step.await {
            Step::Went => {}
            Step::Reconciled => self.answer_waiters(),
            Step::Failed(err) => self.go_dirty(&err),
        }
    }
}

/// Resolves when the lease's role changed (never without `ha:`, or once the lease task ended).
async fn role_changed(roles: &mut Option<watch::Receiver<Role>>) {
    match roles {
        Some(rx) => {
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

impl Writer {
    /// Follows the lease task's news: a new term takes over (after stepping down from an
    /// older one the writer may have missed), a lost lease stands by.
    fn on_role(&mut self) {
        let Some(rx) = &mut self.roles else {
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
        let from = lost_at.unwrap_or_else(std::time::Instant::now);
        self.link.first_write_due(Some(from));
        self.reconcile.take_over();
        // Redis as the previous leader left it: the watchdog starts over.
        self.watchdog.forget();
        // Late bytes of the deposed leader land within its last ttl or so: one more
        // (throttled) pass two ttls after the takeover's finds what landed after it.
        let ttl = self.link.gate().map_or(Duration::ZERO, |g| g.ttl());
        self.anti_entropy.take_over(2 * ttl);
        self.dirty = true;
        self.retry_at = Instant::now();
        tracing::info!(url = %self.link.config.target, "HA: this replica leads; reconciling Redis with its index before its first write.");
    }

    /// Stops writing at once: what is pending is dropped (the index keeps the truth and the
    /// next takeover rewrites it), pipelines in flight are abandoned, background passes end.
    fn step_down(&mut self) {
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
        self.reconcile.step_down();
        self.anti_entropy.step_down();
        self.link.enc.log.forget_due();
        self.adoption.clear();
        self.link.first_write_due(None);
        self.link.shared.dirty.store(false, Ordering::Relaxed);
        self.link.shared.healthy.store(true, Ordering::Relaxed);
        self.answer_waiters();
        tracing::info!(url = %self.link.config.target, "HA: this replica stands by; its mirror writes nothing.");
    }

    /// Stands by because the gate closed under the writer (no renewal within ttl/2): the
    /// lease task is told, so the writer writes again only after a new acquisition.
    fn lease_expired(&mut self) {
        if self.standby {
            return;
        }
        if let Some(gate) = self.link.gate() {
            gate.abandon();
        }
        self.step_down();
    }
}

async fn sleep_until(wake: Option<Instant>) {
    match wake {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

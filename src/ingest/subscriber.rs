//! One SUB socket and one task per (target, DP rank): connect loop, seq tracking, replay.
//!
//! The `zeromq` crate's own reconnect backs off to 30 s and its `connect` waits 30 s by
//! default (DESIGN.md §4), so each task owns its connect loop: a short connect timeout, a
//! fresh socket after any failure or disconnect (seen through the socket monitor), and a
//! backoff capped at [`MAX_BACKOFF`]. `recv` errors are transient.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn, Instrument};
use zeromq::{Socket, SocketEvent, SocketOptions, SocketRecv, SubSocket};

use crate::index::{Delta, DeltaSink, Index, SourceId, SourceSpec};
use crate::metrics::{ReplayFailure, ResetReason, SourceMetrics};
use crate::store::redis::MirrorSender;
use crate::wire::{decode_message, DecodeOptions, Engine, EngineBatch, SkipReason};

use super::replay_client::{self, ReplayLimits};
use super::seq::{SeqDecision, SeqTracker};
use super::stats::IngestStats;
use super::unix_now;

/// Connect timeout of one attempt.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// First backoff after a failed attempt.
pub const MIN_BACKOFF: Duration = Duration::from_millis(50);
/// Backoff cap (the crate's own goes to 30 s).
pub const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// Pause after a `recv` error, so a broken peer cannot make the loop spin.
const RECV_ERROR_PAUSE: Duration = Duration::from_millis(10);
/// Bad frames logged in full before logging thins out to one in [`LOG_EVERY`].
const LOG_FIRST: u64 = 5;
const LOG_EVERY: u64 = 1000;

/// Connection state of one DP rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LinkState {
    /// Trying to connect.
    #[default]
    Connecting,
    /// Connected and receiving.
    Connected,
    /// Lost the peer; about to reconnect.
    Disconnected,
    /// The task ended.
    Stopped,
}

impl LinkState {
    /// Lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            LinkState::Connecting => "connecting",
            LinkState::Connected => "connected",
            LinkState::Disconnected => "disconnected",
            LinkState::Stopped => "stopped",
        }
    }
}

/// Live figures of one DP rank, shared with the supervisor and the API.
#[derive(Debug, Clone, Default)]
pub struct RankStatus {
    /// Connection state.
    pub state: LinkState,
    /// Connections established so far.
    pub connects: u64,
    /// When the last message arrived.
    pub last_message: Option<Instant>,
    /// Last applied seq.
    pub last_seq: Option<u64>,
    /// Ingest counters.
    pub stats: IngestStats,
    /// Replays requested.
    pub replays_requested: u64,
    /// Replays that filled their gap.
    pub replays_succeeded: u64,
    /// Replays that failed.
    pub replays_failed: u64,
}

/// What one subscriber connects to.
#[derive(Debug, Clone)]
pub struct SubscriberSpec {
    /// Pod identifier `{pod}.{namespace}`.
    pub pod: String,
    /// Served model.
    pub model: String,
    /// Engine family.
    pub engine: Engine,
    /// DP rank.
    pub rank: u8,
    /// PUB endpoint of this rank.
    pub endpoint: String,
    /// Replay ROUTER endpoint of this rank.
    pub replay_endpoint: Option<String>,
    /// Subscription filter.
    pub topic: String,
    /// Replay timeouts.
    pub replay_limits: ReplayLimits,
    /// Lowest store time written (kthena ignores fields at or before the container start).
    pub min_store_time: u32,
}

/// Where a subscriber writes.
#[derive(Clone)]
pub struct SubscriberCtx {
    /// The index.
    pub index: Index,
    /// The Redis mirror, when one runs.
    pub mirror: Option<MirrorSender>,
    /// Shared status.
    pub status: Arc<Mutex<RankStatus>>,
    /// Stops the task.
    pub cancel: CancellationToken,
}

/// Collects deltas only when a mirror wants them.
enum Sink {
    Discard,
    Collect(Vec<Delta>),
}

impl DeltaSink for Sink {
    fn wants_mappings(&self) -> bool {
        matches!(self, Sink::Collect(_))
    }
    fn push(&mut self, delta: Delta) {
        if let Sink::Collect(v) = self {
            v.push(delta);
        }
    }
}

/// Runs one subscriber until cancelled.
pub async fn run(spec: SubscriberSpec, ctx: SubscriberCtx) {
    let span = tracing::info_span!("subscriber", pod = %spec.pod, target = %spec.endpoint, rank = spec.rank);
    run_inner(spec, ctx).instrument(span).await;
}

async fn run_inner(spec: SubscriberSpec, ctx: SubscriberCtx) {
    let source = match ctx.index.register_source(&SourceSpec {
        pod: spec.pod.clone(),
        model: spec.model.clone(),
        engine: spec.engine,
        dp_rank: spec.rank,
    }) {
        Ok(s) => s,
        Err(err) => {
            warn!(error = %err, "Cannot register the source; the subscriber stops.");
            ctx.status.lock().state = LinkState::Stopped;
            return;
        }
    };
    let mut worker = Worker {
        metrics: SourceMetrics::new(spec.engine),
        spec,
        ctx,
        source,
        tracker: SeqTracker::new(),
        bad_frames: 0,
        seen_tags: HashSet::new(),
    };
    let exit_reason = worker.connect_loop().await;
    worker.ctx.status.lock().state = LinkState::Stopped;
    let stats = worker.ctx.status.lock().stats.clone();
    info!(
        exit_reason,
        messages = stats.messages,
        batches = stats.batches,
        "Subscriber stopped."
    );
}

struct Worker {
    spec: SubscriberSpec,
    ctx: SubscriberCtx,
    source: SourceId,
    tracker: SeqTracker,
    metrics: SourceMetrics,
    bad_frames: u64,
    seen_tags: HashSet<String>,
}

impl Worker {
    async fn connect_loop(&mut self) -> &'static str {
        let mut backoff = MIN_BACKOFF;
        loop {
            if self.ctx.cancel.is_cancelled() {
                return "cancelled";
            }
            let mut options = SocketOptions::default();
            options.connect_timeout(CONNECT_TIMEOUT);
            let mut socket = SubSocket::with_options(options);
            let mut monitor = socket.monitor();
            let connected = tokio::select! {
                biased;
                _ = self.ctx.cancel.cancelled() => return "cancelled",
                r = async {
                    socket.subscribe(&self.spec.topic).await?;
                    socket.connect(&self.spec.endpoint).await
                } => r,
            };
            if let Err(err) = connected {
                debug!(error = %err, backoff_ms = backoff.as_millis() as u64, "Connect failed; retrying with a fresh socket.");
                self.ctx.status.lock().state = LinkState::Connecting;
                drop(socket);
                tokio::select! {
                    biased;
                    _ = self.ctx.cancel.cancelled() => return "cancelled",
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
            backoff = MIN_BACKOFF;
            self.tracker.reconnected();
            {
                let mut st = self.ctx.status.lock();
                st.state = LinkState::Connected;
                st.connects += 1;
            }
            self.metrics.connected();
            info!("Connected.");
            let ended = self.recv_loop(&mut socket, &mut monitor).await;
            self.metrics.disconnected();
            if let Some(reason) = ended {
                return reason;
            }
            self.ctx.status.lock().state = LinkState::Disconnected;
            info!("Disconnected; reconnecting with a fresh socket.");
        }
    }

    /// Receives until the peer goes away (`None`) or the task is cancelled.
    async fn recv_loop(
        &mut self,
        socket: &mut SubSocket,
        monitor: &mut futures::channel::mpsc::Receiver<SocketEvent>,
    ) -> Option<&'static str> {
        loop {
            tokio::select! {
                biased;
                _ = self.ctx.cancel.cancelled() => return Some("cancelled"),
                event = monitor.next() => match event {
                    Some(SocketEvent::Disconnected(_)) | Some(SocketEvent::Closed) | None => return None,
                    Some(_) => {}
                },
                message = socket.recv() => match message {
                    Ok(message) => {
                        let frames = message.into_vec();
                        self.handle(&frames).await;
                    }
                    Err(err) => {
                        debug!(error = %err, "Receive failed; treated as transient.");
                        tokio::time::sleep(RECV_ERROR_PAUSE).await;
                    }
                },
            }
        }
    }

    fn log_bad(&mut self, what: &str, reason: &'static str, seq: Option<u64>) {
        self.bad_frames += 1;
        if self.bad_frames <= LOG_FIRST || self.bad_frames.is_multiple_of(LOG_EVERY) {
            warn!(
                reason,
                seq,
                bad_frames = self.bad_frames,
                "Rejected a message: {what}."
            );
        }
    }

    async fn handle<F: AsRef<[u8]>>(&mut self, frames: &[F]) {
        let started = Instant::now();
        let mut sink = if self.ctx.mirror.is_some() {
            Sink::Collect(Vec::new())
        } else {
            Sink::Discard
        };
        {
            let mut st = self.ctx.status.lock();
            st.last_message = Some(started);
            st.stats.messages += 1;
        }
        self.metrics.message();
        match decode_message(frames, DecodeOptions::INDEX) {
            Err(err) => {
                self.metrics.decode_error(err.reason());
                *self
                    .ctx
                    .status
                    .lock()
                    .stats
                    .decode_errors
                    .entry(err.reason())
                    .or_default() += 1;
                // A readable seq was still used up: the next message is not a gap.
                if let Some(seq) = err.seq {
                    if matches!(self.tracker.observe(seq), SeqDecision::Apply) {
                        self.tracker.applied(seq);
                    }
                }
                self.log_bad(&err.to_string(), err.reason(), err.seq);
            }
            Ok((seq, batch)) => {
                self.count_batch(&batch);
                self.process(seq, &batch, &mut sink).await;
            }
        }
        self.ctx.status.lock().last_seq = self.tracker.last();
        if let (Sink::Collect(deltas), Some(mirror)) = (sink, &self.ctx.mirror) {
            if !deltas.is_empty() {
                mirror.send(deltas).await;
            }
        }
        self.metrics.pipeline(started.elapsed().as_secs_f64());
    }

    fn count_batch(&mut self, batch: &EngineBatch) {
        let mut st = self.ctx.status.lock();
        let before = (
            st.stats.block_stored_events,
            st.stats.block_removed_events,
            st.stats.all_blocks_cleared_events,
        );
        st.stats.count_batch(batch);
        let after = (
            st.stats.block_stored_events,
            st.stats.block_removed_events,
            st.stats.all_blocks_cleared_events,
        );
        drop(st);
        let mut unknown = 0;
        for skipped in &batch.skipped {
            match &skipped.reason {
                SkipReason::UnknownTag(tag) => {
                    unknown += 1;
                    if self.seen_tags.len() < 64 && self.seen_tags.insert(tag.clone()) {
                        warn!(tag = %tag, "Skipping events with an unknown tag (logged once per tag).");
                    }
                }
                SkipReason::Invalid(e) => {
                    self.metrics.invalid_event(e.reason());
                    self.log_bad(&e.to_string(), e.reason(), None);
                }
            }
        }
        self.metrics.batch(
            after.0 - before.0,
            after.1 - before.1,
            after.2 - before.2,
            unknown,
        );
    }

    async fn process(&mut self, seq: u64, batch: &EngineBatch, sink: &mut Sink) {
        match self.tracker.observe(seq) {
            SeqDecision::Apply => {}
            SeqDecision::Duplicate => {
                self.ctx.status.lock().stats.duplicates += 1;
                self.metrics.duplicate();
                return;
            }
            SeqDecision::StartedMidStream { from } => {
                self.ctx.status.lock().stats.started_mid_stream += 1;
                if self.spec.replay_endpoint.is_some() {
                    self.fill(from, seq, sink).await;
                }
            }
            SeqDecision::Gap { from, to } => {
                self.ctx.status.lock().stats.seq_gaps += 1;
                self.metrics.seq_gap();
                warn!(from, to, "Seq gap.");
                if self.spec.replay_endpoint.is_some() {
                    self.fill(from, to, sink).await;
                } else {
                    self.reset(ResetReason::NoReplayEndpoint, sink);
                }
            }
            SeqDecision::Restart => {
                self.ctx.status.lock().stats.restarts += 1;
                self.metrics.restart();
                info!(
                    seq,
                    last = self.tracker.last(),
                    "Engine restart detected; dropping the source's blocks."
                );
                self.clear(sink);
                if seq > 0 && self.spec.replay_endpoint.is_some() {
                    self.fill(0, seq, sink).await;
                }
            }
        }
        self.apply(seq, batch, sink);
    }

    fn apply(&mut self, seq: u64, batch: &EngineBatch, sink: &mut Sink) {
        let now = unix_now().max(self.spec.min_store_time);
        match self.ctx.index.apply(self.source, batch, now, sink) {
            Ok(applied) => self.ctx.status.lock().stats.apply.add(&applied),
            Err(err) => warn!(error = %err, "Index refused a batch."),
        }
        self.tracker.applied(seq);
    }

    fn clear(&mut self, sink: &mut Sink) {
        if let Err(err) = self.ctx.index.clear_source(self.source, sink) {
            warn!(error = %err, "Cannot clear the source.");
        }
        self.tracker.reset();
    }

    fn reset(&mut self, reason: ResetReason, sink: &mut Sink) {
        self.ctx.status.lock().stats.source_resets += 1;
        self.metrics.source_reset(reason);
        warn!(
            reason = reason.as_str(),
            "The source's state is unknown; reset it and rebuild from what follows."
        );
        self.clear(sink);
    }

    /// Replays `from..to` and applies it in order; on failure resets the source.
    async fn fill(&mut self, from: u64, to: u64, sink: &mut Sink) {
        let Some(endpoint) = self.spec.replay_endpoint.clone() else {
            return;
        };
        self.ctx.status.lock().replays_requested += 1;
        self.metrics.replay_requested();
        let result = tokio::select! {
            biased;
            _ = self.ctx.cancel.cancelled() => Err(ReplayFailure::Timeout),
            r = replay_client::replay(&endpoint, from, to.saturating_sub(1), self.spec.replay_limits) => r,
        };
        match result {
            Ok(batches) => {
                for replayed in batches.iter().filter(|r| r.seq < to) {
                    match decode_message(&replayed.frames, DecodeOptions::INDEX) {
                        Ok((seq, batch)) => {
                            if matches!(self.tracker.observe(seq), SeqDecision::Duplicate) {
                                self.ctx.status.lock().stats.duplicates += 1;
                                continue;
                            }
                            self.count_batch(&batch);
                            self.apply(seq, &batch, sink);
                        }
                        Err(err) => {
                            self.metrics.decode_error(err.reason());
                            self.log_bad(&err.to_string(), err.reason(), Some(replayed.seq));
                            self.tracker.applied(replayed.seq);
                        }
                    }
                }
                self.ctx.status.lock().replays_succeeded += 1;
                self.metrics.replay_succeeded();
                info!(from, to, batches = batches.len(), "Replay filled the gap.");
            }
            Err(failure) => {
                self.ctx.status.lock().replays_failed += 1;
                self.metrics.replay_failed(failure);
                warn!(
                    from,
                    to,
                    failure = failure.as_str(),
                    "Replay could not fill the gap."
                );
                self.reset(ResetReason::ReplayFailed, sink);
            }
        }
    }
}

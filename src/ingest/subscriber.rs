//! One SUB socket and one task per (target, DP rank): connect loop, recv and replay I/O.
//!
//! The `zeromq` crate's own reconnect backs off to 30 s and its `connect` waits 30 s by
//! default (docs/architecture.md §3), so each task owns its connect loop: a short connect timeout, a
//! fresh socket after any failure or disconnect (seen through the socket monitor), and a
//! backoff capped at [`MAX_BACKOFF`]. `recv` errors are transient. Everything a message
//! means (decode, seq, apply, counters, logs) is [`SourcePipeline`]'s job; this task only
//! moves bytes and runs the replays the pipeline asks for.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn, Instrument};
use zeromq::{Socket, SocketEvent, SocketOptions, SocketRecv, SubSocket};

use crate::index::{
    Checkpoint, ClearedBlocks, Delta, DeltaMirror, DeltaSink, Index, SourceId, SourceSpec,
};
use crate::metrics::SourceMetrics;
use crate::wire::Engine;

use super::failure_log::FailureLog;
use super::mirror_sink::MirrorSink;
use super::pipeline::{Observer, SourcePipeline};
use super::replay_client::{self, ReplayLimits};
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
    /// Ingest counters (replays included).
    pub stats: IngestStats,
    /// Why the last connect attempt failed, until a connection succeeds.
    pub last_error: Option<String>,
    /// Connect attempts that failed since the last success.
    pub failed_connects: u64,
    /// When the current connection was established (`None` while not connected).
    pub connected_at: Option<Instant>,
    /// A replay is filling a gap of this rank now.
    pub replaying: bool,
}

impl RankStatus {
    /// Whether this rank follows its engine with nothing to catch up: connected, no replay
    /// running, and either a message applied (with the replay it asked for) or connected
    /// for `settle` without one (an idle engine has nothing newer to tell). A rank that
    /// cannot connect does not hold anything up: no replica can follow it.
    pub fn caught_up(&self, settle: Duration) -> bool {
        if self.replaying {
            return false;
        }
        match self.state {
            LinkState::Connected => {
                self.stats.messages > 0
                    || self.connected_at.is_some_and(|at| at.elapsed() >= settle)
            }
            _ => self.failed_connects > 0,
        }
    }
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
    /// The engine run behind the target (discovered pods), compared with the run a
    /// checkpoint recorded: a different one is an engine restart while kvindex was down.
    pub run: Option<String>,
    /// Largest frame applied; larger messages are dropped and counted.
    pub max_frame_bytes: usize,
}

/// Where a subscriber writes.
#[derive(Clone)]
pub struct SubscriberCtx {
    /// The index.
    pub index: Index,
    /// The mirror (Redis in the daemon), when one runs.
    pub mirror: Option<Arc<dyn DeltaMirror>>,
    /// Shared status.
    pub status: Arc<Mutex<RankStatus>>,
    /// Stops the task.
    pub cancel: CancellationToken,
}

/// Collects deltas only when a mirror wants them.
enum Sink {
    Discard,
    Collect(MirrorSink),
}

impl DeltaSink for Sink {
    fn wants_mappings(&self) -> bool {
        matches!(self, Sink::Collect(_))
    }
    fn push(&mut self, delta: Delta) {
        if let Sink::Collect(sink) = self {
            sink.push(delta);
        }
    }
    fn takes_cleared(&self) -> bool {
        matches!(self, Sink::Collect(_))
    }
    fn push_cleared(&mut self, cleared: ClearedBlocks) {
        if let Sink::Collect(sink) = self {
            sink.push_cleared(cleared);
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
    let mut pipeline = SourcePipeline::new(source, spec.replay_endpoint.is_some())
        .with_max_frame_bytes(spec.max_frame_bytes);
    let mut observer = Observer::new(spec.engine);
    let watermark = ctx.index.take_resume_seq(source);
    // A checkpoint from another run of the engine is dropped, and with it its watermark.
    let restarted = restarted_while_away(&spec, &ctx, source, &mut observer).await;
    if let Some(seq) = watermark.filter(|_| !restarted) {
        info!(seq, "Resuming from the checkpoint's watermark.");
        pipeline.resume(seq);
    }
    let mut worker = Worker {
        failures: FailureLog::default(),
        pipeline,
        checkpointed: None,
        observer,
        metrics: SourceMetrics::new(spec.engine),
        spec,
        ctx,
    };
    let exit_reason = worker.connect_loop().await;
    worker.ctx.status.lock().state = LinkState::Stopped;
    let stats = worker.observer.stats();
    info!(
        exit_reason,
        messages = stats.messages,
        batches = stats.batches,
        "Subscriber stopped."
    );
}

/// Whether the source's inherited blocks come from another run of the engine than the one
/// the target now names (a new pod UID or container restart while kvindex was down): they
/// are dropped (index and mirror) before anything new is applied. Records the current run.
async fn restarted_while_away(
    spec: &SubscriberSpec,
    ctx: &SubscriberCtx,
    source: SourceId,
    observer: &mut Observer,
) -> bool {
    let Some(run) = &spec.run else {
        return false;
    };
    let inherited = ctx.index.source_run(source);
    // Registered by this task, so recording cannot fail.
    let _ = ctx.index.set_source_run(source, Some(run.clone()));
    if inherited.as_ref().is_none_or(|old| old == run) {
        return false;
    }
    let mut sink = MirrorSink::new();
    let _ = ctx.index.clear_source(source, &mut sink);
    observer.engine_restarted_while_away(inherited.as_deref().unwrap_or(""), run);
    if let Some(mirror) = &ctx.mirror {
        sink.hand_over(mirror.as_ref(), None).await;
    }
    true
}

struct Worker {
    failures: FailureLog,
    spec: SubscriberSpec,
    ctx: SubscriberCtx,
    pipeline: SourcePipeline,
    /// The last seq handed to the mirror as a checkpoint.
    checkpointed: Option<u64>,
    observer: Observer,
    metrics: SourceMetrics,
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
                self.connect_failed(&err.to_string(), backoff);
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
            self.pipeline.reconnected();
            {
                let mut st = self.ctx.status.lock();
                st.state = LinkState::Connected;
                st.connected_at = Some(Instant::now());
                st.connects += 1;
                st.last_error = None;
                st.failed_connects = 0;
            }
            self.metrics.connected();
            info!(failed_attempts = self.failures.connected(), "Connected.");
            let ended = self.recv_loop(&mut socket, &mut monitor).await;
            self.metrics.disconnected();
            if let Some(reason) = ended {
                return reason;
            }
            {
                let mut st = self.ctx.status.lock();
                st.state = LinkState::Disconnected;
                st.connected_at = None;
            }
            info!("Disconnected; reconnecting with a fresh socket.");
        }
    }

    /// Records a failed connect: the rank's state and last error, a WARN line for the first
    /// failure of a streak (then at most one per [`super::WARN_EVERY`]), DEBUG otherwise.
    fn connect_failed(&mut self, reason: &str, backoff: Duration) {
        {
            let mut st = self.ctx.status.lock();
            st.state = LinkState::Connecting;
            st.last_error = Some(reason.to_owned());
            st.failed_connects += 1;
        }
        let backoff_ms = backoff.as_millis() as u64;
        match self.failures.failed(Instant::now()) {
            Some(failures) => warn!(
                reason,
                failures,
                "Cannot connect to the target; retrying every {} ms at most (logged again in {} s if it goes on).",
                MAX_BACKOFF.as_millis(),
                super::WARN_EVERY.as_secs()
            ),
            None => debug!(reason, backoff_ms, "Connect failed; retrying with a fresh socket."),
        }
    }

    /// Receives until the peer goes away (`None`) or the task is cancelled.
    async fn recv_loop(
        &mut self,
        socket: &mut SubSocket,
        monitor: &mut futures::channel::mpsc::Receiver<SocketEvent>,
    ) -> Option<&'static str> {
        // One wait for the whole loop: a fresh one per message would register and drop a
        // waiter on the token each time.
        let cancelled = self.ctx.cancel.clone().cancelled_owned();
        tokio::pin!(cancelled);
        loop {
            tokio::select! {
                biased;
                _ = &mut cancelled => return Some("cancelled"),
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

    /// The store time of what is applied now: never at or before the engine's start second.
    fn store_time(&self) -> u32 {
        unix_now().max(self.spec.min_store_time)
    }

    /// One message through the pipeline, the replay it asks for, then status and mirror.
    async fn handle<F: AsRef<[u8]>>(&mut self, frames: &[F]) {
        let started = Instant::now();
        self.ctx.status.lock().last_message = Some(started);
        let mut sink = if self.ctx.mirror.is_some() {
            Sink::Collect(MirrorSink::new())
        } else {
            Sink::Discard
        };
        let index = &self.ctx.index;
        let offered = self.pipeline.offer(
            index,
            frames,
            self.store_time(),
            &mut sink,
            &mut self.observer,
        );
        if let Err(err) = offered {
            warn!(error = %err, "Index refused a batch.");
        }
        if let (Some((from, to)), Some(endpoint)) =
            (self.pipeline.pending_replay(), &self.spec.replay_endpoint)
        {
            let need_through = to.saturating_sub(1);
            let limits = self.spec.replay_limits;
            self.ctx.status.lock().replaying = true;
            let replayed = replay_client::replay_or_cancel(
                endpoint,
                from,
                need_through,
                limits,
                &self.ctx.cancel,
            )
            .await;
            let filled = self.pipeline.fill(
                index,
                replayed,
                self.store_time(),
                &mut sink,
                &mut self.observer,
            );
            if let Err(err) = filled {
                warn!(error = %err, "Index refused a replayed batch.");
            }
        }
        {
            let mut st = self.ctx.status.lock();
            st.replaying = false;
            st.last_seq = self.pipeline.last_seq();
            st.stats.clone_from(self.observer.stats());
        }
        if let (Sink::Collect(deltas), Some(mirror)) = (sink, &self.ctx.mirror) {
            // The checkpoint rides with the last chunk of the deltas it covers, so the mirror
            // writes it after all of them.
            let seq = self.pipeline.last_seq();
            let checkpoint = seq
                .filter(|_| seq != self.checkpointed)
                .map(|seq| Checkpoint {
                    source: self.pipeline.source(),
                    seq,
                });
            if !deltas.is_empty() || checkpoint.is_some() {
                self.checkpointed = seq;
                deltas.hand_over(mirror.as_ref(), checkpoint).await;
            }
        }
        self.metrics.pipeline(started.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_is_caught_up_once_it_applied_a_message_or_sat_idle_and_never_in_a_replay() {
        let settle = Duration::from_secs(1);
        let mut rank = RankStatus::default();
        assert!(!rank.caught_up(settle), "connecting for the first time");
        rank.failed_connects = 1;
        assert!(
            rank.caught_up(settle),
            "an engine nobody can follow holds nothing up"
        );
        rank.state = LinkState::Connected;
        rank.failed_connects = 0;
        rank.connected_at = Some(Instant::now());
        assert!(!rank.caught_up(settle), "just connected, nothing applied");
        rank.stats.messages = 1;
        assert!(rank.caught_up(settle));
        rank.replaying = true;
        assert!(!rank.caught_up(settle), "a replay is filling a gap");
        rank.replaying = false;
        rank.stats.messages = 0;
        rank.connected_at = Instant::now().checked_sub(settle);
        assert!(rank.caught_up(settle), "idle for the settle time");
    }
}

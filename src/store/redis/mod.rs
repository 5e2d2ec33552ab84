//! The Redis mirror of the index in kthena's exact layout (docs/architecture.md §6).
//!
//! | file | job |
//! | --- | --- |
//! | `mod.rs` | the public surface: [`MirrorHandle`], [`MirrorSender`], [`MirrorStats`] |
//! | `writer.rs` | the writer task: the loop that coalesces, flushes, handles outages and the lease, and owns the roles below |
//! | `reconcile.rs` | role: the outage record, and bringing Redis back in line with the index after an outage |
//! | `anti_entropy/` | role: the rewrite and verify passes (`scan.rs`: the SCAN phase) |
//! | `refresh.rs` | role: rewriting fields before kthena's GC would drop them, on the passes' walk |
//! | `watchdog.rs` | role: noticing a Redis restart or FLUSHALL while idle (`run_id`, sentinel key) |
//! | `adopt.rs` | role: removes of unknown engine hashes resolved through Redis's mapping keys |
//! | `compact.rs` | role: the checkpoint log's compaction, a snapshot of a state key before its older fields go |
//! | `link.rs` | what the roles work through: the connection, the index, the encoder, the watermarks |
//! | `encode.rs` | deltas as Redis commands, values read from the index at flush time |
//! | `log.rs` | the checkpoint log's generation and stamps, and which state keys are due for compaction |
//! | `marks.rs` | the checkpoint's watermarks, written behind the data they cover |
//! | `inflight.rs` | several flushes in flight, each a pipeline per lane, in order on each lane's connection; the write-latency histogram |
//! | `key.rs` | which field or key a delta writes (the coalescing key) |
//! | `shared.rs` | the queue's messages and the figures shared with the handle |
//! | `connect.rs` | opening and checking the mirror's connections |
//! | `checkpoint/` | kvindex's own `kvindex:` keys: watermarks and engine-block state for warm starts (`segment.rs`: the state keys' log) |
//! | `lease.rs` | high availability: the per-shard lease that lets one replica write, [`lease::LeaseGate`] |
//! | `dump.rs` | kvindex's keys in a canonical sorted form (`kvindex redis-dump`) |
//! | `config.rs`, `error.rs`, `labels.rs` | at the bottom: [`RedisConfig`], [`MirrorError`], the metric label values |
//! | `tests.rs` | unit tests of coalescing |
//!
//! Files import downwards only, in the order of this table (docs/architecture.md, the Redis
//! writer).
//!
//! Key and value spellings and URL redaction live in `src/redis_layout.rs`, shared with the
//! Redis scoring backend; the connection ([`RedisConn`]: a single Redis or a Redis Cluster,
//! pipelines split per master) in `src/redis_conn.rs`.
//!
//! The index is the truth. Deltas flow one way into a bounded queue; the writer coalesces
//! them per flush (last write of a field or mapping key wins, so writes to one key stay in
//! order) and sends one pipeline per lane, with a few flushes in flight (`redis.connections`
//! lanes to a single Redis, each key always on the same lane and each lane answered in order;
//! `inflight.rs` explains why a key's writes can never be reordered). When Redis fails, the
//! writer keeps draining the queue (ingest never stops), records which keys it could not
//! write (at most a cap; past it, a full pass), and on reconnect rewrites everything the
//! index holds and deletes the recorded keys the index no longer holds, in chunks between
//! flushes. A rate-bounded anti-entropy pass compares Redis with the index (SCANning
//! kthena's key prefixes), the refresh rewrites fields before kthena's GC would drop them,
//! and a watchdog notices a Redis restart or FLUSHALL.
//!
//! Value format: `tiered` writes `"{ts}|{MEDIUM}"`; kthena routers that predate tier support
//! parse the value as an integer and keep an unparsable one fresh forever (never garbage
//! collected), so operators of such routers must choose `timestamp` (bare `"{ts}"`).

mod adopt;
mod anti_entropy;
pub mod checkpoint;
mod compact;
mod connect;
mod dump;
mod encode;
mod error;
mod inflight;
mod key;
pub mod labels;
pub mod lease;
mod link;
mod log;
mod marks;
mod reconcile;
mod refresh;
mod shared;
#[cfg(test)]
mod tests;
mod watchdog;
mod writer;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::task::JoinHandle;

use crate::index::{Checkpoint, Delta, DeltaChunk, Index};
use crate::medium::TierWeights;
pub use crate::redis_conn::{RedisConn, RedisTarget};
pub use error::MirrorError;

/// kthena's Redis layout (keys, field values), shared with `score`'s Redis reads.
pub use crate::redis_layout::{
    block_key, field_value, mapping_key, parse_field_value, ValueFormat,
};
// The mirror's settings are vocabulary `config` fills in, so they sit below both.
pub use crate::settings::redis::RedisConfig;
pub use dump::{dump, dump_target, MappingEntry, RedisDump};
use shared::{Msg, Shared};
use writer::Writer;

/// Figures of a running mirror.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct MirrorStats {
    /// Redis commands written.
    pub commands: u64,
    /// Pipelines sent.
    pub pipelines: u64,
    /// Flush latency p50, microseconds.
    pub flush_p50_us: u64,
    /// Flush latency p99, microseconds.
    pub flush_p99_us: u64,
    /// Write latency p50 over every message since start: from ingest handing its deltas
    /// over to Redis answering the pipeline that wrote them, microseconds.
    pub write_p50_us: u64,
    /// Write latency p99, likewise.
    pub write_p99_us: u64,
    /// The most pipelines that were in flight at once.
    pub in_flight_peak: u64,
    /// Delta batches waiting in the queue.
    pub queue_depth: usize,
    /// Redis unreachable: writes are pending a reconcile.
    pub dirty: bool,
    /// A reconcile is running.
    pub reconciling: bool,
    /// Reconciles completed (the start-up one included).
    pub reconciles: u64,
    /// Removes of unknown engine hashes resolved through Redis's mapping keys.
    pub adopted_removes: u64,
    /// Anti-entropy repairs that deleted a field or mapping key the index does not hold.
    pub repairs_deleted: u64,
    /// Keys anti-entropy found the index no longer holds, waiting out a grace period (a
    /// delete may still be on its way from ingest) before they are checked again.
    pub repair_suspects: u64,
    /// Anti-entropy repairs that wrote a missing or different field or mapping key.
    pub repairs_written: u64,
    /// Fields rewritten with the current time before kthena's GC would drop them.
    pub refreshed: u64,
    /// Redis restarts or flushes noticed by the watchdog.
    pub redis_resets: u64,
    /// Anti-entropy passes completed.
    pub anti_entropy_passes: u64,
    /// Commands sent by the background passes (reconcile, anti-entropy, refresh).
    pub background_commands: u64,
}

/// A cloneable handle for ingest tasks to send deltas through.
#[derive(Debug, Clone)]
pub struct MirrorSender {
    tx: mpsc::Sender<Msg>,
    /// Deltas queued and not yet taken by the writer ([`MAX_QUEUED_DELTAS`]).
    room: Arc<Semaphore>,
}

/// Deltas (or cleared blocks) the queue holds at most, whatever the number of chunks: the
/// queue's bound in memory, where `queue_capacity` bounds chunks (a queue of full messages
/// could otherwise hold more deltas than the index holds blocks when Redis is the slower
/// side). A chunk larger than this enters alone.
pub const MAX_QUEUED_DELTAS: usize = 65_536;

/// The room `chunk` takes in the queue: its deltas (a clear's blocks, which hold less than a
/// delta each), at most the whole queue.
fn weight(chunk: &DeltaChunk) -> u32 {
    chunk.len().clamp(1, MAX_QUEUED_DELTAS) as u32
}

impl MirrorSender {
    /// Queues one batch of deltas and the checkpoint that covers them; waits when the queue
    /// is full (backpressure).
    pub async fn send(&self, deltas: Vec<Delta>, checkpoint: Option<Checkpoint>) {
        self.send_chunk(DeltaChunk::Deltas(deltas), checkpoint)
            .await;
    }

    /// Queues one chunk (deltas, or a clear's blocks whole) and the checkpoint that covers
    /// it and every chunk before it; waits when the queue is full (backpressure).
    pub async fn send_chunk(&self, chunk: DeltaChunk, checkpoint: Option<Checkpoint>) {
        if chunk.is_empty() && checkpoint.is_none() {
            return;
        }
        // Stamped before the wait, so time spent held back by a full queue counts.
        let handed = std::time::Instant::now();
        // Room first, then a slot: the room is given back once the writer has absorbed the
        // chunk, so what waits in the queue stays bounded in deltas too.
        let Ok(room) = self.room.clone().acquire_many_owned(weight(&chunk)).await else {
            tracing::debug!("Dropped deltas: the Redis mirror has stopped.");
            return;
        };
        let msg = Msg::Deltas(chunk, checkpoint, handed, room);
        if self.tx.send(msg).await.is_err() {
            tracing::debug!("Dropped deltas: the Redis mirror has stopped.");
        }
    }
}

impl crate::index::DeltaMirror for MirrorSender {
    fn queue(
        &self,
        chunk: DeltaChunk,
        checkpoint: Option<Checkpoint>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        Box::pin(self.send_chunk(chunk, checkpoint))
    }
}

/// How [`MirrorHandle::shutdown`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MirrorStop {
    /// The writer wrote everything queued before the call and exited on its own.
    Orderly,
    /// The deadline passed first: the writer was aborted with writes outstanding.
    DeadlinePassed,
    /// The writer task had already ended without a shutdown (it panicked).
    WriterLost,
    /// An earlier call already stopped the writer.
    AlreadyStopped,
}

/// The running mirror task. Every method takes `&self`, so any holder of a shared handle
/// (the daemon, its health routes, its gauge task) can flush or stop it.
#[derive(Debug)]
pub struct MirrorHandle {
    tx: mpsc::Sender<Msg>,
    room: Arc<Semaphore>,
    shared: Arc<Shared>,
    /// Taken by the first [`MirrorHandle::shutdown`]; a std lock, held only to take it.
    task: Mutex<Option<JoinHandle<()>>>,
    url: String,
    restored: Option<checkpoint::RestoreSummary>,
}

impl MirrorHandle {
    /// Connects (failing fast on a bad URL or failed auth), rebuilds the index from the
    /// checkpoint when `config.checkpoint` is on, and starts the writer task. The writer
    /// first reconciles Redis with whatever the index then holds.
    ///
    /// # Errors
    /// [`MirrorError`] naming the URL without its password.
    pub async fn start(
        config: RedisConfig,
        index: Index,
        weights: TierWeights,
    ) -> Result<MirrorHandle, MirrorError> {
        MirrorHandle::start_behind(config, index, weights, None).await
    }

    /// [`MirrorHandle::start`], with `lease` (`ha:`): the writer starts as a standby and
    /// writes only while this replica holds the lease, after a full reconcile.
    ///
    /// # Errors
    /// [`MirrorError`] naming the URL without its password.
    pub async fn start_behind(
        config: RedisConfig,
        index: Index,
        weights: TierWeights,
        lease: Option<Arc<lease::LeaseGate>>,
    ) -> Result<MirrorHandle, MirrorError> {
        let shared = Arc::new(Shared::default());
        labels::register_upkeep_series();
        let (mut conn, more) = connect::connect_lanes(&config.target, config.connections).await?;
        let (restored, marks) = if config.checkpoint {
            let (summary, marks) =
                checkpoint::restore(&mut conn, &config.target, &index, config.shard).await?;
            (Some(summary), marks)
        } else {
            (None, Vec::new())
        };
        let (tx, rx) = mpsc::channel(config.queue_capacity.max(1));
        let url = config.target.shown();
        let lanes = (conn, more);
        let mut writer = Writer::new(config, index, weights, lanes, Arc::clone(&shared));
        writer.seed_marks(marks);
        if let Some(gate) = lease {
            writer.behind_lease(gate);
        }
        let task = tokio::spawn(writer.run(rx));
        Ok(MirrorHandle {
            tx,
            room: Arc::new(Semaphore::new(MAX_QUEUED_DELTAS)),
            shared,
            task: Mutex::new(Some(task)),
            url,
            restored,
        })
    }

    /// What the warm start rebuilt from the checkpoint (`None` without `checkpoint`).
    pub fn restored(&self) -> Option<&checkpoint::RestoreSummary> {
        self.restored.as_ref()
    }

    /// A sender for ingest tasks.
    pub fn sender(&self) -> MirrorSender {
        MirrorSender {
            tx: self.tx.clone(),
            room: Arc::clone(&self.room),
        }
    }

    /// Waits until every delta sent before this call is written to Redis (during an outage:
    /// until Redis is back and reconciled).
    ///
    /// # Errors
    /// [`MirrorError::Stopped`] when the writer task is gone.
    pub async fn flush(&self) -> Result<(), MirrorError> {
        let stopped = || MirrorError::Stopped {
            url: self.url.clone(),
        };
        let (done, wait) = oneshot::channel();
        self.tx
            .send(Msg::Flush(done))
            .await
            .map_err(|_| stopped())?;
        wait.await.map_err(|_| stopped())
    }

    /// Current figures.
    pub fn stats(&self) -> MirrorStats {
        let s = &self.shared;
        let (p50, p99) = s.latency_percentiles();
        MirrorStats {
            commands: s.commands.load(Ordering::Relaxed),
            pipelines: s.pipelines.load(Ordering::Relaxed),
            flush_p50_us: p50,
            flush_p99_us: p99,
            write_p50_us: s.write_latency.quantile(0.50),
            write_p99_us: s.write_latency.quantile(0.99),
            in_flight_peak: s.in_flight_peak.load(Ordering::Relaxed),
            queue_depth: self.tx.max_capacity() - self.tx.capacity(),
            dirty: s.dirty.load(Ordering::Relaxed),
            reconciling: s.reconciling.load(Ordering::Relaxed),
            reconciles: s.reconciles.load(Ordering::Relaxed),
            adopted_removes: s.upkeep.adopted_removes.load(Ordering::Relaxed),
            repairs_deleted: s.upkeep.repairs_deleted.load(Ordering::Relaxed),
            repair_suspects: s.upkeep.suspects.load(Ordering::Relaxed),
            repairs_written: s.upkeep.repairs_written.load(Ordering::Relaxed),
            refreshed: s.upkeep.refreshed.load(Ordering::Relaxed),
            redis_resets: s.upkeep.redis_resets.load(Ordering::Relaxed),
            anti_entropy_passes: s.upkeep.passes.load(Ordering::Relaxed),
            background_commands: s.upkeep.background_commands.load(Ordering::Relaxed),
        }
    }

    /// Whether Redis answered the last write or ping.
    pub fn is_healthy(&self) -> bool {
        self.shared.healthy.load(Ordering::Relaxed)
    }

    /// Writes what is queued (bounded by `deadline`) and stops the writer, through a shared
    /// reference: other holders keep a handle whose [`flush`](Self::flush) then reports
    /// [`MirrorError::Stopped`]. Only the first call stops the writer; later ones return
    /// [`MirrorStop::AlreadyStopped`] at once.
    pub async fn shutdown(&self, deadline: Duration) -> MirrorStop {
        let Some(task) = self.task.lock().take() else {
            return MirrorStop::AlreadyStopped;
        };
        let abort = task.abort_handle();
        let drain = async {
            let (done, answered) = oneshot::channel();
            let asked = self.tx.send(Msg::Shutdown(done)).await.is_ok();
            let drained = asked && answered.await.is_ok();
            let exited = task.await.is_ok();
            drained && exited
        };
        let stop = match tokio::time::timeout(deadline, drain).await {
            Ok(true) => MirrorStop::Orderly,
            Ok(false) => MirrorStop::WriterLost,
            Err(_) => {
                abort.abort();
                MirrorStop::DeadlinePassed
            }
        };
        self.log_stop(stop, deadline);
        stop
    }

    fn log_stop(&self, stop: MirrorStop, deadline: Duration) {
        let deadline_ms = deadline.as_millis() as u64;
        match stop {
            MirrorStop::Orderly => {
                tracing::info!(url = %self.url, "Stopped the Redis mirror after writing everything queued.");
            }
            MirrorStop::DeadlinePassed => {
                tracing::warn!(url = %self.url, deadline_ms, "Stopped the Redis mirror before it had written everything: the drain deadline passed.");
            }
            MirrorStop::WriterLost => {
                tracing::error!(url = %self.url, "The Redis mirror's writer had ended before shutdown; queued writes are lost.");
            }
            MirrorStop::AlreadyStopped => {}
        }
    }
}

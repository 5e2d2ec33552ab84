//! What the writer and the handle share: the queue's messages ([`Msg`]) and the figures the
//! writer keeps for [`super::MirrorStats`] ([`Shared`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::oneshot;

use super::inflight::LatencyHistogram;
use super::labels::RepairDirection;
use crate::index::{Checkpoint, DeltaChunk};

/// Flush latencies kept for the percentiles.
const LATENCY_SAMPLES: usize = 4096;

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
    /// Counters of the background roles: passes, refresh, watchdog, adoption.
    pub(super) upkeep: UpkeepStats,
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
    pub(super) fn record_latency(&self, took: Duration) {
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

/// Counters of the background roles, shared with the handle for [`super::MirrorStats`].
#[derive(Debug, Default)]
pub(super) struct UpkeepStats {
    pub(super) adopted_removes: AtomicU64,
    pub(super) repairs_deleted: AtomicU64,
    pub(super) repairs_written: AtomicU64,
    /// Keys of the current pass waiting out their grace period before deletion.
    pub(super) suspects: AtomicU64,
    pub(super) refreshed: AtomicU64,
    pub(super) redis_resets: AtomicU64,
    pub(super) passes: AtomicU64,
    pub(super) background_commands: AtomicU64,
}

impl UpkeepStats {
    /// Counts one anti-entropy repair, here and in the metrics.
    pub(super) fn repaired(&self, direction: RepairDirection) {
        let counter = match direction {
            RepairDirection::Deleted => &self.repairs_deleted,
            RepairDirection::Written => &self.repairs_written,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        crate::metrics::anti_entropy_repair(direction.as_str());
    }
}

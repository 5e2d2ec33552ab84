//! Flushes in flight: up to [`MAX_IN_FLIGHT`] flushes on the wire at once, each one pipeline
//! per lane (the writer's connections; every key always on the same lane), answered in the
//! order they were sent. While Redis executes one flush the writer coalesces and encodes the
//! next, so neither side waits for the other's round trip.
//!
//! Why the order of writes per key holds (a store and a later remove of one field must never
//! be reordered):
//! 1. Every command's value is read from the index when its pipeline is built, so of two
//!    pipelines that write one key, the later one carries the index's later state; Redis
//!    ends right when it executes them in the order they were built.
//! 2. A key's lane depends on the key alone, so every write of one key goes through one
//!    connection. The writer builds flushes one after the other in its single task and hands
//!    each lane's pipeline to that lane's connection before building the next:
//!    [`InFlight::submit`] polls each send once before it returns, and that first poll queues
//!    the encoded pipeline on the multiplexed connection's request channel (a FIFO; when it
//!    is full, waiting senders are served in arrival order). The connection writes its
//!    requests to one socket in that order, and Redis executes one connection's commands in
//!    the order they arrive. Lanes need no order between them: they never share a key.
//! 3. The one way around 2. is a reconnect: pipelines submitted while the connection manager
//!    replaces a broken connection may reach the new connection in any order. A reconnect
//!    follows a failed request, so once a lane's pipeline fails, every key that lane carried
//!    in that flush and in every later one still in flight counts as possibly wrong, whatever
//!    its answer, and the reconcile rewrites each from the index. The other lanes' pipelines
//!    are still answered in order on their own connections; their keys count as written only
//!    if their own answers say so. Nothing is sent (but a PING on every lane) until every
//!    flush in flight is answered and the reconcile starts.
//! 4. Background passes and adopted removes wait until nothing is in flight before they read
//!    Redis or write, as they did when each flush was awaited.
//!
//! Watermarks (the checkpoint) must never run ahead of the data they cover, even across a
//! reconnect as in 3. So a flush only records which sources' seqs it completes; once every
//! lane of that flush (and, by the order of replies, every earlier flush) is answered, the
//! watermarks are confirmed and written by a later flush, always on lane 0 (so the writes of
//! the one watermark hash keep their order too).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;
use std::time::Instant;

use futures::future::{join_all, BoxFuture};
use futures::stream::{FuturesOrdered, StreamExt};
use futures::FutureExt;
use redis::aio::ConnectionLike;
use redis::{Pipeline, RedisError, Value};

use super::key::Key;
use crate::index::{PodId, SourceId};

/// Flushes on the wire at most: enough to keep Redis busy while the next one is encoded.
pub(super) const MAX_IN_FLIGHT: usize = 4;

/// A source's watermark as of one flush: `(pod, rank)`, its source id and seq.
pub(super) type MarkAt = ((PodId, u8), SourceId, u64);

/// What one flush in flight carries besides its commands.
#[derive(Default)]
pub(super) struct Batch {
    /// Keys it writes, per lane: recorded as possibly wrong if their lane fails.
    pub(super) keys: Vec<Vec<Key>>,
    /// Watermarks whose data this pipeline completes (confirmed once it is answered).
    pub(super) covers: Vec<MarkAt>,
    /// Sources whose confirmed watermark it writes (unwritten again if it fails).
    pub(super) marks: Vec<(PodId, u8)>,
    /// When ingest handed over each message this pipeline completes.
    pub(super) stamps: Vec<Instant>,
    /// Commands in the flush.
    pub(super) commands: usize,
    /// Pipelines in the flush (one per lane with commands).
    pub(super) pipelines: usize,
    /// When it was handed to the connection.
    pub(super) sent: Option<Instant>,
}

/// One lane's answer to its pipeline, and the pipeline back for reuse.
type LaneReply = (usize, Result<(), RedisError>, Pipeline);

/// A flush whose answer says that some of its lanes failed.
#[derive(Debug)]
pub(super) struct Failure {
    /// The lanes whose pipeline failed.
    pub(super) lanes: Vec<usize>,
    /// The first of their errors.
    pub(super) error: RedisError,
}

/// The flushes in flight, oldest first.
#[derive(Default)]
pub(super) struct InFlight {
    sends: FuturesOrdered<BoxFuture<'static, Vec<LaneReply>>>,
    batches: VecDeque<Batch>,
    /// Answered pipelines, cleared, so their command vectors are reused.
    spare: Vec<Pipeline>,
}

impl InFlight {
    /// Flushes in flight.
    pub(super) fn len(&self) -> usize {
        self.batches.len()
    }

    /// Whether nothing is in flight.
    pub(super) fn is_empty(&self) -> bool {
        self.batches.is_empty()
    }

    /// A cleared pipeline to fill, reusing an answered one's allocation when there is one.
    pub(super) fn pipeline(&mut self) -> Pipeline {
        self.spare.pop().unwrap_or_default()
    }

    /// Keeps a pipeline that was not sent for reuse.
    pub(super) fn spare(&mut self, mut pipe: Pipeline) {
        pipe.clear();
        if self.spare.len() < SPARE_PIPELINES {
            self.spare.push(pipe);
        }
    }

    /// The newest batch in flight, to which a flush without commands hands its watermarks
    /// and stamps (its data is all in earlier pipelines).
    pub(super) fn newest(&mut self) -> Option<&mut Batch> {
        self.batches.back_mut()
    }

    /// Hands each lane's pipeline to a clone of that lane's connection and returns once all
    /// are queued on their connections (see the module header: the first poll queues a
    /// pipeline, which keeps each lane's pipelines in build order).
    pub(super) async fn submit<C>(&mut self, parts: Vec<(usize, C, Pipeline)>, mut batch: Batch)
    where
        C: ConnectionLike + Send + 'static,
    {
        let mut sends = Vec::with_capacity(parts.len());
        for (lane, mut conn, pipe) in parts {
            let mut send: BoxFuture<'static, LaneReply> = Box::pin(async move {
                let result = write(&mut conn, &pipe).await;
                (lane, result, pipe)
            });
            let first = std::future::poll_fn(|cx| Poll::Ready(send.as_mut().poll(cx))).await;
            match first {
                Poll::Ready(reply) => sends.push(futures::future::ready(reply).boxed()),
                Poll::Pending => sends.push(send),
            }
        }
        batch.sent = Some(Instant::now());
        self.sends.push_back(join_all(sends).boxed());
        self.batches.push_back(batch);
    }

    /// The oldest flush's answer, once every lane of it is answered (never resolves while
    /// nothing is in flight, so it can sit in a `select!`).
    pub(super) async fn next(&mut self) -> (Result<(), Failure>, Batch) {
        let Some(replies) = self.sends.next().await else {
            return std::future::pending().await;
        };
        let mut failure: Option<Failure> = None;
        for (lane, result, pipe) in replies {
            self.spare(pipe);
            if let Err(error) = result {
                match &mut failure {
                    Some(f) => f.lanes.push(lane),
                    None => {
                        failure = Some(Failure {
                            lanes: vec![lane],
                            error,
                        })
                    }
                }
            }
        }
        // One batch per send, pushed together: the queue cannot be empty here.
        let batch = self.batches.pop_front().unwrap_or_default();
        (failure.map_or(Ok(()), Err), batch)
    }

    /// Drops every flush in flight (their writes may or may not land) and returns their
    /// batches, oldest first.
    pub(super) fn abandon(&mut self) -> Vec<Batch> {
        self.sends = FuturesOrdered::new();
        self.batches.drain(..).collect()
    }
}

/// Answered pipelines kept for reuse at most.
const SPARE_PIPELINES: usize = 2 * MAX_IN_FLIGHT;

/// Sends one pipeline and checks every reply (a pipeline's errors come back as values).
async fn write<C: ConnectionLike>(conn: &mut C, pipe: &Pipeline) -> Result<(), RedisError> {
    let values = conn.req_packed_commands(pipe, 0, pipe.len()).await?;
    for value in values {
        if let Value::ServerError(err) = value {
            return Err(err.into());
        }
    }
    Ok(())
}

/// Sub-buckets per power of two of [`LatencyHistogram`]: its resolution.
const SUB_BUCKETS: u64 = 8;
/// Values below this are their own bucket.
const LINEAR: u64 = 2 * SUB_BUCKETS;
/// Powers of two covered above [`LINEAR`]: far past any latency worth telling apart.
const POWERS: u64 = 37;
/// Buckets of [`LatencyHistogram`].
const BUCKETS: usize = (LINEAR + POWERS * SUB_BUCKETS) as usize;

/// A lock-free log-linear histogram of microseconds, for percentiles over every event
/// rather than over a ring of recent samples.
pub(super) struct LatencyHistogram {
    counts: Box<[AtomicU64]>,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram {
            counts: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl std::fmt::Debug for LatencyHistogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LatencyHistogram").finish_non_exhaustive()
    }
}

fn bucket_of(us: u64) -> usize {
    if us < LINEAR {
        return us as usize;
    }
    let top = u64::from(63 - us.leading_zeros()).min(LINEAR.trailing_zeros() as u64 + POWERS - 1);
    let shift = top - SUB_BUCKETS.trailing_zeros() as u64;
    let sub = (us >> shift).min(2 * SUB_BUCKETS - 1) - SUB_BUCKETS;
    (LINEAR + (top - LINEAR.trailing_zeros() as u64) * SUB_BUCKETS + sub) as usize
}

/// The largest value of bucket `i` (percentiles err on the high side).
fn bucket_max(i: usize) -> u64 {
    let i = i as u64;
    if i < LINEAR {
        return i;
    }
    let power = (i - LINEAR) / SUB_BUCKETS + u64::from(LINEAR.trailing_zeros());
    let sub = (i - LINEAR) % SUB_BUCKETS;
    let shift = power - u64::from(SUB_BUCKETS.trailing_zeros());
    ((SUB_BUCKETS + sub + 1) << shift) - 1
}

impl LatencyHistogram {
    /// Counts one latency.
    pub(super) fn record(&self, us: u64) {
        self.counts[bucket_of(us)].fetch_add(1, Ordering::Relaxed);
    }

    /// The `q` quantile (0–1) in microseconds, 0 when empty.
    pub(super) fn quantile(&self, q: f64) -> u64 {
        let counts: Vec<u64> = self
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return 0;
        }
        let rank = ((total as f64 * q).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (i, c) in counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return bucket_max(i);
            }
        }
        bucket_max(BUCKETS - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_falls_in_a_bucket_whose_bound_covers_it_within_an_eighth() {
        for us in (0..100_000u64).chain([1 << 20, (1 << 30) + 12_345, u64::MAX]) {
            let i = bucket_of(us);
            assert!(i < BUCKETS, "{us}");
            let max = bucket_max(i);
            if us < 1 << 40 {
                assert!(max >= us, "{us} -> {max}");
                assert!(max - us <= us / SUB_BUCKETS + 1, "{us} -> {max}");
            }
        }
    }

    #[test]
    fn quantiles_come_from_every_recorded_value() {
        let h = LatencyHistogram::default();
        for us in 1..=1000 {
            h.record(us);
        }
        let p50 = h.quantile(0.5);
        let p99 = h.quantile(0.99);
        assert!((500..=560).contains(&p50), "{p50}");
        assert!((990..=1060).contains(&p99), "{p99}");
        assert_eq!(LatencyHistogram::default().quantile(0.99), 0);
    }
}

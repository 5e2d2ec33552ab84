//! The one path from frames to the index for a source: decode → seq tracking → apply.
//!
//! [`SourcePipeline`] is pure and synchronous, so offline replay, `score --replay`, tests and
//! the live subscriber all run the same step. When a gap can be filled by replay, the step
//! keeps the batch aside and [`SourcePipeline::pending_replay`] names the missing seqs; the
//! socket task fetches them (the only I/O) and hands the result to
//! [`SourcePipeline::fill`]. Every happening goes through one `observe` call that updates
//! the summary counters, the Prometheus counter and the log line together, so the three
//! cannot disagree.

use std::collections::HashSet;
use std::fmt::Display;

use tracing::{debug, info, warn};

use crate::index::{ApplyStats, DeltaSink, Index, IndexError, SourceId};
use crate::metrics::{SourceMetrics, WarmStart};
use crate::settings::target::DEFAULT_MAX_FRAME_BYTES;
use crate::wire::{decode_message, DecodeOptions, Engine, EngineBatch, MessageError, SkipReason};

use super::replay_client::{ReplayError, Replayed};
use super::seq::{SeqDecision, SeqTracker};
use super::stats::IngestStats;

/// Bad messages logged in full before logging thins out to one in [`LOG_EVERY`].
const LOG_FIRST: u64 = 5;
const LOG_EVERY: u64 = 1000;
/// Distinct unknown tags logged (once each) before the rest are only counted.
const MAX_LOGGED_TAGS: usize = 64;
/// The `reason` label of a message with a frame over the cap.
const FRAME_TOO_LARGE: &str = "frame_too_large";
/// The `reason` label of stores dropped past the per-source model cap.
const TOO_MANY_MODELS: &str = "too_many_models";

/// Why a source was reset (its state became unknown).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetReason {
    /// A gap and no replay endpoint.
    NoReplayEndpoint,
    /// A replay that could not fill the gap.
    ReplayFailed,
}

impl ResetReason {
    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ResetReason::NoReplayEndpoint => "no_replay_endpoint",
            ResetReason::ReplayFailed => "replay_failed",
        }
    }
}

/// What became of one message.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Next in order: applied.
    Applied {
        /// The message's seq.
        seq: u64,
    },
    /// Already applied (a replay overlap): dropped.
    Duplicate {
        /// The message's seq.
        seq: u64,
    },
    /// Seqs `from..to` were missing. Without replay the source was reset and the batch
    /// applied; with replay the batch waits for [`SourcePipeline::fill`].
    Gap {
        /// First missing seq.
        from: u64,
        /// The seq that arrived.
        to: u64,
    },
    /// The seq went back: the engine restarted, the source was cleared (and, with replay
    /// and `seq > 0`, the batch waits for the replay of `0..seq`).
    Restart {
        /// The message's seq.
        seq: u64,
        /// The last seq applied before.
        last: Option<u64>,
    },
    /// The source's first message had `seq > 0` (applied, or waiting for replay of `0..seq`).
    MidStreamStart {
        /// The message's seq.
        seq: u64,
    },
    /// Bad frames or payload: nothing was applied.
    DecodeError(MessageError),
    /// A frame passed the size cap: dropped undecoded (its seq, if readable, is used up).
    Oversized {
        /// Size of the largest frame.
        bytes: usize,
    },
}

/// The seq frame of `[topic, seq, payload]`, if it reads as one.
fn seq_of<F: AsRef<[u8]>>(frames: &[F]) -> Option<u64> {
    let seq: [u8; 8] = frames.get(1)?.as_ref().try_into().ok()?;
    Some(u64::from_be_bytes(seq))
}

/// One message's frames checked against the size cap and decoded: the half of
/// [`SourcePipeline::offer`] that needs no state, so a reader may run it ahead of the index
/// on a thread of its own ([`SourcePipeline::offer_decoded`] is the other half).
#[derive(Debug)]
pub enum Decoded {
    /// A frame passed the cap: left undecoded.
    Oversized {
        /// Size of the largest frame.
        bytes: usize,
        /// The cap it passed.
        limit: usize,
        /// The message's seq, if its seq frame reads as one.
        seq: Option<u64>,
    },
    /// The message did not decode.
    Rejected(MessageError),
    /// The message's seq and batch.
    Batch(u64, EngineBatch),
}

impl Decoded {
    /// Decodes `frames` unless a frame passes `max_frame_bytes`.
    pub fn of<F: AsRef<[u8]>>(frames: &[F], max_frame_bytes: usize) -> Decoded {
        let largest = frames.iter().map(|f| f.as_ref().len()).max().unwrap_or(0);
        if largest > max_frame_bytes {
            let seq = seq_of(frames);
            let limit = max_frame_bytes;
            return Decoded::Oversized {
                bytes: largest,
                limit,
                seq,
            };
        }
        match decode_message(frames, DecodeOptions::INDEX) {
            Ok((seq, batch)) => Decoded::Batch(seq, batch),
            Err(err) => Decoded::Rejected(err),
        }
    }
}

/// One thing that happened while ingesting, reported exactly once.
enum Happening<'a> {
    Message,
    BadLine(&'a dyn Display),
    Decoded(&'a EngineBatch),
    Rejected(&'a MessageError),
    Oversized {
        bytes: usize,
        limit: usize,
        seq: Option<u64>,
    },
    Duplicate(u64),
    Gap {
        from: u64,
        to: u64,
    },
    Restart {
        seq: u64,
        last: Option<u64>,
    },
    MidStreamStart(u64),
    Reset(ResetReason),
    ReplayRequested {
        from: u64,
        to: u64,
    },
    ReplayFilled {
        from: u64,
        to: u64,
        batches: usize,
    },
    ReplayFailed {
        from: u64,
        to: u64,
        error: ReplayError,
    },
    ReplayCancelled,
    Applied(&'a ApplyStats),
    WarmStart(WarmStart),
}

/// Counters, metrics and logs of an ingest run (one live source, or one offline replay of
/// several sources); every happening reaches all three through one `observe` call.
pub struct Observer {
    stats: IngestStats,
    metrics: SourceMetrics,
    bad: u64,
    seen_tags: HashSet<String>,
    line: Option<usize>,
}

impl Observer {
    /// An observer with zeroed counters for sources of `engine`.
    pub fn new(engine: Engine) -> Observer {
        Observer {
            stats: IngestStats::default(),
            metrics: SourceMetrics::new(engine),
            bad: 0,
            seen_tags: HashSet::new(),
            line: None,
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> &IngestStats {
        &self.stats
    }

    /// The fixture line of the next message, named in its log lines (offline replay).
    pub fn set_line(&mut self, line: Option<usize>) {
        self.line = line;
    }

    /// Counts (and logs) a source whose checkpoint came from another run of its engine.
    pub fn engine_restarted_while_away(&mut self, old: &str, new: &str) {
        self.stats.restarts += 1;
        self.metrics.restart();
        info!(
            old_run = old,
            new_run = new,
            "The engine restarted while kvindex was down; dropping the blocks inherited from the checkpoint."
        );
        self.observe(Happening::WarmStart(WarmStart::Restarted));
    }

    /// Counts (and logs) a recorded line that was not a fixture object.
    pub fn bad_line(&mut self, err: &dyn Display) {
        self.observe(Happening::BadLine(err));
    }

    fn observe(&mut self, happening: Happening<'_>) {
        let s = &mut self.stats;
        match happening {
            Happening::Message => {
                s.messages += 1;
                self.metrics.message();
            }
            Happening::BadLine(err) => {
                s.messages += 1;
                *s.decode_errors.entry("bad_fixture_line").or_default() += 1;
                self.metrics.decode_error("bad_fixture_line");
                warn!("Skipped a bad fixture line: {err}.");
            }
            Happening::Decoded(batch) => self.decoded(batch),
            Happening::Rejected(err) => {
                *s.decode_errors.entry(err.reason()).or_default() += 1;
                self.metrics.decode_error(err.reason());
                self.log_bad(err, err.reason(), err.seq);
            }
            Happening::Duplicate(seq) => {
                s.duplicates += 1;
                self.metrics.duplicate();
                debug!(seq, "Dropped a message already applied.");
            }
            Happening::Gap { from, to } => {
                s.seq_gaps += 1;
                self.metrics.seq_gap();
                warn!(from, to, "Seq gap.");
            }
            Happening::Restart { seq, last } => {
                s.restarts += 1;
                self.metrics.restart();
                info!(
                    seq,
                    last, "Engine restart detected; dropping the source's blocks."
                );
            }
            Happening::MidStreamStart(seq) => {
                s.started_mid_stream += 1;
                info!(seq, "The source's first message is not seq 0.");
            }
            Happening::Reset(reason) => {
                s.source_resets += 1;
                self.metrics.source_reset(reason.as_str());
                warn!(
                    reason = reason.as_str(),
                    "The source's state is unknown; reset it and rebuild from what follows."
                );
            }
            Happening::ReplayRequested { from, to } => {
                s.replays_requested += 1;
                self.metrics.replay_requested();
                debug!(from, to, "Requesting replay.");
            }
            Happening::ReplayFilled { from, to, batches } => {
                s.replays_succeeded += 1;
                self.metrics.replay_succeeded();
                info!(from, to, batches, "Replay filled the gap.");
            }
            Happening::ReplayFailed { from, to, error } => {
                s.replays_failed += 1;
                self.metrics.replay_failed(error.reason());
                warn!(
                    from,
                    to,
                    failure = error.reason(),
                    "Replay could not fill the gap: {error}."
                );
            }
            Happening::ReplayCancelled => info!("Replay cancelled: the subscriber is stopping."),
            Happening::WarmStart(outcome) => {
                *s.warm_starts.entry(outcome.as_str()).or_default() += 1;
                self.metrics.warm_start(outcome);
                info!(
                    outcome = outcome.as_str(),
                    "Warm start: the source goes on from the checkpoint."
                );
            }
            Happening::Oversized { bytes, limit, seq } => {
                *s.decode_errors.entry(FRAME_TOO_LARGE).or_default() += 1;
                self.metrics.decode_error(FRAME_TOO_LARGE);
                let what = format!("a frame of {bytes} bytes passes max_frame_bytes ({limit})");
                self.log_bad(&what, FRAME_TOO_LARGE, seq);
            }
            Happening::Applied(applied) => {
                s.apply.add(applied);
                if applied.too_many_models > 0 {
                    let n = applied.too_many_models;
                    *s.invalid_events.entry(TOO_MANY_MODELS).or_default() += n;
                    self.metrics.invalid_events(TOO_MANY_MODELS, n);
                    let what = format!(
                        "{n} BlockStored events name a LoRA past ingest.max_models_per_source"
                    );
                    self.log_bad(&what, TOO_MANY_MODELS, None);
                }
            }
        }
    }

    fn decoded(&mut self, batch: &EngineBatch) {
        let before = self.event_counts();
        self.stats.count_batch(batch);
        let after = self.event_counts();
        let mut unknown = 0;
        for skipped in &batch.skipped {
            match &skipped.reason {
                SkipReason::UnknownTag(tag) => {
                    unknown += 1;
                    if self.seen_tags.len() < MAX_LOGGED_TAGS && self.seen_tags.insert(tag.clone())
                    {
                        warn!(tag = %tag, "Skipping events with an unknown tag (logged once per tag).");
                    }
                }
                SkipReason::Invalid(e) => {
                    self.metrics.invalid_event(e.reason());
                    self.log_bad(e, e.reason(), None);
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

    fn event_counts(&self) -> (u64, u64, u64) {
        let s = &self.stats;
        (
            s.block_stored_events,
            s.block_removed_events,
            s.all_blocks_cleared_events,
        )
    }

    fn log_bad(&mut self, what: &dyn Display, reason: &'static str, seq: Option<u64>) {
        self.bad += 1;
        if self.bad <= LOG_FIRST || self.bad.is_multiple_of(LOG_EVERY) {
            warn!(
                reason,
                seq,
                line = self.line,
                bad_messages = self.bad,
                "Rejected a message: {what}."
            );
        }
    }
}

/// A batch held back until the replay of the seqs before it comes back.
struct Pending {
    from: u64,
    seq: u64,
    batch: EngineBatch,
}

/// Frames → seq tracking → index for one source (one pod's DP rank).
pub struct SourcePipeline {
    source: SourceId,
    tracker: SeqTracker,
    replay: bool,
    pending: Option<Pending>,
    /// Resumed from a checkpoint and no message decided how yet.
    warm: bool,
    max_frame_bytes: usize,
}

impl SourcePipeline {
    /// A pipeline for a registered source with no state yet; `replay` says whether a replay
    /// endpoint can fill gaps (otherwise a gap resets the source).
    pub fn new(source: SourceId, replay: bool) -> SourcePipeline {
        SourcePipeline {
            source,
            tracker: SeqTracker::new(),
            replay,
            pending: None,
            warm: false,
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
        }
    }

    /// Goes on after `seq`, the watermark of the source's checkpoint: its state was rebuilt
    /// from that checkpoint, so the next seq applies, a hole is a gap (replayed, or the
    /// inherited blocks are dropped) and a seq that went back is an engine restart.
    pub fn resume(&mut self, seq: u64) {
        self.tracker = SeqTracker::resumed(seq);
        self.warm = true;
    }

    /// Drops messages with a frame larger than `max` bytes (counted, seq used up).
    ///
    /// The `zeromq` crate (0.7) has no receive limit: it reserves a frame's declared length
    /// as soon as the header arrives and hands over only whole multipart messages, so an
    /// oversized message has been buffered in full by the time this cap sees it. The cap
    /// keeps it from being decoded and applied; the buffer is freed when it is dropped.
    pub fn with_max_frame_bytes(mut self, max: usize) -> SourcePipeline {
        self.max_frame_bytes = max.max(1);
        self
    }

    /// The source in the index.
    pub fn source(&self) -> SourceId {
        self.source
    }

    /// The last applied seq.
    pub fn last_seq(&self) -> Option<u64> {
        self.tracker.last()
    }

    /// The connection (or the recording) started over: a seq that does not move forward now
    /// means a restarted engine rather than a duplicate.
    pub fn reconnected(&mut self) {
        self.tracker.reconnected();
    }

    /// Seqs `from..to` to replay before the batch that is waiting, if one is.
    pub fn pending_replay(&self) -> Option<(u64, u64)> {
        self.pending.as_ref().map(|p| (p.from, p.seq))
    }

    /// Decodes one message and applies it in seq order.
    ///
    /// # Errors
    /// Only [`IndexError`] (the source is not registered); bad input is an
    /// [`Outcome::DecodeError`].
    pub fn offer<F: AsRef<[u8]>>(
        &mut self,
        index: &Index,
        frames: &[F],
        now: u32,
        sink: &mut impl DeltaSink,
        obs: &mut Observer,
    ) -> Result<Outcome, IndexError> {
        let decoded = Decoded::of(frames, self.max_frame_bytes);
        self.offer_decoded(index, decoded, now, sink, obs)
    }

    /// Applies one message [`Decoded`] already (its cap may differ from this pipeline's:
    /// the reader chose it), in seq order.
    ///
    /// # Errors
    /// As [`SourcePipeline::offer`].
    pub fn offer_decoded(
        &mut self,
        index: &Index,
        decoded: Decoded,
        now: u32,
        sink: &mut impl DeltaSink,
        obs: &mut Observer,
    ) -> Result<Outcome, IndexError> {
        obs.observe(Happening::Message);
        match decoded {
            Decoded::Oversized { bytes, limit, seq } => {
                self.pass_over(seq);
                obs.observe(Happening::Oversized { bytes, limit, seq });
                Ok(Outcome::Oversized { bytes })
            }
            Decoded::Rejected(err) => {
                self.pass_over(err.seq);
                obs.observe(Happening::Rejected(&err));
                Ok(Outcome::DecodeError(err))
            }
            Decoded::Batch(seq, batch) => {
                obs.observe(Happening::Decoded(&batch));
                self.sequence(index, seq, batch, now, sink, obs)
            }
        }
    }

    /// Applies the replayed batches (those before the waiting one), or resets the source when
    /// the replay failed, then applies the waiting batch. Cancelled: the batch is dropped.
    ///
    /// # Errors
    /// Only [`IndexError`] (the source is not registered).
    pub fn fill(
        &mut self,
        index: &Index,
        replayed: Result<Vec<Replayed>, ReplayError>,
        now: u32,
        sink: &mut impl DeltaSink,
        obs: &mut Observer,
    ) -> Result<(), IndexError> {
        let Some(pending) = self.pending.take() else {
            return Ok(());
        };
        let (from, to) = (pending.from, pending.seq);
        match replayed {
            Ok(batches) => {
                let needed: Vec<&Replayed> = batches.iter().filter(|r| r.seq < to).collect();
                for r in &needed {
                    self.apply_replayed(index, r, now, sink, obs)?;
                }
                let batches = needed.len();
                obs.observe(Happening::ReplayFilled { from, to, batches });
                if std::mem::take(&mut self.warm) {
                    obs.observe(Happening::WarmStart(WarmStart::Replayed));
                }
            }
            Err(ReplayError::Cancelled) => {
                obs.observe(Happening::ReplayCancelled);
                return Ok(());
            }
            Err(error) => {
                obs.observe(Happening::ReplayFailed { from, to, error });
                if std::mem::take(&mut self.warm) {
                    obs.observe(Happening::WarmStart(WarmStart::Reset));
                }
                self.reset(index, ResetReason::ReplayFailed, sink, obs)?;
            }
        }
        self.apply(index, pending.seq, &pending.batch, now, sink, obs)
    }

    /// A readable seq of a bad payload was still used up: the next message is not a gap.
    fn pass_over(&mut self, seq: Option<u64>) {
        if let Some(seq) = seq {
            if matches!(self.tracker.observe(seq), SeqDecision::Apply) {
                self.tracker.applied(seq);
            }
        }
    }

    fn sequence(
        &mut self,
        index: &Index,
        seq: u64,
        batch: EngineBatch,
        now: u32,
        sink: &mut impl DeltaSink,
        obs: &mut Observer,
    ) -> Result<Outcome, IndexError> {
        let decision = self.tracker.observe(seq);
        self.settle_warm_start(&decision, obs);
        let (outcome, replay_from) = match decision {
            SeqDecision::Apply => (Outcome::Applied { seq }, None),
            SeqDecision::Duplicate => {
                obs.observe(Happening::Duplicate(seq));
                return Ok(Outcome::Duplicate { seq });
            }
            SeqDecision::StartedMidStream { from } => {
                obs.observe(Happening::MidStreamStart(seq));
                (Outcome::MidStreamStart { seq }, Some(from))
            }
            SeqDecision::Gap { from, to } => {
                obs.observe(Happening::Gap { from, to });
                if !self.replay {
                    self.reset(index, ResetReason::NoReplayEndpoint, sink, obs)?;
                }
                (Outcome::Gap { from, to }, Some(from))
            }
            SeqDecision::Restart => {
                let last = self.tracker.last();
                obs.observe(Happening::Restart { seq, last });
                self.clear(index, sink)?;
                (Outcome::Restart { seq, last }, (seq > 0).then_some(0))
            }
        };
        match replay_from {
            Some(from) if self.replay => {
                obs.observe(Happening::ReplayRequested { from, to: seq });
                self.pending = Some(Pending { from, seq, batch });
            }
            _ => self.apply(index, seq, &batch, now, sink, obs)?,
        }
        Ok(outcome)
    }

    /// Reports how a resumed source went on, at the first message that decides it (a gap
    /// with replay decides at [`SourcePipeline::fill`]).
    fn settle_warm_start(&mut self, decision: &SeqDecision, obs: &mut Observer) {
        if !self.warm {
            return;
        }
        let outcome = match decision {
            SeqDecision::Apply => WarmStart::Resumed,
            SeqDecision::Restart | SeqDecision::StartedMidStream { .. } => WarmStart::Restarted,
            SeqDecision::Gap { .. } if self.replay => return,
            SeqDecision::Gap { .. } => WarmStart::Reset,
            SeqDecision::Duplicate => return,
        };
        self.warm = false;
        obs.observe(Happening::WarmStart(outcome));
    }

    fn apply_replayed(
        &mut self,
        index: &Index,
        replayed: &Replayed,
        now: u32,
        sink: &mut impl DeltaSink,
        obs: &mut Observer,
    ) -> Result<(), IndexError> {
        match Decoded::of(&replayed.frames, self.max_frame_bytes) {
            // The seq frame is the reply's own: the replay names the seq.
            Decoded::Oversized { bytes, limit, .. } => {
                let seq = Some(replayed.seq);
                obs.observe(Happening::Oversized { bytes, limit, seq });
                self.tracker.applied(replayed.seq);
                Ok(())
            }
            // Within a replay nothing is a restart: a seq at or below the last one is a
            // reply overlapping what was already applied.
            Decoded::Batch(seq, _) if self.tracker.last().is_some_and(|last| seq <= last) => {
                obs.observe(Happening::Duplicate(seq));
                Ok(())
            }
            Decoded::Batch(seq, batch) => {
                obs.observe(Happening::Decoded(&batch));
                self.apply(index, seq, &batch, now, sink, obs)
            }
            Decoded::Rejected(err) => {
                obs.observe(Happening::Rejected(&err));
                self.tracker.applied(replayed.seq);
                Ok(())
            }
        }
    }

    fn apply(
        &mut self,
        index: &Index,
        seq: u64,
        batch: &EngineBatch,
        now: u32,
        sink: &mut impl DeltaSink,
        obs: &mut Observer,
    ) -> Result<(), IndexError> {
        // The seq is used up even when the index refuses the batch, so one refusal does not
        // turn every later message into a gap.
        self.tracker.applied(seq);
        let applied = index.apply(self.source, batch, now, sink)?;
        obs.observe(Happening::Applied(&applied));
        Ok(())
    }

    fn clear(&mut self, index: &Index, sink: &mut impl DeltaSink) -> Result<(), IndexError> {
        self.tracker.reset();
        index.clear_source(self.source, sink)
    }

    fn reset(
        &mut self,
        index: &Index,
        reason: ResetReason,
        sink: &mut impl DeltaSink,
        obs: &mut Observer,
    ) -> Result<(), IndexError> {
        obs.observe(Happening::Reset(reason));
        self.clear(index, sink)
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::index::{Discard, SourceSpec};

    /// A batch storing one 16-token block (engine hash `hash`), as vLLM encodes it.
    fn store_payload(hash: i64) -> Vec<u8> {
        use rmpv::Value as V;
        let tokens: Vec<V> = (0..16).map(|t| V::from(hash as u64 * 100 + t)).collect();
        let event = V::Array(vec![
            V::from("BlockStored"),
            V::Array(vec![V::from(hash)]),
            V::Nil,
            V::Array(tokens),
            V::from(16),
        ]);
        let batch = V::Array(vec![V::F64(1.0), V::Array(vec![event])]);
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, &batch).unwrap();
        out
    }

    fn frames(seq: u64, payload: Vec<u8>) -> [Bytes; 3] {
        [
            Bytes::new(),
            Bytes::copy_from_slice(&seq.to_be_bytes()),
            Bytes::from(payload),
        ]
    }

    fn replayed(seq: u64, hash: i64) -> Replayed {
        Replayed {
            seq,
            frames: frames(seq, store_payload(hash)),
        }
    }

    struct Rig {
        index: Index,
        pipeline: SourcePipeline,
        observer: Observer,
    }

    impl Rig {
        fn new(replay: bool) -> Rig {
            let index = Index::new();
            let source = index
                .register_source(&SourceSpec {
                    pod: "p.ns".to_owned(),
                    model: "m".to_owned(),
                    engine: Engine::Vllm,
                    dp_rank: 0,
                })
                .unwrap();
            Rig {
                index,
                pipeline: SourcePipeline::new(source, replay),
                observer: Observer::new(Engine::Vllm),
            }
        }

        fn offer(&mut self, seq: u64, hash: i64) -> Outcome {
            let f = frames(seq, store_payload(hash));
            self.pipeline
                .offer(&self.index, &f, 1, &mut Discard, &mut self.observer)
                .unwrap()
        }

        fn fill(&mut self, replayed: Result<Vec<Replayed>, ReplayError>) {
            self.pipeline
                .fill(&self.index, replayed, 1, &mut Discard, &mut self.observer)
                .unwrap();
        }

        fn blocks(&self) -> usize {
            self.index.dump().len()
        }
    }

    #[test]
    fn a_gap_without_replay_resets_then_applies() {
        let mut rig = Rig::new(false);
        assert_eq!(rig.offer(0, 1), Outcome::Applied { seq: 0 });
        assert_eq!(rig.offer(2, 2), Outcome::Gap { from: 1, to: 2 });
        assert_eq!(rig.blocks(), 1, "block 1 dropped, block 2 applied");
        let s = rig.observer.stats();
        assert_eq!((s.seq_gaps, s.source_resets, s.messages), (1, 1, 2));
        assert_eq!(rig.pipeline.pending_replay(), None);
    }

    #[test]
    fn a_gap_with_replay_waits_and_fill_applies_in_order() {
        let mut rig = Rig::new(true);
        rig.offer(0, 1);
        assert_eq!(rig.offer(3, 4), Outcome::Gap { from: 1, to: 3 });
        assert_eq!(rig.pipeline.pending_replay(), Some((1, 3)));
        assert_eq!(rig.blocks(), 1, "the batch waits for the replay");
        // The reply overlaps what was applied (seq 0) and runs past the waiting batch.
        let reply = vec![
            replayed(0, 1),
            replayed(1, 2),
            replayed(2, 3),
            replayed(3, 4),
        ];
        rig.fill(Ok(reply));
        assert_eq!(rig.blocks(), 4);
        assert_eq!(rig.pipeline.last_seq(), Some(3));
        let s = rig.observer.stats();
        assert_eq!((s.replays_requested, s.replays_succeeded), (1, 1));
        assert_eq!((s.duplicates, s.source_resets), (1, 0));
        assert_eq!(rig.offer(4, 5), Outcome::Applied { seq: 4 });
    }

    #[test]
    fn a_failed_replay_resets_and_applies_the_waiting_batch() {
        let mut rig = Rig::new(true);
        rig.offer(0, 1);
        rig.offer(3, 4);
        rig.fill(Err(ReplayError::Holes));
        assert_eq!(rig.blocks(), 1, "only the waiting batch's block");
        let s = rig.observer.stats();
        assert_eq!((s.replays_failed, s.source_resets), (1, 1));
        assert_eq!(rig.pipeline.last_seq(), Some(3));
    }

    #[test]
    fn a_cancelled_replay_is_no_failure_and_resets_nothing() {
        let mut rig = Rig::new(true);
        rig.offer(0, 1);
        rig.offer(1, 2);
        assert_eq!(rig.offer(1, 2), Outcome::Duplicate { seq: 1 });
        rig.offer(3, 4);
        rig.fill(Err(ReplayError::Cancelled));
        let s = rig.observer.stats();
        assert_eq!((s.replays_failed, s.source_resets), (0, 0));
        assert_eq!(rig.blocks(), 2);
        assert_eq!(rig.pipeline.pending_replay(), None);
    }

    #[test]
    fn a_restart_with_replay_clears_and_replays_from_zero() {
        let mut rig = Rig::new(true);
        rig.offer(0, 1);
        rig.offer(1, 2);
        rig.pipeline.reconnected();
        let outcome = rig.offer(1, 9);
        assert_eq!(
            outcome,
            Outcome::Restart {
                seq: 1,
                last: Some(1)
            }
        );
        assert_eq!(rig.pipeline.pending_replay(), Some((0, 1)));
        assert_eq!(rig.blocks(), 0, "the old blocks are gone");
        rig.fill(Ok(vec![replayed(0, 8)]));
        assert_eq!(rig.blocks(), 2);
        assert_eq!(rig.observer.stats().restarts, 1);
    }

    #[test]
    fn a_bad_payload_uses_up_its_seq() {
        let mut rig = Rig::new(false);
        rig.offer(0, 1);
        let bad = frames(1, vec![0xc1]);
        let outcome = rig
            .pipeline
            .offer(&rig.index, &bad, 1, &mut Discard, &mut rig.observer)
            .unwrap();
        assert!(matches!(outcome, Outcome::DecodeError(_)));
        assert_eq!(rig.offer(2, 2), Outcome::Applied { seq: 2 });
        assert_eq!(rig.observer.stats().seq_gaps, 0);
    }
}

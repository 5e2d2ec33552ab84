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
use crate::metrics::{ResetReason, SourceMetrics};
use crate::wire::{decode_message, DecodeOptions, Engine, EngineBatch, MessageError, SkipReason};

use super::replay_client::{ReplayError, Replayed};
use super::seq::{SeqDecision, SeqTracker};
use super::stats::IngestStats;

/// Bad messages logged in full before logging thins out to one in [`LOG_EVERY`].
const LOG_FIRST: u64 = 5;
const LOG_EVERY: u64 = 1000;
/// Distinct unknown tags logged (once each) before the rest are only counted.
const MAX_LOGGED_TAGS: usize = 64;

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
}

/// One thing that happened while ingesting, reported exactly once.
enum Happening<'a> {
    Message,
    BadLine(&'a dyn Display),
    Decoded(&'a EngineBatch),
    Rejected(&'a MessageError),
    Duplicate(u64),
    Gap { from: u64, to: u64 },
    Restart { seq: u64, last: Option<u64> },
    MidStreamStart(u64),
    Reset(ResetReason),
    ReplayRequested { from: u64, to: u64 },
    ReplayFilled { from: u64, to: u64, batches: usize },
    ReplayFailed { from: u64, to: u64, error: ReplayError },
    ReplayCancelled,
    Applied(&'a ApplyStats),
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
                self.metrics.source_reset(reason);
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
            Happening::Applied(applied) => s.apply.add(applied),
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
        }
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
        obs.observe(Happening::Message);
        match decode_message(frames, DecodeOptions::INDEX) {
            Err(err) => {
                self.pass_over(err.seq);
                obs.observe(Happening::Rejected(&err));
                Ok(Outcome::DecodeError(err))
            }
            Ok((seq, batch)) => {
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
            }
            Err(ReplayError::Cancelled) => {
                obs.observe(Happening::ReplayCancelled);
                return Ok(());
            }
            Err(error) => {
                obs.observe(Happening::ReplayFailed { from, to, error });
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
        let (outcome, replay_from) = match self.tracker.observe(seq) {
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

    fn apply_replayed(
        &mut self,
        index: &Index,
        replayed: &Replayed,
        now: u32,
        sink: &mut impl DeltaSink,
        obs: &mut Observer,
    ) -> Result<(), IndexError> {
        match decode_message(&replayed.frames, DecodeOptions::INDEX) {
            Ok((seq, _)) if matches!(self.tracker.observe(seq), SeqDecision::Duplicate) => {
                obs.observe(Happening::Duplicate(seq));
                Ok(())
            }
            Ok((seq, batch)) => {
                obs.observe(Happening::Decoded(&batch));
                self.apply(index, seq, &batch, now, sink, obs)
            }
            Err(err) => {
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

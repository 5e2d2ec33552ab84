//! One source's path from frames to the index, shared by `replay` and the live daemon.

use crate::index::{DeltaSink, Index, IndexError, SourceId};
use crate::wire::{decode_message, DecodeOptions, EngineBatch, MessageError};

use super::seq::{SeqDecision, SeqTracker};
use super::stats::IngestStats;

/// What became of one message.
#[derive(Debug, Clone, PartialEq)]
pub enum FeedOutcome {
    /// Applied to the index (after a reset, when the decision says so).
    Applied {
        /// The message's seq.
        seq: u64,
        /// How the seq was classified.
        decision: SeqDecision,
    },
    /// Dropped as already applied.
    Duplicate {
        /// The message's seq.
        seq: u64,
    },
    /// Rejected: bad frames or payload. Nothing was applied.
    Rejected(MessageError),
}

/// Frames → seq tracking → index, for one source without a replay endpoint: a gap makes the
/// source's state unknown, so it is reset before the next batch is applied.
#[derive(Debug)]
pub struct SourceFeed {
    /// The source in the index.
    pub source: SourceId,
    /// Its sequence state.
    pub tracker: SeqTracker,
}

impl SourceFeed {
    /// A feed for a registered source with no state yet.
    pub fn new(source: SourceId) -> SourceFeed {
        SourceFeed {
            source,
            tracker: SeqTracker::new(),
        }
    }

    /// Decodes and applies one message.
    ///
    /// # Errors
    /// Only [`IndexError`] (source not registered); bad input is a [`FeedOutcome::Rejected`].
    pub fn offer<F: AsRef<[u8]>>(
        &mut self,
        index: &Index,
        frames: &[F],
        now: u32,
        sink: &mut impl DeltaSink,
        stats: &mut IngestStats,
    ) -> Result<FeedOutcome, IndexError> {
        stats.messages += 1;
        let (seq, batch) = match decode_message(frames, DecodeOptions::INDEX) {
            Ok(decoded) => decoded,
            Err(err) => {
                *stats.decode_errors.entry(err.reason()).or_default() += 1;
                // A bad payload with a readable seq still used up that seq: the next message
                // is not a gap (the engine did send it; we just could not read it).
                if let Some(seq) = err.seq {
                    if matches!(self.tracker.observe(seq), SeqDecision::Apply) {
                        self.tracker.applied(seq);
                    }
                }
                return Ok(FeedOutcome::Rejected(err));
            }
        };
        stats.count_batch(&batch);
        self.apply_decoded(index, seq, &batch, now, sink, stats)
    }

    /// Applies an already decoded batch under seq tracking (no replay: gaps reset).
    ///
    /// # Errors
    /// Only [`IndexError`] (source not registered).
    pub fn apply_decoded(
        &mut self,
        index: &Index,
        seq: u64,
        batch: &EngineBatch,
        now: u32,
        sink: &mut impl DeltaSink,
        stats: &mut IngestStats,
    ) -> Result<FeedOutcome, IndexError> {
        let decision = self.tracker.observe(seq);
        match decision {
            SeqDecision::Apply => {}
            SeqDecision::Duplicate => {
                stats.duplicates += 1;
                return Ok(FeedOutcome::Duplicate { seq });
            }
            SeqDecision::StartedMidStream { .. } => stats.started_mid_stream += 1,
            SeqDecision::Gap { .. } => {
                stats.seq_gaps += 1;
                stats.source_resets += 1;
                index.clear_source(self.source, sink)?;
            }
            SeqDecision::Restart => {
                stats.restarts += 1;
                index.clear_source(self.source, sink)?;
            }
        }
        let applied = index.apply(self.source, batch, now, sink)?;
        stats.apply.add(&applied);
        self.tracker.applied(seq);
        Ok(FeedOutcome::Applied { seq, decision })
    }
}

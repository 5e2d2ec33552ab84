//! Counters of one ingest run (a replay, or one source of the daemon), kept by
//! [`super::pipeline::Observer`] only.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::index::ApplyStats;
use crate::wire::{EngineBatch, Event, SkipReason};

/// What happened while ingesting messages.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct IngestStats {
    /// Messages seen (good or bad).
    pub messages: u64,
    /// Batches decoded.
    pub batches: u64,
    /// Decoded batches with no events (heartbeats).
    pub empty_batches: u64,
    /// `BlockStored` events decoded.
    pub block_stored_events: u64,
    /// `BlockRemoved` events decoded.
    pub block_removed_events: u64,
    /// `AllBlocksCleared` events decoded.
    pub all_blocks_cleared_events: u64,
    /// Messages rejected whole, by reason.
    pub decode_errors: BTreeMap<&'static str, u64>,
    /// Events skipped for an unknown tag, by tag.
    pub unknown_tags: BTreeMap<String, u64>,
    /// Events rejected on their own, by reason.
    pub invalid_events: BTreeMap<&'static str, u64>,
    /// Seq gaps seen.
    pub seq_gaps: u64,
    /// Sources reset because their state became unknown.
    pub source_resets: u64,
    /// Engine restarts detected (seq went back).
    pub restarts: u64,
    /// Messages dropped as already applied.
    pub duplicates: u64,
    /// Sources whose first message had seq > 0.
    pub started_mid_stream: u64,
    /// Replays requested.
    pub replays_requested: u64,
    /// Replays that filled their gap.
    pub replays_succeeded: u64,
    /// Replays that failed (cancelled ones are not failures).
    pub replays_failed: u64,
    /// What applying the events did to the index.
    pub apply: ApplyStats,
    /// How sources restored from a checkpoint went on, by outcome (daemon warm starts).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub warm_starts: BTreeMap<&'static str, u64>,
}

impl IngestStats {
    /// Counts the events and skipped events of a decoded batch.
    pub fn count_batch(&mut self, batch: &EngineBatch) {
        self.batches += 1;
        if batch.events.is_empty() && batch.skipped.is_empty() {
            self.empty_batches += 1;
        }
        for event in &batch.events {
            match event {
                Event::BlockStored(_) => self.block_stored_events += 1,
                Event::BlockRemoved(_) => self.block_removed_events += 1,
                Event::AllBlocksCleared => self.all_blocks_cleared_events += 1,
            }
        }
        for skipped in &batch.skipped {
            match &skipped.reason {
                SkipReason::UnknownTag(tag) => {
                    *self.unknown_tags.entry(tag.clone()).or_default() += 1
                }
                SkipReason::Invalid(e) => *self.invalid_events.entry(e.reason()).or_default() += 1,
            }
        }
    }
}

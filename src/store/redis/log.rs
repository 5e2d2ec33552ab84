//! [`CheckpointLog`]: the writer's side of the checkpoint's log (`checkpoint/segment.rs`):
//! the generation and stamps it writes segments under, and which state keys have logged
//! enough since their last snapshot to be compacted (`compact.rs`).
//!
//! A state key's log is compacted once the entries it logged since its last snapshot
//! outnumber the blocks it holds by [`MIN_LOG`], or once it holds none: what Redis keeps
//! per block then stays within about twice the live entries, and a source (or LoRA
//! adapter) that holds nothing any more leaves no fields behind. Compaction runs on the
//! writer's upkeep tick (the watchdog's, every second), not on a timer of its own: under a
//! steady stream a timer that is always due would keep the writer's loop in its background
//! branch instead of its flushes.

use std::collections::{HashMap, HashSet};

use super::checkpoint::segment::Stamp;
use crate::index::{Index, ModelId, PodId};

/// A state key: `(pod, rank, model)`.
pub(super) type StateAt = (PodId, u8, ModelId);

/// Entries a state key may log beyond the blocks it holds before it is compacted: small
/// keys are not rewritten for every few changes.
pub(super) const MIN_LOG: u64 = 1024;

/// Stamps, and the logged entries per state key since its last snapshot.
#[derive(Default)]
pub(super) struct CheckpointLog {
    generation: u64,
    next: u64,
    logged: HashMap<StateAt, u64>,
    due: HashSet<StateAt>,
}

impl CheckpointLog {
    /// Starts writing under `generation` (fresh from Redis: larger than any before).
    pub(super) fn start_generation(&mut self, generation: u64) {
        self.generation = generation;
        self.next = 0;
    }

    /// The current generation (0 before the first).
    pub(super) fn generation(&self) -> u64 {
        self.generation
    }

    /// The stamp of the next segment.
    pub(super) fn next_stamp(&mut self) -> Stamp {
        self.next += 1;
        Stamp {
            generation: self.generation,
            n: self.next,
        }
    }

    /// Counts `entries` logged under state key `at`, and marks it due when its log
    /// outgrew the blocks it holds (read from `index`).
    pub(super) fn logged(&mut self, index: &Index, at: StateAt, entries: usize) {
        let logged = self.logged.entry(at).or_default();
        *logged += entries as u64;
        let live = index.engine_blocks_of((at.0, at.1), at.2) as u64;
        if live == 0 || *logged >= live + MIN_LOG {
            self.due.insert(at);
        }
    }

    /// Up to `most` due state keys, taken off the due list.
    pub(super) fn take_due(&mut self, most: usize) -> Vec<StateAt> {
        let taken: Vec<StateAt> = self.due.iter().take(most).copied().collect();
        for at in &taken {
            self.due.remove(at);
        }
        taken
    }

    /// State keys whose compaction failed, due again.
    pub(super) fn due_again(&mut self, keys: impl IntoIterator<Item = StateAt>) {
        self.due.extend(keys);
    }

    /// State key `at` now holds a snapshot of `live` entries and nothing older (or no field
    /// at all when `live` is 0).
    pub(super) fn compacted(&mut self, at: StateAt, live: usize) {
        if live == 0 {
            self.logged.remove(&at);
        } else {
            self.logged.insert(at, 0);
        }
    }

    /// Nothing is due any more (this writer stands by: the next leader compacts).
    pub(super) fn forget_due(&mut self) {
        self.due.clear();
    }
}

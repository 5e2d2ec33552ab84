//! Who holds a prompt's blocks: the [`Lookup`] trait and the in-memory backend.
//!
//! A lookup is built for one prompt and one candidate list, so backends can resolve pod
//! names to candidate slots once and the scorer works on small integers only.

use super::prompt::MatchMode;
use crate::index::{Index, ModelId};
use crate::medium::{MediaSet, TierWeights, MEDIA_SLOTS};

/// One holder of one block among the candidates, as a backend reports it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Owner {
    /// Position of the pod in the candidate list.
    pub candidate: usize,
    /// Weight of the pod's best medium for this block (1.0 when no medium is known).
    pub weight: f64,
    /// Unix second the pod last stored the block; `None` when the backend could not tell
    /// (an unparsable Redis value, which kthena keeps as fresh).
    pub written_at: Option<u64>,
}

/// Answers "which candidates hold block *i* of this prompt" for one prompt.
///
/// A pod may be reported more than once for a block (the in-memory index reports each DP
/// rank); the scorer combines the reports of one pod the way the Redis field does: best
/// weight, latest write.
pub trait Lookup {
    /// Number of prompt blocks this lookup answers for.
    fn blocks(&self) -> usize;
    /// Calls `visit` for every candidate holding block `block` (`block < self.blocks()`).
    fn for_each_owner<F: FnMut(Owner)>(&mut self, block: usize, visit: F);
}

/// Weights per medium slot, filled on first use so one call pays only for the media it sees.
#[derive(Debug, Clone)]
pub(crate) struct SlotWeights<'w> {
    weights: &'w TierWeights,
    slots: [f64; MEDIA_SLOTS],
    last: Option<(u32, f64)>,
}

impl<'w> SlotWeights<'w> {
    pub(crate) fn new(weights: &'w TierWeights) -> SlotWeights<'w> {
        SlotWeights {
            weights,
            slots: [f64::NAN; MEDIA_SLOTS],
            last: None,
        }
    }

    /// Weight of the best medium in `set` (what the mirror writes for the pod).
    pub(crate) fn best(&mut self, set: MediaSet) -> f64 {
        let bits = set.bits();
        if let Some((last_bits, w)) = self.last {
            if last_bits == bits {
                return w;
            }
        }
        let mut best = f64::NEG_INFINITY;
        for medium in set.iter() {
            let slot = medium.slot() as usize;
            let mut w = self.slots[slot];
            if w.is_nan() {
                w = self.weights.weight(medium);
                self.slots[slot] = w;
            }
            best = best.max(w);
        }
        if best == f64::NEG_INFINITY {
            best = 1.0;
        }
        self.last = Some((bits, best));
        best
    }
}

/// Marks a pod id as "not a candidate" in the dense slot table.
const NOT_CANDIDATE: u32 = u32::MAX;

/// The in-memory backend: reads [`Index::for_each_resident`] (`kthena` mode, std hashes)
/// or [`Index::for_each_chain_resident`] (`prefix` mode, chain hashes) block by block,
/// lazily, so a prompt whose prefix stops matching early costs only the blocks up to that
/// point.
pub struct IndexLookup<'a> {
    index: &'a Index,
    model: Option<ModelId>,
    mode: MatchMode,
    blocks: &'a [u64],
    /// Candidate slot per pod id (dense: pod ids are small integers handed out in order).
    slots: Vec<u32>,
    weights: SlotWeights<'a>,
}

impl<'a> IndexLookup<'a> {
    /// A `kthena`-mode lookup of std-hash `blocks` of `model` among `candidates` (pod
    /// identifiers). A candidate the index never saw, and a model it never saw, simply hold
    /// nothing; a candidate listed twice is reported at its first position.
    pub fn new<S: AsRef<str>>(
        index: &'a Index,
        model: &str,
        blocks: &'a [u64],
        candidates: &[S],
        weights: &'a TierWeights,
    ) -> IndexLookup<'a> {
        IndexLookup::with_mode(index, model, blocks, candidates, weights, MatchMode::Kthena)
    }

    /// The same in `mode`: `blocks` are std hashes for `kthena`, chain hashes of `model` for
    /// `prefix` ([`super::PromptSettings::blocks`]).
    pub fn with_mode<S: AsRef<str>>(
        index: &'a Index,
        model: &str,
        blocks: &'a [u64],
        candidates: &[S],
        weights: &'a TierWeights,
        mode: MatchMode,
    ) -> IndexLookup<'a> {
        let model = index.model_id(model);
        let ids: Vec<Option<u32>> = candidates
            .iter()
            .map(|c| index.pod_id(c.as_ref()).map(|p| p.0))
            .collect();
        let len = ids.iter().flatten().max().map_or(0, |m| *m as usize + 1);
        let mut slots = vec![NOT_CANDIDATE; len];
        for (candidate, id) in ids.iter().enumerate() {
            if let Some(id) = id {
                let slot = &mut slots[*id as usize];
                if *slot == NOT_CANDIDATE {
                    *slot = candidate as u32;
                }
            }
        }
        IndexLookup {
            index,
            model,
            mode,
            blocks,
            slots,
            weights: SlotWeights::new(weights),
        }
    }
}

impl Lookup for IndexLookup<'_> {
    fn blocks(&self) -> usize {
        self.blocks.len()
    }

    fn for_each_owner<F: FnMut(Owner)>(&mut self, block: usize, mut visit: F) {
        let (Some(model), Some(hash)) = (self.model, self.blocks.get(block)) else {
            return;
        };
        let slots = &self.slots;
        let weights = &mut self.weights;
        let visit = |pod: crate::index::PodId, media: MediaSet, stored_at: u32| {
            let Some(&candidate) = slots.get(pod.0 as usize) else {
                return;
            };
            if candidate == NOT_CANDIDATE || media.is_empty() {
                return;
            }
            visit(Owner {
                candidate: candidate as usize,
                weight: weights.best(media),
                written_at: Some(u64::from(stored_at)),
            });
        };
        match self.mode {
            MatchMode::Kthena => self.index.for_each_resident(model, *hash, visit),
            MatchMode::Prefix => self.index.for_each_chain_resident(*hash, visit),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::medium::Medium;

    #[test]
    fn slot_weights_take_the_best_medium_and_one_for_none() {
        let w = TierWeights::new([("disk", 0.25)], 0.5).unwrap();
        let mut sw = SlotWeights::new(&w);
        let mut set = MediaSet::single(Medium::intern("CPU"));
        assert_eq!(sw.best(set), 0.8);
        set.insert(Medium::intern("DISK"));
        assert_eq!(sw.best(set), 0.8);
        assert_eq!(sw.best(MediaSet::single(Medium::intern("DISK"))), 0.25);
        assert_eq!(
            sw.best(MediaSet::single(Medium::intern("SHARED_STORAGE"))),
            0.5
        );
        assert_eq!(sw.best(MediaSet::single(Medium::NONE)), 1.0);
    }
}

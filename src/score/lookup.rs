//! Who holds a prompt's blocks: the [`Lookup`] trait and the in-memory backend.
//!
//! A lookup is built for one prompt and one candidate list, so backends can resolve pod
//! names to candidate slots once and the scorer works on small integers only.

use std::borrow::Cow;

use super::prompt::MatchMode;
use crate::index::{Index, LayerReader, Visit};
use crate::medium::{MediaSet, TierWeights};

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

    /// Like [`Lookup::for_each_owner`], except that a backend that can tell block `block`
    /// has exactly the owners, on exactly the media, of block `block - 1` (the block asked
    /// just before) may skip the visits and answer [`Owners::Repeat`]. The default visits.
    fn for_each_owner_or_repeat<F: FnMut(Owner)>(&mut self, block: usize, visit: F) -> Owners {
        self.for_each_owner(block, visit);
        Owners::Visited
    }

    /// After block `block` was answered by [`Lookup::for_each_owner_or_repeat`]: how many of
    /// the blocks right after it a backend can tell have exactly its owners on exactly its
    /// media, so the caller counts them at once and asks next about the block after them.
    /// The default knows of none.
    fn repeats_after(&mut self, block: usize) -> usize {
        let _ = block;
        0
    }
}

/// How [`Lookup::for_each_owner_or_repeat`] answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owners {
    /// The owners were visited (maybe none).
    Visited,
    /// Same owners and media as the previous block; nobody was visited.
    Repeat,
}

/// The best weight of a resident's media, remembered for the set asked last (residents of
/// one prompt are mostly on the same media). Each medium's weight is kept by
/// [`TierWeights::weight`] itself.
#[derive(Debug, Clone)]
pub(crate) struct SlotWeights<'w> {
    weights: &'w TierWeights,
    last: Option<(u32, f64)>,
}

impl<'w> SlotWeights<'w> {
    pub(crate) fn new(weights: &'w TierWeights) -> SlotWeights<'w> {
        SlotWeights {
            weights,
            last: None,
        }
    }

    /// Weight of the best medium in `set` (what the mirror writes for the pod). Inlined: a
    /// query asks once per resident it visits, mostly for the set it asked last.
    #[inline]
    pub(crate) fn best(&mut self, set: MediaSet) -> f64 {
        match self.last {
            Some((bits, w)) if bits == set.bits() => w,
            _ => self.best_of(set),
        }
    }

    /// [`Self::best`] for a set other than the last one asked.
    #[inline(never)]
    fn best_of(&mut self, set: MediaSet) -> f64 {
        let bits = set.bits();
        let mut best = f64::NEG_INFINITY;
        for medium in set.iter() {
            best = best.max(self.weights.weight(medium));
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

/// Candidate pods resolved to index ids once, for many queries: a router's pod list.
///
/// Pod ids are never reused, so a resolved name keeps its id; only names the index did not
/// know yet need resolving again, which [`Candidates::refresh`] does when pods were
/// registered since.
#[derive(Debug, Clone)]
pub struct Candidates {
    names: Vec<String>,
    slots: Slots,
}

impl Candidates {
    /// Resolves `names` (pod identifiers) in `index`. A name the index never saw holds
    /// nothing; a name listed twice is reported at its first position.
    pub fn new<S: AsRef<str>>(index: &Index, names: &[S]) -> Candidates {
        Candidates {
            names: names.iter().map(|n| n.as_ref().to_owned()).collect(),
            slots: Slots::resolve(index, names),
        }
    }

    /// The candidates' names, in candidate order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Number of candidates.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether there are no candidates.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Resolves again when some names were unknown and the index registered pods since.
    pub fn refresh(&mut self, index: &Index) {
        if self.slots.unresolved > 0 && index.pod_count() != self.slots.pods_seen {
            self.slots = Slots::resolve(index, &self.names);
        }
    }
}

/// Candidate slot per pod id (dense: pod ids are small integers handed out in order).
#[derive(Debug, Clone, Default)]
struct Slots {
    slots: Vec<u32>,
    /// [`Index::pod_count`] when the names were resolved.
    pods_seen: usize,
    /// Names the index did not know then.
    unresolved: usize,
}

impl Slots {
    fn resolve<S: AsRef<str>>(index: &Index, names: &[S]) -> Slots {
        let pods_seen = index.pod_count();
        let ids: Vec<Option<u32>> = (index.pod_ids(names).into_iter())
            .map(|id| id.map(|p| p.0))
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
        Slots {
            slots,
            pods_seen,
            unresolved: ids.iter().filter(|id| id.is_none()).count(),
        }
    }

    /// The candidate position of pod id `pod`, if it is a candidate.
    fn slot(&self, pod: u32) -> Option<usize> {
        match self.slots.get(pod as usize) {
            Some(&slot) if slot != NOT_CANDIDATE => Some(slot as usize),
            _ => None,
        }
    }
}

/// The in-memory backend: reads the index's std blocks (`kthena` mode, std hashes) or chain
/// blocks (`prefix` mode, chain hashes) block by block, lazily, so a prompt whose prefix
/// stops matching early costs only the blocks up to that point. A block whose residents'
/// fingerprint equals the previous block's is answered [`Owners::Repeat`] without a visit.
pub struct IndexLookup<'a> {
    layer: Option<LayerReader<'a>>,
    blocks: &'a [u64],
    candidates: Cow<'a, Slots>,
    weights: SlotWeights<'a>,
    /// The block asked last and its residents' fingerprint (`None`: absent or not asked).
    last: Option<(usize, u64)>,
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
    /// `prefix` ([`super::PromptSettings::blocks`]), from the prompt's first block: in
    /// `prefix` mode blocks that start inside a chain score nobody.
    pub fn with_mode<S: AsRef<str>>(
        index: &'a Index,
        model: &str,
        blocks: &'a [u64],
        candidates: &[S],
        weights: &'a TierWeights,
        mode: MatchMode,
    ) -> IndexLookup<'a> {
        let layer = IndexLookup::layer(index, model, mode);
        // A prompt whose first block nobody holds scores nobody: resolve no names for it.
        let slots = if first_held(layer.as_ref(), blocks) {
            Slots::resolve(index, candidates)
        } else {
            Slots::default()
        };
        IndexLookup::open(layer, blocks, Cow::Owned(slots), weights)
    }

    /// [`Self::with_mode`] with every candidate resolved, even when nobody holds the first
    /// block in the index (a placement may hold it: [`super::speculative`]).
    pub(crate) fn resolved<S: AsRef<str>>(
        index: &'a Index,
        model: &str,
        blocks: &'a [u64],
        candidates: &[S],
        weights: &'a TierWeights,
        mode: MatchMode,
    ) -> IndexLookup<'a> {
        let layer = IndexLookup::layer(index, model, mode);
        let slots = Slots::resolve(index, candidates);
        IndexLookup::open(layer, blocks, Cow::Owned(slots), weights)
    }

    /// The same among candidates resolved beforehand ([`Candidates`]), so a query pays no
    /// name lookups; `None` when nobody holds the prompt's first block (a prompt whose first
    /// block nobody holds scores nobody), decided before any of the lookup's set-up: a miss
    /// is the common answer for a new prompt.
    pub fn with_candidates(
        index: &'a Index,
        model: &str,
        blocks: &'a [u64],
        candidates: &'a Candidates,
        weights: &'a TierWeights,
        mode: MatchMode,
    ) -> Option<IndexLookup<'a>> {
        let layer = IndexLookup::layer(index, model, mode);
        if !first_held(layer.as_ref(), blocks) {
            return None;
        }
        let slots = Cow::Borrowed(&candidates.slots);
        Some(IndexLookup::open(layer, blocks, slots, weights))
    }

    /// The layer `mode` reads for `model`. Chain hashes are seeded by the model's name, so
    /// the chain layer needs no model id (and a query no lookup of the name): an unknown
    /// model holds nothing in `prefix` mode, as no chain of it was stored.
    fn layer(index: &'a Index, model: &str, mode: MatchMode) -> Option<LayerReader<'a>> {
        match mode {
            MatchMode::Kthena => index.std_layer(index.model_id(model)?),
            MatchMode::Prefix => Some(index.chain_layer()),
        }
    }

    fn open(
        layer: Option<LayerReader<'a>>,
        blocks: &'a [u64],
        candidates: Cow<'a, Slots>,
        weights: &'a TierWeights,
    ) -> IndexLookup<'a> {
        IndexLookup {
            layer,
            blocks,
            candidates,
            weights: SlotWeights::new(weights),
            last: None,
        }
    }

    /// Visits block `block`'s owners unless `unless` is their fingerprint.
    fn visit<F: FnMut(Owner)>(&mut self, block: usize, unless: Option<u64>, mut visit: F) -> Visit {
        let (Some(layer), Some(hash)) = (&self.layer, self.blocks.get(block)) else {
            return Visit::Absent;
        };
        // Borrowed out of the `Cow` once, not once per resident.
        let candidates: &Slots = &self.candidates;
        let weights = &mut self.weights;
        // Called once per resident: inlined into the index's loop over them, whatever the
        // codegen units (out of line it was a call per resident, ~10 % of a full-hit query).
        layer.visit(
            *hash,
            unless,
            #[inline(always)]
            |pod, media: MediaSet, stored_at| {
                let Some(candidate) = candidates.slot(pod.0) else {
                    return;
                };
                if media.is_empty() {
                    return;
                }
                visit(Owner {
                    candidate,
                    weight: weights.best(media),
                    written_at: Some(u64::from(stored_at)),
                });
            },
        )
    }
}

/// Whether `layer` has anybody holding the first of `blocks` as a prompt's first block
/// ([`LayerReader::holds_first`]).
fn first_held(layer: Option<&LayerReader<'_>>, blocks: &[u64]) -> bool {
    (layer.zip(blocks.first())).is_some_and(|(layer, hash)| layer.holds_first(*hash))
}

impl Lookup for IndexLookup<'_> {
    fn blocks(&self) -> usize {
        self.blocks.len()
    }

    fn for_each_owner<F: FnMut(Owner)>(&mut self, block: usize, visit: F) {
        self.last = None;
        if let Visit::Visited(fingerprint) = self.visit(block, None, visit) {
            self.last = Some((block, fingerprint));
        }
    }

    fn for_each_owner_or_repeat<F: FnMut(Owner)>(&mut self, block: usize, visit: F) -> Owners {
        let previous = self.last.take();
        let unless = previous
            .filter(|(at, _)| at + 1 == block)
            .map(|(_, fingerprint)| fingerprint);
        match self.visit(block, unless, visit) {
            Visit::Absent => Owners::Visited,
            Visit::Unchanged => {
                self.last = unless.map(|fingerprint| (block, fingerprint));
                Owners::Repeat
            }
            Visit::Visited(fingerprint) => {
                self.last = Some((block, fingerprint));
                Owners::Visited
            }
        }
    }

    /// The blocks after `block` that continue its run with its residents (the chain layer
    /// compares them with the run's chain hashes in one pass, [`LayerReader::repeats`]).
    fn repeats_after(&mut self, block: usize) -> usize {
        let Some((_, fingerprint)) = self.last.filter(|(at, _)| *at == block) else {
            return 0;
        };
        let (Some(layer), Some(next)) = (&self.layer, self.blocks.get(block + 1..)) else {
            return 0;
        };
        let repeats = layer.repeats(next);
        self.last = Some((block + repeats, fingerprint));
        repeats
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

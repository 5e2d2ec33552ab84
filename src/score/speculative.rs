//! `prefix` scoring with routers' placements: a [`Lookup`] that reports, beside the index's
//! owners of each block, the candidates a placement holds it on ([`crate::index::Speculative`]).
//!
//! A placed block weighs as a GPU block (the configured `gpu` weight): the request was
//! placed to be prefilled into GPU memory. A pod holding the block in the index too is
//! reported twice, and the scorer keeps the better weight, as for a pod's DP ranks.

use std::time::Instant;

use super::lookup::{Lookup, Owner, Owners};
use crate::index::Index;
use crate::medium::{Medium, TierWeights};

/// Which candidates a placement holds each block of a prompt on.
#[derive(Debug, Clone)]
pub(crate) struct Placed {
    /// (candidate, one flag per prompt block) for each candidate with a live placement.
    holders: Vec<(usize, Vec<bool>)>,
    weight: f64,
}

impl Placed {
    /// The live placements of `pods` (one id per candidate, `None` for a name the index does
    /// not know) over chain hashes `blocks`; `None` when no candidate has one.
    pub(crate) fn of(
        index: &Index,
        pods: &[Option<u32>],
        blocks: &[u64],
        weights: &TierWeights,
    ) -> Option<Placed> {
        let speculative = index.speculative();
        if speculative.is_empty() {
            return None;
        }
        let held = speculative.held(pods, blocks, Instant::now());
        let holders: Vec<(usize, Vec<bool>)> = (held.into_iter().enumerate())
            .filter_map(|(candidate, flags)| Some((candidate, flags?)))
            .collect();
        (!holders.is_empty()).then(|| Placed {
            holders,
            weight: weights.weight(Medium::GPU),
        })
    }

    /// Whether the candidates placed at `block` are the ones placed at `block - 1`.
    fn same_as_previous(&self, block: usize) -> bool {
        block > 0 && (self.holders.iter()).all(|(_, flags)| flags[block] == flags[block - 1])
    }

    fn visit(&self, block: usize, mut visit: impl FnMut(Owner)) {
        for (candidate, flags) in &self.holders {
            if flags[block] {
                visit(Owner {
                    candidate: *candidate,
                    weight: self.weight,
                    written_at: None,
                });
            }
        }
    }
}

/// The index's owners of each block, and the candidates placed on it.
pub(crate) struct WithPlaced<L> {
    inner: L,
    placed: Placed,
}

impl<L: Lookup> WithPlaced<L> {
    /// `inner`'s answers with `placed`'s candidates added.
    pub(crate) fn new(inner: L, placed: Placed) -> WithPlaced<L> {
        WithPlaced { inner, placed }
    }
}

impl<L: Lookup> Lookup for WithPlaced<L> {
    fn blocks(&self) -> usize {
        self.inner.blocks()
    }

    fn for_each_owner<F: FnMut(Owner)>(&mut self, block: usize, mut visit: F) {
        self.inner.for_each_owner(block, &mut visit);
        self.placed.visit(block, visit);
    }

    /// A block repeats the one before when the index's owners do and the placements do.
    fn for_each_owner_or_repeat<F: FnMut(Owner)>(&mut self, block: usize, mut visit: F) -> Owners {
        if !self.placed.same_as_previous(block) {
            self.for_each_owner(block, visit);
            return Owners::Visited;
        }
        let owners = self.inner.for_each_owner_or_repeat(block, &mut visit);
        if owners == Owners::Visited {
            self.placed.visit(block, visit);
        }
        owners
    }

    fn repeats_after(&mut self, block: usize) -> usize {
        let repeats = self.inner.repeats_after(block);
        (1..=repeats)
            .take_while(|after| self.placed.same_as_previous(block + after))
            .count()
    }
}

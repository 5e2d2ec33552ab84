//! What a query reads: whether a block is held, and a run followed position after position.

use std::cell::Cell;

use super::node::fingerprint_at;
use super::spot::Spot;
use super::ChainRuns;
use crate::index::residents::Resident;
use crate::index::vocab::{PodId, Visit};
use crate::medium::MediaSet;

/// A query's place in a run: the spot it read last and, when somebody holds it, the
/// fingerprint of its residents (nonzero).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cursor {
    spot: Spot,
    same: Option<u64>,
}

impl ChainRuns {
    /// Whether anybody holds chain block `key`.
    pub(crate) fn contains(&self, key: u64) -> bool {
        self.held_spot(key).is_some()
    }

    /// Whether anybody holds chain block `key` when it is a chain start: a prompt's first
    /// block always is one, and a block that is no chain block here is answered by the
    /// small table of starts alone.
    pub(crate) fn starts_held(&self, key: u64) -> bool {
        (self.locator.start_spot(key, &self.nodes))
            .is_some_and(|spot| self.nodes[spot.node as usize].held(spot.pos as u16))
    }

    /// [`LayerReader::visit`](crate::index::LayerReader::visit) on chain block `key`,
    /// following the run `cursor` is in without a probe. The blocks after it whose residents
    /// stay the same are for [`Self::repeats`] to count, all at once. Never inlined: one
    /// function per caller's closure, with the closure (called per resident) inlined into
    /// the loop over the residents, is leaner than this inlined into its callers.
    #[inline(never)]
    pub(crate) fn visit(
        &self,
        key: u64,
        unless: Option<u64>,
        cursor: &Cell<Option<Cursor>>,
        mut visit: impl FnMut(PodId, MediaSet, u32),
    ) -> Visit {
        let Some(spot) = self.spot_after(cursor.get().map(|c| c.spot), key) else {
            cursor.set(None);
            return Visit::Absent;
        };
        let node = &self.nodes[spot.node as usize];
        let pos = spot.pos as u16;
        let fingerprint = node.fps.get(pos).unwrap_or(0);
        // A fingerprint of 0 is mostly nobody (and by a 2^-64 chance somebody): it is never
        // taken for the same residents, and the spans tell.
        let same = (fingerprint != 0).then_some(fingerprint);
        cursor.set(Some(Cursor { spot, same }));
        if same.is_some() && unless == same {
            return Visit::Unchanged;
        }
        let mut held = false;
        for r in node.residents_at(pos) {
            held = true;
            visit(PodId(r.pod()), r.media(), r.stored_at);
        }
        debug_assert_eq!(
            fingerprint,
            fingerprint_at(node, pos),
            "a fingerprint out of step"
        );
        match held {
            true => Visit::Visited(fingerprint),
            false => Visit::Absent,
        }
    }

    /// How many of `next` continue the run from `cursor` at positions whose residents are
    /// the cursor's (their fingerprint is): the blocks a visit of each would answer
    /// unchanged. Comparisons of slices rather than a visit per block; the cursor moves to
    /// the last of them.
    pub(crate) fn repeats(&self, next: &[u64], cursor: &Cell<Option<Cursor>>) -> usize {
        let Some(Cursor {
            spot,
            same: same @ Some(fingerprint),
        }) = cursor.get()
        else {
            return 0;
        };
        let Some(node) = self.nodes.get(spot.node as usize) else {
            return 0;
        };
        // The positions after the cursor's with its residents (its fingerprint), then those
        // of them that are `next`'s blocks.
        let after = spot.pos as usize + 1;
        let stable = (node.fps).same_from(after as u16, fingerprint, next.len());
        let Some(run) = (node.chains).get(after..after + stable) else {
            return 0;
        };
        let repeats = common_prefix(run, next);
        let spot = Spot {
            pos: spot.pos + repeats as u32,
            ..spot
        };
        cursor.set(Some(Cursor { spot, same }));
        repeats
    }

    /// The std hash the runs keep for each of `chains` (a prompt's chain hashes, in order),
    /// `None` for a chain block not here: each block looked for right after the one before
    /// it in its run, so a probe is paid only where the prompt leaves a run.
    pub(crate) fn stds_along(&self, chains: &[u64]) -> Vec<Option<u64>> {
        let mut last: Option<Spot> = None;
        (chains.iter())
            .map(|&chain| {
                last = self.spot_after(last, chain);
                Some(self.hashes_at(last?)?.1)
            })
            .collect()
    }

    /// The spot of chain block `key` for a walk along a prompt that read `last` just before
    /// it: right after `last` when its run goes on with `key`, without a probe, else the
    /// locator's.
    #[inline]
    fn spot_after(&self, last: Option<Spot>, key: u64) -> Option<Spot> {
        let after = last.map(|s| Spot {
            node: s.node,
            pos: s.pos + 1,
        });
        (after.filter(|&s| self.at(s) == Some(key))).or_else(|| self.spot(key))
    }

    /// Calls `visit` with the residents of every held chain block, in no order.
    pub(crate) fn for_each_block(&self, mut visit: impl FnMut(&[Resident])) {
        let mut residents = Vec::new();
        for node in &self.nodes {
            for pos in 0..node.chains.len() as u16 {
                residents.clear();
                residents.extend(node.residents_at(pos).copied());
                if !residents.is_empty() {
                    visit(&residents);
                }
            }
        }
    }
}

/// How many leading hashes `a` and `b` have in common: four at a time (compared without a
/// branch each) while they agree, then one by one.
pub(super) fn common_prefix(a: &[u64], b: &[u64]) -> usize {
    let wide = (a.chunks_exact(4).zip(b.chunks_exact(4)))
        .take_while(|(a, b)| a == b)
        .count()
        * 4;
    let narrow = (a[wide..].iter().zip(&b[wide..]))
        .take_while(|(a, b)| a == b)
        .count();
    wide + narrow
}

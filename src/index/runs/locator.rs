//! The locator: chain hash → spot of every chain block, and the table of chain starts.

use std::hash::BuildHasher;

use hashbrown::{DefaultHashBuilder, HashTable};

use super::node::Node;
use super::{Spot, FEW_STARTS};
use crate::index::source::table_bytes;

/// Chain hash → spot of every chain block, and the table of chain starts among them.
///
/// The table keeps spots alone, 8 bytes a slot where a map would keep the 8-byte chain hash
/// beside each: the hash of a slot is the one its run keeps at the spot. A probe reads it
/// for a candidate slot (mostly the block looked for, whose run the caller reads next
/// anyway; another block's only on a 7-bit tag match), and growing the table reads it for
/// every slot. Every method that reads hashes takes the nodes; a spot stays in the table
/// exactly while its run keeps a position there
/// ([`ChainRuns::release`](super::ChainRuns::release)).
#[derive(Debug, Default)]
pub(super) struct Locator {
    pub(super) spots: HashTable<Spot>,
    hasher: DefaultHashBuilder,
    /// The chain blocks placed with no parent here (chain starts, and blocks restored with
    /// their parent unknown), flagged in the locator ([`START`](super::START)): a prompt's
    /// first block is a chain start, so a query that misses (a new prompt) is answered from
    /// this table, which is small and stays in cache, instead of a probe of the locator,
    /// which mostly does not ([`Locator::start_spot`]); Dynamo's tree answers it from its
    /// root's children alike. Kept only while starts are few next to the blocks
    /// ([`Locator::settle`]): where most blocks are starts (chains one block long, a warm
    /// start from a checkpoint without parents) it would be a second locator.
    pub(super) starts: Option<hashbrown::HashSet<u64>>,
    /// Locator entries flagged as starts.
    pub(super) flagged: usize,
}

/// The chain hash the runs keep at `spot` (flagged or not), 0 past their end: what a
/// locator slot is keyed by.
pub(super) fn chain_at(nodes: &[Node], spot: Spot) -> u64 {
    let Spot { node, pos } = spot.unflagged();
    let chain = (nodes.get(node as usize)).and_then(|n| n.chains.get(pos as usize));
    debug_assert!(chain.is_some(), "a locator slot past its run");
    chain.copied().unwrap_or(0)
}

impl Locator {
    /// The slot of chain block `hash`, flagged if it is a start. Not inlined: the probe
    /// inlined into [`ChainRuns::find`](super::ChainRuns::find) made every call of it save
    /// more registers, though most calls find the block beside the last one without a
    /// probe.
    #[inline(never)]
    pub(super) fn slot(&self, hash: u64, nodes: &[Node]) -> Option<Spot> {
        let found = (self.spots).find(self.hasher.hash_one(hash), |s| chain_at(nodes, *s) == hash);
        found.copied()
    }

    /// The spot of chain block `hash`.
    pub(super) fn spot(&self, hash: u64, nodes: &[Node]) -> Option<Spot> {
        self.slot(hash, nodes).map(Spot::unflagged)
    }

    /// Puts new chain block `hash`, which `nodes` keep at `spot` already; a `start` is
    /// flagged and goes in the table.
    pub(super) fn insert(&mut self, hash: u64, spot: Spot, start: bool, nodes: &[Node]) {
        let Locator { spots, hasher, .. } = self;
        let slot = if start { spot.flagged() } else { spot };
        let rehash = |s: &Spot| hasher.hash_one(chain_at(nodes, *s));
        spots.insert_unique(hasher.hash_one(hash), slot, rehash);
        if !start {
            return;
        }
        self.flagged += 1;
        if let Some(starts) = &mut self.starts {
            starts.insert(hash);
        }
        self.settle(nodes);
    }

    /// Takes chain block `hash` at `spot` out, and out of the starts if it is one. Matched
    /// by the spot, not by the hash its run keeps there: the caller is taking the position.
    pub(super) fn remove(&mut self, hash: u64, spot: Spot) {
        let found = (self.spots).find_entry(self.hasher.hash_one(hash), |s| s.unflagged() == spot);
        let Ok(entry) = found else {
            return;
        };
        let (slot, _) = entry.remove();
        if slot.is_flagged() {
            self.flagged -= 1;
            if let Some(starts) = &mut self.starts {
                starts.remove(&hash);
            }
        }
    }

    /// The spot of chain block `hash` when it is a start: one probe of the spots, none
    /// when the table of starts (while there is one) does not have it.
    pub(super) fn start_spot(&self, hash: u64, nodes: &[Node]) -> Option<Spot> {
        if (self.starts.as_ref()).is_some_and(|starts| !starts.contains(&hash)) {
            return None;
        }
        let slot = self.slot(hash, nodes).filter(|slot| slot.is_flagged())?;
        Some(slot.unflagged())
    }

    /// Keeps the table of starts while they are few next to the blocks (a quarter at
    /// most, or [`FEW_STARTS`]), and builds it again from the flags once they are an
    /// eighth: apart, so an index near the line does not build it again and again.
    fn settle(&mut self, nodes: &[Node]) {
        let (flagged, blocks) = (self.flagged, self.len());
        match self.starts {
            Some(_) if flagged > FEW_STARTS && flagged * 4 > blocks => self.starts = None,
            None if flagged <= FEW_STARTS || flagged * 8 <= blocks => {
                let starts = (self.spots.iter())
                    .filter(|slot| slot.is_flagged())
                    .map(|slot| chain_at(nodes, *slot));
                self.starts = Some(starts.collect());
            }
            _ => {}
        }
    }

    /// Gives back memory once the tables are a quarter full or less.
    pub(super) fn shrink(&mut self, nodes: &[Node]) {
        let capacity = self.spots.capacity();
        if capacity > 1024 && self.spots.len() * 4 < capacity {
            let hasher = &self.hasher;
            (self.spots).shrink_to_fit(|s| hasher.hash_one(chain_at(nodes, *s)));
        }
        if let Some(starts) = &mut self.starts {
            if starts.capacity() > 1024 && starts.len() * 4 < starts.capacity() {
                starts.shrink_to_fit();
            }
        }
        self.settle(nodes);
    }

    /// Chain blocks in the table.
    pub(super) fn len(&self) -> usize {
        self.spots.len()
    }

    /// Estimated heap bytes.
    pub(super) fn heap_bytes(&self) -> usize {
        let starts = self.starts.as_ref().map_or(0, |s| s.capacity());
        table_bytes::<Spot, ()>(self.spots.capacity()) + table_bytes::<u64, ()>(starts)
    }
}

//! The locator: chain hash → spot of every chain block, and the table of chain starts.

use std::hash::BuildHasher;

use hashbrown::{DefaultHashBuilder, HashTable};

use super::node::Node;
use super::spot::{Spot, POS_BITS};
use crate::index::vocab::table_bytes;

/// A locator slot: a spot in 4 bytes (the node, the position and the start flag), so the
/// table costs 5 bytes a bucket where a whole [`Spot`] made it 9 (the locator holds every
/// chain block, so its bucket is part of every block's cost). A spot of a node past
/// what a slot names goes in the locator's second table, whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Slot(u32);

/// Bits of a slot's node id: 2^23 runs, past which an index of tens of millions of blocks
/// in short runs keeps the rest whole.
const SLOT_NODE_BITS: u32 = 23;
const SLOT_START: u32 = 1 << 31;
const _: () = assert!(SLOT_NODE_BITS + POS_BITS < 32);

impl Slot {
    /// `spot` (flagged or not) as a slot, if its node and position fit.
    fn pack(spot: Spot) -> Option<Slot> {
        let packed = spot.unflagged().pack(SLOT_NODE_BITS)?;
        let start = if spot.is_flagged() { SLOT_START } else { 0 };
        Some(Slot(packed | start))
    }
}

/// Chain hash → spot of every chain block, and the table of chain starts among them.
///
/// The table keeps spots alone, 4 bytes a slot where a map would keep the 8-byte chain hash
/// beside each: the hash of a slot is the one its run keeps at the spot. A probe reads it
/// for a candidate slot (mostly the block looked for, whose run the caller reads next
/// anyway; another block's only on a 7-bit tag match), and growing the table reads it for
/// every slot. Every method that reads hashes takes the nodes; a spot stays in the table
/// exactly while its run keeps a position there (invariant 5 of [`super`]).
#[derive(Debug, Default)]
pub(super) struct Locator {
    /// The tables in shards, chosen by hash bits neither a table's bucket index nor its tag
    /// uses: a growing table is rehashed under the runs' write lock, which every query waits
    /// for, and a shard grows in a fraction of the time the whole locator would.
    shards: [Shard; SHARDS],
    /// Chain blocks in all shards: counted, not summed, as [`Self::settle`] reads it on
    /// every chain start's insert.
    len: usize,
    /// The most chain blocks held since the shards were last checked for memory to give
    /// back: a check of every shard waits until the blocks are a quarter of that, rather
    /// than running after every event that removes blocks.
    peak: usize,
    hasher: DefaultHashBuilder,
    /// The chain blocks placed with no parent here (chain starts, and blocks restored with
    /// their parent unknown), flagged in the locator (`Spot`'s start flag): a prompt's
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

/// Starts there may always be a table of, whatever the number of blocks.
pub(super) const FEW_STARTS: usize = 4096;

/// Shards of the locator (the most a `Default` array derives).
const SHARDS: usize = 32;

/// One shard of the locator's tables.
#[derive(Debug, Default)]
struct Shard {
    spots: HashTable<Slot>,
    /// The spots a [`Slot`] cannot name, whole; mostly empty, and then never probed.
    wide: HashTable<Spot>,
}

/// What a locator table keeps: a spot, packed ([`Slot`]) or whole.
trait Entry: Copy {
    /// The spot, flagged if it is a start.
    fn spot(self) -> Spot;
}

impl Entry for Slot {
    fn spot(self) -> Spot {
        let spot = Spot::unpack(self.0, SLOT_NODE_BITS);
        if self.0 & SLOT_START != 0 {
            spot.flagged()
        } else {
            spot
        }
    }
}

impl Entry for Spot {
    fn spot(self) -> Spot {
        self
    }
}

/// The hash of the chain block an entry names, as a table growing or shrinking asks for it:
/// read from the runs, as the table keeps no key.
fn rehash<'a, T: Entry>(
    hasher: &'a DefaultHashBuilder,
    nodes: &'a [Node],
) -> impl Fn(&T) -> u64 + 'a {
    move |entry| hasher.hash_one(chain_at(nodes, entry.spot()))
}

/// The entry of `table` under `key` that `is` picks, as a spot.
fn find_in<T: Entry>(table: &HashTable<T>, key: u64, is: impl Fn(Spot) -> bool) -> Option<Spot> {
    table.find(key, |e| is(e.spot())).map(|e| e.spot())
}

/// Takes the entry of `table` under `key` at `spot` out; gives it, flagged if it was a start.
fn take_from<T: Entry>(table: &mut HashTable<T>, key: u64, spot: Spot) -> Option<Spot> {
    let found = table.find_entry(key, |e| e.spot().unflagged() == spot);
    found.ok().map(|entry| entry.remove().0.spot())
}

/// Gives back a table's memory once it is a quarter full or less, past a size worth it.
fn shrink_table<T: Entry>(table: &mut HashTable<T>, hasher: &DefaultHashBuilder, nodes: &[Node]) {
    let capacity = table.capacity();
    if capacity > 1024 / SHARDS && table.len() * 4 < capacity {
        table.shrink_to_fit(rehash(hasher, nodes));
    }
}

/// The shard of a block whose chain hash hashes to `key`: bits 40 to 44, below the 7-bit tag
/// (the top bits) and above any bucket index of a table under 2^40 buckets.
fn shard_of(key: u64) -> usize {
    (key >> 40) as usize % SHARDS
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
        let key = self.hasher.hash_one(hash);
        let shard = &self.shards[shard_of(key)];
        let is = |spot: Spot| chain_at(nodes, spot) == hash;
        let found = find_in(&shard.spots, key, is);
        if found.is_some() || shard.wide.is_empty() {
            return found;
        }
        find_in(&shard.wide, key, is)
    }

    /// The spot of chain block `hash`.
    pub(super) fn spot(&self, hash: u64, nodes: &[Node]) -> Option<Spot> {
        self.slot(hash, nodes).map(Spot::unflagged)
    }

    /// Puts new chain block `hash`, which `nodes` keep at `spot` already; a `start` is
    /// flagged and goes in the table.
    pub(super) fn insert(&mut self, hash: u64, spot: Spot, start: bool, nodes: &[Node]) {
        let Locator { shards, hasher, .. } = self;
        let spot = if start { spot.flagged() } else { spot };
        let key = hasher.hash_one(hash);
        let Shard { spots, wide } = &mut shards[shard_of(key)];
        self.len += 1;
        self.peak = self.peak.max(self.len);
        match Slot::pack(spot) {
            Some(slot) => {
                spots.insert_unique(key, slot, rehash(hasher, nodes));
            }
            None => {
                wide.insert_unique(key, spot, rehash(hasher, nodes));
            }
        }
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
        let key = self.hasher.hash_one(hash);
        let Shard { spots, wide } = &mut self.shards[shard_of(key)];
        let found = take_from(spots, key, spot);
        let found = found.or_else(|| (!wide.is_empty()).then(|| take_from(wide, key, spot))?);
        let Some(slot) = found else {
            return;
        };
        self.len -= 1;
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
                let starts = (self.slots())
                    .filter(|slot| slot.is_flagged())
                    .map(|slot| chain_at(nodes, slot));
                self.starts = Some(starts.collect());
            }
            _ => {}
        }
    }

    /// Gives back memory once the tables are a quarter full or less (the shards once the
    /// blocks are a quarter of their peak).
    pub(super) fn shrink(&mut self, nodes: &[Node]) {
        if self.len * 4 < self.peak {
            self.peak = self.len;
            for Shard { spots, wide } in &mut self.shards {
                shrink_table(spots, &self.hasher, nodes);
                shrink_table(wide, &self.hasher, nodes);
            }
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
        self.len
    }

    /// Every chain block's spot, flagged if it is a start.
    pub(super) fn slots(&self) -> impl Iterator<Item = Spot> + '_ {
        (self.shards.iter()).flat_map(|shard| {
            let packed = shard.spots.iter().map(|s| s.spot());
            packed.chain(shard.wide.iter().copied())
        })
    }

    /// Slots of all tables, for tests of memory given back.
    #[cfg(test)]
    pub(super) fn capacity(&self) -> usize {
        let tables = self.shards.iter();
        tables.map(|s| s.spots.capacity() + s.wide.capacity()).sum()
    }

    /// Estimated heap bytes.
    pub(super) fn heap_bytes(&self) -> usize {
        let starts = self.starts.as_ref().map_or(0, |s| s.capacity());
        let tables = self.shards.iter().map(|s| {
            table_bytes::<Slot, ()>(s.spots.capacity()) + table_bytes::<Spot, ()>(s.wide.capacity())
        });
        tables.sum::<usize>() + table_bytes::<u64, ()>(starts)
    }
}

#[cfg(test)]
mod tests {
    use super::super::spot::TEST_NODE_BITS;
    use super::*;

    #[test]
    fn a_slot_packs_a_spot_and_its_start_flag_up_to_the_largest_node_it_names() {
        let last = (1 << TEST_NODE_BITS) - 1;
        let spots = [
            Spot::from_parts(0, 0),
            Spot::from_parts(last, 255),
            Spot::from_parts(3, 7).flagged(),
            Spot::from_parts(last, 0).flagged(),
        ];
        for spot in spots {
            assert_eq!(Slot::pack(spot).map(Slot::spot), Some(spot));
        }
        assert_eq!(Slot::pack(Spot::from_parts(last + 1, 0)), None);
        assert_eq!(Slot::pack(Spot::from_parts(0, 256)), None);
    }
}

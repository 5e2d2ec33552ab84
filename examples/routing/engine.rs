//! One simulated engine's paged prefix cache, with vLLM's prefix-caching semantics.
//!
//! A block is named by its prefix: a chain hash over every token up to and including it
//! ([`block_ids`]), so the same 16 tokens after another prefix are another block. A request's
//! hit is the longest run of its leading full blocks present (on GPU or, with offload, on
//! CPU), capped so that at least the prompt's last token is computed again (vLLM's rule); its
//! missing full blocks are stored. Blocks of requests in flight are referenced and never
//! evicted; unreferenced GPU blocks are evicted least recently used first, a request's tail
//! before its head (vLLM frees a request's blocks in reverse order). With a CPU tier, an
//! evicted GPU block moves to CPU (stored there, then removed from GPU); the CPU tier evicts
//! its own least recently used blocks. Every change is returned as a [`Change`] in the order
//! the cache changed, for the engine to publish.

use std::collections::{BTreeSet, HashMap};

/// Tokens per KV block.
pub const BLOCK_SIZE: usize = 16;

/// A block's identity in the engine: the chain hash of its whole prefix.
pub type BlockId = u64;

/// The chain seed of a prompt's first block.
const CHAIN_SEED: u64 = 0x6b76_696e_6465_7831;

/// The identities of a prompt's full blocks (a trailing partial block is never cached).
pub fn block_ids(tokens: &[u32]) -> Vec<BlockId> {
    let mut parent = CHAIN_SEED;
    tokens
        .chunks_exact(BLOCK_SIZE)
        .map(|chunk| {
            let bytes: Vec<u8> = chunk.iter().flat_map(|t| t.to_le_bytes()).collect();
            parent = xxhash_rust::xxh3::xxh3_64_with_seed(&bytes, parent);
            parent
        })
        .collect()
}

/// The most blocks a prompt of `len` tokens can take from the cache: vLLM computes at least
/// the last prompt token, so a fully cached, block-aligned prompt recomputes its last block.
pub fn max_hit_blocks(len: usize) -> usize {
    len.saturating_sub(1) / BLOCK_SIZE
}

/// A storage tier of the simulated engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// GPU memory, the engine's block pool.
    Gpu,
    /// The CPU offload tier.
    Cpu,
}

impl Tier {
    /// The medium string vLLM puts on the wire.
    pub fn medium(self) -> &'static str {
        match self {
            Tier::Gpu => "GPU",
            Tier::Cpu => "CPU",
        }
    }
}

/// One change of the cache, in engine block identities.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Consecutive blocks of one prompt stored on a tier; `tokens` are theirs (empty for a
    /// block copied to CPU, as offload connectors send it), `parent` the block before.
    Stored {
        /// The blocks, in prompt order.
        blocks: Vec<BlockId>,
        /// The block before the first, `None` at a prompt's start.
        parent: Option<BlockId>,
        /// `BLOCK_SIZE` tokens per block, or none.
        tokens: Vec<u32>,
        /// Where.
        tier: Tier,
    },
    /// One block removed from a tier.
    Removed {
        /// The block.
        block: BlockId,
        /// From where.
        tier: Tier,
    },
}

#[derive(Debug, Clone, Copy, Default)]
struct Entry {
    depth: u32,
    refs: u32,
    gpu: bool,
    cpu: bool,
    /// Position in the GPU free list while unreferenced on GPU.
    free_key: Option<(u64, u32)>,
    /// Position in the CPU list while on CPU.
    cpu_key: Option<u64>,
}

/// Counters of one cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// GPU blocks evicted.
    pub gpu_evictions: u64,
    /// CPU blocks evicted.
    pub cpu_evictions: u64,
    /// Blocks stored while every GPU block was referenced (the pool ran over its size).
    pub overflows: u64,
}

/// The prefix cache of one engine.
#[derive(Debug)]
pub struct PrefixCache {
    gpu_capacity: usize,
    cpu_capacity: usize,
    gpu_used: usize,
    cpu_used: usize,
    entries: HashMap<BlockId, Entry>,
    /// Unreferenced GPU blocks: (release tick, deepest first, block), oldest first.
    free: BTreeSet<(u64, u32, BlockId)>,
    /// CPU blocks: (tick, block), oldest first.
    cpu_lru: BTreeSet<(u64, BlockId)>,
    tick: u64,
    stats: CacheStats,
}

/// What admitting a request did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    /// Leading blocks taken from the cache (the hit, in blocks).
    pub hit_blocks: usize,
    /// Of those, blocks that came from the CPU tier.
    pub cpu_hit_blocks: usize,
    /// The cache's changes, in order.
    pub changes: Vec<Change>,
}

impl PrefixCache {
    /// A cache of `gpu_capacity` GPU blocks and `cpu_capacity` CPU blocks (0: no offload).
    pub fn new(gpu_capacity: usize, cpu_capacity: usize) -> PrefixCache {
        PrefixCache {
            gpu_capacity,
            cpu_capacity,
            gpu_used: 0,
            cpu_used: 0,
            entries: HashMap::new(),
            free: BTreeSet::new(),
            cpu_lru: BTreeSet::new(),
            tick: 0,
            stats: CacheStats::default(),
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// GPU blocks held.
    #[cfg(test)]
    pub fn gpu_blocks(&self) -> usize {
        self.gpu_used
    }

    /// The longest run of leading `ids` present on any tier, in blocks.
    pub fn prefix_len(&self, ids: &[BlockId]) -> usize {
        ids.iter()
            .take_while(|id| self.entries.contains_key(id))
            .count()
    }

    /// Places a request of `tokens` (whose full blocks are `ids`): its hit, its missing blocks
    /// stored, every block of it referenced until [`PrefixCache::release`].
    pub fn admit(&mut self, ids: &[BlockId], tokens: &[u32]) -> Admission {
        let hit_blocks = self.prefix_len(ids).min(max_hit_blocks(tokens.len()));
        let cpu_hit_blocks = ids[..hit_blocks]
            .iter()
            .filter(|id| self.entries.get(id).is_some_and(|e| !e.gpu))
            .count();
        let changes = self.acquire(ids, tokens);
        Admission {
            hit_blocks,
            cpu_hit_blocks,
            changes,
        }
    }

    /// References every block of `ids` and stores on GPU those not there (new blocks and
    /// CPU blocks loaded back), evicting as needed. Removals come first, then the stores,
    /// one event per run of consecutive stored blocks.
    pub fn acquire(&mut self, ids: &[BlockId], tokens: &[u32]) -> Vec<Change> {
        for id in ids {
            if let Some(e) = self.entries.get(id).copied() {
                if e.gpu {
                    self.reference(*id);
                }
            }
        }
        let mut removals = Vec::new();
        let mut to_store = Vec::new();
        for (i, id) in ids.iter().enumerate() {
            let on_gpu = self.entries.get(id).is_some_and(|e| e.gpu);
            if on_gpu {
                continue;
            }
            self.make_gpu_room(&mut removals);
            let entry = self.entries.entry(*id).or_default();
            entry.depth = i as u32;
            entry.gpu = true;
            self.gpu_used += 1;
            self.reference(*id);
            to_store.push(i);
        }
        let mut changes = removals;
        changes.extend(store_runs(ids, tokens, &to_store));
        changes
    }

    /// Drops one reference from every block of `ids`; a block no request references joins
    /// the free list as the most recently used, the deepest blocks first in line.
    pub fn release(&mut self, ids: &[BlockId]) {
        self.tick += 1;
        for id in ids {
            let Some(e) = self.entries.get_mut(id) else {
                continue;
            };
            e.refs = e.refs.saturating_sub(1);
            if e.refs == 0 && e.gpu && e.free_key.is_none() {
                let key = (self.tick, u32::MAX - e.depth);
                e.free_key = Some(key);
                self.free.insert((key.0, key.1, *id));
            }
        }
    }

    fn reference(&mut self, id: BlockId) {
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        e.refs += 1;
        if let Some((tick, rev)) = e.free_key.take() {
            self.free.remove(&(tick, rev, id));
        }
    }

    fn make_gpu_room(&mut self, changes: &mut Vec<Change>) {
        if self.gpu_used < self.gpu_capacity {
            return;
        }
        let Some((_, _, id)) = self.free.pop_first() else {
            self.stats.overflows += 1;
            return;
        };
        self.stats.gpu_evictions += 1;
        self.gpu_used -= 1;
        let on_cpu = self.entries.get(&id).is_some_and(|e| e.cpu);
        if self.cpu_capacity > 0 && !on_cpu {
            self.make_cpu_room(changes);
            self.cpu_used += 1;
            self.tick += 1;
            let cpu_tick = self.tick;
            self.cpu_lru.insert((cpu_tick, id));
            if let Some(e) = self.entries.get_mut(&id) {
                e.cpu = true;
                e.cpu_key = Some(cpu_tick);
            }
            changes.push(Change::Stored {
                blocks: vec![id],
                parent: None,
                tokens: Vec::new(),
                tier: Tier::Cpu,
            });
        }
        self.leave(id, Tier::Gpu, changes);
    }

    fn make_cpu_room(&mut self, changes: &mut Vec<Change>) {
        if self.cpu_used < self.cpu_capacity {
            return;
        }
        let Some((_, id)) = self.cpu_lru.pop_first() else {
            return;
        };
        self.stats.cpu_evictions += 1;
        self.cpu_used -= 1;
        self.leave(id, Tier::Cpu, changes);
    }

    /// Block `id` leaves `tier` (the engine reports the remove); forgotten once on neither.
    fn leave(&mut self, id: BlockId, tier: Tier, changes: &mut Vec<Change>) {
        changes.push(Change::Removed { block: id, tier });
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        match tier {
            Tier::Gpu => {
                e.gpu = false;
                e.free_key = None;
            }
            Tier::Cpu => {
                e.cpu = false;
                e.cpu_key = None;
            }
        }
        if !e.gpu && !e.cpu {
            self.entries.remove(&id);
        }
    }
}

/// One GPU `Stored` change per run of consecutive indices in `stored`.
fn store_runs(ids: &[BlockId], tokens: &[u32], stored: &[usize]) -> Vec<Change> {
    let mut changes = Vec::new();
    let mut start = 0;
    while start < stored.len() {
        let mut end = start + 1;
        while end < stored.len() && stored[end] == stored[end - 1] + 1 {
            end += 1;
        }
        let (first, last) = (stored[start], stored[end - 1]);
        changes.push(Change::Stored {
            blocks: ids[first..=last].to_vec(),
            parent: first.checked_sub(1).map(|p| ids[p]),
            tokens: tokens[first * BLOCK_SIZE..(last + 1) * BLOCK_SIZE].to_vec(),
            tier: Tier::Gpu,
        });
        start = end;
    }
    changes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt(start: u32, blocks: usize) -> Vec<u32> {
        (start..start + (blocks * BLOCK_SIZE) as u32).collect()
    }

    fn stored_blocks(changes: &[Change], tier: Tier) -> usize {
        changes
            .iter()
            .map(|c| match c {
                Change::Stored {
                    blocks, tier: t, ..
                } if *t == tier => blocks.len(),
                _ => 0,
            })
            .sum()
    }

    fn removed(changes: &[Change], tier: Tier) -> Vec<BlockId> {
        changes
            .iter()
            .filter_map(|c| match c {
                Change::Removed { block, tier: t } if *t == tier => Some(*block),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_block_is_named_by_its_prefix() {
        let a = block_ids(&[[1; 16], [2; 16]].concat());
        let b = block_ids(&[[3; 16], [2; 16]].concat());
        assert_eq!(a.len(), 2);
        assert_ne!(a[1], b[1], "the same tokens after another prefix");
        assert_eq!(
            block_ids(&[1; 40]).len(),
            2,
            "a partial block is not a block"
        );
    }

    #[test]
    fn the_hit_is_the_longest_leading_run_and_missing_blocks_are_stored() {
        let mut cache = PrefixCache::new(100, 0);
        let first = prompt(0, 4);
        let ids = block_ids(&first);
        let a = cache.admit(&ids, &first);
        assert_eq!(a.hit_blocks, 0);
        assert_eq!(
            a.changes,
            vec![Change::Stored {
                blocks: ids.clone(),
                parent: None,
                tokens: first.clone(),
                tier: Tier::Gpu
            }]
        );
        let mut second = first[..2 * BLOCK_SIZE].to_vec();
        second.extend(prompt(9_000, 3));
        let ids2 = block_ids(&second);
        let b = cache.admit(&ids2, &second);
        assert_eq!(b.hit_blocks, 2);
        let Change::Stored { blocks, parent, .. } = &b.changes[0] else {
            panic!("a store")
        };
        assert_eq!(blocks, &ids2[2..]);
        assert_eq!(*parent, Some(ids[1]), "chained to the last hit block");
    }

    #[test]
    fn a_fully_cached_aligned_prompt_recomputes_its_last_block() {
        let mut cache = PrefixCache::new(100, 0);
        let p = prompt(0, 3);
        let ids = block_ids(&p);
        cache.admit(&ids, &p);
        assert_eq!(cache.admit(&ids, &p).hit_blocks, 2);
        let mut longer = p.clone();
        longer.push(7);
        assert_eq!(cache.admit(&block_ids(&longer), &longer).hit_blocks, 3);
    }

    #[test]
    fn referenced_blocks_are_never_evicted_and_the_lru_tail_goes_first() {
        let mut cache = PrefixCache::new(4, 0);
        let a = prompt(0, 2);
        let ids_a = block_ids(&a);
        cache.admit(&ids_a, &a);
        cache.release(&ids_a);
        let b = prompt(1_000, 2);
        let ids_b = block_ids(&b);
        cache.admit(&ids_b, &b);
        // Full: a's blocks are free, b's are in flight. A new block evicts a's tail.
        let c = prompt(2_000, 1);
        let ids_c = block_ids(&c);
        let admitted = cache.admit(&ids_c, &c);
        assert_eq!(removed(&admitted.changes, Tier::Gpu), vec![ids_a[1]]);
        assert_eq!(cache.prefix_len(&ids_a), 1);
        assert_eq!(cache.prefix_len(&ids_b), 2, "in flight");
        // Nothing free any more: the pool runs over rather than evicting b or c.
        let d = prompt(3_000, 2);
        let admitted = cache.admit(&block_ids(&d), &d);
        assert_eq!(removed(&admitted.changes, Tier::Gpu), vec![ids_a[0]]);
        assert_eq!(cache.stats().overflows, 1);
        assert_eq!(cache.prefix_len(&ids_b), 2);
    }

    #[test]
    fn the_least_recently_released_goes_first() {
        let mut cache = PrefixCache::new(2, 0);
        let (a, b) = (prompt(0, 1), prompt(100, 1));
        let (ids_a, ids_b) = (block_ids(&a), block_ids(&b));
        cache.admit(&ids_a, &a);
        cache.admit(&ids_b, &b);
        cache.release(&ids_a);
        cache.release(&ids_b);
        // a is used again, so b is now the least recently used.
        let mut a2 = a.clone();
        a2.push(1);
        cache.admit(&ids_a, &a2);
        cache.release(&ids_a);
        let c = prompt(200, 1);
        let admitted = cache.admit(&block_ids(&c), &c);
        assert_eq!(removed(&admitted.changes, Tier::Gpu), ids_b);
    }

    #[test]
    fn offload_moves_evicted_blocks_to_cpu_where_they_still_hit() {
        let mut cache = PrefixCache::new(2, 2);
        let a = prompt(0, 2);
        let ids_a = block_ids(&a);
        cache.admit(&ids_a, &a);
        cache.release(&ids_a);
        let b = prompt(1_000, 2);
        let ids_b = block_ids(&b);
        let admitted = cache.admit(&ids_b, &b);
        // Each eviction: stored on CPU, then removed from GPU.
        let kinds: Vec<(Tier, bool)> = admitted
            .changes
            .iter()
            .map(|c| match c {
                Change::Stored { tier, .. } => (*tier, true),
                Change::Removed { tier, .. } => (*tier, false),
            })
            .collect();
        assert_eq!(
            kinds,
            vec![
                (Tier::Cpu, true),
                (Tier::Gpu, false),
                (Tier::Cpu, true),
                (Tier::Gpu, false),
                (Tier::Gpu, true)
            ]
        );
        cache.release(&ids_b);
        let mut again = a.clone();
        again.push(5);
        let back = cache.admit(&block_ids(&again), &again);
        assert_eq!(back.hit_blocks, 2);
        assert_eq!(back.cpu_hit_blocks, 2);
        assert_eq!(stored_blocks(&back.changes, Tier::Gpu), 2, "loaded back");
        assert_eq!(cache.gpu_blocks(), 2);
    }

    #[test]
    fn the_cpu_tier_evicts_its_own_oldest() {
        let mut cache = PrefixCache::new(1, 1);
        let mut seen = Vec::new();
        for n in 0..3 {
            let p = prompt(n * 100, 1);
            let ids = block_ids(&p);
            let admitted = cache.admit(&ids, &p);
            seen.extend(removed(&admitted.changes, Tier::Cpu));
            cache.release(&ids);
        }
        assert_eq!(seen, block_ids(&prompt(0, 1)));
        assert_eq!(cache.stats().cpu_evictions, 1);
    }
}

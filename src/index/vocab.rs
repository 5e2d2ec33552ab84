//! The index's shared vocabulary, at the bottom of its import graph: the interned ids, a
//! pod's value of one block ([`FieldValue`]), what a visit of one block found ([`Visit`]),
//! table sizing and the partition of an engine hash. Every other file of `index/` may use
//! it; it uses none of them.

use crate::medium::MediaSet;

/// An interned pod identifier (`{pod}.{namespace}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodId(pub u32);

/// An interned model name (a base model or a LoRA adapter's served name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelId(pub u32);

/// One registered event source: a (pod, DP rank) engine publisher.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceId(pub u32);

/// The pod-level residency of one block: what a Redis field's value is computed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldValue {
    /// Unix second of the last store (max over the pod's DP ranks).
    pub stored_at: u32,
    /// Every medium the pod holds the block on ([`crate::medium::Medium::NONE`] = unknown).
    pub media: MediaSet,
}

/// What [`LayerReader::visit`](super::LayerReader::visit) found for one block, in either
/// layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Visit {
    /// No source holds the block.
    Absent,
    /// The residents' fingerprint equals the one given: nobody was visited.
    Unchanged,
    /// Every resident was visited; their fingerprint, for the next block's call.
    Visited(u64),
}

/// Approximate heap bytes of a hashbrown table with `capacity` usable slots.
pub(crate) fn table_bytes<K, V>(capacity: usize) -> usize {
    if capacity == 0 {
        return 0;
    }
    let buckets = (capacity * 8 / 7).next_power_of_two();
    buckets * (std::mem::size_of::<(K, V)>() + 1)
}

/// The partition of a 64-bit engine-hash key among `partitions` (a multiplicative mix, so
/// sequential hashes spread evenly).
#[inline]
pub(crate) fn partition_of_bits(bits: u64, partitions: u32) -> u32 {
    let mixed = (bits ^ (bits >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    ((mixed >> 32) % u64::from(partitions.max(1))) as u32
}

/// The partition of a bytes engine hash among `partitions` (FNV-1a, then the same mix).
#[inline]
pub(crate) fn partition_of_bytes(bytes: &[u8], partitions: u32) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    partition_of_bits(h, partitions)
}

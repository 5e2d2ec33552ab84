//! Chunked walks for the mirror's background passes (reconcile, anti-entropy, refresh): a
//! resumable cursor over every source's engine hashes, point lookups, and the refresh of a
//! resident's store time.
//!
//! A pass never copies the index and never holds a lock for long: the cursor visits one
//! partition of one source per call. An engine hash's partition is a function of the hash
//! alone, so a hash map with no stable order can still be walked in pieces: each call scans
//! the source's map under its lock (cheap per entry) but copies out only one partition
//! of about [`PARTITION_TARGET`] entries. Entries added to an already walked partition are
//! missed by that pass, which is fine: their store wrote them a moment ago.

use std::sync::Arc;

use hashbrown::HashMap;
use parking_lot::Mutex;

use super::residents;
use super::source::SourceState;
use super::vocab::{FieldValue, ModelId, PodId};
use super::Index;
use crate::wire::{BlockHash, Engine};

/// Engine hashes a partition aims at: bounds what one call copies out.
const PARTITION_TARGET: usize = 8192;
/// Partitions of a source at least: a source that grows while it is walked (its partition
/// count is fixed when the walk enters it) still yields pieces of a bounded share.
const MIN_PARTITIONS: usize = 64;

/// Where a walk over the engine hashes of every source stands.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WalkCursor {
    /// Slot of the source being walked.
    source: usize,
    /// Partition of that source to visit next.
    partition: u32,
    /// Partitions of that source, fixed when the walk enters it (0 = not entered yet).
    partitions: u32,
    done: bool,
}

impl WalkCursor {
    /// A cursor at the start of a walk.
    pub fn new() -> WalkCursor {
        WalkCursor::default()
    }

    /// Whether the walk has visited every source.
    pub fn is_done(&self) -> bool {
        self.done
    }

    fn next_source(&mut self) {
        self.source += 1;
        self.partition = 0;
        self.partitions = 0;
    }
}

/// One engine block met by a walk, with the pod-level field it contributes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalkEntry {
    /// Pod of the source.
    pub pod: PodId,
    /// DP rank of the source.
    pub rank: u8,
    /// Engine family (mapping-key prefix).
    pub engine: Engine,
    /// Model of the block.
    pub model: ModelId,
    /// Standardized hash.
    pub std_hash: u64,
    /// Engine hash as sent.
    pub engine_hash: BlockHash,
    /// Media this source's engine block is resident on (its checkpoint entry).
    pub media: crate::medium::MediaSet,
    /// Chain hash of the block (its checkpoint entry); 0 when it has none.
    pub chain: u64,
    /// The pod's field value of the block (`None` when it went away since the walk read it).
    pub field: Option<FieldValue>,
    /// Last store (or refresh) time of this source's resident of the block.
    pub resident_at: Option<u32>,
}

/// The registered sources grouped by pod: the pods this index owns, taken once per chunk
/// of a background pass so lookups need no walk over the source list.
pub struct OwnedPods {
    by_pod: HashMap<u32, Vec<Arc<Mutex<SourceState>>>>,
    /// The index the sources are in, whose chain runs keep most blocks' std hashes.
    index: Index,
}

impl std::fmt::Debug for OwnedPods {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedPods")
            .field("pods", &self.by_pod.len())
            .finish()
    }
}

impl OwnedPods {
    /// Whether `pod` has a registered source.
    pub fn contains(&self, pod: PodId) -> bool {
        self.by_pod.contains_key(&pod.0)
    }

    /// The owned pods, in no order.
    pub fn ids(&self) -> impl Iterator<Item = PodId> + '_ {
        self.by_pod.keys().map(|p| PodId(*p))
    }

    /// Whether no pod is owned.
    pub fn is_empty(&self) -> bool {
        self.by_pod.is_empty()
    }

    /// The std hash any source (DP rank) of `pod` maps `hash` to, if one holds it.
    pub fn engine_hash_std(&self, pod: PodId, hash: &BlockHash) -> Option<u64> {
        self.by_pod
            .get(&pod.0)?
            .iter()
            .find_map(|s| self.index.source_std(s, hash))
    }
}

impl Index {
    /// Appends the entries of the next partition to `out` and advances `cursor`; sets the
    /// cursor done when every source was visited. One call locks one source once.
    pub fn walk_engine_hashes(&self, cursor: &mut WalkCursor, out: &mut Vec<WalkEntry>) {
        let state = loop {
            let slot = self.inner.sources.read().get(cursor.source).cloned();
            match slot {
                None => {
                    cursor.done = true;
                    return;
                }
                Some(None) => cursor.next_source(),
                Some(Some(state)) => break state,
            }
        };
        let first = out.len();
        let (pod, rank) = {
            let s = state.lock();
            let chains = self.inner.chains.read_recursive();
            if cursor.partitions == 0 {
                let wanted = s.len().div_ceil(PARTITION_TARGET).max(MIN_PARTITIONS);
                cursor.partitions = u32::try_from(wanted).unwrap_or(u32::MAX);
            }
            for (hash, held) in s.partition_entries(&chains, cursor.partition, cursor.partitions) {
                out.push(WalkEntry {
                    pod: PodId(s.pod),
                    rank: s.rank,
                    engine: s.engine,
                    model: ModelId(held.model()),
                    std_hash: held.std(),
                    engine_hash: hash,
                    media: held.media(),
                    chain: held.chain(),
                    field: None,
                    resident_at: None,
                });
            }
            (s.pod, s.rank)
        };
        // Field values are read after the source's lock is released: ingest waits less.
        for e in &mut out[first..] {
            let (field, at) = self.resident_of(e.model, e.std_hash, pod, rank);
            e.field = field;
            e.resident_at = at;
        }
        cursor.partition += 1;
        if cursor.partition >= cursor.partitions {
            cursor.next_source();
        }
    }

    /// The pod-level field of `(model, std_hash, pod)` and the store time of `(pod, rank)`'s
    /// resident.
    fn resident_of(
        &self,
        model: ModelId,
        std_hash: u64,
        pod: u32,
        rank: u8,
    ) -> (Option<FieldValue>, Option<u32>) {
        let Some(blocks) = self.blocks_of(model.0) else {
            return (None, None);
        };
        let Some(entry) = blocks.get(&std_hash) else {
            return (None, None);
        };
        let list = entry.as_slice();
        let at = list
            .iter()
            .find(|r| r.pod() == pod && r.rank() == rank)
            .map(|r| r.stored_at);
        (residents::pod_value(list, pod), at)
    }

    /// Sets the store time of `(pod, rank)`'s resident of a block to `now` when it is at or
    /// before `due`, so later rewrites of the field write the refreshed value. Returns the
    /// pod's field value afterwards (`None` when the pod no longer holds the block), the
    /// resident's store time afterwards, and whether it was moved.
    pub fn refresh_resident(
        &self,
        model: ModelId,
        std_hash: u64,
        pod: PodId,
        rank: u8,
        due: u32,
        now: u32,
    ) -> (Option<FieldValue>, Option<u32>, bool) {
        let Some(blocks) = self.blocks_of(model.0) else {
            return (None, None, false);
        };
        let Some(mut entry) = blocks.get_mut(&std_hash) else {
            return (None, None, false);
        };
        let mut moved = false;
        let mut at = None;
        entry.edit(pod.0, rank, |r| {
            if r.stored_at <= due && !r.media().is_empty() {
                r.stored_at = now;
                moved = true;
            }
            at = Some(r.stored_at);
        });
        (entry.pod_value(pod.0), at, moved)
    }

    /// The registered sources grouped by pod.
    pub fn owned_pods(&self) -> OwnedPods {
        let mut owned = OwnedPods {
            by_pod: HashMap::new(),
            index: self.clone(),
        };
        for source in self.live_sources() {
            let pod = source.lock().pod;
            owned.by_pod.entry(pod).or_default().push(source);
        }
        owned
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::{Discard, SourceSpec};
    use crate::medium::Medium;
    use crate::wire::{BlockStored, EngineBatch, Event};

    fn index_with(blocks: u64) -> (Index, crate::index::SourceId) {
        let index = Index::new();
        let src = index
            .register_source(&SourceSpec {
                pod: "p.ns".into(),
                model: "m".into(),
                engine: Engine::Vllm,
                dp_rank: 0,
            })
            .unwrap();
        let events = (0..blocks)
            .map(|i| {
                let t = i as u32;
                Event::BlockStored(BlockStored::new(
                    vec![BlockHash::Int(i)],
                    vec![t, t + 1, t + 2, t + 3],
                    4,
                    Medium::GPU,
                ))
            })
            .collect();
        index
            .apply(src, &EngineBatch::of(events), 100, &mut Discard)
            .unwrap();
        (index, src)
    }

    #[test]
    fn a_walk_visits_every_engine_hash_once_in_several_partitions() {
        let (index, _) = index_with(20_000);
        let mut cursor = WalkCursor::new();
        let mut out = Vec::new();
        let mut calls = 0;
        while !cursor.is_done() {
            index.walk_engine_hashes(&mut cursor, &mut out);
            calls += 1;
        }
        assert!(calls >= 64, "{calls} calls");
        let mut seen: Vec<String> = out.iter().map(|e| e.engine_hash.to_string()).collect();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 20_000);
        assert_eq!(out.len(), 20_000);
        assert!(out
            .iter()
            .all(|e| e.field.is_some() && e.resident_at == Some(100)));
    }

    #[test]
    fn a_walk_visits_whole_slots_once_too() {
        // Blocks stored after a parent the source does not hold have no chain: the source
        // keeps their slots whole, in the map beside the spots.
        let (index, src) = index_with(3_000);
        let events = (0..3_000u64)
            .map(|i| {
                let t = 100_000 + i as u32;
                let mut stored = BlockStored::new(
                    vec![BlockHash::Int(1_000_000 + i)],
                    vec![t, t + 1, t + 2, t + 3],
                    4,
                    Medium::GPU,
                );
                stored.parent_block_hash = Some(BlockHash::Int(u64::MAX - i));
                Event::BlockStored(stored)
            })
            .collect();
        index
            .apply(src, &EngineBatch::of(events), 100, &mut Discard)
            .unwrap();
        let mut cursor = WalkCursor::new();
        let mut out = Vec::new();
        while !cursor.is_done() {
            index.walk_engine_hashes(&mut cursor, &mut out);
        }
        assert!(out.iter().any(|e| e.chain == 0), "whole slots are walked");
        assert_eq!(out.len(), 6_000, "each engine hash once");
    }

    #[test]
    fn a_refresh_moves_only_due_residents_and_changes_the_field_time() {
        let (index, _) = index_with(1);
        let mut cursor = WalkCursor::new();
        let mut out = Vec::new();
        index.walk_engine_hashes(&mut cursor, &mut out);
        let e = &out[0];
        let (value, at, moved) = index.refresh_resident(e.model, e.std_hash, e.pod, 0, 99, 200);
        assert!(!moved);
        assert_eq!((value.map(|v| v.stored_at), at), (Some(100), Some(100)));
        let (value, at, moved) = index.refresh_resident(e.model, e.std_hash, e.pod, 0, 100, 200);
        assert!(moved);
        assert_eq!(at, Some(200));
        assert_eq!(value.map(|v| v.stored_at), Some(200));
        assert_eq!(
            index
                .field_value(e.model, e.std_hash, e.pod)
                .map(|v| v.stored_at),
            Some(200)
        );
        let owned = index.owned_pods();
        assert!(owned.contains(e.pod));
        assert_eq!(
            owned.engine_hash_std(e.pod, &BlockHash::Int(0)),
            Some(e.std_hash)
        );
        assert_eq!(owned.engine_hash_std(e.pod, &BlockHash::Int(1)), None);
    }
}

//! The in-memory residency index: which pod holds which block on which tier.
//!
//! | file | job |
//! | --- | --- |
//! | `mod.rs` | [`Index`]: apply batches, forget sources, look up owners, dump |
//! | `source.rs` | per (pod, DP rank) engine-hash map, the set of blocks a source holds |
//! | `residents.rs` | compact per-block list of resident sources |
//! | `delta.rs` | [`Delta`]s for mirrors, [`DeltaSink`] |
//! | `intern.rs` | pod and model name interning |
//!
//! Concurrency: blocks live in one concurrent map per model (sharded locks, readers never
//! wait for a whole-index lock); each source's state sits behind its own mutex, which only
//! that source's ingest task takes on the hot path.

mod delta;
mod intern;
mod residents;
mod source;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use parking_lot::{Mutex, RwLock};
use serde::Serialize;

pub use delta::{Delta, DeltaMirror, DeltaSink, Discard, FieldValue};

use crate::hash::std_hash;
use crate::medium::{MediaSet, Medium, MEDIA_SLOTS};
use crate::wire::{BlockHash, BlockRemoved, BlockStored, Engine, EngineBatch, Event};
use intern::Interner;
use residents::{Resident, Residents, MAX_POD_ID};
use source::{table_bytes, SourceState};

/// An interned pod identifier (`{pod}.{namespace}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodId(pub u32);

/// An interned model name (a base model or a LoRA adapter's served name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelId(pub u32);

/// One registered event source: a (pod, DP rank) engine publisher.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceId(pub u32);

/// Describes a source when it is registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceSpec {
    /// Pod identifier as written to Redis: `{pod}.{namespace}`.
    pub pod: String,
    /// Served model name of the pod.
    pub model: String,
    /// Engine family.
    pub engine: Engine,
    /// DP rank (0 … 255).
    pub dp_rank: u8,
}

/// Why a source could not be registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IndexError {
    /// More pods than a resident can name.
    #[error("too many pods: the index holds at most {max} pod identifiers")]
    TooManyPods {
        /// The limit.
        max: u32,
    },
    /// The source id is not registered.
    #[error("source {0} is not registered")]
    UnknownSource(u32),
}

/// Counters from applying events; summed by callers for summaries and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ApplyStats {
    /// Blocks stored (new, refreshed or gaining a medium).
    pub blocks_stored: u64,
    /// Blocks removed from at least one medium.
    pub blocks_removed: u64,
    /// `AllBlocksCleared` events applied.
    pub clears: u64,
    /// Tokenless stores whose engine hash this source never stored.
    pub unresolved_stores: u64,
    /// Removes of engine hashes this source does not hold.
    pub unknown_removes: u64,
    /// Removes naming a medium the block was not on.
    pub noop_removes: u64,
    /// Blocks of non-main KV-cache groups (hybrid models), skipped.
    pub skipped_group_blocks: u64,
    /// Stores whose std block this source already held through another engine hash.
    pub duplicate_engine_hashes: u64,
}

impl ApplyStats {
    /// Adds `other` into `self`.
    pub fn add(&mut self, other: &ApplyStats) {
        self.blocks_stored += other.blocks_stored;
        self.blocks_removed += other.blocks_removed;
        self.clears += other.clears;
        self.unresolved_stores += other.unresolved_stores;
        self.unknown_removes += other.unknown_removes;
        self.noop_removes += other.noop_removes;
        self.skipped_group_blocks += other.skipped_group_blocks;
        self.duplicate_engine_hashes += other.duplicate_engine_hashes;
    }
}

/// One resident (block, pod) in the canonical dump form.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, serde::Deserialize)]
pub struct DumpEntry {
    /// Model name.
    pub model: String,
    /// Standardized hash, decimal.
    pub std_hash: String,
    /// Pod identifier.
    pub pod: String,
    /// Media spellings, sorted (empty when no medium was reported).
    pub media: Vec<String>,
    /// Unix second of the last store.
    pub stored_at: u32,
}

/// Size figures of the index.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct IndexStats {
    /// Distinct (model, std hash) blocks.
    pub blocks: usize,
    /// Resident (block, pod) entries.
    pub entries: usize,
    /// Engine hashes held over all sources.
    pub engine_hashes: usize,
    /// Registered sources.
    pub sources: usize,
    /// (block, pod) entries per medium spelling (`""` = no medium reported).
    pub entries_by_medium: Vec<(String, usize)>,
    /// Estimated heap bytes of the index tables.
    pub heap_bytes: usize,
}

type ModelBlocks = DashMap<u64, Residents, hashbrown::DefaultHashBuilder>;

/// Every medium bit: what a `BlockRemoved` without medium removes.
const ALL_MEDIA: u32 = (1 << MEDIA_SLOTS) - 1;

/// The residency index. Cheap to clone (shared state).
#[derive(Clone, Default)]
pub struct Index {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    models: Interner,
    pods: Interner,
    blocks: RwLock<Vec<Arc<ModelBlocks>>>,
    sources: RwLock<Vec<Option<Arc<Mutex<SourceState>>>>>,
    /// Resident (block, pod) entries, kept as fields change so metrics need no index walk.
    entries: AtomicI64,
    /// The same, per medium slot.
    entries_by_slot: [AtomicI64; MEDIA_SLOTS],
}

impl Index {
    /// An empty index.
    pub fn new() -> Index {
        Index::default()
    }

    /// Registers a source, or returns the id it already has.
    ///
    /// # Errors
    /// [`IndexError::TooManyPods`] past 2^24 pod identifiers.
    pub fn register_source(&self, spec: &SourceSpec) -> Result<SourceId, IndexError> {
        let pod = self.inner.pods.intern(&spec.pod);
        if pod > MAX_POD_ID {
            return Err(IndexError::TooManyPods { max: MAX_POD_ID });
        }
        let model = self.intern_model(&spec.model);
        let mut sources = self.inner.sources.write();
        for (id, slot) in sources.iter().enumerate() {
            if let Some(state) = slot {
                let s = state.lock();
                if s.pod == pod && s.rank == spec.dp_rank {
                    return Ok(SourceId(id as u32));
                }
            }
        }
        let state = SourceState::new(pod, spec.dp_rank, spec.engine, model.0);
        sources.push(Some(Arc::new(Mutex::new(state))));
        Ok(SourceId(sources.len() as u32 - 1))
    }

    /// Sources registered for `pod` (identifier `{pod}.{namespace}`).
    pub fn sources_of_pod(&self, pod: &str) -> Vec<SourceId> {
        let Some(pod) = self.inner.pods.get(pod) else {
            return Vec::new();
        };
        self.inner
            .sources
            .read()
            .iter()
            .enumerate()
            .filter_map(|(id, s)| {
                s.as_ref()
                    .filter(|s| s.lock().pod == pod)
                    .map(|_| SourceId(id as u32))
            })
            .collect()
    }

    fn source(&self, id: SourceId) -> Result<Arc<Mutex<SourceState>>, IndexError> {
        self.inner
            .sources
            .read()
            .get(id.0 as usize)
            .and_then(Clone::clone)
            .ok_or(IndexError::UnknownSource(id.0))
    }

    fn intern_model(&self, name: &str) -> ModelId {
        let id = self.inner.models.intern(name);
        let missing = self.inner.blocks.read().len() <= id as usize;
        if missing {
            let mut blocks = self.inner.blocks.write();
            while blocks.len() <= id as usize {
                blocks.push(Arc::new(ModelBlocks::default()));
            }
        }
        ModelId(id)
    }

    fn blocks_of(&self, model: u32) -> Option<Arc<ModelBlocks>> {
        self.inner.blocks.read().get(model as usize).cloned()
    }

    /// Applies one batch of `source` in order, emitting deltas for every changed field.
    /// `now` is the unix second recorded as the store time.
    ///
    /// # Errors
    /// [`IndexError::UnknownSource`] when `source` is not registered.
    pub fn apply(
        &self,
        source: SourceId,
        batch: &EngineBatch,
        now: u32,
        sink: &mut impl DeltaSink,
    ) -> Result<ApplyStats, IndexError> {
        let state = self.source(source)?;
        let mut state = state.lock();
        let mut stats = ApplyStats::default();
        for event in &batch.events {
            match event {
                Event::BlockStored(stored) => {
                    self.apply_stored(&mut state, stored, now, sink, &mut stats)
                }
                Event::BlockRemoved(removed) => {
                    self.apply_removed(&mut state, removed, sink, &mut stats)
                }
                Event::AllBlocksCleared => {
                    self.clear_state(&mut state, sink);
                    stats.clears += 1;
                }
            }
        }
        Ok(stats)
    }

    /// Drops every block of `source` (engine restart, unfillable gap), keeping it registered.
    ///
    /// # Errors
    /// [`IndexError::UnknownSource`] when `source` is not registered.
    pub fn clear_source(
        &self,
        source: SourceId,
        sink: &mut impl DeltaSink,
    ) -> Result<(), IndexError> {
        let state = self.source(source)?;
        let mut state = state.lock();
        self.clear_state(&mut state, sink);
        Ok(())
    }

    /// Drops every block of `source` and unregisters it.
    ///
    /// # Errors
    /// [`IndexError::UnknownSource`] when `source` is not registered.
    pub fn remove_source(
        &self,
        source: SourceId,
        sink: &mut impl DeltaSink,
    ) -> Result<(), IndexError> {
        self.clear_source(source, sink)?;
        if let Some(slot) = self.inner.sources.write().get_mut(source.0 as usize) {
            *slot = None;
        }
        Ok(())
    }

    /// Forgets a pod: every source of it is cleared and unregistered.
    pub fn forget_pod(&self, pod: &str, sink: &mut impl DeltaSink) {
        for source in self.sources_of_pod(pod) {
            // A concurrent removal of the same source is harmless: it is gone either way.
            let _ = self.remove_source(source, sink);
        }
    }

    fn apply_stored(
        &self,
        state: &mut SourceState,
        stored: &BlockStored,
        now: u32,
        sink: &mut impl DeltaSink,
        stats: &mut ApplyStats,
    ) {
        let blocks = stored.block_hashes.len() as u64;
        if !state.is_main_group(stored.group_idx, stored.kv_cache_spec_kind.as_deref()) {
            stats.skipped_group_blocks += blocks;
            return;
        }
        let model = match &stored.lora_name {
            Some(name) => self.intern_model(name).0,
            None => state.base_model,
        };
        let media = MediaSet::single(stored.medium);
        let tokenless = stored.token_ids.is_empty();
        for (i, hash) in stored.block_hashes.iter().enumerate() {
            let std = if tokenless {
                None
            } else {
                Some(std_hash(stored.block_tokens(i)))
            };
            self.store_block(state, model, hash, std, media, now, sink, stats);
        }
    }

    /// Stores one engine block; `std` is `None` for a tokenless tier copy.
    #[allow(clippy::too_many_arguments)]
    fn store_block(
        &self,
        state: &mut SourceState,
        model: u32,
        hash: &BlockHash,
        std: Option<u64>,
        media: MediaSet,
        now: u32,
        sink: &mut impl DeltaSink,
        stats: &mut ApplyStats,
    ) {
        let existing = state
            .find_mut(hash, model)
            .map(|(m, slot)| (m, slot.std(), slot.media()));
        let (model, std, added, new_copy) = match (existing, std) {
            (None, None) => {
                stats.unresolved_stores += 1;
                return;
            }
            (Some((m, old_std, old_media)), None) => {
                (m, old_std, media.difference(old_media), false)
            }
            (Some((m, old_std, old_media)), Some(std)) if m == model && old_std == std => {
                (m, std, media.difference(old_media), false)
            }
            (Some((m, old_std, old_media)), Some(std)) => {
                // The engine reused a hash for other content: the old block is gone.
                state.remove(m, hash);
                self.drop_engine_media(state, m, old_std, old_media, true, sink);
                self.insert_slot(state, model, hash, std, media, sink);
                (model, std, media, true)
            }
            (None, Some(std)) => {
                self.insert_slot(state, model, hash, std, media, sink);
                (model, std, media, true)
            }
        };
        if !new_copy {
            if let Some((_, slot)) = state.find_mut(hash, model) {
                slot.set_media(slot.media().union(media));
            }
        }
        if self.add_engine_media(state, model, std, added, new_copy, now, sink) {
            stats.duplicate_engine_hashes += 1;
        }
        if sink.wants_mappings() {
            sink.push(Delta::Mapping {
                pod: PodId(state.pod),
                engine: state.engine,
                engine_hash: hash.clone(),
                std_hash: Some(std),
            });
        }
        stats.blocks_stored += 1;
    }

    /// Adds an engine slot. Int keys hold only the 64 bits, so a hash with the same bits
    /// and the other sign (found by fuzzing) is displaced: that block is dropped like a
    /// reused hash, its mapping key included.
    fn insert_slot(
        &self,
        state: &mut SourceState,
        model: u32,
        hash: &BlockHash,
        std: u64,
        media: MediaSet,
        sink: &mut impl DeltaSink,
    ) {
        let Some((twin, old)) = state.insert(model, hash, std, media) else {
            return;
        };
        self.drop_engine_media(state, model, old.std(), old.media(), true, sink);
        if sink.wants_mappings() {
            sink.push(Delta::Mapping {
                pod: PodId(state.pod),
                engine: state.engine,
                engine_hash: twin,
                std_hash: None,
            });
        }
    }

    /// Records `added` media (and a new engine copy) on the source's resident of the block;
    /// returns whether the block is now held through more than one engine hash.
    #[allow(clippy::too_many_arguments)]
    fn add_engine_media(
        &self,
        state: &mut SourceState,
        model: u32,
        std: u64,
        added: MediaSet,
        new_copy: bool,
        now: u32,
        sink: &mut impl DeltaSink,
    ) -> bool {
        let Some(blocks) = self.blocks_of(model) else {
            return false;
        };
        let (pod, rank) = (state.pod, state.rank);
        let mut entry = match blocks.entry(std) {
            Entry::Vacant(vacant) => {
                vacant.insert(Residents::One(Resident::new(pod, rank, now, added)));
                emit_field(
                    &self.inner,
                    sink,
                    model,
                    std,
                    pod,
                    None,
                    Some(FieldValue {
                        stored_at: now,
                        media: added,
                    }),
                );
                return false;
            }
            Entry::Occupied(occupied) => occupied,
        };
        let residents = entry.get_mut();
        let before = residents.pod_value(pod);
        let mut duplicate = false;
        match residents.find_mut(pod, rank) {
            None => residents.push(Resident::new(pod, rank, now, added)),
            Some(resident) => {
                let copies = resident.copies();
                if new_copy {
                    duplicate = true;
                    if copies == 1 {
                        let mut counts = [0u16; MEDIA_SLOTS];
                        for m in resident.media().iter() {
                            counts[m.slot() as usize] = 1;
                        }
                        state.dups.insert((model, std), counts);
                    }
                    resident.set_copies(copies.saturating_add(1));
                }
                if resident.copies() > 1 {
                    if let Some(counts) = state.dups.get_mut(&(model, std)) {
                        for m in added.iter() {
                            let c = &mut counts[m.slot() as usize];
                            *c = c.saturating_add(1);
                        }
                    }
                }
                resident.set_media(resident.media().union(added));
                resident.stored_at = now;
            }
        }
        let after = residents.pod_value(pod);
        drop(entry);
        emit_field(&self.inner, sink, model, std, pod, before, after);
        duplicate
    }

    /// Takes `removed` media off the source's resident of the block; `slot_gone` when the
    /// engine block itself is no longer held.
    fn drop_engine_media(
        &self,
        state: &mut SourceState,
        model: u32,
        std: u64,
        removed: MediaSet,
        slot_gone: bool,
        sink: &mut impl DeltaSink,
    ) {
        let Some(blocks) = self.blocks_of(model) else {
            return;
        };
        let (pod, rank) = (state.pod, state.rank);
        let Entry::Occupied(mut entry) = blocks.entry(std) else {
            return;
        };
        let residents = entry.get_mut();
        let before = residents.pod_value(pod);
        let Some(resident) = residents.find_mut(pod, rank) else {
            return;
        };
        let copies = resident.copies();
        if copies > 1 {
            let counts = state.dups.entry((model, std)).or_insert([0; MEDIA_SLOTS]);
            for m in removed.iter() {
                let c = &mut counts[m.slot() as usize];
                *c = c.saturating_sub(1);
            }
            let mut media = MediaSet::EMPTY;
            for (slot, c) in counts.iter().enumerate() {
                if *c > 0 {
                    media.insert(slot_medium(slot));
                }
            }
            resident.set_media(media);
        } else {
            resident.set_media(resident.media().difference(removed));
        }
        let mut drop_resident = resident.media().is_empty();
        if slot_gone {
            let left = copies.saturating_sub(1);
            resident.set_copies(left);
            if left <= 1 {
                state.dups.remove(&(model, std));
            }
            drop_resident |= left == 0;
        }
        let after = if drop_resident {
            if residents.remove(pod, rank) {
                entry.remove();
                None
            } else {
                entry.get().pod_value(pod)
            }
        } else {
            residents.pod_value(pod)
        };
        emit_field(&self.inner, sink, model, std, pod, before, after);
    }

    fn apply_removed(
        &self,
        state: &mut SourceState,
        removed: &BlockRemoved,
        sink: &mut impl DeltaSink,
        stats: &mut ApplyStats,
    ) {
        if !state.is_main_group(removed.group_idx, None) {
            stats.skipped_group_blocks += removed.block_hashes.len() as u64;
            return;
        }
        let mask = if removed.medium.is_none() {
            MediaSet::from_bits(ALL_MEDIA)
        } else {
            // A block stored without a medium may be on any tier: any remove takes it off.
            let mut mask = removed.medium.same_tier_mask();
            mask.insert(Medium::NONE);
            mask
        };
        let base = state.base_model;
        for hash in &removed.block_hashes {
            let Some((model, slot)) = state.find_mut(hash, base) else {
                stats.unknown_removes += 1;
                continue;
            };
            let taken = MediaSet::from_bits(slot.media().bits() & mask.bits());
            if taken.is_empty() {
                stats.noop_removes += 1;
                continue;
            }
            let left = slot.media().difference(taken);
            slot.set_media(left);
            let std = slot.std();
            let gone = left.is_empty();
            if gone {
                state.remove(model, hash);
                if sink.wants_mappings() {
                    sink.push(Delta::Mapping {
                        pod: PodId(state.pod),
                        engine: state.engine,
                        engine_hash: hash.clone(),
                        std_hash: None,
                    });
                }
            }
            self.drop_engine_media(state, model, std, taken, gone, sink);
            stats.blocks_removed += 1;
        }
    }

    fn clear_state(&self, state: &mut SourceState, sink: &mut impl DeltaSink) {
        let (pod, rank) = (state.pod, state.rank);
        let wants_mappings = sink.wants_mappings();
        for map in &state.maps {
            let Some(blocks) = self.blocks_of(map.model) else {
                continue;
            };
            for slot in map.slots() {
                let std = slot.std();
                let Entry::Occupied(mut entry) = blocks.entry(std) else {
                    continue;
                };
                let before = entry.get().pod_value(pod);
                if entry.get_mut().find_mut(pod, rank).is_none() {
                    continue;
                }
                let after = if entry.get_mut().remove(pod, rank) {
                    entry.remove();
                    None
                } else {
                    entry.get().pod_value(pod)
                };
                emit_field(&self.inner, sink, map.model, std, pod, before, after);
            }
            if wants_mappings {
                for (engine_hash, _) in map.entries() {
                    sink.push(Delta::Mapping {
                        pod: PodId(pod),
                        engine: state.engine,
                        engine_hash,
                        std_hash: None,
                    });
                }
            }
        }
        state.clear();
    }

    /// The id of a model name, if any block or source ever used it.
    pub fn model_id(&self, name: &str) -> Option<ModelId> {
        self.inner.models.get(name).map(ModelId)
    }

    /// The id of a pod identifier, if it was ever registered.
    pub fn pod_id(&self, name: &str) -> Option<PodId> {
        self.inner.pods.get(name).map(PodId)
    }

    /// The name of a model id.
    pub fn model_name(&self, id: ModelId) -> Arc<str> {
        self.inner.models.name(id.0)
    }

    /// The identifier of a pod id.
    pub fn pod_name(&self, id: PodId) -> Arc<str> {
        self.inner.pods.name(id.0)
    }

    /// The engine of a registered source.
    ///
    /// # Errors
    /// [`IndexError::UnknownSource`] when `source` is not registered.
    pub fn source_engine(&self, source: SourceId) -> Result<Engine, IndexError> {
        Ok(self.source(source)?.lock().engine)
    }

    /// Calls `visit(pod, media, stored_at)` for every resident of a block. A pod with several
    /// DP ranks holding the block is visited once per rank; callers combine them.
    pub fn for_each_resident(
        &self,
        model: ModelId,
        std_hash: u64,
        mut visit: impl FnMut(PodId, MediaSet, u32),
    ) {
        let Some(blocks) = self.blocks_of(model.0) else {
            return;
        };
        if let Some(entry) = blocks.get(&std_hash) {
            for r in entry.as_slice() {
                visit(PodId(r.pod()), r.media(), r.stored_at);
            }
        };
    }

    /// Calls `visit` with the pod-level value of every resident (block, pod), in no order.
    pub fn for_each_field(&self, mut visit: impl FnMut(ModelId, u64, PodId, FieldValue)) {
        let models: Vec<Arc<ModelBlocks>> = self.inner.blocks.read().clone();
        for (model, blocks) in models.iter().enumerate() {
            for entry in blocks.iter() {
                let residents = entry.value().as_slice();
                for (i, r) in residents.iter().enumerate() {
                    // Visit each pod once: at its first resident.
                    if residents[..i].iter().any(|p| p.pod() == r.pod()) {
                        continue;
                    }
                    if let Some(value) = residents::pod_value(residents, r.pod()) {
                        visit(ModelId(model as u32), *entry.key(), PodId(r.pod()), value);
                    }
                }
            }
        }
    }

    /// Calls `visit(pod, engine, engine_hash, std_hash)` for every engine hash held.
    pub fn for_each_mapping(&self, mut visit: impl FnMut(PodId, Engine, BlockHash, u64)) {
        let sources: Vec<Arc<Mutex<SourceState>>> = self
            .inner
            .sources
            .read()
            .iter()
            .flatten()
            .cloned()
            .collect();
        for source in sources {
            let state = source.lock();
            for map in &state.maps {
                for (hash, slot) in map.entries() {
                    visit(PodId(state.pod), state.engine, hash, slot.std());
                }
            }
        }
    }

    /// The whole index in canonical sorted form.
    pub fn dump(&self) -> Vec<DumpEntry> {
        let mut out = Vec::new();
        self.for_each_field(|model, std, pod, value| {
            out.push(DumpEntry {
                model: self.model_name(model).to_string(),
                std_hash: std.to_string(),
                pod: self.pod_name(pod).to_string(),
                media: value
                    .media
                    .spellings()
                    .into_iter()
                    .map(str::to_owned)
                    .collect(),
                stored_at: value.stored_at,
            });
        });
        out.sort();
        out
    }

    /// Size figures (walks the whole index: for summaries and periodic metrics).
    pub fn stats(&self) -> IndexStats {
        let mut stats = IndexStats::default();
        let mut by_medium = [0usize; MEDIA_SLOTS];
        self.for_each_field(|_, _, _, value| {
            stats.entries += 1;
            for m in value.media.iter() {
                by_medium[m.slot() as usize] += 1;
            }
        });
        let models: Vec<Arc<ModelBlocks>> = self.inner.blocks.read().clone();
        for blocks in &models {
            stats.blocks += blocks.len();
            stats.heap_bytes += table_bytes::<u64, Residents>(blocks.capacity());
            for entry in blocks.iter() {
                if let Residents::Many(v) = entry.value() {
                    stats.heap_bytes += 24 + v.capacity() * std::mem::size_of::<Resident>();
                }
            }
        }
        for source in self.inner.sources.read().iter().flatten() {
            let state = source.lock();
            stats.sources += 1;
            stats.engine_hashes += state.len();
            stats.heap_bytes += state.heap_bytes();
        }
        stats.entries_by_medium = by_medium
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(slot, n)| (slot_medium(slot).spelling().to_owned(), *n))
            .collect();
        stats
    }

    /// Resident (block, pod) entries and their count per medium spelling, without walking the
    /// index (kept up to date as fields change; for metrics).
    pub fn entry_counts(&self) -> (u64, Vec<(&'static str, u64)>) {
        let total = self.inner.entries.load(Ordering::Relaxed).max(0) as u64;
        let per_medium = self
            .inner
            .entries_by_slot
            .iter()
            .enumerate()
            .map(|(slot, n)| {
                (
                    slot_medium(slot).spelling(),
                    n.load(Ordering::Relaxed).max(0) as u64,
                )
            })
            .filter(|(_, n)| *n > 0)
            .collect();
        (total, per_medium)
    }

    /// Number of pods ever registered (ids are `0..pod_count`).
    pub fn pod_count(&self) -> usize {
        self.inner.pods.len()
    }
}

fn slot_medium(slot: usize) -> Medium {
    MediaSet::from_bits(1 << slot)
        .iter()
        .next()
        .unwrap_or(Medium::NONE)
}

/// Counts a pod-level change and hands it to the sink.
fn emit_field(
    inner: &Inner,
    sink: &mut impl DeltaSink,
    model: u32,
    std: u64,
    pod: u32,
    before: Option<FieldValue>,
    after: Option<FieldValue>,
) {
    if before != after {
        let media = |v: Option<FieldValue>| v.map_or(MediaSet::EMPTY, |v| v.media);
        let (old, new) = (media(before), media(after));
        for m in old.difference(new).iter() {
            inner.entries_by_slot[m.slot() as usize].fetch_sub(1, Ordering::Relaxed);
        }
        for m in new.difference(old).iter() {
            inner.entries_by_slot[m.slot() as usize].fetch_add(1, Ordering::Relaxed);
        }
        let delta = i64::from(after.is_some()) - i64::from(before.is_some());
        if delta != 0 {
            inner.entries.fetch_add(delta, Ordering::Relaxed);
        }
        sink.push(Delta::Field {
            model: ModelId(model),
            std_hash: std,
            pod: PodId(pod),
            value: after,
        });
    }
}

#[cfg(test)]
mod tests;

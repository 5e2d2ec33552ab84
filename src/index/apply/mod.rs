//! The mutation engine: events of one source applied to the block maps, every changed field
//! counted and handed to the sink.
//!
//! A [`Mutation`] is built per `apply` call while the source's lock is held; its steps take
//! only what differs per block, the rest (source state, sink, store time, counters) is in it.
//!
//! | file | job |
//! | --- | --- |
//! | `mod.rs` | [`Index::apply`] and the mutation: `BlockStored`, `BlockRemoved`, `AllBlocksCleared` |
//! | `lifecycle.rs` | a source cleared or unregistered, a pod forgotten |
//! | `restore.rs` | a source's blocks rebuilt from a checkpoint (warm start) |
//!
//! The mutation's steps stay in one module, stores and removes alike: with its remove steps
//! in a module of their own, the apply loop they are inlined into was compiled otherwise,
//! and both the store and the remove path did more work.

mod lifecycle;
mod restore;

use parking_lot::RwLockWriteGuard;
use serde::Serialize;

use super::blocks::Blocks;
use super::counters::CountDelta;
use super::delta::{ClearedBlocks, Delta, DeltaSink, EngineState};
use super::layer::{self, Change, DupCounts, Editor};
use super::runs::{ChainRuns, HeldRuns, Spot, Stretch};
use super::source::{twin_of, HeldSlot, SourceState, TakenBlocks};
use super::vocab::{FieldValue, ModelId, PodId, SourceId};
use super::{Index, IndexError};
use crate::hash::{chain_hash, content_hash, model_seed, salted_seed, std_hash};
use crate::medium::{MediaSet, Medium, MEDIA_SLOTS};
use crate::wire::{BlockHash, BlockRemoved, BlockStored, Engine, EngineBatch, Event};

/// Every medium bit: what a `BlockRemoved` without medium removes.
const ALL_MEDIA: u32 = (1 << MEDIA_SLOTS) - 1;

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
    /// `BlockStored` events dropped: their LoRA would pass the source's cap on models.
    pub too_many_models: u64,
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
        self.too_many_models += other.too_many_models;
    }
}

impl Index {
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
        // The source list stays read-locked for the call rather than the source's handle
        // cloned out of it: one atomic pair less per call (registering a source waits for
        // the calls in flight).
        let sources = self.inner.sources.read();
        let state = (sources.get(source.0 as usize)).and_then(Option::as_ref);
        let mut state = state.ok_or(IndexError::UnknownSource(source.0))?.lock();
        // Dropped where it stands at the block's end: `drop(mutation)` would move it first,
        // a copy of a few hundred bytes on every call, a large part of a 1-block event's
        // cost outside its block.
        let (stats, dropped_lora) = {
            let mut mutation = Mutation::new(self, &mut state, sink, now);
            mutation.apply_events(&batch.events);
            (mutation.stats, mutation.dropped_lora)
        };
        state.settle(stats.blocks_removed > 0 || stats.clears > 0);
        drop(state);
        drop(sources);
        if stats.clears > 0 {
            self.shrink_shared();
        } else if dropped_lora {
            // The adapters' map is checked only by calls that took blocks out of it: its
            // length is a walk of its shards.
            shrink_sparse(self.inner.models.lora_blocks());
        }
        Ok(stats)
    }

    /// The chain runs, write-locked for an event's edits.
    fn edit_chains(&self) -> RwLockWriteGuard<'_, ChainRuns> {
        let mut runs = self.inner.chains.write();
        runs.relocked();
        runs
    }

    /// Gives back the shared maps' memory once each is a quarter full or less, so a burst of
    /// blocks does not keep its peak after it leaves (a base model's std map goes with its
    /// model; the chain map and the adapters' map serve every model and stay).
    fn shrink_shared(&self) {
        self.inner.chains.write().shrink();
        shrink_sparse(self.inner.models.lora_blocks());
    }
}

/// Gives back a shared block map's memory once it is a quarter full or less.
fn shrink_sparse<K: Eq + std::hash::Hash>(map: &layer::LayerMap<K>) {
    let capacity = map.capacity();
    if capacity > 1024 && map.len() * 4 < capacity {
        map.shrink_to_fit();
    }
}

/// A stored block's identities: kthena's std hash and the chain hash (0 when unknown), with
/// its parent's chain hash (0 for a chain start or when unknown), after which a new chain
/// block is placed.
#[derive(Debug, Clone, Copy)]
struct StoreHashes {
    std: u64,
    chain: u64,
    parent: u64,
}

/// Where a mutation's effects go: the sink and the entry counters, for one source's pod.
struct Out<'a, S: DeltaSink> {
    index: &'a Index,
    sink: &'a mut S,
    pod: u32,
    rank: u8,
    engine: Engine,
    /// This call's field changes, added to its source's counts when it ends.
    counted: CountDelta,
}

impl<S: DeltaSink> Out<'_, S> {
    /// Counts a pod-level field change (whole index and this pod) and hands it to the sink.
    fn field(
        &mut self,
        model: u32,
        std: u64,
        before: Option<FieldValue>,
        after: Option<FieldValue>,
    ) {
        if !self.count(before, after) {
            return;
        }
        self.sink.push(Delta::Field {
            model: ModelId(model),
            std_hash: std,
            pod: PodId(self.pod),
            value: after,
        });
    }

    /// Counts a pod-level field change (added to the whole index and this pod when the call
    /// ends); returns whether the field changed.
    fn count(&mut self, before: Option<FieldValue>, after: Option<FieldValue>) -> bool {
        if before == after {
            return false;
        }
        self.counted.record(before, after);
        true
    }

    /// [`Self::count`] for `times` fields with the same change.
    fn count_times(&mut self, (before, after): Change, times: u32) {
        if before != after {
            self.counted.record_times(before, after, i64::from(times));
        }
    }

    /// Tells the sink that `engine_hash` now maps to `std`, or to nothing; clones the hash
    /// only when the sink wants mappings.
    fn mapping(&mut self, engine_hash: &BlockHash, std: Option<u64>) {
        if self.sink.wants_mappings() {
            self.mapping_owned(engine_hash.clone(), std);
        }
    }

    /// Tells the sink the source's new state of one engine block (its checkpoint entry).
    fn engine_state(&mut self, model: u32, engine_hash: &BlockHash, state: Option<EngineState>) {
        if self.sink.wants_mappings() {
            self.sink.push(Delta::Engine {
                pod: PodId(self.pod),
                rank: self.rank,
                model: ModelId(model),
                engine_hash: engine_hash.clone(),
                state,
            });
        }
    }

    /// Tells a sink that wants mappings about a remove the source could not resolve.
    fn unknown_remove(&mut self, model: u32, engine_hash: &BlockHash) {
        if self.sink.wants_mappings() {
            self.sink.push(Delta::UnknownRemove {
                pod: PodId(self.pod),
                engine: self.engine,
                model: ModelId(model),
                engine_hash: engine_hash.clone(),
            });
        }
    }

    fn mapping_owned(&mut self, engine_hash: BlockHash, std: Option<u64>) {
        self.sink.push(Delta::Mapping {
            pod: PodId(self.pod),
            engine: self.engine,
            engine_hash,
            std_hash: std,
        });
    }
}

impl<S: DeltaSink> Drop for Mutation<'_, S> {
    /// Adds the call's counts, whichever way the call ended.
    fn drop(&mut self) {
        self.state.counted.merge(&self.out.counted);
    }
}

/// The block map of the model a mutation last touched: most calls edit one model, and the
/// model table's lock and the map's reference count are then paid once per call, not once
/// per block. Safe to keep for a call: a model the source holds or touched in the call is
/// not freed before the call settles, and a live model's map never changes.
#[derive(Default)]
struct BlocksCache {
    model: u32,
    blocks: Option<Blocks>,
}

impl BlocksCache {
    fn get(&mut self, index: &Index, model: u32) -> Option<&Blocks> {
        if !index.inner.std_layer {
            // Nothing to look up, on every block of a `prefix`-only index.
            return None;
        }
        if self.model != model || self.blocks.is_none() {
            self.blocks = index.blocks_of(model);
            self.model = model;
        }
        self.blocks.as_ref()
    }

    /// Keeps `blocks`, just looked up, as `model`'s.
    fn prime(&mut self, model: u32, blocks: Blocks) {
        self.model = model;
        self.blocks = Some(blocks);
    }
}

/// Calls a `layer` edit on the map holding `blocks`' block `std` of model `model`, with the
/// key that map uses (and the block's key in the source's duplicate counts).
macro_rules! on_std_block {
    ($edit:path, $blocks:expr, $dups:expr, ($model:expr, $std:expr) $(, $arg:expr)*) => {
        match $blocks {
            Blocks::Own(map) => $edit(map, $dups, ($model, $std), $std $(, $arg)*),
            Blocks::Lora(map, m) => $edit(map, $dups, ($model, $std), (*m, $std) $(, $arg)*),
        }
    };
}

/// The hash a block of `tokens` new to the runs is kept under: kthena's std hash (SHA-256)
/// with the std layer; without it nothing reads that, and a cheap content hash still tells
/// an engine hash reused for other content.
fn fresh_content(std_layer: bool, tokens: &[u32]) -> u64 {
    if std_layer {
        std_hash(tokens)
    } else {
        content_hash(tokens)
    }
}

/// The runs `slot` keeps locked, locked if they are not yet. Inlined: stores and removes ask
/// per block, and the runs are mostly locked already.
#[inline]
fn locked<'g, 'a>(
    slot: &'g mut Option<RwLockWriteGuard<'a, ChainRuns>>,
    index: &'a Index,
) -> &'g mut ChainRuns {
    slot.get_or_insert_with(|| index.edit_chains())
}

/// One source's events being applied: the state every step shares.
struct Mutation<'a, S: DeltaSink> {
    state: &'a mut SourceState,
    out: Out<'a, S>,
    /// The chain runs, write-locked from the event's first chain edit to its end: one lock
    /// per event rather than one per block.
    chains: Option<RwLockWriteGuard<'a, ChainRuns>>,
    /// Whether this call took a LoRA adapter's block off its residents (the adapters'
    /// shared map may then be worth shrinking).
    dropped_lora: bool,
    /// Whether the event being applied stores one block alone (a new chain start of it
    /// shares a run with other such starts; see [`ChainRuns`]).
    alone: bool,
    /// The block map of the model last edited.
    blocks: BlocksCache,
    /// Unix second recorded as the store time.
    now: u32,
    stats: ApplyStats,
}

impl<'a, S: DeltaSink> Mutation<'a, S> {
    fn new(index: &'a Index, state: &'a mut SourceState, sink: &'a mut S, now: u32) -> Self {
        let out = Out {
            index,
            sink,
            pod: state.pod,
            rank: state.rank,
            engine: state.engine,
            counted: CountDelta::default(),
        };
        Mutation {
            state,
            out,
            chains: None,
            dropped_lora: false,
            alone: true,
            blocks: BlocksCache::default(),
            now,
            stats: ApplyStats::default(),
        }
    }

    /// Applies `events` in order, the runs locked from an event's first chain edit to its
    /// end.
    fn apply_events(&mut self, events: &[Event]) {
        for event in events {
            let removed_before = self.stats.blocks_removed;
            match event {
                Event::BlockStored(stored) => self.stored(stored),
                Event::BlockRemoved(removed) => self.removed(removed),
                Event::AllBlocksCleared => {
                    self.clear();
                    self.stats.clears += 1;
                }
            }
            if self.stats.blocks_removed > removed_before {
                // While they are locked anyway: a check of two lengths, mostly.
                if let Some(chains) = self.chains.as_mut() {
                    chains.shrink();
                }
            }
            // Queries wait for a writer one event at most.
            self.chains = None;
        }
    }

    /// `BlockStored`: blocks of one chain (after the parent, if any) on one medium, in order.
    fn stored(&mut self, stored: &BlockStored) {
        let Some((model, seed)) = self.stored_model(stored) else {
            return;
        };
        // A salt seeds the chain it starts; a continued chain carries its parent's.
        let seed = match (&stored.cache_salt, &stored.parent_block_hash) {
            (Some(salt), None) => salted_seed(seed, salt),
            _ => seed,
        };
        let media = MediaSet::single(stored.medium);
        self.alone = stored.block_hashes.len() == 1;
        if stored.token_ids.is_empty() {
            for hash in &stored.block_hashes {
                self.store_block(model, hash, None, media);
            }
            return;
        }
        // Before the runs are locked (`chain_above` locks them).
        self.state.reserve(&stored.block_hashes, model);
        let mut parent = self.chain_above(stored, model, seed);
        // The common store: a base-model block with a chain, which the source does not hold
        // under any sign, is placed in the runs and kept by the source, and the source's
        // spans are edited once per stretch of a run the event stores
        // ([`ChainRuns::add_first_copies`]; one edit for an 8-block event, mostly), not
        // block by block; with the std layer its std block gets the copy too
        // (`add_std_media`). Any other block goes the general way (`store_block`), after the
        // stretch before it is edited in.
        let first_copies = model == self.state.base_model;
        let std_layer = self.std_layer();
        let mut stretch = None;
        let starts = stored.parent_block_hash.is_none();
        let mut confirmed = self.speculating().then(Vec::new);
        for (i, hash) in stored.block_hashes.iter().enumerate() {
            let tokens = stored.block_tokens(i);
            // The parent block's chain hash: the seed a chain starts at is no block.
            let above = if i == 0 && starts { 0 } else { parent };
            let chain = if parent == 0 {
                0
            } else {
                chain_hash(parent, tokens)
            };
            if let Some(confirmed) = confirmed.as_mut().filter(|_| chain != 0) {
                confirmed.push(chain);
            }
            if first_copies && chain != 0 {
                let placed = self.place_new_copy(hash, (chain, above), tokens, media);
                if let Some((spot, std)) = placed {
                    if !(stretch.as_mut()).is_some_and(|s: &mut Stretch| s.grow(spot)) {
                        self.add_stretch(stretch.replace(Stretch::at(spot)), media);
                    }
                    if std_layer {
                        let duplicate = self.add_std_media(model, std, media, true);
                        self.stats.duplicate_engine_hashes += u64::from(duplicate == Some(true));
                    }
                    self.record_stored(model, hash, (std, chain, above), media);
                    parent = chain;
                    continue;
                }
            }
            self.add_stretch(stretch.take(), media);
            let std = self.content_of(chain, tokens);
            let block = Some(StoreHashes {
                std,
                chain,
                parent: above,
            });
            parent = self.store_block(model, hash, block, media);
        }
        self.add_stretch(stretch, media);
        if let Some(confirmed) = confirmed {
            self.out
                .index
                .speculative()
                .confirm(self.out.pod, &confirmed);
        }
    }

    /// Whether routers' placements are live, so stores confirm them and removes drop them.
    fn speculating(&self) -> bool {
        !self.out.index.speculative().is_empty()
    }

    /// The pod removes `hashes`: placements of their chain blocks on it go.
    #[inline(never)]
    fn drop_speculative(&mut self, hashes: &[BlockHash]) {
        let (chains, state) = self.chain_edit();
        let gone: Vec<u64> = (hashes.iter())
            .filter_map(|hash| state.find(hash, chains))
            .map(|(held, _)| held.chain())
            .filter(|chain| *chain != 0)
            .collect();
        self.out
            .index
            .speculative()
            .drop_blocks(self.out.pod, &gone);
    }

    /// The model a store is for and its chain seed: the source's base model, or the LoRA
    /// adapter it names. `None`, counted, for a store of a KV cache group kvindex does not
    /// index or of an adapter past the source's limit. Not inlined, as [`Self::chain_above`].
    #[inline(never)]
    fn stored_model(&mut self, stored: &BlockStored) -> Option<(u32, u64)> {
        let group = stored.kv_cache_spec_kind.as_deref();
        if !self.state.is_main_group(stored.group_idx, group) {
            self.stats.skipped_group_blocks += stored.block_hashes.len() as u64;
            return None;
        }
        let Some(name) = &stored.lora_name else {
            return Some((self.state.base_model, self.state.base_seed));
        };
        let Some((model, blocks)) = self.state.lora_model(name) else {
            self.stats.too_many_models += 1;
            return None;
        };
        if self.std_layer() {
            self.blocks.prime(model, blocks);
        }
        Some((model, model_seed(name)))
    }

    /// The chain hash a store's first block continues: the model's `seed` for a chain start,
    /// the parent's chain when the source holds the parent under the same `model`, else 0
    /// (the blocks have no chain). Not inlined: called once an event, out of line it leaves
    /// the block loop of [`Self::stored`] its registers (inlined, the store path does more
    /// work).
    #[inline(never)]
    fn chain_above(&mut self, stored: &BlockStored, model: u32, seed: u64) -> u64 {
        let Some(parent) = &stored.parent_block_hash else {
            return seed;
        };
        let (chains, state) = self.chain_edit();
        match state.find(parent, chains) {
            Some((held, spot)) if held.model() == model => {
                if let Some(spot) = spot {
                    chains.expect_after(held.chain(), spot);
                }
                held.chain()
            }
            _ => 0,
        }
    }

    /// Places chain block `chain` (after `parent`, of `tokens`) for an engine block `hash`
    /// the source does not hold under any sign, and keeps `hash` on `media` by its spot
    /// there; gives the spot and the std hash its run keeps, or `None`, with nothing
    /// changed, when the source holds `hash`. The tokens are hashed only for a chain block
    /// new to the runs (see `content_of`).
    fn place_new_copy(
        &mut self,
        hash: &BlockHash,
        (chain, parent): (u64, u64),
        tokens: &[u32],
        media: MediaSet,
    ) -> Option<(Spot, u64)> {
        let place = (parent, self.alone);
        let std_layer = self.std_layer();
        let (chains, state) = self.chain_edit();
        state.put_new(hash, chain, media, || {
            chains.find_or_place(chain, place, || fresh_content(std_layer, tokens))
        })
    }

    /// Adds the source's first engine copy of every block of `stretch` (placed by
    /// [`Self::stored`]) on `media`, counted; block by block when it holds some already.
    fn add_stretch(&mut self, stretch: Option<Stretch>, media: MediaSet) {
        let Some(stretch) = stretch else {
            return;
        };
        let added = self.edit_stretch(|chains, held, who, out| {
            chains.add_first_copies(held, stretch, who, media, |c, n| out.count_times(c, n))
        });
        if added {
            return;
        }
        // The source holds some of these chain blocks through other engine blocks.
        for spot in stretch.spots() {
            let (chains, _) = self.chain_edit();
            let Some((chain, std)) = chains.hashes_at(spot) else {
                continue;
            };
            let (duplicate, _) = self.add_chain_media((chain, 0), std, media, true);
            // With the std layer a duplicate is counted on it (`add_std_media`).
            if duplicate && !self.std_layer() {
                self.stats.duplicate_engine_hashes += 1;
            }
        }
    }

    /// Runs a stretch edit on the chain runs, write-locked until the event ends: `edit` gets
    /// them, the runs the source holds spans in, the chain layer's editor and where its
    /// changes are counted.
    fn edit_stretch<R>(
        &mut self,
        edit: impl FnOnce(&mut ChainRuns, &mut HeldRuns, Editor, &mut Out<'a, S>) -> R,
    ) -> R {
        let who = self.lock_chains();
        let chains = locked(&mut self.chains, self.out.index);
        edit(chains, &mut self.state.runs, who, &mut self.out)
    }

    /// The std hash (without the std layer, the content hash) of a block of `tokens` with
    /// chain hash `chain`: the one its run keeps when another source stored the chain block
    /// already (a chain hash names the tokens with their whole prefix), without hashing
    /// them again; most stores of a shared prefix are of such a block, so kthena's SHA-256
    /// is computed once per chain block, not once per copy. A 64-bit chain-hash collision
    /// of two contents then gives the second the first's hash: as unlikely as the std or
    /// content hashes colliding themselves.
    fn content_of(&mut self, chain: u64, tokens: &[u32]) -> u64 {
        let std_layer = self.std_layer();
        let (chains, _) = self.chain_edit();
        let known = (chain != 0).then(|| chains.std_of(chain)).flatten();
        known.unwrap_or_else(|| fresh_content(std_layer, tokens))
    }

    /// Stores one engine block; `block` is `None` for a tokenless tier copy. Returns the
    /// block's chain hash as recorded (0 when unknown), the parent of the next block.
    fn store_block(
        &mut self,
        model: u32,
        hash: &BlockHash,
        block: Option<StoreHashes>,
        media: MediaSet,
    ) -> u64 {
        let (chains, state) = self.chain_edit();
        let found = state.find_key(hash, chains);
        let existing = found.filter(|held| held.sent_as(hash));
        let before = existing.map_or(MediaSet::EMPTY, |old| old.media());
        let parent = block.map_or(0, |b| b.parent);
        let (model, std, chain, added, new_copy) = match (existing, block) {
            (None, None) => {
                self.stats.unresolved_stores += 1;
                return 0;
            }
            (Some(old), None) => (
                old.model(),
                old.std(),
                old.chain(),
                media.difference(old.media()),
                false,
            ),
            (Some(old), Some(new)) if old.model() == model && old.std() == new.std => {
                // The same block again: a chain learnt now replaces an unknown or other one;
                // an unknown one never forgets a chain verified before.
                let chain = if new.chain == 0 {
                    old.chain()
                } else {
                    new.chain
                };
                if chain != old.chain() {
                    self.move_chain(new.std, old.chain(), (chain, parent), old.media());
                }
                (model, new.std, chain, media.difference(old.media()), false)
            }
            (Some(old), Some(new)) => {
                // The engine reused a hash for other content: the old block is gone.
                self.drop_block(hash, old);
                if old.model() != model {
                    // The checkpoint keys entries by model: the old model's entry goes.
                    self.out.engine_state(old.model(), hash, None);
                }
                (model, new.std, new.chain, media, true)
            }
            (None, Some(new)) => {
                if let Some(twin) = found {
                    self.drop_twin(hash, twin);
                }
                (model, new.std, new.chain, media, true)
            }
        };
        let (duplicate, spot) = self.add_engine_media(model, std, (chain, parent), added, new_copy);
        if duplicate {
            self.stats.duplicate_engine_hashes += 1;
        }
        let media = if new_copy { media } else { before.union(media) };
        // A tokenless tier copy names no parent: the runs know it.
        let parent = match block {
            Some(block) => block.parent,
            None => self.parent_in_runs(chain, spot),
        };
        self.keep_stored(model, hash, (std, chain, spot), parent, media);
        chain
    }

    /// The parent of chain block `chain` (at `spot` when known) as the runs place it
    /// ([`ChainRuns::parent_at`]); 0 for a block without a chain.
    fn parent_in_runs(&mut self, chain: u64, spot: Option<Spot>) -> u64 {
        if chain == 0 {
            return 0;
        }
        let (chains, _) = self.chain_edit();
        match spot {
            Some(spot) => chains.parent_at(spot),
            None => chains.parent_of(chain),
        }
    }

    /// Keeps engine block `hash` in the source, its residents edited, and records it as
    /// stored ([`Self::record_stored`]).
    fn keep_stored(
        &mut self,
        model: u32,
        hash: &BlockHash,
        (std, chain, spot): (u64, u64, Option<Spot>),
        parent: u64,
        media: MediaSet,
    ) {
        self.state.put(model, hash, (std, chain, spot), media);
        self.record_stored(model, hash, (std, chain, parent), media);
    }

    /// Records engine block `hash`, kept by the source, as stored: the sink's engine state
    /// and mapping, the count.
    fn record_stored(
        &mut self,
        model: u32,
        hash: &BlockHash,
        (std, chain, parent): (u64, u64, u64),
        media: MediaSet,
    ) {
        let state = EngineState {
            std_hash: std,
            media,
            stored_at: self.now,
            chain,
            parent,
        };
        self.out.engine_state(model, hash, Some(state));
        self.out.mapping(hash, Some(std));
        self.stats.blocks_stored += 1;
    }

    /// Drops the block held under an int `hash`'s key with the other sign, which the block
    /// of `hash` displaces (int keys hold only the 64 bits; found by fuzzing): like a reused
    /// hash, its mapping key included.
    fn drop_twin(&mut self, hash: &BlockHash, old: HeldSlot) {
        let twin = twin_of(hash);
        self.drop_block(&twin, old);
        self.out.engine_state(old.model(), &twin, None);
        self.out.mapping(&twin, None);
    }

    /// Takes engine block `hash`, held as `old`, out of the source and off its residents.
    fn drop_block(&mut self, hash: &BlockHash, old: HeldSlot) {
        self.state.remove(hash);
        let chain = (old.chain(), None);
        self.drop_engine_media(old.model(), old.std(), chain, old.media(), true);
    }

    /// Moves an engine block of std hash `std` held on `media` from chain block `from` to
    /// `to` (either may be 0, no chain; `to` with its parent's chain): the std layer is
    /// untouched.
    fn move_chain(&mut self, std: u64, from: u64, to: (u64, u64), media: MediaSet) {
        self.drop_chain_media((from, None), media, true);
        self.add_chain_media(to, std, media, true);
    }

    /// Adds `added` media (and one engine copy when `new_copy`) to the source's resident of
    /// chain block `chain` (none when 0, chain unknown; a new one placed after `parent`),
    /// counted when the chain layer is the counted one; returns whether the source now holds
    /// it through more than one engine block, and the block's spot when its run keeps `std`
    /// for it (the source's slot then needs neither hash).
    fn add_chain_media(
        &mut self,
        (chain, parent): (u64, u64),
        std: u64,
        added: MediaSet,
        new_copy: bool,
    ) -> (bool, Option<Spot>) {
        if chain == 0 {
            return (false, None);
        }
        let who = self.lock_chains();
        let place = (parent, self.alone);
        let (chains, state) = self.chain_edit();
        let edited = (&mut state.dups, &mut state.runs);
        let ((before, after), duplicate, spot) =
            chains.add_media(place, edited, (chain, std), who, added, new_copy);
        self.count_chain(before, after);
        (duplicate, spot)
    }

    /// Takes `removed` media off the source's resident of chain block `chain` (none when 0;
    /// found at `spot` when given; `slot_gone` when the engine block itself went), counted
    /// likewise; returns the resident's last store time (0 when the source held no such
    /// block).
    fn drop_chain_media(
        &mut self,
        (chain, spot): (u64, Option<Spot>),
        removed: MediaSet,
        slot_gone: bool,
    ) -> u32 {
        if chain == 0 {
            return 0;
        }
        let who = self.lock_chains();
        let (chains, state) = self.chain_edit();
        let edited = (&mut state.dups, &mut state.runs);
        let dropped = chains.drop_media(edited, (chain, spot), who, removed, slot_gone);
        let Some(((before, after), stored_at)) = dropped else {
            return 0;
        };
        self.count_chain(before, after);
        stored_at
    }

    /// The chain runs, write-locked until the event ends, with the source's state beside
    /// them (a chain edit updates the source's duplicate counts and held runs).
    fn chain_edit(&mut self) -> (&mut ChainRuns, &mut SourceState) {
        let chains = locked(&mut self.chains, self.out.index);
        (chains, self.state)
    }

    /// Locks the chain runs until the event ends, if they are not yet; gives the editor of
    /// chain-layer edits, which knows from then on whether the pod has other DP ranks.
    fn lock_chains(&mut self) -> Editor {
        locked(&mut self.chains, self.out.index);
        self.chain_editor()
    }

    /// Whether the index keeps the std layer; without it entries are counted on the chain
    /// layer.
    fn std_layer(&self) -> bool {
        self.out.index.inner.std_layer
    }

    /// The editor of chain-layer edits: pod values are read only where entries are counted
    /// on that layer (no std layer).
    fn chain_editor(&self) -> Editor {
        let who = self.editor();
        if self.std_layer() {
            who.without_values()
        } else {
            who
        }
    }

    /// Counts a chain-layer field change when the chain layer is the one counted.
    fn count_chain(&mut self, before: Option<FieldValue>, after: Option<FieldValue>) {
        if !self.std_layer() {
            self.out.count(before, after);
        }
    }

    /// The source and store time of this call's edits. [`Editor::sole`] only while this
    /// call holds the runs locked ([`ChainRuns::sole_rank`]): another DP rank of the pod
    /// cannot even finish registering meanwhile (registering tells the runs), so it holds
    /// nothing in either layer; with the runs unlocked (a clear's std edits) a rank may
    /// register and store alongside.
    fn editor(&self) -> Editor {
        let pod = self.state.pod;
        Editor {
            pod,
            rank: self.state.rank,
            now: self.now,
            pod_values: true,
            sole: (self.chains.as_ref()).is_some_and(|runs| runs.sole_rank(pod)),
        }
    }

    /// Records `added` media (and a new engine copy) on the source's residents of the std
    /// block and, when known, the chain block (with its parent's); returns whether the std
    /// block is now held through more than one engine hash, and the chain block's spot
    /// ([`Self::add_chain_media`]).
    fn add_engine_media(
        &mut self,
        model: u32,
        std: u64,
        chain: (u64, u64),
        added: MediaSet,
        new_copy: bool,
    ) -> (bool, Option<Spot>) {
        let (chain_duplicate, spot) = self.add_chain_media(chain, std, added, new_copy);
        // No std layer: a duplicate is a chain block held through another engine hash.
        let duplicate = self.add_std_media(model, std, added, new_copy);
        (duplicate.unwrap_or(chain_duplicate), spot)
    }

    /// Records `added` media (and a new engine copy) on the source's resident of std block
    /// `std` of `model`, counted; returns whether the source now holds it through more than
    /// one engine hash, or `None` without the std layer.
    fn add_std_media(
        &mut self,
        model: u32,
        std: u64,
        added: MediaSet,
        new_copy: bool,
    ) -> Option<bool> {
        let (who, blocks, dups) = self.std_edit(model)?;
        let ((before, after), duplicate) = on_std_block!(
            layer::add_media,
            blocks,
            dups,
            (model, std),
            who,
            added,
            new_copy
        );
        self.out.field(model, std, before, after);
        Some(duplicate)
    }

    /// What an edit of a std block of `model` needs: the editor, the map holding the block
    /// and the source's duplicate counts; `None` without the std layer.
    fn std_edit(&mut self, model: u32) -> Option<(Editor, &Blocks, &mut DupCounts)> {
        let who = self.editor();
        let blocks = self.blocks.get(self.out.index, model)?;
        Some((who, blocks, &mut self.state.dups))
    }

    /// Takes `removed` media off the source's residents of the std block and, when known,
    /// the chain block (at its spot, when the source's slot gives it); `slot_gone` when the
    /// engine block itself is no longer held. Returns the std resident's last store time.
    fn drop_engine_media(
        &mut self,
        model: u32,
        std: u64,
        chain: (u64, Option<Spot>),
        removed: MediaSet,
        slot_gone: bool,
    ) -> u32 {
        self.dropped_lora |= model != self.state.base_model;
        let chain_stored_at = self.drop_chain_media(chain, removed, slot_gone);
        // No std layer: the chain resident's store time is the one kept.
        (self.drop_std_media(model, std, removed, slot_gone)).unwrap_or(chain_stored_at)
    }

    /// Takes `removed` media off the source's resident of std block `std` of `model`
    /// (`slot_gone` as for [`Self::drop_engine_media`]), counted; returns the resident's last
    /// store time (0 when the source held none), or `None` without the std layer.
    fn drop_std_media(
        &mut self,
        model: u32,
        std: u64,
        removed: MediaSet,
        slot_gone: bool,
    ) -> Option<u32> {
        let (who, blocks, dups) = self.std_edit(model)?;
        let dropped = on_std_block!(
            layer::drop_media,
            blocks,
            dups,
            (model, std),
            who,
            removed,
            slot_gone
        );
        let Some(((before, after), stored_at)) = dropped else {
            return Some(0);
        };
        self.out.field(model, std, before, after);
        Some(stored_at)
    }

    fn removed(&mut self, removed: &BlockRemoved) {
        if !self.state.is_main_group(removed.group_idx, None) {
            self.stats.skipped_group_blocks += removed.block_hashes.len() as u64;
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
        let base = self.state.base_model;
        if self.speculating() {
            self.drop_speculative(&removed.block_hashes);
        }
        self.state.warm(&removed.block_hashes);
        let mut stretch: Option<Stretch> = None;
        for hash in &removed.block_hashes {
            if self.drop_one_copy(hash, mask, &mut stretch) {
                continue;
            }
            self.drop_stretch(stretch.take());
            let (chains, state) = self.chain_edit();
            let Some((held, spot)) = state.find(hash, chains) else {
                self.stats.unknown_removes += 1;
                self.out.unknown_remove(base, hash);
                continue;
            };
            let taken = MediaSet::from_bits(held.media().bits() & mask.bits());
            if taken.is_empty() {
                self.stats.noop_removes += 1;
                continue;
            }
            let left = held.media().difference(taken);
            let (model, std, chain) = (held.model(), held.std(), held.chain());
            let gone = left.is_empty();
            if gone {
                self.state.remove(hash);
                self.out.mapping(hash, None);
            } else {
                self.state.set_media(hash, held, left);
            }
            let stored_at = self.drop_engine_media(model, std, (chain, spot), taken, gone);
            let parent = if gone {
                0
            } else {
                self.parent_in_runs(chain, spot)
            };
            let state = (!gone).then_some(EngineState {
                std_hash: std,
                media: left,
                stored_at,
                chain,
                parent,
            });
            self.out.engine_state(model, hash, state);
            self.stats.blocks_removed += 1;
        }
        self.drop_stretch(stretch);
    }

    /// The common remove: engine block `hash`, kept by its spot in the runs, goes whole
    /// (`mask` takes all its media) and is the source's one copy of its chain block. It is
    /// then taken out of the source, its std block's copy with it (with the std layer), and
    /// its chain block added to `stretch`, whose residents go in one span edit
    /// ([`Self::drop_stretch`]); returns `false`, with nothing changed, for any other block.
    fn drop_one_copy(
        &mut self,
        hash: &BlockHash,
        mask: MediaSet,
        stretch: &mut Option<Stretch>,
    ) -> bool {
        let std_layer = self.std_layer();
        let (chains, state) = self.chain_edit();
        let taken = state.take_run_block(hash, |spot, media, dups| {
            if media.is_empty() || !media.difference(mask).is_empty() {
                return None;
            }
            if dups.is_empty() && !std_layer {
                // Nothing below is needed: the std hash is read only for the std layer.
                return Some(0);
            }
            // Copies past one are counted in `dups` under the chain hash, which the run keeps
            // with the std hash.
            let (chain, std) = chains.hashes_at(spot)?;
            (chain != 0 && !dups.contains_key(&(layer::CHAIN_DUPS, chain))).then_some(std)
        });
        let Some((spot, media, std)) = taken else {
            return false;
        };
        if !(stretch.as_mut()).is_some_and(|s| s.grow_either(spot)) {
            self.drop_stretch(stretch.replace(Stretch::at(spot)));
        }
        let base = self.state.base_model;
        if std_layer {
            self.drop_std_media(base, std, media, true);
        }
        self.out.mapping(hash, None);
        self.out.engine_state(base, hash, None);
        self.stats.blocks_removed += 1;
        true
    }

    /// Takes the source off every block of `stretch` (gathered by [`Self::removed`]),
    /// counted.
    fn drop_stretch(&mut self, stretch: Option<Stretch>) {
        let Some(stretch) = stretch else {
            return;
        };
        self.edit_stretch(|chains, held, who, out| {
            chains.drop_copies(held, stretch, who, |c, n| out.count_times(c, n));
        });
    }

    /// Drops every block of the source: its residents, then its engine-hash maps. A sink that
    /// takes clears whole gets the maps themselves ([`ClearedBlocks`]) instead of three
    /// deltas per block.
    fn clear(&mut self) {
        self.out.index.speculative().drop_pod(self.out.pod);
        let who = self.editor();
        let wants_mappings = self.out.sink.wants_mappings();
        let whole = self.out.sink.takes_cleared();
        let std_layer = self.std_layer();
        let chain_who = self.lock_chains();
        let index = self.out.index;
        let chains = locked(&mut self.chains, index);
        // The source's slots read their hashes from the runs, so what needs them is read
        // out before the source's spans go. The runs are then unlocked for the rest, which
        // edits a std block per engine block and must not hold queries back that long. A
        // `prefix`-only index has no std block to take the source out of.
        let read_out = std_layer || whole || wants_mappings;
        let taken = read_out.then(|| self.state.take_blocks(chains));
        let held = std::mem::take(&mut self.state.runs);
        let out = &mut self.out;
        chains.drop_source(held, chain_who, |change, times| {
            if !std_layer {
                out.count_times(change, times);
            }
        });
        self.chains = None;
        let std_slots = taken
            .iter()
            .filter(|_| std_layer)
            .flat_map(TakenBlocks::slots);
        for slot in std_slots {
            let (model, std) = (slot.model(), slot.std());
            let Some(blocks) = self.blocks.get(index, model) else {
                continue;
            };
            let dropped = match blocks {
                Blocks::Own(map) => layer::drop_resident(map, std, who),
                Blocks::Lora(map, m) => layer::drop_resident(map, (*m, std), who),
            };
            if let Some((before, after)) = dropped {
                if whole {
                    self.out.count(before, after);
                } else {
                    self.out.field(model, std, before, after);
                }
            }
        }
        match taken.filter(|_| whole || wants_mappings) {
            Some(blocks) if whole => {
                let (pod, rank, engine) = (PodId(self.out.pod), self.out.rank, self.out.engine);
                let cleared = ClearedBlocks::new(pod, rank, engine, blocks);
                if !cleared.is_empty() {
                    self.out.sink.push_cleared(cleared);
                }
            }
            Some(blocks) => {
                for (engine_hash, held) in blocks.into_entries() {
                    self.out.engine_state(held.model(), &engine_hash, None);
                    self.out.mapping_owned(engine_hash, None);
                }
            }
            None => {}
        }
        self.state.clear();
    }
}

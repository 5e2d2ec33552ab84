//! The read side of the index: names of ids, owners of a block, walks, dump and size figures.

use std::cell::Cell;
use std::sync::Arc;

use parking_lot::{Mutex, RwLockReadGuard};
use serde::Serialize;

use super::blocks::{Blocks, ModelBlocks};
use super::counters::{slot_medium, CountDelta};
use super::delta::EngineState;
use super::layer::LayerMap;
use super::residents::{self, Resident, Residents};
use super::runs::{ChainRuns, Cursor};
use super::source::{HeldSlot, SourceState};
use super::vocab::{table_bytes, FieldValue, ModelId, PodId, Visit};
use super::Index;
use crate::medium::{MediaSet, MEDIA_SLOTS};
use crate::wire::{BlockHash, Engine};

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
    /// Runs the chain layer (`prefix` matching) keeps its blocks in: few next to the blocks
    /// where chains are stored, or restored, whole.
    pub chain_runs: usize,
}

impl Index {
    /// Resident (block, pod) entries and their count per medium spelling, without walking the
    /// blocks (kept up to date as fields change; a walk of the sources; for metrics).
    pub fn entry_counts(&self) -> (u64, Vec<(&'static str, u64)>) {
        let mut live = CountDelta::default();
        for source in self.live_sources() {
            live.merge(&source.lock().counted);
        }
        self.inner.entries.snapshot_with(&live)
    }

    /// The same figures for one pod (over all its DP ranks), from its sources: what
    /// `GET /v1/pods` reports. A pod never registered has none.
    pub fn pod_entry_counts(&self, pod: PodId) -> (u64, Vec<(&'static str, u64)>) {
        let Some(departed) = self.inner.pod_entries.get(pod.0) else {
            return (0, Vec::new());
        };
        let mut live = CountDelta::default();
        let ids = self.inner.pod_sources.read().get(&pod.0).cloned();
        for id in ids.into_iter().flatten() {
            if let Ok(source) = self.source(id) {
                live.merge(&source.lock().counted);
            }
        }
        departed.snapshot_with(&live)
    }

    /// The id of a model name, while any block or source uses it.
    pub fn model_id(&self, name: &str) -> Option<ModelId> {
        self.inner.models.get(name).map(ModelId)
    }

    /// The id of a pod identifier, if it was ever registered.
    pub fn pod_id(&self, name: &str) -> Option<PodId> {
        self.inner.pods.get(name).map(PodId)
    }

    /// The ids of pod identifiers `names`, in order (`None` for one never registered): one
    /// lock for the whole list, for resolving a router's candidates.
    pub fn pod_ids<S: AsRef<str>>(&self, names: &[S]) -> Vec<Option<PodId>> {
        let ids = self.inner.pods.get_all(names);
        ids.into_iter().map(|id| id.map(PodId)).collect()
    }

    /// How many pod identifiers were ever registered: ids are `0..pod_count()` and never
    /// reused, so a name resolved once keeps its id.
    pub fn pod_count(&self) -> usize {
        self.inner.pods.len()
    }

    /// The name of a model id.
    pub fn model_name(&self, id: ModelId) -> Arc<str> {
        self.inner.models.name(id.0)
    }

    /// The identifier of a pod id.
    pub fn pod_name(&self, id: PodId) -> Arc<str> {
        self.inner.pods.name(id.0)
    }

    /// The chain hash of chain block `chain`'s parent as the runs place it (what its
    /// checkpoint entry keeps): 0 for a chain start, for a block without a chain (0) and
    /// for one not here.
    pub fn chain_parent(&self, chain: crate::hash::ChainHash) -> crate::hash::ChainHash {
        self.inner.chains.read_recursive().parent_of(chain)
    }

    /// kthena's std hash of each of `chains` (a prompt's chain hashes, in order) as the
    /// index computed it when the chain block was stored, `None` for a block not here (or
    /// every block, without the std layer): a chain hash names the block's tokens, so its
    /// std hash is theirs, and a `kthena` query of tokens need not hash with SHA-256 the
    /// blocks the index already holds.
    pub(crate) fn stored_std_hashes(&self, chains: &[crate::hash::ChainHash]) -> Vec<Option<u64>> {
        if !self.inner.std_layer {
            return vec![None; chains.len()];
        }
        self.inner.chains.read_recursive().stds_along(chains)
    }

    /// Model `model`'s std blocks opened for many reads (`kthena` matching), or `None` when
    /// no source holds a block of it.
    pub fn std_layer(&self, model: ModelId) -> Option<LayerReader<'_>> {
        self.blocks_of(model.0).map(|blocks| LayerReader {
            blocks: Layer::Std(blocks),
        })
    }

    /// The chain blocks of every model opened for many reads (`prefix` matching). Holds
    /// the chain layer's read lock until dropped (taken recursively, so two readers on one
    /// thread never wait for a writer queued between them).
    pub fn chain_layer(&self) -> LayerReader<'_> {
        LayerReader {
            blocks: Layer::Chain(self.inner.chains.read_recursive(), Cell::new(None)),
        }
    }

    /// The pod-level value of field `pod` of block `(model, std_hash)` now, or `None` when
    /// the pod holds the block on no medium. A mirror reads this when it writes, so what it
    /// writes is the index's latest state whatever order DP ranks' deltas arrived in.
    pub fn field_value(&self, model: ModelId, std_hash: u64, pod: PodId) -> Option<FieldValue> {
        let blocks = self.blocks_of(model.0)?;
        let entry = blocks.get(&std_hash)?;
        residents::pod_value(entry.as_slice(), pod.0)
    }

    /// Calls `visit(pod, rank, model, engine_hash, state)` for every engine block of every
    /// source: the checkpoint a mirror writes for warm starts.
    pub fn for_each_engine_state(
        &self,
        mut visit: impl FnMut(PodId, u8, ModelId, BlockHash, EngineState),
    ) {
        for source in self.live_sources() {
            let state = source.lock();
            let chains = self.inner.chains.read_recursive();
            for (hash, held) in state.entries(&chains) {
                let engine = self.engine_state_of(&state, &chains, held);
                visit(
                    PodId(state.pod),
                    state.rank,
                    ModelId(held.model()),
                    hash,
                    engine,
                );
            }
        }
    }

    /// The checkpoint state of engine block `hash` of source `(pod, rank)` under `model`, or
    /// `None` when the source does not hold it (under that model): what a repair writes
    /// back for one checkpoint entry.
    pub fn engine_state(
        &self,
        (pod, rank): (PodId, u8),
        model: ModelId,
        hash: &BlockHash,
    ) -> Option<EngineState> {
        let source = self.source_state_of(pod, rank)?;
        let state = source.lock();
        let chains = self.inner.chains.read_recursive();
        let (held, _) = state.find(hash, &chains)?;
        (held.model() == model.0).then(|| self.engine_state_of(&state, &chains, held))
    }

    /// Engine blocks source `(pod, rank)` holds of `model` (0 for a source not registered).
    pub fn engine_blocks_of(&self, (pod, rank): (PodId, u8), model: ModelId) -> usize {
        self.source_state_of(pod, rank)
            .map_or(0, |source| source.lock().model_len(model.0))
    }

    /// The checkpoint state of every engine block source `(pod, rank)` holds of `model`:
    /// what a checkpoint snapshot of its state key writes. Empty for a source not registered.
    pub fn engine_states_of(
        &self,
        (pod, rank): (PodId, u8),
        model: ModelId,
    ) -> Vec<(BlockHash, EngineState)> {
        let Some(source) = self.source_state_of(pod, rank) else {
            return Vec::new();
        };
        let state = source.lock();
        let chains = self.inner.chains.read_recursive();
        let mut out = Vec::with_capacity(state.model_len(model.0));
        for (hash, held) in state.entries(&chains) {
            if held.model() == model.0 {
                out.push((hash, self.engine_state_of(&state, &chains, held)));
            }
        }
        out
    }

    /// The checkpoint state of one block `state` holds as `held`.
    fn engine_state_of(
        &self,
        state: &SourceState,
        chains: &ChainRuns,
        held: HeldSlot,
    ) -> EngineState {
        let stored_at = self
            .blocks_of(held.model())
            .and_then(|b| {
                let entry = b.get(&held.std())?;
                let r = entry
                    .as_slice()
                    .iter()
                    .find(|r| r.pod() == state.pod && r.rank() == state.rank)?;
                Some(r.stored_at)
            })
            .unwrap_or(0);
        EngineState {
            std_hash: held.std(),
            media: held.media(),
            stored_at,
            chain: held.chain(),
            parent: chains.parent_of(held.chain()),
        }
    }

    /// Calls `visit` with the pod-level value of every resident (block, pod), in no order.
    pub fn for_each_field(&self, mut visit: impl FnMut(ModelId, u64, PodId, FieldValue)) {
        let models: Vec<(u32, Arc<ModelBlocks>)> = self.inner.models.all_blocks();
        for (model, blocks) in &models {
            for entry in blocks.iter() {
                visit_fields(*model, *entry.key(), entry.value().as_slice(), &mut visit);
            }
        }
        for entry in self.inner.models.lora_blocks().iter() {
            let (model, std) = *entry.key();
            visit_fields(model, std, entry.value().as_slice(), &mut visit);
        }
    }

    /// Calls `visit(pod, engine, engine_hash, std_hash)` for every engine hash held.
    pub fn for_each_mapping(&self, mut visit: impl FnMut(PodId, Engine, BlockHash, u64)) {
        for source in self.live_sources() {
            let state = source.lock();
            let chains = self.inner.chains.read_recursive();
            for (hash, slot) in state.entries(&chains) {
                visit(PodId(state.pod), state.engine, hash, slot.std());
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
        let mut count = |value: FieldValue| {
            stats.entries += 1;
            for m in value.media.iter() {
                by_medium[m.slot() as usize] += 1;
            }
        };
        if self.inner.std_layer {
            self.for_each_field(|_, _, _, value| count(value));
        } else {
            // A `prefix`-only index counts what it matches: (chain block, pod) entries.
            let chains = self.inner.chains.read_recursive();
            chains.for_each_block(|residents| {
                stats.blocks += 1;
                visit_fields(0, 0, residents, &mut |_, _, _, value| count(value));
            });
        }
        let models = self.inner.models.all_blocks();
        for (_, blocks) in &models {
            stats.blocks += blocks.len();
            stats.heap_bytes += blocks_heap_bytes(blocks);
        }
        let lora = self.inner.models.lora_blocks();
        stats.blocks += lora.len();
        stats.heap_bytes += blocks_heap_bytes(lora);
        let chains = self.inner.chains.read_recursive();
        stats.heap_bytes += chains.heap_bytes();
        stats.chain_runs = chains.runs();
        drop(chains);
        for source in self.live_sources() {
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

    /// Resident (chain block, pod) entries: what `prefix` matching can see (blocks whose
    /// chain is unknown are left out). Walks the chain map.
    pub fn chain_entries(&self) -> usize {
        let mut entries = 0;
        self.inner
            .chains
            .read_recursive()
            .for_each_block(|residents| {
                entries += residents
                    .iter()
                    .enumerate()
                    .filter(|(i, r)| !residents[..*i].iter().any(|p| p.pod() == r.pod()))
                    .count();
            });
        entries
    }

    /// The registered sources, cloned out so no source lock is taken under the list's lock.
    pub(super) fn live_sources(&self) -> Vec<Arc<Mutex<SourceState>>> {
        self.inner
            .sources
            .read()
            .iter()
            .flatten()
            .cloned()
            .collect()
    }
}

/// Calls `visit` once per pod resident in one std block, with the pod's value.
fn visit_fields(
    model: u32,
    std: u64,
    residents: &[Resident],
    visit: &mut impl FnMut(ModelId, u64, PodId, FieldValue),
) {
    for (i, r) in residents.iter().enumerate() {
        // Visit each pod once: at its first resident.
        if residents[..i].iter().any(|p| p.pod() == r.pod()) {
            continue;
        }
        if let Some(value) = residents::pod_value(residents, r.pod()) {
            visit(ModelId(model), std, PodId(r.pod()), value);
        }
    }
}

/// Approximate heap bytes of one block map and its boxed resident lists.
fn blocks_heap_bytes<K: Eq + std::hash::Hash>(blocks: &LayerMap<K>) -> usize {
    let mut bytes = table_bytes::<K, Residents>(blocks.capacity());
    for entry in blocks.iter() {
        bytes += entry.value().heap_bytes();
    }
    bytes
}

/// One residency layer opened for reading: a model's std blocks or the chain blocks. Holds
/// the layer, so a query of many blocks resolves it once.
pub struct LayerReader<'a> {
    blocks: Layer<'a>,
}

enum Layer<'a> {
    Std(Blocks),
    /// The chain runs under their read lock, and where the last visit left off in them.
    Chain(RwLockReadGuard<'a, ChainRuns>, Cell<Option<Cursor>>),
}

impl LayerReader<'_> {
    /// Whether any source holds block `key`.
    pub fn contains(&self, key: u64) -> bool {
        match &self.blocks {
            Layer::Std(blocks) => blocks.get(&key).is_some(),
            Layer::Chain(runs, _) => runs.contains(key),
        }
    }

    /// Whether any source holds block `key` as a prompt's first block. In the chain layer
    /// that is a chain start (a block seeded by its model, [`crate::hash::model_seed`]):
    /// a chain hash from inside a chain is not one. Answered from a small table of the
    /// starts while they are few, so a new prompt's miss stays in cache.
    pub fn holds_first(&self, key: u64) -> bool {
        match &self.blocks {
            Layer::Std(blocks) => blocks.get(&key).is_some(),
            Layer::Chain(runs, _) => runs.starts_held(key),
        }
    }

    /// Calls `visit(pod, media, stored_at)` for every resident of block `key` (a pod with
    /// several DP ranks once per rank), unless the block's resident fingerprint equals
    /// `unless`: then the block has the same (pod, rank, media) residents as the block that
    /// fingerprint came from, and nobody is visited. Store times are not in the fingerprint.
    /// Not inlined: inlined into a scorer's block loop, it made that loop save and reload
    /// more registers per block than the call costs.
    #[inline(never)]
    pub fn visit(
        &self,
        key: u64,
        unless: Option<u64>,
        mut visit: impl FnMut(PodId, MediaSet, u32),
    ) -> Visit {
        let blocks = match &self.blocks {
            Layer::Chain(runs, cursor) => return runs.visit(key, unless, cursor, visit),
            // A LoRA adapter's std blocks are in the adapters' shared map: `Blocks` knows.
            Layer::Std(blocks) => blocks,
        };
        let Some(entry) = blocks.get(&key) else {
            return Visit::Absent;
        };
        let fingerprint = entry.fingerprint();
        if unless == Some(fingerprint) {
            return Visit::Unchanged;
        }
        for r in entry.as_slice() {
            visit(PodId(r.pod()), r.media(), r.stored_at);
        }
        Visit::Visited(fingerprint)
    }

    /// After a [`Self::visit`] that found the block held: how many of `next`, the prompt's
    /// blocks after it, are known to have its residents (in the chain layer, the positions
    /// after it in its run, while their chain hashes are `next`'s and the residents stay
    /// the same); what a visit of each would answer [`Visit::Unchanged`] for. The std
    /// layer knows of none.
    pub fn repeats(&self, next: &[u64]) -> usize {
        match &self.blocks {
            Layer::Chain(runs, cursor) => runs.repeats(next, cursor),
            Layer::Std(_) => 0,
        }
    }
}

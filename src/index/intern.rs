//! String interning for pods and models: the index stores 4-byte ids, not names.
//!
//! Pods: append-only (bounded by `MAX_POD_ID`, and a pod's counters live as long as it).
//! Models: reference counted and freed ([`ModelTable`]), since LoRA names are engine input.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use hashbrown::HashMap;
use parking_lot::RwLock;

use super::blocks::{Blocks, LoraBlocks, ModelBlocks};

/// A thread-safe, append-only interner (pods).
#[derive(Default)]
pub(crate) struct Interner {
    inner: RwLock<InternerInner>,
}

#[derive(Default)]
struct InternerInner {
    by_name: HashMap<Arc<str>, u32>,
    names: Vec<Arc<str>>,
}

impl Interner {
    /// The id of `name`, allocating one on first sight.
    pub(crate) fn intern(&self, name: &str) -> u32 {
        if let Some(id) = self.inner.read().by_name.get(name) {
            return *id;
        }
        let mut inner = self.inner.write();
        if let Some(id) = inner.by_name.get(name) {
            return *id;
        }
        let id = inner.names.len() as u32;
        let name: Arc<str> = Arc::from(name);
        inner.names.push(name.clone());
        inner.by_name.insert(name, id);
        id
    }

    /// The id of `name` if it was interned.
    pub(crate) fn get(&self, name: &str) -> Option<u32> {
        self.inner.read().by_name.get(name).copied()
    }

    /// How many names were interned (ids are `0..len`).
    pub(crate) fn len(&self) -> usize {
        self.inner.read().names.len()
    }

    /// The ids of `names` (`None` for a name never interned), under one read lock.
    pub(crate) fn get_all<S: AsRef<str>>(&self, names: &[S]) -> Vec<Option<u32>> {
        let inner = self.inner.read();
        (names.iter())
            .map(|name| inner.by_name.get(name.as_ref()).copied())
            .collect()
    }

    /// The name behind `id` (empty for an id never handed out).
    pub(crate) fn name(&self, id: u32) -> Arc<str> {
        self.inner
            .read()
            .names
            .get(id as usize)
            .cloned()
            .unwrap_or_else(|| Arc::from(""))
    }
}

/// How many freed model names stay resolvable by id by default, so a mirror that resolves a
/// delta's model a little after its last block left still writes the right key (a bounded
/// cost: one name each).
pub const DEFAULT_FREED_MODEL_NAMES: usize = 16_384;

/// Default cap on distinct models (base model and LoRA adapters) one source may hold.
pub const DEFAULT_MAX_MODELS_PER_SOURCE: usize = 1024;

/// Model names and their block maps, reference counted so that a model no source holds is
/// freed (its name and its block map), whatever number of LoRA names an engine sends. Base
/// models have a block map each; LoRA adapters share one, keyed by (model, std hash), so an
/// adapter costs its name and two table slots.
///
/// Why reclaim rather than cap the interner: adapters come and go over a daemon's life, so
/// an append-only table either grows without bound or, capped, refuses new adapters forever.
/// Ids are never reused (a `u32` counter; past `u32::MAX` new names are refused): readers and
/// the mirror may hold an id briefly after its model is freed, and a reused id would point
/// them at another model's blocks. A freed id resolves to nothing (and its name stays
/// resolvable for the last few frees, [`DEFAULT_FREED_MODEL_NAMES`] by default).
pub(crate) struct ModelTable {
    inner: RwLock<ModelsInner>,
    /// Every LoRA adapter's std blocks.
    lora: Arc<LoraBlocks>,
    /// Distinct models one source may hold at once.
    pub(crate) max_per_source: usize,
    /// Freed names kept resolvable (0 when no delta consumer resolves ids late).
    freed_kept: usize,
}

#[derive(Default)]
struct ModelsInner {
    by_name: HashMap<Arc<str>, Named>,
    live: HashMap<u32, LiveModel>,
    next: u32,
    freed: HashMap<u32, Arc<str>>,
    freed_order: std::collections::VecDeque<u32>,
}

/// A live name's id and whether it has a block map of its own (a base model), so a LoRA
/// adapter's blocks are found from its name with one probe.
#[derive(Debug, Clone, Copy)]
struct Named {
    id: u32,
    own: bool,
}

struct LiveModel {
    name: Arc<str>,
    /// Sources holding the model (base model or blocks) and events being applied with it.
    refs: AtomicU32,
    /// A base model's own block map; `None` for an adapter (its blocks are in the shared map).
    blocks: Option<Arc<ModelBlocks>>,
}

impl Default for ModelTable {
    fn default() -> Self {
        ModelTable::new(DEFAULT_MAX_MODELS_PER_SOURCE, DEFAULT_FREED_MODEL_NAMES)
    }
}

impl ModelTable {
    /// An empty table whose sources may hold `max_per_source` models each, and which keeps
    /// the names of the last `freed_kept` freed models resolvable.
    pub(crate) fn new(max_per_source: usize, freed_kept: usize) -> ModelTable {
        ModelTable {
            inner: RwLock::default(),
            lora: Arc::default(),
            max_per_source: max_per_source.max(1),
            freed_kept,
        }
    }

    /// The id of base model `name` with one more reference, allocated on first sight;
    /// `None` once ids are exhausted.
    pub(crate) fn acquire(&self, name: &str) -> Option<u32> {
        self.acquire_with(name, || Some(Arc::default()))
            .map(|(id, _)| id)
    }

    /// The same for a LoRA adapter (no map of its own: its blocks go to the shared map),
    /// with its blocks. A name that is already live keeps the kind it was created with.
    pub(crate) fn acquire_lora(&self, name: &str) -> Option<(u32, Blocks)> {
        self.acquire_with(name, || None)
    }

    fn acquire_with(
        &self,
        name: &str,
        blocks: impl FnOnce() -> Option<Arc<ModelBlocks>>,
    ) -> Option<(u32, Blocks)> {
        {
            let inner = self.inner.read();
            if let Some(found) = self.retain_named(&inner, name) {
                return Some(found);
            }
        }
        let mut inner = self.inner.write();
        if let Some(found) = self.retain_named(&inner, name) {
            return Some(found);
        }
        let id = inner.next;
        inner.next = id.checked_add(1)?;
        let name: Arc<str> = Arc::from(name);
        let blocks = blocks();
        let own = blocks.is_some();
        inner.by_name.insert(name.clone(), Named { id, own });
        let handle = self.handle(id, blocks.as_ref());
        let live = LiveModel {
            name,
            refs: AtomicU32::new(1),
            blocks,
        };
        inner.live.insert(id, live);
        Some((id, handle))
    }

    /// One more reference to live `name`, with its id and blocks.
    fn retain_named(&self, inner: &ModelsInner, name: &str) -> Option<(u32, Blocks)> {
        let id = inner.by_name.get(name)?.id;
        let live = inner.live.get(&id)?;
        live.refs.fetch_add(1, Ordering::AcqRel);
        Some((id, self.handle(id, live.blocks.as_ref())))
    }

    /// The blocks of model `id` whose own map (a base model's) is `own`.
    fn handle(&self, id: u32, own: Option<&Arc<ModelBlocks>>) -> Blocks {
        match own {
            Some(own) => Blocks::Own(own.clone()),
            None => Blocks::Lora(self.lora.clone(), id),
        }
    }

    /// The id and blocks of live `name`, without a reference: for a caller that already
    /// holds one (a source that holds the model), so the model cannot be freed meanwhile.
    /// A LoRA adapter is found with one probe.
    pub(crate) fn lookup(&self, name: &str) -> Option<(u32, Blocks)> {
        let inner = self.inner.read();
        let named = *inner.by_name.get(name)?;
        if !named.own {
            return Some((named.id, Blocks::Lora(self.lora.clone(), named.id)));
        }
        let live = inner.live.get(&named.id)?;
        Some((named.id, self.handle(named.id, live.blocks.as_ref())))
    }

    /// One more reference to a live `id` (the caller already holds one).
    pub(crate) fn retain(&self, id: u32) {
        if let Some(live) = self.inner.read().live.get(&id) {
            live.refs.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Drops one reference; the last one frees the model's name and block map.
    pub(crate) fn release(&self, id: u32) {
        let last = match self.inner.read().live.get(&id) {
            Some(live) => live.refs.fetch_sub(1, Ordering::AcqRel) == 1,
            None => false,
        };
        if !last {
            return;
        }
        let mut inner = self.inner.write();
        // Someone may have acquired it again between the two locks.
        if inner
            .live
            .get(&id)
            .is_none_or(|l| l.refs.load(Ordering::Acquire) != 0)
        {
            return;
        }
        let Some(live) = inner.live.remove(&id) else {
            return;
        };
        inner.by_name.remove(&live.name);
        if self.freed_kept > 0 {
            inner.freed.insert(id, live.name);
            inner.freed_order.push_back(id);
        }
        while inner.freed_order.len() > self.freed_kept {
            if let Some(old) = inner.freed_order.pop_front() {
                inner.freed.remove(&old);
            }
        }
        // Tables never shrink by themselves: give back a burst of adapters' slots.
        shrink_sparse(&mut inner.by_name);
        shrink_sparse(&mut inner.live);
    }

    /// The id of a live `name`.
    pub(crate) fn get(&self, name: &str) -> Option<u32> {
        self.inner.read().by_name.get(name).map(|n| n.id)
    }

    /// The name behind `id` (a recently freed one too; empty for an unknown id).
    pub(crate) fn name(&self, id: u32) -> Arc<str> {
        let inner = self.inner.read();
        inner
            .live
            .get(&id)
            .map(|l| l.name.clone())
            .or_else(|| inner.freed.get(&id).cloned())
            .unwrap_or_else(|| Arc::from(""))
    }

    /// The std blocks of a live model.
    pub(crate) fn blocks(&self, id: u32) -> Option<Blocks> {
        let inner = self.inner.read();
        let live = inner.live.get(&id)?;
        Some(self.handle(id, live.blocks.as_ref()))
    }

    /// Every live base model's own block map (adapters' blocks are in [`Self::lora_blocks`]).
    pub(crate) fn all_blocks(&self) -> Vec<(u32, Arc<ModelBlocks>)> {
        let inner = self.inner.read();
        inner
            .live
            .iter()
            .filter_map(|(id, l)| Some((*id, l.blocks.clone()?)))
            .collect()
    }

    /// The map of every LoRA adapter's std blocks, keyed by (model, std hash).
    pub(crate) fn lora_blocks(&self) -> &LoraBlocks {
        &self.lora
    }

    /// Live models (for tests and figures).
    pub(crate) fn live(&self) -> usize {
        self.inner.read().live.len()
    }
}

/// Halves a table's spare room once it is at most a quarter full (amortized O(1)).
fn shrink_sparse<K: Eq + std::hash::Hash, V>(map: &mut HashMap<K, V>) {
    if map.capacity() > 64 && map.len() * 4 < map.capacity() {
        map.shrink_to(map.len() * 2);
    }
}

//! Per-source state: one (pod, DP rank) engine's engine-hash map and group bookkeeping.
//!
//! The engine-hash map is also the set of blocks the source holds, so clearing a source or
//! forgetting a pod walks exactly that source's entries, never the whole index.
//!
//! One map per source, keyed by engine hash alone (an engine hash names one block of one
//! source whatever its model), with the model in the slot: a lookup is O(1) whatever the
//! number of LoRA names. Per-model block counts say which models the source holds; the
//! source keeps one reference in the [`ModelTable`] per model it holds, so a model whose
//! last block leaves every source is freed.

use std::sync::Arc;

use hashbrown::HashMap;

use super::intern::ModelTable;

use crate::medium::{MediaSet, MEDIA_SLOTS};
use crate::wire::{BlockHash, Engine};

/// Where one engine block sits: its model, its std hash (63 bits, top bit = "sent as
/// negative") and the media this engine block is resident on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EngineSlot {
    std_lo: u32,
    std_hi: u32,
    media: u32,
    model: u32,
}

const NEG_FLAG: u64 = 1 << 63;

impl EngineSlot {
    fn new(model: u32, std: u64, negative: bool, media: MediaSet) -> EngineSlot {
        let packed = (std & !NEG_FLAG) | if negative { NEG_FLAG } else { 0 };
        EngineSlot {
            std_lo: packed as u32,
            std_hi: (packed >> 32) as u32,
            media: media.bits(),
            model,
        }
    }

    fn packed(&self) -> u64 {
        (u64::from(self.std_hi) << 32) | u64::from(self.std_lo)
    }

    /// The standardized hash.
    pub(crate) fn std(&self) -> u64 {
        self.packed() & !NEG_FLAG
    }

    /// The model (base or LoRA adapter) the block was stored under.
    pub(crate) fn model(&self) -> u32 {
        self.model
    }

    fn negative(&self) -> bool {
        self.packed() & NEG_FLAG != 0
    }

    /// Media of this engine block.
    pub(crate) fn media(&self) -> MediaSet {
        MediaSet::from_bits(self.media)
    }

    pub(crate) fn set_media(&mut self, media: MediaSet) {
        self.media = media.bits();
    }
}

/// An integer engine hash's 64 bits, split so map buckets pack to 4-byte alignment.
type IntKey = [u32; 2];

fn int_key(bits: u64) -> IntKey {
    [bits as u32, (bits >> 32) as u32]
}

fn int_bits(key: &IntKey) -> u64 {
    (u64::from(key[1]) << 32) | u64::from(key[0])
}

/// Approximate heap bytes of a hashbrown table with `capacity` usable slots.
pub(crate) fn table_bytes<K, V>(capacity: usize) -> usize {
    if capacity == 0 {
        return 0;
    }
    let buckets = (capacity * 8 / 7).next_power_of_two();
    buckets * (std::mem::size_of::<(K, V)>() + 1)
}

/// The state of one event source.
pub(crate) struct SourceState {
    pub(crate) pod: u32,
    pub(crate) rank: u8,
    pub(crate) engine: Engine,
    pub(crate) base_model: u32,
    /// The full-attention KV-cache group, learned from events that name their spec kind.
    main_group: Option<i64>,
    ints: HashMap<IntKey, EngineSlot>,
    bytes: HashMap<Box<[u8]>, EngineSlot>,
    /// Engine blocks held per model; a model is here (and referenced) while it has any.
    models: HashMap<u32, u32>,
    /// References to drop once the current call has settled the block maps (dropping one
    /// may free a model's block map, which must not happen while its blocks are edited).
    deferred: Vec<u32>,
    table: Arc<ModelTable>,
    /// Per-medium counts of engine blocks, only for std blocks this source holds through
    /// more than one engine hash (the same tokens after different prefixes).
    pub(crate) dups: HashMap<(u32, u64), [u16; MEDIA_SLOTS]>,
}

impl SourceState {
    /// A source holding nothing; `base_model` must already be referenced for it.
    pub(crate) fn new(
        pod: u32,
        rank: u8,
        engine: Engine,
        base_model: u32,
        table: Arc<ModelTable>,
    ) -> SourceState {
        SourceState {
            pod,
            rank,
            engine,
            base_model,
            main_group: None,
            ints: HashMap::new(),
            bytes: HashMap::new(),
            models: HashMap::new(),
            deferred: Vec::new(),
            table,
            dups: HashMap::new(),
        }
    }

    /// Whether an event of `group_idx` / `kind` belongs to the main full-attention group.
    pub(crate) fn is_main_group(&mut self, group_idx: Option<i64>, kind: Option<&str>) -> bool {
        match (group_idx, kind) {
            (None, None) => true,
            (group, Some(kind)) => {
                let full = kind.eq_ignore_ascii_case("full_attention")
                    || kind.eq_ignore_ascii_case("full");
                if full {
                    if let Some(g) = group {
                        self.main_group = Some(g);
                    }
                }
                full
            }
            (Some(group), None) => group == self.main_group.unwrap_or(0),
        }
    }

    /// The id of LoRA `name`, referenced until this call settles ([`Self::settle`]);
    /// `None` when the source already holds its cap of distinct models (or ids ran out).
    pub(crate) fn lora_model(&mut self, name: &str) -> Option<u32> {
        let id = self.table.acquire(name)?;
        self.deferred.push(id);
        let admitted = self.models.contains_key(&id)
            || id == self.base_model
            || self.models.len() < self.table.max_per_source;
        admitted.then_some(id)
    }

    /// Drops the references deferred during this call; call once the call's block-map edits
    /// are done.
    pub(crate) fn settle(&mut self) {
        for id in self.deferred.drain(..) {
            self.table.release(id);
        }
        self.shrink();
    }

    /// The slot of `hash`, whatever its model. (`_model` is kept for the call sites: an
    /// engine hash names one block per source, so no preference is needed.)
    pub(crate) fn find_mut(
        &mut self,
        hash: &BlockHash,
        _model: u32,
    ) -> Option<(u32, &mut EngineSlot)> {
        let slot = match hash {
            BlockHash::Int(v) => self.ints.get_mut(&int_key(*v)).filter(|s| !s.negative()),
            BlockHash::Neg(v) => self
                .ints
                .get_mut(&int_key(*v as u64))
                .filter(|s| s.negative()),
            BlockHash::Bytes(b) => self.bytes.get_mut(&**b),
        }?;
        Some((slot.model, slot))
    }

    /// Inserts `hash` under `model`; returns the slot it displaced (with its own model).
    /// Int keys hold only the 64 bits, so an unsigned hash and a negative one with the same
    /// bits share a key: the caller must drop the displaced block (returned with its hash as
    /// it was sent).
    pub(crate) fn insert(
        &mut self,
        model: u32,
        hash: &BlockHash,
        std: u64,
        media: MediaSet,
    ) -> Option<(BlockHash, EngineSlot)> {
        self.count_in(model);
        let (bits, negative) = match hash {
            BlockHash::Int(v) => (*v, false),
            BlockHash::Neg(v) => (*v as u64, true),
            BlockHash::Bytes(b) => {
                let old = self
                    .bytes
                    .insert(b.clone(), EngineSlot::new(model, std, false, media))?;
                self.count_out(old.model);
                return Some((hash.clone(), old));
            }
        };
        let old = self
            .ints
            .insert(int_key(bits), EngineSlot::new(model, std, negative, media))?;
        self.count_out(old.model);
        let twin = if old.negative() {
            BlockHash::Neg(bits as i64)
        } else {
            BlockHash::Int(bits)
        };
        Some((twin, old))
    }

    /// Removes `hash` (of any model).
    pub(crate) fn remove(&mut self, _model: u32, hash: &BlockHash) {
        let old = match hash {
            BlockHash::Int(v) => self.ints.remove(&int_key(*v)),
            BlockHash::Neg(v) => self.ints.remove(&int_key(*v as u64)),
            BlockHash::Bytes(b) => self.bytes.remove(&**b),
        };
        if let Some(old) = old {
            self.count_out(old.model);
        }
    }

    /// One more block of `model`: its first takes a reference.
    fn count_in(&mut self, model: u32) {
        let n = self.models.entry(model).or_insert(0);
        if *n == 0 {
            self.table.retain(model);
        }
        *n += 1;
    }

    /// One block of `model` fewer: its last defers dropping the reference.
    fn count_out(&mut self, model: u32) {
        let Some(n) = self.models.get_mut(&model) else {
            return;
        };
        *n = n.saturating_sub(1);
        if *n == 0 {
            self.models.remove(&model);
            self.deferred.push(model);
        }
    }

    /// Number of engine blocks held.
    pub(crate) fn len(&self) -> usize {
        self.ints.len() + self.bytes.len()
    }

    /// Every (engine hash, slot), rebuilding the hash exactly as it was sent.
    pub(crate) fn entries(&self) -> impl Iterator<Item = (BlockHash, EngineSlot)> + '_ {
        let ints = self.ints.iter().map(|(k, s)| {
            let bits = int_bits(k);
            let hash = if s.negative() {
                BlockHash::Neg(bits as i64)
            } else {
                BlockHash::Int(bits)
            };
            (hash, *s)
        });
        let bytes = self
            .bytes
            .iter()
            .map(|(k, s)| (BlockHash::Bytes(k.clone()), *s));
        ints.chain(bytes)
    }

    /// Every slot without rebuilding hashes.
    pub(crate) fn slots(&self) -> impl Iterator<Item = EngineSlot> + '_ {
        self.ints.values().chain(self.bytes.values()).copied()
    }

    /// Drops every engine block (after their residents were removed); the maps give their
    /// memory back, so a source that held a burst does not keep its peak.
    pub(crate) fn clear(&mut self) {
        self.ints = HashMap::new();
        self.bytes = HashMap::new();
        self.dups = HashMap::new();
        let models: Vec<u32> = self.models.drain().map(|(m, _)| m).collect();
        self.deferred.extend(models);
        self.models = HashMap::new();
        self.main_group = None;
    }

    /// Gives back map memory after many removes (a quarter full or less).
    fn shrink(&mut self) {
        if self.ints.capacity() > 64 && self.ints.len() * 4 < self.ints.capacity() {
            self.ints.shrink_to(self.ints.len() * 2);
        }
        if self.bytes.capacity() > 64 && self.bytes.len() * 4 < self.bytes.capacity() {
            self.bytes.shrink_to(self.bytes.len() * 2);
        }
        if self.models.capacity() > 16 && self.models.len() * 4 < self.models.capacity() {
            self.models.shrink_to(self.models.len() * 2);
        }
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        table_bytes::<IntKey, EngineSlot>(self.ints.capacity())
            + table_bytes::<Box<[u8]>, EngineSlot>(self.bytes.capacity())
            + self.bytes.keys().map(|k| k.len()).sum::<usize>()
            + table_bytes::<u32, u32>(self.models.capacity())
            + table_bytes::<(u32, u64), [u16; MEDIA_SLOTS]>(self.dups.capacity())
    }
}

impl Drop for SourceState {
    /// Gives back the base model's reference and any still held or deferred.
    fn drop(&mut self) {
        self.clear();
        self.deferred.push(self.base_model);
        self.settle();
    }
}

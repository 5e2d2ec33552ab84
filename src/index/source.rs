//! Per-source state: one (pod, DP rank) engine's engine-hash map and group bookkeeping.
//!
//! The engine-hash map is also the set of blocks the source holds, so clearing a source or
//! forgetting a pod walks exactly that source's entries, never the whole index.
//!
//! Keyed by engine hash alone (an engine hash names one block of one source whatever its
//! model): one map for the base model's blocks and one for every LoRA adapter's, whose
//! slots carry their model, so a lookup is at most two probes whatever the number of LoRA
//! names, and a source without LoRA blocks pays nothing for them. Per-model block counts say which models the source holds; the
//! source keeps one reference in the [`ModelTable`] per model it holds, so a model whose
//! last block leaves every source is freed.

use std::sync::Arc;

use hashbrown::HashMap;

use super::intern::ModelTable;
use super::layer::DupCounts;
use super::runs::HeldRuns;
use super::walk::{partition_of_bits, partition_of_bytes};
use super::Blocks;

use crate::medium::{MediaSet, MEDIA_SLOTS};
use crate::wire::{BlockHash, Engine};

/// Where one engine block sits: its std hash (63 bits, top bit = "sent as negative"), its
/// chain hash (0 = chain unknown, not matched in `prefix` mode) and the media this engine
/// block is resident on. 20 bytes (4-byte aligned halves): the model is implied by the map
/// that holds it (the base model's, or the LoRA map's [`HeldSlot`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EngineSlot {
    std_lo: u32,
    std_hi: u32,
    chain_lo: u32,
    chain_hi: u32,
    media: u32,
}

const NEG_FLAG: u64 = 1 << 63;

impl EngineSlot {
    fn new(std: u64, chain: u64, negative: bool, media: MediaSet) -> EngineSlot {
        let packed = (std & !NEG_FLAG) | if negative { NEG_FLAG } else { 0 };
        EngineSlot {
            std_lo: packed as u32,
            std_hi: (packed >> 32) as u32,
            chain_lo: chain as u32,
            chain_hi: (chain >> 32) as u32,
            media: media.bits(),
        }
    }

    /// The chain hash, 0 when the block's chain is unknown.
    pub(crate) fn chain(&self) -> u64 {
        (u64::from(self.chain_hi) << 32) | u64::from(self.chain_lo)
    }

    pub(crate) fn set_chain(&mut self, chain: u64) {
        self.chain_lo = chain as u32;
        self.chain_hi = (chain >> 32) as u32;
    }

    fn packed(&self) -> u64 {
        (u64::from(self.std_hi) << 32) | u64::from(self.std_lo)
    }

    /// The standardized hash.
    pub(crate) fn std(&self) -> u64 {
        self.packed() & !NEG_FLAG
    }

    fn negative(&self) -> bool {
        self.packed() & NEG_FLAG != 0
    }

    /// The engine hash of an int key's 64 `bits` as it was sent: signed when this slot's
    /// hash came negative.
    fn int_hash(&self, bits: u64) -> BlockHash {
        if self.negative() {
            BlockHash::Neg(bits as i64)
        } else {
            BlockHash::Int(bits)
        }
    }

    /// Media of this engine block.
    pub(crate) fn media(&self) -> MediaSet {
        MediaSet::from_bits(self.media)
    }

    pub(crate) fn set_media(&mut self, media: MediaSet) {
        self.media = media.bits();
    }
}

/// An engine slot with its model: how slots are stored in the LoRA maps and handed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HeldSlot {
    slot: EngineSlot,
    model: u32,
}

impl HeldSlot {
    /// The standardized hash.
    pub(crate) fn std(&self) -> u64 {
        self.slot.std()
    }

    /// Media of this engine block.
    pub(crate) fn media(&self) -> MediaSet {
        self.slot.media()
    }

    /// The chain hash, 0 when unknown.
    pub(crate) fn chain(&self) -> u64 {
        self.slot.chain()
    }

    /// The model (base or LoRA adapter) the block was stored under.
    pub(crate) fn model(&self) -> u32 {
        self.model
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

/// Engine blocks taken out of a source whole, when a clear hands them to a mirror rather
/// than one delta per block: the maps the clear would have freed, walked once by the mirror
/// (in slices) and freed when the walk ends.
pub(crate) struct TakenBlocks {
    base: u32,
    ints: HashMap<IntKey, EngineSlot>,
    bytes: HashMap<Box<[u8]>, EngineSlot>,
    lora_ints: HashMap<IntKey, HeldSlot>,
    lora_bytes: HashMap<Box<[u8]>, HeldSlot>,
}

impl TakenBlocks {
    /// Number of engine blocks taken.
    pub(crate) fn len(&self) -> usize {
        self.ints.len() + self.bytes.len() + self.lora_ints.len() + self.lora_bytes.len()
    }

    /// Every (engine hash as it was sent, slot), consuming the maps.
    pub(crate) fn into_entries(
        self,
    ) -> impl Iterator<Item = (BlockHash, HeldSlot)> + Send + 'static {
        let base = self.base;
        let ints = self.ints.into_iter().map(move |(k, slot)| {
            let held = HeldSlot { slot, model: base };
            (slot.int_hash(int_bits(&k)), held)
        });
        let lora_ints = (self.lora_ints.into_iter())
            .map(move |(k, held)| (held.slot.int_hash(int_bits(&k)), held));
        let bytes = (self.bytes.into_iter())
            .map(move |(k, slot)| (BlockHash::Bytes(k), HeldSlot { slot, model: base }));
        let lora_bytes = (self.lora_bytes.into_iter()).map(|(k, held)| (BlockHash::Bytes(k), held));
        ints.chain(lora_ints).chain(bytes).chain(lora_bytes)
    }
}

/// The state of one event source.
pub(crate) struct SourceState {
    pub(crate) pod: u32,
    pub(crate) rank: u8,
    pub(crate) engine: Engine,
    pub(crate) base_model: u32,
    /// The full-attention KV-cache group, learned from events that name their spec kind.
    main_group: Option<i64>,
    /// Engine hash → slot of the base model's blocks (most sources hold nothing else, and
    /// pay nothing for LoRA support).
    ints: HashMap<IntKey, EngineSlot>,
    bytes: HashMap<Box<[u8]>, EngineSlot>,
    /// The same for LoRA adapters' blocks, each slot with its model. A key is in at most one
    /// of the base and LoRA maps.
    lora_ints: HashMap<IntKey, HeldSlot>,
    lora_bytes: HashMap<Box<[u8]>, HeldSlot>,
    /// Engine blocks held per model; a model is here (and referenced) while it has any.
    models: HashMap<u32, u32>,
    /// References to drop once the current call has settled the block maps (dropping one
    /// may free a model's block map, which must not happen while its blocks are edited).
    deferred: Vec<u32>,
    table: Arc<ModelTable>,
    /// Per-medium counts of engine blocks, only for std blocks this source holds through
    /// more than one engine hash (the same tokens after different prefixes).
    /// Chain blocks held more than once sit here too, under model [`super::layer::CHAIN_DUPS`].
    pub(crate) dups: DupCounts,
    /// The chain runs this source holds spans in, for a clear.
    pub(crate) runs: HeldRuns,
    /// Chain hash of the base model's first blocks ([`crate::hash::model_seed`]).
    pub(crate) base_seed: u64,
    /// The watermark a restored source resumes after, until its pipeline takes it.
    pub(crate) resume_seq: Option<u64>,
    /// The engine run (process identity) whose blocks the source holds, when known.
    pub(crate) run: Option<String>,
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
            lora_ints: HashMap::new(),
            lora_bytes: HashMap::new(),
            models: HashMap::new(),
            deferred: Vec::new(),
            table,
            dups: HashMap::new(),
            runs: HeldRuns::default(),
            base_seed: 0,
            resume_seq: None,
            run: None,
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

    /// The id and blocks of LoRA `name`; `None` when the source already holds its cap of
    /// distinct models (or ids ran out). A model the source does not hold yet is referenced
    /// until this call settles ([`Self::settle`]); one it holds needs no reference (it
    /// cannot be freed meanwhile: this source holds it), so a block of a held adapter costs
    /// one probe of the name table, whatever the number of names.
    pub(crate) fn lora_model(&mut self, name: &str) -> Option<(u32, Blocks)> {
        if let Some((id, blocks)) = self.table.lookup(name) {
            if self.models.contains_key(&id) || id == self.base_model {
                return Some((id, blocks));
            }
        }
        if self.models.len() >= self.table.max_per_source {
            // At the cap only a model this source holds is admitted, and a refused name
            // allocates nothing.
            return None;
        }
        let (id, blocks) = self.table.acquire_lora(name)?;
        self.deferred.push(id);
        Some((id, blocks))
    }

    /// Drops the references deferred during this call; call once the call's block-map edits
    /// are done.
    pub(crate) fn settle(&mut self) {
        for id in self.deferred.drain(..) {
            self.table.release(id);
        }
        self.shrink();
    }

    /// The slot of `hash`, whatever its model, with that model. (`_model` is kept for the
    /// call sites: an engine hash names one block per source, so no preference is needed.)
    pub(crate) fn find_mut(
        &mut self,
        hash: &BlockHash,
        _model: u32,
    ) -> Option<(u32, &mut EngineSlot)> {
        let base = self.base_model;
        let (key, negative) = match hash {
            BlockHash::Int(v) => (int_key(*v), false),
            BlockHash::Neg(v) => (int_key(*v as u64), true),
            BlockHash::Bytes(b) => {
                if let Some(slot) = self.bytes.get_mut(&**b) {
                    return Some((base, slot));
                }
                let held = self.lora_bytes.get_mut(&**b)?;
                return Some((held.model, &mut held.slot));
            }
        };
        if let Some(slot) = self.ints.get_mut(&key) {
            return (slot.negative() == negative).then_some((base, slot));
        }
        let held = self.lora_ints.get_mut(&key)?;
        (held.slot.negative() == negative).then_some((held.model, &mut held.slot))
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
        chain: u64,
        media: MediaSet,
    ) -> Option<(BlockHash, HeldSlot)> {
        self.count_in(model);
        let (bits, negative) = match hash {
            BlockHash::Int(v) => (*v, false),
            BlockHash::Neg(v) => (*v as u64, true),
            BlockHash::Bytes(b) => {
                let slot = EngineSlot::new(std, chain, false, media);
                let old = self.take_bytes(b);
                if model == self.base_model {
                    self.bytes.insert(b.clone(), slot);
                } else {
                    self.lora_bytes.insert(b.clone(), HeldSlot { slot, model });
                }
                let old = old?;
                self.count_out(old.model);
                return Some((hash.clone(), old));
            }
        };
        let key = int_key(bits);
        let slot = EngineSlot::new(std, chain, negative, media);
        let base = self.base_model;
        // `insert` hands back what it displaced in the same probe; a key is in at most one of
        // the two maps, so the other one is only checked for it.
        let old = if model == base {
            let old = self.ints.insert(key, slot);
            let old = old.map(|slot| HeldSlot { slot, model: base });
            old.or_else(|| self.lora_ints.remove(&key))
        } else {
            let old = self.lora_ints.insert(key, HeldSlot { slot, model });
            old.or_else(|| {
                self.ints
                    .remove(&key)
                    .map(|slot| HeldSlot { slot, model: base })
            })
        };
        let old = old?;
        self.count_out(old.model);
        Some((old.slot.int_hash(bits), old))
    }

    /// Takes an int key out of whichever map holds it.
    fn take_int(&mut self, key: IntKey) -> Option<HeldSlot> {
        let base = self.base_model;
        match self.ints.remove(&key) {
            Some(slot) => Some(HeldSlot { slot, model: base }),
            None => self.lora_ints.remove(&key),
        }
    }

    /// Takes a bytes key out of whichever map holds it.
    fn take_bytes(&mut self, key: &[u8]) -> Option<HeldSlot> {
        let base = self.base_model;
        match self.bytes.remove(key) {
            Some(slot) => Some(HeldSlot { slot, model: base }),
            None => self.lora_bytes.remove(key),
        }
    }

    /// Removes `hash` (of any model).
    pub(crate) fn remove(&mut self, _model: u32, hash: &BlockHash) {
        let old = match hash {
            BlockHash::Int(v) => self.take_int(int_key(*v)),
            BlockHash::Neg(v) => self.take_int(int_key(*v as u64)),
            BlockHash::Bytes(b) => self.take_bytes(b),
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
        self.ints.len() + self.bytes.len() + self.lora_ints.len() + self.lora_bytes.len()
    }

    /// Every (engine hash, slot), rebuilding the hash exactly as it was sent.
    pub(crate) fn entries(&self) -> impl Iterator<Item = (BlockHash, HeldSlot)> + '_ {
        self.entries_where(|_| true, |_| true)
    }

    /// The entries of one partition of the source (see `walk.rs`): keys are filtered before
    /// hashes are rebuilt, so a walk in pieces copies each entry once per pass.
    pub(crate) fn partition_entries(
        &self,
        partition: u32,
        partitions: u32,
    ) -> impl Iterator<Item = (BlockHash, HeldSlot)> + '_ {
        self.entries_where(
            move |bits| partition_of_bits(bits, partitions) == partition,
            move |bytes| partition_of_bytes(bytes, partitions) == partition,
        )
    }

    /// The entries whose key passes `keep_int` (int hashes, by their 64 bits) or
    /// `keep_bytes` (byte-string hashes); only those hashes are rebuilt.
    fn entries_where<'a>(
        &'a self,
        keep_int: impl Fn(u64) -> bool + 'a,
        keep_bytes: impl Fn(&[u8]) -> bool + 'a,
    ) -> impl Iterator<Item = (BlockHash, HeldSlot)> + 'a {
        let base = self.base_model;
        let held = move |slot: &EngineSlot| HeldSlot {
            slot: *slot,
            model: base,
        };
        let ints = self.ints.iter().map(move |(k, s)| (int_bits(k), held(s)));
        let ints = ints.chain(self.lora_ints.iter().map(|(k, s)| (int_bits(k), *s)));
        let ints = ints
            .filter(move |(bits, _)| keep_int(*bits))
            .map(move |(bits, s)| (s.slot.int_hash(bits), s));
        let bytes = self.bytes.iter().map(move |(k, s)| (k, held(s)));
        let bytes = bytes.chain(self.lora_bytes.iter().map(|(k, s)| (k, *s)));
        let bytes = bytes
            .filter(move |(k, _)| keep_bytes(k))
            .map(|(k, s)| (BlockHash::Bytes(k.clone()), s));
        ints.chain(bytes)
    }

    /// The std hash this source maps `hash` to, whatever its model.
    pub(crate) fn std_of(&self, hash: &BlockHash) -> Option<u64> {
        self.slot_of(hash).map(|s| s.std())
    }

    /// The slot of `hash`, whatever its model.
    pub(crate) fn slot_of(&self, hash: &BlockHash) -> Option<EngineSlot> {
        let (key, negative) = match hash {
            BlockHash::Int(v) => (int_key(*v), false),
            BlockHash::Neg(v) => (int_key(*v as u64), true),
            BlockHash::Bytes(b) => {
                return self
                    .bytes
                    .get(&**b)
                    .copied()
                    .or_else(|| self.lora_bytes.get(&**b).map(|h| h.slot));
            }
        };
        let slot = self
            .ints
            .get(&key)
            .copied()
            .or_else(|| self.lora_ints.get(&key).map(|h| h.slot))?;
        (slot.negative() == negative).then_some(slot)
    }

    /// Every slot without rebuilding hashes.
    pub(crate) fn slots(&self) -> impl Iterator<Item = HeldSlot> + '_ {
        let base = self.base_model;
        let held = move |slot: &EngineSlot| HeldSlot {
            slot: *slot,
            model: base,
        };
        let base_slots = self.ints.values().chain(self.bytes.values()).map(held);
        base_slots.chain(
            self.lora_ints
                .values()
                .chain(self.lora_bytes.values())
                .copied(),
        )
    }

    /// Takes the engine-hash maps out whole (after their residents were removed), for a
    /// clear that hands them to a mirror; [`Self::clear`] then does the rest.
    pub(crate) fn take_blocks(&mut self) -> TakenBlocks {
        TakenBlocks {
            base: self.base_model,
            ints: std::mem::take(&mut self.ints),
            bytes: std::mem::take(&mut self.bytes),
            lora_ints: std::mem::take(&mut self.lora_ints),
            lora_bytes: std::mem::take(&mut self.lora_bytes),
        }
    }

    /// Drops every engine block (after their residents were removed); the maps give their
    /// memory back, so a source that held a burst does not keep its peak.
    pub(crate) fn clear(&mut self) {
        self.ints = HashMap::new();
        self.bytes = HashMap::new();
        self.lora_ints = HashMap::new();
        self.lora_bytes = HashMap::new();
        self.dups = HashMap::new();
        self.runs = HeldRuns::default();
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
        if self.lora_ints.capacity() > 64 && self.lora_ints.len() * 4 < self.lora_ints.capacity() {
            self.lora_ints.shrink_to(self.lora_ints.len() * 2);
        }
        if self.lora_bytes.capacity() > 64 && self.lora_bytes.len() * 4 < self.lora_bytes.capacity()
        {
            self.lora_bytes.shrink_to(self.lora_bytes.len() * 2);
        }
        if self.models.capacity() > 16 && self.models.len() * 4 < self.models.capacity() {
            self.models.shrink_to(self.models.len() * 2);
        }
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        table_bytes::<IntKey, EngineSlot>(self.ints.capacity())
            + table_bytes::<Box<[u8]>, EngineSlot>(self.bytes.capacity())
            + self.bytes.keys().map(|k| k.len()).sum::<usize>()
            + table_bytes::<IntKey, HeldSlot>(self.lora_ints.capacity())
            + table_bytes::<Box<[u8]>, HeldSlot>(self.lora_bytes.capacity())
            + self.lora_bytes.keys().map(|k| k.len()).sum::<usize>()
            + table_bytes::<u32, u32>(self.models.capacity())
            + table_bytes::<(u32, u64), [u16; MEDIA_SLOTS]>(self.dups.capacity())
            + self.runs.heap_bytes()
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

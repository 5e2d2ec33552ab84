//! Per-source state: one (pod, DP rank) engine's engine-hash map and group bookkeeping.
//!
//! The engine-hash map is also the set of blocks the source holds, so clearing a source or
//! forgetting a pod walks exactly that source's entries, never the whole index.
//!
//! Keyed by engine hash alone (an engine hash names one block of one source whatever its
//! model), in two kinds of map:
//! - a base-model block whose chain block sits in the chain runs keeps only its spot there
//!   and a code for its media ([`RunSlot`], 4 bytes; the codes are the map's [`Palette`]):
//!   the run keeps the block's chain and std hashes once for every source holding it, so
//!   the common entry of an int engine hash costs a 12-byte bucket;
//! - every other block (a LoRA adapter's, one whose chain is unknown, or one whose node or
//!   media set a run slot cannot name) keeps its slot whole, with its model ([`HeldSlot`]).
//!
//! A lookup is at most two probes whatever the number of LoRA names, and a source without
//! LoRA blocks pays nothing for them. Reading a block's hashes needs the runs, which every
//! caller holds already (an apply has them write-locked for its chain edits). Per-model
//! block counts say which models the source holds; the source keeps one reference in the
//! [`ModelTable`] per model it holds, so a model whose last block leaves every source is
//! freed.

use std::hash::Hash;
use std::sync::Arc;

use hashbrown::hash_map::EntryRef;
use hashbrown::{Equivalent, HashMap};

use super::blocks::Blocks;
use super::counters::CountDelta;
use super::intern::ModelTable;
use super::layer::DupCounts;
use super::runs::{ChainRuns, HeldRuns, Spot, POS_BITS};
use super::vocab::{partition_of_bits, partition_of_bytes, table_bytes};

use crate::medium::{MediaSet, MEDIA_SLOTS};
use crate::wire::{BlockHash, Engine};

/// Where one engine block sits: its std hash (63 bits, top bit = "sent as negative"), its
/// chain hash (0 = chain unknown, not matched in `prefix` mode) and the media this engine
/// block is resident on. 20 bytes (4-byte aligned halves): the model is implied by the map
/// that holds it, or carried beside it ([`HeldSlot`]).
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

    /// Media of this engine block.
    pub(crate) fn media(&self) -> MediaSet {
        MediaSet::from_bits(self.media)
    }
}

/// The engine hash of an int key's 64 `bits` as it was sent: signed when it came negative.
fn int_hash(bits: u64, negative: bool) -> BlockHash {
    if negative {
        BlockHash::Neg(bits as i64)
    } else {
        BlockHash::Int(bits)
    }
}

/// The twin of an int `hash`: the same 64 bits sent with the other sign.
pub(crate) fn twin_of(hash: &BlockHash) -> BlockHash {
    match hash {
        BlockHash::Int(v) => BlockHash::Neg(*v as i64),
        BlockHash::Neg(v) => BlockHash::Int(*v as u64),
        BlockHash::Bytes(b) => BlockHash::Bytes(b.clone()),
    }
}

/// A base-model block found through its spot in the chain runs, which keep its chain and
/// std hashes: 4 bytes, so with its 8-byte key a bucket of the source's map is 12 bytes
/// where a `u64` slot made it 16 (the maps are most of the index's memory: one bucket per
/// (block, source)). From the low bits: the node (20 bits), the position (8), the "sent as
/// negative" flag, and the code of its media in the source's [`Palette`] (3). A block
/// whose node or media a slot cannot name is kept whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RunSlot(u32);

/// Bits of a run slot's node id: blocks of nodes past 2^20 are kept whole.
const RUN_NODE_BITS: u32 = 20;
const RUN_NEG: u32 = 1 << (RUN_NODE_BITS + POS_BITS);
const RUN_CODE_SHIFT: u32 = RUN_NODE_BITS + POS_BITS + 1;
const _: () = assert!(PALETTE <= 1 << (32 - RUN_CODE_SHIFT));

impl RunSlot {
    /// The slot of a block at `spot` on `media`; `None` past the node ids a slot can name,
    /// or when `palette` has no code for `media` and no room for one.
    #[inline]
    fn new(spot: Spot, negative: bool, media: MediaSet, palette: &mut Palette) -> Option<RunSlot> {
        let packed = spot.pack(RUN_NODE_BITS)?;
        let code = palette.code_of(media)?;
        let sign = if negative { RUN_NEG } else { 0 };
        Some(RunSlot(packed | sign | (code << RUN_CODE_SHIFT)))
    }

    fn spot(self) -> Spot {
        Spot::unpack(self.0, RUN_NODE_BITS)
    }

    fn negative(self) -> bool {
        self.0 & RUN_NEG != 0
    }

    fn media(self, palette: &Palette) -> MediaSet {
        palette.media(self.0 >> RUN_CODE_SHIFT)
    }

    /// The slot with its media named by `code` instead.
    fn with_code(self, code: u32) -> RunSlot {
        RunSlot((self.0 & ((1 << RUN_CODE_SHIFT) - 1)) | (code << RUN_CODE_SHIFT))
    }

    /// The whole slot, with the hashes the runs keep at its spot. `None` only if the runs
    /// lost the spot, which a source holding the block prevents (its span keeps it).
    fn resolve(self, model: u32, runs: &ChainRuns, palette: &Palette) -> Option<HeldSlot> {
        let found = runs.hashes_at(self.spot());
        debug_assert!(found.is_some(), "a held block's spot left the runs");
        let (chain, std) = found?;
        let slot = EngineSlot::new(std, chain, self.negative(), self.media(palette));
        Some(HeldSlot { slot, model })
    }
}

/// Media sets a map's run slots can name.
const PALETTE: usize = 8;

/// The media sets a map's run slots name by code, in the order they were first needed: a
/// source's blocks sit on few distinct sets (GPU; CPU; both; a disk tier with them), so a
/// 3-bit code names each where a 24-bit set would not fit a 4-byte slot. Codes are kept
/// until the map is dropped; a ninth set keeps its blocks whole.
#[derive(Debug, Clone, Default)]
struct Palette {
    sets: [MediaSet; PALETTE],
    len: u8,
}

impl Palette {
    /// The code of `media`, given one if it has none and there is room. Inlined: every new
    /// block asks, and mostly the first code is it.
    #[inline]
    fn code_of(&mut self, media: MediaSet) -> Option<u32> {
        if self.sets[0] == media && self.len > 0 {
            return Some(0);
        }
        let len = usize::from(self.len);
        if let Some(code) = self.sets[..len].iter().position(|set| *set == media) {
            return Some(code as u32);
        }
        let free = self.sets.get_mut(len)?;
        *free = media;
        self.len += 1;
        Some(len as u32)
    }

    /// The set named by `code` (one [`Self::code_of`] gave).
    fn media(&self, code: u32) -> MediaSet {
        self.sets[code as usize % PALETTE]
    }
}

/// An engine slot with its model: how whole slots are stored and how every slot is handed
/// out.
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

    fn negative(&self) -> bool {
        self.slot.negative()
    }

    /// Whether this is the block of `hash` as sent, not of its twin: the int hash with the
    /// same 64 bits and the other sign.
    pub(crate) fn sent_as(&self, hash: &BlockHash) -> bool {
        match hash {
            BlockHash::Int(_) => !self.negative(),
            BlockHash::Neg(_) => self.negative(),
            BlockHash::Bytes(_) => true,
        }
    }

    fn set_media(&mut self, media: MediaSet) {
        self.slot.media = media.bits();
    }
}

/// An integer engine hash's 64 bits (hashed as the one `u64` it is). Aligned to 4 bytes,
/// so a bucket of it and a [`RunSlot`] is 12 bytes, not 16.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(C, packed(4))]
struct IntKey(u64);

const _: () = assert!(std::mem::size_of::<(IntKey, RunSlot)>() == 12);

/// What a map inserting under a borrowed key needs (hashbrown's `entry_ref`).
impl From<&IntKey> for IntKey {
    fn from(key: &IntKey) -> IntKey {
        *key
    }
}

/// An engine hash as a map key: an int's 64 bits and its sign, or the bytes.
enum Key<'a> {
    Int(IntKey, bool),
    Bytes(&'a [u8]),
}

fn key_of(hash: &BlockHash) -> Key<'_> {
    match hash {
        BlockHash::Int(v) => Key::Int(IntKey(*v), false),
        BlockHash::Neg(v) => Key::Int(IntKey(*v as u64), true),
        BlockHash::Bytes(b) => Key::Bytes(b),
    }
}

/// A slot to put: a spot in the runs, or whole.
enum Slot {
    Run(RunSlot),
    Whole(HeldSlot),
}

impl Slot {
    /// The slot of a block of `model` (`base` is the source's base model) with its hashes:
    /// a spot when it is the base model's and has a `spot` a run slot can name, else whole.
    /// Inlined: every new block of a store is put through it.
    #[inline]
    fn of(
        (model, base): (u32, u32),
        (std, chain, spot): (u64, u64, Option<Spot>),
        (negative, media): (bool, MediaSet),
        palette: &mut Palette,
    ) -> Slot {
        let run_slot = spot
            .filter(|_| model == base)
            .and_then(|spot| RunSlot::new(spot, negative, media, palette));
        match run_slot {
            Some(slot) => Slot::Run(slot),
            None => Slot::Whole(HeldSlot {
                slot: EngineSlot::new(std, chain, negative, media),
                model,
            }),
        }
    }
}

/// The slots of one kind of key (int or bytes): spots in the runs, and whole slots. A key is
/// in at most one of the two maps.
struct Slots<K> {
    run: HashMap<K, RunSlot>,
    whole: HashMap<K, HeldSlot>,
    /// The media sets `run`'s slots name.
    palette: Palette,
}

impl<K> Default for Slots<K> {
    fn default() -> Self {
        Slots {
            run: HashMap::new(),
            whole: HashMap::new(),
            palette: Palette::default(),
        }
    }
}

impl<K: Hash + Eq> Slots<K> {
    /// The slot under `key`, resolved through `runs` (`base` is the model of run slots),
    /// and its spot if it has one.
    fn get<Q>(&self, key: &Q, base: u32, runs: &ChainRuns) -> Option<(HeldSlot, Option<Spot>)>
    where
        Q: Hash + Equivalent<K> + ?Sized,
    {
        match self.run.get(key) {
            Some(slot) => Some((slot.resolve(base, runs, &self.palette)?, Some(slot.spot()))),
            None => self.whole.get(key).map(|held| (*held, None)),
        }
    }

    /// Probes the run map for `key`, changing nothing ([`SourceState::warm`]).
    fn warm<Q: Hash + Equivalent<K> + ?Sized>(&self, key: &Q) {
        std::hint::black_box(self.run.get(key));
    }

    /// Gives the block under `key` the media of `held` (its slot as found, with the new
    /// media): a run slot whose new media the palette cannot name is kept whole from then on.
    fn set_media<'q, Q>(&mut self, key: &'q Q, held: HeldSlot)
    where
        Q: Hash + Equivalent<K> + ?Sized,
        &'q Q: Into<K>,
    {
        if let Some(slot) = self.run.get_mut(key) {
            match self.palette.code_of(held.media()) {
                Some(code) => *slot = slot.with_code(code),
                None => {
                    self.run.remove(key);
                    self.whole.insert(key.into(), held);
                }
            }
        } else if let Some(whole) = self.whole.get_mut(key) {
            whole.set_media(held.media());
        }
    }

    /// Puts a block of `model` (`base` is the model of run slots) under `key`; returns the
    /// model of the slot it replaced, if any. The insert finds what it replaces in the same
    /// probe; the other map is checked only when it found nothing, and is mostly empty.
    fn put<'q, Q>(
        &mut self,
        key: &'q Q,
        (model, base): (u32, u32),
        hashes: (u64, u64, Option<Spot>),
        sent: (bool, MediaSet),
    ) -> Option<u32>
    where
        Q: Hash + Equivalent<K> + ?Sized,
        &'q Q: Into<K>,
    {
        match Slot::of((model, base), hashes, sent, &mut self.palette) {
            Slot::Run(slot) => match self.run.entry_ref(key) {
                EntryRef::Occupied(mut old) => {
                    old.insert(slot);
                    Some(base)
                }
                EntryRef::Vacant(vacant) => {
                    vacant.insert(slot);
                    // An empty map would still hash the key to answer.
                    let whole = (!self.whole.is_empty()).then(|| self.whole.remove(key));
                    whole.flatten().map(|held| held.model)
                }
            },
            Slot::Whole(held) => match self.whole.entry_ref(key) {
                EntryRef::Occupied(mut old) => Some(old.insert(held).model),
                EntryRef::Vacant(vacant) => {
                    vacant.insert(held);
                    self.run.remove(key).map(|_| base)
                }
            },
        }
    }

    /// Puts a run slot under `key` if it holds nothing (in either map), with `media` at the
    /// spot `place` gives, or whole when the spot is past what a run slot names: one probe
    /// finds whether the key is held and where its slot goes. Returns `place`'s answer, or
    /// `None`, with nothing called or changed, when the key is held. Inlined, as
    /// [`SourceState::put_new`] is, for `place`'s sake: without the attribute it is called
    /// out of line once the caller is inlined, which costs the store path more work.
    #[inline(always)]
    fn put_new<'q, Q>(
        &mut self,
        key: &'q Q,
        (negative, media): (bool, MediaSet),
        (chain, base): (u64, u32),
        place: impl FnOnce() -> (Spot, u64),
    ) -> Option<(Spot, u64)>
    where
        Q: Hash + Equivalent<K> + ?Sized,
        &'q Q: Into<K>,
    {
        let Slots {
            run,
            whole,
            palette,
        } = self;
        if !whole.is_empty() && whole.contains_key(key) {
            return None;
        }
        let EntryRef::Vacant(vacant) = run.entry_ref(key) else {
            return None;
        };
        let (spot, std) = place();
        let hashes = (std, chain, Some(spot));
        match Slot::of((base, base), hashes, (negative, media), palette) {
            Slot::Run(slot) => {
                vacant.insert(slot);
            }
            Slot::Whole(held) => {
                whole.insert(key.into(), held);
            }
        }
        Some((spot, std))
    }

    /// Takes the run slot under `key` out if `take`, given it and its media, gives a value
    /// for it; gives the slot, its media and the value. One probe finds and removes it.
    fn take_run<Q, T>(
        &mut self,
        key: &Q,
        take: impl FnOnce(RunSlot, MediaSet) -> Option<T>,
    ) -> Option<(RunSlot, MediaSet, T)>
    where
        Q: Hash + Equivalent<K> + ?Sized,
    {
        let EntryRef::Occupied(entry) = self.run.entry_ref(key) else {
            return None;
        };
        let slot = *entry.get();
        let media = slot.media(&self.palette);
        let value = take(slot, media)?;
        entry.remove();
        Some((slot, media, value))
    }

    /// Removes `key`; returns the model of the slot it held, if any.
    fn remove<Q: Hash + Equivalent<K> + ?Sized>(&mut self, key: &Q, base: u32) -> Option<u32> {
        match self.run.remove(key) {
            Some(_) => Some(base),
            None => self.whole.remove(key).map(|held| held.model),
        }
    }

    /// Every (key, resolved slot) whose key passes `keep`; only those are resolved.
    fn iter<'a>(
        &'a self,
        base: u32,
        runs: &'a ChainRuns,
        keep: impl Fn(&K) -> bool + Copy + 'a,
    ) -> impl Iterator<Item = (&'a K, HeldSlot)> + 'a {
        let run = (self.run.iter())
            .filter(move |(key, _)| keep(key))
            .filter_map(move |(key, slot)| Some((key, slot.resolve(base, runs, &self.palette)?)));
        let whole = (self.whole.iter())
            .filter(move |(key, _)| keep(key))
            .map(|(key, held)| (key, *held));
        run.chain(whole)
    }

    fn len(&self) -> usize {
        self.run.len() + self.whole.len()
    }

    fn shrink(&mut self) {
        shrink_map(&mut self.run, 64);
        shrink_map(&mut self.whole, 64);
    }

    /// Estimated heap bytes of the tables (not of what keys point to).
    fn table_bytes(&self) -> usize {
        table_bytes::<K, RunSlot>(self.run.capacity())
            + table_bytes::<K, HeldSlot>(self.whole.capacity())
    }
}

/// Engine blocks taken out of a source whole, when a clear hands them to a mirror rather
/// than one delta per block: read out of the source (with their hashes from the runs)
/// before its spans go, walked once by the mirror (in slices) and freed when the walk ends.
pub(crate) struct TakenBlocks {
    entries: Vec<(BlockHash, HeldSlot)>,
}

impl TakenBlocks {
    /// Number of engine blocks taken.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Every slot taken.
    pub(crate) fn slots(&self) -> impl Iterator<Item = &HeldSlot> + '_ {
        self.entries.iter().map(|(_, held)| held)
    }

    /// Every (engine hash as it was sent, slot), consuming the list.
    pub(crate) fn into_entries(
        self,
    ) -> impl Iterator<Item = (BlockHash, HeldSlot)> + Send + 'static {
        self.entries.into_iter()
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
    /// Int engine hash → slot: a spot in the runs for the base model's blocks with a chain
    /// there (most blocks of most sources), whole for every other block (LoRA adapters'
    /// blocks, and blocks whose chain is unknown or whose run keeps another std hash).
    ints: Slots<IntKey>,
    /// The same for byte-string engine hashes.
    bytes: Slots<Box<[u8]>>,
    /// Engine blocks held of the base model, which is referenced while there are any: apart
    /// from `models`, as nearly every block is the base model's and its count moves with
    /// every store and remove.
    base_blocks: u32,
    /// Engine blocks held per LoRA model; a model is here (and referenced) while it has any.
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
    /// The pod-level field changes this source's calls counted, summed ([`super::counters`]).
    pub(crate) counted: CountDelta,
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
            ints: Slots::default(),
            bytes: Slots::default(),
            base_blocks: 0,
            models: HashMap::new(),
            deferred: Vec::new(),
            table,
            dups: HashMap::new(),
            runs: HeldRuns::default(),
            base_seed: 0,
            resume_seq: None,
            run: None,
            counted: CountDelta::default(),
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
        if self.models.len() + usize::from(self.base_blocks > 0) >= self.table.max_per_source {
            // At the cap only a model this source holds is admitted, and a refused name
            // allocates nothing.
            return None;
        }
        let (id, blocks) = self.table.acquire_lora(name)?;
        self.deferred.push(id);
        Some((id, blocks))
    }

    /// Drops the references deferred during this call; call once the call's block-map edits
    /// are done. The maps are checked for memory to give back only when the call `took`
    /// blocks out: a call that only stored cannot have left them emptier (the check is a
    /// few map reads, but every call of the write path makes it).
    #[inline]
    pub(crate) fn settle(&mut self, took: bool) {
        // Mostly empty: a drain of it still costs work on every call.
        if !self.deferred.is_empty() {
            for id in self.deferred.drain(..) {
                self.table.release(id);
            }
        }
        if took {
            self.shrink();
        }
    }

    /// The slot of `hash` (as sent: an int key held with the other sign is not it), whatever
    /// its model, with its hashes read from `runs`; and the block's spot in the runs when
    /// the source keeps it there (an edit of the chain block then needs no lookup of it).
    pub(crate) fn find(
        &self,
        hash: &BlockHash,
        runs: &ChainRuns,
    ) -> Option<(HeldSlot, Option<Spot>)> {
        self.lookup(hash, runs)
            .filter(|(held, _)| held.sent_as(hash))
    }

    /// The slot under `hash`'s key: for an int hash, whichever sign it was sent with (int
    /// keys hold only the 64 bits; see [`HeldSlot::sent_as`]).
    pub(crate) fn find_key(&self, hash: &BlockHash, runs: &ChainRuns) -> Option<HeldSlot> {
        self.lookup(hash, runs).map(|(held, _)| held)
    }

    /// Takes `hash` (as sent) out when the source keeps it by its spot in the runs and
    /// `take`, given the spot, the media and the source's duplicate counts, gives a value
    /// (what it read of the block); gives the spot, the media and that value. One probe
    /// where a lookup and then [`Self::remove`] would take two; the block's hashes are read
    /// only if `take` reads them (they sit in the runs, mostly out of cache).
    #[inline]
    pub(crate) fn take_run_block<T>(
        &mut self,
        hash: &BlockHash,
        take: impl FnOnce(Spot, MediaSet, &DupCounts) -> Option<T>,
    ) -> Option<(Spot, MediaSet, T)> {
        let dups = &self.dups;
        let take = |slot: RunSlot, media| take(slot.spot(), media, dups);
        let (slot, media, value) = match key_of(hash) {
            Key::Int(key, negative) => (self.ints).take_run(&key, |slot, media| {
                (slot.negative() == negative).then(|| take(slot, media))?
            }),
            Key::Bytes(b) => self.bytes.take_run(b, take),
        }?;
        self.count_out(self.base_model);
        Some((slot.spot(), media, value))
    }

    /// The slot under `hash`'s key, whatever its sign, and its spot if it has one.
    fn lookup(&self, hash: &BlockHash, runs: &ChainRuns) -> Option<(HeldSlot, Option<Spot>)> {
        let base = self.base_model;
        match key_of(hash) {
            Key::Int(key, _) => self.ints.get(&key, base, runs),
            Key::Bytes(b) => self.bytes.get(b, base, runs),
        }
    }

    /// Makes room for `hashes`, an event's new blocks of `model`, in the map they go to (the
    /// run map for the base model's, the whole one for an adapter's), so a growing map is
    /// rehashed here, before the event takes the chain runs' write lock, and not inside it,
    /// where every query would wait for it.
    pub(crate) fn reserve(&mut self, hashes: &[BlockHash], model: u32) {
        let base = model == self.base_model;
        let n = hashes.len();
        match hashes.first() {
            Some(BlockHash::Bytes(_)) if base => self.bytes.run.reserve(n),
            Some(BlockHash::Bytes(_)) => self.bytes.whole.reserve(n),
            Some(_) if base => self.ints.run.reserve(n),
            Some(_) => self.ints.whole.reserve(n),
            None => {}
        }
    }

    /// Looks up every hash of a removed event up front, so their probes overlap: the
    /// source's map is mostly out of cache, and an event's blocks are otherwise looked up
    /// one at a time, each waiting for its own miss. Changes nothing. A stored event is not
    /// warmed: its one probe per block (`put_new`) is faster without.
    pub(crate) fn warm(&self, hashes: &[BlockHash]) {
        if hashes.len() < 2 {
            return;
        }
        for hash in hashes {
            match key_of(hash) {
                Key::Int(key, _) => self.ints.warm(&key),
                Key::Bytes(b) => self.bytes.warm(b),
            }
        }
    }

    /// The std hash this source maps `hash` to, whatever its model.
    pub(crate) fn std_of(&self, hash: &BlockHash, runs: &ChainRuns) -> Option<u64> {
        self.find(hash, runs).map(|(held, _)| held.std())
    }

    /// Sets the media of `hash`, a block this source holds as `held` ([`Self::find`]).
    pub(crate) fn set_media(&mut self, hash: &BlockHash, mut held: HeldSlot, media: MediaSet) {
        held.set_media(media);
        match key_of(hash) {
            Key::Int(key, _) => self.ints.set_media(&key, held),
            Key::Bytes(b) => self.bytes.set_media(b, held),
        }
    }

    /// Puts `hash` under `model` with its hashes and media, replacing what the source held
    /// under that key (the caller took any block of another identity out first): as a spot
    /// when the block is the base model's and has a `spot` whose run keeps its hashes, else
    /// whole.
    pub(crate) fn put(
        &mut self,
        model: u32,
        hash: &BlockHash,
        (std, chain, spot): (u64, u64, Option<Spot>),
        media: MediaSet,
    ) {
        let base = self.base_model;
        let key = key_of(hash);
        let negative = matches!(key, Key::Int(_, true));
        let (models, hashes, sent) = ((model, base), (std, chain, spot), (negative, media));
        let old_model = match key {
            Key::Int(key, _) => self.ints.put(&key, models, hashes, sent),
            Key::Bytes(b) => self.bytes.put(b, models, hashes, sent),
        };
        if old_model != Some(model) {
            self.count_in(model);
            if let Some(old) = old_model {
                self.count_out(old);
            }
        }
    }

    /// Keeps `hash`, a base-model block with chain hash `chain`, by the spot `place` gives
    /// in the runs (and the std hash it keeps there), on `media`, if the source holds
    /// nothing under its key (either sign); gives `place`'s answer, or `None`, with
    /// nothing called or changed, when it holds the key. One probe of the source's map
    /// where a lookup and then a [`Self::put`] would take two. Inlined into its caller, so
    /// `place` runs in the caller's frame: out of line, its captures went through a 16-byte
    /// copy of two 8-byte stores, which stalled on every new block.
    #[inline(always)]
    pub(crate) fn put_new(
        &mut self,
        hash: &BlockHash,
        chain: u64,
        media: MediaSet,
        place: impl FnOnce() -> (Spot, u64),
    ) -> Option<(Spot, u64)> {
        let base = self.base_model;
        let placed = match key_of(hash) {
            Key::Int(key, negative) => {
                (self.ints).put_new(&key, (negative, media), (chain, base), place)
            }
            Key::Bytes(b) => (self.bytes).put_new(b, (false, media), (chain, base), place),
        }?;
        self.count_in(base);
        Some(placed)
    }

    /// Removes `hash` (of any model, either sign).
    pub(crate) fn remove(&mut self, hash: &BlockHash) {
        let base = self.base_model;
        let old = match key_of(hash) {
            Key::Int(key, _) => self.ints.remove(&key, base),
            Key::Bytes(b) => self.bytes.remove(b, base),
        };
        if let Some(old) = old {
            self.count_out(old);
        }
    }

    /// One more block of `model`: its first takes a reference. Inlined: every store calls it
    /// for the base model, whose count is one field.
    #[inline]
    fn count_in(&mut self, model: u32) {
        let n = if model == self.base_model {
            &mut self.base_blocks
        } else {
            self.models.entry(model).or_insert(0)
        };
        if *n == 0 {
            self.table.retain(model);
        }
        *n += 1;
    }

    /// One block of `model` fewer: its last defers dropping the reference. Inlined: every
    /// remove calls it for the base model, whose count is one field.
    #[inline]
    fn count_out(&mut self, model: u32) {
        if model == self.base_model {
            if self.base_blocks > 0 {
                self.base_blocks -= 1;
                if self.base_blocks == 0 {
                    self.deferred.push(model);
                }
            }
            return;
        }
        let Some(n) = self.models.get_mut(&model) else {
            return;
        };
        *n = n.saturating_sub(1);
        if *n == 0 {
            self.models.remove(&model);
            self.deferred.push(model);
        }
    }

    /// Engine blocks kept as spots in the runs and kept whole, for tests of where slots go.
    #[cfg(test)]
    pub(crate) fn slot_kinds(&self) -> (usize, usize) {
        (
            self.ints.run.len() + self.bytes.run.len(),
            self.ints.whole.len() + self.bytes.whole.len(),
        )
    }

    /// Number of engine blocks held.
    pub(crate) fn len(&self) -> usize {
        self.ints.len() + self.bytes.len()
    }

    /// Number of engine blocks held of `model`.
    pub(crate) fn model_len(&self, model: u32) -> usize {
        if model == self.base_model {
            return self.base_blocks as usize;
        }
        self.models.get(&model).map_or(0, |n| *n as usize)
    }

    /// Every (engine hash, slot), rebuilding the hash exactly as it was sent.
    pub(crate) fn entries<'a>(
        &'a self,
        runs: &'a ChainRuns,
    ) -> impl Iterator<Item = (BlockHash, HeldSlot)> + 'a {
        self.entries_where(runs, |_| true, |_| true)
    }

    /// The entries of one partition of the source (see `walk.rs`): keys are filtered before
    /// slots are resolved and hashes rebuilt, so a walk in pieces copies each entry once
    /// per pass.
    pub(crate) fn partition_entries<'a>(
        &'a self,
        runs: &'a ChainRuns,
        partition: u32,
        partitions: u32,
    ) -> impl Iterator<Item = (BlockHash, HeldSlot)> + 'a {
        self.entries_where(
            runs,
            move |bits| partition_of_bits(bits, partitions) == partition,
            move |bytes| partition_of_bytes(bytes, partitions) == partition,
        )
    }

    /// The entries whose key passes `keep_int` (int hashes, by their 64 bits) or
    /// `keep_bytes` (byte-string hashes).
    fn entries_where<'a>(
        &'a self,
        runs: &'a ChainRuns,
        keep_int: impl Fn(u64) -> bool + Copy + 'a,
        keep_bytes: impl Fn(&[u8]) -> bool + Copy + 'a,
    ) -> impl Iterator<Item = (BlockHash, HeldSlot)> + 'a {
        let base = self.base_model;
        let ints = (self.ints.iter(base, runs, move |key| keep_int(key.0)))
            .map(|(key, held)| (int_hash(key.0, held.negative()), held));
        let bytes = (self.bytes.iter(base, runs, move |key| keep_bytes(key)))
            .map(|(key, held)| (BlockHash::Bytes(key.clone()), held));
        ints.chain(bytes)
    }

    /// Reads every engine block out (before their residents are removed: the runs still
    /// keep their hashes), for a clear to take them off the std layer and hand them to a
    /// mirror; [`Self::clear`] then drops them.
    pub(crate) fn take_blocks(&self, runs: &ChainRuns) -> TakenBlocks {
        TakenBlocks {
            entries: self.entries(runs).collect(),
        }
    }

    /// Drops every engine block (after their residents were removed); the maps give their
    /// memory back, so a source that held a burst does not keep its peak.
    pub(crate) fn clear(&mut self) {
        self.ints = Slots::default();
        self.bytes = Slots::default();
        self.dups = HashMap::new();
        self.runs = HeldRuns::default();
        let models: Vec<u32> = self.models.drain().map(|(m, _)| m).collect();
        self.deferred.extend(models);
        self.models = HashMap::new();
        if std::mem::take(&mut self.base_blocks) > 0 {
            self.deferred.push(self.base_model);
        }
        self.main_group = None;
    }

    /// Gives back map memory after many removes (a quarter full or less).
    fn shrink(&mut self) {
        self.ints.shrink();
        self.bytes.shrink();
        shrink_map(&mut self.models, 16);
    }

    /// Estimated heap bytes of the source's maps.
    pub(crate) fn heap_bytes(&self) -> usize {
        let byte_keys = (self.bytes.run.keys().chain(self.bytes.whole.keys())).map(|k| k.len());
        self.ints.table_bytes()
            + self.bytes.table_bytes()
            + byte_keys.sum::<usize>()
            + table_bytes::<u32, u32>(self.models.capacity())
            + table_bytes::<(u32, u64), [u16; MEDIA_SLOTS]>(self.dups.capacity())
            + self.runs.heap_bytes()
    }
}

/// Gives back a map's memory once it is a quarter full or less (past `floor` slots).
fn shrink_map<K: Eq + std::hash::Hash, V>(map: &mut HashMap<K, V>, floor: usize) {
    if map.capacity() > floor && map.len() * 4 < map.capacity() {
        map.shrink_to(map.len() * 2);
    }
}

impl Drop for SourceState {
    /// Gives back the base model's reference and any still held or deferred.
    fn drop(&mut self) {
        self.clear();
        self.deferred.push(self.base_model);
        self.settle(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::runs::TEST_NODE_BITS;

    #[test]
    fn a_run_slot_keeps_each_part_apart_up_to_the_largest_it_names() {
        let mut palette = Palette::default();
        let gpu = MediaSet::single(crate::medium::Medium::GPU);
        let last_node = (1 << TEST_NODE_BITS) - 1;
        for (node, pos, negative) in [(0, 0, false), (last_node, 255, true), (5, 17, true)] {
            let spot = Spot::from_parts(node, pos);
            let slot = RunSlot::new(spot, negative, gpu, &mut palette).unwrap();
            assert_eq!(slot.spot(), spot);
            assert_eq!(slot.negative(), negative);
            assert_eq!(slot.media(&palette), gpu);
            let other = MediaSet::from_bits(0b110);
            let moved = slot.with_code(palette.code_of(other).unwrap());
            assert_eq!((moved.spot(), moved.negative()), (spot, negative));
            assert_eq!(moved.media(&palette), other);
        }
        let past = Spot::from_parts(last_node + 1, 0);
        assert_eq!(RunSlot::new(past, false, gpu, &mut palette), None);
    }

    #[test]
    fn a_palette_names_eight_sets_and_no_more() {
        let mut palette = Palette::default();
        for bits in 1..=8 {
            assert_eq!(palette.code_of(MediaSet::from_bits(bits)), Some(bits - 1));
        }
        assert_eq!(palette.code_of(MediaSet::from_bits(3)), Some(2), "kept");
        assert_eq!(palette.code_of(MediaSet::from_bits(9)), None);
        assert_eq!(palette.media(7), MediaSet::from_bits(8));
    }
}

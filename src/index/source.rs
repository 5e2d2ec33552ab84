//! Per-source state: one (pod, DP rank) engine's engine-hash map and group bookkeeping.
//!
//! The engine-hash map is also the set of blocks the source holds, so clearing a source or
//! forgetting a pod walks exactly that source's entries, never the whole index.

use hashbrown::HashMap;

use super::walk::{partition_of_bits, partition_of_bytes};
use crate::medium::{MediaSet, MEDIA_SLOTS};
use crate::wire::{BlockHash, Engine};

/// Where one engine block sits: its std hash (63 bits, top bit = "sent as negative") and the
/// media this engine block is resident on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EngineSlot {
    std_lo: u32,
    std_hi: u32,
    media: u32,
}

const NEG_FLAG: u64 = 1 << 63;

impl EngineSlot {
    fn new(std: u64, negative: bool, media: MediaSet) -> EngineSlot {
        let packed = (std & !NEG_FLAG) | if negative { NEG_FLAG } else { 0 };
        EngineSlot {
            std_lo: packed as u32,
            std_hi: (packed >> 32) as u32,
            media: media.bits(),
        }
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

/// Engine hash → slot, for one model (the base model or a LoRA adapter).
#[derive(Default)]
pub(crate) struct ModelMap {
    pub(crate) model: u32,
    ints: HashMap<IntKey, EngineSlot>,
    bytes: HashMap<Box<[u8]>, EngineSlot>,
}

impl ModelMap {
    fn get_mut(&mut self, hash: &BlockHash) -> Option<&mut EngineSlot> {
        match hash {
            BlockHash::Int(v) => self.ints.get_mut(&int_key(*v)).filter(|s| !s.negative()),
            BlockHash::Neg(v) => self
                .ints
                .get_mut(&int_key(*v as u64))
                .filter(|s| s.negative()),
            BlockHash::Bytes(b) => self.bytes.get_mut(&**b),
        }
    }

    fn get(&self, hash: &BlockHash) -> Option<&EngineSlot> {
        match hash {
            BlockHash::Int(v) => self.ints.get(&int_key(*v)).filter(|s| !s.negative()),
            BlockHash::Neg(v) => self.ints.get(&int_key(*v as u64)).filter(|s| s.negative()),
            BlockHash::Bytes(b) => self.bytes.get(&**b),
        }
    }

    fn remove(&mut self, hash: &BlockHash) -> Option<EngineSlot> {
        match hash {
            BlockHash::Int(v) => self.ints.remove(&int_key(*v)),
            BlockHash::Neg(v) => self.ints.remove(&int_key(*v as u64)),
            BlockHash::Bytes(b) => self.bytes.remove(&**b),
        }
    }

    /// Inserts `hash`; returns the slot it displaced. Int keys hold only the 64 bits, so an
    /// unsigned hash and a negative one with the same bits share a key: the caller must
    /// drop the displaced block (returned with its hash as it was sent).
    fn insert(
        &mut self,
        hash: &BlockHash,
        std: u64,
        media: MediaSet,
    ) -> Option<(BlockHash, EngineSlot)> {
        let (bits, negative) = match hash {
            BlockHash::Int(v) => (*v, false),
            BlockHash::Neg(v) => (*v as u64, true),
            BlockHash::Bytes(b) => {
                let old = self
                    .bytes
                    .insert(b.clone(), EngineSlot::new(std, false, media));
                return old.map(|slot| (hash.clone(), slot));
            }
        };
        let old = self
            .ints
            .insert(int_key(bits), EngineSlot::new(std, negative, media))?;
        let twin = if old.negative() {
            BlockHash::Neg(bits as i64)
        } else {
            BlockHash::Int(bits)
        };
        Some((twin, old))
    }

    fn len(&self) -> usize {
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

    /// The entries of one partition of the map (see `walk.rs`): only those hashes are
    /// rebuilt, so a walk in pieces copies each entry once per pass.
    pub(crate) fn partition_entries(
        &self,
        partition: u32,
        partitions: u32,
    ) -> impl Iterator<Item = (BlockHash, EngineSlot)> + '_ {
        let ints = self
            .ints
            .iter()
            .filter(move |(k, _)| partition_of_bits(int_bits(k), partitions) == partition)
            .map(|(k, s)| {
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
            .filter(move |(k, _)| partition_of_bytes(k, partitions) == partition)
            .map(|(k, s)| (BlockHash::Bytes(k.clone()), *s));
        ints.chain(bytes)
    }

    /// Every slot without rebuilding hashes.
    pub(crate) fn slots(&self) -> impl Iterator<Item = EngineSlot> + '_ {
        self.ints.values().chain(self.bytes.values()).copied()
    }

    fn heap_bytes(&self) -> usize {
        table_bytes::<IntKey, EngineSlot>(self.ints.capacity())
            + table_bytes::<Box<[u8]>, EngineSlot>(self.bytes.capacity())
            + self.bytes.keys().map(|k| k.len()).sum::<usize>()
    }
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
    pub(crate) maps: Vec<ModelMap>,
    /// Per-medium counts of engine blocks, only for std blocks this source holds through
    /// more than one engine hash (the same tokens after different prefixes).
    pub(crate) dups: HashMap<(u32, u64), [u16; MEDIA_SLOTS]>,
}

impl SourceState {
    pub(crate) fn new(pod: u32, rank: u8, engine: Engine, base_model: u32) -> SourceState {
        SourceState {
            pod,
            rank,
            engine,
            base_model,
            main_group: None,
            maps: Vec::new(),
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

    /// The model map of `model`, created on first use.
    fn map_mut(&mut self, model: u32) -> &mut ModelMap {
        let pos = match self.maps.iter().position(|m| m.model == model) {
            Some(pos) => pos,
            None => {
                self.maps.push(ModelMap {
                    model,
                    ..ModelMap::default()
                });
                self.maps.len() - 1
            }
        };
        &mut self.maps[pos]
    }

    /// The slot of `hash` in any model map, preferring `model`'s.
    pub(crate) fn find_mut(
        &mut self,
        hash: &BlockHash,
        model: u32,
    ) -> Option<(u32, &mut EngineSlot)> {
        let order = self.maps.iter().position(|m| m.model == model);
        let idx = order
            .into_iter()
            .chain(0..self.maps.len())
            .find(|&i| self.maps[i].get_mut(hash).is_some())?;
        let map = &mut self.maps[idx];
        let model = map.model;
        map.get_mut(hash).map(|slot| (model, slot))
    }

    /// Inserts `hash` into `model`'s map; returns the slot it displaced (see
    /// [`ModelMap::insert`]).
    pub(crate) fn insert(
        &mut self,
        model: u32,
        hash: &BlockHash,
        std: u64,
        media: MediaSet,
    ) -> Option<(BlockHash, EngineSlot)> {
        self.map_mut(model).insert(hash, std, media)
    }

    pub(crate) fn remove(&mut self, model: u32, hash: &BlockHash) {
        if let Some(map) = self.maps.iter_mut().find(|m| m.model == model) {
            map.remove(hash);
        }
    }

    /// The std hash this source maps `hash` to, in any model map.
    pub(crate) fn std_of(&self, hash: &BlockHash) -> Option<u64> {
        self.maps
            .iter()
            .find_map(|m| m.get(hash))
            .map(EngineSlot::std)
    }

    /// Number of engine blocks held.
    pub(crate) fn len(&self) -> usize {
        self.maps.iter().map(ModelMap::len).sum()
    }

    /// Drops every engine block (after their residents were removed).
    pub(crate) fn clear(&mut self) {
        self.maps.clear();
        self.dups.clear();
        self.main_group = None;
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.maps.iter().map(ModelMap::heap_bytes).sum::<usize>()
            + table_bytes::<(u32, u64), [u16; MEDIA_SLOTS]>(self.dups.capacity())
    }
}

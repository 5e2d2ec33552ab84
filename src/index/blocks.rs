//! The std layer's block maps: a base model's own map, or a LoRA adapter's share of the
//! adapters' map ([`Blocks`]), and the guards that read or write one block's residents
//! whichever map holds it. Above the residents, below the model table that owns the maps.

use std::sync::Arc;

use dashmap::DashMap;

use super::residents::Residents;

/// One base model's std blocks, keyed by std hash.
pub(crate) type ModelBlocks = DashMap<u64, Residents, hashbrown::DefaultHashBuilder>;

/// The std blocks of every LoRA adapter, keyed by (model, std hash): one map for all of
/// them, so an adapter costs no block map of its own (a map per adapter made ingest with
/// many adapter names slower per block and each adapter heavier).
/// An adapter's entries leave with its last resident, before the adapter is freed, and ids
/// are never reused, so no entry outlives its model.
pub(crate) type LoraBlocks = DashMap<(u32, u64), Residents, hashbrown::DefaultHashBuilder>;

/// One model's std blocks: a base model's own map, or its share of the adapters' map.
#[derive(Clone)]
pub(crate) enum Blocks {
    /// A base model's own map, keyed by std hash.
    Own(Arc<ModelBlocks>),
    /// A LoRA adapter's entries in the shared map.
    Lora(Arc<LoraBlocks>, u32),
}

/// A read guard on one block's residents, whichever map holds it.
pub(crate) enum BlockRef<'a> {
    Own(dashmap::mapref::one::Ref<'a, u64, Residents>),
    Lora(dashmap::mapref::one::Ref<'a, (u32, u64), Residents>),
}

impl std::ops::Deref for BlockRef<'_> {
    type Target = Residents;
    #[inline]
    fn deref(&self) -> &Residents {
        match self {
            BlockRef::Own(r) => r.value(),
            BlockRef::Lora(r) => r.value(),
        }
    }
}

/// A write guard on one block's residents, whichever map holds it.
pub(crate) enum BlockRefMut<'a> {
    Own(dashmap::mapref::one::RefMut<'a, u64, Residents>),
    Lora(dashmap::mapref::one::RefMut<'a, (u32, u64), Residents>),
}

impl std::ops::Deref for BlockRefMut<'_> {
    type Target = Residents;
    #[inline]
    fn deref(&self) -> &Residents {
        match self {
            BlockRefMut::Own(r) => r.value(),
            BlockRefMut::Lora(r) => r.value(),
        }
    }
}

impl std::ops::DerefMut for BlockRefMut<'_> {
    #[inline]
    fn deref_mut(&mut self) -> &mut Residents {
        match self {
            BlockRefMut::Own(r) => r.value_mut(),
            BlockRefMut::Lora(r) => r.value_mut(),
        }
    }
}

impl Blocks {
    /// The residents of block `std`.
    #[inline]
    pub(crate) fn get(&self, std: &u64) -> Option<BlockRef<'_>> {
        match self {
            Blocks::Own(map) => map.get(std).map(BlockRef::Own),
            Blocks::Lora(map, model) => map.get(&(*model, *std)).map(BlockRef::Lora),
        }
    }

    /// The residents of block `std`, for writing.
    #[inline]
    pub(crate) fn get_mut(&self, std: &u64) -> Option<BlockRefMut<'_>> {
        match self {
            Blocks::Own(map) => map.get_mut(std).map(BlockRefMut::Own),
            Blocks::Lora(map, model) => map.get_mut(&(*model, *std)).map(BlockRefMut::Lora),
        }
    }
}

//! What the index tells its mirrors: one delta per changed Redis field or mapping key.

use super::source::{HeldSlot, TakenBlocks};
use super::vocab::{FieldValue, ModelId, PodId, SourceId};
use crate::medium::MediaSet;
use crate::wire::{BlockHash, Engine};

/// One source's state of one engine block: what a warm start rebuilds the index from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineState {
    /// Standardized hash the engine block maps to.
    pub std_hash: u64,
    /// Media this engine block is resident on.
    pub media: MediaSet,
    /// Unix second of the source's last store of the block.
    pub stored_at: u32,
    /// The block's chain hash (`prefix` matching); 0 when it has none (its parent was not
    /// held when it was stored, or it was restored from a checkpoint that kept none).
    pub chain: u64,
    /// The chain hash of the block's parent: 0 for a chain start, a block without a chain,
    /// or where it is not known. A warm start places the block right after it, so chains
    /// are runs again ([`crate::index::Index::restore_blocks`]).
    pub parent: u64,
}

/// How far a source's effects have been handed to a mirror: every delta of seqs up to `seq`
/// was queued before (or with) this checkpoint, so a mirror that writes it after those
/// deltas never records a watermark ahead of its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checkpoint {
    /// The source.
    pub source: SourceId,
    /// The last seq applied.
    pub seq: u64,
}

/// One change to the mirrored state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delta {
    /// Field `pod` of block key `(model, std_hash)` is now `value`, or gone when `None`.
    Field {
        /// Model (interned).
        model: ModelId,
        /// Standardized block hash.
        std_hash: u64,
        /// Pod (interned `{pod}.{namespace}`).
        pod: PodId,
        /// New value, `None` = delete the field.
        value: Option<FieldValue>,
    },
    /// The engine-hash mapping key of `pod` now maps to `std_hash`, or is gone when `None`.
    /// A `Some` is sent on every store so the key's TTL is refreshed.
    Mapping {
        /// Pod (interned).
        pod: PodId,
        /// Engine family (decides the key prefix).
        engine: Engine,
        /// Engine hash as sent.
        engine_hash: BlockHash,
        /// Standardized hash, `None` = delete the key.
        std_hash: Option<u64>,
    },
    /// Source `(pod, rank)`'s state of one engine block (kvindex's own checkpoint, not
    /// kthena's layout), or gone when `None`.
    Engine {
        /// Pod (interned).
        pod: PodId,
        /// DP rank.
        rank: u8,
        /// Model the block belongs to (base model or LoRA adapter).
        model: ModelId,
        /// Engine hash as sent.
        engine_hash: BlockHash,
        /// New state, `None` = the source no longer holds the engine block.
        state: Option<EngineState>,
    },
    /// Source `(pod, rank)` was unregistered: its checkpoint goes.
    SourceGone {
        /// Pod (interned).
        pod: PodId,
        /// DP rank.
        rank: u8,
    },
    /// A remove of an engine hash this source does not hold (state another writer or an
    /// earlier process left): a Redis mirror resolves it through the mapping key in Redis.
    /// Sent only to sinks that want mappings.
    UnknownRemove {
        /// Pod (interned).
        pod: PodId,
        /// Engine family (decides the mapping-key prefix).
        engine: Engine,
        /// The source's base model (the block key's model).
        model: ModelId,
        /// Engine hash as sent.
        engine_hash: BlockHash,
    },
}

/// The engine blocks a source held when it was cleared, handed over whole instead of as
/// three deltas per block: a clear of a large cache would otherwise build a delta list as
/// large as the cache at once. The blocks are the source's own maps, which the
/// clear would have freed; [`ClearedBlocks::into_deltas`] walks them lazily, so a mirror
/// expands them slice by slice and never holds more than a slice of deltas.
///
/// The deltas are those of the clear, per engine block: the field of its std block
/// (`value: None`: the field's value after the clear is the index's to tell, another DP rank
/// of the pod may still hold the block, so a sink that takes clears whole must read field
/// values from the index when it writes, as the Redis mirror does), its checkpoint entry gone
/// and its mapping key gone. Only sinks that ask for them get them
/// ([`DeltaSink::takes_cleared`]); others get the clear's deltas one by one as before.
pub struct ClearedBlocks {
    pod: PodId,
    rank: u8,
    engine: Engine,
    blocks: TakenBlocks,
}

impl std::fmt::Debug for ClearedBlocks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClearedBlocks")
            .field("pod", &self.pod)
            .field("rank", &self.rank)
            .field("blocks", &self.blocks.len())
            .finish()
    }
}

impl ClearedBlocks {
    pub(super) fn new(pod: PodId, rank: u8, engine: Engine, blocks: TakenBlocks) -> Self {
        ClearedBlocks {
            pod,
            rank,
            engine,
            blocks,
        }
    }

    /// Engine blocks the source held.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether the source held no engine block.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The clear's deltas, built one at a time (three per engine block).
    pub fn into_deltas(self) -> ClearedDeltas {
        ClearedDeltas {
            pod: self.pod,
            rank: self.rank,
            engine: self.engine,
            entries: Box::new(self.blocks.into_entries()),
            queued: Vec::with_capacity(2),
        }
    }
}

/// The deltas of a [`ClearedBlocks`], built as they are read.
pub struct ClearedDeltas {
    pod: PodId,
    rank: u8,
    engine: Engine,
    entries: Box<dyn Iterator<Item = (BlockHash, HeldSlot)> + Send>,
    /// The rest of the current block's deltas, last first.
    queued: Vec<Delta>,
}

impl Iterator for ClearedDeltas {
    type Item = Delta;

    fn next(&mut self) -> Option<Delta> {
        if let Some(delta) = self.queued.pop() {
            return Some(delta);
        }
        let (engine_hash, held) = self.entries.next()?;
        let (pod, model) = (self.pod, ModelId(held.model()));
        self.queued.push(Delta::Mapping {
            pod,
            engine: self.engine,
            engine_hash: engine_hash.clone(),
            std_hash: None,
        });
        self.queued.push(Delta::Engine {
            pod,
            rank: self.rank,
            model,
            engine_hash,
            state: None,
        });
        Some(Delta::Field {
            model,
            std_hash: held.std(),
            pod,
            value: None,
        })
    }
}

/// A piece of what one message did, on its way to a mirror: some deltas, or a clear's
/// blocks handed over whole.
#[derive(Debug)]
pub enum DeltaChunk {
    /// Deltas in order.
    Deltas(Vec<Delta>),
    /// A cleared source's blocks ([`ClearedBlocks`]; boxed: four maps' headers).
    Cleared(Box<ClearedBlocks>),
}

impl DeltaChunk {
    /// The chunk's deltas in order (a clear's built as they are read).
    pub fn into_deltas(self) -> Box<dyn Iterator<Item = Delta> + Send> {
        match self {
            DeltaChunk::Deltas(deltas) => Box::new(deltas.into_iter()),
            DeltaChunk::Cleared(cleared) => Box::new((*cleared).into_deltas()),
        }
    }

    /// Deltas in the chunk, or engine blocks of a clear (each of which makes three).
    pub fn len(&self) -> usize {
        match self {
            DeltaChunk::Deltas(deltas) => deltas.len(),
            DeltaChunk::Cleared(cleared) => cleared.len(),
        }
    }

    /// Whether the chunk holds nothing to write.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Receives the deltas of one `apply` call, in order.
///
/// A sink is called while the index holds the source's lock and, for most deltas, the chain
/// runs' write lock, so it must not call back into the index: it buffers, and the caller
/// reads the index once `apply` returned (as the Redis mirror does).
pub trait DeltaSink {
    /// Whether mapping-key deltas are wanted (building them clones engine hashes).
    fn wants_mappings(&self) -> bool {
        true
    }
    /// Takes one delta.
    fn push(&mut self, delta: Delta);
    /// Whether a clear's blocks are taken whole ([`ClearedBlocks`], whose field deltas carry
    /// no value) rather than as deltas one by one.
    fn takes_cleared(&self) -> bool {
        false
    }
    /// Takes a clear's blocks whole (only called when [`Self::takes_cleared`]).
    fn push_cleared(&mut self, cleared: ClearedBlocks) {
        for delta in cleared.into_deltas() {
            self.push(delta);
        }
    }
}

impl DeltaSink for Vec<Delta> {
    fn push(&mut self, delta: Delta) {
        Vec::push(self, delta);
    }
}

/// Where ingest hands the deltas of each message, asynchronously (the Redis mirror in the
/// daemon): ingest holds this trait, not a concrete store, so it never depends on `store`.
pub trait DeltaMirror: Send + Sync {
    /// Queues one chunk of a message's deltas and, with its last chunk, the source's
    /// checkpoint that covers them; may wait while the mirror is behind (backpressure).
    fn queue(
        &self,
        chunk: DeltaChunk,
        checkpoint: Option<Checkpoint>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>>;
}

/// A sink that drops everything: the embedded, index-only mode.
#[derive(Debug, Default, Clone, Copy)]
pub struct Discard;

impl DeltaSink for Discard {
    fn wants_mappings(&self) -> bool {
        false
    }
    fn push(&mut self, _delta: Delta) {}
}

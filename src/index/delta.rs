//! What the index tells its mirrors: one delta per changed Redis field or mapping key.

use super::{ModelId, PodId, SourceId};
use crate::medium::MediaSet;
use crate::wire::{BlockHash, Engine};

/// The pod-level residency of one block: what a Redis field's value is computed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldValue {
    /// Unix second of the last store (max over the pod's DP ranks).
    pub stored_at: u32,
    /// Every medium the pod holds the block on ([`crate::medium::Medium::NONE`] = unknown).
    pub media: MediaSet,
}

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

/// Receives the deltas of one `apply` call, in order.
pub trait DeltaSink {
    /// Whether mapping-key deltas are wanted (building them clones engine hashes).
    fn wants_mappings(&self) -> bool {
        true
    }
    /// Takes one delta.
    fn push(&mut self, delta: Delta);
}

impl DeltaSink for Vec<Delta> {
    fn push(&mut self, delta: Delta) {
        Vec::push(self, delta);
    }
}

/// Where ingest hands the deltas of each message, asynchronously (the Redis mirror in the
/// daemon): ingest holds this trait, not a concrete store, so it never depends on `store`.
pub trait DeltaMirror: Send + Sync {
    /// Queues one message's deltas and, when given, the source's checkpoint that covers
    /// them; may wait while the mirror is behind (backpressure).
    fn queue(
        &self,
        deltas: Vec<Delta>,
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

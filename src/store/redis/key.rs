//! The coalescing key of one flush: which Redis field or key a delta writes.

use std::hash::BuildHasher;

use crate::index::{Delta, ModelId, PodId};
use crate::wire::{BlockHash, Engine};

/// Which Redis field or key a [`Delta`] writes: the coalescing key of one flush and the
/// record of writes that may not have landed. The wanted state is the [`Delta`] itself, so a
/// key kind and a state kind can never be paired wrongly.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(in crate::store::redis) enum Key {
    /// Field `pod` of block key `(model, std)`.
    Field {
        /// Model.
        model: ModelId,
        /// Standardized hash.
        std: u64,
        /// Pod.
        pod: PodId,
    },
    /// Mapping key of `pod`'s engine hash.
    Mapping {
        /// Pod.
        pod: PodId,
        /// Engine (key prefix).
        engine: Engine,
        /// Engine hash.
        hash: BlockHash,
    },
    /// Checkpoint entry of one engine block of source `(pod, rank)`.
    Engine {
        /// Pod.
        pod: PodId,
        /// DP rank.
        rank: u8,
        /// Model.
        model: ModelId,
        /// Engine hash.
        hash: BlockHash,
    },
    /// The checkpoint of source `(pod, rank)` as a whole (written only to delete it).
    Source {
        /// Pod.
        pod: PodId,
        /// DP rank.
        rank: u8,
    },
}

impl Key {
    /// The key `delta` writes.
    pub(in crate::store::redis) fn of(delta: &Delta) -> Key {
        match delta {
            Delta::Field {
                model,
                std_hash,
                pod,
                ..
            } => Key::Field {
                model: *model,
                std: *std_hash,
                pod: *pod,
            },
            Delta::Mapping {
                pod,
                engine,
                engine_hash,
                ..
            }
            | Delta::UnknownRemove {
                pod,
                engine,
                engine_hash,
                ..
            } => Key::Mapping {
                pod: *pod,
                engine: *engine,
                hash: engine_hash.clone(),
            },
            Delta::Engine {
                pod,
                rank,
                model,
                engine_hash,
                ..
            } => Key::Engine {
                pod: *pod,
                rank: *rank,
                model: *model,
                hash: engine_hash.clone(),
            },
            Delta::SourceGone { pod, rank } => Key::Source {
                pod: *pod,
                rank: *rank,
            },
        }
    }

    /// The lane (of `lanes`) that carries every write of this key: the checkpoint entries of
    /// one state key share a lane, as they are written by one command per flush, and the
    /// watermark hash is always on lane 0.
    pub(in crate::store::redis) fn lane(&self, lanes: usize, hasher: &impl BuildHasher) -> usize {
        let hash = match self {
            Key::Source { .. } => return 0,
            Key::Engine {
                pod, rank, model, ..
            } => hasher.hash_one((pod, rank, model)),
            Key::Field { .. } | Key::Mapping { .. } => hasher.hash_one(self),
        };
        (hash % lanes.max(1) as u64) as usize
    }

    /// The write that deletes this key (HDEL of the field, DEL of the mapping key).
    pub(in crate::store::redis) fn deletion(self) -> Delta {
        match self {
            Key::Field { model, std, pod } => Delta::Field {
                model,
                std_hash: std,
                pod,
                value: None,
            },
            Key::Mapping { pod, engine, hash } => Delta::Mapping {
                pod,
                engine,
                engine_hash: hash,
                std_hash: None,
            },
            Key::Engine {
                pod,
                rank,
                model,
                hash,
            } => Delta::Engine {
                pod,
                rank,
                model,
                engine_hash: hash,
                state: None,
            },
            Key::Source { pod, rank } => Delta::SourceGone { pod, rank },
        }
    }
}

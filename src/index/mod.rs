//! The in-memory residency index: which pod holds which block on which tier.
//!
//! | file | job |
//! | --- | --- |
//! | `mod.rs` | [`Index`] and its ids: register sources, the shared tables |
//! | `apply.rs` | the mutation engine: apply batches, clear and forget sources, [`ApplyStats`] |
//! | `query.rs` | the read side: owners of a block, walks, [`Index::dump`], [`IndexStats`] |
//! | `counters.rs` | O(1) resident-entry counts, whole index and per pod, kept as fields change |
//! | `source.rs` | per (pod, DP rank) engine-hash map, the set of blocks a source holds |
//! | `residents.rs` | compact per-block list of resident sources |
//! | `delta.rs` | [`Delta`]s for mirrors, [`DeltaSink`] |
//! | `walk.rs` | chunked walks, point lookups and refreshes for the mirror's background passes |
//! | `intern.rs` | pod and model name interning |
//!
//! Concurrency: blocks live in one concurrent map per model (sharded locks, readers never
//! wait for a whole-index lock); each source's state sits behind its own mutex, which only
//! that source's ingest task takes on the hot path.

mod apply;
mod counters;
mod delta;
mod intern;
mod query;
mod residents;
mod source;
mod walk;

use std::sync::Arc;

use dashmap::DashMap;
use parking_lot::{Mutex, RwLock};

pub use apply::ApplyStats;
pub use delta::{Delta, DeltaMirror, DeltaSink, Discard, FieldValue};
pub use query::{DumpEntry, IndexStats};
pub use walk::{OwnedPods, WalkCursor, WalkEntry};

use crate::wire::Engine;
use counters::{EntryCounter, PodCounters};
use intern::Interner;
use residents::{Residents, MAX_POD_ID};
use source::SourceState;

/// An interned pod identifier (`{pod}.{namespace}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodId(pub u32);

/// An interned model name (a base model or a LoRA adapter's served name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelId(pub u32);

/// One registered event source: a (pod, DP rank) engine publisher.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceId(pub u32);

/// Describes a source when it is registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceSpec {
    /// Pod identifier as written to Redis: `{pod}.{namespace}`.
    pub pod: String,
    /// Served model name of the pod.
    pub model: String,
    /// Engine family.
    pub engine: Engine,
    /// DP rank (0 … 255).
    pub dp_rank: u8,
}

/// Why a source could not be registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IndexError {
    /// More pods than a resident can name.
    #[error("too many pods: the index holds at most {max} pod identifiers")]
    TooManyPods {
        /// The limit.
        max: u32,
    },
    /// The source id is not registered.
    #[error("source {0} is not registered")]
    UnknownSource(u32),
}

type ModelBlocks = DashMap<u64, Residents, hashbrown::DefaultHashBuilder>;

/// The residency index. Cheap to clone (shared state).
#[derive(Clone, Default)]
pub struct Index {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    models: Interner,
    pods: Interner,
    blocks: RwLock<Vec<Arc<ModelBlocks>>>,
    sources: RwLock<Vec<Option<Arc<Mutex<SourceState>>>>>,
    /// Resident (block, pod) entries, kept as fields change so metrics need no index walk.
    entries: EntryCounter,
    /// The same per pod, so `GET /v1/pods` needs no walk either.
    pod_entries: PodCounters,
}

impl Index {
    /// An empty index.
    pub fn new() -> Index {
        Index::default()
    }

    /// Registers a source, or returns the id it already has.
    ///
    /// # Errors
    /// [`IndexError::TooManyPods`] past 2^24 pod identifiers.
    pub fn register_source(&self, spec: &SourceSpec) -> Result<SourceId, IndexError> {
        let pod = self.inner.pods.intern(&spec.pod);
        if pod > MAX_POD_ID {
            return Err(IndexError::TooManyPods { max: MAX_POD_ID });
        }
        let model = self.intern_model(&spec.model);
        self.inner.pod_entries.of(pod);
        let mut sources = self.inner.sources.write();
        for (id, slot) in sources.iter().enumerate() {
            if let Some(state) = slot {
                let s = state.lock();
                if s.pod == pod && s.rank == spec.dp_rank {
                    return Ok(SourceId(id as u32));
                }
            }
        }
        let state = SourceState::new(pod, spec.dp_rank, spec.engine, model.0);
        sources.push(Some(Arc::new(Mutex::new(state))));
        Ok(SourceId(sources.len() as u32 - 1))
    }

    /// Sources registered for `pod` (identifier `{pod}.{namespace}`).
    pub fn sources_of_pod(&self, pod: &str) -> Vec<SourceId> {
        let Some(pod) = self.inner.pods.get(pod) else {
            return Vec::new();
        };
        self.inner
            .sources
            .read()
            .iter()
            .enumerate()
            .filter_map(|(id, s)| {
                s.as_ref()
                    .filter(|s| s.lock().pod == pod)
                    .map(|_| SourceId(id as u32))
            })
            .collect()
    }

    fn source(&self, id: SourceId) -> Result<Arc<Mutex<SourceState>>, IndexError> {
        self.inner
            .sources
            .read()
            .get(id.0 as usize)
            .and_then(Clone::clone)
            .ok_or(IndexError::UnknownSource(id.0))
    }

    fn intern_model(&self, name: &str) -> ModelId {
        let id = self.inner.models.intern(name);
        let missing = self.inner.blocks.read().len() <= id as usize;
        if missing {
            let mut blocks = self.inner.blocks.write();
            while blocks.len() <= id as usize {
                blocks.push(Arc::new(ModelBlocks::default()));
            }
        }
        ModelId(id)
    }

    fn blocks_of(&self, model: u32) -> Option<Arc<ModelBlocks>> {
        self.inner.blocks.read().get(model as usize).cloned()
    }
}

#[cfg(test)]
mod tests;

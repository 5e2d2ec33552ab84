//! The in-memory residency index: which pod holds which block on which tier.
//!
//! Files, bottom up: each imports only files listed before it (`mod.rs` re-exports the
//! public names of all of them, and [`Index`] is extended by the files after it).
//!
//! | file | job |
//! | --- | --- |
//! | `vocab.rs` | shared vocabulary: [`PodId`], [`ModelId`], [`SourceId`], [`FieldValue`], [`Visit`], table sizing, engine-hash partitions |
//! | `residents.rs` | compact per-block list of resident sources, owner keys, a pod's value of a block |
//! | `counters.rs` | O(1) resident-entry counts, whole index and per pod, kept as fields change |
//! | `layer.rs` | one residency layer's edits (std blocks, chain blocks), shared by both |
//! | `blocks.rs` | the std layer's block maps (a base model's own, the LoRA adapters' shared one) |
//! | `runs/` | the chain blocks, kept in runs with residents as spans of positions (spot, node, locator, edits, reads; its invariants are in its module docs) |
//! | `intern.rs` | pod name interning; model names and block maps, freed when unreferenced |
//! | `source.rs` | per (pod, DP rank) engine-hash map, the set of blocks a source holds |
//! | `delta.rs` | [`Delta`]s for mirrors, [`DeltaSink`] |
//! | `speculative.rs` | [`Speculative`]: chain blocks a router placed on a pod, until its engine confirms them or a TTL |
//! | `mod.rs` | [`Index`] and its options: register sources, the shared tables |
//! | `apply/` | the mutation engine: apply batches, clear and forget sources (`lifecycle.rs`), warm-start restores (`restore.rs`), [`ApplyStats`] |
//! | `query.rs` | the read side: owners of a block ([`LayerReader`]), walks, [`Index::dump`], [`IndexStats`], entry counts |
//! | `walk.rs` | chunked walks, point lookups and refreshes for the mirror's background passes |
//!
//! See `docs/architecture.md`, section 5, for the structure and its invariants.
//!
//! Two residency layers, one index: kthena's **std blocks** (per model, keyed by the
//! content-only std hash: what the Redis mirror writes and `kthena` matching reads) and the
//! **chain blocks** of `prefix` matching (every model's, identified by the chain hash of the
//! block's whole prefix, so a pod matches block i only if it holds that exact prefix; kept
//! in runs with residents as spans, see `runs/`).
//! A block whose parent the source does not know has no chain hash and is in the std layer
//! only (it can never be a false hit).
//!
//! The std layer is optional ([`IndexOptions::std_layer`]): a `prefix`-only index computes no
//! SHA-256 and keeps no std map; its entry counts then come from the chain layer.
//!
//! Concurrency: std blocks live in one concurrent map per model (sharded locks); the chain
//! runs sit behind one read-write lock, taken by a writer for one event at most and by a
//! query once; each source's state sits behind its own mutex, which only that source's ingest
//! task takes on the hot path.

mod apply;
mod blocks;
mod counters;
mod delta;
mod intern;
mod layer;
mod query;
mod residents;
mod runs;
mod source;
mod speculative;
mod vocab;
mod walk;

use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

pub use apply::ApplyStats;
pub use delta::{
    Checkpoint, ClearedBlocks, ClearedDeltas, Delta, DeltaChunk, DeltaMirror, DeltaSink, Discard,
    EngineState,
};
pub use intern::{DEFAULT_FREED_MODEL_NAMES, DEFAULT_MAX_MODELS_PER_SOURCE};
pub use query::{DumpEntry, IndexStats, LayerReader};
pub use speculative::{
    Speculative, SpeculativeOptions, SpeculativeStats, DEFAULT_SPECULATIVE_MAX_ENTRIES,
    DEFAULT_SPECULATIVE_TTL,
};
pub use vocab::{FieldValue, ModelId, PodId, SourceId, Visit};
pub use walk::{OwnedPods, WalkCursor, WalkEntry};

use crate::wire::Engine;
use blocks::Blocks;
use counters::{EntryCounter, PodCounters};
use intern::{Interner, ModelTable};
use residents::MAX_POD_ID;
use runs::ChainRuns;
use source::SourceState;

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
    /// Every model id was handed out (ids are never reused).
    #[error("model ids are exhausted")]
    TooManyModels,
}

/// The residency index. Cheap to clone (shared state).
#[derive(Clone, Default)]
pub struct Index {
    inner: Arc<Inner>,
}

struct Inner {
    /// Model names and their block maps (one concurrent map per live model).
    models: Arc<ModelTable>,
    pods: Interner,
    sources: RwLock<Vec<Option<Arc<Mutex<SourceState>>>>>,
    /// Registered sources per pod id, so pod-level questions (does any DP rank of the pod
    /// still hold an engine hash?) never walk every source. Locked before the chain runs
    /// where both are (a change tells the runs the pod's number of ranks); never while the
    /// runs are locked.
    pod_sources: RwLock<hashbrown::HashMap<u32, Vec<SourceId>>>,
    /// Chain blocks of every model, in runs (`prefix` matching): one lock, since an edit
    /// may touch a run other sources share; a query takes it once for all its blocks.
    chains: RwLock<ChainRuns>,
    /// Resident (block, pod) entries counted by unregistered sources; the live sources keep
    /// their own counts, so metrics need no walk of the blocks ([`counters`]).
    entries: EntryCounter,
    /// The same per pod, for `GET /v1/pods`.
    pod_entries: PodCounters,
    /// Whether kthena's std layer is kept (see [`IndexOptions::std_layer`]).
    std_layer: bool,
    /// Placements routers reported, beside the index's own structures.
    speculative: Speculative,
}

impl Default for Inner {
    fn default() -> Inner {
        Inner::with_options(IndexOptions::default())
    }
}

impl Inner {
    fn with_options(options: IndexOptions) -> Inner {
        Inner {
            models: Arc::new(ModelTable::new(
                options.max_models_per_source,
                options.freed_model_names,
            )),
            pods: Interner::default(),
            sources: RwLock::default(),
            pod_sources: RwLock::default(),
            chains: RwLock::default(),
            entries: EntryCounter::default(),
            pod_entries: PodCounters::default(),
            std_layer: options.std_layer,
            speculative: Speculative::new(options.speculative),
        }
    }
}

/// How an index is built ([`Index::with_options`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexOptions {
    /// Distinct models (base model and LoRA adapters) one source may hold; stores of one
    /// more are dropped and counted ([`ApplyStats::too_many_models`]).
    pub max_models_per_source: usize,
    /// Whether to keep kthena's std layer: the content-only SHA-256 std hash of every block
    /// and its residents, which the Redis mirror, checkpoints, `dump` and `kthena` matching
    /// read. Without it the index is `prefix`-only: no SHA-256 is computed and no std map is
    /// kept (stores are about twice as fast and entries smaller), entry counts come from the
    /// chain blocks, and `kthena` queries find nothing (the API refuses them).
    pub std_layer: bool,
    /// How many freed models' names stay resolvable by id ([`Index::model_name`]): a delta
    /// consumer such as the Redis mirror resolves a delta's model a little after the index
    /// made it, possibly after the model's last block left. 0 when nothing consumes deltas
    /// (an in-memory index), so LoRA names that come and go leave nothing behind.
    pub freed_model_names: usize,
    /// How long routers' placements count as speculative residents, and how many may.
    pub speculative: SpeculativeOptions,
}

impl Default for IndexOptions {
    fn default() -> IndexOptions {
        IndexOptions {
            max_models_per_source: DEFAULT_MAX_MODELS_PER_SOURCE,
            std_layer: true,
            freed_model_names: DEFAULT_FREED_MODEL_NAMES,
            speculative: SpeculativeOptions::default(),
        }
    }
}

impl Index {
    /// An empty index.
    pub fn new() -> Index {
        Index::default()
    }

    /// An empty index whose sources may each hold at most `max` distinct models (base model
    /// and LoRA adapters); stores of one more are dropped and counted
    /// ([`ApplyStats::too_many_models`]). Default [`DEFAULT_MAX_MODELS_PER_SOURCE`].
    pub fn with_max_models_per_source(max: usize) -> Index {
        Index::with_options(IndexOptions {
            max_models_per_source: max,
            ..IndexOptions::default()
        })
    }

    /// An empty index built with `options`.
    pub fn with_options(options: IndexOptions) -> Index {
        Index {
            inner: Arc::new(Inner::with_options(options)),
        }
    }

    /// Whether the index keeps kthena's std layer ([`IndexOptions::std_layer`]).
    pub fn has_std_layer(&self) -> bool {
        self.inner.std_layer
    }

    /// Routers' placements not confirmed yet ([`Speculative`]): `prefix` scoring counts
    /// them; the index's own answers, its counts and its mirror never do.
    pub fn speculative(&self) -> &Speculative {
        &self.inner.speculative
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
        let model = (self.inner.models)
            .acquire(&spec.model)
            .ok_or(IndexError::TooManyModels)?;
        self.inner.pod_entries.of(pod);
        let mut sources = self.inner.sources.write();
        for (id, slot) in sources.iter().enumerate() {
            if let Some(state) = slot {
                let s = state.lock();
                if s.pod == pod && s.rank == spec.dp_rank {
                    self.inner.models.release(model);
                    return Ok(SourceId(id as u32));
                }
            }
        }
        let models = self.inner.models.clone();
        let mut state = SourceState::new(pod, spec.dp_rank, spec.engine, model, models);
        state.base_seed = crate::hash::model_seed(&spec.model);
        sources.push(Some(Arc::new(Mutex::new(state))));
        let id = SourceId(sources.len() as u32 - 1);
        drop(sources);
        let mut pods = self.inner.pod_sources.write();
        let ids = pods.entry(pod).or_default();
        ids.push(id);
        // Under the pod list's lock, so the runs learn the counts in the order they change.
        self.inner.chains.write().note_ranks(pod, ids.len());
        Ok(id)
    }

    /// What `source` was registered with, or `None` when it is not registered.
    pub fn source_spec(&self, source: SourceId) -> Option<SourceSpec> {
        let state = self.source(source).ok()?;
        let state = state.lock();
        Some(SourceSpec {
            pod: self.inner.pods.name(state.pod).to_string(),
            model: self.inner.models.name(state.base_model).to_string(),
            engine: state.engine,
            dp_rank: state.rank,
        })
    }

    /// Records the seq a restored source resumes after (its checkpoint's watermark).
    ///
    /// # Errors
    /// [`IndexError::UnknownSource`] when `source` is not registered.
    pub fn set_resume_seq(&self, source: SourceId, seq: u64) -> Result<(), IndexError> {
        self.source(source)?.lock().resume_seq = Some(seq);
        Ok(())
    }

    /// Takes the seq a restored source resumes after, if it was restored and not yet taken.
    pub fn take_resume_seq(&self, source: SourceId) -> Option<u64> {
        self.source(source).ok()?.lock().resume_seq.take()
    }

    /// Records which engine run (e.g. a pod UID and its container restarts) the source's
    /// blocks come from, so a warm start can tell a restarted engine by its identity.
    ///
    /// # Errors
    /// [`IndexError::UnknownSource`] when `source` is not registered.
    pub fn set_source_run(&self, source: SourceId, run: Option<String>) -> Result<(), IndexError> {
        self.source(source)?.lock().run = run;
        Ok(())
    }

    /// The engine run recorded for `source`, if any.
    pub fn source_run(&self, source: SourceId) -> Option<String> {
        self.source(source).ok()?.lock().run.clone()
    }

    /// The std hash `engine_hash` maps to in any DP rank of `pod`, or `None` when no rank
    /// of the pod holds it: a pod-level mapping key may only go when this is `None`.
    pub fn pod_engine_std(&self, pod: PodId, engine_hash: &crate::wire::BlockHash) -> Option<u64> {
        let ids = self.inner.pod_sources.read().get(&pod.0).cloned()?;
        ids.into_iter()
            .find_map(|id| self.source_std(&*self.source(id).ok()?, engine_hash))
    }

    /// The registered source of `(pod, rank)`, if any.
    pub fn source_of(&self, pod: PodId, rank: u8) -> Option<SourceId> {
        let ids = self.inner.pod_sources.read().get(&pod.0).cloned()?;
        ids.into_iter()
            .find(|id| self.source(*id).is_ok_and(|s| s.lock().rank == rank))
    }

    /// Whether source `(pod, rank)` holds `engine_hash` (the checkpoint entry is live).
    pub fn source_holds(&self, pod: PodId, rank: u8, engine_hash: &crate::wire::BlockHash) -> bool {
        self.source_state_of(pod, rank)
            .is_some_and(|s| self.source_std(&s, engine_hash).is_some())
    }

    /// The state of the registered source of `(pod, rank)`, if any.
    fn source_state_of(&self, pod: PodId, rank: u8) -> Option<Arc<Mutex<SourceState>>> {
        self.source_of(pod, rank)
            .and_then(|id| self.source(id).ok())
    }

    /// The std hash `source` maps `hash` to. The runs, which keep it for most blocks, are
    /// locked after the source, as an apply locks them.
    fn source_std(
        &self,
        source: &Mutex<SourceState>,
        hash: &crate::wire::BlockHash,
    ) -> Option<u64> {
        let state = source.lock();
        let chains = self.inner.chains.read_recursive();
        state.std_of(hash, &chains)
    }

    fn unlink_pod_source(&self, pod: u32, source: SourceId) {
        let mut pods = self.inner.pod_sources.write();
        if let Some(ids) = pods.get_mut(&pod) {
            ids.retain(|id| *id != source);
            self.inner.chains.write().note_ranks(pod, ids.len());
            if ids.is_empty() {
                pods.remove(&pod);
            }
        }
    }

    /// Sources registered for `pod` (identifier `{pod}.{namespace}`).
    pub fn sources_of_pod(&self, pod: &str) -> Vec<SourceId> {
        let Some(pod) = self.inner.pods.get(pod) else {
            return Vec::new();
        };
        self.inner
            .pod_sources
            .read()
            .get(&pod)
            .cloned()
            .unwrap_or_default()
    }

    fn source(&self, id: SourceId) -> Result<Arc<Mutex<SourceState>>, IndexError> {
        self.inner
            .sources
            .read()
            .get(id.0 as usize)
            .and_then(Clone::clone)
            .ok_or(IndexError::UnknownSource(id.0))
    }

    /// Model `model`'s std blocks; `None` when it holds none or the index keeps no std layer.
    fn blocks_of(&self, model: u32) -> Option<Blocks> {
        if !self.inner.std_layer {
            return None;
        }
        self.inner.models.blocks(model)
    }

    /// Models with a block map now (a model no source holds is freed).
    pub fn live_models(&self) -> usize {
        self.inner.models.live()
    }
}

#[cfg(test)]
mod tests;

//! [`Encoder`]: deltas as Redis commands, kthena's fields and mapping keys read from the
//! index at flush time and the checkpoint's entries grouped per state key, in the order that
//! keeps the checkpoint behind the data it covers. Every role that fills a pipeline encodes
//! through it.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use super::checkpoint::segment::{SegmentBody, LOG};
use super::checkpoint::{source_field, state_key, WATERMARKS_KEY};
use super::log::{CheckpointLog, StateAt};
use crate::index::{Delta, FieldValue, Index, ModelId, PodId};
use crate::medium::TierWeights;
use crate::redis_layout::{
    block_key, field_value, mapping_key, mapping_value, push_block_key, push_field_value,
    push_mapping_key, ValueFormat, MAPPING_TTL_SECS,
};
use crate::wire::{BlockHash, Engine};

/// Model ids per source `(pod, rank)` with checkpoint entries: what its watermark lists.
pub(super) type SourceModels = HashMap<(PodId, u8), BTreeSet<ModelId>>;

/// Reused buffers for the keys and values of the commands being encoded.
#[derive(Default)]
struct Scratch {
    key: String,
    value: String,
    /// The mapping keys' TTL in decimal.
    ttl: String,
}

impl Scratch {
    /// Empty buffers, and the mapping keys' TTL written once.
    fn new() -> Scratch {
        Scratch {
            ttl: MAPPING_TTL_SECS.to_string(),
            ..Scratch::default()
        }
    }
}

/// Caches of interned names (they never change once interned). Pod ids are few (one per
/// target); model ids are not (LoRA adapters come and go, and ids are never reused), so
/// that cache is a bounded map: a daemon that sees millions of adapter names over its life
/// keeps at most [`MODEL_NAMES_CACHED`] of them here.
#[derive(Default)]
pub(super) struct Names {
    models: HashMap<ModelId, Arc<str>>,
    pods: Vec<Option<Arc<str>>>,
}

/// Model names the mirror keeps at hand; past that the cache starts over (a miss costs one
/// read of the index's table).
const MODEL_NAMES_CACHED: usize = 4096;

impl Names {
    /// The name of model `id`.
    pub(super) fn model(&mut self, index: &Index, id: ModelId) -> Arc<str> {
        if let Some(name) = self.models.get(&id) {
            return name.clone();
        }
        if self.models.len() >= MODEL_NAMES_CACHED {
            self.models = HashMap::new();
        }
        let name = index.model_name(id);
        self.models.insert(id, name.clone());
        name
    }

    /// The identifier of pod `id`.
    pub(super) fn pod(&mut self, index: &Index, id: PodId) -> Arc<str> {
        cached(&mut self.pods, id.0, || index.pod_name(id))
    }
}

fn cached(cache: &mut Vec<Option<Arc<str>>>, id: u32, load: impl FnOnce() -> Arc<str>) -> Arc<str> {
    let i = id as usize;
    if cache.len() <= i {
        cache.resize(i + 1, None);
    }
    cache[i].get_or_insert_with(load).clone()
}

/// Encodes deltas as commands; holds the name caches, reused buffers, value format and the
/// checkpoint log's stamps.
pub(super) struct Encoder {
    /// Interned names at hand.
    pub(super) names: Names,
    /// The stamps checkpoint segments are written under, and what is due for compaction.
    pub(super) log: CheckpointLog,
    scratch: Scratch,
    format: ValueFormat,
    weights: TierWeights,
}

impl Encoder {
    /// An encoder writing field values in `format`.
    pub(super) fn new(format: ValueFormat, weights: TierWeights) -> Encoder {
        Encoder {
            names: Names::default(),
            log: CheckpointLog::default(),
            scratch: Scratch::new(),
            format,
            weights,
        }
    }

    /// The field value the index's `value` is written as.
    pub(super) fn field_text(&self, value: FieldValue) -> String {
        field_value(value, self.format, &self.weights)
    }

    /// Appends the `HSET` of one field with the index's `value`.
    pub(super) fn push_field(
        &mut self,
        index: &Index,
        pipe: &mut redis::Pipeline,
        (model, std, pod): (ModelId, u64, PodId),
        value: FieldValue,
    ) {
        let bk = block_key(&self.names.model(index, model), std);
        let v = self.field_text(value);
        pipe.hset(bk, &*self.names.pod(index, pod), v).ignore();
    }

    /// Appends the `SET EX` of one mapping key (which renews its TTL).
    pub(super) fn push_mapping(
        &mut self,
        index: &Index,
        pipe: &mut redis::Pipeline,
        (pod, engine, hash): (PodId, Engine, &BlockHash),
        std: u64,
    ) {
        let mk = mapping_key(engine, &self.names.pod(index, pod), hash);
        pipe.set_ex(mk, mapping_value(std), MAPPING_TTL_SECS)
            .ignore();
    }

    /// Appends the command that brings Redis to `delta`'s key's current state to `pipe`. The
    /// value is read from the index now, not taken from the delta: DP ranks of one pod queue
    /// their deltas independently, so only the index knows the pod's latest value, and a
    /// mapping key is kept while any rank of the pod still holds its engine hash.
    pub(super) fn push_command(
        &mut self,
        index: &Index,
        models: &mut SourceModels,
        pipe: &mut redis::Pipeline,
        delta: &Delta,
    ) {
        let sc = &mut self.scratch;
        match delta {
            Delta::Field {
                model,
                std_hash,
                pod,
                ..
            } => {
                push_block_key(&mut sc.key, &self.names.model(index, *model), *std_hash);
                let field = self.names.pod(index, *pod);
                match index.field_value(*model, *std_hash, *pod) {
                    Some(v) => {
                        push_field_value(&mut sc.value, v, self.format, &self.weights);
                        add(pipe, &["HSET", sc.key.as_str(), &field, sc.value.as_str()]);
                    }
                    None => add(pipe, &["HDEL", sc.key.as_str(), &field]),
                }
            }
            Delta::Mapping {
                pod,
                engine,
                engine_hash,
                std_hash,
            } => {
                let pod_name = self.names.pod(index, *pod);
                push_mapping_key(&mut sc.key, *engine, &pod_name, engine_hash);
                let std = std_hash.or_else(|| index.pod_engine_std(*pod, engine_hash));
                match std {
                    Some(std) => {
                        sc.value.clear();
                        let _ = std::fmt::Write::write_fmt(&mut sc.value, format_args!("{std}"));
                        add(pipe, &["SETEX", sc.key.as_str(), &sc.ttl, &sc.value]);
                    }
                    None => add(pipe, &["DEL", sc.key.as_str()]),
                }
            }
            Delta::Engine { .. } | Delta::SourceGone { .. } => {
                self.push_commands(index, models, pipe, std::iter::once(delta));
            }
            // Resolved through Redis by the adoption step, never written as such.
            Delta::UnknownRemove { .. } => {}
        }
    }

    /// Appends the commands for `deltas` in the order that keeps the checkpoint behind the
    /// data: kthena's fields and mapping keys first, then checkpoint entries as one log
    /// segment per state key, then the watermarks of unregistered sources deleted. Returns
    /// the number of commands.
    pub(super) fn push_commands<'d>(
        &mut self,
        index: &Index,
        models: &mut SourceModels,
        pipe: &mut redis::Pipeline,
        deltas: impl IntoIterator<Item = &'d Delta>,
    ) -> usize {
        let mut commands = 0;
        let mut states: Vec<StateSegment> = Vec::new();
        let mut gone: Option<redis::Cmd> = None;
        for delta in deltas {
            match delta {
                Delta::Engine {
                    pod,
                    rank,
                    model,
                    engine_hash,
                    state,
                } => {
                    let at = (*pod, *rank, *model);
                    let i = match states.iter().position(|s| s.at == at) {
                        Some(i) => i,
                        None => {
                            states.push(StateSegment::new(at));
                            states.len() - 1
                        }
                    };
                    let segment = &mut states[i];
                    segment.body.push(engine_hash, state.as_ref());
                    segment.stored |= state.is_some();
                }
                Delta::SourceGone { pod, rank } => {
                    let field = source_field(&self.names.pod(index, *pod), *rank);
                    gone.get_or_insert_with(|| {
                        let mut cmd = redis::cmd("HDEL");
                        cmd.arg(WATERMARKS_KEY);
                        cmd
                    })
                    .arg(field);
                }
                data => {
                    self.push_command(index, models, pipe, data);
                    commands += 1;
                }
            }
        }
        for segment in states {
            if segment.stored {
                // Once per state key and flush: the watermark lists every state key.
                let listed = models.entry((segment.at.0, segment.at.1)).or_default();
                listed.insert(segment.at.2);
            }
            let key = self.state_key(index, segment.at);
            let stamp = self.log.next_stamp();
            pipe.hset(key, stamp.field(), segment.body.bytes()).ignore();
            commands += 1;
            (self.log).logged(index, segment.at, segment.body.entries());
        }
        if let Some(cmd) = gone {
            pipe.add_command(cmd);
            commands += 1;
        }
        commands
    }

    /// The state key of `at`.
    pub(super) fn state_key(&mut self, index: &Index, at: StateAt) -> String {
        state_key(
            &self.names.pod(index, at.0),
            at.1,
            &self.names.model(index, at.2),
        )
    }
}

/// The checkpoint entries of one state key written by one flush: one log segment.
struct StateSegment {
    at: StateAt,
    body: SegmentBody,
    /// Whether any entry stores a block (the watermark then lists the key's model).
    stored: bool,
}

impl StateSegment {
    fn new(at: StateAt) -> StateSegment {
        StateSegment {
            at,
            body: SegmentBody::new(LOG),
            stored: false,
        }
    }
}

/// Appends one command, sized up front: two allocations, whatever the number of arguments.
fn add(pipe: &mut redis::Pipeline, args: &[&str]) {
    let bytes = args.iter().map(|a| a.len()).sum();
    let mut cmd = redis::Cmd::with_capacity(args.len(), bytes);
    for arg in args {
        cmd.arg(*arg);
    }
    pipe.add_command(cmd);
}

//! Encoding the writer's commands: kthena's fields and mapping keys read from the index at
//! flush time, the checkpoint's entries grouped per state key, and the watermarks, in the
//! order that keeps the checkpoint behind the data it covers.

use std::collections::HashMap;
use std::sync::Arc;

use super::{MarkAt, Writer};
use crate::index::{Delta, Index, ModelId, PodId};
use crate::redis_layout::{push_block_key, push_field_value, push_mapping_key, MAPPING_TTL_SECS};
use crate::store::redis::checkpoint::{
    push_engine_field, push_engine_value, source_field, state_key, WATERMARKS_KEY,
};

/// Reused buffers for the keys and values of the commands being encoded.
#[derive(Default)]
pub(super) struct Scratch {
    key: String,
    field: String,
    value: String,
    /// The mapping keys' TTL in decimal.
    ttl: String,
}

impl Scratch {
    /// Empty buffers, and the mapping keys' TTL written once.
    pub(super) fn new() -> Scratch {
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
pub(in crate::store::redis) struct Names {
    models: HashMap<ModelId, Arc<str>>,
    pods: Vec<Option<Arc<str>>>,
}

/// Model names the mirror keeps at hand; past that the cache starts over (a miss costs one
/// read of the index's table).
const MODEL_NAMES_CACHED: usize = 4096;

impl Names {
    pub(in crate::store::redis) fn model(&mut self, index: &Index, id: ModelId) -> Arc<str> {
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
    pub(in crate::store::redis) fn pod(&mut self, index: &Index, id: PodId) -> Arc<str> {
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

impl Writer {
    /// Appends the command that brings Redis to `delta`'s key's current state to `pipe`. The
    /// value is read from the index now, not taken from the delta: DP ranks of one pod queue
    /// their deltas independently, so only the index knows the pod's latest value, and a
    /// mapping key is kept while any rank of the pod still holds its engine hash.
    pub(in crate::store::redis) fn push_command(
        &mut self,
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
                push_block_key(
                    &mut sc.key,
                    &self.names.model(&self.index, *model),
                    *std_hash,
                );
                let field = self.names.pod(&self.index, *pod);
                match self.index.field_value(*model, *std_hash, *pod) {
                    Some(v) => {
                        let format = self.config.value_format;
                        push_field_value(&mut sc.value, v, format, &self.weights);
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
                let pod_name = self.names.pod(&self.index, *pod);
                push_mapping_key(&mut sc.key, *engine, &pod_name, engine_hash);
                let std = std_hash.or_else(|| self.index.pod_engine_std(*pod, engine_hash));
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
                self.push_commands(pipe, std::iter::once(delta));
            }
            // Resolved through Redis by the adoption step, never written as such.
            Delta::UnknownRemove { .. } => {}
        }
    }

    /// Appends the commands for `deltas` in the order that keeps the checkpoint behind the
    /// data: kthena's fields and mapping keys first, then checkpoint entries grouped into one
    /// `HDEL` and one `HMSET` per state key, then the watermarks of unregistered sources
    /// deleted. Returns the number of commands.
    pub(in crate::store::redis) fn push_commands<'d>(
        &mut self,
        pipe: &mut redis::Pipeline,
        deltas: impl IntoIterator<Item = &'d Delta>,
    ) -> usize {
        let mut commands = 0;
        let mut states: Vec<StateOps> = Vec::new();
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
                            states.push(self.state_ops(at));
                            states.len() - 1
                        }
                    };
                    let sc = &mut self.scratch;
                    push_engine_field(&mut sc.field, engine_hash);
                    let ops = &mut states[i];
                    match state {
                        Some(state) => {
                            push_engine_value(&mut sc.value, state);
                            ops.set.arg(sc.field.as_str()).arg(sc.value.as_str());
                            ops.sets += 1;
                        }
                        None => {
                            ops.del.arg(sc.field.as_str());
                            ops.dels += 1;
                        }
                    }
                }
                Delta::SourceGone { pod, rank } => {
                    let field = source_field(&self.names.pod(&self.index, *pod), *rank);
                    gone.get_or_insert_with(|| {
                        let mut cmd = redis::cmd("HDEL");
                        cmd.arg(WATERMARKS_KEY);
                        cmd
                    })
                    .arg(field);
                }
                data => {
                    self.push_command(pipe, data);
                    commands += 1;
                }
            }
        }
        for ops in states {
            if ops.sets > 0 {
                // Once per state key and flush: the watermark lists every state key.
                let models = self.marks.models.entry((ops.at.0, ops.at.1)).or_default();
                models.insert(ops.at.2);
            }
            if ops.dels > 0 {
                pipe.add_command(ops.del);
                commands += 1;
            }
            if ops.sets > 0 {
                pipe.add_command(ops.set);
                commands += 1;
            }
        }
        if let Some(cmd) = gone {
            pipe.add_command(cmd);
            commands += 1;
        }
        commands
    }

    /// The empty `HDEL` and `HMSET` of one state key.
    fn state_ops(&mut self, at: (PodId, u8, ModelId)) -> StateOps {
        let key = state_key(
            &self.names.pod(&self.index, at.0),
            at.1,
            &self.names.model(&self.index, at.2),
        );
        let mut set = redis::cmd("HMSET");
        set.arg(&key);
        let mut del = redis::cmd("HDEL");
        del.arg(&key);
        StateOps {
            at,
            set,
            sets: 0,
            del,
            dels: 0,
        }
    }

    /// Appends one `HSET` of the watermarks `marks` (whose data Redis has answered for).
    /// Returns the number of commands.
    pub(super) fn push_watermarks(
        &mut self,
        pipe: &mut redis::Pipeline,
        marks: &[MarkAt],
    ) -> usize {
        let mut fields: Vec<(String, String)> = Vec::with_capacity(marks.len());
        for &(key, source, seq) in marks {
            let Some(mark) = self.watermark(key, source, seq) else {
                continue;
            };
            let Ok(json) = serde_json::to_string(&mark) else {
                continue;
            };
            fields.push((
                source_field(&self.names.pod(&self.index, key.0), key.1),
                json,
            ));
        }
        if fields.is_empty() {
            return 0;
        }
        pipe.hset_multiple(WATERMARKS_KEY, &fields);
        1
    }

    /// Appends every live source's latest watermark: the end of a reconcile, which rewrote
    /// all the data they cover.
    pub(in crate::store::redis) fn push_all_watermarks(
        &mut self,
        pipe: &mut redis::Pipeline,
    ) -> usize {
        self.marks.unwritten.clear();
        self.marks.confirmed.clear();
        let all: Vec<MarkAt> = self
            .marks
            .latest
            .iter()
            .map(|(key, (source, seq))| (*key, *source, *seq))
            .collect();
        self.push_watermarks(pipe, &all)
    }
}

/// The checkpoint entries of one state key written by one flush: one `HDEL` and one
/// `HMSET`, each encoded as its entries come.
struct StateOps {
    /// `(pod, rank, model)` of the state key.
    at: (PodId, u8, ModelId),
    set: redis::Cmd,
    sets: usize,
    del: redis::Cmd,
    dels: usize,
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

//! [`Marks`]: the checkpoint's watermarks, one per live source. A watermark is written only
//! once Redis has answered for the data it covers (see `inflight.rs`), and every one is
//! written again at the end of a reconcile.

use std::collections::{HashMap, HashSet};

use super::checkpoint::{source_field, Watermark, WATERMARKS_KEY};
use super::encode::{Names, SourceModels};
use super::inflight::MarkAt;
use crate::index::{Checkpoint, Index, PodId, SourceId};

/// Watermarks of the sources the mirror checkpoints. Only the seq is recorded per message;
/// the rest of a watermark entry (names, models, engine run) is read when it is written, once
/// per flush, so a message costs one map update here.
#[derive(Default)]
pub(super) struct Marks {
    /// Per source `(pod, rank)`: its id and the latest seq handed over.
    latest: HashMap<(PodId, u8), (SourceId, u64)>,
    /// Sources whose latest watermark is not in Redis yet.
    unwritten: HashSet<(PodId, u8)>,
    /// Watermarks whose data Redis has answered for, to be written by the next pipeline.
    confirmed: HashMap<(PodId, u8), (SourceId, u64)>,
    /// Model ids per source, so a watermark lists every state key of its source.
    pub(super) models: SourceModels,
    /// Source ids resolved to `(pod, rank)` (ids are never reused).
    sources: HashMap<SourceId, Option<(PodId, u8)>>,
}

impl Marks {
    /// Seeds the watermarks a warm start restored, so later ones keep their model lists and a
    /// reconcile writes them back.
    pub(super) fn seed(&mut self, index: &Index, restored: Vec<(SourceId, Watermark)>) {
        for (source, mark) in restored {
            let Some(key) = self.resolve_source(index, source) else {
                continue;
            };
            let models = self.models.entry(key).or_default();
            for name in &mark.models {
                if let Some(id) = index.model_id(name) {
                    models.insert(id);
                }
            }
            self.latest.insert(key, (source, mark.seq));
        }
    }

    fn resolve_source(&mut self, index: &Index, source: SourceId) -> Option<(PodId, u8)> {
        *self.sources.entry(source).or_insert_with(|| {
            let spec = index.source_spec(source)?;
            Some((index.pod_id(&spec.pod)?, spec.dp_rank))
        })
    }

    /// Records a source's checkpoint: its watermark is written after the data it covers.
    pub(super) fn absorb(&mut self, index: &Index, checkpoint: Checkpoint) {
        let Some(key) = self.resolve_source(index, checkpoint.source) else {
            return;
        };
        self.latest.insert(key, (checkpoint.source, checkpoint.seq));
        self.unwritten.insert(key);
    }

    /// Drops the watermarks of a source that is gone.
    pub(super) fn forget(&mut self, pod: PodId, rank: u8) {
        self.unwritten.remove(&(pod, rank));
        self.latest.remove(&(pod, rank));
        self.models.remove(&(pod, rank));
        self.confirmed.remove(&(pod, rank));
    }

    /// Whether some watermark waits to be written.
    pub(super) fn waiting(&self) -> bool {
        !self.unwritten.is_empty() || !self.confirmed.is_empty()
    }

    /// Whether a confirmed watermark waits for the next pipeline.
    pub(super) fn any_confirmed(&self) -> bool {
        !self.confirmed.is_empty()
    }

    /// Takes the confirmed watermarks, for the pipeline being built.
    pub(super) fn take_confirmed(&mut self) -> Vec<MarkAt> {
        (self.confirmed.drain())
            .map(|(key, (source, seq))| (key, source, seq))
            .collect()
    }

    /// Takes the unwritten sources' latest watermarks: those the pipeline being built
    /// completes.
    pub(super) fn take_covered(&mut self) -> Vec<MarkAt> {
        let latest = &self.latest;
        (self.unwritten.drain())
            .filter_map(|key| latest.get(&key).map(|(source, seq)| (key, *source, *seq)))
            .collect()
    }

    /// Confirms watermarks whose data Redis has answered for.
    pub(super) fn confirm(&mut self, covers: Vec<MarkAt>) {
        for (key, source, seq) in covers {
            self.confirmed.insert(key, (source, seq));
        }
    }

    /// Marks sources unwritten again: a pipeline that may not have landed carried their data
    /// or their watermark.
    pub(super) fn unwritten_again(&mut self, keys: impl IntoIterator<Item = (PodId, u8)>) {
        self.unwritten.extend(keys);
    }

    /// The watermark entry of source `key` at `seq`, `None` once it is unregistered (or
    /// registered again as another source).
    fn watermark(
        &mut self,
        index: &Index,
        names: &mut Names,
        (key, source, seq): MarkAt,
    ) -> Option<Watermark> {
        let (latest, _) = *self.latest.get(&key)?;
        if latest != source {
            return None;
        }
        let spec = index.source_spec(source)?;
        let models = self.models.entry(key).or_default();
        if let Some(base) = index.model_id(&spec.model) {
            models.insert(base);
        }
        let models = models
            .iter()
            .map(|m| names.model(index, *m).to_string())
            .collect();
        Some(Watermark {
            seq,
            engine: spec.engine,
            model: spec.model,
            models,
            run: index.source_run(source),
        })
    }

    /// Appends one `HSET` of the watermarks `marks` (whose data Redis has answered for).
    /// Returns the number of commands.
    pub(super) fn push(
        &mut self,
        index: &Index,
        names: &mut Names,
        pipe: &mut redis::Pipeline,
        marks: &[MarkAt],
    ) -> usize {
        let mut fields: Vec<(String, String)> = Vec::with_capacity(marks.len());
        for &mark in marks {
            let Some(entry) = self.watermark(index, names, mark) else {
                continue;
            };
            let Ok(json) = serde_json::to_string(&entry) else {
                continue;
            };
            let (pod, rank) = mark.0;
            fields.push((source_field(&names.pod(index, pod), rank), json));
        }
        if fields.is_empty() {
            return 0;
        }
        pipe.hset_multiple(WATERMARKS_KEY, &fields);
        1
    }

    /// Appends every live source's latest watermark: the end of a reconcile, which rewrote
    /// all the data they cover.
    pub(super) fn push_all(
        &mut self,
        index: &Index,
        names: &mut Names,
        pipe: &mut redis::Pipeline,
    ) -> usize {
        self.unwritten.clear();
        self.confirmed.clear();
        let all: Vec<MarkAt> = (self.latest.iter())
            .map(|(key, (source, seq))| (*key, *source, *seq))
            .collect();
        self.push(index, names, pipe, &all)
    }
}

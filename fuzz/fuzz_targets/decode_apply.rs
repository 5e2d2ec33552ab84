//! Decoded batches applied to an [`Index`] from several sources: nothing may panic, and a
//! mirror built only from the emitted deltas must equal the index after every step (the
//! Redis mirror relies on exactly that), and clearing every source leaves no block of
//! either layer (std blocks, chain blocks). A `prefix`-only index (no std layer) takes the
//! same operations: its entry counters must equal a walk of its blocks and the full index's
//! chain entries after every step, and it must be empty after the clears too.
//!
//! Input layout: records of [ctrl, len_hi, len_lo, payload…]. ctrl & 3 picks one of four
//! sources (two DP ranks of one vLLM pod, an SGLang pod, a TRT-LLM pod); ctrl >> 2 & 7 is
//! the operation: 0–4 apply the payload, 5 clear the source, 6 forget its pod (then register
//! it again), 7 apply with the store time going backwards.
#![no_main]

use std::collections::BTreeMap;

use kvindex::index::{Delta, Discard, FieldValue, Index, IndexOptions, SourceId, SourceSpec};
use kvindex::wire::{decode_batch, DecodeOptions, Engine};
use libfuzzer_sys::fuzz_target;

const SPECS: [(&str, &str, Engine, u8); 4] = [
    ("vllm-0.default", "base", Engine::Vllm, 0),
    ("vllm-0.default", "base", Engine::Vllm, 1),
    ("sglang-0.default", "base", Engine::Sglang, 0),
    ("trt-0.default", "other", Engine::Trtllm, 0),
];

fn register(index: &Index, i: usize) -> SourceId {
    let (pod, model, engine, dp_rank) = SPECS[i];
    let spec = SourceSpec {
        pod: pod.to_owned(),
        model: model.to_owned(),
        engine,
        dp_rank,
    };
    index.register_source(&spec).expect("four sources fit")
}

type Fields = BTreeMap<(u32, u64, u32), (u32, u32)>;
type Mappings = BTreeMap<(u32, String), u64>;
/// Checkpoint entries: (pod, rank, model, engine hash) → (std hash, media bits).
type Engines = BTreeMap<(u32, u8, u32, String), (u64, u32)>;

#[derive(Default)]
struct Mirror {
    fields: Fields,
    mappings: Mappings,
    engines: Engines,
}

impl Mirror {
    fn absorb(&mut self, deltas: Vec<Delta>) {
        for delta in deltas {
            match delta {
                Delta::Field {
                    model,
                    std_hash,
                    pod,
                    value,
                } => {
                    let key = (model.0, std_hash, pod.0);
                    match value {
                        Some(FieldValue { stored_at, media }) => {
                            self.fields.insert(key, (stored_at, media.bits()));
                        }
                        None => {
                            assert!(self.fields.remove(&key).is_some(), "delete of absent field");
                        }
                    }
                }
                Delta::UnknownRemove { .. } => {}
                Delta::Mapping {
                    pod,
                    engine_hash,
                    std_hash,
                    ..
                } => {
                    let key = (pod.0, engine_hash.to_string());
                    match std_hash {
                        Some(std) => {
                            self.mappings.insert(key, std);
                        }
                        None => {
                            self.mappings.remove(&key);
                        }
                    }
                }
                Delta::Engine {
                    pod,
                    rank,
                    model,
                    engine_hash,
                    state,
                } => {
                    let key = (pod.0, rank, model.0, engine_hash.to_string());
                    match state {
                        Some(s) => {
                            self.engines.insert(key, (s.std_hash, s.media.bits()));
                        }
                        None => {
                            self.engines.remove(&key);
                        }
                    }
                }
                Delta::SourceGone { pod, rank } => {
                    assert!(
                        !self.engines.keys().any(|k| k.0 == pod.0 && k.1 == rank),
                        "a source went before its checkpoint entries"
                    );
                }
            }
        }
    }

    fn check(&self, index: &Index) {
        let mut fields = Fields::new();
        index.for_each_field(|model, std, pod, value| {
            let old = fields.insert((model.0, std, pod.0), (value.stored_at, value.media.bits()));
            assert!(old.is_none(), "field visited twice");
        });
        assert_eq!(fields, self.fields, "delta mirror diverged from the index");
        let mut engines = Engines::new();
        index.for_each_engine_state(|pod, rank, model, hash, state| {
            engines.insert(
                (pod.0, rank, model.0, hash.to_string()),
                (state.std_hash, state.media.bits()),
            );
        });
        assert_eq!(engines, self.engines, "checkpoint entries diverged from the index");
        // Mapping keys are per pod, not per DP rank, so only single-rank pods are checked
        // exactly (two ranks may hold the same engine hash).
        let multi_rank = index.pod_id(SPECS[0].0).map(|p| p.0);
        let mut mappings = Mappings::new();
        index.for_each_mapping(|pod, _, hash, std| {
            if Some(pod.0) != multi_rank {
                mappings.insert((pod.0, hash.to_string()), std);
            }
        });
        let announced: Mappings = self
            .mappings
            .iter()
            .filter(|((pod, _), _)| Some(*pod) != multi_rank)
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        assert_eq!(
            mappings, announced,
            "mapping deltas diverged from the index"
        );
    }
}

/// The `prefix`-only index's counters against a walk of it and the full index's chain layer.
fn check_lean(lean: &Index, index: &Index) {
    let walked = lean.stats().entries as u64;
    let counted = lean.entry_counts().0;
    assert_eq!(walked, counted, "prefix-only counters diverged from its blocks");
    assert_eq!(
        counted,
        index.chain_entries() as u64,
        "prefix-only index diverged from the full index's chain layer"
    );
}

fuzz_target!(|data: &[u8]| {
    let index = Index::new();
    let lean = Index::with_options(IndexOptions {
        std_layer: false,
        ..IndexOptions::default()
    });
    let mut sources: Vec<SourceId> = (0..SPECS.len()).map(|i| register(&index, i)).collect();
    let mut lean_sources: Vec<SourceId> = (0..SPECS.len()).map(|i| register(&lean, i)).collect();
    let mut mirror = Mirror::default();
    let mut now = 1_000u32;
    let mut rest = data;
    while let [ctrl, hi, lo, tail @ ..] = rest {
        let len = (usize::from(*hi) << 8 | usize::from(*lo)).min(tail.len());
        let (payload, next) = tail.split_at(len);
        rest = next;
        let which = usize::from(ctrl & 3);
        let mut deltas = Vec::new();
        match (ctrl >> 2) & 7 {
            5 => {
                index
                    .clear_source(sources[which], &mut deltas)
                    .expect("registered");
                lean.clear_source(lean_sources[which], &mut Discard)
                    .expect("registered");
            }
            6 => {
                index.forget_pod(SPECS[which].0, &mut deltas);
                lean.forget_pod(SPECS[which].0, &mut Discard);
                for (i, spec) in SPECS.iter().enumerate() {
                    if spec.0 == SPECS[which].0 {
                        sources[i] = register(&index, i);
                        lean_sources[i] = register(&lean, i);
                    }
                }
            }
            op => {
                now = if op == 7 {
                    now.saturating_sub(5)
                } else {
                    now + 1
                };
                if let Ok(batch) = decode_batch(payload, DecodeOptions::INDEX) {
                    index
                        .apply(sources[which], &batch, now, &mut deltas)
                        .expect("registered");
                    lean.apply(lean_sources[which], &batch, now, &mut Discard)
                        .expect("registered");
                }
            }
        }
        mirror.absorb(deltas);
        mirror.check(&index);
        check_lean(&lean, &index);
    }
    // Clearing every source must leave nothing behind: no field, no engine hash.
    let mut deltas = Vec::new();
    for source in &sources {
        index
            .clear_source(*source, &mut deltas)
            .expect("registered");
    }
    for source in &lean_sources {
        lean.clear_source(*source, &mut Discard)
            .expect("registered");
    }
    let lean_stats = lean.stats();
    assert_eq!(
        (lean_stats.entries, lean_stats.engine_hashes, lean.entry_counts().0),
        (0, 0, 0),
        "prefix-only blocks left after clearing every source"
    );
    mirror.absorb(deltas);
    assert!(
        mirror.fields.is_empty(),
        "fields left after clearing every source"
    );
    let stats = index.stats();
    assert_eq!(
        (stats.entries, stats.blocks, stats.engine_hashes),
        (0, 0, 0)
    );
    // The chain blocks of `prefix` matching are left behind by no path either.
    assert_eq!(index.chain_entries(), 0, "chain blocks left after clearing every source");
});

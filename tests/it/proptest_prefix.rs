//! Model-based tests of the two match modes: random chained event streams from several
//! sources (two DP ranks of one pod, a second pod) are applied to an [`Index`] and to a
//! naive chain model, then random prompts are scored in both modes.
//!
//! The model keeps, per source, engine hash → (model, content id, chain, media), where the
//! chain is the block's whole prefix as a list of content ids under its root model —
//! learnt from the parent the event names (the previous block inside an event), unknown
//! when the source does not hold that parent under the same model. A pod matches block i
//! of a prompt in `prefix` mode iff for every j ≤ i one of its ranks holds an engine block
//! whose chain is exactly the prompt's blocks 0..=j; in `kthena` mode iff it holds each
//! block's content (std hash) under the model, whatever came before. Contents come from a
//! small pool and parents from a small hash pool, so spliced prefixes, mid-chain removals,
//! reused hashes, tier copies and duplicate engine blocks are all frequent.
//!
//! Engine restarts and routers' placements come in the same streams: a placed prompt's
//! chains count as held on GPU by its pod in `prefix` mode until a rank of the pod stores
//! that chain (confirmed) or removes it, clears or restarts (dropped).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use kvindex::index::{Discard, Index, IndexOptions, SourceId, SourceSpec, SpeculativeOptions};
use kvindex::medium::{MediaSet, Medium, TierWeights};
use kvindex::score::{score_candidates, score_index_with, Candidates, MatchMode, PromptSettings};
use kvindex::store::redis::checkpoint;
use kvindex::wire::{BlockHash, BlockRemoved, BlockStored, Engine, EngineBatch, Event};

const BASE: &str = "base-model";
const ADAPTER: &str = "sql-adapter";
const SOURCES: [(&str, u8); 3] = [("pod-a.ns", 0), ("pod-a.ns", 1), ("pod-b.ns", 0)];
const PODS: [&str; 2] = ["pod-a.ns", "pod-b.ns"];
const MEDIA: [&str; 4] = ["GPU", "CPU", "DISK", ""];
const BLOCK_SIZE: usize = 16;

#[derive(Debug, Clone)]
enum Op {
    Store {
        parent: Option<u64>,
        hashes: Vec<u64>,
        /// One content id per block; `None` = a tokenless tier copy.
        contents: Option<Vec<u8>>,
        medium: &'static str,
        lora: bool,
    },
    Remove {
        hashes: Vec<u64>,
        medium: &'static str,
    },
    Clear,
    /// The source's engine restarted (its blocks are dropped, it stays registered).
    Restart,
    /// A router placed a prompt (content ids, adapter or base model) on the source's pod.
    Route {
        prompt: Vec<u8>,
        lora: bool,
    },
}

fn gen_op() -> impl Strategy<Value = Op> {
    let medium = || proptest::sample::select(&MEDIA[..]);
    prop_oneof![
        7 => (1usize..5)
            .prop_flat_map(move |n| (
                proptest::option::weighted(0.6, 0u64..16),
                proptest::collection::vec(0u64..16, n),
                proptest::option::weighted(0.9, proptest::collection::vec(0u8..4, n)),
                medium(),
                proptest::bool::weighted(0.1),
            ))
            .prop_map(|(parent, hashes, contents, medium, lora)| Op::Store {
                parent,
                hashes,
                contents,
                medium,
                lora,
            }),
        3 => (proptest::collection::vec(0u64..16, 1..3), medium())
            .prop_map(|(hashes, medium)| Op::Remove { hashes, medium }),
        1 => Just(Op::Clear),
        1 => Just(Op::Restart),
        2 => (proptest::collection::vec(0u8..4, 1..6), proptest::bool::weighted(0.1))
            .prop_map(|(prompt, lora)| Op::Route { prompt, lora }),
    ]
}

fn gen_stream() -> impl Strategy<Value = Vec<(usize, Vec<Op>)>> {
    proptest::collection::vec(
        (0..SOURCES.len(), proptest::collection::vec(gen_op(), 1..5)),
        1..40,
    )
}

/// A prompt: content ids (a few share the stored pool's first blocks), and its model.
fn gen_prompts() -> impl Strategy<Value = Vec<(Vec<u8>, bool)>> {
    proptest::collection::vec(
        (
            proptest::collection::vec(0u8..4, 1..6),
            proptest::bool::weighted(0.1),
        ),
        1..8,
    )
}

fn tokens_of(content: u8) -> Vec<u32> {
    (0..BLOCK_SIZE as u32)
        .map(|t| u32::from(content) * 1000 + t)
        .collect()
}

fn to_event(op: &Op) -> Event {
    match op {
        Op::Store {
            parent,
            hashes,
            contents,
            medium,
            lora,
        } => {
            let tokens = contents
                .iter()
                .flatten()
                .flat_map(|c| tokens_of(*c))
                .collect();
            let hashes = hashes.iter().map(|h| BlockHash::Int(*h)).collect();
            Event::BlockStored(BlockStored {
                lora_name: lora.then(|| ADAPTER.to_owned()),
                parent_block_hash: parent.map(BlockHash::Int),
                ..BlockStored::new(hashes, tokens, BLOCK_SIZE as u32, Medium::intern(medium))
            })
        }
        Op::Remove { hashes, medium } => Event::BlockRemoved(BlockRemoved::new(
            hashes.iter().map(|h| BlockHash::Int(*h)).collect(),
            Medium::intern(medium),
        )),
        Op::Clear => Event::AllBlocksCleared,
        Op::Restart | Op::Route { .. } => unreachable!("not an engine event"),
    }
}

/// A block's whole prefix: its root model and every content id up to and including it.
type Chain = (&'static str, Vec<u8>);

#[derive(Debug, Clone)]
struct Block {
    model: &'static str,
    content: u8,
    chain: Option<Chain>,
    media: MediaSet,
}

/// The naive model: per source, engine hash → block; per pod, the chains routers placed
/// on it and its engine has not confirmed (stored) or dropped (removed, cleared) since.
#[derive(Default)]
struct Model {
    sources: [BTreeMap<u64, Block>; 3],
    placed: BTreeMap<&'static str, std::collections::BTreeSet<Chain>>,
}

impl Model {
    fn apply(&mut self, source: usize, op: &Op) {
        let placed = self.placed.entry(SOURCES[source].0).or_default();
        let map = &mut self.sources[source];
        match op {
            Op::Route { prompt, lora } => {
                let model = if *lora { ADAPTER } else { BASE };
                placed.extend((1..=prompt.len()).map(|n| (model, prompt[..n].to_vec())));
                return;
            }
            Op::Clear | Op::Restart => placed.clear(),
            Op::Remove { hashes, .. } => {
                for chain in hashes.iter().filter_map(|h| map.get(h)?.chain.as_ref()) {
                    placed.remove(chain);
                }
            }
            Op::Store { .. } => {}
        }
        match op {
            Op::Store {
                parent,
                hashes,
                contents,
                medium,
                lora,
            } => {
                let added = MediaSet::single(Medium::intern(medium));
                let model = if *lora { ADAPTER } else { BASE };
                let Some(contents) = contents else {
                    for h in hashes {
                        if let Some(b) = map.get_mut(h) {
                            b.media = b.media.union(added);
                        }
                    }
                    return;
                };
                // The first block's parent chain: the model's root, or the parent's chain
                // when this source holds it under the same model.
                let mut parent_chain: Option<Chain> = match parent {
                    None => Some((model, Vec::new())),
                    Some(p) => map
                        .get(p)
                        .filter(|b| b.model == model)
                        .and_then(|b| b.chain.clone()),
                };
                for (h, content) in hashes.iter().zip(contents) {
                    let chain = parent_chain.map(|(root, mut ids)| {
                        ids.push(*content);
                        (root, ids)
                    });
                    if let Some(chain) = &chain {
                        placed.remove(chain);
                    }
                    let kept = match map.get_mut(h) {
                        // The same block again: gains the medium; a known chain replaces.
                        Some(b) if b.model == model && b.content == *content => {
                            b.media = b.media.union(added);
                            if chain.is_some() {
                                b.chain = chain;
                            }
                            b.chain.clone()
                        }
                        _ => {
                            let block = Block {
                                model,
                                content: *content,
                                chain: chain.clone(),
                                media: added,
                            };
                            map.insert(*h, block);
                            chain
                        }
                    };
                    parent_chain = kept;
                }
            }
            Op::Remove { hashes, medium } => {
                let m = Medium::intern(medium);
                let mut mask = if m.is_none() {
                    MediaSet::from_bits(u32::MAX)
                } else {
                    m.same_tier_mask()
                };
                mask.insert(Medium::NONE);
                for h in hashes {
                    if let Some(b) = map.get_mut(h) {
                        b.media = b.media.difference(mask);
                        if b.media.is_empty() {
                            map.remove(h);
                        }
                    }
                }
            }
            Op::Clear | Op::Restart => map.clear(),
            Op::Route { .. } => {}
        }
    }

    /// Media `pod` holds block `i` of the prompt on (empty: not held), in `mode`.
    fn held(
        &self,
        pod: &str,
        model: &'static str,
        prompt: &[u8],
        i: usize,
        mode: MatchMode,
    ) -> MediaSet {
        let mut media = MediaSet::EMPTY;
        let chain = (model, prompt[..=i].to_vec());
        if mode == MatchMode::Prefix && self.placed.get(pod).is_some_and(|p| p.contains(&chain)) {
            media.insert(Medium::GPU);
        }
        for (s, map) in self.sources.iter().enumerate() {
            if SOURCES[s].0 != pod {
                continue;
            }
            for b in map.values() {
                let hit = match mode {
                    MatchMode::Prefix => b.chain.as_ref().is_some_and(|(root, ids)| {
                        *root == model && ids.as_slice() == &prompt[..=i]
                    }),
                    MatchMode::Kthena => b.model == model && b.content == prompt[i],
                };
                if hit {
                    media = media.union(b.media);
                }
            }
        }
        media
    }

    /// Per pod: (matched blocks, Σ best weights) in `mode`.
    fn scores(
        &self,
        model: &'static str,
        prompt: &[u8],
        mode: MatchMode,
    ) -> BTreeMap<String, (u32, f64)> {
        let weights = TierWeights::default();
        let mut out = BTreeMap::new();
        for pod in PODS {
            let (mut matched, mut sum) = (0u32, 0.0);
            for i in 0..prompt.len() {
                let media = self.held(pod, model, prompt, i, mode);
                if media.is_empty() {
                    break;
                }
                let best = media
                    .iter()
                    .map(|m| weights.weight(m))
                    .fold(f64::NEG_INFINITY, f64::max);
                matched += 1;
                sum += best;
            }
            if matched > 0 {
                out.insert(pod.to_owned(), (matched, sum));
            }
        }
        out
    }
}

fn new_index() -> (Index, Vec<SourceId>) {
    index_with(IndexOptions::default())
}

fn index_with(options: IndexOptions) -> (Index, Vec<SourceId>) {
    // Placements outlive any test case: their expiry is tested on its own.
    let speculative = SpeculativeOptions {
        ttl: Duration::from_secs(3600),
        ..SpeculativeOptions::default()
    };
    let index = Index::with_options(IndexOptions {
        speculative,
        ..options
    });
    let ids = SOURCES
        .iter()
        .map(|(pod, rank)| {
            index
                .register_source(&SourceSpec {
                    pod: (*pod).to_owned(),
                    model: BASE.to_owned(),
                    engine: Engine::Vllm,
                    dp_rank: *rank,
                })
                .expect("three sources fit")
        })
        .collect();
    (index, ids)
}

/// How a test asks the index for scores.
#[derive(Clone, Copy)]
enum Ask {
    /// By pod names ([`score_index_with`]).
    ByNames,
    /// Through a router's resolved candidate list ([`score_candidates`], which answers a
    /// prompt whose first block nobody holds without scoring it), [`wide_candidates`]: more
    /// candidates than one 64-bit word of the scorer holds.
    ByCandidates,
}

/// The index's per-pod (matched blocks, Σ weights) for a prompt in `mode`, by pod names.
fn index_scores(
    index: &Index,
    model: &str,
    prompt: &[u8],
    mode: MatchMode,
) -> BTreeMap<String, (u32, f64)> {
    asked_scores(index, model, prompt, (mode, Ask::ByNames))
}

/// The same, asked as `ask` says.
fn asked_scores(
    index: &Index,
    model: &str,
    prompt: &[u8],
    (mode, ask): (MatchMode, Ask),
) -> BTreeMap<String, (u32, f64)> {
    let tokens: Vec<u32> = prompt.iter().flat_map(|c| tokens_of(*c)).collect();
    let blocks = PromptSettings::default().blocks(model, &tokens, mode);
    let weights = TierWeights::default();
    let scored: Vec<(String, u32, f64)> = match ask {
        Ask::ByNames => {
            let scores = score_index_with(index, model, &blocks, &PODS, &weights, &[], mode);
            (scores.scores.into_iter())
                .map(|s| (s.pod, s.matched_blocks, s.weighted_sum))
                .collect()
        }
        Ask::ByCandidates => {
            let names = wide_candidates();
            let candidates = Candidates::new(index, &names);
            let scores = score_candidates(index, model, &blocks, &candidates, &weights, &[], mode);
            (scores.into_iter())
                .map(|s| (names[s.candidate].clone(), s.matched_blocks, s.weighted_sum))
                .collect()
        }
    };
    (scored.into_iter())
        .map(|(pod, matched, sum)| (pod, (matched, sum)))
        .collect()
}

/// A router's list of 70 candidates: the two pods at 3 and 66 (either side of the scorer's
/// first 64-bit word), the others pods the index never heard of.
fn wide_candidates() -> Vec<String> {
    let mut names: Vec<String> = (0..70).map(|i| format!("idle-{i}.ns")).collect();
    names[3] = PODS[0].to_owned();
    names[66] = PODS[1].to_owned();
    names
}

/// Applies `ops` of `source` in order: runs of engine events as one batch each, restarts and
/// placements between them ([`outside_event`]).
fn apply_ops(index: &Index, source: SourceId, ops: &[Op], now: u32) {
    let outside = |op: &Op| matches!(op, Op::Restart | Op::Route { .. });
    for part in ops.split_inclusive(outside) {
        let (events, last) = match part.split_last() {
            Some((last, events)) if outside(last) => (events, Some(last)),
            _ => (part, None),
        };
        let batch = EngineBatch::of(events.iter().map(to_event).collect());
        index
            .apply(source, &batch, now, &mut Discard)
            .expect("registered");
        if let Some(op) = last {
            outside_event(index, source, op);
        }
    }
}

/// An op that is no engine event: a restart clears the source; a placement goes to the
/// source's pod's speculative entries, as `POST /v1/routed` puts it there.
fn outside_event(index: &Index, source: SourceId, op: &Op) {
    match op {
        Op::Restart => index
            .clear_source(source, &mut Discard)
            .expect("registered"),
        Op::Route { prompt, lora } => {
            let model = if *lora { ADAPTER } else { BASE };
            let tokens: Vec<u32> = prompt.iter().flat_map(|c| tokens_of(*c)).collect();
            let chains = PromptSettings::default().blocks(model, &tokens, MatchMode::Prefix);
            let spec = index.source_spec(source).expect("registered");
            let pod = index.pod_id(&spec.pod).expect("registered");
            index.speculative().place(pod.0, &chains, Instant::now());
        }
        _ => {}
    }
}

/// The first (batch, prompt, mode) where index and model disagree, if any.
/// Also checks a `prefix`-only index (no std layer) fed the same stream: its `prefix` scores
/// equal the model's, and its O(1) entry counters equal both its own walk and the full
/// index's (chain block, pod) entries.
fn first_divergence(stream: &[(usize, Vec<Op>)], prompts: &[(Vec<u8>, bool)]) -> Option<String> {
    let (index, ids) = new_index();
    let (lean, _) = index_with(IndexOptions {
        std_layer: false,
        ..IndexOptions::default()
    });
    let mut model = Model::default();
    for (n, (source, ops)) in stream.iter().enumerate() {
        let now = 1_000 + n as u32;
        for index in [&index, &lean] {
            apply_ops(index, ids[*source], ops, now);
        }
        for op in ops {
            model.apply(*source, op);
        }
        let walked = lean.stats().entries as u64;
        let counted = lean.entry_counts().0;
        let chain_entries = index.chain_entries() as u64;
        if walked != counted || counted != chain_entries {
            return Some(format!(
                "after batch {n}: prefix-only index counts {counted}, walks {walked}; the full index has {chain_entries} chain entries"
            ));
        }
        for (prompt, lora) in prompts {
            let name = if *lora { ADAPTER } else { BASE };
            for mode in [MatchMode::Prefix, MatchMode::Kthena] {
                let want = model.scores(name, prompt, mode);
                for ask in [Ask::ByNames, Ask::ByCandidates] {
                    let got = asked_scores(&index, name, prompt, (mode, ask));
                    if want != got {
                        let by = match ask {
                            Ask::ByNames => "by names",
                            Ask::ByCandidates => "by candidates",
                        };
                        return Some(format!(
                            "after batch {n}, {mode:?} {name} {prompt:?} {by}: model {want:?}, index {got:?}"
                        ));
                    }
                }
            }
            let want = model.scores(name, prompt, MatchMode::Prefix);
            let got = index_scores(&lean, name, prompt, MatchMode::Prefix);
            if want != got {
                return Some(format!(
                    "after batch {n}, prefix-only index, {name} {prompt:?}: model {want:?}, index {got:?}"
                ));
            }
        }
    }
    None
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Both modes equal the naive model after every batch: `prefix` never reports a block
    /// the pod does not hold after that very prefix, and stays exact after removals of
    /// blocks in the middle of a chain.
    #[test]
    fn both_match_modes_equal_the_chain_model(stream in gen_stream(), prompts in gen_prompts()) {
        if let Some(diff) = first_divergence(&stream, &prompts) {
            prop_assert!(false, "{}", diff);
        }
    }

    /// A warm start rebuilds an index from the Redis checkpoint's engine-block entries (as
    /// encoded in Redis): it scores every prompt as the index it came from, in both modes —
    /// the checkpoint keeps each block's chain hash, so `prefix` matches survive a restart.
    #[test]
    fn a_warm_start_from_the_checkpoint_scores_as_before_in_both_modes(
        stream in gen_stream(),
        prompts in gen_prompts(),
    ) {
        let (before, ids) = new_index();
        for (n, (source, ops)) in stream.iter().enumerate() {
            // Placements are never checkpointed: only the engines' own blocks come back.
            let engine_ops: Vec<Op> =
                ops.iter().filter(|op| !matches!(op, Op::Route { .. })).cloned().collect();
            apply_ops(&before, ids[*source], &engine_ops, 1_000 + n as u32);
        }
        let (after, _) = new_index();
        // Per source and model, as the checkpoint keeps them, and children first: a
        // checkpoint is read in no order, and restoring orders it.
        let mut keys: Vec<((SourceId, String), Vec<_>)> = Vec::new();
        before.for_each_engine_state(|pod, rank, model, hash, state| {
            let encoded = checkpoint::engine_value(&state);
            let state = checkpoint::parse_engine_value(&encoded).expect("own encoding");
            let pod = after.pod_id(&before.pod_name(pod)).expect("same pods");
            let source = after.source_of(pod, rank).expect("same sources");
            let key = (source, before.model_name(model).to_string());
            match keys.iter_mut().find(|(k, _)| *k == key) {
                Some((_, blocks)) => blocks.push((hash, state)),
                None => keys.push((key, vec![(hash, state)])),
            }
        });
        for ((source, model), mut blocks) in keys {
            blocks.reverse();
            let restored = after.restore_blocks(source, &model, &blocks).unwrap();
            prop_assert_eq!(restored, blocks.len());
        }
        for (prompt, lora) in &prompts {
            let name = if *lora { ADAPTER } else { BASE };
            for mode in [MatchMode::Prefix, MatchMode::Kthena] {
                prop_assert_eq!(
                    index_scores(&before, name, prompt, mode),
                    index_scores(&after, name, prompt, mode),
                    "{:?} {} {:?}", mode, name, prompt
                );
            }
        }
    }
}

fn store(parent: Option<u64>, hashes: &[u64], contents: &[u8]) -> Op {
    Op::Store {
        parent,
        hashes: hashes.to_vec(),
        contents: Some(contents.to_vec()),
        medium: "GPU",
        lora: false,
    }
}

/// A spliced prompt (system prompt A, then a conversation stored after system prompt B):
/// `kthena` credits every block, `prefix` only the first.
#[test]
fn a_spliced_prompt_is_no_false_hit_in_prefix_mode() {
    let (index, ids) = new_index();
    // Pod b holds A·x·y (hashes 1, 2, 3) and B·z·w (4, 5, 6).
    let ops = [
        store(None, &[1, 2, 3], &[0, 2, 3]),
        store(None, &[4, 5, 6], &[1, 1, 2]),
    ];
    let batch = EngineBatch::of(ops.iter().map(to_event).collect());
    index.apply(ids[2], &batch, 1_000, &mut Discard).unwrap();
    // The prompt A·z·w: A as pod b holds it, z·w as held only after B.
    let spliced = [0, 1, 2];
    let prefix = index_scores(&index, BASE, &spliced, MatchMode::Prefix);
    let kthena = index_scores(&index, BASE, &spliced, MatchMode::Kthena);
    assert_eq!(prefix["pod-b.ns"].0, 1);
    assert_eq!(kthena["pod-b.ns"].0, 3);
    assert_eq!(
        index_scores(&index, BASE, &[1, 1, 2], MatchMode::Prefix)["pod-b.ns"].0,
        3
    );
}

/// A removal in the middle of a chain stops the match there, the blocks after it stay
/// resident, and storing the block again restores the whole match (no truncation).
#[test]
fn a_mid_chain_removal_is_exact_and_undone_by_a_restore() {
    let (index, ids) = new_index();
    let apply = |ops: &[Op]| {
        let batch = EngineBatch::of(ops.iter().map(to_event).collect());
        index.apply(ids[0], &batch, 1_000, &mut Discard).unwrap();
    };
    let prompt = [0, 1, 2, 3];
    apply(&[store(None, &[1, 2, 3, 4], &prompt)]);
    assert_eq!(
        index_scores(&index, BASE, &prompt, MatchMode::Prefix)["pod-a.ns"].0,
        4
    );
    apply(&[Op::Remove {
        hashes: vec![2],
        medium: "",
    }]);
    assert_eq!(
        index_scores(&index, BASE, &prompt, MatchMode::Prefix)["pod-a.ns"].0,
        1
    );
    apply(&[store(Some(1), &[2], &[1])]);
    assert_eq!(
        index_scores(&index, BASE, &prompt, MatchMode::Prefix)["pod-a.ns"].0,
        4
    );
    // Removing the block after the restored one is exact too.
    apply(&[Op::Remove {
        hashes: vec![4],
        medium: "",
    }]);
    assert_eq!(
        index_scores(&index, BASE, &prompt, MatchMode::Prefix)["pod-a.ns"].0,
        3
    );
}

/// A block whose parent the source does not hold has no chain: `prefix` never matches it,
/// `kthena` does.
#[test]
fn a_block_after_an_unknown_parent_is_matched_by_kthena_only() {
    let (index, ids) = new_index();
    let ops = [store(None, &[1], &[0]), store(Some(9), &[2], &[1])];
    let batch = EngineBatch::of(ops.iter().map(to_event).collect());
    index.apply(ids[0], &batch, 1_000, &mut Discard).unwrap();
    assert_eq!(
        index_scores(&index, BASE, &[0, 1], MatchMode::Prefix)["pod-a.ns"].0,
        1
    );
    assert_eq!(
        index_scores(&index, BASE, &[0, 1], MatchMode::Kthena)["pod-a.ns"].0,
        2
    );
}

/// The model has teeth: a stream where a content-only match would be a false hit is told
/// apart from the chain model.
#[test]
fn the_chain_model_tells_prefix_from_kthena() {
    let stream = vec![(
        2,
        vec![store(None, &[1, 2], &[0, 2]), store(None, &[4, 5], &[1, 1])],
    )];
    let mut model = Model::default();
    for (source, ops) in &stream {
        for op in ops {
            model.apply(*source, op);
        }
    }
    let prefix = model.scores(BASE, &[0, 1], MatchMode::Prefix);
    let kthena = model.scores(BASE, &[0, 1], MatchMode::Kthena);
    assert_eq!(prefix["pod-b.ns"].0, 1);
    assert_eq!(kthena["pod-b.ns"].0, 2);
    assert_eq!(first_divergence(&stream, &[(vec![0, 1], false)]), None);
}

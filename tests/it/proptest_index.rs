//! Model-based tests of the index: random event streams from several sources (two DP ranks
//! of one pod, a second pod) are applied to an [`Index`] and to a simple reference of
//! docs/architecture.md §5 — per source, engine hash → (model, std hash, media); a pod holds (model,
//! std) on medium M iff some engine block of one of its ranks maps there with M — and
//! `Index::dump()` must equal the reference after every batch. Block contents come from a
//! small pool, so one std hash often stands for several engine hashes (the case kthena gets
//! wrong). A deliberately broken reference (removal drops every medium) is shown to be
//! caught, so the comparison has teeth. The same streams check the index's O(1) entry
//! counters (whole index and per pod) against a full walk.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

use kvindex::hash::std_hash;
use kvindex::index::{Delta, Discard, Index, SourceId, SourceSpec};
use kvindex::medium::{MediaSet, Medium};
use kvindex::wire::{BlockHash, BlockRemoved, BlockStored, Engine, EngineBatch, Event};

const BASE: &str = "base-model";
const ADAPTER: &str = "sql-adapter";
/// (pod, DP rank) of each source.
const SOURCES: [(&str, u8); 3] = [("pod-a.ns", 0), ("pod-a.ns", 1), ("pod-b.ns", 0)];
const MEDIA: [&str; 5] = ["GPU", "CPU", "cpu", "STORAGE", ""];
const BLOCK_SIZE: usize = 16;

/// A generated event; `content` ids pick block tokens from a small pool.
#[derive(Debug, Clone)]
enum Op {
    Store {
        hashes: Vec<BlockHash>,
        /// One content id per block; `None` = a tokenless tier copy.
        contents: Option<Vec<u8>>,
        medium: &'static str,
        lora: bool,
    },
    Remove {
        hashes: Vec<BlockHash>,
        medium: &'static str,
    },
    Clear,
}

fn gen_hash() -> impl Strategy<Value = BlockHash> {
    // A small pool so that stores, re-stores and removes meet; signed, unsigned and byte
    // hashes whose bits never coincide.
    prop_oneof![
        (0u64..24).prop_map(BlockHash::Int),
        (-12i64..0).prop_map(BlockHash::Neg),
        (0u8..6).prop_map(|b| BlockHash::Bytes(vec![b; 32].into_boxed_slice())),
    ]
}

/// A store of a number of blocks in `blocks`.
fn gen_store(blocks: std::ops::Range<usize>) -> impl Strategy<Value = Op> {
    blocks
        .prop_flat_map(|n| {
            (
                proptest::collection::vec(gen_hash(), n),
                proptest::option::weighted(0.85, proptest::collection::vec(0u8..6, n)),
                proptest::sample::select(&MEDIA[..]),
                proptest::bool::weighted(0.15),
            )
        })
        .prop_map(|(hashes, contents, medium, lora)| Op::Store {
            hashes,
            contents,
            medium,
            lora,
        })
}

fn gen_op() -> impl Strategy<Value = Op> {
    let medium = || proptest::sample::select(&MEDIA[..]);
    prop_oneof![
        6 => gen_store(1..4),
        // Long events (an engine stores a prompt's blocks in one), with hashes from the small
        // pool repeating inside the event.
        1 => gen_store(17..40),
        3 => (proptest::collection::vec(gen_hash(), 1..3), medium())
            .prop_map(|(hashes, medium)| Op::Remove { hashes, medium }),
        1 => Just(Op::Clear),
    ]
}

/// A stream: batches of (source, events).
fn gen_stream() -> impl Strategy<Value = Vec<(usize, Vec<Op>)>> {
    proptest::collection::vec(
        (0..SOURCES.len(), proptest::collection::vec(gen_op(), 1..5)),
        1..40,
    )
}

fn tokens_of(content: u8) -> Vec<u32> {
    (0..BLOCK_SIZE as u32)
        .map(|t| u32::from(content) * 1000 + t)
        .collect()
}

fn medium(name: &str) -> Medium {
    Medium::intern(name)
}

fn to_event(op: &Op) -> Event {
    match op {
        Op::Store {
            hashes,
            contents,
            medium: m,
            lora,
        } => {
            let tokens = contents
                .iter()
                .flatten()
                .flat_map(|c| tokens_of(*c))
                .collect();
            Event::BlockStored(BlockStored {
                lora_name: lora.then(|| ADAPTER.to_owned()),
                ..BlockStored::new(hashes.clone(), tokens, BLOCK_SIZE as u32, medium(m))
            })
        }
        Op::Remove { hashes, medium: m } => {
            Event::BlockRemoved(BlockRemoved::new(hashes.clone(), medium(m)))
        }
        Op::Clear => Event::AllBlocksCleared,
    }
}

/// The reference: docs/architecture.md §5 written as plainly as possible.
#[derive(Default, Clone)]
struct Reference {
    /// Per source: engine hash → (model, std hash, media bits).
    sources: [BTreeMap<BlockHash, (&'static str, u64, MediaSet)>; 3],
    /// Deliberately wrong removal (every medium goes), to show the comparison catches it.
    broken_remove: bool,
}

impl Reference {
    fn apply(&mut self, source: usize, op: &Op) {
        let map = &mut self.sources[source];
        match op {
            Op::Store {
                hashes,
                contents,
                medium: m,
                lora,
            } => {
                let model = if *lora { ADAPTER } else { BASE };
                let added = MediaSet::single(medium(m));
                for (i, hash) in hashes.iter().enumerate() {
                    match contents {
                        Some(contents) => {
                            let std = std_hash(&tokens_of(contents[i]));
                            match map.get_mut(hash) {
                                // The same block again: it gains the medium.
                                Some(e) if e.0 == model && e.1 == std => e.2 = e.2.union(added),
                                // A new block, or a hash reused for other content.
                                _ => {
                                    map.insert(hash.clone(), (model, std, added));
                                }
                            }
                        }
                        // A tier copy: resolves through the engine hash or is ignored.
                        None => {
                            if let Some(e) = map.get_mut(hash) {
                                e.2 = e.2.union(added);
                            }
                        }
                    }
                }
            }
            Op::Remove { hashes, medium: m } => {
                let m = medium(m);
                // No medium: every medium; a medium: that tier (any spelling), and blocks
                // stored without a medium (they may be on any tier).
                let mut mask = if m.is_none() {
                    MediaSet::from_bits(u32::MAX)
                } else {
                    m.same_tier_mask()
                };
                mask.insert(Medium::NONE);
                if self.broken_remove {
                    mask = MediaSet::from_bits(u32::MAX);
                }
                for hash in hashes {
                    if let Some(e) = map.get_mut(hash) {
                        e.2 = e.2.difference(mask);
                        if e.2.is_empty() {
                            map.remove(hash);
                        }
                    }
                }
            }
            Op::Clear => map.clear(),
        }
    }

    /// (model, std, pod) → sorted media spellings, the shape of `Index::dump()`.
    fn expected(&self) -> BTreeMap<(String, u64, String), Vec<String>> {
        let mut held: BTreeMap<(String, u64, String), MediaSet> = BTreeMap::new();
        for (source, map) in self.sources.iter().enumerate() {
            for (model, std, media) in map.values() {
                let key = (model.to_string(), *std, SOURCES[source].0.to_owned());
                let entry = held.entry(key).or_default();
                *entry = entry.union(*media);
            }
        }
        held.into_iter()
            .filter(|(_, media)| !media.is_empty())
            .map(|(k, media)| {
                let names: BTreeSet<String> =
                    media.spellings().into_iter().map(str::to_owned).collect();
                (k, names.into_iter().collect())
            })
            .collect()
    }
}

fn actual(index: &Index) -> BTreeMap<(String, u64, String), Vec<String>> {
    index
        .dump()
        .into_iter()
        .map(|e| {
            let std = e.std_hash.parse().expect("decimal std hash");
            let mut media = e.media;
            media.sort();
            ((e.model, std, e.pod), media)
        })
        .collect()
}

fn new_index() -> (Index, Vec<SourceId>) {
    let index = Index::new();
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

/// Runs a stream through an index and `reference`; the first batch after which they differ.
fn first_divergence(
    stream: &[(usize, Vec<Op>)],
    mut reference: Reference,
    with_deltas: bool,
) -> Option<(usize, String)> {
    let (index, ids) = new_index();
    for (n, (source, ops)) in stream.iter().enumerate() {
        let batch = EngineBatch {
            ts: n as f64,
            dp_rank: Some(i64::from(SOURCES[*source].1)),
            events: ops.iter().map(to_event).collect(),
            skipped: Vec::new(),
        };
        let now = 1_000 + n as u32;
        if with_deltas {
            let mut deltas: Vec<Delta> = Vec::new();
            index.apply(ids[*source], &batch, now, &mut deltas).ok()?;
        } else {
            index.apply(ids[*source], &batch, now, &mut Discard).ok()?;
        }
        for op in ops {
            reference.apply(*source, op);
        }
        let (want, got) = (reference.expected(), actual(&index));
        if want != got {
            return Some((n, format!("reference {want:#?}\nindex {got:#?}")));
        }
    }
    None
}

/// Entry counts per medium spelling (`""` = none reported), summed over equal spellings.
type Counts = (u64, BTreeMap<&'static str, u64>);

fn counts(total: u64, per_medium: Vec<(&'static str, u64)>) -> Counts {
    let mut by_name = BTreeMap::new();
    for (name, n) in per_medium {
        *by_name.entry(name).or_insert(0) += n;
    }
    (total, by_name)
}

/// The whole index's and each pod's entry counts from one full walk, the slow truth the
/// resident counters must equal.
fn walked_counts(index: &Index) -> (Counts, BTreeMap<String, Counts>) {
    let mut all: Counts = (0, BTreeMap::new());
    let mut by_pod: BTreeMap<String, Counts> = BTreeMap::new();
    index.for_each_field(|_, _, pod, value| {
        let pod = by_pod.entry(index.pod_name(pod).to_string()).or_default();
        for counts in [&mut all, pod] {
            counts.0 += 1;
            for m in value.media.iter() {
                *counts.1.entry(m.spelling()).or_insert(0) += 1;
            }
        }
    });
    (all, by_pod)
}

/// Where the resident counters differ from a full walk, if anywhere.
fn counter_divergence(index: &Index) -> Option<String> {
    let (want_all, want_pods) = walked_counts(index);
    let (total, per_medium) = index.entry_counts();
    let got_all = counts(total, per_medium);
    if got_all != want_all {
        return Some(format!("index: counters {got_all:?}, walk {want_all:?}"));
    }
    for (pod, _) in SOURCES {
        let id = index.pod_id(pod)?;
        let (total, per_medium) = index.pod_entry_counts(id);
        let got = counts(total, per_medium);
        let want = want_pods.get(pod).cloned().unwrap_or_default();
        if got != want {
            return Some(format!("{pod}: counters {got:?}, walk {want:?}"));
        }
    }
    None
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn index_matches_the_reference_after_every_batch(stream in gen_stream(), with_deltas in any::<bool>()) {
        if let Some((batch, diff)) = first_divergence(&stream, Reference::default(), with_deltas) {
            prop_assert!(false, "diverged after batch {}: {}", batch, diff);
        }
    }

    /// The O(1) entry counters (whole index and per pod, behind metrics and `GET /v1/pods`)
    /// equal a full walk after every batch, source reset and pod removal.
    #[test]
    fn entry_counters_equal_a_full_walk_after_every_batch(
        stream in gen_stream(),
        resets in proptest::collection::vec(0u8..8, 1..40),
    ) {
        let (index, ids) = new_index();
        for (n, (source, ops)) in stream.iter().enumerate() {
            let batch = EngineBatch::of(ops.iter().map(to_event).collect());
            index.apply(ids[*source], &batch, 1_000 + n as u32, &mut Discard).expect("registered");
            // Now and then a source is reset as after an engine restart or unfillable gap.
            if resets[n % resets.len()] == 0 {
                index.clear_source(ids[*source], &mut Discard).expect("registered");
            }
            if let Some(diff) = counter_divergence(&index) {
                prop_assert!(false, "after batch {}: {}", n, diff);
            }
        }
        index.forget_pod(SOURCES[0].0, &mut Discard);
        if let Some(diff) = counter_divergence(&index) {
            prop_assert!(false, "after forgetting {}: {}", SOURCES[0].0, diff);
        }
    }
}

/// The same harness with a reference whose removal drops every medium must find streams
/// where it disagrees with the index: the comparison detects a real semantic bug.
#[test]
fn a_reference_that_drops_every_medium_on_remove_is_caught() {
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]),
    );
    let strategy = gen_stream();
    let mut caught = 0;
    for _ in 0..64 {
        let stream = strategy
            .new_tree(&mut runner)
            .expect("stream strategy never rejects")
            .current();
        let broken = Reference {
            broken_remove: true,
            ..Reference::default()
        };
        if first_divergence(&stream, broken, false).is_some() {
            caught += 1;
            // The correct reference agrees with the index on that very stream.
            assert_eq!(first_divergence(&stream, Reference::default(), false), None);
        }
    }
    assert!(caught > 0, "no stream told the broken reference apart");
}

/// The tier case by hand: GPU and CPU copies of one block, the CPU copy removed.
#[test]
fn removing_one_tier_keeps_the_others_in_index_and_reference() {
    let h = BlockHash::Int(5);
    let stream = vec![(
        0,
        vec![
            Op::Store {
                hashes: vec![h.clone()],
                contents: Some(vec![1]),
                medium: "GPU",
                lora: false,
            },
            Op::Store {
                hashes: vec![h.clone()],
                contents: None,
                medium: "CPU",
                lora: false,
            },
            Op::Remove {
                hashes: vec![h],
                medium: "cpu",
            },
        ],
    )];
    assert_eq!(first_divergence(&stream, Reference::default(), true), None);
    let broken = Reference {
        broken_remove: true,
        ..Reference::default()
    };
    assert!(first_divergence(&stream, broken, true).is_some());
}

/// Regression (found by the `decode_apply` fuzz target): an unsigned hash and a negative
/// one with the same 64 bits shared an engine-map key, so storing the second overwrote the
/// first's slot and left its block resident forever (a clear no longer reached it).
#[test]
fn a_hash_with_the_same_bits_and_the_other_sign_displaces_the_first() {
    let (index, ids) = new_index();
    let bits: u64 = 16_147_937_615_365_325_126;
    let store = |hash: BlockHash, content: u8| EngineBatch {
        ts: 0.0,
        dp_rank: Some(0),
        events: vec![to_event(&Op::Store {
            hashes: vec![hash],
            contents: Some(vec![content]),
            medium: "GPU",
            lora: false,
        })],
        skipped: Vec::new(),
    };
    let mut deltas: Vec<Delta> = Vec::new();
    let neg = BlockHash::Neg(bits as i64);
    index
        .apply(ids[0], &store(neg.clone(), 1), 10, &mut deltas)
        .unwrap();
    index
        .apply(ids[0], &store(BlockHash::Int(bits), 2), 11, &mut deltas)
        .unwrap();
    let held: Vec<u64> = actual(&index).keys().map(|k| k.1).collect();
    assert_eq!(held, vec![std_hash(&tokens_of(2))]);
    assert!(deltas.contains(&Delta::Mapping {
        pod: index.pod_id(SOURCES[0].0).unwrap(),
        engine: Engine::Vllm,
        engine_hash: neg,
        std_hash: None,
    }));
    index.clear_source(ids[0], &mut Discard).unwrap();
    assert!(index.dump().is_empty());
    assert_eq!(index.stats().engine_hashes, 0);
}

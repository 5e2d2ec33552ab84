use std::cell::Cell;

use super::locator::{chain_at, FEW_STARTS};
use super::node::Span;
use super::read::common_prefix;
use super::*;
use crate::index::layer::{self, Change, DupCounts, Editor};
use crate::index::residents::Resident;
use crate::index::vocab::Visit;
use crate::medium::MediaSet;
use crate::medium::Medium;
use hashbrown::HashMap;

fn who(pod: u32, now: u32) -> Editor {
    Editor {
        pod,
        rank: 0,
        now,
        pod_values: true,
        sole: false,
    }
}

fn gpu() -> MediaSet {
    MediaSet::single(Medium::GPU)
}

/// Stores chain blocks `keys` for `pod`, each after the one before, on GPU at second 10.
fn store_chain(
    runs: &mut ChainRuns,
    edited: (&mut DupCounts, &mut HeldRuns),
    pod: u32,
    keys: std::ops::RangeInclusive<u64>,
) {
    let (dups, held) = edited;
    let mut parent = 0;
    for key in keys {
        runs.add_media(
            (parent, false),
            (dups, held),
            (key, !key),
            who(pod, 10),
            gpu(),
            true,
        );
        parent = key;
    }
}

fn pods_at(runs: &ChainRuns, key: u64) -> Vec<u32> {
    let mut pods = Vec::new();
    let cursor = Cell::new(None);
    runs.visit(key, None, &cursor, |pod, _, _| pods.push(pod.0));
    pods.sort();
    pods
}

/// One edit of the equivalence test below.
#[derive(Debug, Clone)]
enum Op {
    Run {
        source: (u32, u8),
        first: u64,
        last: u64,
        media: u8,
        new_copy: bool,
        now: u32,
    },
    Add {
        source: (u32, u8),
        key: u64,
        after_previous: bool,
        alone: bool,
        media: u8,
        new_copy: bool,
        now: u32,
    },
    Drop {
        source: (u32, u8),
        key: u64,
        media: u8,
        slot_gone: bool,
    },
    Clear {
        source: (u32, u8),
    },
    /// A source's one copy of each of a run's blocks removed by one event, in one span
    /// edit per stretch ([`ChainRuns::drop_copies`]); the blocks it holds otherwise (or
    /// not at all) as single drops.
    DropRun {
        source: (u32, u8),
        first: u64,
        last: u64,
    },
    /// A run stored as one event's new first copies: placed block by block, its spans
    /// edited once per stretch ([`ChainRuns::add_first_copies`]).
    Stretch {
        source: (u32, u8),
        first: u64,
        last: u64,
        media: u8,
        now: u32,
    },
}

fn media_of(bits: u8) -> MediaSet {
    let mut media = MediaSet::EMPTY;
    for (i, name) in ["GPU", "CPU", "DISK"].iter().enumerate() {
        if bits & (1 << i) != 0 {
            media.insert(Medium::intern(name));
        }
    }
    media
}

/// The editor of `source` at `now` for the block map, which always looks for the pod's
/// other DP ranks, and for the runs, which skip that for a pod with one rank
/// ([`Editor::sole`]: pod 2 has one in [`gen_op`]'s sources).
fn editors(source: (u32, u8), now: u32) -> (Editor, Editor) {
    let who = Editor {
        rank: source.1,
        ..who(source.0, now)
    };
    (
        who,
        Editor {
            sole: source.0 == 2,
            ..who
        },
    )
}

fn gen_op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    // Pod 2 has one DP rank only ([`sole`]); pods 0 and 1 have two.
    let source = (0u32..3, 0u8..2).prop_map(|(pod, rank)| (pod, if pod == 2 { 0 } else { rank }));
    prop_oneof![
        6 => (source.clone(), 1u64..16, any::<bool>(), any::<bool>(), 1u8..8, any::<bool>(), 0u32..3)
            .prop_map(|(source, key, after_previous, alone, media, new_copy, now)| Op::Add {
                source, key, after_previous, alone, media, new_copy, now,
            }),
        3 => (source.clone(), 1u64..16, 1u8..8, any::<bool>())
            .prop_map(|(source, key, media, slot_gone)| Op::Drop {
                source, key, media, slot_gone,
            }),
        1 => source.clone().prop_map(|source| Op::Clear { source }),
        // A source storing a run of blocks in order, as engines do (again, mostly).
        2 => (source.clone(), 1u64..16, 1u64..8, 1u8..8, any::<bool>(), 0u32..3).prop_map(
            |(source, first, len, media, new_copy, now)| {
                Op::Run { source, first, last: (first + len).min(15), media, new_copy, now }
            },
        ),
        2 => (source.clone(), 1u64..16, 1u64..8, 1u8..8, 0u32..3).prop_map(
            |(source, first, len, media, now)| {
                Op::Stretch { source, first, last: (first + len).min(15), media, now }
            },
        ),
        2 => (source, 1u64..16, 0u64..8, any::<bool>()).prop_map(|(source, first, len, down)| {
            let last = (first + len).min(15);
            // Deepest first, as engines remove, or in order.
            let (first, last) = if down { (last, first) } else { (first, last) };
            Op::DropRun { source, first, last }
        }),
    ]
}

/// The adds of a run, block after block; other ops as they are.
fn expand(op: Op) -> Vec<Op> {
    match op {
        Op::Run {
            source,
            first,
            last,
            media,
            new_copy,
            now,
        } => (first..=last)
            .map(|key| Op::Add {
                source,
                key,
                after_previous: key > first,
                alone: false,
                media,
                new_copy,
                now,
            })
            .collect(),
        op => vec![op],
    }
}

/// The residents of every block, sorted, as the block map holds them.
fn map_residents(map: &layer::LayerMap<u64>) -> Vec<(u64, Vec<Resident>)> {
    let mut all: Vec<_> = (map.iter())
        .map(|e| (*e.key(), sorted(e.value().as_slice().to_vec())))
        .collect();
    all.sort_by_key(|(k, _)| *k);
    all
}

/// The same as the runs hold them; checks the span order on the way (by source, then
/// position, a source's spans apart and not touching with the same resident).
fn run_residents(runs: &ChainRuns) -> Vec<(u64, Vec<Resident>)> {
    for node in &runs.nodes {
        // Every position is in the locator, at that position.
        assert_eq!(
            node.chains.len(),
            node.stds.len(),
            "a position without its std"
        );
        // Every position's fingerprint is its residents' now.
        assert_eq!(
            node.fingerprints_from_spans(),
            Some(node.fps.expanded()),
            "fingerprints out of step with the spans"
        );
        assert!(
            node.fps.well_formed(),
            "stretches out of shape: {:?}",
            node.fps
        );
        for (pos, hash) in node.chains.iter().enumerate() {
            let spot = runs
                .locator
                .spot(*hash, &runs.nodes)
                .map(|s| (s.node, s.pos));
            let here = runs.nodes.iter().position(|n| std::ptr::eq(n, node));
            assert_eq!(
                spot,
                here.map(|n| (n as u32, pos as u32)),
                "{hash} misplaced"
            );
        }
        // No run keeps a tail nobody holds (`ChainRuns::release` relies on it).
        if let Some(last) = node.chains.len().checked_sub(1) {
            assert!(node.held(last as u16), "a tail nobody holds kept");
        }
        for pair in node.spans.windows(2) {
            let [a, b] = pair else { continue };
            let key = |s: &Span| (s.resident.pod(), s.resident.rank(), s.from);
            assert!(key(a) < key(b), "spans out of order: {a:?} {b:?}");
            if a.is(b.resident.pod(), b.resident.rank()) {
                assert!(a.to < b.from, "spans overlap: {a:?} {b:?}");
                let touching = a.to + 1 == b.from;
                assert!(
                    !touching || a.resident != b.resident,
                    "unmerged: {a:?} {b:?}"
                );
            }
        }
    }
    let locator = &runs.locator;
    let flagged: Vec<u64> = (locator.slots())
        .filter(|slot| slot.is_flagged())
        .map(|slot| chain_at(&runs.nodes, slot))
        .collect();
    assert_eq!(locator.flagged, flagged.len(), "starts miscounted");
    if let Some(starts) = &locator.starts {
        assert_eq!(starts.len(), flagged.len(), "a start not in the table");
        assert!(
            flagged.iter().all(|h| starts.contains(h)),
            "a start not in the table"
        );
    }
    let mut all = Vec::new();
    for spot in runs.locator.slots() {
        let key = &chain_at(&runs.nodes, spot);
        let node = &runs.nodes[spot.node as usize];
        let residents: Vec<Resident> = node
            .residents_at(spot.unflagged().pos as u16)
            .copied()
            .collect();
        if !residents.is_empty() {
            all.push((*key, sorted(residents)));
        }
    }
    all.sort_by_key(|(k, _)| *k);
    all
}

fn sorted(mut residents: Vec<Resident>) -> Vec<Resident> {
    residents.sort_by_key(|r| (r.pod(), r.rank()));
    residents
}

#[test]
fn common_prefixes_are_counted_across_and_within_groups_of_four() {
    let a: Vec<u64> = (1..=11).collect();
    for len in 0..=11 {
        for differ in 0..=len {
            let mut b = a[..len].to_vec();
            if differ < len {
                b[differ] = 0;
            }
            assert_eq!(common_prefix(&a, &b), differ, "{len} {differ}");
            assert_eq!(common_prefix(&b, &a), differ, "{len} {differ}");
        }
    }
}

#[test]
fn the_table_of_starts_is_kept_only_while_starts_are_few() {
    let starts = FEW_STARTS as u64 + 1;
    // Block `i` (chain hash `i + 1`) at position `i % 256` of node `i / 256`.
    let nodes: Vec<Node> = (0..starts * 8)
        .collect::<Vec<u64>>()
        .chunks(256)
        .map(|ids| Node {
            chains: ids.iter().map(|i| i + 1).collect(),
            ..Node::default()
        })
        .collect();
    let spot = |i: u64| Spot {
        node: (i / 256) as u32,
        pos: (i % 256) as u32,
    };
    let mut locator = Locator::default();
    for i in 0..starts {
        locator.insert(i + 1, spot(i), true, &nodes);
    }
    // Every block a start: a table would be a second locator.
    assert!(locator.starts.is_none());
    let known = |l: &Locator, i: u64| l.start_spot(i + 1, &nodes) == Some(spot(i));
    assert!((0..starts).all(|i| known(&locator, i)));
    // Blocks inside chains until starts are an eighth: the table is built again.
    for i in starts..starts * 8 {
        locator.insert(i + 1, spot(i), false, &nodes);
    }
    locator.shrink(&nodes);
    assert_eq!(
        locator.starts.as_ref().map(|s| s.len()),
        Some(starts as usize)
    );
    assert!((0..starts).all(|i| known(&locator, i)));
    let inside = starts + 1;
    assert!(locator.start_spot(inside, &nodes).is_none());
    assert_eq!(locator.spot(inside, &nodes), Some(spot(starts)));
    for i in 0..starts {
        locator.remove(i + 1, spot(i));
    }
    assert_eq!(locator.flagged, 0);
    assert_eq!(locator.starts.as_ref().map(|s| s.len()), Some(0));
    assert!(locator.start_spot(1, &nodes).is_none() && locator.spot(1, &nodes).is_none());
    assert_eq!(locator.len(), (starts * 7) as usize);
}

#[test]
fn the_locator_finds_blocks_by_the_hash_their_run_keeps_as_the_table_grows_and_shrinks() {
    // Enough blocks to grow the table many times, then most taken out and the table
    // shrunk: every block left is found at its spot, every one taken out is not.
    let blocks = 20_000u64;
    let nodes: Vec<Node> = (0..blocks)
        .collect::<Vec<u64>>()
        .chunks(MAX_RUN)
        .map(|ids| Node {
            chains: ids.iter().map(|i| crate::hash::mix64(i + 1)).collect(),
            ..Node::default()
        })
        .collect();
    let spot = |i: u64| Spot::from_parts((i / MAX_RUN as u64) as u32, (i % MAX_RUN as u64) as u32);
    let chain = |i: u64| crate::hash::mix64(i + 1);
    let mut locator = Locator::default();
    for i in 0..blocks {
        locator.insert(chain(i), spot(i), i % 100 == 0, &nodes);
    }
    assert!((0..blocks).all(|i| locator.spot(chain(i), &nodes) == Some(spot(i))));
    let before = locator.heap_bytes();
    for i in (0..blocks).filter(|i| i % 10 != 0) {
        locator.remove(chain(i), spot(i));
    }
    locator.shrink(&nodes);
    assert!(locator.heap_bytes() < before / 4, "memory given back");
    for i in 0..blocks {
        let expected = (i % 10 == 0).then(|| spot(i));
        assert_eq!(locator.spot(chain(i), &nodes), expected, "block {i}");
    }
    assert_eq!(locator.flagged, 200);
    // A hash no run keeps is not found, whatever slot its probe meets.
    assert!((blocks..blocks * 2).all(|i| locator.spot(chain(i), &nodes).is_none()));
}

proptest::proptest! {
    /// Runs hold exactly what a block map of the same edits holds, block by block, and
    /// answer every edit the same (the layer rules are shared; only the storage differs).
    #[test]
    fn runs_hold_what_a_block_map_holds(ops in proptest::collection::vec(gen_op(), 1..120)) {
        let map = layer::LayerMap::<u64>::default();
        let mut runs = ChainRuns::default();
        let mut map_dups: HashMap<(u32, u8), DupCounts> = HashMap::new();
        let mut run_dups: HashMap<(u32, u8), DupCounts> = HashMap::new();
        let mut run_held: HashMap<(u32, u8), HeldRuns> = HashMap::new();
        for op in ops.into_iter().flat_map(expand) {
            match op {
                Op::Run { .. } => unreachable!("runs are expanded into adds"),
                Op::DropRun { source, first, last } => {
                    let (who, fast) = editors(source, 0);
                    let keys: Vec<u64> = if first <= last {
                        (first..=last).collect()
                    } else {
                        (last..=first).rev().collect()
                    };
                    let all = media_of(7);
                    let mut want = Vec::new();
                    let mut got = Vec::new();
                    let (dups, held) = (run_dups.entry(source).or_default(), run_held.entry(source).or_default());
                    let mut stretch: Option<Stretch> = None;
                    for key in keys {
                        // The source's one copy of the block, as `removed` tells it.
                        let one_copy = (map.get(&key)).is_some_and(|r| {
                            r.as_slice().iter().any(|r| (r.pod(), r.rank()) == source && r.copies() == 1)
                        }) && !dups.contains_key(&(layer::CHAIN_DUPS, key));
                        let map_dups = map_dups.entry(source).or_default();
                        let dropped = layer::drop_media(&map, map_dups, (layer::CHAIN_DUPS, key), key, who, all, true);
                        want.extend(dropped.map(|(change, _)| change));
                        match runs.spot(key).filter(|_| one_copy) {
                            Some(spot) => {
                                if !stretch.as_mut().is_some_and(|s| s.grow_either(spot)) {
                                    if let Some(done) = stretch.replace(Stretch::at(spot)) {
                                        runs.drop_copies(held, done, fast, |c, times| got.extend(std::iter::repeat_n(c, times as usize)));
                                    }
                                }
                            }
                            None => {
                                if let Some(done) = stretch.take() {
                                    runs.drop_copies(held, done, fast, |c, times| got.extend(std::iter::repeat_n(c, times as usize)));
                                }
                                let dropped = runs.drop_media((dups, held), (key, None), fast, all, true);
                                got.extend(dropped.map(|(change, _)| change));
                            }
                        }
                    }
                    if let Some(done) = stretch {
                        runs.drop_copies(held, done, fast, |c, times| got.extend(std::iter::repeat_n(c, times as usize)));
                    }
                    let order = |c: &Change| format!("{c:?}");
                    want.sort_by_key(order);
                    got.sort_by_key(order);
                    proptest::prop_assert_eq!(want, got);
                }
                Op::Stretch { source, first, last, media, now } => {
                    let (who, fast) = editors(source, now);
                    let media = media_of(media);
                    let dups = map_dups.entry(source).or_default();
                    let want: Vec<_> = (first..=last)
                        .map(|key| layer::add_media(&map, dups, (layer::CHAIN_DUPS, key), key, who, media, true))
                        .collect();
                    let (dups, held) = (run_dups.entry(source).or_default(), run_held.entry(source).or_default());
                    // Placed as an event places them: a stretch ends where the run does.
                    let mut stretches: Vec<Stretch> = Vec::new();
                    for key in first..=last {
                        let parent = if key > first { key - 1 } else { 0 };
                        let (spot, std) = runs.find_or_place(key, (parent, false), || !key);
                        proptest::prop_assert_eq!(std, !key);
                        if !stretches.last_mut().is_some_and(|s| s.grow(spot)) {
                            stretches.push(Stretch::at(spot));
                        }
                    }
                    let mut got = Vec::new();
                    for stretch in stretches {
                        let mut changes = Vec::new();
                        let added = runs.add_first_copies(held, stretch, fast, media, |change, times| {
                            changes.extend(std::iter::repeat_n((change, false), times as usize));
                        });
                        if !added {
                            proptest::prop_assert!(changes.is_empty());
                            for spot in stretch.spots() {
                                let key = runs.at(spot).unwrap_or(0);
                                let (change, duplicate, _) =
                                    runs.add_media((0, false), (dups, held), (key, !key), fast, media, true);
                                changes.push((change, duplicate));
                            }
                        }
                        got.extend(changes);
                    }
                    proptest::prop_assert_eq!(want, got);
                }
                Op::Add { source, key, after_previous, alone, media, new_copy, now } => {
                    let (who, fast) = editors(source, now);
                    let dup_key = (layer::CHAIN_DUPS, key);
                    let parent = if after_previous { key - 1 } else { 0 };
                    let media = media_of(media);
                    let dups = map_dups.entry(source).or_default();
                    let want = layer::add_media(&map, dups, dup_key, key, who, media, new_copy);
                    let dups = run_dups.entry(source).or_default();
                    let held = run_held.entry(source).or_default();
                    let (change, duplicate, spot) =
                        runs.add_media((parent, alone), (dups, held), (key, !key), fast, media, new_copy);
                    proptest::prop_assert_eq!(want, (change, duplicate));
                    // The spot a source keeps gives both hashes back.
                    let spot = spot.map(|s| runs.hashes_at(s));
                    proptest::prop_assert_eq!(spot, Some(Some((key, !key))));
                }
                Op::Drop { source, key, media, slot_gone } => {
                    let (who, fast) = editors(source, 0);
                    let dup_key = (layer::CHAIN_DUPS, key);
                    let media = media_of(media);
                    let dups = map_dups.entry(source).or_default();
                    let want = layer::drop_media(&map, dups, dup_key, key, who, media, slot_gone);
                    let dups = run_dups.entry(source).or_default();
                    let held = run_held.entry(source).or_default();
                    // The caller's spot: right, stale (another block's) or none.
                    let spot = match key % 3 {
                        0 => runs.spot(key),
                        1 => Some(Spot { node: 0, pos: 0 }),
                        _ => None,
                    };
                    let got = runs.drop_media((dups, held), (key, spot), fast, media, slot_gone);
                    proptest::prop_assert_eq!(want, got);
                }
                Op::Clear { source } => {
                    let (who, fast) = editors(source, 0);
                    let held: Vec<u64> = (map.iter())
                        .filter(|e| e.value().as_slice().iter().any(|r| r.pod() == who.pod && r.rank() == who.rank))
                        .map(|e| *e.key())
                        .collect();
                    let mut want = Vec::new();
                    for key in &held {
                        want.extend(layer::drop_resident(&map, *key, who));
                    }
                    let mut got = Vec::new();
                    let runs_held = run_held.remove(&source).unwrap_or_default();
                    runs.drop_source(runs_held, fast, |change, times| {
                        got.extend(std::iter::repeat_n(change, times as usize));
                    });
                    let order = |c: &Change| format!("{c:?}");
                    want.sort_by_key(order);
                    got.sort_by_key(order);
                    proptest::prop_assert_eq!(want, got);
                    map_dups.remove(&source);
                    run_dups.remove(&source);
                }
            }
            proptest::prop_assert_eq!(map_residents(&map), run_residents(&runs));
            for ((pod, rank), held) in &run_held {
                let holds: hashbrown::HashSet<u32> = (0..runs.nodes.len() as u32)
                    .filter(|id| runs.nodes[*id as usize].has(*pod, *rank))
                    .collect();
                proptest::prop_assert_eq!(&held.ids, &holds, "runs of {}/{}", pod, rank);
            }
            proptest::prop_assert_eq!(&map_dups, &run_dups);
        }
    }
}

#[test]
fn a_block_whose_run_keeps_another_std_hash_gets_no_spot() {
    let mut runs = ChainRuns::default();
    let (mut dups, mut held) = (DupCounts::new(), HeldRuns::default());
    let edited = (&mut dups, &mut held);
    let (_, _, spot) = runs.add_media((0, true), edited, (7, 70), who(1, 10), gpu(), true);
    let spot = spot.expect("the first std hash is the run's");
    // The same chain hash with other content (a 64-bit collision): the source keeps its
    // slot whole rather than read the first block's std hash.
    let edited = (&mut dups, &mut held);
    let (_, _, other) = runs.add_media((0, true), edited, (7, 71), who(2, 10), gpu(), true);
    assert_eq!(other, None);
    assert_eq!(runs.hashes_at(spot), Some((7, 70)));
}

#[test]
fn a_chain_stored_in_order_is_one_run_with_one_span_per_source() {
    let mut runs = ChainRuns::default();
    let mut dups = DupCounts::new();
    let mut held = HeldRuns::default();
    for pod in [1, 2] {
        store_chain(&mut runs, (&mut dups, &mut held), pod, 1..=100);
    }
    assert_eq!(runs.nodes.len(), 1);
    assert_eq!(runs.nodes[0].chains.len(), 100);
    assert_eq!(runs.nodes[0].spans.len(), 2);
}

#[test]
fn a_mid_run_remove_keeps_the_blocks_after_it_and_merges_back_on_restore() {
    let mut runs = ChainRuns::default();
    let mut dups = DupCounts::new();
    let mut held = HeldRuns::default();
    store_chain(&mut runs, (&mut dups, &mut held), 1, 1..=10);
    assert!(runs
        .drop_media((&mut dups, &mut held), (5, None), who(1, 10), gpu(), true)
        .is_some());
    assert_eq!(pods_at(&runs, 5), Vec::<u32>::new());
    assert_eq!(pods_at(&runs, 6), vec![1]);
    assert_eq!(runs.nodes[0].spans.len(), 2);
    // The later blocks can still be removed: nothing was truncated.
    assert!(runs
        .drop_media((&mut dups, &mut held), (10, None), who(1, 10), gpu(), true)
        .is_some());
    assert_eq!(runs.len(), 9, "the tail nobody holds is trimmed");
    runs.add_media(
        (4, true),
        (&mut dups, &mut held),
        (5, !5),
        who(1, 10),
        gpu(),
        true,
    );
    assert_eq!(runs.nodes[0].spans.len(), 1, "the run is whole again");
    let mut changes = 0;
    runs.drop_source(held, who(1, 10), |(before, after), times| {
        assert!(before.is_some() && after.is_none());
        changes += times;
    });
    assert_eq!(changes, 9);
    assert_eq!((runs.len(), runs.free.len()), (0, 1));
}

#[test]
fn a_query_counts_the_blocks_inside_a_span_at_once_and_sees_every_change() {
    let mut runs = ChainRuns::default();
    let mut dups = DupCounts::new();
    let mut held = HeldRuns::default();
    store_chain(&mut runs, (&mut dups, &mut held), 1, 1..=8);
    let mut held2 = HeldRuns::default();
    for key in 1..=4u64 {
        runs.add_media(
            (0, true),
            (&mut dups, &mut held2),
            (key, !key),
            who(2, 10),
            gpu(),
            true,
        );
    }
    let keys: Vec<u64> = (1..=8).collect();
    let cursor = Cell::new(None);
    let mut last = None;
    let mut seen = Vec::new();
    for key in 1..=8u64 {
        let mut pods = 0;
        let visit = runs.visit(key, last, &cursor, |_, _, _| pods += 1);
        match visit {
            Visit::Visited(f) => {
                last = Some(f);
                seen.push(pods);
            }
            Visit::Unchanged => seen.push(0),
            Visit::Absent => unreachable!("every block is held"),
        }
    }
    assert_eq!(seen, vec![2, 0, 0, 0, 1, 0, 0, 0]);
    // Counted at once: after block 1, blocks 2-4 keep its two pods; after 5, 6-8 its one.
    let cursor = Cell::new(None);
    let mut counted = Vec::new();
    let mut at = 0;
    while at < keys.len() {
        let mut pods = 0;
        runs.visit(keys[at], None, &cursor, |_, _, _| pods += 1);
        let repeats = runs.repeats(&keys[at + 1..], &cursor);
        counted.push((pods, repeats));
        at += repeats + 1;
    }
    assert_eq!(counted, vec![(2, 3), (1, 3)]);
}

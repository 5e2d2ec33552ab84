use super::*;
use crate::hash::std_hash;
use crate::medium::Medium;
use crate::wire::{BlockHash, BlockRemoved, BlockStored, EngineBatch, Event};

fn spec(pod: &str, rank: u8) -> SourceSpec {
    SourceSpec {
        pod: pod.to_owned(),
        model: "m".to_owned(),
        engine: Engine::Vllm,
        dp_rank: rank,
    }
}

fn stored(hashes: &[i64], tokens: Vec<u32>, medium: &str) -> Event {
    Event::BlockStored(BlockStored::new(
        hashes.iter().map(|h| BlockHash::from_i64(*h)).collect(),
        tokens,
        16,
        Medium::intern(medium),
    ))
}

fn removed(hashes: &[i64], medium: &str) -> Event {
    Event::BlockRemoved(BlockRemoved::new(
        hashes.iter().map(|h| BlockHash::from_i64(*h)).collect(),
        Medium::intern(medium),
    ))
}

fn batch(events: Vec<Event>) -> EngineBatch {
    EngineBatch::of(events)
}

fn tokens(start: u32, blocks: u32) -> Vec<u32> {
    (start..start + 16 * blocks).collect()
}

fn media_of(index: &Index, std: u64, pod: &str) -> Vec<String> {
    index
        .dump()
        .into_iter()
        .find(|e| e.std_hash == std.to_string() && e.pod == pod)
        .map(|e| e.media)
        .unwrap_or_default()
}

#[test]
fn store_adds_medium_and_remove_takes_only_that_medium() {
    let index = Index::new();
    let src = index.register_source(&spec("p.ns", 0)).unwrap();
    let std = std_hash(&tokens(0, 1));
    index
        .apply(
            src,
            &batch(vec![stored(&[1], tokens(0, 1), "GPU")]),
            10,
            &mut Discard,
        )
        .unwrap();
    index
        .apply(
            src,
            &batch(vec![stored(&[1], vec![], "CPU")]),
            11,
            &mut Discard,
        )
        .unwrap();
    assert_eq!(media_of(&index, std, "p.ns"), ["CPU", "GPU"]);
    index
        .apply(src, &batch(vec![removed(&[1], "GPU")]), 12, &mut Discard)
        .unwrap();
    assert_eq!(media_of(&index, std, "p.ns"), ["CPU"]);
    index
        .apply(src, &batch(vec![removed(&[1], "cpu")]), 13, &mut Discard)
        .unwrap();
    assert!(index.dump().is_empty());
    assert_eq!(index.stats().engine_hashes, 0);
}

#[test]
fn remove_without_medium_removes_every_medium() {
    let index = Index::new();
    let src = index.register_source(&spec("p.ns", 0)).unwrap();
    index
        .apply(
            src,
            &batch(vec![
                stored(&[1], tokens(0, 1), "GPU"),
                stored(&[1], vec![], "CPU"),
            ]),
            1,
            &mut Discard,
        )
        .unwrap();
    index
        .apply(src, &batch(vec![removed(&[1], "")]), 2, &mut Discard)
        .unwrap();
    assert!(index.dump().is_empty());
}

#[test]
fn tokenless_store_of_unknown_hash_is_counted_unresolved() {
    let index = Index::new();
    let src = index.register_source(&spec("p.ns", 0)).unwrap();
    let stats = index
        .apply(
            src,
            &batch(vec![stored(&[42], vec![], "CPU")]),
            1,
            &mut Discard,
        )
        .unwrap();
    assert_eq!(stats.unresolved_stores, 1);
    assert!(index.dump().is_empty());
}

#[test]
fn one_std_block_through_two_engine_hashes_survives_one_removal() {
    let index = Index::new();
    let src = index.register_source(&spec("p.ns", 0)).unwrap();
    let std = std_hash(&tokens(0, 1));
    // Same 16 tokens stored under two engine hashes (different prefixes).
    let stats = index
        .apply(
            src,
            &batch(vec![
                stored(&[1], tokens(0, 1), "GPU"),
                stored(&[2], tokens(0, 1), "GPU"),
            ]),
            1,
            &mut Discard,
        )
        .unwrap();
    assert_eq!(stats.duplicate_engine_hashes, 1);
    index
        .apply(src, &batch(vec![removed(&[1], "GPU")]), 2, &mut Discard)
        .unwrap();
    assert_eq!(media_of(&index, std, "p.ns"), ["GPU"]);
    index
        .apply(src, &batch(vec![removed(&[2], "GPU")]), 3, &mut Discard)
        .unwrap();
    assert!(index.dump().is_empty());
}

#[test]
fn duplicate_copies_track_media_per_engine_block() {
    let index = Index::new();
    let src = index.register_source(&spec("p.ns", 0)).unwrap();
    let std = std_hash(&tokens(0, 1));
    index
        .apply(
            src,
            &batch(vec![
                stored(&[1], tokens(0, 1), "GPU"),
                stored(&[2], tokens(0, 1), "GPU"),
                stored(&[2], vec![], "CPU"),
            ]),
            1,
            &mut Discard,
        )
        .unwrap();
    index
        .apply(src, &batch(vec![removed(&[2], "GPU")]), 2, &mut Discard)
        .unwrap();
    // Engine block 1 still holds GPU; engine block 2 holds CPU.
    assert_eq!(media_of(&index, std, "p.ns"), ["CPU", "GPU"]);
    index
        .apply(src, &batch(vec![removed(&[1], "GPU")]), 3, &mut Discard)
        .unwrap();
    assert_eq!(media_of(&index, std, "p.ns"), ["CPU"]);
}

#[test]
fn clear_touches_only_its_source_and_ranks_union() {
    let index = Index::new();
    let a0 = index.register_source(&spec("a.ns", 0)).unwrap();
    let a1 = index.register_source(&spec("a.ns", 1)).unwrap();
    let b = index.register_source(&spec("b.ns", 0)).unwrap();
    let ev = || batch(vec![stored(&[1], tokens(0, 1), "GPU")]);
    index.apply(a0, &ev(), 1, &mut Discard).unwrap();
    index.apply(a1, &ev(), 2, &mut Discard).unwrap();
    index.apply(b, &ev(), 3, &mut Discard).unwrap();
    assert_eq!(index.dump().len(), 2);
    let mut deltas = Vec::new();
    index
        .apply(a0, &batch(vec![Event::AllBlocksCleared]), 4, &mut deltas)
        .unwrap();
    // Rank 1 still holds the block: the pod-level field stays (its time is rank 1's).
    assert_eq!(index.dump().len(), 2);
    assert!(deltas
        .iter()
        .any(|d| matches!(d, Delta::Mapping { std_hash: None, .. })));
    index.forget_pod("a.ns", &mut Discard);
    let dump = index.dump();
    assert_eq!(dump.len(), 1);
    assert_eq!(dump[0].pod, "b.ns");
}

#[test]
fn deltas_describe_field_changes_in_order() {
    let index = Index::new();
    let src = index.register_source(&spec("p.ns", 0)).unwrap();
    let std = std_hash(&tokens(0, 1));
    let mut deltas = Vec::new();
    index
        .apply(
            src,
            &batch(vec![
                stored(&[-5], tokens(0, 1), "GPU"),
                removed(&[-5], "GPU"),
            ]),
            7,
            &mut deltas,
        )
        .unwrap();
    let fields: Vec<_> = deltas
        .iter()
        .filter_map(|d| match d {
            Delta::Field {
                std_hash, value, ..
            } => Some((*std_hash, value.map(|v| v.stored_at))),
            _ => None,
        })
        .collect();
    assert_eq!(fields, vec![(std, Some(7)), (std, None)]);
    let mappings: Vec<_> = deltas
        .iter()
        .filter_map(|d| match d {
            Delta::Mapping {
                engine_hash,
                std_hash,
                ..
            } => Some((engine_hash.to_string(), *std_hash)),
            _ => None,
        })
        .collect();
    assert_eq!(
        mappings,
        vec![("-5".to_owned(), Some(std)), ("-5".to_owned(), None)]
    );
}

#[test]
fn signed_and_unsigned_hashes_with_the_same_bits_stay_distinct() {
    let index = Index::new();
    let src = index.register_source(&spec("p.ns", 0)).unwrap();
    index
        .apply(
            src,
            &batch(vec![stored(&[-1], tokens(0, 1), "GPU")]),
            1,
            &mut Discard,
        )
        .unwrap();
    let unsigned = Event::BlockRemoved(BlockRemoved::new(
        vec![BlockHash::Int(u64::MAX)],
        Medium::GPU,
    ));
    let stats = index
        .apply(src, &batch(vec![unsigned]), 2, &mut Discard)
        .unwrap();
    assert_eq!(stats.unknown_removes, 1);
    assert_eq!(index.dump().len(), 1);
}

#[test]
fn non_main_groups_are_skipped() {
    let index = Index::new();
    let src = index.register_source(&spec("p.ns", 0)).unwrap();
    let Event::BlockStored(mut s) = stored(&[1], tokens(0, 1), "GPU") else {
        unreachable!()
    };
    s.group_idx = Some(1);
    s.kv_cache_spec_kind = Some("sliding_window".into());
    let stats = index
        .apply(src, &batch(vec![Event::BlockStored(s)]), 1, &mut Discard)
        .unwrap();
    assert_eq!(stats.skipped_group_blocks, 1);
    assert!(index.dump().is_empty());
}

#[test]
fn lora_blocks_belong_to_the_adapter_model() {
    let index = Index::new();
    let src = index.register_source(&spec("p.ns", 0)).unwrap();
    let Event::BlockStored(mut s) = stored(&[1], tokens(0, 1), "GPU") else {
        unreachable!()
    };
    s.lora_name = Some("sql-adapter".into());
    index
        .apply(src, &batch(vec![Event::BlockStored(s)]), 1, &mut Discard)
        .unwrap();
    assert_eq!(index.dump()[0].model, "sql-adapter");
    index
        .apply(src, &batch(vec![removed(&[1], "GPU")]), 2, &mut Discard)
        .unwrap();
    assert!(index.dump().is_empty());
}

#[test]
fn entry_counts_follow_field_changes_without_a_walk() {
    let index = Index::new();
    let a = index.register_source(&spec("a.ns", 0)).unwrap();
    let b = index.register_source(&spec("b.ns", 0)).unwrap();
    index
        .apply(
            a,
            &batch(vec![stored(&[1, 2], tokens(0, 2), "GPU")]),
            1,
            &mut Discard,
        )
        .unwrap();
    index
        .apply(
            b,
            &batch(vec![
                stored(&[1], tokens(0, 1), "GPU"),
                stored(&[1], vec![], "CPU"),
            ]),
            1,
            &mut Discard,
        )
        .unwrap();
    let (total, per_medium) = index.entry_counts();
    assert_eq!(total, 3);
    assert!(per_medium.contains(&("GPU", 3)));
    assert!(per_medium.contains(&("CPU", 1)));
    let (pod_a, pod_b) = (index.pod_id("a.ns").unwrap(), index.pod_id("b.ns").unwrap());
    assert_eq!(index.pod_entry_counts(pod_a), (2, vec![("GPU", 2)]));
    let (total_b, mut media_b) = index.pod_entry_counts(pod_b);
    media_b.sort_unstable();
    assert_eq!((total_b, media_b), (1, vec![("CPU", 1), ("GPU", 1)]));
    index.forget_pod("b.ns", &mut Discard);
    assert_eq!(index.pod_entry_counts(pod_b), (0, vec![]));
    index
        .apply(a, &batch(vec![removed(&[2], "GPU")]), 2, &mut Discard)
        .unwrap();
    assert_eq!(index.entry_counts(), (1, vec![("GPU", 1)]));
    assert_eq!(index.pod_entry_counts(pod_a), (1, vec![("GPU", 1)]));
    assert_eq!(index.stats().entries, 1);
}

/// A store of `hashes` under LoRA `name`.
fn lora_stored(hashes: &[i64], start: u32, name: &str) -> Event {
    let mut event = stored(hashes, tokens(start, hashes.len() as u32), "GPU");
    if let Event::BlockStored(s) = &mut event {
        s.lora_name = Some(name.to_owned());
    }
    event
}

/// A LoRA name must not keep its block map and name forever.
#[test]
fn a_lora_whose_last_block_leaves_is_freed() {
    let index = Index::new();
    let src = index.register_source(&spec("p.ns", 0)).unwrap();
    let mut deltas: Vec<Delta> = Vec::new();
    for i in 0..500i64 {
        let event = lora_stored(&[i], i as u32 * 16, &format!("lora-{i}"));
        index
            .apply(src, &batch(vec![event]), 10, &mut deltas)
            .unwrap();
    }
    assert_eq!(index.live_models(), 501);
    let lora = index.model_id("lora-7").unwrap();
    let removes: Vec<i64> = (0..500).collect();
    index
        .apply(src, &batch(vec![removed(&removes, "GPU")]), 11, &mut deltas)
        .unwrap();
    assert!(index.dump().is_empty());
    assert_eq!(index.live_models(), 1, "only the base model stays");
    assert_eq!(index.model_id("lora-7"), None);
    // A mirror resolving the last deltas a little later still gets the right name.
    assert_eq!(&*index.model_name(lora), "lora-7");
    // The name comes back with a new id.
    let event = lora_stored(&[1], 16, "lora-7");
    index
        .apply(src, &batch(vec![event]), 12, &mut deltas)
        .unwrap();
    assert_ne!(index.model_id("lora-7"), Some(lora));
    assert_eq!(index.dump()[0].model, "lora-7");
    // Removing the source frees everything, its base model too.
    index.remove_source(src, &mut deltas).unwrap();
    assert_eq!(index.live_models(), 0);
}

/// An index nobody reads deltas from keeps no name of a freed model, so LoRA names
/// that come and go leave nothing behind; one with a mirror keeps only the last few.
#[test]
fn freed_model_names_are_kept_only_as_many_as_asked() {
    for kept in [0, 3] {
        let index = Index::with_options(crate::index::IndexOptions {
            freed_model_names: kept,
            ..crate::index::IndexOptions::default()
        });
        let src = index.register_source(&spec("p.ns", 0)).unwrap();
        let mut ids = Vec::new();
        for i in 0..10i64 {
            let name = format!("lora-{i}");
            let event = lora_stored(&[i], i as u32 * 16, &name);
            index
                .apply(src, &batch(vec![event]), 1, &mut Discard)
                .unwrap();
            ids.push(index.model_id(&name).unwrap());
            let gone = removed(&[i], "GPU");
            index
                .apply(src, &batch(vec![gone]), 2, &mut Discard)
                .unwrap();
        }
        assert_eq!(index.live_models(), 1, "only the base model stays");
        let resolvable: Vec<bool> = ids
            .iter()
            .map(|id| !index.model_name(*id).is_empty())
            .collect();
        let expected: Vec<bool> = (0..10).map(|i| i >= 10 - kept).collect();
        assert_eq!(resolvable, expected, "kept {kept}");
    }
}

#[test]
fn loras_past_the_cap_are_dropped_and_counted_until_one_leaves() {
    let index = Index::with_max_models_per_source(3);
    let src = index.register_source(&spec("p.ns", 0)).unwrap();
    let other = index.register_source(&spec("q.ns", 0)).unwrap();
    let apply = |source, event| index.apply(source, &batch(vec![event]), 10, &mut Discard);
    apply(src, stored(&[1], tokens(0, 1), "GPU")).unwrap();
    for (i, name) in ["a", "b"].iter().enumerate() {
        let stats = apply(src, lora_stored(&[10 + i as i64], 0, name)).unwrap();
        assert_eq!(stats.too_many_models, 0);
    }
    let stats = apply(src, lora_stored(&[20], 0, "c")).unwrap();
    assert_eq!((stats.too_many_models, stats.blocks_stored), (1, 0));
    // The cap is per source: another source still takes `c`.
    let stats = apply(other, lora_stored(&[20], 0, "c")).unwrap();
    assert_eq!((stats.too_many_models, stats.blocks_stored), (0, 1));
    // Known models keep being accepted; once `a` leaves, `c` fits.
    let stats = apply(src, lora_stored(&[11], 16, "b")).unwrap();
    assert_eq!(stats.too_many_models, 0);
    apply(src, removed(&[10], "GPU")).unwrap();
    let stats = apply(src, lora_stored(&[20], 0, "c")).unwrap();
    assert_eq!((stats.too_many_models, stats.blocks_stored), (0, 1));
}

/// An engine hash names one block of a source whatever the model: storing it under another
/// LoRA moves it (the reference model of the proptests says the same).
#[test]
fn a_hash_stored_under_another_lora_moves_to_it() {
    let index = Index::new();
    let src = index.register_source(&spec("p.ns", 0)).unwrap();
    let apply = |event| index.apply(src, &batch(vec![event]), 10, &mut Discard);
    apply(lora_stored(&[5], 0, "a")).unwrap();
    apply(lora_stored(&[5], 0, "b")).unwrap();
    let models: Vec<String> = index.dump().into_iter().map(|e| e.model).collect();
    assert_eq!(models, ["b"]);
    apply(removed(&[5], "GPU")).unwrap();
    assert!(index.dump().is_empty());
    assert_eq!(index.live_models(), 1);
}

/// Found by fuzzing (`decode_apply`): a hash that moved to another LoRA left its checkpoint
/// entry under the old model behind.
#[test]
fn checkpoint_deltas_follow_a_hash_across_loras() {
    let index = Index::new();
    let src = index.register_source(&spec("p.ns", 0)).unwrap();
    let mut deltas: Vec<Delta> = Vec::new();
    for event in [
        lora_stored(&[5], 0, "a"),
        lora_stored(&[5], 0, "b"),
        lora_stored(&[6], 0, "a"),
    ] {
        index
            .apply(src, &batch(vec![event]), 10, &mut deltas)
            .unwrap();
    }
    let mut entries = std::collections::BTreeMap::new();
    for delta in deltas {
        if let Delta::Engine {
            model,
            engine_hash,
            state,
            ..
        } = delta
        {
            match state {
                Some(s) => entries.insert((model, engine_hash.to_string()), s.std_hash),
                None => entries.remove(&(model, engine_hash.to_string())),
            };
        }
    }
    let mut held = std::collections::BTreeMap::new();
    index.for_each_engine_state(|_, _, model, hash, s| {
        held.insert((model, hash.to_string()), s.std_hash);
    });
    assert_eq!(entries, held);
    assert_eq!(held.len(), 2);
}

#[test]
fn the_chain_runs_give_their_memory_back_after_the_blocks_leave() {
    let index = Index::new();
    let src = index.register_source(&spec("p.ns", 0)).unwrap();
    let hashes: Vec<i64> = (1..=4096).collect();
    let store = stored(&hashes, tokens(0, 4096), "GPU");
    index
        .apply(src, &batch(vec![store]), 10, &mut Discard)
        .unwrap();
    assert_eq!(index.chain_entries(), 4096);
    let peak = index.inner.chains.read().capacity();
    assert!(peak >= 4096);
    let remove = removed(&hashes, "");
    index
        .apply(src, &batch(vec![remove]), 11, &mut Discard)
        .unwrap();
    assert_eq!(index.chain_entries(), 0);
    assert!(
        index.inner.chains.read().capacity() < peak / 4,
        "chain runs kept their peak"
    );
}

#[test]
fn a_source_clear_takes_its_chain_blocks_and_keeps_the_other_sources() {
    let index = Index::new();
    let a = index.register_source(&spec("a.ns", 0)).unwrap();
    let b = index.register_source(&spec("b.ns", 0)).unwrap();
    for src in [a, b] {
        let store = stored(&[1, 2, 3], tokens(0, 3), "GPU");
        index
            .apply(src, &batch(vec![store]), 10, &mut Discard)
            .unwrap();
    }
    assert_eq!(index.chain_entries(), 6);
    index.clear_source(a, &mut Discard).unwrap();
    assert_eq!(index.chain_entries(), 3);
    index.forget_pod("b.ns", &mut Discard);
    assert_eq!(index.chain_entries(), 0);
}

#[test]
fn a_slot_moves_between_spot_and_whole_as_its_chain_is_learnt_and_reads_back_the_same() {
    use crate::hash::{chain_hash, model_seed};
    let index = Index::new();
    let src = index.register_source(&spec("p.ns", 0)).unwrap();
    let kinds = || index.source(src).unwrap().lock().slot_kinds();
    let chain1 = chain_hash(model_seed("m"), &tokens(0, 1));
    let chain2 = chain_hash(chain1, &tokens(16, 1));
    // A chain from the model's seed: both blocks are spots in one run.
    let first = stored(&[1, -2], tokens(0, 2), "GPU");
    index
        .apply(src, &batch(vec![first]), 10, &mut Discard)
        .unwrap();
    assert_eq!(kinds(), (2, 0));
    // A block after a parent the source does not hold has no chain: kept whole.
    let mut orphan = BlockStored::new(vec![BlockHash::Int(3)], tokens(32, 1), 16, Medium::GPU);
    orphan.parent_block_hash = Some(BlockHash::Int(99));
    let orphan = Event::BlockStored(orphan);
    index
        .apply(src, &batch(vec![orphan]), 11, &mut Discard)
        .unwrap();
    assert_eq!(kinds(), (2, 1));
    // Stored again after block -2, it learns its chain and becomes a spot.
    let mut again = BlockStored::new(
        vec![BlockHash::Int(3)],
        tokens(32, 1),
        16,
        Medium::intern("CPU"),
    );
    again.parent_block_hash = Some(BlockHash::Neg(-2));
    index
        .apply(
            src,
            &batch(vec![Event::BlockStored(again)]),
            12,
            &mut Discard,
        )
        .unwrap();
    assert_eq!(kinds(), (3, 0));
    let chain3 = chain_hash(chain2, &tokens(32, 1));
    let mut states: Vec<(String, u64, u64, usize)> = Vec::new();
    index.for_each_engine_state(|_, _, _, hash, state| {
        let media = state.media.iter().count();
        states.push((hash.to_string(), state.std_hash, state.chain, media));
    });
    states.sort();
    let want = |h: &str, t: u32, chain: u64, media: usize| {
        (h.to_owned(), std_hash(&tokens(t, 1)), chain, media)
    };
    assert_eq!(
        states,
        [
            want("-2", 16, chain2, 1),
            want("1", 0, chain1, 1),
            want("3", 32, chain3, 2)
        ]
    );
    assert_eq!(
        index.pod_engine_std(PodId(0), &BlockHash::Neg(-2)),
        Some(std_hash(&tokens(16, 1)))
    );
    assert_eq!(
        index.pod_engine_std(PodId(0), &BlockHash::Int(2)),
        None,
        "the sign is kept"
    );
    // Removes and the clear leave no slot of either kind.
    index
        .apply(src, &batch(vec![removed(&[1], "GPU")]), 13, &mut Discard)
        .unwrap();
    assert_eq!(kinds(), (2, 0));
    index
        .apply(src, &batch(vec![Event::AllBlocksCleared]), 14, &mut Discard)
        .unwrap();
    assert_eq!(kinds(), (0, 0));
    assert_eq!(index.stats().engine_hashes, 0);
}

#[test]
fn blocks_on_more_media_sets_than_a_slot_names_are_kept_whole_and_read_back_the_same() {
    // Ten blocks, each on its own medium: a run slot names eight media sets per source.
    let media = [
        "GPU",
        "CPU_PINNED",
        "DISK",
        "OBJ",
        "CPU",
        "FS",
        "EXTERNAL",
        "STORAGE",
        "CPU_TIER2",
        "CPU_TIER1",
    ];
    let index = Index::new();
    let src = index.register_source(&spec("p.ns", 0)).unwrap();
    let kinds = || index.source(src).unwrap().lock().slot_kinds();
    let std_of = |i: usize| std_hash(&tokens(16 * i as u32, 1));
    for (i, medium) in media.iter().enumerate() {
        let store = stored(&[i as i64 + 1], tokens(16 * i as u32, 1), medium);
        index
            .apply(src, &batch(vec![store]), 10, &mut Discard)
            .unwrap();
    }
    assert_eq!(kinds(), (8, 2));
    for (i, medium) in media.iter().enumerate() {
        assert_eq!(media_of(&index, std_of(i), "p.ns"), [*medium], "block {i}");
    }
    // Block 1 also on CPU: a ninth set, so its slot goes whole and keeps both media.
    let again = stored(&[1], vec![], "CPU");
    index
        .apply(src, &batch(vec![again]), 11, &mut Discard)
        .unwrap();
    assert_eq!(kinds(), (7, 3));
    assert_eq!(media_of(&index, std_of(0), "p.ns"), ["CPU", "GPU"]);
    let off_gpu = removed(&[1], "GPU");
    index
        .apply(src, &batch(vec![off_gpu]), 12, &mut Discard)
        .unwrap();
    assert_eq!(media_of(&index, std_of(0), "p.ns"), ["CPU"]);
    // Block 2 also on GPU: likewise whole, and it stays whole back on one medium.
    let moved = stored(&[2], vec![], "GPU");
    index
        .apply(src, &batch(vec![moved]), 13, &mut Discard)
        .unwrap();
    let off_pinned = removed(&[2], "CPU_PINNED");
    index
        .apply(src, &batch(vec![off_pinned]), 14, &mut Discard)
        .unwrap();
    assert_eq!(kinds(), (6, 4));
    assert_eq!(media_of(&index, std_of(1), "p.ns"), ["GPU"]);
    // Each block goes with a remove of what it is on.
    let mut left = vec![removed(&[1], "CPU"), removed(&[2], "GPU")];
    left.extend((2..media.len()).map(|i| removed(&[i as i64 + 1], media[i])));
    index.apply(src, &batch(left), 15, &mut Discard).unwrap();
    assert!(index.dump().is_empty());
    assert_eq!(index.stats().engine_hashes, 0);
    assert_eq!(kinds(), (0, 0));
}

#[test]
fn a_clear_edits_the_std_blocks_with_the_chain_runs_unlocked() {
    /// Records, per field delta, whether a query could read the chain runs then.
    struct Probe {
        index: Index,
        runs_free: Vec<bool>,
    }
    impl DeltaSink for Probe {
        fn push(&mut self, delta: Delta) {
            if let Delta::Field { .. } = delta {
                let free = self.index.inner.chains.try_read().is_some();
                self.runs_free.push(free);
            }
        }
    }
    let index = Index::new();
    let src = index.register_source(&spec("p.ns", 0)).unwrap();
    let store = stored(&[1, 2, 3], tokens(0, 3), "GPU");
    index
        .apply(src, &batch(vec![store]), 10, &mut Discard)
        .unwrap();
    let mut probe = Probe {
        index: index.clone(),
        runs_free: Vec::new(),
    };
    let clear = batch(vec![Event::AllBlocksCleared]);
    index.apply(src, &clear, 11, &mut probe).unwrap();
    assert_eq!(
        probe.runs_free, [true; 3],
        "a field delta per block, none under the lock"
    );
    assert!(index.dump().is_empty());
    assert_eq!(index.chain_entries(), 0);
}

#[test]
fn a_departed_source_leaves_its_counts_with_its_pod() {
    // Rank 0 counts block 1 (the pod's field appears); rank 1 then holds it too, rank 0
    // lets go (the field stays: no change), and rank 1 counts block 2. Rank 0's count is
    // the pod's block 1, so it must outlive rank 0's registration.
    let index = Index::new();
    let r0 = index.register_source(&spec("p.ns", 0)).unwrap();
    let r1 = index.register_source(&spec("p.ns", 1)).unwrap();
    let apply = |src, events| index.apply(src, &batch(events), 1, &mut Discard).unwrap();
    apply(r0, vec![stored(&[1], tokens(0, 1), "GPU")]);
    apply(r1, vec![stored(&[1], tokens(0, 1), "GPU")]);
    apply(r0, vec![removed(&[1], "GPU")]);
    apply(r1, vec![stored(&[2], tokens(16, 1), "GPU")]);
    let pod = index.pod_id("p.ns").unwrap();
    assert_eq!(index.pod_entry_counts(pod), (2, vec![("GPU", 2)]));
    index.remove_source(r0, &mut Discard).unwrap();
    assert_eq!(index.pod_entry_counts(pod), (2, vec![("GPU", 2)]));
    assert_eq!(index.entry_counts(), (2, vec![("GPU", 2)]));
    index.remove_source(r1, &mut Discard).unwrap();
    assert_eq!(index.pod_entry_counts(pod), (0, vec![]));
    assert_eq!(index.entry_counts(), (0, vec![]));
}

#[test]
fn a_block_after_one_that_kept_its_verified_chain_follows_that_chain() {
    use crate::hash::{chain_hash, model_seed};
    let index = Index::new();
    let src = index.register_source(&spec("p.ns", 0)).unwrap();
    let first = stored(&[1], tokens(0, 1), "GPU");
    index
        .apply(src, &batch(vec![first]), 10, &mut Discard)
        .unwrap();
    // Block 1 again, now after a parent the source does not know, with block 2 after it:
    // block 1 keeps the chain it was verified with, and block 2 is chained after that.
    let mut both = BlockStored::new(
        vec![BlockHash::Int(1), BlockHash::Int(2)],
        tokens(0, 2),
        16,
        Medium::GPU,
    );
    both.parent_block_hash = Some(BlockHash::Int(99));
    let both = Event::BlockStored(both);
    index
        .apply(src, &batch(vec![both]), 11, &mut Discard)
        .unwrap();
    let chain1 = chain_hash(model_seed("m"), &tokens(0, 1));
    let mut chains = Vec::new();
    index
        .for_each_engine_state(|_, _, _, hash, state| chains.push((hash.to_string(), state.chain)));
    chains.sort();
    let chain2 = chain_hash(chain1, &tokens(16, 1));
    assert_eq!(chains, [("1".to_owned(), chain1), ("2".to_owned(), chain2)]);
}

#[test]
fn a_prompt_is_answered_from_a_chain_start_and_the_starts_follow_the_runs() {
    use crate::hash::{chain_hash, model_seed};
    let index = Index::new();
    let a = index.register_source(&spec("a.ns", 0)).unwrap();
    let b = index.register_source(&spec("b.ns", 0)).unwrap();
    let chain1 = chain_hash(model_seed("m"), &tokens(0, 1));
    let chain2 = chain_hash(chain1, &tokens(16, 1));
    let first = stored(&[1, 2], tokens(0, 2), "GPU");
    index
        .apply(a, &batch(vec![first]), 10, &mut Discard)
        .unwrap();
    let starts = || {
        let layer = index.chain_layer();
        [chain1, chain2, 77].map(|chain| (layer.contains(chain), layer.holds_first(chain)))
    };
    // Block 2 is held, but a prompt cannot start with it: it is no chain start.
    assert_eq!(starts(), [(true, true), (true, false), (false, false)]);
    // A block restored from a checkpoint has no known parent: it may be a start.
    let restored = EngineState {
        std_hash: 5,
        media: crate::medium::MediaSet::single(Medium::GPU),
        stored_at: 9,
        chain: 77,
        parent: 0,
    };
    index
        .restore_block(b, "m", &BlockHash::Int(7), restored)
        .unwrap();
    assert_eq!(starts(), [(true, true), (true, false), (true, true)]);
    // An entry without a medium restores nothing, and is not counted as restored.
    let empty = EngineState {
        media: crate::medium::MediaSet::EMPTY,
        chain: 78,
        ..restored
    };
    let restored_none = index.restore_blocks(b, "m", &[(BlockHash::Int(8), empty)]);
    assert_eq!(restored_none, Ok(0));
    assert!(index.chain_parent(78) == 0 && index.chain_entries() == 3);
    // Blocks that leave the runs leave the starts.
    let gone = [removed(&[1, 2], "GPU")];
    index
        .apply(a, &batch(gone.to_vec()), 11, &mut Discard)
        .unwrap();
    index.clear_source(b, &mut Discard).unwrap();
    assert_eq!(starts(), [(false, false); 3]);
    assert_eq!(index.chain_entries(), 0);
}

#[test]
fn runs_know_which_pods_have_several_ranks() {
    let index = Index::new();
    let a0 = index.register_source(&spec("pod-a.ns", 0)).unwrap();
    index.register_source(&spec("pod-b.ns", 0)).unwrap();
    let (pod_a, pod_b) = (
        index.inner.pods.get("pod-a.ns"),
        index.inner.pods.get("pod-b.ns"),
    );
    let (pod_a, pod_b) = (pod_a.unwrap(), pod_b.unwrap());
    let sole = |pod| index.inner.chains.read().sole_rank(pod);
    assert!(sole(pod_a) && sole(pod_b));
    let a1 = index.register_source(&spec("pod-a.ns", 1)).unwrap();
    // Registering a rank again changes nothing.
    index.register_source(&spec("pod-a.ns", 1)).unwrap();
    assert!(!sole(pod_a) && sole(pod_b));
    index.remove_source(a0, &mut Discard).unwrap();
    assert!(sole(pod_a));
    index.remove_source(a1, &mut Discard).unwrap();
    assert!(sole(pod_a) && sole(pod_b));
}

#[test]
fn a_warm_start_restores_chains_as_runs_with_their_parents() {
    use crate::hash::{chain_hash, model_seed};
    let after_block = |parent: i64, hashes: &[i64], first: u32| {
        let Event::BlockStored(mut event) =
            stored(hashes, tokens(first, hashes.len() as u32), "GPU")
        else {
            unreachable!("a store")
        };
        event.parent_block_hash = Some(BlockHash::from_i64(parent));
        Event::BlockStored(event)
    };
    let index = Index::new();
    let a = index.register_source(&spec("a.ns", 0)).unwrap();
    let b = index.register_source(&spec("b.ns", 0)).unwrap();
    let events = vec![
        stored(&[1, 2, 3, 4, 5, 6, 7, 8], tokens(0, 8), "GPU"),
        after_block(8, &[9, 10, 11, 12], 128),
        // A fork from the middle of the first run.
        after_block(4, &[20, 21, 22, 23], 1_000),
        // A tier copy without tokens, then its GPU copy goes: the entry is written again.
        stored(&[12], vec![], "CPU"),
        removed(&[12], "GPU"),
    ];
    index.apply(a, &batch(events), 10, &mut Discard).unwrap();
    let shared = stored(&[1, 2, 3, 4], tokens(0, 4), "GPU");
    index
        .apply(b, &batch(vec![shared]), 11, &mut Discard)
        .unwrap();

    let states = |index: &Index| {
        let mut all = Vec::new();
        index.for_each_engine_state(|pod, rank, _, hash, state| {
            all.push((
                index.pod_name(pod).to_string(),
                rank,
                hash.to_string(),
                state,
            ));
        });
        all.sort_by(|x, y| (&x.0, &x.2).cmp(&(&y.0, &y.2)));
        all
    };
    let before = states(&index);
    let parent_of = |pod: &str, hash: &str| {
        let found = before.iter().find(|(p, _, h, _)| p == pod && h == hash);
        found.map(|(_, _, _, state)| state.parent)
    };
    let chain1 = chain_hash(model_seed("m"), &tokens(0, 1));
    let chain_of = |pod: &str, hash: &str| {
        let found = before.iter().find(|(p, _, h, _)| p == pod && h == hash);
        found.map(|(_, _, _, state)| state.chain)
    };
    assert_eq!(chain_of("a.ns", "1"), Some(chain1));
    // A start has no parent; a block after its parent, a fork's first block and a block
    // whose entry a remove wrote again know theirs.
    assert_eq!(parent_of("a.ns", "1"), Some(0));
    assert_eq!(parent_of("a.ns", "2"), chain_of("a.ns", "1"));
    assert_eq!(parent_of("a.ns", "9"), chain_of("a.ns", "8"));
    assert_eq!(parent_of("a.ns", "20"), chain_of("a.ns", "4"));
    assert_eq!(parent_of("a.ns", "12"), chain_of("a.ns", "11"));
    let runs = index.stats().chain_runs;
    assert_eq!(
        runs, 2,
        "the chain's run, which its second event extends, and the fork's"
    );
    // A rewrite writes the checkpoint from its walk, with the parents the runs give.
    let mut walked = Vec::new();
    let mut cursor = WalkCursor::new();
    while !cursor.is_done() {
        index.walk_engine_hashes(&mut cursor, &mut walked);
    }
    assert_eq!(walked.len(), before.len());
    for entry in &walked {
        let pod = index.pod_name(entry.pod);
        let hash = entry.engine_hash.to_string();
        let parent = index.chain_parent(entry.chain);
        assert_eq!(Some(parent), parent_of(&pod, &hash), "{pod} {hash}");
    }

    // Restored children first (a checkpoint is read in no order): the engine hashes
    // grow along every chain here.
    let restore = |whole: bool| {
        let fresh = Index::new();
        for (pod, _, _, _) in &before {
            fresh.register_source(&spec(pod, 0)).unwrap();
        }
        for pod in ["a.ns", "b.ns"] {
            let source = fresh.source_of(fresh.pod_id(pod).unwrap(), 0).unwrap();
            let mut blocks: Vec<(i64, EngineState)> = (before.iter())
                .filter(|(p, ..)| p == pod)
                .map(|(_, _, hash, state)| (hash.parse().unwrap(), *state))
                .collect();
            blocks.sort_by_key(|(hash, _)| std::cmp::Reverse(*hash));
            let blocks: Vec<(BlockHash, EngineState)> = (blocks.into_iter())
                .map(|(hash, state)| (BlockHash::from_i64(hash), state))
                .collect();
            if whole {
                assert_eq!(fresh.restore_blocks(source, "m", &blocks), Ok(blocks.len()));
            } else {
                for (hash, state) in &blocks {
                    fresh.restore_block(source, "m", hash, *state).unwrap();
                }
            }
        }
        fresh
    };
    let restored = restore(true);
    assert_eq!(states(&restored), before);
    assert_eq!(restored.stats().chain_runs, runs);
    // One by one, children first, no block finds its parent placed: every block is a
    // start, and the runs know no parent to write back.
    let scattered = states(&restore(false));
    assert_eq!(scattered.len(), before.len());
    assert!(scattered.iter().all(|(.., state)| state.parent == 0));
}

/// kthena's std hash of a prompt's blocks as the index stored them: every block it holds is
/// answered, with the std hash of that block's own tokens, along a chain, through a fork
/// and after removals; blocks it does not hold are not; a `prefix`-only index answers none.
#[test]
fn stored_std_hashes_are_the_prompts_blocks_own() {
    let index = Index::new();
    let a = index.register_source(&spec("a.ns", 0)).unwrap();
    let b = index.register_source(&spec("b.ns", 0)).unwrap();
    let fork = [tokens(0, 2), tokens(1_000, 1)].concat();
    let events = [
        (a, stored(&[1, 2, 3, 4], tokens(0, 4), "GPU")),
        (b, stored(&[11, 12, 13], fork.clone(), "GPU")),
    ];
    for (source, event) in events {
        index
            .apply(source, &batch(vec![event]), 10, &mut Discard)
            .unwrap();
    }
    let answers = |prompt: &[u32]| {
        let chains = crate::hash::prompt_chain_hashes("m", prompt, 16, 128);
        let stored = index.stored_std_hashes(&chains);
        assert_eq!(stored.len(), chains.len());
        for (i, (block, std)) in prompt.chunks(16).zip(&stored).enumerate() {
            if let Some(std) = std {
                assert_eq!(*std, std_hash(block), "block {i}");
            }
        }
        stored.iter().map(Option::is_some).collect::<Vec<_>>()
    };
    assert_eq!(answers(&tokens(0, 4)), [true; 4]);
    let beyond = [fork.clone(), tokens(5_000, 1), vec![7, 8, 9]].concat();
    assert_eq!(answers(&beyond), [true, true, true, false, false]);
    // The same content after another prefix is another chain block.
    assert_eq!(
        answers(&[tokens(1_000, 1), tokens(16, 1)].concat()),
        [false, false]
    );
    index
        .apply(a, &batch(vec![removed(&[3, 4], "GPU")]), 11, &mut Discard)
        .unwrap();
    assert_eq!(answers(&tokens(0, 4))[..2], [true, true]);

    let lean = Index::with_options(IndexOptions {
        std_layer: false,
        ..IndexOptions::default()
    });
    let a = lean.register_source(&spec("a.ns", 0)).unwrap();
    lean.apply(
        a,
        &batch(vec![stored(&[1, 2], tokens(0, 2), "GPU")]),
        10,
        &mut Discard,
    )
    .unwrap();
    let chains = crate::hash::prompt_chain_hashes("m", &tokens(0, 2), 16, 128);
    assert_eq!(lean.stored_std_hashes(&chains), [None, None]);
}

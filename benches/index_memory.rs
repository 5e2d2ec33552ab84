//! Index memory per resident (block, pod) entry, measured with a counting global allocator.
//!
//! Each case registers its sources, then stores blocks of 16 tokens (one block per
//! `BlockStored`, int engine hashes above and below 2^63, medium "GPU") until the index holds
//! the target number of resident (block, pod) entries. Batches are dropped after they are
//! applied, so the live-heap growth is the index alone: the per-model block tables, every
//! block's resident list and every source's engine-hash map (the map `BlockRemoved` resolves
//! through). hashbrown tables double at powers of two, so several sizes are reported; the
//! "8 pods" cases store every block on 8 pods (shared prefixes, one list of 8 residents).
//! Goal: ≤ 32 bytes per entry at 1 M entries. Each case runs
//! twice: with kthena's std layer (the default) and `prefix`-only (`IndexOptions::std_layer`
//! false: no std map, no SHA-256).
//!
//! Run: `cargo bench --bench index_memory` (prints a table; takes a few seconds).

// The binary's allocator, included by path: it is private to the binary.
#[allow(dead_code)]
#[path = "../src/allocator.rs"]
mod allocator;

use std::sync::atomic::Ordering;

use kvindex::index::{Discard, Index, IndexOptions, SourceSpec};
use kvindex::medium::Medium;
use kvindex::wire::{BlockHash, BlockStored, Engine, EngineBatch, Event};

#[path = "common/counting_alloc.rs"]
mod counting_alloc;

use counting_alloc::LIVE;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

const BLOCK_SIZE: u32 = 16;
const EVENTS_PER_BATCH: usize = 512;

/// One case: `pods` sources each holding the same `blocks` blocks.
fn measure(blocks: usize, pods: usize, std_layer: bool) -> (usize, f64, usize) {
    let index = Index::with_options(IndexOptions {
        std_layer,
        ..IndexOptions::default()
    });
    let sources: Vec<_> = (0..pods)
        .map(|p| {
            index
                .register_source(&SourceSpec {
                    pod: format!("pod-{p}.default"),
                    model: "meta-llama/Llama-3.1-8B-Instruct".to_owned(),
                    engine: Engine::Vllm,
                    dp_rank: 0,
                })
                .expect("few sources")
        })
        .collect();
    let before = live();
    for (p, source) in sources.iter().enumerate() {
        let mut next = 0usize;
        while next < blocks {
            let end = (next + EVENTS_PER_BATCH).min(blocks);
            let events = (next..end)
                .map(|i| {
                    // Distinct tokens per block; engine hashes spread over the u64 range.
                    let tokens: Vec<u32> = (0..BLOCK_SIZE).map(|t| i as u32 ^ (t << 27)).collect();
                    let hash = (i as u64 ^ ((p as u64) << 40)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                    Event::BlockStored(BlockStored::new(
                        vec![BlockHash::Int(hash)],
                        tokens,
                        BLOCK_SIZE,
                        Medium::GPU,
                    ))
                })
                .collect();
            let batch = EngineBatch {
                ts: 0.0,
                dp_rank: Some(0),
                events,
                skipped: Vec::new(),
            };
            index
                .apply(*source, &batch, 1_767_225_600, &mut Discard)
                .expect("registered");
            next = end;
        }
    }
    let grown = (live() - before) as usize;
    let stats = index.stats();
    assert_eq!(
        stats.entries,
        blocks * pods,
        "every block is resident on every pod"
    );
    (
        stats.entries,
        grown as f64 / stats.entries as f64,
        stats.heap_bytes,
    )
}

fn main() {
    // `cargo bench` passes harness flags; a filter-free table is all this binary prints.
    let cases = [
        (500_000, 1),
        (1_000_000, 1),
        (1_048_576, 1),
        (1_500_000, 1),
        (62_500, 8),
        (125_000, 8),
        (187_500, 8),
    ];
    println!("| index | pods | blocks | (block, pod) entries | measured bytes/entry | stats() estimate bytes/entry |");
    println!("| --- | --- | --- | --- | --- | --- |");
    for std_layer in [true, false] {
        let name = if std_layer {
            "+ std layer"
        } else {
            "prefix-only"
        };
        for (blocks, pods) in cases {
            let (entries, per_entry, estimate) = measure(blocks, pods, std_layer);
            println!(
                "| {name} | {pods} | {blocks} | {entries} | {per_entry:.1} | {:.1} |",
                estimate as f64 / entries as f64
            );
        }
    }
}

//! Ingest cost per block (thread CPU time) and memory against the number of distinct LoRA
//! names.
//!
//! One source stores `blocks` blocks of 16 tokens (100 `BlockStored` events per batch, one
//! block each), event i under LoRA `lora-{i mod names}`, then removes every block. Cases:
//! 1 name and 100,000 names over 1 M blocks (ten blocks per name) and over 100 k blocks
//! (every block a new name, so every block creates a model) — the per-source cap is raised
//! past them, so the data structure is what is timed — and 100,000 names under the default
//! cap (1,024: the rest are dropped and counted). The index keeps no freed model names, as
//! the daemon without Redis; one case keeps the mirror's 16,384 to show what they cost.
//! Batches are built outside the timed part.
//!
//! Reported: ingest time per block and its ratio to the 1-name case (goal ≤ 1.5×), the live
//! heap (counting allocator) and RSS before, after ingest and after every block is removed,
//! once it stopped falling (jemalloc as built returns freed pages within about a second,
//! from a background thread; goal: within 10 % of before), and RSS after `malloc_trim(0)`
//! to tell freed-but-cached allocator pages from memory still held (glibc only: a no-op for
//! jemalloc). Each case runs in a fresh index, in
//! this order, within one process; the 1-name case runs first and again last as the
//! reference.
//!
//! Run: `cargo bench --bench lora_names [-- CASE]` (a few seconds; `CASE` keeps only the
//! cases whose name contains it, e.g. to profile one).

// The binary's allocator, included by path: it is private to the binary.
#[allow(dead_code)]
#[path = "../src/allocator.rs"]
mod allocator;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use kvindex::index::{
    Discard, Index, IndexOptions, SourceSpec, DEFAULT_FREED_MODEL_NAMES,
    DEFAULT_MAX_MODELS_PER_SOURCE,
};
use kvindex::medium::Medium;
use kvindex::wire::{BlockHash, BlockRemoved, BlockStored, Engine, EngineBatch, Event};

#[path = "common/counting_alloc.rs"]
mod counting_alloc;
#[path = "common/thread_cpu.rs"]
mod thread_cpu;
// Only `rss_mib` serves here; the rest serves the soak examples.
#[allow(dead_code)]
#[path = "../examples/common/measure.rs"]
mod measure;

use counting_alloc::LIVE;
use measure::rss_mib;
use thread_cpu::thread_cpu;

const PER_BATCH: u64 = 100;
const BLOCK_SIZE: u32 = 16;

fn live_mib() -> f64 {
    LIVE.load(Ordering::Relaxed) as f64 / (1 << 20) as f64
}

/// RSS once the allocator has given back what it will: read until it has not fallen for a
/// second (jemalloc's background thread returns freed pages over its decay time), at most
/// `SETTLE_DEADLINE`. What an idle daemon holds after the same frees.
fn settled_rss() -> f64 {
    let deadline = Instant::now() + SETTLE_DEADLINE;
    let mut low = rss_mib();
    let mut since = Instant::now();
    while Instant::now() < deadline && since.elapsed() < Duration::from_secs(1) {
        std::thread::sleep(Duration::from_millis(50));
        let now = rss_mib();
        if now < low - 0.05 {
            low = now;
            since = Instant::now();
        }
    }
    low
}

/// The longest [`settled_rss`] waits.
const SETTLE_DEADLINE: Duration = Duration::from_secs(5);

fn trim() {
    // SAFETY: malloc_trim only returns free pages to the OS.
    unsafe {
        libc::malloc_trim(0);
    }
}

fn batch(events: Vec<Event>) -> EngineBatch {
    EngineBatch {
        ts: 0.0,
        dp_rank: Some(0),
        events,
        skipped: Vec::new(),
    }
}

fn hash_of(i: u64) -> BlockHash {
    BlockHash::Int(i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// Store batch `b`.
fn stores(b: u64, names: u64) -> EngineBatch {
    let events = (b * PER_BATCH..(b + 1) * PER_BATCH)
        .map(|i| {
            let tokens: Vec<u32> = (0..BLOCK_SIZE).map(|t| i as u32 ^ (t << 27)).collect();
            let mut stored = BlockStored::new(vec![hash_of(i)], tokens, BLOCK_SIZE, Medium::GPU);
            stored.lora_name = Some(format!("lora-{}", i % names));
            Event::BlockStored(stored)
        })
        .collect();
    batch(events)
}

/// Remove batch `b`.
fn removes(b: u64) -> EngineBatch {
    let hashes = (b * PER_BATCH..(b + 1) * PER_BATCH).map(hash_of).collect();
    batch(vec![Event::BlockRemoved(BlockRemoved::new(
        hashes,
        Medium::NONE,
    ))])
}

struct Figures {
    ns_per_block: f64,
    dropped: u64,
    live: [f64; 3],
    rss: [f64; 4],
}

fn run(blocks: u64, names: u64, cap: usize, freed_names: usize) -> Figures {
    trim();
    let (live0, rss0) = (live_mib(), rss_mib());
    let index = Index::with_options(IndexOptions {
        max_models_per_source: cap,
        freed_model_names: freed_names,
        ..IndexOptions::default()
    });
    let source = index
        .register_source(&SourceSpec {
            pod: "p.ns".to_owned(),
            model: "base".to_owned(),
            engine: Engine::Vllm,
            dp_rank: 0,
        })
        .expect("one source");
    let mut elapsed = Duration::ZERO;
    let mut dropped = 0;
    for b in 0..blocks / PER_BATCH {
        let batch = stores(b, names);
        let started = thread_cpu();
        let stats = index
            .apply(source, &batch, 1, &mut Discard)
            .expect("registered");
        elapsed += thread_cpu().saturating_sub(started);
        dropped += stats.too_many_models;
    }
    let (live1, rss1) = (live_mib(), rss_mib());
    for b in 0..blocks / PER_BATCH {
        index
            .apply(source, &removes(b), 2, &mut Discard)
            .expect("registered");
    }
    assert_eq!(index.entry_counts().0, 0, "every block removed");
    assert_eq!(index.live_models(), 1, "only the base model is left");
    let (live2, rss2) = (live_mib(), settled_rss());
    trim();
    let rss3 = rss_mib();
    drop(index);
    Figures {
        ns_per_block: elapsed.as_nanos() as f64 / blocks as f64,
        dropped,
        live: [live0, live1, live2],
        rss: [rss0, rss1, rss2, rss3],
    }
}

fn main() {
    const M: u64 = 1_000_000;
    const K100: u64 = 100_000;
    // The daemon without Redis keeps no freed model names (nothing resolves a delta's model
    // late); with the mirror it keeps the last 16,384, so one case shows that bounded cost.
    let cases = [
        ("1 M blocks, 1 name", M, 1, usize::MAX, 0),
        ("1 M blocks, 100k names, cap raised", M, K100, usize::MAX, 0),
        ("100k blocks, 1 name", K100, 1, usize::MAX, 0),
        (
            "100k blocks, 100k names, cap raised",
            K100,
            K100,
            usize::MAX,
            0,
        ),
        (
            "100k blocks, 100k names, cap raised, freed names kept for a mirror",
            K100,
            K100,
            usize::MAX,
            DEFAULT_FREED_MODEL_NAMES,
        ),
        (
            "100k blocks, 100k names, default cap",
            K100,
            K100,
            DEFAULT_MAX_MODELS_PER_SOURCE,
            0,
        ),
        ("1 M blocks, 1 name (again)", M, 1, usize::MAX, 0),
    ];
    // An optional argument keeps only the cases whose name contains it (for profiling one).
    let only: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let cases = cases
        .into_iter()
        .filter(|(name, ..)| only.as_deref().is_none_or(|o| name.contains(o)));
    println!("allocator: {}", allocator::NAME);
    println!("| case | ns/block | vs first case | dropped | live MiB before / ingested / removed | RSS MiB before / ingested / removed / trimmed | RSS removed vs before |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    let mut reference = None;
    for (name, blocks, names, cap, freed) in cases {
        let f = run(blocks, names, cap, freed);
        let base = *reference.get_or_insert(f.ns_per_block);
        println!(
            "| {name} | {:.0} | {:.2}× | {} | {:.1} / {:.1} / {:.1} | {:.1} / {:.1} / {:.1} / {:.1} | {:+.1} % |",
            f.ns_per_block,
            f.ns_per_block / base,
            f.dropped,
            f.live[0],
            f.live[1],
            f.live[2],
            f.rss[0],
            f.rss[1],
            f.rss[2],
            f.rss[3],
            (f.rss[2] / f.rss[0] - 1.0) * 100.0
        );
    }
}

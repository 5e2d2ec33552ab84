//! A full index of 10 M resident (block, pod) entries, built and queried.
//!
//! 8 pods each store the same 9,766 prompts of 128 blocks × 16 tokens as chained 8-block
//! `BlockStored` events (1,250,048 distinct blocks, 10,000,384 entries). Then 2,000 queries
//! score a random stored prompt (a full hit on all 8 pods) and 2,000 score a prompt nobody
//! holds, against the 8 pods resolved once ([`kvindex::score::Candidates`]). Reported per
//! index (`prefix`-only, then with kthena's std layer): build time and blocks/s (thread CPU
//! time); the longest query and the number over 1 ms of a second thread scoring one prompt
//! again and again during the build (wall clock: a query waits for a writer's lock, and an
//! event holds it while a table it grows is rehashed); live heap per entry (counting
//! allocator), process RSS and swap (`VmSwap`) after the build, and query p50/p99. The two
//! indexes are built one after the other, the first dropped before the second starts.
//!
//! Run: `cargo bench --bench index_scale` (about a minute; ~2.5 GB of RAM at its peak).

// The binary's allocator, included by path: it is private to the binary.
#[allow(dead_code)]
#[path = "../src/allocator.rs"]
mod allocator;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kvindex::index::{Discard, SourceId, SourceSpec};
use kvindex::index::{Index, IndexOptions};
use kvindex::medium::{Medium, TierWeights};
use kvindex::score::{score_candidates, Candidates};
use kvindex::score::{MatchMode, PromptSettings};
use kvindex::wire::BlockStored;
use kvindex::wire::{BlockHash, Engine, EngineBatch, Event};

#[path = "common/counting_alloc.rs"]
mod counting_alloc;
// Only `rss_mib` and `swap_mib` serve here; the rest serves the soak examples.
#[allow(dead_code)]
#[path = "../examples/common/measure.rs"]
mod measure;
#[path = "common/thread_cpu.rs"]
mod thread_cpu;

use thread_cpu::thread_cpu;

const PODS: usize = 8;
const PROMPTS: usize = 9_766;
const PROMPT_BLOCKS: usize = 128;
const BLOCK: usize = 16;
const PER_EVENT: usize = 8;
const QUERIES: usize = 2_000;
const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

/// Block `b` of prompt `p`: distinct tokens for every (prompt, block).
fn tokens(p: usize, b: usize) -> impl Iterator<Item = u32> {
    let base = ((p * PROMPT_BLOCKS + b) * BLOCK) as u32;
    (0..BLOCK as u32).map(move |t| base.wrapping_add(t).wrapping_mul(2_654_435_761) >> 1)
}

/// The engine hash pod `pod` gives block `b` of prompt `p` (engines hash differently).
fn engine_hash(pod: usize, p: usize, b: usize) -> BlockHash {
    let n = ((p * PROMPT_BLOCKS + b) as u64) << 8 | pod as u64;
    BlockHash::Int(n.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// Prompt `p` for `pod` as 8-block events, each naming its parent.
fn prompt_batch(pod: usize, p: usize) -> EngineBatch {
    let events = (0..PROMPT_BLOCKS)
        .step_by(PER_EVENT)
        .map(|first| {
            let hashes = (first..first + PER_EVENT)
                .map(|b| engine_hash(pod, p, b))
                .collect();
            let toks = (first..first + PER_EVENT)
                .flat_map(|b| tokens(p, b))
                .collect();
            let mut stored = BlockStored::new(hashes, toks, BLOCK as u32, Medium::GPU);
            stored.parent_block_hash = (first > 0).then(|| engine_hash(pod, p, first - 1));
            Event::BlockStored(stored)
        })
        .collect();
    EngineBatch {
        ts: 0.0,
        dp_rank: Some(0),
        events,
        skipped: Vec::new(),
    }
}

fn percentile(sorted: &[Duration], q: f64) -> f64 {
    let i = ((sorted.len() as f64 * q) as usize).min(sorted.len() - 1);
    sorted[i].as_secs_f64() * 1e6
}

/// Prompt `p`'s blocks as `mode` matches them.
fn prompt_blocks(p: usize, mode: MatchMode) -> Vec<u64> {
    let settings = PromptSettings::new(BLOCK, PROMPT_BLOCKS).expect("valid settings");
    let toks: Vec<u32> = (0..PROMPT_BLOCKS).flat_map(|b| tokens(p, b)).collect();
    settings.blocks(MODEL, &toks, mode)
}

/// Every pod's matched blocks for `blocks` (kthena's default weights), and the time the
/// scoring took (wall clock).
fn timed_score(
    index: &Index,
    candidates: &Candidates,
    blocks: &[u64],
    mode: MatchMode,
) -> (Vec<u32>, Duration) {
    let weights = TierWeights::default();
    let started = Instant::now();
    let scores = score_candidates(index, MODEL, blocks, candidates, &weights, &[], mode);
    let took = started.elapsed();
    (scores.iter().map(|s| s.matched_blocks).collect(), took)
}

/// p50 and p99 (µs) of scoring the prompts `pick` chooses; `expect` is every pod's matched
/// block count, checked on each answer so the figure is for right answers.
fn query(
    index: &Index,
    candidates: &Candidates,
    mode: MatchMode,
    pick: impl Fn(usize) -> usize,
    expect: u32,
) -> (f64, f64) {
    let mut times = Vec::with_capacity(QUERIES);
    for q in 0..QUERIES {
        let p = pick(q);
        let (matched, took) = timed_score(index, candidates, &prompt_blocks(p, mode), mode);
        times.push(took);
        let want = if expect == 0 {
            vec![]
        } else {
            vec![expect; PODS]
        };
        assert_eq!(matched, want, "query {q} (prompt {p})");
    }
    times.sort();
    (percentile(&times, 0.5), percentile(&times, 0.99))
}

/// Stores every prompt on every pod; the builder thread's CPU time.
fn build(index: &Index, sources: &[SourceId]) -> Duration {
    let mut cpu = Duration::ZERO;
    for p in 0..PROMPTS {
        for (pod, source) in sources.iter().enumerate() {
            let batch = prompt_batch(pod, p);
            let started = thread_cpu();
            index
                .apply(*source, &batch, 1_767_225_600, &mut Discard)
                .expect("registered");
            cpu += thread_cpu() - started;
        }
    }
    cpu
}

/// Scores prompt 0 again and again while `building`, as a router would during ingest: the
/// longest wait (wall clock: a query waits for a writer's lock) and how many took over 1 ms.
fn query_while(
    building: &AtomicBool,
    index: &Index,
    candidates: &Candidates,
    mode: MatchMode,
) -> (Duration, usize) {
    let blocks = prompt_blocks(0, mode);
    let (mut longest, mut slow) = (Duration::ZERO, 0);
    while building.load(Ordering::Relaxed) {
        let (matched, took) = timed_score(index, candidates, &blocks, mode);
        std::hint::black_box(matched);
        longest = longest.max(took);
        slow += usize::from(took > Duration::from_millis(1));
    }
    (longest, slow)
}

fn run(std_layer: bool) {
    let index = Index::with_options(IndexOptions {
        std_layer,
        ..IndexOptions::default()
    });
    let pods: Vec<String> = (0..PODS).map(|p| format!("pod-{p}.default")).collect();
    let sources: Vec<SourceId> = (pods.iter())
        .map(|pod| {
            index
                .register_source(&SourceSpec {
                    pod: pod.clone(),
                    model: MODEL.to_owned(),
                    engine: Engine::Vllm,
                    dp_rank: 0,
                })
                .expect("8 pods fit")
        })
        .collect();
    let candidates = Candidates::new(&index, &pods);
    let mode = if std_layer {
        MatchMode::Kthena
    } else {
        MatchMode::Prefix
    };
    let live_before = counting_alloc::LIVE.load(Ordering::Relaxed);
    let building = AtomicBool::new(true);
    let (cpu, (longest, slow)) = std::thread::scope(|scope| {
        let waits = scope.spawn(|| query_while(&building, &index, &candidates, mode));
        let cpu = build(&index, &sources);
        building.store(false, Ordering::Relaxed);
        (cpu, waits.join().expect("the query thread ends"))
    });
    let entries = index.entry_counts().0;
    assert_eq!(entries as usize, PODS * PROMPTS * PROMPT_BLOCKS);
    let live = (counting_alloc::LIVE.load(Ordering::Relaxed) - live_before) as f64;
    let (rss, swap) = (measure::rss_mib(), measure::swap_mib());
    let stride = 7_919; // a prime: hits spread over the whole index
    let (hit50, hit99) = query(&index, &candidates, mode, |q| q * stride % PROMPTS, 128);
    let (miss50, miss99) = query(&index, &candidates, mode, |q| PROMPTS + q, 0);
    println!(
        "| {} | {entries} | {:.1} s | {:.2} / {slow} | {:.2} | {:.1} | {rss:.0} | {swap:.0} | {hit50:.2} / {hit99:.2} | {miss50:.2} / {miss99:.2} |",
        if std_layer { "+ std layer (kthena queries)" } else { "prefix-only (prefix queries)" },
        cpu.as_secs_f64(),
        longest.as_secs_f64() * 1e3,
        entries as f64 / cpu.as_secs_f64() / 1e6,
        live / entries as f64,
    );
}

fn main() {
    println!("allocator: {}", allocator::NAME);
    println!("| index | entries | build (CPU) | query during the build: longest ms / over 1 ms | M entries/s | live heap B/entry | RSS MiB | swap MiB | full hit p50 / p99 µs | miss p50 / p99 µs |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    run(false);
    run(true);
}

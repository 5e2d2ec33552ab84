//! Warm start at scale: how long a restarted daemon takes to rebuild its index from the
//! Redis checkpoint.
//!
//! It fills an index with `--entries` resident blocks over `--sources` sources through the
//! real mirror with the checkpoint on (as `serve` writes it), then rebuilds a fresh index
//! from Redis with the same function the daemon calls at start, and checks both hold the same.
//! Each source stores prompts of 128 blocks, 8 blocks an event after its parent, so the
//! chain layer holds them in runs; it prints the runs of both indexes and the `prefix` query
//! time of whole prompts on each (a restore that loses the runs answers slower).
//! It writes to a bench-only db (default 14) that it empties before and after.
//!
//! Run: `cargo run --release --example warm_start -- --entries 1000000`

// The binary's allocator, included by path: it is private to the binary.
#[allow(dead_code)]
#[path = "../src/allocator.rs"]
mod allocator;

use std::time::{Duration, Instant};

use clap::Parser;
use kvindex::index::{Checkpoint, Delta, Index, SourceSpec};
use kvindex::medium::{Medium, TierWeights};
use kvindex::score::{score_candidates, Candidates, MatchMode};
use kvindex::store::redis::checkpoint;
use kvindex::store::redis::{MirrorHandle, RedisConfig, RedisConn, RedisTarget};
use kvindex::wire::{BlockHash, BlockStored, Engine, EngineBatch, Event};

// The daemon's allocator (jemalloc by default), so the figures are the daemon's.
#[global_allocator]
static GLOBAL: allocator::Chosen = allocator::Chosen;

const BLOCKS_PER_EVENT: u64 = 8;
const MODEL: &str = "warm-model";
const BLOCK_SIZE: u32 = 16;
/// Blocks of a prompt: its events after the first name the one before as their parent.
const PROMPT_BLOCKS: u64 = 128;
/// Prompts queried on each index, and rounds of them.
const QUERIES: u64 = 2_000;
const QUERY_ROUNDS: usize = 5;

/// Warm start at scale: the checkpoint written through the real mirror, then restored.
#[derive(Parser)]
struct Args {
    /// Resident entries to write and restore.
    #[arg(long, default_value_t = 1_000_000)]
    entries: u64,
    /// Sources they are spread over.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..))]
    sources: u64,
    /// The Redis db written to (emptied before and after).
    #[arg(long, default_value = "redis://127.0.0.1:6379/14")]
    redis: String,
}

async fn flushdb(url: &str) {
    let client = redis::Client::open(url).expect("Redis URL");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("Redis");
    let _: () = redis::cmd("FLUSHDB")
        .arg("ASYNC")
        .query_async(&mut conn)
        .await
        .expect("FLUSHDB");
}

/// The tokens of the event of `source` that stores blocks from `first`.
fn event_tokens(source: u64, first: u64) -> impl Iterator<Item = u32> {
    (0..BLOCKS_PER_EVENT * u64::from(BLOCK_SIZE))
        .map(move |t| ((source << 40 | first) * 131 + t) as u32)
}

fn event(source: u64, first: u64) -> Event {
    let hashes = (0..BLOCKS_PER_EVENT)
        .map(|i| BlockHash::Int(source << 40 | (first + i)))
        .collect();
    let tokens = event_tokens(source, first).collect();
    let mut stored = BlockStored::new(hashes, tokens, BLOCK_SIZE, Medium::GPU);
    if !first.is_multiple_of(PROMPT_BLOCKS) {
        stored.parent_block_hash = Some(BlockHash::Int(source << 40 | (first - 1)));
    }
    Event::BlockStored(stored)
}

/// The chain hashes of the prompt of `source` that starts at block `first`.
fn prompt_hashes(source: u64, first: u64) -> Vec<u64> {
    let tokens: Vec<u32> = (first..first + PROMPT_BLOCKS)
        .step_by(BLOCKS_PER_EVENT as usize)
        .flat_map(|at| event_tokens(source, at))
        .collect();
    kvindex::hash::prompt_chain_hashes(MODEL, &tokens, BLOCK_SIZE as usize, usize::MAX)
}

/// Mean wall time of a `prefix` query of every prompt in `prompts` against every source's
/// pod, best of [`QUERY_ROUNDS`] rounds.
fn query_time(index: &Index, prompts: &[Vec<u64>], pods: &[String]) -> Duration {
    let candidates = Candidates::new(index, pods);
    let weights = TierWeights::default();
    let mut best = Duration::MAX;
    for _ in 0..QUERY_ROUNDS {
        let started = Instant::now();
        for hashes in prompts {
            let scores = score_candidates(
                index,
                MODEL,
                hashes,
                &candidates,
                &weights,
                &[],
                MatchMode::Prefix,
            );
            // Sources store the same tokens (under engine hashes of their own).
            let whole =
                |s: &kvindex::score::SlotScore| u64::from(s.matched_blocks) == PROMPT_BLOCKS;
            assert!(
                scores.len() == pods.len() && scores.iter().all(whole),
                "every pod holds each prompt"
            );
        }
        best = best.min(started.elapsed() / prompts.len() as u32);
    }
    best
}

/// Fills `index` through the mirror with the checkpoint on; returns the wall time.
async fn fill(args: &Args, index: &Index) -> Duration {
    let config = RedisConfig {
        target: RedisTarget::Single(args.redis.clone()),
        checkpoint: true,
        ..RedisConfig::default()
    };
    let mirror = MirrorHandle::start(config, index.clone(), TierWeights::default())
        .await
        .expect("Redis");
    let sender = mirror.sender();
    let started = Instant::now();
    // Stored now, as an engine's blocks are: with a store time older than the mirror's
    // refresh age, its passes would refresh every entry while the fill runs.
    let now = kvindex::ingest::unix_now();
    let per_source = args.entries / args.sources;
    for s in 0..args.sources {
        let spec = SourceSpec {
            pod: format!("warm-{s}.bench"),
            model: MODEL.to_owned(),
            engine: Engine::Vllm,
            dp_rank: 0,
        };
        let source = index.register_source(&spec).expect("register");
        for (seq, first) in (0..per_source)
            .step_by(BLOCKS_PER_EVENT as usize)
            .enumerate()
        {
            let batch = EngineBatch::of(vec![event(s, first)]);
            let mut deltas: Vec<Delta> = Vec::new();
            index
                .apply(source, &batch, now, &mut deltas)
                .expect("apply");
            let seq = seq as u64;
            sender.send(deltas, Some(Checkpoint { source, seq })).await;
        }
    }
    mirror.flush().await.expect("flush");
    let took = started.elapsed();
    mirror.shutdown(Duration::from_secs(60)).await;
    took
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    flushdb(&args.redis).await;
    let original = Index::new();
    let filled = fill(&args, &original).await;
    let entries = original.stats().entries;
    println!(
        "filled {entries} entries over {} sources through the mirror in {:.2} s",
        args.sources,
        filled.as_secs_f64()
    );

    let restored = Index::new();
    let client = redis::Client::open(args.redis.as_str()).expect("Redis URL");
    let mut conn = RedisConn::Single(client.get_connection_manager().await.expect("Redis"));
    let target = RedisTarget::Single(args.redis.clone());
    let started = Instant::now();
    let (summary, _) = checkpoint::restore(
        &mut conn,
        &target,
        &restored,
        kvindex::config::Shard::SINGLE,
    )
    .await
    .expect("restore");
    let took = started.elapsed();
    let got = restored.stats();
    println!(
        "warm start: restored {} entries ({} engine blocks, {} sources) in {:.2} s = {:.0} entries/s; index heap {:.1} MB",
        got.entries,
        summary.engine_blocks,
        summary.sources.len(),
        took.as_secs_f64(),
        got.entries as f64 / took.as_secs_f64(),
        got.heap_bytes as f64 / 1e6
    );
    assert_eq!(
        got.entries, entries,
        "the restored index holds what was written"
    );
    let strip = |index: &Index| {
        let mut d = index.dump();
        d.iter_mut().for_each(|e| e.stored_at = 0);
        d
    };
    assert!(
        strip(&restored) == strip(&original),
        "restored index differs"
    );
    let per_source = args.entries / args.sources;
    let prompts: Vec<Vec<u64>> = (0..QUERIES)
        .map(|q| {
            // Whole prompts only, spread over each source's.
            let source = q % args.sources;
            let prompt = (q * 7_919) % (per_source / PROMPT_BLOCKS).max(1);
            prompt_hashes(source, prompt * PROMPT_BLOCKS)
        })
        .collect();
    let pods: Vec<String> = (0..args.sources)
        .map(|s| format!("warm-{s}.bench"))
        .collect();
    let (before, after) = (
        query_time(&original, &prompts, &pods),
        query_time(&restored, &prompts, &pods),
    );
    println!(
        "chain runs: {} written, {} restored; prefix query of a {PROMPT_BLOCKS}-block prompt (mean of {QUERIES}, best of {QUERY_ROUNDS}): {:.2} us written, {:.2} us restored",
        original.stats().chain_runs,
        got.chain_runs,
        before.as_secs_f64() * 1e6,
        after.as_secs_f64() * 1e6,
    );
    flushdb(&args.redis).await;
}

//! Ingest into Redis through the mirror, in blocks per second, with 1-block and 8-block
//! `BlockStored` events (GPU, tiered values, mapping keys on: 2 commands per block).
//! Each iteration applies 20,000 fresh blocks to the index, sends each event's deltas to the
//! mirror and waits for the flush, so the figure is end to end (index + coalescing +
//! pipelines + Redis). Needs a Redis at 127.0.0.1:6379; it writes to db 15, a bench-only db
//! that it empties after each case (millions of keys would otherwise slow every later SCAN).
//!
//! Each size runs twice: kthena's layout alone (`replay --redis`), and with the daemon's
//! checkpoint (`kvindex:` watermark per message and engine-block state per block, as
//! `serve` writes them), so the checkpoint's cost is the ratio of the two in one run.
//!
//! Run: `cargo bench --bench redis_ingest` and compare with
//! `redis-benchmark -P 64 -q -t hset,set -n 1000000`.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kvindex::index::{Checkpoint, Delta, Index, SourceSpec};
use kvindex::medium::{Medium, TierWeights};
use kvindex::store::redis::{MirrorHandle, RedisConfig};
use kvindex::wire::{BlockHash, BlockStored, Engine, EngineBatch, Event};

const BLOCKS_PER_ITER: u64 = 20_000;
const BLOCK_SIZE: u32 = 16;

fn event(first_hash: u64, blocks: u64, salt: u64) -> Event {
    let block_hashes = (0..blocks)
        .map(|i| BlockHash::Int(first_hash + i))
        .collect();
    let token_ids = (0..blocks * u64::from(BLOCK_SIZE))
        .map(|t| (t ^ (first_hash * 31) ^ salt) as u32)
        .collect();
    Event::BlockStored(BlockStored::new(
        block_hashes,
        token_ids,
        BLOCK_SIZE,
        Medium::GPU,
    ))
}

/// The db the bench writes to and empties afterwards.
const BENCH_DB: &str = "redis://127.0.0.1:6379/15";

async fn empty_bench_db() {
    let client = redis::Client::open(BENCH_DB).expect("bench db URL");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("Redis at 127.0.0.1:6379");
    let _: () = redis::cmd("FLUSHDB")
        .arg("ASYNC")
        .query_async(&mut conn)
        .await
        .expect("FLUSHDB on the bench db");
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    let mut group = c.benchmark_group("redis_ingest");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(8));
    group.throughput(Throughput::Elements(BLOCKS_PER_ITER));
    let cases = [(1u64, false), (1, true), (8, false), (8, true)];
    for (blocks_per_event, checkpoint) in cases {
        let index = Index::new();
        let source = index
            .register_source(&SourceSpec {
                pod: format!("bench-{blocks_per_event}-{checkpoint}.bench"),
                model: "bench-model".to_owned(),
                engine: Engine::Vllm,
                dp_rank: 0,
            })
            .expect("register");
        let mirror = rt
            .block_on(MirrorHandle::start(
                RedisConfig {
                    url: BENCH_DB.to_owned(),
                    checkpoint,
                    ..RedisConfig::default()
                },
                index.clone(),
                TierWeights::default(),
            ))
            .expect("Redis at 127.0.0.1:6379");
        let sender = mirror.sender();
        let mut next_hash = 0u64;
        let mut seq = 0u64;
        let layout = if checkpoint { "+checkpoint" } else { "kthena" };
        let name = format!("{blocks_per_event}-block events, {layout}");
        group.bench_function(&name, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    // Pre-build the events so only ingest is timed.
                    let batches: Vec<EngineBatch> = (0..BLOCKS_PER_ITER / blocks_per_event)
                        .map(|_| {
                            let e = event(next_hash, blocks_per_event, blocks_per_event);
                            next_hash += blocks_per_event;
                            EngineBatch::of(vec![e])
                        })
                        .collect();
                    let started = Instant::now();
                    rt.block_on(async {
                        for batch in &batches {
                            let mut deltas: Vec<Delta> = Vec::new();
                            let _ = index.apply(source, batch, 1_700_000_000, &mut deltas);
                            seq += 1;
                            let mark = checkpoint.then_some(Checkpoint { source, seq });
                            sender.send(deltas, mark).await;
                        }
                        mirror.flush().await.expect("flush");
                    });
                    total += started.elapsed();
                }
                total
            });
        });
        let stats = mirror.stats();
        println!(
            "{name}: {} commands in {} pipelines, flush p50 {} us p99 {} us",
            stats.commands, stats.pipelines, stats.flush_p50_us, stats.flush_p99_us
        );
        rt.block_on(mirror.shutdown(Duration::from_secs(30)));
        rt.block_on(empty_bench_db());
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

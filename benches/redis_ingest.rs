//! Ingest into Redis through the mirror, in blocks per second, with 1-block and 8-block
//! `BlockStored` events (GPU, tiered values, mapping keys on: 2 commands per block).
//! Each iteration applies 20,000 fresh blocks to the index, sends each event's deltas to the
//! mirror and waits for the flush, so the figure is end to end (index + coalescing +
//! pipelines + Redis). Needs a Redis at 127.0.0.1:6379; it writes to db 15, a bench-only db
//! that it empties after each case (millions of keys would otherwise slow every later SCAN).
//!
//! Three variants per event size, so each cost is a ratio within one run:
//! - `kthena`: kthena's layout alone, background passes held to 1 command per second (the
//!   reference: what `replay --redis` writes);
//! - `+checkpoint`: the same plus the daemon's checkpoint (`kvindex:` watermark per message,
//!   engine-block state per block);
//! - `serve`: checkpoint and background passes (anti-entropy, refresh, watchdog) at their
//!   defaults, as the daemon runs. The stores carry an old time, so every field is due for a
//!   refresh and the passes work at their rate cap throughout (the worst case).
//!
//! Between cases the bench waits until Redis has freed the previous case's keys (lazy free
//! runs on Redis's CPU and would otherwise slow whichever case comes next).
//!
//! Run: `cargo bench --bench redis_ingest` and compare with
//! `redis-benchmark -P 64 -q -t hset,set -n 1000000`.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kvindex::index::{Checkpoint, Delta, Index, SourceSpec};
use kvindex::medium::{Medium, TierWeights};
use kvindex::store::redis::{MirrorHandle, RedisConfig, RedisTarget};
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
    // ASYNC: a synchronous FLUSHDB of millions of keys outlasts the response timeout.
    let _: () = redis::cmd("FLUSHDB")
        .arg("ASYNC")
        .query_async(&mut conn)
        .await
        .expect("FLUSHDB on the bench db");
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(120) {
        let info: String = redis::cmd("INFO")
            .arg("memory")
            .query_async(&mut conn)
            .await
            .expect("INFO memory");
        if info.contains("lazyfree_pending_objects:0\r") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What the mirror writes besides kthena's layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// kthena's layout, background passes held to 1 command per second.
    Kthena,
    /// Plus the checkpoint.
    Checkpoint,
    /// Checkpoint and background passes at their defaults (`serve`).
    Serve,
}

impl Variant {
    fn label(self) -> &'static str {
        match self {
            Variant::Kthena => "kthena",
            Variant::Checkpoint => "+checkpoint",
            Variant::Serve => "serve",
        }
    }

    fn config(self) -> RedisConfig {
        let mut config = RedisConfig {
            target: RedisTarget::Single(BENCH_DB.to_owned()),
            checkpoint: self != Variant::Kthena,
            ..RedisConfig::default()
        };
        if self != Variant::Serve {
            config.anti_entropy_max_commands_per_s = 1;
            config.anti_entropy_interval = Duration::from_secs(86_400);
        }
        config
    }
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    let mut group = c.benchmark_group("redis_ingest");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(8));
    group.throughput(Throughput::Elements(BLOCKS_PER_ITER));
    let variants = [Variant::Kthena, Variant::Checkpoint, Variant::Serve];
    let cases = [1u64, 8].into_iter().flat_map(|n| variants.map(|v| (n, v)));
    for (blocks_per_event, variant) in cases {
        let index = Index::new();
        let source = index
            .register_source(&SourceSpec {
                pod: format!("bench-{blocks_per_event}-{}.bench", variant.label()),
                model: "bench-model".to_owned(),
                engine: Engine::Vllm,
                dp_rank: 0,
            })
            .expect("register");
        let mirror = rt
            .block_on(MirrorHandle::start(
                variant.config(),
                index.clone(),
                TierWeights::default(),
            ))
            .expect("Redis at 127.0.0.1:6379");
        let sender = mirror.sender();
        let mut next_hash = 0u64;
        let mut seq = 0u64;
        let checkpoint = variant != Variant::Kthena;
        let name = format!("{blocks_per_event}-block events, {}", variant.label());
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
            "{name}: {} commands in {} pipelines, flush p50 {} us p99 {} us; background: {} commands, {} fields refreshed",
            stats.commands,
            stats.pipelines,
            stats.flush_p50_us,
            stats.flush_p99_us,
            stats.background_commands,
            stats.refreshed
        );
        rt.block_on(mirror.shutdown(Duration::from_secs(30)));
        rt.block_on(empty_bench_db());
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

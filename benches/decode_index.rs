//! Decode + index throughput on a synthetic vLLM stream, against the raw SHA-256 floor.
//!
//! What it measures (fixed seed, no I/O):
//! - `decode_index/<era>_<n>blk`: decoding every payload of a stream of `BlockStored` events
//!   of `n` blocks (16 tokens each, int hashes, medium "GPU") and applying it to a fresh
//!   [`Index`] with the [`Discard`] sink (the embedded mode), in blocks/s. Payloads are built
//!   the way vLLM's msgspec encoder lays them out: `array` = 0.10.2–0.23 tagged arrays
//!   (`[ts, [["BlockStored", hashes, parent, tokens, 16, nil, "GPU"], …], 0]`), `map` =
//!   0.24+ tagged maps with omit_defaults.
//! - `decode_index_deltas/…`: the same with a `Vec<Delta>` sink (the Redis mirror's path).
//! - `decode_index_prefix_only/…`: the same without kthena's std layer
//!   (`ingest.std_hashes: false`): no SHA-256 and no std map per block.
//! - `decode_only/…`: decoding alone.
//! - `std_hash/…`: `kvindex::hash::std_hash` over the same blocks' tokens: the floor that
//!   decode + index is compared with (goal: decode+index ≤ 2 × hashing).
//!
//! Times are the benchmark thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), not wall time:
//! the machines this runs on are shared, and CPU time leaves out the time other processes
//! hold the core (cache interference from them still counts). Everything runs on one thread.
//!
//! Run: `cargo bench --bench decode_index` (one core is enough; figures in docs/benchmarks.md).

use std::time::Duration;

use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use rmpv::Value as V;

use kvindex::hash::std_hash;
use kvindex::index::{Delta, Discard, Index, IndexOptions, SourceId, SourceSpec};
use kvindex::wire::{decode_batch, DecodeOptions, Engine};

#[path = "common/rng.rs"]
mod rng;
#[path = "common/thread_cpu.rs"]
mod thread_cpu;

use rng::Rng;
use thread_cpu::thread_cpu;

/// Blocks per measured stream.
const BLOCKS: usize = 16_384;
/// Blocks per batch (a scheduler step's worth of events).
const BLOCKS_PER_BATCH: usize = 32;
const BLOCK_SIZE: usize = 16;

/// Criterion measurement of the calling thread's CPU time.
struct ThreadCpu;

impl Measurement for ThreadCpu {
    type Intermediate = Duration;
    type Value = Duration;

    fn start(&self) -> Duration {
        thread_cpu()
    }
    fn end(&self, start: Duration) -> Duration {
        thread_cpu().saturating_sub(start)
    }
    fn add(&self, a: &Duration, b: &Duration) -> Duration {
        *a + *b
    }
    fn zero(&self) -> Duration {
        Duration::ZERO
    }
    fn to_f64(&self, value: &Duration) -> f64 {
        value.as_nanos() as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        // Nanoseconds either way: wall time's formatter prints them with units.
        static WALL: WallTime = WallTime;
        WALL.formatter()
    }
}

#[derive(Clone, Copy)]
enum Era {
    Array,
    Map,
}

struct Stream {
    payloads: Vec<Vec<u8>>,
    tokens: Vec<Vec<u32>>,
}

fn stored_event(era: Era, hashes: Vec<u64>, parent: Option<u64>, tokens: &[u32]) -> V {
    let hashes = V::Array(hashes.into_iter().map(V::from).collect());
    let parent = parent.map_or(V::Nil, V::from);
    let tokens = V::Array(tokens.iter().map(|t| V::from(*t)).collect());
    match era {
        Era::Array => V::Array(vec![
            V::from("BlockStored"),
            hashes,
            parent,
            tokens,
            V::from(BLOCK_SIZE as u32),
            V::Nil,
            V::from("GPU"),
        ]),
        Era::Map => {
            let mut pairs = vec![
                (V::from("type"), V::from("BlockStored")),
                (V::from("block_hashes"), hashes),
            ];
            if !parent.is_nil() {
                pairs.push((V::from("parent_block_hash"), parent));
            }
            pairs.extend([
                (V::from("token_ids"), tokens),
                (V::from("block_size"), V::from(BLOCK_SIZE as u32)),
                (V::from("medium"), V::from("GPU")),
            ]);
            V::Map(pairs)
        }
    }
}

/// `BLOCKS` blocks in events of `per_event` blocks; each event chains on the previous one.
fn stream(era: Era, per_event: usize) -> Stream {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut payloads = Vec::new();
    let mut block_tokens = Vec::new();
    let mut parent = None;
    let events_per_batch = BLOCKS_PER_BATCH / per_event;
    let mut ts = 1_767_225_600.0f64;
    for _ in 0..BLOCKS / BLOCKS_PER_BATCH {
        let mut events = Vec::new();
        for _ in 0..events_per_batch {
            // vLLM int mode: the digest's last 8 bytes, unsigned, often above 2^63.
            let hashes: Vec<u64> = (0..per_event).map(|_| rng.next()).collect();
            let tokens: Vec<u32> = (0..per_event * BLOCK_SIZE)
                .map(|_| (rng.next() % 151_000) as u32)
                .collect();
            for chunk in tokens.chunks(BLOCK_SIZE) {
                block_tokens.push(chunk.to_vec());
            }
            events.push(stored_event(era, hashes.clone(), parent, &tokens));
            parent = hashes.last().copied();
        }
        ts += 0.01;
        let batch = V::Array(vec![V::F64(ts), V::Array(events), V::from(0)]);
        let mut buf = Vec::new();
        rmpv::encode::write_value(&mut buf, &batch).expect("Vec writes cannot fail");
        payloads.push(buf);
    }
    Stream {
        payloads,
        tokens: block_tokens,
    }
}

/// A fresh index and its one registered source.
type Fresh = fn() -> (Index, SourceId);

fn fresh_index() -> (Index, SourceId) {
    index_with(IndexOptions::default())
}

fn fresh_prefix_only_index() -> (Index, SourceId) {
    index_with(IndexOptions {
        std_layer: false,
        ..IndexOptions::default()
    })
}

fn index_with(options: IndexOptions) -> (Index, SourceId) {
    let index = Index::with_options(options);
    let source = index
        .register_source(&SourceSpec {
            pod: "bench-0.default".to_owned(),
            model: "meta-llama/Llama-3.1-8B-Instruct".to_owned(),
            engine: Engine::Vllm,
            dp_rank: 0,
        })
        .expect("one source fits");
    (index, source)
}

fn bench(c: &mut Criterion<ThreadCpu>) {
    let cases = [
        ("array_1blk", Era::Array, 1),
        ("array_8blk", Era::Array, 8),
        ("map_1blk", Era::Map, 1),
        ("map_8blk", Era::Map, 8),
    ];
    let streams: Vec<(&str, Stream)> = cases
        .iter()
        .map(|(name, era, n)| (*name, stream(*era, *n)))
        .collect();

    let groups: [(&str, Fresh); 2] = [
        ("decode_index", fresh_index),
        ("decode_index_prefix_only", fresh_prefix_only_index),
    ];
    for (group_name, fresh) in groups {
        let mut group = c.benchmark_group(group_name);
        group.throughput(Throughput::Elements(BLOCKS as u64));
        for (name, s) in &streams {
            group.bench_function(*name, |b| {
                b.iter_batched(
                    fresh,
                    |(index, source)| {
                        for payload in &s.payloads {
                            let batch = decode_batch(payload, DecodeOptions::INDEX).expect("valid");
                            index
                                .apply(source, &batch, 1_767_225_600, &mut Discard)
                                .expect("registered");
                        }
                        // Returned so that dropping the index is not timed.
                        index
                    },
                    BatchSize::PerIteration,
                )
            });
        }
        group.finish();
    }

    let mut group = c.benchmark_group("decode_index_deltas");
    group.throughput(Throughput::Elements(BLOCKS as u64));
    for (name, s) in streams.iter().filter(|(n, _)| n.starts_with("array")) {
        group.bench_function(*name, |b| {
            b.iter_batched(
                fresh_index,
                |(index, source)| {
                    let mut deltas: Vec<Delta> = Vec::with_capacity(4 * BLOCKS_PER_BATCH);
                    for payload in &s.payloads {
                        let batch = decode_batch(payload, DecodeOptions::INDEX).expect("valid");
                        index
                            .apply(source, &batch, 1_767_225_600, &mut deltas)
                            .expect("registered");
                        deltas.clear();
                    }
                    index
                },
                BatchSize::PerIteration,
            )
        });
    }
    group.finish();

    let mut group = c.benchmark_group("decode_only");
    group.throughput(Throughput::Elements(BLOCKS as u64));
    for (name, s) in &streams {
        group.bench_function(*name, |b| {
            b.iter(|| {
                for payload in &s.payloads {
                    let batch = decode_batch(payload, DecodeOptions::INDEX).expect("valid");
                    std::hint::black_box(&batch);
                }
            })
        });
    }
    group.finish();

    let mut group = c.benchmark_group("std_hash");
    group.throughput(Throughput::Elements(BLOCKS as u64));
    // Every stream hashes the same kind of blocks; one case per block count is enough.
    for (name, s) in streams.iter().filter(|(n, _)| n.starts_with("array")) {
        group.bench_function(*name, |b| {
            b.iter(|| {
                let mut acc = 0u64;
                for tokens in &s.tokens {
                    acc ^= std_hash(std::hint::black_box(tokens));
                }
                acc
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().with_measurement(ThreadCpu).sample_size(30);
    targets = bench
}
criterion_main!(benches);

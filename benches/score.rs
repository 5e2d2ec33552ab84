//! Scoring benchmarks (fixed inputs, no randomness):
//! - prompt hashing of 128 blocks × 16 tokens (the raw hashing time);
//! - score of 128 blocks × 64 candidate pods from the in-memory index, from precomputed
//!   hashes and from tokens, for a full hit, a half match and a miss of the first block, in
//!   `kthena` mode (std hashes) and `prefix` mode (chain hashes);
//! - Redis: a bare pipeline of 128 `HGETALL` vs `RedisLookup::fetch` + scoring of the same
//!   128 keys (64 fields each), in the same run (needs Redis on 127.0.0.1:6379);
//! - `/v1/score` under a bounded load on 127.0.0.1 (4 keep-alive connections, 20 000
//!   requests or 10 s): requests/s and latency percentiles, printed at the end.
//!
//! Run: `cargo bench --bench score`

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion};
use kvindex::api::{router, serve, ApiState};
use kvindex::hash::{prompt_block_hashes, prompt_chain_hashes};
use kvindex::index::{Discard, Index, SourceSpec};
use kvindex::ingest::{PodStatus, PodsView};
use kvindex::medium::{Medium, TierWeights};
use kvindex::score::{score_index, score_index_with, score_prefix, MatchMode, RedisLookup};
use kvindex::store::redis::block_key;
use kvindex::wire::{BlockHash, BlockStored, Engine, EngineBatch, Event};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BLOCKS: usize = 128;
const PODS: usize = 64;

fn prompt() -> Vec<u32> {
    (0..(BLOCKS * 16) as u32)
        .map(|t| t.wrapping_mul(2654435761) % 150_000)
        .collect()
}

fn pods() -> Vec<String> {
    (0..PODS).map(|i| format!("vllm-{i}.bench")).collect()
}

/// 64 pods holding all 128 blocks of the prompt on GPU (the worst case: nobody drops out).
fn full_index(model: &str) -> Index {
    let index = Index::new();
    let tokens = prompt();
    for (p, pod) in pods().iter().enumerate() {
        let source = index
            .register_source(&SourceSpec {
                pod: pod.clone(),
                model: model.to_owned(),
                engine: Engine::Vllm,
                dp_rank: 0,
            })
            .expect("register");
        let event = Event::BlockStored(BlockStored::new(
            (0..BLOCKS as i64)
                .map(|b| BlockHash::from_i64((p as i64) << 20 | b))
                .collect(),
            tokens.clone(),
            16,
            Medium::GPU,
        ));
        let batch = EngineBatch::of(vec![event]);
        index
            .apply(source, &batch, 1_700_000_000, &mut Discard)
            .expect("apply");
    }
    index
}

fn bench_memory(c: &mut Criterion) {
    let model = "bench/model";
    let index = full_index(model);
    let tokens = prompt();
    let hashes = prompt_block_hashes(&tokens, 16, 128);
    let mut half = hashes.clone();
    for h in &mut half[BLOCKS / 2..] {
        *h ^= 1;
    }
    let mut miss = hashes.clone();
    miss[0] ^= 1;
    let candidates = pods();
    let weights = TierWeights::default();
    let mut g = c.benchmark_group("score_128x64");
    g.bench_function("hash_prompt_only", |b| {
        b.iter(|| black_box(prompt_block_hashes(black_box(&tokens), 16, 128)))
    });
    for (name, blocks) in [("hit", &hashes), ("half", &half), ("miss", &miss)] {
        g.bench_function(format!("from_hashes/{name}"), |b| {
            b.iter(|| {
                black_box(score_index(
                    &index,
                    model,
                    black_box(blocks),
                    &candidates,
                    &weights,
                    &[],
                ))
            })
        });
    }
    // The same queries in `prefix` mode (chain hashes; a changed block changes every chain
    // hash after it, as a spliced or diverging prompt does).
    let chains = prompt_chain_hashes(model, &tokens, 16, 128);
    let mut chain_half = chains.clone();
    for h in &mut chain_half[BLOCKS / 2..] {
        *h ^= 1;
    }
    let mut chain_miss = chains.clone();
    for h in &mut chain_miss {
        *h ^= 1;
    }
    g.bench_function("hash_prompt_only/prefix", |b| {
        b.iter(|| black_box(prompt_chain_hashes(model, black_box(&tokens), 16, 128)))
    });
    let prefix = MatchMode::Prefix;
    for (name, blocks) in [
        ("hit", &chains),
        ("half", &chain_half),
        ("miss", &chain_miss),
    ] {
        g.bench_function(format!("from_hashes/prefix/{name}"), |b| {
            b.iter(|| {
                black_box(score_index_with(
                    &index,
                    model,
                    black_box(blocks),
                    &candidates,
                    &weights,
                    &[],
                    prefix,
                ))
            })
        });
    }
    g.bench_function("from_tokens/prefix/hit", |b| {
        b.iter(|| {
            let blocks = prompt_chain_hashes(model, black_box(&tokens), 16, 128);
            black_box(score_index_with(
                &index,
                model,
                &blocks,
                &candidates,
                &weights,
                &[],
                prefix,
            ))
        })
    });
    g.bench_function("from_tokens/hit", |b| {
        b.iter(|| {
            let blocks = prompt_block_hashes(black_box(&tokens), 16, 128);
            black_box(score_index(
                &index,
                model,
                &blocks,
                &candidates,
                &weights,
                &[],
            ))
        })
    });
    g.finish();
}

fn bench_redis(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let Ok(client) = redis::Client::open("redis://127.0.0.1:6379/") else {
        return;
    };
    let Ok(mut conn) = rt.block_on(client.get_multiplexed_async_connection()) else {
        eprintln!("redis on 127.0.0.1:6379 not reachable: skipping the Redis benchmarks");
        return;
    };
    let model = format!("bench-score-{}", std::process::id());
    let hashes = prompt_block_hashes(&prompt(), 16, 128);
    let candidates = pods();
    let keys: Vec<String> = hashes.iter().map(|h| block_key(&model, *h)).collect();
    rt.block_on(async {
        let mut pipe = redis::pipe();
        for key in &keys {
            for (i, pod) in candidates.iter().enumerate() {
                let value = if i % 2 == 0 {
                    "1700000000|GPU"
                } else {
                    "1700000000|CPU"
                };
                pipe.hset(key, pod, value).ignore();
            }
        }
        let _: redis::RedisResult<()> = pipe.query_async(&mut conn).await;
    });
    let weights = TierWeights::default();
    let mut g = c.benchmark_group("redis_128_keys_x64_fields");
    g.bench_function("bare_pipelined_hgetall", |b| {
        b.iter(|| {
            rt.block_on(async {
                let mut pipe = redis::pipe();
                let mut key = String::new();
                for h in &hashes {
                    key.clear();
                    key.push_str("matrix:kv:block:");
                    key.push_str(&model);
                    key.push('@');
                    key.push_str(&h.to_string());
                    pipe.hgetall(key.as_str());
                }
                let v: Vec<redis::Value> = pipe.query_async(&mut conn).await.expect("hgetall");
                black_box(v)
            })
        })
    });
    g.bench_function("redis_lookup_and_score", |b| {
        b.iter(|| {
            rt.block_on(async {
                let mut owners =
                    RedisLookup::fetch(&mut conn, &model, &hashes, &candidates, &weights)
                        .await
                        .expect("fetch");
                black_box(score_prefix(&mut owners, candidates.len(), &[]))
            })
        })
    });
    g.finish();
    rt.block_on(async {
        let _: redis::RedisResult<()> = redis::cmd("DEL").arg(&keys).query_async(&mut conn).await;
    });
}

struct NoPods;

impl PodsView for NoPods {
    fn pods(&self) -> Vec<PodStatus> {
        Vec::new()
    }
}

/// One keep-alive HTTP/1.1 exchange; returns whether the status was 200.
async fn exchange(conn: &mut tokio::net::TcpStream, request: &[u8], buf: &mut Vec<u8>) -> bool {
    if conn.write_all(request).await.is_err() {
        return false;
    }
    buf.clear();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let Ok(n) = conn.read(&mut chunk).await else {
            return false;
        };
        if n == 0 {
            return false;
        }
        buf.extend_from_slice(&chunk[..n]);
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        if buf.len() >= end + 4 + length {
            return head.starts_with("http/1.1 200");
        }
    }
}

fn load_test() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let model = "bench/model";
        let state = ApiState::new(
            kvindex::score::ScoreBackend::Index(full_index(model)),
            TierWeights::default(),
            None,
            Arc::new(NoPods),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, router(state), async {
            let _ = stopped.await;
        }));
        let body = serde_json::json!({"model": model, "tokens": prompt(), "pods": pods()}).to_string();
        let request = format!(
            "POST /v1/score HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes();
        let request = Arc::new(request);
        let (connections, per_connection) = (4usize, 5_000usize);
        let deadline = Instant::now() + Duration::from_secs(10);
        let started = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..connections {
            let request = request.clone();
            tasks.push(tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(per_connection);
                let mut failures = 0usize;
                let Ok(mut conn) = tokio::net::TcpStream::connect(addr).await else {
                    return (latencies, per_connection);
                };
                let mut buf = Vec::new();
                for _ in 0..per_connection {
                    if Instant::now() > deadline {
                        break;
                    }
                    let t = Instant::now();
                    if exchange(&mut conn, &request, &mut buf).await {
                        latencies.push(t.elapsed());
                    } else {
                        failures += 1;
                    }
                }
                (latencies, failures)
            }));
        }
        let mut all = Vec::new();
        let mut failures = 0;
        for t in tasks {
            if let Ok((l, f)) = t.await {
                all.extend(l);
                failures += f;
            }
        }
        let elapsed = started.elapsed();
        all.sort();
        let pct = |p: f64| all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1))).copied().unwrap_or_default();
        println!(
            "v1_score_load: {} requests ({} failed) over {connections} connections in {:.2} s: {:.0} req/s, p50 {:?}, p99 {:?}, max {:?} (body {} bytes: 128 blocks x 64 pods)",
            all.len(),
            failures,
            elapsed.as_secs_f64(),
            all.len() as f64 / elapsed.as_secs_f64(),
            pct(0.50),
            pct(0.99),
            all.last().copied().unwrap_or_default(),
            body.len(),
        );
        let _ = stop.send(());
        let _ = server.await;
    });
}

criterion_group!(benches, bench_memory, bench_redis);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    load_test();
}

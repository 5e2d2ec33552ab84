//! Mirror throughput into a 3-master Redis Cluster against a single Redis, measured in the
//! same run on the same machine: blocks per second through the mirror (index + coalescing +
//! pipelines + Redis, kthena's layout, mapping keys on: 2 commands per block) with 1-block
//! and 8-block `BlockStored` events, and `redis-benchmark -P 64 -t hset` against each as the
//! servers' own pipelined limit.
//!
//! Every server is started here (`redis-server` on free 127.0.0.1 ports, no persistence; the
//! cluster made by `redis-cli --cluster create`) and killed at the end; nothing touches the
//! shared Redis on 6379. Rounds alternate single and cluster so drift on a shared machine
//! hits both; the median of the rounds is printed.
//!
//! Run: `cargo run --release --example cluster_ingest -- [--blocks N] [--rounds R]
//! [--flush-max COMMANDS]` (`redis.flush_max_commands`, default 1000).

// The binary's allocator, included by path: it is private to the binary.
#[allow(dead_code)]
#[path = "../src/allocator.rs"]
mod allocator;

use std::process::Command;
use std::time::{Duration, Instant};

#[allow(dead_code)] // `benchmark` measures SET + HSET; this example measures HSET per topology
#[path = "common/redis_server.rs"]
mod redis_server;

use redis_server::{free_port, RedisServer};

use clap::Parser;
use kvindex::index::{Delta, Index, SourceSpec};
use kvindex::medium::{Medium, TierWeights};
use kvindex::store::redis::{MirrorHandle, RedisConfig, RedisTarget};
use kvindex::wire::{BlockHash, BlockStored, Engine, EngineBatch, Event};

// The daemon's allocator (jemalloc by default), so the figures are the daemon's.
#[global_allocator]
static GLOBAL: allocator::Chosen = allocator::Chosen;

const BLOCK_SIZE: u32 = 16;

/// A single node or a cluster node (`--cluster-enabled`), its files in `dir`.
fn server(dir: &std::path::Path, cluster: bool) -> RedisServer {
    let port = free_port();
    let mut extra = vec!["--dir".to_owned(), dir.display().to_string()];
    if cluster {
        for arg in ["--cluster-enabled", "yes", "--cluster-config-file"] {
            extra.push(arg.to_owned());
        }
        extra.push(format!("nodes-{port}.conf"));
        extra.push("--cluster-port".to_owned());
        extra.push(free_port().to_string());
    }
    RedisServer::start_on(port, &extra)
}

/// A node's URL as the cluster client takes it (no database number).
fn node_url(server: &RedisServer) -> String {
    format!("redis://127.0.0.1:{}", server.port)
}

fn cli(args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(args)
        .output()
        .expect("redis-cli on PATH");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Three masters in one cluster, ready (`cluster_state:ok` on every node).
fn cluster(dir: &std::path::Path) -> Vec<RedisServer> {
    let nodes: Vec<RedisServer> = (0..3).map(|_| server(dir, true)).collect();
    let addrs: Vec<String> = nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    let mut args = vec!["--cluster", "create"];
    args.extend(addrs.iter().map(String::as_str));
    args.push("--cluster-yes");
    cli(&args);
    let started = Instant::now();
    while !nodes
        .iter()
        .all(|n| cli(&["-p", &n.port.to_string(), "cluster", "info"]).contains("cluster_state:ok"))
    {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "cluster not ready"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    nodes
}

fn event(first_hash: u64, blocks: u64) -> Event {
    let block_hashes = (0..blocks)
        .map(|i| BlockHash::Int(first_hash + i))
        .collect();
    let token_ids = (0..blocks * u64::from(BLOCK_SIZE))
        .map(|t| (t ^ (first_hash * 31)) as u32)
        .collect();
    Event::BlockStored(BlockStored::new(
        block_hashes,
        token_ids,
        BLOCK_SIZE,
        Medium::GPU,
    ))
}

/// Blocks per second of `blocks` fresh blocks in `per_event`-block events through the mirror;
/// `flush_max` is `redis.flush_max_commands`.
async fn ingest(
    target: RedisTarget,
    blocks: u64,
    per_event: u64,
    salt: u64,
    flush_max: usize,
) -> f64 {
    let config = RedisConfig {
        target,
        flush_max_commands: flush_max,
        verify: false,
        anti_entropy_max_commands_per_s: 1,
        anti_entropy_interval: Duration::from_secs(86_400),
        ..RedisConfig::default()
    };
    let index = Index::new();
    let source = index
        .register_source(&SourceSpec {
            pod: format!("bench-{salt}.bench"),
            model: "bench-model".to_owned(),
            engine: Engine::Vllm,
            dp_rank: 0,
        })
        .expect("register");
    let mirror = MirrorHandle::start(config, index.clone(), TierWeights::default())
        .await
        .expect("mirror");
    mirror.flush().await.expect("start-up reconcile");
    let sender = mirror.sender();
    let first = salt * 1_000_000_000;
    let batches: Vec<EngineBatch> = (0..blocks / per_event)
        .map(|i| EngineBatch::of(vec![event(first + i * per_event, per_event)]))
        .collect();
    let started = Instant::now();
    for batch in &batches {
        let mut deltas: Vec<Delta> = Vec::new();
        let _ = index.apply(source, batch, 1_700_000_000, &mut deltas);
        sender.send(deltas, None).await;
    }
    mirror.flush().await.expect("flush");
    let took = started.elapsed();
    mirror.shutdown(Duration::from_secs(30)).await;
    blocks as f64 / took.as_secs_f64()
}

/// `redis-benchmark -P 64 -t hset` requests per second (`--cluster` for a cluster).
fn redis_benchmark(port: u16, cluster: bool) -> f64 {
    let port = port.to_string();
    let mut args = vec!["-p", &port, "-P", "64", "-t", "hset", "-n", "500000", "-q"];
    if cluster {
        args.push("--cluster");
    }
    let out = Command::new("redis-benchmark")
        .args(&args)
        .output()
        .expect("redis-benchmark");
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .zip(text.split_whitespace().skip(1))
        .find_map(|(n, unit)| {
            unit.starts_with("requests")
                .then(|| n.parse().ok())
                .flatten()
        })
        .unwrap_or(0.0)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Mirror throughput into a 3-master Redis Cluster against a single Redis.
#[derive(Parser)]
struct Args {
    /// Fresh blocks per case and round.
    #[arg(long, default_value_t = 200_000)]
    blocks: u64,
    /// Rounds (the median is printed).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    rounds: u64,
    /// `redis.flush_max_commands`.
    #[arg(long = "flush-max", default_value_t = 1000)]
    flush_max: usize,
}

#[tokio::main]
async fn main() {
    let Args {
        blocks,
        rounds,
        flush_max,
    } = Args::parse();
    let dir = tempfile::tempdir().expect("a temp dir");
    let single = server(dir.path(), false);
    let nodes = cluster(dir.path());
    let single_target = RedisTarget::Single(node_url(&single));
    let cluster_target = RedisTarget::Cluster(nodes.iter().map(node_url).collect());
    println!("blocks per case: {blocks}, rounds: {rounds} (median shown)");
    let mut salt = 1;
    for per_event in [1u64, 8] {
        let (mut s, mut c) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            s.push(ingest(single_target.clone(), blocks, per_event, salt, flush_max).await);
            c.push(
                ingest(
                    cluster_target.clone(),
                    blocks,
                    per_event,
                    salt + 1,
                    flush_max,
                )
                .await,
            );
            salt += 2;
            for port in std::iter::once(single.port).chain(nodes.iter().map(|n| n.port)) {
                cli(&["-p", &port.to_string(), "flushall"]);
            }
        }
        let (s, c) = (median(s), median(c));
        println!(
            "{per_event}-block events: single {s:.0} blocks/s, cluster (3 masters) {c:.0} blocks/s, cluster/single {:.2}",
            c / s
        );
    }
    let rs = redis_benchmark(single.port, false);
    let rc = redis_benchmark(nodes[0].port, true);
    println!(
        "redis-benchmark -P 64 -t hset: single {rs:.0}/s, cluster {rc:.0}/s, cluster/single {:.2}",
        rc / rs.max(1.0)
    );
}

//! N kvindex writers × one Redis: the aggregate Redis write rate of K concurrent
//! `kvindex replay --redis` processes (each a replica's share of the pods: its own pod and
//! model, its own mirror and connection), for K = 1, 2, 3, against the pipelined limit of
//! the same Redis measured in the same run by `redis-benchmark -P 64 -t hset,set` (a block
//! is one HSET + one SET EX).
//!
//! It starts its own `redis-server` on a free 127.0.0.1 port (no persistence) and removes it
//! at the end; `redis-server`, `redis-cli` and `redis-benchmark` must be on PATH.
//!
//! Run: `cargo build --release --bin kvindex && cargo run --release --example shard_scale --
//! [--events N] [--kvindex target/release/kvindex]`

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use kvindex::ingest::fixture::format_line;
use rmpv::Value as V;

#[allow(dead_code)] // `benchmark_command` serves `redis_ingest`
#[path = "common/redis_server.rs"]
mod redis_server;

use redis_server::RedisServer;

/// One message holding one 1-block `BlockStored` (vLLM array era, int hash, GPU).
fn message(seq: u64) -> Vec<Vec<u8>> {
    let tokens: Vec<V> = (0..16).map(|t| V::from(seq * 16 + t)).collect();
    let event = V::Array(vec![
        V::from("BlockStored"),
        V::Array(vec![V::from(seq + 1)]),
        V::Nil,
        V::Array(tokens),
        V::from(16),
        V::Nil,
        V::from("GPU"),
    ]);
    let batch = V::Array(vec![V::F64(1.0), V::Array(vec![event])]);
    let mut payload = Vec::new();
    rmpv::encode::write_value(&mut payload, &batch).expect("encode to a Vec");
    vec![Vec::new(), seq.to_be_bytes().to_vec(), payload]
}

fn write_fixture(path: &Path, events: u64) {
    let mut text = String::new();
    for seq in 0..events {
        text.push_str(&format_line(0, &message(seq)));
        text.push('\n');
    }
    std::fs::write(path, text).expect("write the fixture");
}

/// K concurrent replays, each its own pod and model; returns the wall time.
fn run_writers(kvindex: &Path, fixture: &Path, url: &str, k: usize) -> Duration {
    let started = Instant::now();
    let children: Vec<Child> = (0..k)
        .map(|i| {
            Command::new(kvindex)
                .arg("replay")
                .arg(fixture)
                .args(["--redis", url, "--engine", "vllm"])
                .args(["--pod", &format!("writer-{i}.bench")])
                .args(["--model", &format!("model-{i}")])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("the kvindex binary")
        })
        .collect();
    for mut c in children {
        let status = c.wait().expect("wait");
        assert!(status.success(), "kvindex replay failed: {status}");
    }
    started.elapsed()
}

/// Aggregate blocks/s of 1, 2 and 3 concurrent `kvindex replay --redis` writers against
/// `redis-benchmark` on the same server.
#[derive(Parser)]
struct Args {
    /// One-block events each writer replays.
    #[arg(long, default_value_t = 200_000)]
    events: u64,
    /// The kvindex binary the writers run.
    #[arg(long, default_value = "target/release/kvindex")]
    kvindex: PathBuf,
}

fn main() {
    let Args { events, kvindex } = Args::parse();
    let dir = tempfile::tempdir().expect("temp dir");
    let fixture = dir.path().join("one-block-events.jsonl");
    write_fixture(&fixture, events);
    let redis = RedisServer::start();
    let url = redis.url();
    let (set, hset) = redis.benchmark();
    let limit = 1.0 / (1.0 / hset + 1.0 / set);
    println!(
        "redis-benchmark -P 64: HSET {hset:.0}/s, SET {set:.0}/s → {limit:.0} blocks/s (HSET + SET)"
    );
    let mut one = 0.0;
    for k in [1usize, 2, 3] {
        redis.flush();
        let took = run_writers(&kvindex, &fixture, &url, k);
        let rate = (k as u64 * events) as f64 / took.as_secs_f64();
        if k == 1 {
            one = rate;
        }
        println!(
            "{k} writer(s): {rate:.0} blocks/s in {:.2} s = {:.2}× one writer, {:.0} % of the redis-benchmark limit",
            took.as_secs_f64(),
            rate / one,
            100.0 * rate / limit
        );
    }
}

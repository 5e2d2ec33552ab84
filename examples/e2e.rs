//! End-to-end figures for `kvindex serve` (bounded; not a test, nothing asserted):
//! messages/s from N paced publishers through real ZMQ sockets into the index, CPU per
//! 10k events/s, and RSS with 200 idle targets.
//!
//! Run: `cargo run --release --example e2e -- [messages_per_publisher]` (default 20000).

// The binary's allocator, included by path: it is private to the binary.
#[allow(dead_code)]
#[path = "../src/allocator.rs"]
mod allocator;

#[path = "../benches/common/proc_status.rs"]
mod proc_status;
#[allow(dead_code)] // Only the process's CPU serves here.
#[path = "../benches/common/thread_cpu.rs"]
mod thread_cpu;

use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use kvindex::config::Config;
use kvindex::ingest::fixture;
use kvindex::ingest::replay_client::ReplayLimits;
use kvindex::Daemon;
use zeromq::{PubSocket, Socket, SocketSend, ZmqMessage};

// The daemon's allocator (jemalloc by default), so the figures are the daemon's.
#[global_allocator]
static GLOBAL: allocator::Chosen = allocator::Chosen;

/// (user + system CPU seconds, RSS KiB) of this process.
fn proc_figures() -> (f64, u64) {
    let (cpu, _) = thread_cpu::process_cpu_and_faults(std::process::id());
    let rss_kib = proc_status::status_mib("self", "VmRSS") * 1024.0;
    (cpu.as_secs_f64(), rss_kib as u64)
}

async fn bind_any() -> (PubSocket, u16) {
    let mut s = PubSocket::new();
    let ep = s.bind("tcp://127.0.0.1:0").await.expect("bind");
    let zeromq::Endpoint::Tcp(_, port) = ep else {
        panic!("not tcp")
    };
    (s, port)
}

fn yaml(ports: &[u16]) -> String {
    let mut s = String::from("metrics:\n  listen: 127.0.0.1:0\ntargets:\n");
    for (i, p) in ports.iter().enumerate() {
        s.push_str(&format!(
            "  - {{pod: p{i}, model: m, engine: vllm, endpoint: 'tcp://127.0.0.1:{p}'}}\n"
        ));
    }
    s
}

async fn wait_connected(d: &Daemon, n: usize) {
    let end = Instant::now() + Duration::from_secs(60);
    while d.supervisor.connected_ranks() < n && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
}

async fn run(n: usize, per_pub: u64, payloads: &[Vec<u8>], events_per_msg: f64) {
    let mut pubs = Vec::new();
    let mut ports = Vec::new();
    for _ in 0..n {
        let (s, p) = bind_any().await;
        pubs.push(s);
        ports.push(p);
    }
    let config = Config::from_str(&yaml(&ports)).expect("config");
    let daemon = Daemon::start(config, None, ReplayLimits::default())
        .await
        .expect("daemon");
    wait_connected(&daemon, n).await;
    let (cpu0, _) = proc_figures();
    let started = Instant::now();
    let tasks: Vec<_> = pubs
        .into_iter()
        .map(|mut s| {
            let payloads: Vec<Bytes> = payloads.iter().map(|p| Bytes::copy_from_slice(p)).collect();
            tokio::spawn(async move {
                for seq in 0..per_pub {
                    let p = payloads[(seq as usize) % payloads.len()].clone();
                    let m = ZmqMessage::try_from(vec![
                        Bytes::new(),
                        Bytes::copy_from_slice(&seq.to_be_bytes()),
                        p,
                    ])
                    .expect("frames");
                    let _ = s.send(m).await;
                    // Pace: the crate's PUB stalls and drops under a flat-out loop.
                    tokio::task::yield_now().await;
                }
                s
            })
        })
        .collect();
    let mut keep = Vec::new();
    for t in tasks {
        keep.push(t.await.expect("publisher"));
    }
    let total = n as u64 * per_pub;
    let received = || -> u64 {
        daemon
            .supervisor
            .status()
            .iter()
            .flat_map(|t| t.ranks.iter())
            .map(|r| r.stats.messages)
            .sum()
    };
    let mut last = (received(), Instant::now());
    while last.0 < total && last.1.elapsed() < Duration::from_secs(2) {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let now = received();
        if now != last.0 {
            last = (now, Instant::now());
        }
    }
    let elapsed = last.1.duration_since(started).as_secs_f64();
    let (cpu1, rss) = proc_figures();
    let got = last.0;
    let rate = got as f64 / elapsed;
    let events = rate * events_per_msg;
    let cpu = (cpu1 - cpu0) / elapsed;
    println!(
        "N={n:>3}: {got}/{total} messages in {elapsed:.2} s = {rate:>8.0} msg/s ({events:.0} events/s), \
         process CPU {:.2} cores (publishers included) = {:.3} cores per 10k events/s, RSS {} MiB",
        cpu,
        cpu / (events / 10_000.0),
        rss / 1024
    );
    daemon.shutdown(Duration::from_secs(5)).await;
    drop(keep);
}

/// End-to-end ingest throughput of the daemon from recorded vLLM frames.
#[derive(Parser)]
struct Args {
    /// Messages each publisher sends.
    #[arg(default_value_t = 20_000)]
    messages_per_publisher: u64,
}

#[tokio::main]
async fn main() {
    let per_pub = Args::parse().messages_per_publisher;
    let file =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/vllm-e01-0.9.0.jsonl");
    let msgs: Vec<_> = fixture::read_file(&file)
        .expect("fixture")
        .into_iter()
        .filter_map(Result::ok)
        .collect();
    let payloads: Vec<Vec<u8>> = msgs.iter().map(|m| m.frames[2].clone()).collect();
    let events: usize = payloads
        .iter()
        .filter_map(|p| kvindex::wire::decode_batch(p, kvindex::wire::DecodeOptions::INDEX).ok())
        .map(|b| b.events.len())
        .sum();
    let events_per_msg = events as f64 / payloads.len() as f64;
    run(1, per_pub, &payloads, events_per_msg).await;
    run(50, (per_pub / 10).max(1), &payloads, events_per_msg).await;

    // RSS with 200 idle targets: the daemon's share is measured after the PUBs are bound.
    let mut pubs = Vec::new();
    let mut ports = Vec::new();
    for _ in 0..200 {
        let (s, p) = bind_any().await;
        pubs.push(s);
        ports.push(p);
    }
    let (_, bound) = proc_figures();
    let config = Config::from_str(&yaml(&ports)).expect("config");
    let daemon = Daemon::start(config, None, ReplayLimits::default())
        .await
        .expect("daemon");
    wait_connected(&daemon, 200).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (_, rss) = proc_figures();
    println!(
        "200 idle targets: {} connected, daemon RSS share {} KiB (process {} MiB incl. the 200 test PUB sockets)",
        daemon.supervisor.connected_ranks(),
        rss.saturating_sub(bound),
        rss / 1024
    );
    daemon.shutdown(Duration::from_secs(5)).await;
}

//! High availability, measured: how fast a standby takes over the Redis writer, what the
//! lease costs the writer, and what a standby costs next to its leader.
//!
//! 1. Two `kvindex serve` processes with `ha:` (the built binary) follow one simulated
//!    engine publishing a steady stream. The leader is SIGKILLed `--kills` times (then
//!    SIGTERMed `--terms` times); each time the time from the signal to the other replica's
//!    `kvindex_ha_leader` gauge, and the daemon's own `kvindex_ha_takeover_seconds` (from
//!    the previous lease's end to the first write), are recorded; the killed replica is
//!    started again and waits as the standby. p50/p99 are printed.
//! 2. Meanwhile, both processes' CPU time and RSS over a quiet stretch of the stream.
//! 3. The writer's throughput with a lease (the default ttl, renewed on its own thread and
//!    connection, checked before every write) against without, in one run, alternating: the
//!    mirror fed flat out as `benches/redis_ingest.rs` does, `--rounds` times each.
//!
//! Run: `cargo build --release --bin kvindex && cargo run --release --example ha_takeover --
//! [--kills 20] [--terms 5] [--ttl-ms 1000] [--kvindex target/release/kvindex]`
//! (about a minute and a half with the defaults).

// The simulated engines of `kvindex demo`, included by path: private to the binary.
#[allow(dead_code)]
#[path = "../src/sim/mod.rs"]
mod sim;

#[path = "common/daemon_log.rs"]
mod daemon_log;
#[path = "../benches/common/proc_status.rs"]
mod proc_status;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use kvindex::config::Shard;
use kvindex::index::{Checkpoint, Delta, Index, SourceSpec};
use kvindex::medium::{Medium, TierWeights};
use kvindex::store::redis::lease::{LeaseSettings, LeaseThread, Role};
use kvindex::store::redis::{MirrorHandle, RedisConfig, RedisTarget};
use kvindex::wire::{BlockHash, BlockStored, Engine, EngineBatch, Event};
use rmpv::Value as V;
use sim::SimEngine;

#[path = "common/redis_server.rs"]
#[allow(dead_code)]
mod redis_server;
use redis_server::RedisServer;

const MODEL: &str = "ha-model";

#[derive(Parser)]
struct Args {
    /// SIGKILLs of the leader.
    #[arg(long, default_value_t = 20)]
    kills: usize,
    /// SIGTERMs of the leader (rolling-restart handovers).
    #[arg(long, default_value_t = 5)]
    terms: usize,
    /// The lease's ttl, milliseconds.
    #[arg(long, default_value_t = 1000)]
    ttl_ms: u64,
    /// Rounds of the throughput comparison (each: one run with the lease, one without).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Blocks each throughput run writes.
    #[arg(long, default_value_t = 200_000)]
    blocks: u64,
    /// The kvindex binary.
    #[arg(long, default_value = "target/release/kvindex")]
    kvindex: PathBuf,
}

/// A `kvindex serve` child and its metrics address.
struct Replica {
    child: Child,
    metrics: SocketAddr,
}

impl Replica {
    fn start(kvindex: &Path, config: &Path, name: &str) -> Replica {
        let mut child = Command::new(kvindex)
            .args(["--log-format", "json", "--log", "info", "serve", "--config"])
            .arg(config)
            .env("POD_NAME", name)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the kvindex binary");
        let stderr = child.stderr.take().expect("piped stderr");
        let timeout = Duration::from_secs(30);
        if let Some(metrics) = daemon_log::listener_address(stderr, "metrics", timeout) {
            return Replica { child, metrics };
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("kvindex serve never logged its metrics listener");
    }

    fn signal(&self, signal: i32) {
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as i32, signal);
        }
    }

    fn stop(mut self, signal: i32) {
        self.signal(signal);
        let _ = self.child.wait();
    }

    async fn metrics(&self) -> String {
        self.get("/metrics").await
    }

    /// Whether it has caught up and may lead (`/readyz` tells its HA state).
    async fn ready_to_lead(&self) -> bool {
        self.get("/readyz").await.contains("ready to lead: true")
    }

    async fn get(&self, path: &str) -> String {
        let Ok(mut s) = tokio::net::TcpStream::connect(self.metrics).await else {
            return String::new();
        };
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        if s.write_all(req.as_bytes()).await.is_err() {
            return String::new();
        }
        let mut out = String::new();
        let _ = s.read_to_string(&mut out).await;
        out
    }

    async fn metric(&self, name: &str) -> f64 {
        self.metrics()
            .await
            .lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    async fn leads(&self) -> bool {
        self.metric("kvindex_ha_leader{").await == 1.0
    }

    /// Polls `cond` every 5 ms until it holds (a minute at most).
    async fn wait_until(&self, what: &str, cond: impl AsyncFn(&Replica) -> bool) {
        let end = Instant::now() + Duration::from_secs(60);
        while !cond(self).await {
            assert!(Instant::now() < end, "{what} never happened");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// CPU seconds (user + system) and RSS in MiB, from /proc.
    fn cpu_and_rss(&self) -> (f64, f64) {
        let pid = self.child.id();
        let (cpu, _) = redis_server::thread_cpu::process_cpu_and_faults(pid);
        let rss = proc_status::status_mib(&pid.to_string(), "VmRSS");
        (cpu.as_secs_f64(), rss)
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Message `i`: four new GPU blocks, and from 8 on, the four of message i − 8 removed.
fn message(i: u64) -> Vec<Vec<u8>> {
    let hash = |msg: u64, k: u64| V::from(msg * 4 + k + 1);
    let tokens: Vec<V> = (0..64).map(|t| V::from((i * 64 + t) % 150_000)).collect();
    let mut events = vec![V::Array(vec![
        V::from("BlockStored"),
        V::Array((0..4).map(|k| hash(i, k)).collect()),
        V::Nil,
        V::Array(tokens),
        V::from(16),
        V::Nil,
        V::from("GPU"),
    ])];
    if i >= 8 {
        events.push(V::Array(vec![
            V::from("BlockRemoved"),
            V::Array((0..4).map(|k| hash(i - 8, k)).collect()),
            V::Nil,
        ]));
    }
    let batch = V::Array(vec![V::F64(1.0), V::Array(events)]);
    let mut payload = Vec::new();
    rmpv::encode::write_value(&mut payload, &batch).expect("encode to a Vec");
    vec![Vec::new(), i.to_be_bytes().to_vec(), payload]
}

fn percentile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

fn show(what: &str, v: &mut [f64]) {
    if v.is_empty() {
        return;
    }
    println!(
        "{what}: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms over {}",
        percentile(v, 0.50) * 1e3,
        percentile(v, 0.99) * 1e3,
        percentile(v, 1.0) * 1e3,
        v.len()
    );
}

/// Part 1 and 2: handovers between two processes, and their costs.
async fn handovers(args: &Args, url: &str) {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut engine = SimEngine::bind(1, 0, 0).await.expect("engine sockets");
    let config = dir.path().join("kvindex.yaml");
    std::fs::write(
        &config,
        format!(
            "redis:\n  url: {url}\nha:\n  lease_ttl_ms: {}\nmetrics:\n  listen: 127.0.0.1:0\ntargets:\n  - pod: engine-0\n    namespace: bench\n    model: {MODEL}\n    engine: vllm\n    endpoint: tcp://127.0.0.1:{}\n    replay_endpoint: tcp://127.0.0.1:{}\n",
            args.ttl_ms,
            engine.pub_port(),
            engine.replay_port()
        ),
    )
    .expect("write the config");
    // The stream: 200 messages a second, for as long as the handovers last.
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let publisher = tokio::spawn(async move {
        let mut i = 0u64;
        let mut tick = tokio::time::interval(Duration::from_millis(5));
        while !*stop_rx.borrow_and_update() {
            tick.tick().await;
            let _ = engine.publish(0, &message(i)).await;
            i += 1;
        }
    });
    let mut replicas = [
        Some(Replica::start(&args.kvindex, &config, "replica-0")),
        Some(Replica::start(&args.kvindex, &config, "replica-1")),
    ];
    let leader_of = async |replicas: &[Option<Replica>; 2]| loop {
        for (i, r) in replicas.iter().enumerate() {
            if r.as_ref().expect("running").leads().await {
                return i;
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let mut leader = leader_of(&replicas).await;
    let other = |i: usize| 1 - i;
    replicas[other(leader)]
        .as_ref()
        .expect("running")
        .wait_until("the standby caught up", async |r| r.ready_to_lead().await)
        .await;

    // Part 2 first, while both run quietly: CPU and RSS over 10 s.
    let before: Vec<(f64, f64)> = replicas
        .iter()
        .map(|r| r.as_ref().expect("running").cpu_and_rss())
        .collect();
    let window = Duration::from_secs(10);
    tokio::time::sleep(window).await;
    for (i, r) in replicas.iter().enumerate() {
        let (cpu, rss) = r.as_ref().expect("running").cpu_and_rss();
        let role = if i == leader { "leader " } else { "standby" };
        println!(
            "{role}: {:.1} % of a core, RSS {rss:.1} MiB (200 msgs/s of 4 stores + 4 removes)",
            (cpu - before[i].0) / window.as_secs_f64() * 100.0
        );
    }

    let mut to_leader = Vec::new();
    let mut to_first_write = Vec::new();
    for n in 0..args.kills + args.terms {
        let signal = if n < args.kills {
            libc::SIGKILL
        } else {
            libc::SIGTERM
        };
        let next = other(leader);
        let heir = replicas[next].take().expect("running");
        let written_before = (
            heir.metric("kvindex_ha_takeover_seconds_sum").await,
            heir.metric("kvindex_ha_takeover_seconds_count").await,
        );
        let signalled = Instant::now();
        replicas[leader].take().expect("running").stop(signal);
        heir.wait_until("the standby leads", async |r| r.leads().await)
            .await;
        to_leader.push((signal, signalled.elapsed().as_secs_f64()));
        heir.wait_until("the first write", async |r| {
            r.metric("kvindex_ha_takeover_seconds_count").await > written_before.1
        })
        .await;
        let sum = heir.metric("kvindex_ha_takeover_seconds_sum").await;
        to_first_write.push((signal, sum - written_before.0));
        replicas[next] = Some(heir);
        let name = format!("replica-{leader}");
        let back = Replica::start(&args.kvindex, &config, &name);
        back.wait_until("the restarted replica caught up", async |r| {
            r.ready_to_lead().await
        })
        .await;
        replicas[leader] = Some(back);
        leader = next;
    }
    let _ = stop_tx.send(true);
    let _ = publisher.await;
    for (label, signal) in [("SIGKILL", libc::SIGKILL), ("SIGTERM", libc::SIGTERM)] {
        let mut a: Vec<f64> = to_leader
            .iter()
            .filter(|(s, _)| *s == signal)
            .map(|(_, t)| *t)
            .collect();
        show(
            &format!(
                "{label} → the standby's leader gauge (ttl {} ms)",
                args.ttl_ms
            ),
            &mut a,
        );
        let mut b: Vec<f64> = to_first_write
            .iter()
            .filter(|(s, _)| *s == signal)
            .map(|(_, t)| *t)
            .collect();
        show(
            &format!("{label}: previous lease's end → first write (kvindex_ha_takeover_seconds)"),
            &mut b,
        );
    }
    for r in replicas.into_iter().flatten() {
        r.stop(libc::SIGTERM);
    }
}

/// One throughput run: `blocks` one-block stores through the mirror, behind a held lease
/// or not; blocks per second.
async fn throughput(url: &str, blocks: u64, lease: bool, ttl: Duration, run: usize) -> f64 {
    let index = Index::new();
    let pod = format!("bench-{run}-{lease}.bench");
    let source = index
        .register_source(&SourceSpec {
            pod: pod.clone(),
            model: MODEL.to_owned(),
            engine: Engine::Vllm,
            dp_rank: 0,
        })
        .expect("register");
    let target = RedisTarget::Single(url.to_owned());
    let config = RedisConfig {
        target: target.clone(),
        checkpoint: true,
        ..RedisConfig::default()
    };
    let shard = Shard {
        index: run as u32,
        count: 1_000,
    };
    let (gate, lease_task, stop) = if lease {
        let settings = LeaseSettings {
            ttl,
            shard,
            replica: pod.clone(),
        };
        let mut lease = LeaseThread::start(&target, settings).await.expect("Redis");
        let gate = lease.gate();
        let stop = tokio_util::sync::CancellationToken::new();
        lease.begin(Arc::new(|| true), shard, stop.clone());
        (Some(gate), Some(lease), Some(stop))
    } else {
        (None, None, None)
    };
    let mirror =
        MirrorHandle::start_behind(config, index.clone(), TierWeights::default(), gate.clone())
            .await
            .expect("Redis");
    if let Some(gate) = &gate {
        while !matches!(gate.role(), Role::Leader { .. }) || mirror.stats().reconciling {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    mirror.flush().await.expect("flush");
    // The start-up (or takeover) passes end before the clock starts: a takeover's verify runs
    // unthrottled, and a throttled one follows two ttls later; they would be measured
    // instead of the lease.
    let passes = if lease { 2 } else { 1 };
    while mirror.stats().anti_entropy_passes < passes {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let sender = mirror.sender();
    let batches: Vec<EngineBatch> = (0..blocks)
        .map(|i| {
            let tokens = (0..16).map(|t| (i * 16 + t) as u32).collect();
            let stored = BlockStored::new(vec![BlockHash::Int(i + 1)], tokens, 16, Medium::GPU);
            EngineBatch::of(vec![Event::BlockStored(stored)])
        })
        .collect();
    let started = Instant::now();
    for (i, batch) in batches.iter().enumerate() {
        let mut deltas: Vec<Delta> = Vec::new();
        let _ = index.apply(source, batch, 1_700_000_000, &mut deltas);
        let mark = Some(Checkpoint {
            source,
            seq: i as u64 + 1,
        });
        sender.send(deltas, mark).await;
    }
    mirror.flush().await.expect("flush");
    let rate = blocks as f64 / started.elapsed().as_secs_f64();
    if let Some(gate) = &gate {
        if !matches!(gate.role(), Role::Leader { term: 1, .. }) || !gate.is_open() {
            println!("  (run {run}: the lease was lost during the run)");
        }
    }
    mirror.shutdown(Duration::from_secs(30)).await;
    if let (Some(stop), Some(lease)) = (stop, lease_task) {
        stop.cancel();
        lease.finished().await;
    }
    rate
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let redis = RedisServer::start();
    let url = redis.url();
    handovers(&args, &url).await;
    redis.flush();

    // The shipped lease, not the short one of the handovers.
    let ttl = kvindex::store::redis::lease::DEFAULT_LEASE_TTL;
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for round in 0..args.rounds {
        without.push(throughput(&url, args.blocks, false, ttl, 2 * round).await);
        redis.flush();
        with.push(throughput(&url, args.blocks, true, ttl, 2 * round + 1).await);
        redis.flush();
    }
    // Each round's two runs are back to back: their ratio cancels the shared machine's slow
    // swings, which move single runs by a fifth.
    let mut ratios: Vec<f64> = with.iter().zip(&without).map(|(w, wo)| w / wo).collect();
    println!("  runs without: {without:.0?}\n  runs with:    {with:.0?}");
    let median = |v: &mut Vec<f64>| percentile(v, 0.5);
    let (w, wo) = (median(&mut with), median(&mut without));
    println!(
        "writer throughput (1-block stores + checkpoint, {} blocks, {} rounds): median without ha {wo:.0} blocks/s, with ha {w:.0} blocks/s; median of the rounds' ratios {:+.1} % (quartiles {:+.1} … {:+.1} %)",
        args.blocks,
        args.rounds,
        (percentile(&mut ratios, 0.5) - 1.0) * 100.0,
        (percentile(&mut ratios, 0.25) - 1.0) * 100.0,
        (percentile(&mut ratios, 0.75) - 1.0) * 100.0,
    );
}

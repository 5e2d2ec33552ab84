//! A bounded soak of state that must never drift: a churning vLLM stream (stores on
//! GPU and CPU, ~40 % removes, clears) at a fixed rate into `kvindex serve` (in process) with
//! a Redis mirror of its own (`redis-server` on a free 127.0.0.1 port), and on a schedule:
//! at 1/4 of the run Redis is killed and started again empty while the stream goes on; at
//! 2/4 kvindex restarts (the publisher holds back meanwhile, seq going on), so the second
//! daemon warm-starts from the Redis checkpoint; at 3/4 the engine restarts (seq back to 0,
//! new content). RSS is printed every `--sample-secs`. At the end it checks
//! Redis == index == an offline replay of the recorded stream (timestamps aside) and exits
//! non-zero on any difference.
//!
//! Run: `cargo run --release --example state_soak -- --duration 600 [--sample-secs 30]
//! [--rate 500]`

// The binary's allocator, included by path: it is private to the binary.
#[allow(dead_code)]
#[path = "../src/allocator.rs"]
mod allocator;

#[path = "common/churn.rs"]
mod churn;
#[path = "common/cli.rs"]
mod cli;
// `swap_mib` serves the `index_scale` bench.
#[allow(dead_code)]
#[path = "common/measure.rs"]
mod measure;
#[allow(dead_code)] // the benchmark and cli helpers serve the other examples
#[path = "common/redis_server.rs"]
mod redis_server;

use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, Instant};

use churn::{message, Rng};
use clap::Parser;
use kvindex::config::Config;
use kvindex::index::{DumpEntry, Index};
use kvindex::ingest::fixture;
use kvindex::ingest::replay_client::ReplayLimits;
use kvindex::medium::TierWeights;
use kvindex::store::redis::{block_key, field_value, mapping_key, ValueFormat};
use kvindex::store::redis::{dump, RedisDump};
use kvindex::wire::Engine;
use kvindex::Daemon;
use measure::{messages_seen, rss_mib, strip};
use redis_server::RedisServer;
use zeromq::{PubSocket, Socket, SocketSend, ZmqMessage};

// The daemon's allocator (jemalloc by default), so the figures are the daemon's.
#[global_allocator]
static GLOBAL: allocator::Chosen = allocator::Chosen;

const POD: &str = "soak.default";

/// A bounded soak of state that must never drift: Redis, kvindex and the engine restart
/// under a churning stream; exits non-zero if Redis, the index and a replay differ.
#[derive(Parser)]
struct Args {
    /// Seconds the stream runs for.
    #[arg(long, value_name = "SECONDS", default_value = "120", value_parser = cli::secs)]
    duration: Duration,
    /// Seconds between two samples.
    #[arg(
        long = "sample-secs",
        value_name = "SECONDS",
        default_value = "30",
        value_parser = cli::secs,
    )]
    sample: Duration,
    /// Messages a second.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..))]
    rate: u64,
}

async fn start_daemon(text: &str) -> Daemon {
    let config = Config::from_str(text).expect("valid config");
    let daemon = Daemon::start(config, None, ReplayLimits::default())
        .await
        .expect("daemon starts");
    while daemon.supervisor.connected_ranks() < 1 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The PUB drops what it sends before the subscription arrives (the slow joiner).
    tokio::time::sleep(Duration::from_millis(500)).await;
    daemon
}

/// What Redis must hold for the index, in kthena's layout, timestamps and TTLs aside.
fn expected(index: &Index) -> RedisDump {
    let weights = TierWeights::default();
    let mut want = RedisDump::default();
    index.for_each_field(|model, std, _, value| {
        let value = field_value(value, ValueFormat::Tiered, &weights);
        want.blocks
            .entry(block_key(&index.model_name(model), std))
            .or_default()
            .insert(POD.to_owned(), value);
    });
    index.for_each_mapping(|_, engine, hash, std| {
        let entry = kvindex::store::redis::MappingEntry {
            value: std.to_string(),
            ttl: 0,
        };
        want.mappings.insert(mapping_key(engine, POD, &hash), entry);
    });
    without_times(want)
}

fn without_times(mut d: RedisDump) -> RedisDump {
    let blocks: BTreeMap<_, _> = std::mem::take(&mut d.blocks);
    for (key, mut fields) in blocks {
        for value in fields.values_mut() {
            *value = value
                .split_once('|')
                .map_or(String::new(), |(_, m)| m.to_owned());
        }
        d.blocks.insert(key, fields);
    }
    for m in d.mappings.values_mut() {
        m.ttl = 0;
    }
    d
}

#[tokio::main]
async fn main() {
    let a = Args::parse();
    let mut redis = RedisServer::start();
    let redis_port = redis.port;
    let url = redis.url();
    let mut publisher = PubSocket::new();
    let ep = publisher.bind("tcp://127.0.0.1:0").await.expect("bind");
    let zeromq::Endpoint::Tcp(_, port) = ep else {
        panic!("not tcp")
    };
    let text = format!(
        "redis:\n  url: {url}\nmetrics:\n  listen: 127.0.0.1:0\ntargets:\n  - {{pod: soak, model: m, engine: vllm, endpoint: 'tcp://127.0.0.1:{port}'}}\n"
    );
    let mut daemon = start_daemon(&text).await;
    let dir = std::env::temp_dir().join(format!("kvindex-state-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("vllm-soak.jsonl");
    let mut recording = std::io::BufWriter::new(std::fs::File::create(&path).expect("file"));
    let mut rng = Rng(0x5EED_CAFE_F00D_D00D);
    let started = Instant::now();
    let pace = Duration::from_secs(1) / u32::try_from(a.rate).unwrap_or(u32::MAX);
    let (mut seq, mut sent_to_daemon) = (0u64, 0u64);
    let mut next_sample = Duration::ZERO;
    let mut events = ["redis restart", "kvindex restart", "engine restart"].into_iter();
    let mut next_event = a.duration / 4;
    println!("| t s | messages | RSS MiB | index heap MiB | entries |");
    println!("| --- | --- | --- | --- | --- |");
    while started.elapsed() < a.duration {
        let now = started.elapsed();
        if now >= next_sample {
            let st = daemon.index.stats();
            let heap = st.heap_bytes as f64 / f64::from(1 << 20);
            let rss = rss_mib();
            println!(
                "| {} | {seq} | {rss:.1} | {heap:.1} | {} |",
                now.as_secs(),
                st.entries
            );
            next_sample += a.sample;
        }
        if now >= next_event {
            next_event += a.duration / 4;
            match events.next() {
                Some("redis restart") => {
                    drop(redis);
                    redis = RedisServer::start_on(redis_port, &[]);
                    println!(
                        "| {} | redis-server killed and started again empty |",
                        now.as_secs()
                    );
                }
                Some("kvindex restart") => {
                    let seen = |d: &Daemon| messages_seen(d) >= sent_to_daemon;
                    while !seen(&daemon) {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    daemon.shutdown(Duration::from_secs(30)).await;
                    daemon = start_daemon(&text).await;
                    sent_to_daemon = 0;
                    println!("| {} | kvindex restarted (warm start) |", now.as_secs());
                }
                Some(_) => {
                    seq = 0;
                    rng = Rng(0xD1CE_BA5E_0DDB_A110);
                    println!("| {} | engine restarted (seq back to 0) |", now.as_secs());
                }
                None => {}
            }
        }
        let frames = message(seq, &mut rng);
        writeln!(recording, "{}", fixture::format_line(0, &frames)).expect("write");
        let msg = ZmqMessage::try_from(frames).expect("three frames");
        publisher.send(msg).await.expect("send");
        seq += 1;
        sent_to_daemon += 1;
        tokio::time::sleep(pace).await;
    }
    recording.flush().expect("flush");
    drop(recording);
    let end = Instant::now() + Duration::from_secs(120);
    while messages_seen(&daemon) < sent_to_daemon && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let index = daemon.index.clone();
    daemon.shutdown(Duration::from_secs(60)).await;
    let st = index.stats();
    println!(
        "| {} (end) | {seq} | {:.1} | {:.1} | {} |",
        started.elapsed().as_secs(),
        rss_mib(),
        st.heap_bytes as f64 / f64::from(1 << 20),
        st.entries
    );
    let live = strip(index.dump());
    let replay = kvindex::ingest::replay_files(Index::new(), POD, "m", Engine::Vllm, &[path])
        .expect("replay the recording");
    let offline = strip(replay.index().dump());
    let in_redis = without_times(dump(&url, None, Some(POD)).await.expect("dump"));
    let want = expected(&index);
    let diff =
        |a: &[DumpEntry], b: &[DumpEntry]| a.iter().filter(|e| b.binary_search(e).is_err()).count();
    let field_diff = want
        .blocks
        .iter()
        .filter(|(k, f)| in_redis.blocks.get(*k) != Some(*f))
        .count()
        + in_redis
            .blocks
            .keys()
            .filter(|k| !want.blocks.contains_key(*k))
            .count();
    let mapping_diff = (want.mappings != in_redis.mappings) as usize;
    println!(
        "index {} entries, replay {} (missing {}, extra {}); Redis {} block keys, {} differ from the index; mapping keys {}",
        live.len(),
        offline.len(),
        diff(&offline, &live),
        diff(&live, &offline),
        in_redis.blocks.len(),
        field_diff,
        if mapping_diff == 0 { "equal" } else { "DIFFER" }
    );
    drop(redis);
    let _ = std::fs::remove_dir_all(&dir);
    let clean = live == offline && field_diff == 0 && mapping_diff == 0;
    println!(
        "{}",
        if clean {
            "OK: Redis == index == replay"
        } else {
            "DRIFT"
        }
    );
    if !clean {
        std::process::exit(1);
    }
}

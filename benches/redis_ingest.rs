//! Ingest into Redis through the mirror, in blocks per second, against the pipelined limit of
//! the same Redis measured in the same run: `kvindex replay --redis`-style ingest
//! of `--blocks` blocks (default 600,000) as 1-block and as 8-block `BlockStored` events (GPU,
//! tiered values, mapping keys on: `HSET` + `SETEX` per block), each event applied to the
//! index and its deltas handed to the mirror, timed until the mirror has flushed, so the
//! figure is end to end (index + coalescing + encoding + pipelines + Redis).
//!
//! The reference: `redis-benchmark -P 64 -q -t set,hset -n 1000000` against the same
//! redis-server, run by this bench before and after the cases; the limit in blocks/s is one
//! `SET` plus one `HSET` per block, `1 / (1/SET + 1/HSET)`, and each case prints its ratio to
//! the mean of the two runs. The bench starts its own redis-server on a free 127.0.0.1 port
//! (no persistence), so no other client of a shared Redis skews either side.
//!
//! Three variants per event size, so each cost is a ratio within one run:
//! - `kthena`: kthena's layout alone, background passes held to 1 command per second (what
//!   `replay --redis` writes);
//! - `+checkpoint`: the same plus the daemon's checkpoint (`kvindex:` watermark per message,
//!   engine-block state per block);
//! - `serve`: checkpoint and background passes (anti-entropy, refresh, watchdog) at their
//!   defaults, as the daemon runs. The stores carry an old time, so every field is due for a
//!   refresh and the passes work at their rate cap throughout (the worst case).
//!
//! A second reference, Redis's own ceiling for these very commands: the `HSET` + `SETEX` of
//! `--blocks` fresh blocks in kthena's layout, encoded before the clock starts and streamed
//! over one raw socket as `redis-cli --pipe` does. `redis-benchmark` rewrites one key with a
//! 3-byte value; the mirror creates two keys per block (one with a TTL) with longer names, so
//! Redis itself does several times more work per block, and this ceiling shows how much of
//! the gap is Redis's and how much the writer's.
//!
//! Each case also reports Redis's memory growth per block (`used_memory` before and after
//! the run, on a server emptied before it): kthena's layout alone against the checkpoint's
//! share on top.
//!
//! Each flat-out case runs `--repeat` times (default 2) and keeps its best run: other
//! processes on a shared machine only ever slow a run down.
//!
//! Then the write latency (event handed over → written in Redis, p50/p99 of every event) at
//! `--load` (default 0.5) of the lower of the two references, paced for `--paced-secs`
//! (default 3) seconds, for 1-block events in the `kthena` and `serve` variants.
//!
//! Run: `cargo bench --bench redis_ingest [-- --blocks N --repeat R --load F --paced-secs S]`.
//! Needs `redis-server` and `redis-benchmark` on the PATH.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use kvindex::index::{Checkpoint, Delta, Index, SourceSpec};
use kvindex::medium::{Medium, TierWeights};
use kvindex::store::redis::{block_key, mapping_key};
use kvindex::store::redis::{MirrorHandle, MirrorStats, RedisConfig, RedisTarget};
use kvindex::wire::{BlockHash, BlockStored, Engine, EngineBatch, Event};

// `cli` and `flush` serve the examples; this bench empties its server through its client.
#[allow(dead_code)]
#[path = "../examples/common/redis_server.rs"]
mod redis_server;

use redis_server::RedisServer;

const BLOCK_SIZE: u32 = 16;

/// Command-line settings.
struct Args {
    blocks: u64,
    repeat: u32,
    load: f64,
    paced_secs: f64,
}

fn args() -> Args {
    let mut a = Args {
        blocks: 600_000,
        repeat: 2,
        load: 0.5,
        paced_secs: 3.0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--blocks" => a.blocks = it.next().and_then(|v| v.parse().ok()).unwrap_or(a.blocks),
            "--repeat" => a.repeat = it.next().and_then(|v| v.parse().ok()).unwrap_or(a.repeat),
            "--load" => a.load = it.next().and_then(|v| v.parse().ok()).unwrap_or(a.load),
            "--paced-secs" => {
                a.paced_secs = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(a.paced_secs)
            }
            // `cargo bench` passes `--bench`; anything else is ignored too.
            _ => {}
        }
    }
    a
}

/// Appends one command in RESP.
fn resp(out: &mut Vec<u8>, args: &[&str]) {
    let _ = write!(out, "*{}\r\n", args.len());
    for arg in args {
        let _ = write!(out, "${}\r\n{arg}\r\n", arg.len());
    }
}

/// Redis's ceiling for the mirror's commands in blocks/s (see the header).
fn ceiling(port: u16, blocks: u64) -> f64 {
    let pod = "bench-ceiling.bench";
    let mut bytes = Vec::with_capacity(blocks as usize * 200);
    for i in 0..blocks {
        let std = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 1;
        resp(
            &mut bytes,
            &[
                "HSET",
                &block_key("bench-model", std),
                pod,
                "1700000000|GPU",
            ],
        );
        let mk = mapping_key(Engine::Vllm, pod, &BlockHash::Int(i));
        resp(&mut bytes, &["SETEX", &mk, "86400", &std.to_string()]);
    }
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let mut reader = stream.try_clone().expect("clone the socket");
    let replies = 2 * blocks;
    let started = Instant::now();
    let read = std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 16];
        let mut lines = 0u64;
        while lines < replies {
            let n = reader.read(&mut buf).expect("read replies");
            assert!(n > 0, "Redis closed the connection");
            lines += buf[..n].iter().filter(|&&b| b == b'\n').count() as u64;
        }
    });
    stream.write_all(&bytes).expect("write commands");
    read.join().expect("reader");
    blocks as f64 / started.elapsed().as_secs_f64()
}

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

/// A connection to the bench's Redis.
async fn connect(url: &str) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(url).expect("URL");
    client
        .get_multiplexed_async_connection()
        .await
        .expect("the bench's Redis")
}

/// The text of `INFO memory`.
async fn info_memory(conn: &mut redis::aio::MultiplexedConnection) -> String {
    redis::cmd("INFO")
        .arg("memory")
        .query_async(conn)
        .await
        .expect("INFO memory")
}

/// Empties the server and waits until Redis has freed the keys (lazy free runs on Redis's
/// CPU and would otherwise slow whichever case comes next).
async fn flush_server(url: &str) {
    let mut conn = connect(url).await;
    let _: () = redis::cmd("FLUSHALL")
        .arg("ASYNC")
        .query_async(&mut conn)
        .await
        .expect("FLUSHALL");
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(120) {
        if info_memory(&mut conn)
            .await
            .contains("lazyfree_pending_objects:0\r")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Redis's `used_memory` in bytes.
async fn used_memory(url: &str) -> u64 {
    let info = info_memory(&mut connect(url).await).await;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("INFO memory names used_memory")
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

    fn config(self, url: &str) -> RedisConfig {
        let mut config = RedisConfig {
            target: RedisTarget::Single(url.to_owned()),
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

/// One case's outcome.
struct Outcome {
    blocks_per_s: f64,
    stats: MirrorStats,
    /// Redis's memory growth over the run, per block.
    redis_bytes_per_block: f64,
}

/// Ingests `blocks` blocks as `per_event`-block events; paced at `rate` blocks/s when given
/// (flat out otherwise).
fn run(
    rt: &tokio::runtime::Runtime,
    url: &str,
    per_event: u64,
    variant: Variant,
    blocks: u64,
    rate: Option<f64>,
) -> Outcome {
    let index = Index::new();
    let source = index
        .register_source(&SourceSpec {
            pod: format!("bench-{per_event}-{}.bench", variant.label()),
            model: "bench-model".to_owned(),
            engine: Engine::Vllm,
            dp_rank: 0,
        })
        .expect("register");
    let mirror = rt
        .block_on(MirrorHandle::start(
            variant.config(url),
            index.clone(),
            TierWeights::default(),
        ))
        .expect("the bench's Redis");
    let sender = mirror.sender();
    // Built before the clock starts, so only ingest is timed.
    let batches: Vec<EngineBatch> = (0..blocks / per_event)
        .map(|i| EngineBatch::of(vec![event(i * per_event, per_event, per_event)]))
        .collect();
    let checkpoint = variant != Variant::Kthena;
    let memory_before = rt.block_on(used_memory(url));
    let started = Instant::now();
    rt.block_on(async {
        for (i, batch) in batches.iter().enumerate() {
            if let Some(rate) = rate {
                let due = started + Duration::from_secs_f64((i as u64 * per_event) as f64 / rate);
                if due > Instant::now() + Duration::from_millis(1) {
                    tokio::time::sleep_until(due.into()).await;
                }
            }
            let mut deltas: Vec<Delta> = Vec::new();
            let _ = index.apply(source, batch, 1_700_000_000, &mut deltas);
            let mark = checkpoint.then_some(Checkpoint {
                source,
                seq: i as u64 + 1,
            });
            sender.send(deltas, mark).await;
        }
        mirror.flush().await.expect("flush");
    });
    let took = started.elapsed();
    let memory_after = rt.block_on(used_memory(url));
    let stats = mirror.stats();
    rt.block_on(mirror.shutdown(Duration::from_secs(30)));
    drop(batches);
    rt.block_on(flush_server(url));
    Outcome {
        blocks_per_s: blocks as f64 / took.as_secs_f64(),
        stats,
        redis_bytes_per_block: memory_after.saturating_sub(memory_before) as f64 / blocks as f64,
    }
}

fn main() {
    let a = args();
    let server = RedisServer::start();
    let url = server.url();
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    let (set0, hset0) = server.benchmark();
    rt.block_on(flush_server(&url));
    let ceiling0 = ceiling(server.port, a.blocks);
    rt.block_on(flush_server(&url));
    let mut rows = Vec::new();
    for per_event in [1u64, 8] {
        for variant in [Variant::Kthena, Variant::Checkpoint, Variant::Serve] {
            let out = (0..a.repeat.max(1))
                .map(|_| run(&rt, &url, per_event, variant, a.blocks, None))
                .max_by(|x, y| x.blocks_per_s.total_cmp(&y.blocks_per_s))
                .expect("one run at least");
            rows.push((per_event, variant, out));
        }
    }
    let ceiling1 = ceiling(server.port, a.blocks);
    rt.block_on(flush_server(&url));
    let (set1, hset1) = server.benchmark();
    rt.block_on(flush_server(&url));
    let limit_of = |set: f64, hset: f64| 1.0 / (1.0 / set + 1.0 / hset);
    let limit = (limit_of(set0, hset0) + limit_of(set1, hset1)) / 2.0;
    let same = (ceiling0 + ceiling1) / 2.0;
    println!(
        "redis-benchmark -P 64: SET {set0:.0}/s HSET {hset0:.0}/s before, SET {set1:.0}/s HSET {hset1:.0}/s after; limit {limit:.0} blocks/s (SET + HSET per block, mean of both runs)"
    );
    println!(
        "Redis's ceiling for the mirror's own commands (raw pipe): {ceiling0:.0} blocks/s before, {ceiling1:.0} after; mean {same:.0} blocks/s = {:.1} % of the redis-benchmark limit",
        100.0 * same / limit
    );
    println!("| events | variant | blocks/s | % of limit | % of ceiling | cost vs kthena | pipelines | commands | flush p99 µs | write p99 µs | Redis B/block |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for (per_event, variant, out) in &rows {
        let reference = rows
            .iter()
            .find(|(n, v, _)| n == per_event && *v == Variant::Kthena)
            .map_or(out.blocks_per_s, |(_, _, o)| o.blocks_per_s);
        println!(
            "| {per_event}-block | {} | {:.0} | {:.1} % | {:.1} % | {:.1} % | {} | {} | {} | {} | {:.0} |",
            variant.label(),
            out.blocks_per_s,
            100.0 * out.blocks_per_s / limit,
            100.0 * out.blocks_per_s / same,
            100.0 * (1.0 - out.blocks_per_s / reference),
            out.stats.pipelines,
            out.stats.commands,
            out.stats.flush_p99_us,
            out.stats.write_p99_us,
            out.redis_bytes_per_block,
        );
    }
    let rate = a.load * limit.min(same);
    let paced_blocks = (rate * a.paced_secs) as u64;
    for variant in [Variant::Kthena, Variant::Serve] {
        let out = run(&rt, &url, 1, variant, paced_blocks, Some(rate));
        println!(
            "paced 1-block {} at {:.0} % of the lower reference ({rate:.0} blocks/s target, {:.0} achieved): write latency p50 {} µs, p99 {} µs",
            variant.label(),
            100.0 * a.load,
            out.blocks_per_s,
            out.stats.write_p50_us,
            out.stats.write_p99_us
        );
    }
}

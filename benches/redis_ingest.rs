//! Ingest into Redis through the mirror, in blocks per second, against what the same Redis
//! takes for the mirror's own commands, measured in the same run: `kvindex replay
//! --redis`-style ingest of `--blocks` blocks (default 600,000) as 1-block and as 8-block
//! `BlockStored` events (GPU, tiered values, mapping keys on: `HSET` + `SETEX` per block),
//! each event applied to the index and its deltas handed to the mirror, timed until the
//! mirror has flushed, so the figure is end to end (index, coalescing, encoding, pipelines,
//! Redis). The bench starts its own redis-server on a free 127.0.0.1 port (no persistence),
//! so no other client of a shared Redis skews either side.
//!
//! Three variants per event size, so each cost is a ratio within one run:
//! - `kthena`: kthena's layout alone, background passes held to 1 command per second (what
//!   `replay --redis` writes);
//! - `+checkpoint`: the same plus the daemon's checkpoint (`kvindex:` watermark per flush,
//!   engine-block state per block);
//! - `serve`: checkpoint and background passes (anti-entropy, refresh, watchdog) at their
//!   defaults, as the daemon runs. The stores carry an old time, so every field is due for a
//!   refresh and the passes work at their rate cap throughout (the worst case).
//!
//! `kthena` and `+checkpoint` run once per writer connection count in `--connections`
//! (default `1,4`; `RedisConfig::connections`); `serve` runs with the default count.
//!
//! Two references, each measured before and after the cases (the mean is what rows divide
//! by), every run on a server emptied first, so each starts on an empty keyspace:
//! - multi-client: `redis-benchmark -P 64 -c 50 -r 100000000 -n N` (N = `--blocks`, at least
//!   100,000) with the mirror's exact commands, every `__rand_int__` a random 12-digit number,
//!   so nearly every request creates a key or field as the mirror's do:
//!   `HSET matrix:kv:block:bench-model@1234567__rand_int__ {pod} 1700000000|GPU` (a 19-digit
//!   std hash like the mirror's), `SETEX vllm:kv:block:{pod}@1__rand_int__ 86400 {std hash}`
//!   (the mirror's own `SETEX`, not `SET … EX`) and, for the checkpoint,
//!   `HSET kvindex:src:{pod}#0@bench-model __rand_int__ {value}` with a checkpoint value of
//!   a block with chain and parent (47 bytes). Each command is its own run; the limit in
//!   blocks/s is `1 / (1/HSET + 1/SETEX)`, plus `1/checkpoint HSET` for the checkpoint.
//! - single connection: the same commands for `--blocks` fresh blocks, encoded before the
//!   clock starts and streamed over one raw socket as `redis-cli --pipe` does.
//!
//! How the checkpoint's reference differs from the writer: the reference sends one `HSET`
//! of one field per block (the per-block layout kvindex wrote before its log), where the
//! writer sends one log segment per state key per flush (one field holding every entry of
//! that flush) and one watermark `HSET` per flush, so a `+checkpoint` row may pass it.
//!
//! Each case also reports Redis's memory growth per block (`used_memory` before and after
//! the run, on a server emptied before it): kthena's layout alone against the checkpoint's
//! share on top.
//!
//! Each flat-out case runs `--repeat` times (default 2) and keeps its best run: other
//! processes on a shared machine only ever slow a run down.
//!
//! Then the write latency (event handed over → written in Redis, p50/p99 of every event) at
//! `--load` (default 0.5) of the lower of the two `kthena` references, paced for
//! `--paced-secs` (default 3) seconds, for 1-block events in the `kthena` and `serve`
//! variants with the default connection count.
//!
//! Run: `cargo bench --bench redis_ingest [-- --blocks N --repeat R --connections 1,4 --load F
//! --paced-secs S]`. Needs `redis-server` and `redis-benchmark` on the PATH.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use kvindex::index::{Checkpoint, Delta, EngineState, Index, SourceSpec};
use kvindex::medium::{MediaSet, Medium, TierWeights};
use kvindex::store::redis::checkpoint::{engine_field, engine_value, state_key};
use kvindex::store::redis::{block_key, mapping_key};
use kvindex::store::redis::{MirrorHandle, MirrorStats, RedisConfig, RedisTarget};
use kvindex::wire::{BlockHash, BlockStored, Engine, EngineBatch, Event};

// The binary's allocator, included by path: it is private to the binary.
#[allow(dead_code)]
#[path = "../src/allocator.rs"]
mod allocator;

// `cli`, `flush` and `benchmark` serve the examples; this bench empties its server through
// its client.
#[allow(dead_code)]
#[path = "../examples/common/redis_server.rs"]
mod redis_server;

use redis_server::RedisServer;

// The daemon's allocator (jemalloc by default), so the figures are the daemon's.
#[global_allocator]
static GLOBAL: allocator::Chosen = allocator::Chosen;

const BLOCK_SIZE: u32 = 16;
/// The model every case and reference writes.
const MODEL: &str = "bench-model";
/// The pod the references write as (as long as the cases' pod names).
const REFERENCE_POD: &str = "bench-reference.bench";
/// The store time of every block (Unix seconds).
const STORED_AT: u32 = 1_700_000_000;
/// A 19-digit std hash, as long as most of the mirror's.
const SAMPLE_STD: u64 = 0x9E37_79B9_7F4A_7C15 >> 1;

/// Command-line settings.
struct Args {
    blocks: u64,
    repeat: u32,
    load: f64,
    paced_secs: f64,
    /// Writer connection counts the `kthena` and `+checkpoint` variants run with.
    connections: Vec<usize>,
}

fn args() -> Args {
    let mut a = Args {
        blocks: 600_000,
        repeat: 2,
        load: 0.5,
        paced_secs: 3.0,
        connections: vec![1, 4],
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
            "--connections" => {
                let list = connection_list(&it.next().unwrap_or_default());
                if !list.is_empty() {
                    a.connections = list;
                }
            }
            // `cargo bench` passes `--bench`; anything else is ignored too.
            _ => {}
        }
    }
    a
}

/// `1,4` → `[1, 4]`; zeros and what does not parse are left out.
fn connection_list(text: &str) -> Vec<usize> {
    text.split(',')
        .filter_map(|v| v.trim().parse().ok())
        .filter(|&n| n > 0)
        .collect()
}

/// kthena's field value of a GPU block stored at [`STORED_AT`].
fn field_text() -> String {
    format!("{STORED_AT}|GPU")
}

/// The checkpoint entry of a GPU block with chain and parent (the longest, 47 bytes).
fn checkpoint_text() -> String {
    engine_value(&EngineState {
        std_hash: SAMPLE_STD,
        media: MediaSet::single(Medium::GPU),
        stored_at: STORED_AT,
        chain: SAMPLE_STD ^ 0x5555,
        parent: SAMPLE_STD ^ 0xAAAA,
    })
}

/// Requests per second of each of one block's commands, from `redis-benchmark`.
#[derive(Debug, Clone, Copy)]
struct Rates {
    hset: f64,
    setex: f64,
    checkpoint: f64,
}

impl Rates {
    /// The limits in blocks/s: one of each command per block.
    fn limits(self) -> Limits {
        let kthena = 1.0 / self.hset + 1.0 / self.setex;
        Limits {
            kthena: 1.0 / kthena,
            checkpoint: 1.0 / (kthena + 1.0 / self.checkpoint),
        }
    }
}

/// A reference's limit in blocks/s, without and with the checkpoint.
#[derive(Debug, Clone, Copy)]
struct Limits {
    kthena: f64,
    checkpoint: f64,
}

impl Limits {
    fn mean(a: Limits, b: Limits) -> Limits {
        Limits {
            kthena: (a.kthena + b.kthena) / 2.0,
            checkpoint: (a.checkpoint + b.checkpoint) / 2.0,
        }
    }

    /// The limit `variant` is measured against.
    fn of(self, variant: Variant) -> f64 {
        match variant {
            Variant::Kthena => self.kthena,
            Variant::Checkpoint | Variant::Serve => self.checkpoint,
        }
    }
}

/// The multi-client reference: each of the mirror's commands from `redis-benchmark` with
/// random new keys, each run on an emptied server (see the header).
fn multi_client(rt: &tokio::runtime::Runtime, server: &RedisServer, requests: u64) -> Rates {
    let url = server.url();
    let block = format!("{}__rand_int__", block_key(MODEL, 1_234_567));
    let mapping = format!(
        "{}__rand_int__",
        mapping_key(Engine::Vllm, REFERENCE_POD, &BlockHash::Int(1))
    );
    let state = state_key(REFERENCE_POD, 0, MODEL);
    let (field, std, entry) = (field_text(), SAMPLE_STD.to_string(), checkpoint_text());
    let run = |command: &[&str]| {
        rt.block_on(flush_server(&url));
        let rate = server.benchmark_command(requests, command);
        rt.block_on(flush_server(&url));
        rate
    };
    Rates {
        hset: run(&["HSET", &block, REFERENCE_POD, &field]),
        setex: run(&["SETEX", &mapping, "86400", &std]),
        checkpoint: run(&["HSET", &state, "__rand_int__", &entry]),
    }
}

/// Appends one command in RESP.
fn resp(out: &mut Vec<u8>, args: &[&str]) {
    let _ = write!(out, "*{}\r\n", args.len());
    for arg in args {
        let _ = write!(out, "${}\r\n{arg}\r\n", arg.len());
    }
}

/// One block's commands for `blocks` fresh blocks in RESP, and how many there are.
fn encode_blocks(blocks: u64, checkpoint: bool) -> (Vec<u8>, u64) {
    let (field, entry) = (field_text(), checkpoint_text());
    let state = state_key(REFERENCE_POD, 0, MODEL);
    let mut bytes = Vec::with_capacity(blocks as usize * if checkpoint { 300 } else { 200 });
    for i in 0..blocks {
        let std = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 1;
        let engine = BlockHash::Int(i);
        resp(
            &mut bytes,
            &["HSET", &block_key(MODEL, std), REFERENCE_POD, &field],
        );
        let mk = mapping_key(Engine::Vllm, REFERENCE_POD, &engine);
        resp(&mut bytes, &["SETEX", &mk, "86400", &std.to_string()]);
        if checkpoint {
            resp(
                &mut bytes,
                &["HSET", &state, &engine_field(&engine), &entry],
            );
        }
    }
    (bytes, blocks * if checkpoint { 3 } else { 2 })
}

/// The single-connection reference in blocks/s (see the header), on an emptied server, and
/// the CPU Redis spent per block on it, in µs.
fn pipe(
    rt: &tokio::runtime::Runtime,
    server: &RedisServer,
    blocks: u64,
    checkpoint: bool,
) -> (f64, f64) {
    let (bytes, replies) = encode_blocks(blocks, checkpoint);
    rt.block_on(flush_server(&server.url()));
    let cpu = server.cpu_seconds();
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", server.port)).expect("connect");
    let mut reader = stream.try_clone().expect("clone the socket");
    let started = Instant::now();
    // Every reply (`:1`, `+OK`) is one line.
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
    let rate = blocks as f64 / started.elapsed().as_secs_f64();
    let us = 1e6 * (server.cpu_seconds() - cpu) / blocks as f64;
    rt.block_on(flush_server(&server.url()));
    (rate, us)
}

/// Both references, measured once.
struct References {
    multi: Rates,
    pipe: Limits,
    /// Redis's CPU per block on the pipe, µs: kthena's commands, and with the checkpoint.
    pipe_redis_us: (f64, f64),
}

fn references(rt: &tokio::runtime::Runtime, server: &RedisServer, blocks: u64) -> References {
    let multi = multi_client(rt, server, blocks.max(100_000));
    let (kthena, kthena_us) = pipe(rt, server, blocks, false);
    let (checkpoint, checkpoint_us) = pipe(rt, server, blocks, true);
    References {
        multi,
        pipe: Limits { kthena, checkpoint },
        pipe_redis_us: (kthena_us, checkpoint_us),
    }
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

    fn config(self, url: &str, connections: usize) -> RedisConfig {
        let mut config = RedisConfig {
            target: RedisTarget::Single(url.to_owned()),
            checkpoint: self != Variant::Kthena,
            connections,
            ..RedisConfig::default()
        };
        if self != Variant::Serve {
            config.anti_entropy_max_commands_per_s = 1;
            config.anti_entropy_interval = Duration::from_secs(86_400);
        }
        config
    }
}

/// One case: event size, variant and writer connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Case {
    per_event: u64,
    variant: Variant,
    connections: usize,
}

/// The flat-out cases: `kthena` and `+checkpoint` per connection count, `serve` with the
/// default count, for 1- and 8-block events.
fn cases(connections: &[usize]) -> Vec<Case> {
    let mut all = Vec::new();
    for per_event in [1u64, 8] {
        for variant in [Variant::Kthena, Variant::Checkpoint] {
            for &connections in connections {
                all.push(Case {
                    per_event,
                    variant,
                    connections,
                });
            }
        }
        all.push(Case {
            per_event,
            variant: Variant::Serve,
            connections: RedisConfig::default().connections,
        });
    }
    all
}

/// One case's outcome.
struct Outcome {
    blocks_per_s: f64,
    stats: MirrorStats,
    /// Redis's memory growth over the run, per block.
    redis_bytes_per_block: f64,
    /// Redis's CPU over the run, per block, µs.
    redis_us_per_block: f64,
    /// This process's CPU over the run (ingest and the writer), per block, µs.
    own_us_per_block: f64,
}

/// Ingests `blocks` blocks as `case.per_event`-block events; paced at `rate` blocks/s when
/// given (flat out otherwise).
fn run(
    rt: &tokio::runtime::Runtime,
    server: &RedisServer,
    case: Case,
    blocks: u64,
    rate: Option<f64>,
) -> Outcome {
    let Case {
        per_event,
        variant,
        connections,
    } = case;
    let url = &server.url();
    let index = Index::new();
    let source = index
        .register_source(&SourceSpec {
            pod: format!("bench-{per_event}-{}.bench", variant.label()),
            model: MODEL.to_owned(),
            engine: Engine::Vllm,
            dp_rank: 0,
        })
        .expect("register");
    let mirror = rt
        .block_on(MirrorHandle::start(
            variant.config(url, connections),
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
    let (redis_cpu, own_cpu) = (server.cpu_seconds(), process_cpu_seconds());
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
            let _ = index.apply(source, batch, STORED_AT, &mut deltas);
            let mark = checkpoint.then_some(Checkpoint {
                source,
                seq: i as u64 + 1,
            });
            sender.send(deltas, mark).await;
        }
        mirror.flush().await.expect("flush");
    });
    let took = started.elapsed();
    let per_block = |seconds: f64| 1e6 * seconds / blocks as f64;
    let redis_us_per_block = per_block(server.cpu_seconds() - redis_cpu);
    let own_us_per_block = per_block(process_cpu_seconds() - own_cpu);
    let memory_after = rt.block_on(used_memory(url));
    let stats = mirror.stats();
    rt.block_on(mirror.shutdown(Duration::from_secs(30)));
    drop(batches);
    rt.block_on(flush_server(url));
    Outcome {
        blocks_per_s: blocks as f64 / took.as_secs_f64(),
        stats,
        redis_bytes_per_block: memory_after.saturating_sub(memory_before) as f64 / blocks as f64,
        redis_us_per_block,
        own_us_per_block,
    }
}

/// CPU seconds this process (ingest and the writer) has used so far.
fn process_cpu_seconds() -> f64 {
    redis_server::thread_cpu::cpu_time(libc::CLOCK_PROCESS_CPUTIME_ID).as_secs_f64()
}

/// Prints both references, before and after the cases; returns their means.
fn print_references(before: &References, after: &References, requests: u64) -> (Limits, Limits) {
    let multi = Limits::mean(before.multi.limits(), after.multi.limits());
    let pipe = Limits::mean(before.pipe, after.pipe);
    for (when, r) in [("before", before), ("after", after)] {
        let l = r.multi.limits();
        println!(
            "{when}: redis-benchmark -P 64 -c 50, random new keys, -n {requests}: HSET {:.0}/s, SETEX {:.0}/s, checkpoint HSET {:.0}/s → {:.0} blocks/s kthena, {:.0} +checkpoint; one connection, raw pipe: {:.0} blocks/s kthena, {:.0} +checkpoint",
            r.multi.hset, r.multi.setex, r.multi.checkpoint, l.kthena, l.checkpoint, r.pipe.kthena, r.pipe.checkpoint,
        );
        println!(
            "{when}: Redis's CPU per block on the pipe: {:.2} µs kthena, {:.2} µs +checkpoint",
            r.pipe_redis_us.0, r.pipe_redis_us.1,
        );
    }
    println!(
        "mean: redis-benchmark {:.0} blocks/s kthena, {:.0} +checkpoint; pipe {:.0} kthena ({:.1} % of redis-benchmark), {:.0} +checkpoint ({:.1} %)",
        multi.kthena,
        multi.checkpoint,
        pipe.kthena,
        100.0 * pipe.kthena / multi.kthena,
        pipe.checkpoint,
        100.0 * pipe.checkpoint / multi.checkpoint,
    );
    (multi, pipe)
}

/// The `kthena` row a row's checkpoint cost is measured against: same event size, same
/// connections, else the first `kthena` row of that event size.
fn kthena_of(rows: &[(Case, Outcome)], case: Case) -> Option<&Outcome> {
    let kthena =
        |(c, _): &&(Case, Outcome)| c.variant == Variant::Kthena && c.per_event == case.per_event;
    rows.iter()
        .filter(kthena)
        .find(|(c, _)| c.connections == case.connections)
        .or_else(|| rows.iter().find(kthena))
        .map(|(_, o)| o)
}

fn print_table(rows: &[(Case, Outcome)], multi: Limits, pipe: Limits) {
    println!("| events | variant | conns | blocks/s | ÷ redis-benchmark | ÷ pipe | cost vs kthena | Redis µs/block | kvindex µs/block | pipelines | commands | flush p99 µs | write p99 µs | Redis B/block |");
    println!(
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for (case, out) in rows {
        let cost = match kthena_of(rows, *case) {
            Some(k) if case.variant != Variant::Kthena => {
                format!("{:.1} %", 100.0 * (1.0 - out.blocks_per_s / k.blocks_per_s))
            }
            _ => "—".to_owned(),
        };
        println!(
            "| {}-block | {} | {} | {:.0} | {:.1} % | {:.1} % | {cost} | {:.2} | {:.2} | {} | {} | {} | {} | {:.0} |",
            case.per_event,
            case.variant.label(),
            case.connections,
            out.blocks_per_s,
            100.0 * out.blocks_per_s / multi.of(case.variant),
            100.0 * out.blocks_per_s / pipe.of(case.variant),
            out.redis_us_per_block,
            out.own_us_per_block,
            out.stats.pipelines,
            out.stats.commands,
            out.stats.flush_p99_us,
            out.stats.write_p99_us,
            out.redis_bytes_per_block,
        );
    }
}

fn main() {
    let a = args();
    let server = RedisServer::start();
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    let requests = a.blocks.max(100_000);
    println!(
        "{} blocks per case, best of {}, allocator {}",
        a.blocks,
        a.repeat.max(1),
        allocator::NAME
    );
    let before = references(&rt, &server, a.blocks);
    let rows: Vec<(Case, Outcome)> = cases(&a.connections)
        .into_iter()
        .map(|case| {
            let best = (0..a.repeat.max(1))
                .map(|_| run(&rt, &server, case, a.blocks, None))
                .max_by(|x, y| x.blocks_per_s.total_cmp(&y.blocks_per_s))
                .expect("one run at least");
            (case, best)
        })
        .collect();
    let after = references(&rt, &server, a.blocks);
    let (multi, pipe) = print_references(&before, &after, requests);
    print_table(&rows, multi, pipe);
    let rate = a.load * multi.kthena.min(pipe.kthena);
    let paced_blocks = (rate * a.paced_secs) as u64;
    for variant in [Variant::Kthena, Variant::Serve] {
        let case = Case {
            per_event: 1,
            variant,
            connections: RedisConfig::default().connections,
        };
        let out = run(&rt, &server, case, paced_blocks, Some(rate));
        println!(
            "paced 1-block {} ({} connections) at {:.0} % of the lower kthena reference ({rate:.0} blocks/s target, {:.0} achieved): write latency p50 {} µs, p99 {} µs",
            variant.label(),
            case.connections,
            100.0 * a.load,
            out.blocks_per_s,
            out.stats.write_p50_us,
            out.stats.write_p99_us
        );
    }
}

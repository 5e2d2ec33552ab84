//! The ingest path's cost against the SHA-256 floor measured in the same run: one SHA-256 of
//! a 64-byte block, the least a block of kthena's std layer costs (`openssl speed -bytes 64
//! -seconds 3 sha256`, hashes/s).
//!
//! - **replay**: `kvindex replay` end to end (reading the JSON lines, base64, decode, seq
//!   tracking, hashing, index) of a recording of `--replay-messages` messages, each one vLLM
//!   `BlockStored` of 8 blocks (array era, int hashes, 16 tokens a block, GPU; prompts of 128
//!   blocks, every block new): blocks/s of wall time against the floor.
//! - **in process**: the serve stream's decode alone, then decode + index (the index the
//!   daemon's config builds, no mirror) of its first 16,000 blocks and of all of it, each
//!   into a fresh index, on this thread, in ns of its CPU time per block: what the daemon's
//!   CPU below is compared with.
//! - **serve**: `kvindex serve` (no Redis; the default `ingest`, then `std_hashes: false`)
//!   draining a backlog of `--serve-messages` such messages over ZeroMQ: CPU seconds of the
//!   daemon (`/proc/PID/stat`, every thread) per block stored against the floor's per hash,
//!   and its minor page faults (fresh memory the kernel zeroes).
//!   The publisher is a minimal ZMTP PUB of this example's own over one TCP connection, which
//!   writes the whole stream as fast as the daemon reads it: TCP pushes back instead of the
//!   `zeromq` crate's PUB dropping what its queue cannot hold, so nothing is lost. The run
//!   checks the daemon's counters (`GET /v1/pods`): every message received, every block
//!   stored, no seq gap and no decode error.
//!
//! Everything is on 127.0.0.1 and bounded by `--timeout-secs`. `--recording FILE` keeps the
//! recording, to profile `kvindex replay` on it; `--kvindex` may name a wrapper script (a
//! profiler in front of the binary): the daemon is stopped with SIGTERM, so it exits cleanly.
//!
//! Run: `cargo build --release --bin kvindex && cargo run --release --example ingest_cost --
//! [--replay-messages 50000] [--serve-messages 200000] [--kvindex PATH] [--recording FILE]`

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use kvindex::config::Config;
use kvindex::index::{Discard, Index, SourceSpec};
use kvindex::ingest::fixture::format_line;
use kvindex::wire::{decode_message, DecodeOptions, Engine};
use rmpv::Value as V;

// The daemon's allocator (jemalloc by default), so the in-process figures are the daemon's.
#[allow(dead_code)]
#[path = "../src/allocator.rs"]
mod allocator;

#[global_allocator]
static GLOBAL: allocator::Chosen = allocator::Chosen;

#[path = "common/daemon_log.rs"]
mod daemon_log;
#[path = "../benches/common/proc_status.rs"]
mod proc_status;
#[path = "../benches/common/rng.rs"]
mod rng;
#[path = "../benches/common/thread_cpu.rs"]
mod thread_cpu;

use rng::Rng;
use thread_cpu::thread_cpu;

/// Blocks in one message's `BlockStored`.
const BLOCKS_PER_MESSAGE: u64 = 8;
/// Tokens in a block.
const BLOCK_SIZE: u64 = 16;
/// Messages of one prompt: each chains on the one before, the first on nothing.
const MESSAGES_PER_PROMPT: u64 = 16;

/// The ingest path's cost against `openssl speed`'s SHA-256 of a 64-byte block.
#[derive(Parser)]
struct Args {
    /// 8-block messages in the recording `kvindex replay` reads.
    #[arg(long, default_value_t = 50_000)]
    replay_messages: u64,
    /// 8-block messages the daemon drains.
    #[arg(long, default_value_t = 200_000)]
    serve_messages: u64,
    /// The kvindex binary (default: `kvindex` next to this example's directory, the same
    /// target directory and profile).
    #[arg(long)]
    kvindex: Option<PathBuf>,
    /// Longest a replay or a drain may take before the run gives up.
    #[arg(long, default_value_t = 300)]
    timeout_secs: u64,
    /// Keep the recording at this path (to profile `kvindex replay` on it) instead of in a
    /// temporary directory.
    #[arg(long)]
    recording: Option<PathBuf>,
}

/// Engine hash of block `n` of the stream: distinct for every `n` (an odd multiplier is a
/// bijection), spread over all 64 bits as vLLM's int hashes are.
fn engine_hash(n: u64) -> u64 {
    (n + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// The payload of message `seq`: one batch of one 8-block `BlockStored`.
fn payload(seq: u64, rng: &mut Rng) -> Vec<u8> {
    let first = seq * BLOCKS_PER_MESSAGE;
    let hashes = (first..first + BLOCKS_PER_MESSAGE).map(|n| V::from(engine_hash(n)));
    let parent = if seq.is_multiple_of(MESSAGES_PER_PROMPT) {
        V::Nil
    } else {
        V::from(engine_hash(first - 1))
    };
    let tokens = (0..BLOCKS_PER_MESSAGE * BLOCK_SIZE).map(|_| V::from(rng.next() % 151_000));
    let event = V::Array(vec![
        V::from("BlockStored"),
        V::Array(hashes.collect()),
        parent,
        V::Array(tokens.collect()),
        V::from(BLOCK_SIZE),
        V::Nil,
        V::from("GPU"),
    ]);
    let batch = V::Array(vec![V::F64(1.0), V::Array(vec![event])]);
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &batch).expect("encoding into a Vec cannot fail");
    out
}

/// One message's three frames: topic, seq, payload.
type Frames = [Vec<u8>; 3];

/// The first `messages` messages of the stream (always the same).
fn stream(messages: u64) -> Vec<Frames> {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    (0..messages)
        .map(|seq| {
            let payload = payload(seq, &mut rng);
            [b"kv".to_vec(), seq.to_be_bytes().to_vec(), payload]
        })
        .collect()
}

/// `openssl speed -bytes 64 -seconds 3 sha256`: SHA-256 hashes of 64 bytes per second.
fn sha256_floor() -> f64 {
    let out = Command::new("openssl")
        .args(["speed", "-bytes", "64", "-seconds", "3", "sha256"])
        .stderr(Stdio::null())
        .output()
        .expect("openssl on the PATH");
    let text = String::from_utf8_lossy(&out.stdout);
    let kilobytes: f64 = text
        .lines()
        .find_map(|l| {
            l.strip_prefix("sha256")?
                .trim()
                .strip_suffix('k')?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no sha256 figure in openssl's output: {text}"));
    kilobytes * 1000.0 / 64.0
}

/// CPU seconds (user + system, every thread) and minor page faults of process `pid` so far.
fn cpu_and_faults(pid: u32) -> (f64, f64) {
    let (cpu, faults) = thread_cpu::process_cpu_and_faults(pid);
    (cpu.as_secs_f64(), faults as f64)
}

/// Peak RSS (`VmHWM`) of process `pid`, MiB.
fn peak_rss_mib(pid: u32) -> f64 {
    proc_status::status_mib(&pid.to_string(), "VmHWM")
}

/// CPU seconds of every child waited for so far.
fn children_cpu_seconds() -> f64 {
    thread_cpu::children_cpu().as_secs_f64()
}

/// What one replay did.
struct ReplayRun {
    blocks: u64,
    wall: Duration,
    cpu: f64,
}

/// Writes the recording and runs `kvindex replay --json` on it.
fn replay(kvindex: &Path, path: &Path, messages: u64, timeout: Duration) -> ReplayRun {
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).expect("the recording"));
    for frames in stream(messages) {
        writeln!(file, "{}", format_line(0, &frames)).expect("write the recording");
    }
    file.flush().expect("write the recording");
    drop(file);
    let cpu_before = children_cpu_seconds();
    let started = Instant::now();
    let mut child = Command::new(kvindex)
        .arg("replay")
        .arg(path)
        .args(["--engine", "vllm", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the kvindex binary (cargo build --release --bin kvindex)");
    let mut out = String::new();
    let mut stdout = child.stdout.take().expect("piped stdout");
    let reader = std::thread::spawn(move || {
        let _ = stdout.read_to_string(&mut out);
        out
    });
    let status = wait_bounded(&mut child, timeout);
    let wall = started.elapsed();
    assert!(status.success(), "kvindex replay failed: {status}");
    let cpu = children_cpu_seconds() - cpu_before;
    let summary: serde_json::Value = serde_json::from_str(&reader.join().expect("stdout reader"))
        .expect("replay's JSON summary");
    let blocks = summary["ingest"]["apply"]["blocks_stored"]
        .as_u64()
        .expect("blocks_stored in the summary");
    assert_eq!(blocks, messages * BLOCKS_PER_MESSAGE, "every block stored");
    ReplayRun { blocks, wall, cpu }
}

/// Waits for `child`, killing it past `timeout`.
fn wait_bounded(child: &mut Child, timeout: Duration) -> std::process::ExitStatus {
    let end = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("wait for the child") {
            return status;
        }
        if Instant::now() > end {
            let _ = child.kill();
            panic!("the child ran past {} s", timeout.as_secs());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// One ZMTP 3.0 frame: `flags` (more, command), then the short or long size.
fn zmtp_frame(out: &mut Vec<u8>, flags: u8, body: &[u8]) {
    match u8::try_from(body.len()) {
        Ok(len) => out.extend_from_slice(&[flags, len]),
        Err(_) => {
            out.push(flags | 0x02);
            out.extend_from_slice(&(body.len() as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(body);
}

/// The whole stream the daemon drains, as ZMTP message frames ready to write.
fn zmtp_stream(messages: &[Frames]) -> Vec<u8> {
    let mut out = Vec::new();
    for [topic, seq, payload] in messages {
        zmtp_frame(&mut out, 0x01, topic);
        zmtp_frame(&mut out, 0x01, seq);
        zmtp_frame(&mut out, 0x00, payload);
    }
    out
}

/// Messages of the small case of [`in_process`]: 16,000 blocks, the size of the
/// `decode_index` bench's streams, an index that fits in the caches.
const SMALL_MESSAGES: usize = 2_000;

/// What decoding and indexing cost on this thread, in ns of its CPU time per block.
struct InProcess {
    /// Decoding every message alone.
    decode: f64,
    /// Decode + index of the first [`SMALL_MESSAGES`] into a fresh index.
    small: f64,
    /// Decode + index of every message into a fresh index.
    whole: f64,
}

/// Decoding alone, then decode + index into the index `config` builds (no mirror).
fn in_process(messages: &[Frames], config: &str) -> InProcess {
    let config = Config::from_str(config).expect("a valid config");
    let per_block =
        |d: Duration, n: usize| d.as_secs_f64() * 1e9 / (n as u64 * BLOCKS_PER_MESSAGE) as f64;
    let started = thread_cpu();
    for frames in messages {
        let decoded = decode_message(frames, DecodeOptions::INDEX).expect("a good message");
        std::hint::black_box(decoded);
    }
    let decode = per_block(thread_cpu() - started, messages.len());
    let index_all = |messages: &[Frames]| {
        let index = Index::with_options(config.index_options());
        let spec = SourceSpec {
            pod: "bench-0.default".to_owned(),
            model: "m".to_owned(),
            engine: Engine::Vllm,
            dp_rank: 0,
        };
        let source = index.register_source(&spec).expect("one source");
        let started = thread_cpu();
        for frames in messages {
            let (_, batch) = decode_message(frames, DecodeOptions::INDEX).expect("a good message");
            index
                .apply(source, &batch, 1, &mut Discard)
                .expect("a registered source");
        }
        per_block(thread_cpu() - started, messages.len())
    };
    let small = index_all(&messages[..SMALL_MESSAGES.min(messages.len())]);
    InProcess {
        decode,
        small,
        whole: index_all(messages),
    }
}

/// The daemon's config: no Redis, listeners on free 127.0.0.1 ports, `ingest` (a YAML
/// section or nothing), one vLLM target on `port`.
fn config_yaml(ingest: &str, port: u16) -> String {
    format!(
        "api:\n  listen: 127.0.0.1:0\nmetrics:\n  listen: 127.0.0.1:0\n{ingest}targets:\n  - {{pod: bench-0, namespace: default, model: m, engine: vllm, endpoint: 'tcp://127.0.0.1:{port}'}}\n"
    )
}

/// Reads one ZMTP frame: (flags, body).
fn read_frame(conn: &mut TcpStream) -> std::io::Result<(u8, Vec<u8>)> {
    let mut head = [0u8; 2];
    conn.read_exact(&mut head)?;
    let len = if head[0] & 0x02 != 0 {
        let mut rest = [0u8; 7];
        conn.read_exact(&mut rest)?;
        let mut long = [head[1], 0, 0, 0, 0, 0, 0, 0];
        long[1..].copy_from_slice(&rest);
        u64::from_be_bytes(long) as usize
    } else {
        usize::from(head[1])
    };
    let mut body = vec![0; len];
    conn.read_exact(&mut body)?;
    Ok((head[0], body))
}

/// Accepts the daemon's SUB and completes the handshake as a PUB (ZMTP 3.0, NULL
/// mechanism): greeting, READY both ways, then waits for its subscription.
fn accept_subscriber(listener: &TcpListener) -> TcpStream {
    let (mut conn, _) = listener.accept().expect("the daemon connects");
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("a read timeout");
    let mut greeting = [0u8; 64];
    greeting[0] = 0xff;
    greeting[9] = 0x7f;
    greeting[10] = 3;
    greeting[12..16].copy_from_slice(b"NULL");
    conn.write_all(&greeting).expect("send the greeting");
    let mut theirs = [0u8; 64];
    conn.read_exact(&mut theirs).expect("the SUB's greeting");
    let mut ready = b"\x05READY\x0bSocket-Type".to_vec();
    ready.extend_from_slice(&3u32.to_be_bytes());
    ready.extend_from_slice(b"PUB");
    let mut command = Vec::new();
    zmtp_frame(&mut command, 0x04, &ready);
    conn.write_all(&command).expect("send READY");
    loop {
        let (flags, body) = read_frame(&mut conn).expect("the SUB's READY and subscription");
        // A message frame (not a command) starting with 1 subscribes.
        if flags & 0x04 == 0 && body.first() == Some(&1) {
            return conn;
        }
    }
}

/// `GET path` on `addr`: the JSON body.
fn get_json(addr: SocketAddr, path: &str) -> serde_json::Value {
    let mut conn = TcpStream::connect(addr).expect("the daemon's API");
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("a read timeout");
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .expect("send the request");
    let mut reply = String::new();
    conn.read_to_string(&mut reply).expect("read the reply");
    let body = reply.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str(body).unwrap_or(serde_json::Value::Null)
}

/// What one drain cost the daemon.
struct ServeRun {
    blocks: u64,
    wall: Duration,
    cpu: f64,
    faults: f64,
    peak_rss_mib: f64,
}

/// Stops the daemon on every way out of [`serve`]: SIGTERM (it drains and exits, so a
/// profiler wrapping it writes its data), SIGKILL past ten seconds.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the pid of a child not yet waited for.
        unsafe { libc::kill(self.0.id() as libc::pid_t, libc::SIGTERM) };
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `kvindex serve` on a PUB of this process, writes `stream` (`messages` messages)
/// flat out and waits until the daemon applied every message.
fn serve(
    kvindex: &Path,
    dir: &Path,
    ingest: &str,
    stream: &[u8],
    messages: u64,
    timeout: Duration,
) -> ServeRun {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a 127.0.0.1 port");
    let port = listener.local_addr().expect("its address").port();
    let config = dir.join("ingest-cost.yaml");
    std::fs::write(&config, config_yaml(ingest, port)).expect("write the config");
    let mut child = Command::new(kvindex)
        .args(["--log-format", "json", "--log", "info", "serve", "--config"])
        .arg(&config)
        .env_remove("KVINDEX_SHARD_INDEX")
        .env_remove("KVINDEX_SHARD_COUNT")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the kvindex binary (cargo build --release --bin kvindex)");
    let stderr = child.stderr.take().expect("piped stderr");
    let daemon = Daemon(child);
    let pid = daemon.0.id();
    let api = daemon_log::listener_address(stderr, "API", Duration::from_secs(30))
        .expect("the daemon's API listening");
    let mut conn = accept_subscriber(&listener);
    // A daemon that stops reading fails the write instead of holding the run (the scope
    // below waits for the writer even when the wait for the daemon gives up).
    conn.set_write_timeout(Some(timeout))
        .expect("a write timeout");
    let (cpu_before, faults_before) = cpu_and_faults(pid);
    let started = Instant::now();
    let writer = std::thread::scope(|s| {
        let writer = s.spawn(move || conn.write_all(stream));
        let end = started + timeout;
        let counters = loop {
            let pods = get_json(api, "/v1/pods");
            let counters = pods["pods"][0]["counters"].clone();
            if counters["messages"].as_u64() >= Some(messages) {
                break counters;
            }
            assert!(
                Instant::now() < end,
                "the daemon took {} s and is not done: {counters}",
                timeout.as_secs()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let wall = started.elapsed();
        let (cpu, faults) = cpu_and_faults(pid);
        let blocks = counters["blocks_stored"].as_u64().unwrap_or(0);
        assert_eq!(blocks, messages * BLOCKS_PER_MESSAGE, "{counters}");
        for clean in [
            "seq_gaps",
            "decode_errors",
            "invalid_events",
            "source_resets",
        ] {
            assert_eq!(counters[clean].as_u64(), Some(0), "{clean}: {counters}");
        }
        let run = ServeRun {
            blocks,
            wall,
            cpu: cpu - cpu_before,
            faults: faults - faults_before,
            peak_rss_mib: peak_rss_mib(pid),
        };
        (writer.join(), run)
    });
    let (written, run) = writer;
    written
        .expect("the writer thread")
        .expect("the whole stream written");
    drop(daemon);
    run
}

fn main() {
    let args = Args::parse();
    let kvindex = args.kvindex.unwrap_or_else(|| {
        let exe = std::env::current_exe().expect("this example's path");
        // target/<profile>/examples/ingest_cost → target/<profile>/kvindex
        exe.parent()
            .and_then(Path::parent)
            .expect("a target directory")
            .join("kvindex")
    });
    let timeout = Duration::from_secs(args.timeout_secs);
    let dir = tempfile::tempdir().expect("a temp dir");

    let floor = sha256_floor();
    let per_hash = 1.0 / floor;
    println!(
        "SHA-256 floor (openssl speed -bytes 64 sha256): {:.2} M hashes/s, {:.3} CPU-s per million; floor ÷ 5 = {:.2} M blocks/s",
        floor / 1e6,
        per_hash * 1e6,
        floor / 5e6
    );

    let recording =
        (args.recording).unwrap_or_else(|| dir.path().join("vllm-8-block-stores.jsonl"));
    let r = replay(&kvindex, &recording, args.replay_messages, timeout);
    let rate = r.blocks as f64 / r.wall.as_secs_f64();
    println!(
        "replay: {} blocks in {:.2} s = {:.2} M blocks/s = floor ÷ {:.2} (goal ≤ 5); {:.2} M blocks per CPU-second",
        r.blocks,
        r.wall.as_secs_f64(),
        rate / 1e6,
        floor / rate,
        r.blocks as f64 / r.cpu / 1e6
    );

    let messages = stream(args.serve_messages);
    let cases = [
        ("default", ""),
        ("std_hashes: false", "ingest:\n  std_hashes: false\n"),
    ];
    let per_hash_ns = per_hash * 1e9;
    let mut index_ns = Vec::new();
    for (name, ingest) in cases {
        let p = in_process(&messages, &config_yaml(ingest, 1));
        println!(
            "in process ({name}): decode {:.0} ns/block; decode + index {:.0} ns/block into an index of 16,000 blocks, {:.0} ns/block ({:.2} × the floor) into one of {}",
            p.decode,
            p.small,
            p.whole,
            p.whole / per_hash_ns,
            messages.len() as u64 * BLOCKS_PER_MESSAGE
        );
        index_ns.push(p.whole);
    }
    let wire = zmtp_stream(&messages);
    drop(messages);
    for ((name, ingest), index_ns) in cases.into_iter().zip(index_ns) {
        let s = serve(
            &kvindex,
            dir.path(),
            ingest,
            &wire,
            args.serve_messages,
            timeout,
        );
        let per_block = s.cpu / s.blocks as f64;
        println!(
            "serve ({name}): {} blocks in {:.2} s = {:.2} M blocks/s; {:.2} CPU-s = {:.3} CPU-s per million blocks = {:.2} × the floor (goal ≤ 4), {:.0} ns/block beyond decode + index in process; {:.0} minor page faults, peak RSS {:.0} MiB",
            s.blocks,
            s.wall.as_secs_f64(),
            s.blocks as f64 / s.wall.as_secs_f64() / 1e6,
            s.cpu,
            per_block * 1e6,
            per_block / per_hash,
            per_block * 1e9 - index_ns,
            s.faults,
            s.peak_rss_mib
        );
    }
}

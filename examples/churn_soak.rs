//! A bounded churn soak of `kvindex serve`: one paced ZMQ publisher sends a
//! churning stream (stores on GPU and CPU, ~40 % removes, an `AllBlocksCleared` every few
//! thousand messages) into an in-process daemon for `--duration` seconds. The publisher is
//! this example again in a child process, as an engine is its own process: what ZMQ queues
//! for a daemon that lags (after a clear) is counted where it lives, in the publisher. Every
//! `--sample-secs` it prints the process RSS next to the live heap (a counting allocator),
//! the index's own heap estimate and the goal for RSS (2 × that estimate + 32 MiB),
//! so the gap between them is visible; at the end it replays the same stream offline
//! (written to a temporary fixture file, not held in memory) and prints the diff of the two
//! indexes. Not a test: nothing is asserted.
//!
//! Run: `cargo run --release --example churn_soak -- --duration 600 [--sample-secs 30]
//! [--redis redis://127.0.0.1:6379/15]` (with `--redis` the mirror runs too).

// The binary's allocator, included by path: it is private to the binary.
#[allow(dead_code)]
#[path = "../src/allocator.rs"]
mod allocator;

use std::io::{BufRead, BufReader, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use kvindex::config::Config;
use kvindex::index::Index;
use kvindex::ingest::fixture;
use kvindex::ingest::replay_client::ReplayLimits;
use kvindex::wire::Engine;
use kvindex::Daemon;
use zeromq::{PubSocket, Socket, SocketSend, ZmqMessage};

#[path = "common/churn.rs"]
mod churn;
#[path = "common/cli.rs"]
mod cli;
#[path = "../benches/common/counting_alloc.rs"]
mod counting_alloc;
// `swap_mib` serves the `index_scale` bench.
#[allow(dead_code)]
#[path = "common/measure.rs"]
mod measure;

use churn::{message, Rng};
use measure::{messages_seen, rss_mib, strip};

/// A bounded churn soak of `kvindex serve`: RSS against the index's heap, then the diff
/// against an offline replay.
#[derive(Parser)]
struct Args {
    /// Seconds the publisher sends for.
    #[arg(long, value_name = "SECONDS", default_value = "60", value_parser = cli::secs)]
    duration: Duration,
    /// Seconds between two samples.
    #[arg(
        long = "sample-secs",
        value_name = "SECONDS",
        default_value = "10",
        value_parser = cli::secs,
    )]
    sample: Duration,
    /// A Redis URL: the mirror runs too.
    #[arg(long)]
    redis: Option<String>,
    /// Set in the publisher child: where it records the stream it sends.
    #[arg(long, hide = true)]
    publish_to: Option<std::path::PathBuf>,
}

/// One row of the curve: messages sent and seen by the daemon (the difference waits in ZMQ),
/// the mirror's queue (chunks), RSS, the live heap (counting allocator), the index's
/// estimate of its own heap and the goal for RSS from it.
fn sample(daemon: &Daemon, t: String, seq: u64) {
    let st = daemon.index.stats();
    let heap = st.heap_bytes as f64 / f64::from(1 << 20);
    let live =
        counting_alloc::LIVE.load(std::sync::atomic::Ordering::Relaxed) as f64 / f64::from(1 << 20);
    let queue = daemon.mirror_stats().map_or(0, |m| m.queue_depth);
    println!(
        "| {t} | {seq} | {} | {queue} | {:.1} | {live:.1} | {heap:.1} | {:.1} | {} | {} |",
        messages_seen(daemon),
        rss_mib(),
        2.0 * heap + 32.0,
        st.entries,
        st.blocks
    );
}

#[tokio::main]
async fn main() {
    let a = Args::parse();
    if let Some(recording) = a.publish_to.clone() {
        publish(&a, &recording).await;
        return;
    }
    let dir = std::env::temp_dir().join(format!("kvindex-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("vllm-soak.jsonl");
    let mut child = spawn_publisher(&a, &path);
    let redis = a
        .redis
        .as_ref()
        .map_or(String::new(), |u| format!("redis:\n  url: {u}\n"));
    let text = format!(
        "{redis}metrics:\n  listen: 127.0.0.1:0\ntargets:\n  - {{pod: soak, model: m, engine: vllm, endpoint: 'tcp://127.0.0.1:{}'}}\n",
        child.port
    );
    let config = Config::from_str(&text).expect("valid config");
    let daemon = Daemon::start(config, None, ReplayLimits::default())
        .await
        .expect("daemon starts");
    while daemon.supervisor.connected_ranks() < 1 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The publisher starts on this line; its progress (messages sent) comes back a line a
    // sample, so the curve shows what waits in ZMQ without holding it in this process.
    writeln!(child.stdin, "go").expect("start the publisher");
    child.stdin.flush().expect("start the publisher");
    let started = Instant::now();
    let mut next_sample = Duration::ZERO;
    println!("allocator: {}", allocator::NAME);
    println!("| t s | messages sent | seen | mirror queue | RSS MiB | live heap MiB | index heap MiB (estimate) | goal: 2 × index + 32 MiB | entries | blocks |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    while started.elapsed() < a.duration {
        if started.elapsed() >= next_sample {
            let sent = child.sent.load(Ordering::Relaxed);
            sample(&daemon, started.elapsed().as_secs().to_string(), sent);
            next_sample += a.sample;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let end = Instant::now() + Duration::from_secs(60);
    while !child.finished.load(Ordering::Acquire) && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seq = child.sent.load(Ordering::Acquire);
    while messages_seen(&daemon) < seq && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    sample(
        &daemon,
        format!("{} (end)", started.elapsed().as_secs()),
        seq,
    );
    let live = strip(daemon.index.dump());
    let seen = messages_seen(&daemon);
    // Closing its stdin lets the publisher exit (it kept its socket open until now).
    drop(child.stdin);
    let _ = child.process.wait();
    daemon.shutdown(Duration::from_secs(10)).await;
    let replay =
        kvindex::ingest::replay_files(Index::new(), "soak.default", "m", Engine::Vllm, &[path])
            .expect("replay the recording");
    let offline = strip(replay.index().dump());
    let missing = offline
        .iter()
        .filter(|e| live.binary_search(e).is_err())
        .count();
    let extra = live
        .iter()
        .filter(|e| offline.binary_search(e).is_err())
        .count();
    println!(
        "messages sent {seq}, seen {}; live {} entries, replay {}; missing {missing}, extra {extra}",
        seen,
        live.len(),
        offline.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The publisher child, its port and its progress.
struct Publisher {
    process: std::process::Child,
    stdin: std::process::ChildStdin,
    port: String,
    /// Messages sent so far (the child reports every 100).
    sent: Arc<AtomicU64>,
    /// Set once the child has sent its last message.
    finished: Arc<AtomicBool>,
}

/// Starts this example again as the publisher of `recording` (the engine's side of the
/// socket lives in its own process: what ZMQ queues for a lagging subscriber is the
/// publisher's memory, not the daemon's, as with a real engine).
fn spawn_publisher(a: &Args, recording: &std::path::Path) -> Publisher {
    let exe = std::env::current_exe().expect("own path");
    let mut process = std::process::Command::new(exe)
        .args(["--duration", &a.duration.as_secs().to_string()])
        .arg("--publish-to")
        .arg(recording)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the publisher");
    let stdin = process.stdin.take().expect("piped stdin");
    let mut lines = BufReader::new(process.stdout.take().expect("piped stdout")).lines();
    let port = lines
        .next()
        .and_then(Result::ok)
        .expect("the publisher's port");
    let sent = Arc::new(AtomicU64::new(0));
    let finished = Arc::new(AtomicBool::new(false));
    let (progress, done) = (sent.clone(), finished.clone());
    // Lines are "N" (sent so far) and, last, "end N".
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            let (last, n) = match line.strip_prefix("end ") {
                Some(n) => (true, n),
                None => (false, line.as_str()),
            };
            progress.store(n.trim().parse().unwrap_or(0), Ordering::Release);
            if last {
                done.store(true, Ordering::Release);
            }
        }
    });
    Publisher {
        process,
        stdin,
        port,
        sent,
        finished,
    }
}

/// The publisher's side: binds, prints the port, waits for "go", publishes a paced churn for
/// `--duration` (recording it), reports its progress, and keeps the socket open until its
/// stdin closes.
async fn publish(a: &Args, recording: &std::path::Path) {
    let mut publisher = PubSocket::new();
    let ep = publisher.bind("tcp://127.0.0.1:0").await.expect("bind");
    let zeromq::Endpoint::Tcp(_, port) = ep else {
        panic!("not tcp")
    };
    println!("{port}");
    std::io::stdout().flush().expect("stdout");
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).expect("wait for go");
    let mut file = std::io::BufWriter::new(std::fs::File::create(recording).expect("file"));
    let mut rng = Rng(0x5EED_CAFE_F00D_D00D);
    let started = Instant::now();
    let mut seq = 0u64;
    while started.elapsed() < a.duration {
        let frames = message(seq, &mut rng);
        writeln!(file, "{}", fixture::format_line(0, &frames)).expect("write");
        let msg = ZmqMessage::try_from(frames).expect("three frames");
        publisher.send(msg).await.expect("send");
        seq += 1;
        if seq.is_multiple_of(100) {
            println!("{seq}");
        }
        // The crate's PUB drops under a flat-out loop: pace it.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    file.flush().expect("flush");
    println!("end {seq}");
    std::io::stdout().flush().expect("stdout");
    // The socket stays open, its queue draining, until the parent is done with it.
    let _ = tokio::task::spawn_blocking(|| std::io::stdin().read_line(&mut String::new())).await;
}

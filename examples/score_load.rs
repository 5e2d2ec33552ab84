//! End-to-end `POST /v1/score` under load (not a test, nothing asserted): the real HTTP
//! router over an index of 64 pods, 4 of which hold a 32,768-token prompt (2,048 blocks of
//! 16), every pod holding 128 blocks of its own besides. It serves on 127.0.0.1 and runs
//! `wrk` against it in the same run: a one-block request (16 tokens) as the floor, the
//! prompt's first 2,048 tokens, the whole 32,768-token prompt, all naming the 64 pods, and
//! `POST /v1/routed` of the 2,048-token prompt; it prints requests/s and latency
//! percentiles of each and their ratios. Then it exits.
//!
//! Run: `cargo run --release --example score_load -- [seconds per case] [match]`
//! (default 10 s, `prefix`; `kthena` scores by std hashes, and cuts prompts at 128 blocks).
//! Needs `wrk` on the PATH (`apt-get install wrk`).

// The binary's allocator, included by path: it is private to the binary.
#[allow(dead_code)]
#[path = "../src/allocator.rs"]
mod allocator;

use std::process::Command;

use clap::Parser;
use kvindex::api::{router, serve, ApiState};
use kvindex::index::{Discard, Index, SourceSpec};
use kvindex::ingest::replay_client::ReplayLimits;
use kvindex::ingest::supervisor::Supervisor;
use kvindex::medium::{Medium, TierWeights};
use kvindex::score::MatchMode;
use kvindex::wire::{BlockHash, BlockStored, Engine, EngineBatch, Event};
use tokio_util::sync::CancellationToken;

// The daemon's allocator (jemalloc by default), so the figures are the daemon's.
#[global_allocator]
static GLOBAL: allocator::Chosen = allocator::Chosen;

const PODS: u32 = 64;
const HOLDERS: u32 = 4;
const BLOCK_SIZE: u32 = 16;
const PROMPT_BLOCKS: u32 = 128;
/// Blocks of the long prompt the holders keep.
const LONG_BLOCKS: u32 = 2048;
const MODEL: &str = "m";

fn pod(n: u32) -> String {
    format!("pod-{n}.ns")
}

/// Stores `tokens` as one chained event (engine hashes from `first_hash`) for `source`.
fn store(index: &Index, source: kvindex::index::SourceId, first_hash: u64, tokens: Vec<u32>) {
    let blocks = tokens.len() as u64 / u64::from(BLOCK_SIZE);
    let hashes = (first_hash..first_hash + blocks)
        .map(BlockHash::Int)
        .collect();
    let stored = BlockStored::new(hashes, tokens, BLOCK_SIZE, Medium::GPU);
    let batch = EngineBatch::of(vec![Event::BlockStored(stored)]);
    index
        .apply(source, &batch, 1_700_000_000, &mut Discard)
        .expect("registered");
}

fn filled_index(prompt: &[u32]) -> Index {
    let index = Index::new();
    for n in 0..PODS {
        let source = index
            .register_source(&SourceSpec {
                pod: pod(n),
                model: MODEL.to_owned(),
                engine: Engine::Vllm,
                dp_rank: 0,
            })
            .expect("64 pods fit");
        if n < HOLDERS {
            store(&index, source, 1, prompt.to_vec());
        }
        let own = 1_000_000 + n * PROMPT_BLOCKS * BLOCK_SIZE;
        let tokens = (own..own + PROMPT_BLOCKS * BLOCK_SIZE).collect();
        store(&index, source, 1_000 + u64::from(n) * 1_000, tokens);
    }
    index
}

fn body(tokens: &[u32], mode: MatchMode) -> String {
    let pods: Vec<String> = (0..PODS).map(pod).collect();
    let mode = mode.as_str();
    serde_json::json!({ "model": MODEL, "tokens": tokens, "pods": pods, "match": mode }).to_string()
}

/// A `/v1/routed` body placing `tokens` on the first pod.
fn routed_body(tokens: &[u32]) -> String {
    serde_json::json!({ "model": MODEL, "tokens": tokens, "pod": pod(0) }).to_string()
}

/// Requests/s and the latency percentiles wrk printed.
struct WrkFigures {
    requests_per_s: f64,
    latency: Vec<(String, String)>,
}

fn run_wrk(url: &str, body: &str, seconds: u32) -> std::io::Result<WrkFigures> {
    let dir = std::env::temp_dir().join(format!("kvindex-score-load-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let script = dir.join("post.lua");
    let escaped = body.replace('\\', "\\\\").replace('"', "\\\"");
    std::fs::write(
        &script,
        format!(
            "wrk.method = \"POST\"\nwrk.headers[\"Content-Type\"] = \"application/json\"\n\
             wrk.body = \"{escaped}\"\n"
        ),
    )?;
    let out = Command::new("wrk")
        .args(["-t2", "-c32", &format!("-d{seconds}s"), "--latency", "-s"])
        .arg(&script)
        .arg(url)
        .output()?;
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8_lossy(&out.stdout);
    let requests_per_s = text
        .lines()
        .find_map(|l| l.strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0);
    let latency = text
        .lines()
        .filter_map(|l| {
            let mut parts = l.split_whitespace();
            let pct = parts.next()?;
            let value = parts.next()?;
            (pct.ends_with('%') && parts.next().is_none())
                .then(|| (pct.to_owned(), value.to_owned()))
        })
        .collect();
    if requests_per_s == 0.0 {
        eprintln!(
            "wrk printed no figures:\n{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(WrkFigures {
        requests_per_s,
        latency,
    })
}

/// `POST /v1/score` under `wrk`: a 2,048-token prompt against the one-block floor.
#[derive(Parser)]
struct Args {
    /// Seconds of load per case.
    #[arg(default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    seconds: u32,
    /// Match mode of the requests: prefix or kthena.
    #[arg(default_value = "prefix")]
    mode: MatchMode,
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let Args { seconds, mode } = Args::parse();
    let prompt: Vec<u32> = (0..LONG_BLOCKS * BLOCK_SIZE).collect();
    let index = filled_index(&prompt);
    let short = &prompt[..(PROMPT_BLOCKS * BLOCK_SIZE) as usize];

    let cancel = CancellationToken::new();
    let supervisor = Supervisor::new(index.clone(), None, cancel.clone(), ReplayLimits::default());
    let state = ApiState::new(
        kvindex::score::ScoreBackend::Index(index),
        TierWeights::default(),
        None,
        supervisor.clone(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let stop = cancel.clone();
    let server = tokio::spawn(serve(listener, router(state), async move {
        stop.cancelled().await;
    }));

    let score = format!("{base}/v1/score");
    let cases = [
        (
            "one block (16 tokens)",
            &score,
            body(&prompt[..BLOCK_SIZE as usize], mode),
        ),
        ("2,048 tokens (128 blocks)", &score, body(short, mode)),
        ("32,768 tokens (2,048 blocks)", &score, body(&prompt, mode)),
        (
            "/v1/routed, 2,048 tokens",
            &format!("{base}/v1/routed"),
            routed_body(short),
        ),
    ];
    println!(
        "POST /v1/score, {PODS} candidate pods ({HOLDERS} hold the prompt), match {}, \
         wrk -t2 -c32 -d{seconds}s, allocator {}",
        mode.as_str(),
        allocator::NAME
    );
    let mut figures = Vec::new();
    for (name, url, body) in &cases {
        let url = (*url).clone();
        let body = body.clone();
        let f = tokio::task::spawn_blocking(move || run_wrk(&url, &body, seconds))
            .await
            .map_err(std::io::Error::other)??;
        let latency: Vec<String> = f.latency.iter().map(|(p, v)| format!("p{p} {v}")).collect();
        println!(
            "{name}: {:.0} req/s, {}",
            f.requests_per_s,
            latency.join(", ")
        );
        figures.push(f.requests_per_s);
    }
    let ratio = |a: usize, b: usize| 100.0 * figures[a] / figures[b].max(f64::MIN_POSITIVE);
    println!("2,048 tokens ÷ one block: {:.1} %", ratio(1, 0));
    println!("32,768 tokens ÷ 2,048 tokens: {:.1} %", ratio(2, 1));
    println!("/v1/routed ÷ /v1/score, 2,048 tokens: {:.1} %", ratio(3, 1));
    cancel.cancel();
    let _ = server.await;
    supervisor.shutdown(std::time::Duration::from_secs(2)).await;
    Ok(())
}

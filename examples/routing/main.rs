//! The routing benchmark: how much of the engines' prefix caches a router reuses with
//! kvindex's answers, next to an oracle that reads every engine's true cache when it routes.
//!
//! P simulated vLLM pods (paged prefix caches with vLLM's semantics, `engine`) publish real
//! event batches over real ZeroMQ to a real in-process daemon when each prefill completes;
//! seeded workloads (`workloads`, `mooncake`) are placed in real time by each router
//! (`routers`), one fresh daemon and fresh pods per (workload, router) run (`harness`); the
//! report (`report`) gives per router the hit rate, its share of the oracle's, the balance
//! over pods, `/v1/score`'s predictions against the engines' hits, routes whose true prefix
//! was longer than the score could see, and `/v1/score` latency.
//!
//! Run: `cargo run --release --example routing -- [--workload chat,fanout,…|all]
//! [--router kvindex,oracle,…|all] [--duration S] [--lag-scale X] [--json] …`
//! (`--help` lists every option; `docs/benchmarks.md`, "Routing benchmark", explains the report).
//!
//! | file | job |
//! | --- | --- |
//! | `engine.rs` | one pod's prefix cache: hits, stores, LRU eviction, CPU offload, its changes |
//! | `vllm.rs` | a pod's changes as vLLM event batches and frames |
//! | `workloads.rs` | seeded workloads: chat, fan-out, mixed, one-off, long prompts |
//! | `mooncake.rs` | Mooncake trace reader (and the shipped sample's generator) |
//! | `routers.rs` | random, round-robin, least-loaded, and the prefix rule |
//! | `http.rs` | the daemon's API and metrics as a router calls them |
//! | `harness.rs` | one run: pods, daemon, real-time event loop |
//! | `report.rs` | what a run measured, tables |

// The binary's allocator, included by path: it is private to the binary.
#[allow(dead_code)]
#[path = "../../src/allocator.rs"]
mod allocator;

// The simulated engines of `kvindex demo`, included by path: private to the binary.
#[allow(dead_code)]
#[path = "../../src/sim/mod.rs"]
mod sim;

mod engine;
mod harness;
mod http;
mod mooncake;
mod report;
mod routers;
mod vllm;
mod workloads;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;

use harness::Setup;
use report::RunStats;
use routers::RouterKind;
use workloads::{Params, Workload};

// The daemon's allocator (jemalloc by default), so the daemon's figures are its own.
#[global_allocator]
static GLOBAL: allocator::Chosen = allocator::Chosen;

/// GPU blocks per pod of the `long` workload unless `--blocks` is given: twice its longest
/// prompt, so a document fits.
const LONG_GPU_BLOCKS: usize = 16_384;
/// Every workload, in report order.
const WORKLOADS: [&str; 6] = ["chat", "fanout", "mixed", "oneoff", "long", "mooncake"];

/// kvindex's routing benchmark (see `docs/benchmarks.md`, "Routing benchmark").
#[derive(Parser, Debug)]
struct Args {
    /// Workloads: chat, fanout, mixed, oneoff, long, mooncake, or all.
    #[arg(long = "workload", value_delimiter = ',', default_value = "all")]
    workloads: Vec<String>,
    /// Routers: random, round-robin, least-loaded, kvindex, kvindex+speculative, oracle, or all.
    #[arg(long = "router", value_delimiter = ',', default_value = "all")]
    routers: Vec<String>,
    /// The Mooncake-format trace of the `mooncake` workload (default: the shipped sample).
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Replays the trace this many times faster than its timestamps.
    #[arg(long, default_value_t = 1.0)]
    trace_speed: f64,
    /// Simulated pods.
    #[arg(long, default_value_t = 8)]
    pods: usize,
    /// GPU blocks (16 tokens) per pod [default: 1500; `long`: 16384].
    #[arg(long)]
    blocks: Option<usize>,
    /// CPU offload blocks per pod, fed by GPU evictions (0: no offload tier).
    #[arg(long, default_value_t = 0)]
    cpu_blocks: usize,
    /// Seconds during which sessions start, per run (each session then runs to its end).
    #[arg(long, default_value_t = 4.0)]
    duration: f64,
    /// Multiplies the engines' event delays (0: published at placement).
    #[arg(long, default_value_t = 1.0)]
    lag_scale: f64,
    /// Matched blocks one request in flight costs a pod (kvindex and oracle routers).
    #[arg(long, default_value_t = 8.0)]
    load_penalty: f64,
    /// Prefill time of a fully cached prompt, ms.
    #[arg(long, default_value_t = 5.0)]
    prefill_base_ms: f64,
    /// Prefill time per uncached prompt token, ms.
    #[arg(long, default_value_t = 0.08)]
    prefill_ms_per_token: f64,
    /// Decode time per output token, ms (a request is in flight through its decode).
    #[arg(long, default_value_t = 2.0)]
    decode_ms_per_token: f64,
    /// `max_blocks` sent with every `/v1/score` (default: none, the daemon's own cap).
    #[arg(long)]
    max_blocks: Option<usize>,
    /// The daemon's `api.max_blocks`: prompt blocks `prefix` scoring looks at (default: the
    /// daemon's).
    #[arg(long)]
    api_max_blocks: Option<usize>,
    /// The daemon's `speculative.ttl_ms` (default: the daemon's).
    #[arg(long)]
    speculative_ttl_ms: Option<u64>,
    /// Multiplies every workload's arrival rate.
    #[arg(long, default_value_t = 1.0)]
    rate_scale: f64,
    /// Seconds a run may go on after the last session start at most (later requests are
    /// cut and counted).
    #[arg(long, default_value_t = 20.0)]
    drain: f64,
    /// The seed of the workloads, routers' ties and engine hashes.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Prints the runs as JSON on stdout (the tables go to stderr).
    #[arg(long)]
    json: bool,
    /// Writes the sample Mooncake trace to this file and exits.
    #[arg(long)]
    write_mooncake_sample: Option<PathBuf>,
}

fn names(given: &[String], all: &[&str]) -> Vec<String> {
    if given.iter().any(|g| g == "all") {
        return all.iter().map(|s| (*s).to_owned()).collect();
    }
    given.to_vec()
}

fn workload(name: &str, args: &Args) -> anyhow::Result<Workload> {
    let p = Params {
        seed: args.seed,
        window: Duration::from_secs_f64(args.duration),
        rate_scale: args.rate_scale,
    };
    Ok(match name {
        "chat" => workloads::chat(p),
        "fanout" => workloads::fanout(p),
        "mixed" => workloads::mixed(p),
        "oneoff" => workloads::oneoff(p),
        "long" => workloads::long(p),
        "mooncake" => {
            let path = args.trace.clone().unwrap_or_else(|| {
                PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                    .join("examples/routing/sample-mooncake.jsonl")
            });
            let records = mooncake::read(&path)?;
            mooncake::workload(&records, args.trace_speed, p.window)
        }
        other => bail!(
            "unknown workload `{other}` ({}, or all)",
            WORKLOADS.join(", ")
        ),
    })
}

fn setup(args: &Args, workload: &str) -> Setup {
    let default_blocks = if workload == "long" {
        LONG_GPU_BLOCKS
    } else {
        1500
    };
    Setup {
        pods: args.pods,
        gpu_blocks: args.blocks.unwrap_or(default_blocks),
        cpu_blocks: args.cpu_blocks,
        lag_scale: args.lag_scale,
        load_penalty: args.load_penalty,
        prefill_base_ms: args.prefill_base_ms,
        prefill_ms_per_token: args.prefill_ms_per_token,
        decode_ms_per_token: args.decode_ms_per_token,
        max_blocks: args.max_blocks,
        api_max_blocks: args.api_max_blocks,
        speculative_ttl_ms: args.speculative_ttl_ms,
        window: Duration::from_secs_f64(args.duration),
        drain: Duration::from_secs_f64(args.drain),
        seed: args.seed,
    }
}

fn header(name: &str, w: &Workload, s: &Setup) -> String {
    format!(
        "## {name}: {} sessions starting in the first {} s, {} requests; {} pods × {} GPU blocks{}, \
         lag scale {}, load penalty {} blocks/request, seed {}",
        w.sessions.len(),
        s.window.as_secs_f64(),
        w.requests(),
        s.pods,
        s.gpu_blocks,
        if s.cpu_blocks > 0 {
            format!(" + {} CPU", s.cpu_blocks)
        } else {
            String::new()
        },
        s.lag_scale,
        s.load_penalty,
        s.seed
    )
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(path) = &args.write_mooncake_sample {
        let text = mooncake::to_jsonl(&mooncake::sample(1));
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
        return Ok(());
    }
    if args.pods == 0 {
        bail!("--pods must be at least 1");
    }
    for (flag, value) in [
        ("--lag-scale", args.lag_scale),
        ("--load-penalty", args.load_penalty),
        ("--prefill-base-ms", args.prefill_base_ms),
        ("--prefill-ms-per-token", args.prefill_ms_per_token),
        ("--decode-ms-per-token", args.decode_ms_per_token),
        ("--duration", args.duration),
        ("--drain", args.drain),
    ] {
        if !(value.is_finite() && value >= 0.0) {
            bail!("{flag} must be a finite number ≥ 0, not {value}");
        }
    }
    if !(args.rate_scale > 0.0 && args.trace_speed > 0.0) {
        bail!("--rate-scale and --trace-speed must be > 0");
    }
    let all_routers: Vec<&str> = RouterKind::ALL.iter().map(|k| k.name()).collect();
    let routers = names(&args.routers, &all_routers)
        .iter()
        .map(|r| RouterKind::parse(r).map_err(anyhow::Error::msg))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut all = Vec::new();
    let mut failed = 0;
    for name in names(&args.workloads, &WORKLOADS) {
        let w = workload(&name, &args)?;
        let s = setup(&args, &name);
        eprintln!("{}", header(&name, &w, &s));
        let mut runs: Vec<RunStats> = Vec::new();
        for kind in &routers {
            let run = match harness::run(&s, &w, *kind).await {
                Ok(run) => run,
                Err(e) => {
                    eprintln!("  {}: failed: {e:#}", kind.name());
                    failed += 1;
                    runs.push(RunStats {
                        workload: name.clone(),
                        router: kind.name().to_owned(),
                        error: Some(format!("{e:#}")),
                        ..RunStats::default()
                    });
                    continue;
                }
            };
            eprintln!(
                "  {}: {} requests, hit rate {:.1} %, {:.1} s",
                run.router,
                run.requests,
                100.0 * run.hit_rate(),
                run.seconds
            );
            runs.push(run);
        }
        let table = report::table(&runs.iter().collect::<Vec<_>>());
        if args.json {
            eprintln!("{table}");
        } else {
            println!("{}\n\n{table}", header(&name, &w, &s));
        }
        all.extend(runs);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&all)?);
    }
    if failed > 0 {
        bail!("{failed} runs failed (see the tables)");
    }
    Ok(())
}

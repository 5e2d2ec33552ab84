//! A load target for `GET /v1/pods` (not a test, nothing asserted): the real HTTP router and
//! the daemon's real [`Supervisor`] over an index holding 4 pods × 12k (block, pod) entries,
//! served on 127.0.0.1 until Ctrl-C. The targets point at a closed port, so they stay
//! `connecting` and the index is only what this example stored.
//!
//! Run: `cargo run --example pods_load -- [addr] [entries_per_pod]`
//! (defaults `127.0.0.1:18080`, 12000), then
//! `wrk -t2 -c16 -d 10s --latency http://127.0.0.1:18080/v1/pods`.

// The binary's allocator, included by path: it is private to the binary.
#[allow(dead_code)]
#[path = "../src/allocator.rs"]
mod allocator;

use clap::Parser;
use kvindex::api::{router, serve, ApiState};
use kvindex::index::{Discard, Index, SourceSpec};
use kvindex::ingest::replay_client::ReplayLimits;
use kvindex::ingest::supervisor::Supervisor;
use kvindex::ingest::{Target, TcpEndpoint};
use kvindex::medium::{Medium, TierWeights};
use kvindex::score::ScoreBackend;
use kvindex::wire::{BlockHash, BlockStored, Engine, EngineBatch, Event};
use tokio_util::sync::CancellationToken;

// The daemon's allocator (jemalloc by default), so the figures are the daemon's.
#[global_allocator]
static GLOBAL: allocator::Chosen = allocator::Chosen;

const PODS: u32 = 4;
const BLOCK_SIZE: u32 = 16;
const BLOCKS_PER_EVENT: u32 = 64;

fn target(n: u32) -> Target {
    Target {
        pod: format!("pod-{n}"),
        namespace: "ns".to_owned(),
        model: "m".to_owned(),
        engine: Engine::Vllm,
        // Nothing listens on the discard port: the subscriber keeps connecting.
        endpoint: TcpEndpoint::parse("tcp://127.0.0.1:9").expect("a valid endpoint"),
        replay_endpoint: None,
        topic: String::new(),
        dp_ranks: 1,
        max_frame_bytes: None,
    }
}

/// Stores `entries` distinct blocks for pod `n`, every fourth one also on CPU.
fn fill(index: &Index, n: u32, entries: u32) {
    let source = index
        .register_source(&SourceSpec {
            pod: target(n).pod_id(),
            model: "m".to_owned(),
            engine: Engine::Vllm,
            dp_rank: 0,
        })
        .expect("four pods fit");
    let base = n * entries;
    for chunk in (0..entries).step_by(BLOCKS_PER_EVENT as usize) {
        let blocks: Vec<u32> = (chunk..(chunk + BLOCKS_PER_EVENT).min(entries)).collect();
        let tokens: Vec<u32> = blocks
            .iter()
            .flat_map(|b| ((base + b) * BLOCK_SIZE)..((base + b + 1) * BLOCK_SIZE))
            .collect();
        let hashes = |medium: &str| {
            Event::BlockStored(BlockStored::new(
                blocks
                    .iter()
                    .map(|b| BlockHash::from_i64(i64::from(base + b)))
                    .collect(),
                tokens.clone(),
                BLOCK_SIZE,
                Medium::intern(medium),
            ))
        };
        let mut events = vec![hashes("GPU")];
        if chunk % (4 * BLOCKS_PER_EVENT) == 0 {
            events.push(hashes("CPU"));
        }
        index
            .apply(
                source,
                &EngineBatch::of(events),
                1_700_000_000,
                &mut Discard,
            )
            .expect("registered");
    }
}

/// Serves `/v1/pods` over a filled index, for an HTTP load tool.
#[derive(Parser)]
struct Args {
    /// Address to listen on.
    #[arg(default_value = "127.0.0.1:18080")]
    addr: String,
    /// Resident entries per pod.
    #[arg(default_value_t = 12_000)]
    entries_per_pod: u32,
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let Args {
        addr,
        entries_per_pod: entries,
    } = Args::parse();
    let index = Index::new();
    for n in 0..PODS {
        fill(&index, n, entries);
    }
    let cancel = CancellationToken::new();
    let supervisor = Supervisor::new(index.clone(), None, cancel.clone(), ReplayLimits::default());
    supervisor.apply((0..PODS).map(target).collect()).await;
    let state = ApiState::new(
        ScoreBackend::Index(index.clone()),
        TierWeights::default(),
        None,
        supervisor.clone(),
    );
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!(
        "Serving /v1/pods on http://{} ({} entries).",
        listener.local_addr()?,
        index.stats().entries
    );
    let stop = cancel.clone();
    serve(listener, router(state), async move {
        let _ = tokio::signal::ctrl_c().await;
        stop.cancel();
    })
    .await?;
    supervisor.shutdown(std::time::Duration::from_secs(2)).await;
    Ok(())
}

//! kvindex's index against NVIDIA Dynamo's KV-router indexes (`dynamo-kv-router` 1.6.1:
//! `RadixTree` and `ConcurrentRadixTreeCompressed`, "CRTC") on one seeded workload, in one
//! process, so the ratios hold whatever else the machine is doing.
//!
//! Workload (fixed seed): 64 pods (`PEER_PODS=256` for a wider cluster); 1,024 prompts of 128
//! blocks × 16 tokens, organised as 32 system prompts (32 blocks) → 8 conversations each (64
//! blocks) → 4 turns each (32 blocks). Every pod stores 128 prompts, as an engine does: only
//! the blocks it does not hold yet, with the parent hash of the block before. Then ~30 % of
//! each pod's blocks are removed (chain tails, deepest first, and some single mid-chain blocks)
//! and 4 pods clear.
//!
//! Figures: throughput in M blocks/s from process CPU time (best of 5 runs, a fresh index
//! each), live heap bytes per resident (block, pod) entry from a counting allocator, and
//! per-query latency for a 128-block prompt against all the pods: full hit, half hit (a held
//! conversation, then a new turn), miss, and the three mixed. Three views of it: p50/p99 of
//! wall time over every query of 5 passes over the prompts (steady), and apart the first
//! pass after the index is built, whose data the build left out of cache (its p50 is about
//! twice the others' and its tail the cache's: counted as one of the five, it made the p99);
//! and the p50 of each prompt's fastest of 30 queries in a row, the query's own work with
//! its data in cache. Queries take precomputed block hashes on both sides.
//!
//! A cross-check follows the table: on natural prompts each index's matched length per pod
//! against the truth computed from the workload; on "spliced" prompts (system prompt A, then
//! a conversation of system prompt B) the chain truth (what a pod can reuse) and the
//! content-only truth (kthena's std hash semantics).
//!
//! Run: `cd benches/peers/dynamo && cargo run --release` (about a minute on 2 cores). The
//! process keeps the pages glibc's malloc gets (see [`keep_pages`]); `PEER_MALLOC=default`
//! measures with glibc's defaults instead.
//!
//! For a profiler (`perf record`, `valgrind --tool=callgrind`), one part of kvindex's
//! `prefix`-only side alone: `profile` (every edit), `profile-store1`, `profile-store8`,
//! `profile-remove` (each phase's best apply time and its page faults are printed; with
//! `PROFILE_STD=1`, on the default index with kthena's std layer; with
//! `PROFILE_PEER=radix`, on Dynamo's RadixTree, the yardstick), or `profile-query-full`,
//! `-half`, `-miss`, `-mixed` (one query kind after the 8-block stores, its p50 and p99
//! steady and in the first pass, and the p50 and p99 of each prompt's fastest of 30 queries
//! in a row: the spread of the work itself, without the cache's; `PROFILE_PEER=crtc` or
//! `radix` queries Dynamo's index instead: in callgrind, toggle `*find_matches_impl*` or
//! `*RadixTree::find_matches*`).
//! In callgrind, RadixTree's edits are `*apply_event_with_counters*` (`apply_event` only
//! jumps there, and a toggle on it collects nothing).

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dynamo_kv_router::indexer::{SyncIndexer, WorkerTask};
use dynamo_kv_router::protocols::{
    compute_block_hash_for_seq, BlockHashOptions, ExternalSequenceBlockHash, KvCacheEvent,
    KvCacheEventData, KvCacheRemoveData, KvCacheStoreData, KvCacheStoredBlockData, LocalBlockHash,
    OverlapScores, RouterEvent,
};
use dynamo_kv_router::{ConcurrentRadixTreeCompressed, RadixTree};
use kvindex::index::{Discard, Index, IndexOptions, SourceId, SourceSpec};
use kvindex::score::Candidates;
use kvindex::wire::{BlockHash, BlockRemoved, BlockStored, Engine, EngineBatch, Event};
use kvindex::{score::MatchMode, medium::Medium, score::PromptSettings, medium::TierWeights};

// ---------------------------------------------------------------------------------------
// Live heap bytes (for bytes per resident entry) and CPU time: kvindex's benches' own.
// ---------------------------------------------------------------------------------------

// The counting allocator wraps the binary's `allocator::Chosen`: the system allocator here,
// as this crate enables none of kvindex's allocator features.
// This crate has no allocator features: the include falls back to the system allocator.
#[allow(dead_code, unexpected_cfgs)]
#[path = "../../../../src/allocator.rs"]
mod allocator;
#[path = "../../../common/counting_alloc.rs"]
mod counting_alloc;
// Only `cpu_time` serves here (the process clock).
#[allow(dead_code)]
#[path = "../../../common/thread_cpu.rs"]
mod thread_cpu;

use counting_alloc::LIVE;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// CPU time of the whole process (CRTC applies on a worker thread of its own).
fn cpu_now() -> Duration {
    thread_cpu::cpu_time(libc::CLOCK_PROCESS_CPUTIME_ID)
}

// ---------------------------------------------------------------------------------------
// The workload.
// ---------------------------------------------------------------------------------------

const SEED: u64 = 0x6b76_696e_6465_7821;
const BLOCK: usize = 16;
const SYSTEMS: usize = 32;
const CONVS: usize = 8;
const TURNS: usize = 4;
const SYS_BLOCKS: usize = 32;
const CONV_BLOCKS: usize = 64;
const TURN_BLOCKS: usize = 32;
const PROMPT_BLOCKS: usize = SYS_BLOCKS + CONV_BLOCKS + TURN_BLOCKS;
/// Pods in the workload: 64, or `PEER_PODS` when it is more than the `CLEARED_PODS` that
/// clear (every query scores all of them, so a wider cluster measures candidate lists
/// longer than one 64-bit word).
fn pods() -> usize {
    static PODS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *PODS.get_or_init(|| {
        let pods = std::env::var("PEER_PODS").ok().and_then(|p| p.parse().ok());
        pods.filter(|&p| p > CLEARED_PODS).unwrap_or(64)
    })
}
const PROMPTS_PER_POD: usize = 128;
const CLEARED_PODS: usize = 4;
const QUERIES: usize = 200;
const RUNS: usize = 5;
const MODEL: &str = "m";

/// One chain block: its tokens and every hash either side needs, computed once.
struct Node {
    tokens: [u32; BLOCK],
    /// The engine's (chained) block hash, as an engine would publish it.
    engine: u64,
    /// Dynamo's content hash of the block (XXH3 of the tokens).
    local: LocalBlockHash,
    /// kthena's std hash of the block (SHA-256 of the tokens).
    std: u64,
}

/// A store, remove or clear of one pod, in engine-hash terms (node ids).
enum Op {
    Store {
        pod: usize,
        parent: Option<usize>,
        nodes: Vec<usize>,
    },
    Remove {
        pod: usize,
        nodes: Vec<usize>,
    },
    Clear {
        pod: usize,
    },
}

struct Workload {
    nodes: Vec<Node>,
    prompts: Vec<Vec<usize>>,
    /// What each pod holds after the store phase (node ids).
    held: Vec<HashSet<usize>>,
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

fn new_node(nodes: &mut Vec<Node>, rng: &mut fastrand::Rng, parent: Option<usize>) -> usize {
    let mut tokens = [0u32; BLOCK];
    for t in &mut tokens {
        *t = rng.u32(..50_000);
    }
    node_with(nodes, tokens, parent)
}

fn node_with(nodes: &mut Vec<Node>, tokens: [u32; BLOCK], parent: Option<usize>) -> usize {
    let id = nodes.len();
    let parent_engine = parent.map_or(0, |p| nodes[p].engine);
    let engine = splitmix(parent_engine ^ splitmix(SEED ^ id as u64));
    let local = compute_block_hash_for_seq(&tokens, BLOCK as u32, BlockHashOptions::default())[0];
    let std = kvindex::hash::std_hash(&tokens);
    nodes.push(Node {
        tokens,
        engine,
        local,
        std,
    });
    id
}

/// A chain of `n` fresh blocks after `parent`.
fn chain(
    nodes: &mut Vec<Node>,
    rng: &mut fastrand::Rng,
    mut parent: Option<usize>,
    n: usize,
) -> Vec<usize> {
    (0..n)
        .map(|_| {
            let id = new_node(nodes, rng, parent);
            parent = Some(id);
            id
        })
        .collect()
}

impl Workload {
    fn new(rng: &mut fastrand::Rng) -> Workload {
        let mut nodes = Vec::new();
        let mut prompts = Vec::new();
        for _ in 0..SYSTEMS {
            let system = chain(&mut nodes, rng, None, SYS_BLOCKS);
            for _ in 0..CONVS {
                let conv = chain(&mut nodes, rng, system.last().copied(), CONV_BLOCKS);
                for _ in 0..TURNS {
                    let turn = chain(&mut nodes, rng, conv.last().copied(), TURN_BLOCKS);
                    prompts.push([system.as_slice(), &conv, &turn].concat());
                }
            }
        }
        Workload {
            nodes,
            prompts,
            held: vec![HashSet::new(); pods()],
        }
    }

    /// Every pod stores `PROMPTS_PER_POD` prompts, in rounds across pods, `per_event` blocks
    /// an event.
    fn stores(&mut self, rng: &mut fastrand::Rng, per_event: usize) -> Vec<Op> {
        let picks: Vec<Vec<usize>> = (0..pods())
            .map(|_| {
                let mut all: Vec<usize> = (0..self.prompts.len()).collect();
                rng.shuffle(&mut all);
                all.truncate(PROMPTS_PER_POD);
                all
            })
            .collect();
        let mut held = vec![HashSet::new(); pods()];
        let mut ops = Vec::new();
        for round in 0..PROMPTS_PER_POD {
            for (pod, picked) in picks.iter().enumerate() {
                let prompt = &self.prompts[picked[round]];
                let first_new = prompt
                    .iter()
                    .position(|n| !held[pod].contains(n))
                    .unwrap_or(prompt.len());
                let mut parent = first_new.checked_sub(1).map(|i| prompt[i]);
                for chunk in prompt[first_new..].chunks(per_event) {
                    held[pod].extend(chunk.iter().copied());
                    ops.push(Op::Store {
                        pod,
                        parent,
                        nodes: chunk.to_vec(),
                    });
                    parent = chunk.last().copied();
                }
            }
        }
        self.held = held;
        ops
    }

    /// About 30 % of each pod's blocks: turn tails of whole prompts (deepest first, 8 a
    /// message) and single mid-chain turn blocks of other prompts.
    fn removes(&self, rng: &mut fastrand::Rng) -> Vec<Op> {
        let mut ops = Vec::new();
        for pod in 0..pods() {
            let mut prompts: Vec<&Vec<usize>> = self
                .prompts
                .iter()
                .filter(|p| self.held[pod].contains(p.last().unwrap()))
                .collect();
            rng.shuffle(&mut prompts);
            let target = self.held[pod].len() * 3 / 10;
            let mut removed = 0;
            let mut rest = prompts.into_iter();
            for prompt in rest.by_ref() {
                if removed >= target * 9 / 10 {
                    break;
                }
                let tail: Vec<usize> = prompt[PROMPT_BLOCKS - 24..].iter().rev().copied().collect();
                removed += tail.len();
                for chunk in tail.chunks(8) {
                    ops.push(Op::Remove {
                        pod,
                        nodes: chunk.to_vec(),
                    });
                }
            }
            for prompt in rest {
                if removed >= target {
                    break;
                }
                let mid = prompt[SYS_BLOCKS + CONV_BLOCKS + 4];
                ops.push(Op::Remove {
                    pod,
                    nodes: vec![mid],
                });
                removed += 1;
            }
        }
        ops
    }

    fn resident_entries(&self) -> usize {
        self.held.iter().map(HashSet::len).sum()
    }
}

// ---------------------------------------------------------------------------------------
// The two sides' event forms, built before the clock starts.
// ---------------------------------------------------------------------------------------

/// Dynamo's events for `ops`, each with its blocks' tokens (for the rows that hash).
fn dynamo_events(w: &Workload, ops: &[Op]) -> Vec<(RouterEvent, Vec<u32>)> {
    ops.iter()
        .enumerate()
        .map(|(i, op)| {
            let tokens = match op {
                Op::Store { nodes, .. } => nodes.iter().flat_map(|&n| w.nodes[n].tokens).collect(),
                _ => Vec::new(),
            };
            (dynamo_event(w, op, i as u64), tokens)
        })
        .collect()
}

/// Recomputes a store's content hashes from its tokens, as a router that receives tokens
/// must.
fn rehash(event: &mut RouterEvent, tokens: &[u32]) {
    if let KvCacheEventData::Stored(store) = &mut event.event.data {
        let locals = compute_block_hash_for_seq(tokens, BLOCK as u32, BlockHashOptions::default());
        for (block, local) in store.blocks.iter_mut().zip(locals) {
            block.tokens_hash = local;
        }
    }
}

fn dynamo_event(w: &Workload, op: &Op, id: u64) -> RouterEvent {
    let (pod, data) = match op {
        Op::Store { pod, parent, nodes } => {
            let locals: Vec<LocalBlockHash> = nodes.iter().map(|&n| w.nodes[n].local).collect();
            let blocks = nodes
                .iter()
                .zip(locals)
                .map(|(&n, local)| KvCacheStoredBlockData {
                    block_hash: ExternalSequenceBlockHash(w.nodes[n].engine),
                    tokens_hash: local,
                    mm_extra_info: None,
                })
                .collect();
            let data = KvCacheStoreData {
                parent_hash: parent.map(|p| ExternalSequenceBlockHash(w.nodes[p].engine)),
                start_position: None,
                blocks,
            };
            (*pod, KvCacheEventData::Stored(data))
        }
        Op::Remove { pod, nodes } => {
            let block_hashes = nodes
                .iter()
                .map(|&n| ExternalSequenceBlockHash(w.nodes[n].engine))
                .collect();
            (
                *pod,
                KvCacheEventData::Removed(KvCacheRemoveData { block_hashes }),
            )
        }
        Op::Clear { pod } => (*pod, KvCacheEventData::Cleared),
    };
    RouterEvent::new(
        pod as u64,
        KvCacheEvent {
            event_id: id,
            data,
            dp_rank: 0,
        },
    )
}

fn kvindex_batch(w: &Workload, op: &Op) -> (usize, EngineBatch) {
    let engine = |n: usize| BlockHash::Int(w.nodes[n].engine);
    match op {
        Op::Store { pod, parent, nodes } => {
            let tokens: Vec<u32> = nodes.iter().flat_map(|&n| w.nodes[n].tokens).collect();
            let mut stored = BlockStored::new(
                nodes.iter().map(|&n| engine(n)).collect(),
                tokens,
                BLOCK as u32,
                Medium::GPU,
            );
            stored.parent_block_hash = parent.map(engine);
            (*pod, EngineBatch::of(vec![Event::BlockStored(stored)]))
        }
        Op::Remove { pod, nodes } => {
            let removed =
                BlockRemoved::new(nodes.iter().map(|&n| engine(n)).collect(), Medium::NONE);
            (*pod, EngineBatch::of(vec![Event::BlockRemoved(removed)]))
        }
        Op::Clear { pod } => (*pod, EngineBatch::of(vec![Event::AllBlocksCleared])),
    }
}

fn pod_name(pod: usize) -> String {
    format!("pod-{pod}.bench")
}

// ---------------------------------------------------------------------------------------
// The three indexes behind one face.
// ---------------------------------------------------------------------------------------

trait Peer {
    fn name(&self) -> &'static str;
    /// Applies `ops`; returns how many events were refused and the CPU time of applying
    /// them. Events are built before the clock starts; with `hashed`, the clock also covers
    /// hashing each block's tokens (Dynamo's XXH3 content hash, kvindex's std hash).
    fn apply(&mut self, ops: &[Op], w: &Workload, hashed: bool) -> (usize, Duration);
    /// Matched blocks per pod for one prompt.
    fn matched(&self, prompt: &[usize], w: &Workload) -> Vec<u32>;
    /// One query, timed on its own.
    fn query_time(&self, prompt: &[usize], w: &Workload) -> Duration;
}

struct Dynamo {
    tree: RadixTree,
}

/// A prompt as Dynamo queries it: its blocks' content hashes.
fn locals(prompt: &[usize], w: &Workload) -> Vec<LocalBlockHash> {
    prompt.iter().map(|&n| w.nodes[n].local).collect()
}

/// Dynamo's overlap scores as matched blocks per pod.
fn per_pod(scores: OverlapScores) -> Vec<u32> {
    let mut out = vec![0; pods()];
    for (worker, score) in scores.scores {
        out[worker.worker_id as usize] = score;
    }
    out
}

/// The wall time of one query (its result kept from being optimised away).
fn timed<T>(query: impl FnOnce() -> T) -> Duration {
    let start = Instant::now();
    let result = query();
    let took = start.elapsed();
    std::hint::black_box(result);
    took
}

impl Peer for Dynamo {
    fn name(&self) -> &'static str {
        "Dynamo RadixTree"
    }
    fn apply(&mut self, ops: &[Op], w: &Workload, hashed: bool) -> (usize, Duration) {
        let events = dynamo_events(w, ops);
        let start = cpu_now();
        let mut refused = 0;
        for (mut event, tokens) in events {
            if hashed {
                rehash(&mut event, &tokens);
            }
            refused += usize::from(self.tree.apply_event(event).is_err());
        }
        (refused, cpu_now() - start)
    }
    fn matched(&self, prompt: &[usize], w: &Workload) -> Vec<u32> {
        per_pod(self.tree.find_matches(locals(prompt, w), false))
    }
    fn query_time(&self, prompt: &[usize], w: &Workload) -> Duration {
        let seq = locals(prompt, w);
        timed(|| self.tree.find_matches(seq, false))
    }
}

/// CRTC applies events on a worker thread fed through a channel, as Dynamo runs it; the
/// clock (process CPU) covers both threads.
struct Crtc {
    tree: Arc<ConcurrentRadixTreeCompressed>,
    tx: Option<flume::Sender<WorkerTask>>,
    worker: Option<std::thread::JoinHandle<()>>,
}

impl Crtc {
    fn new() -> Crtc {
        let tree = Arc::new(ConcurrentRadixTreeCompressed::new());
        let (tx, rx) = flume::unbounded();
        let worker_tree = tree.clone();
        let worker = std::thread::spawn(move || {
            let _ = worker_tree.worker(rx, None);
        });
        Crtc {
            tree,
            tx: Some(tx),
            worker: Some(worker),
        }
    }
}

impl Drop for Crtc {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

impl Peer for Crtc {
    fn name(&self) -> &'static str {
        "Dynamo CRTC"
    }
    fn apply(&mut self, ops: &[Op], w: &Workload, hashed: bool) -> (usize, Duration) {
        let tx = self.tx.as_ref().expect("worker running");
        let events = dynamo_events(w, ops);
        let start = cpu_now();
        let mut refused = 0;
        let n = events.len();
        for (i, (mut event, tokens)) in events.into_iter().enumerate() {
            if hashed {
                rehash(&mut event, &tokens);
            }
            if i + 1 == n {
                let (resp, done) = tokio::sync::oneshot::channel();
                tx.send(WorkerTask::EventWithAck { event, resp })
                    .expect("worker alive");
                refused += usize::from(!done.blocking_recv().unwrap_or(false));
            } else {
                tx.send(WorkerTask::Event(event)).expect("worker alive");
            }
        }
        (refused, cpu_now() - start)
    }
    fn matched(&self, prompt: &[usize], w: &Workload) -> Vec<u32> {
        per_pod(self.tree.find_matches(&locals(prompt, w), false))
    }
    fn query_time(&self, prompt: &[usize], w: &Workload) -> Duration {
        let seq = locals(prompt, w);
        timed(|| self.tree.find_matches(&seq, false))
    }
}

struct Kvindex {
    index: Index,
    sources: Vec<SourceId>,
    pods: Vec<String>,
    /// The pod list resolved once, as a router keeps its candidates.
    candidates: Candidates,
    weights: TierWeights,
    mode: MatchMode,
}

impl Kvindex {
    /// An index with kthena's std layer (what a mirror or `kthena` matching needs).
    fn new(mode: MatchMode) -> Kvindex {
        Kvindex::with_options(mode, IndexOptions::default())
    }

    /// The `prefix`-only index: no std layer, no SHA-256.
    fn prefix_only() -> Kvindex {
        let options = IndexOptions {
            std_layer: false,
            ..IndexOptions::default()
        };
        Kvindex::with_options(MatchMode::Prefix, options)
    }

    fn with_options(mode: MatchMode, options: IndexOptions) -> Kvindex {
        let index = Index::with_options(options);
        let pods: Vec<String> = (0..pods()).map(pod_name).collect();
        let sources = pods
            .iter()
            .map(|pod| {
                index
                    .register_source(&SourceSpec {
                        pod: pod.clone(),
                        model: MODEL.to_owned(),
                        engine: Engine::Vllm,
                        dp_rank: 0,
                    })
                    .expect("the pods fit")
            })
            .collect();
        let candidates = Candidates::new(&index, &pods);
        Kvindex {
            index,
            sources,
            pods,
            candidates,
            weights: TierWeights::default(),
            mode,
        }
    }

    /// The prompt's block hashes in this peer's match mode: chain hashes for `prefix`,
    /// kthena's std hashes for `kthena` (computed before the clock starts, as Dynamo's are).
    fn hashes(&self, prompt: &[usize], w: &Workload) -> Vec<u64> {
        match self.mode {
            MatchMode::Kthena => prompt.iter().map(|&n| w.nodes[n].std).collect(),
            MatchMode::Prefix => {
                let tokens: Vec<u32> = prompt.iter().flat_map(|&n| w.nodes[n].tokens).collect();
                let settings = PromptSettings::new(BLOCK, PROMPT_BLOCKS).expect("valid settings");
                settings.blocks(MODEL, &tokens, MatchMode::Prefix)
            }
        }
    }

    fn scores(&self, hashes: &[u64]) -> kvindex::score::PrefixScores {
        kvindex::score::score_index_with(
            &self.index,
            MODEL,
            hashes,
            &self.pods,
            &self.weights,
            &[],
            self.mode,
        )
    }
}

impl Peer for Kvindex {
    fn name(&self) -> &'static str {
        match (self.mode, self.index.has_std_layer()) {
            (MatchMode::Prefix, false) => "kvindex prefix-only",
            (MatchMode::Prefix, true) => "kvindex prefix",
            (MatchMode::Kthena, _) => "kvindex kthena",
        }
    }
    fn apply(&mut self, ops: &[Op], w: &Workload, _hashed: bool) -> (usize, Duration) {
        // kvindex hashes inside `apply` (the std hash of each block's tokens) either way.
        let batches: Vec<(usize, EngineBatch)> =
            ops.iter().map(|op| kvindex_batch(w, op)).collect();
        let start = cpu_now();
        let mut refused = 0;
        for (pod, batch) in &batches {
            refused += usize::from(
                self.index
                    .apply(self.sources[*pod], batch, 0, &mut Discard)
                    .is_err(),
            );
        }
        (refused, cpu_now() - start)
    }
    fn matched(&self, prompt: &[usize], w: &Workload) -> Vec<u32> {
        let hashes = self.hashes(prompt, w);
        let mut out = vec![0; pods()];
        for s in self.scores(&hashes).scores {
            let pod: usize = s.pod["pod-".len()..s.pod.len() - ".bench".len()]
                .parse()
                .expect("our pod names");
            out[pod] = s.matched_blocks;
        }
        out
    }
    fn query_time(&self, prompt: &[usize], w: &Workload) -> Duration {
        // What a router calls per request: scores by candidate position (Dynamo's answer
        // is likewise keyed by worker id, unnamed and unsorted).
        let hashes = self.hashes(prompt, w);
        timed(|| {
            kvindex::score::score_candidates(
                &self.index,
                MODEL,
                &hashes,
                &self.candidates,
                &self.weights,
                &[],
                self.mode,
            )
        })
    }
}

// ---------------------------------------------------------------------------------------
// Measuring.
// ---------------------------------------------------------------------------------------

fn blocks_in(ops: &[Op]) -> usize {
    ops.iter()
        .map(|op| match op {
            Op::Store { nodes, .. } | Op::Remove { nodes, .. } => nodes.len(),
            Op::Clear { .. } => 0,
        })
        .sum()
}

/// A way to build a fresh peer of one kind.
type MakePeer = dyn Fn() -> Box<dyn Peer>;

/// The peers, in the table's column order ([`print_table`]), then kvindex in `kthena` mode
/// (the cross-check's fifth row).
fn peer_kinds() -> [Box<MakePeer>; 5] {
    [
        Box::new(|| {
            Box::new(Dynamo {
                tree: RadixTree::new(),
            })
        }),
        Box::new(|| Box::new(Crtc::new())),
        Box::new(|| Box::new(Kvindex::prefix_only())),
        Box::new(|| Box::new(Kvindex::new(MatchMode::Prefix))),
        Box::new(|| Box::new(Kvindex::new(MatchMode::Kthena))),
    ]
}

/// Dynamo's RadixTree in [`peer_kinds`].
const RADIX: usize = 0;
/// kvindex `prefix`-only in [`peer_kinds`].
const KVINDEX_PREFIX_ONLY: usize = 2;
/// kvindex with the std layer in [`peer_kinds`].
const KVINDEX: usize = 3;

/// Best-of-`RUNS` M blocks/s of applying `ops` to a fresh peer of each kind (after `before`,
/// untimed), with the applies refused. The kinds take turns run after run, so a change in
/// the machine's load falls on all of them alike rather than on whichever ran then.
fn throughputs(
    makes: &[&MakePeer],
    w: &Workload,
    before: &[&[Op]],
    ops: &[Op],
    blocks: usize,
    hashed: bool,
) -> Vec<(f64, usize)> {
    let mut best = vec![(Duration::MAX, 0); makes.len()];
    for _ in 0..RUNS {
        for (make, best) in makes.iter().zip(&mut best) {
            let mut peer = make();
            for ops in before {
                peer.apply(ops, w, hashed);
            }
            let (refused, took) = peer.apply(ops, w, hashed);
            *best = (best.0.min(took), refused);
        }
    }
    let rate = |took: Duration| blocks as f64 / took.as_secs_f64() / 1e6;
    (best.into_iter())
        .map(|(took, refused)| (rate(took), refused))
        .collect()
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

struct Latency {
    p50: f64,
    p99: f64,
}

impl Latency {
    /// The p50 and p99 of `times`.
    fn of(mut times: Vec<Duration>) -> Latency {
        times.sort();
        Latency {
            p50: percentile(&times, 0.5),
            p99: percentile(&times, 0.99),
        }
    }
}

fn latency(peer: &dyn Peer, prompts: &[Vec<usize>], w: &Workload) -> Passes {
    latencies(&[peer], prompts, w).remove(0)
}

/// Queries of each prompt in a row, of which each prompt's fastest counts.
const WARM_REPEATS: usize = 30;

/// p50 and p99 over `prompts` of each prompt's fastest of [`WARM_REPEATS`] queries in a
/// row: the query's own work with its data in cache, apart from what the cache costs.
fn warm_latency(peer: &dyn Peer, prompts: &[Vec<usize>], w: &Workload) -> Latency {
    warm_latencies(&[peer], prompts, w).remove(0)
}

/// [`warm_latency`] of each peer, the peers taking turns prompt after prompt, so a drift of
/// the machine's speed (a shared host's) weighs on each alike.
fn warm_latencies(peers: &[&dyn Peer], prompts: &[Vec<usize>], w: &Workload) -> Vec<Latency> {
    let mut fastest = vec![Vec::with_capacity(prompts.len()); peers.len()];
    for p in prompts {
        for (peer, fastest) in peers.iter().zip(&mut fastest) {
            let best = (0..WARM_REPEATS).map(|_| peer.query_time(p, w)).min();
            fastest.extend(best);
        }
    }
    fastest.into_iter().map(Latency::of).collect()
}

/// The latency of each peer over `prompts`: its first pass, then `RUNS` passes more (the
/// steady figure), the peers taking turns pass after pass (as [`throughputs`]).
fn latencies(peers: &[&dyn Peer], prompts: &[Vec<usize>], w: &Workload) -> Vec<Passes> {
    let pass = |peer: &dyn Peer| -> Vec<Duration> {
        prompts.iter().map(|p| peer.query_time(p, w)).collect()
    };
    let first: Vec<Vec<Duration>> = peers.iter().map(|peer| pass(*peer)).collect();
    let mut times = vec![Vec::with_capacity(prompts.len() * RUNS); peers.len()];
    for _ in 0..RUNS {
        for (peer, times) in peers.iter().zip(&mut times) {
            times.extend(pass(*peer));
        }
    }
    (first.into_iter().zip(times))
        .map(|(first, steady)| Passes {
            first: Latency::of(first),
            steady: Latency::of(steady),
        })
        .collect()
}

/// A peer's latency over a query set: its first pass over the prompts and the passes after.
/// The first pass after the index is built (or after other work filled the cache) finds
/// the index out of cache, and its tail is the cache's: apart, so neither hides the other.
struct Passes {
    first: Latency,
    steady: Latency,
}

/// One figure of a peer's [`Passes`], as the table prints it.
type PassFigure = fn(&Passes) -> f64;

struct Column {
    store_1: f64,
    store_8: f64,
    store_8_nohash: f64,
    remove: f64,
    clear: f64,
    bytes_per_entry: f64,
    /// Per query set, [`latencies`].
    queries: Vec<Passes>,
    /// Per query set, [`warm_latency`].
    warm: Vec<Latency>,
    refused: usize,
}

struct QuerySets {
    names: [&'static str; 4],
    sets: [Vec<Vec<usize>>; 4],
}

fn query_sets(w: &mut Workload, rng: &mut fastrand::Rng) -> QuerySets {
    let held_prompts: Vec<usize> = (0..w.prompts.len())
        .filter(|&p| {
            w.held
                .iter()
                .any(|h| h.contains(w.prompts[p].last().unwrap()))
        })
        .collect();
    let full: Vec<Vec<usize>> = (0..QUERIES)
        .map(|_| w.prompts[held_prompts[rng.usize(..held_prompts.len())]].clone())
        .collect();
    let half: Vec<Vec<usize>> = (0..QUERIES)
        .map(|_| {
            let base = w.prompts[held_prompts[rng.usize(..held_prompts.len())]].clone();
            let head = &base[..PROMPT_BLOCKS / 2];
            let tail = chain(&mut w.nodes, rng, head.last().copied(), PROMPT_BLOCKS / 2);
            [head, &tail].concat()
        })
        .collect();
    let miss: Vec<Vec<usize>> = (0..QUERIES)
        .map(|_| chain(&mut w.nodes, rng, None, PROMPT_BLOCKS))
        .collect();
    let mut mixed: Vec<Vec<usize>> = full
        .iter()
        .chain(&half)
        .chain(&miss)
        .step_by(3)
        .cloned()
        .collect();
    rng.shuffle(&mut mixed);
    QuerySets {
        names: ["full hit", "half hit", "miss", "mixed"],
        sets: [full, half, miss, mixed],
    }
}

/// The edits the table times, in the order they are applied.
struct Phases<'a> {
    stores_1: &'a [Op],
    stores_8: &'a [Op],
    removes: &'a [Op],
    clears: &'a [Op],
    /// Entries the clears take out.
    cleared_entries: usize,
}

/// Every figure of the table for each kind of peer, the kinds measured side by side.
fn measure(makes: &[&MakePeer], w: &Workload, phases: &Phases, queries: &QuerySets) -> Vec<Column> {
    let Phases {
        stores_1,
        stores_8,
        removes,
        clears,
        cleared_entries,
    } = *phases;
    let blocks = blocks_in(stores_8);
    let store_1 = throughputs(makes, w, &[], stores_1, blocks, true);
    let store_8 = throughputs(makes, w, &[], stores_8, blocks, true);
    let store_8_nohash = throughputs(makes, w, &[], stores_8, blocks, false);
    let remove = throughputs(makes, w, &[stores_8], removes, blocks_in(removes), false);
    let before_clear: &[&[Op]] = &[stores_8, removes];
    let clear = throughputs(makes, w, before_clear, clears, cleared_entries, false);

    // Each alone, so its heap growth is its own (CRTC keeps threads).
    let bytes_per_entry: Vec<f64> = (makes.iter())
        .map(|make| {
            let before = live();
            let mut peer = make();
            peer.apply(stores_8, w, false);
            (live() - before) as f64 / w.resident_entries() as f64
        })
        .collect();
    let peers: Vec<Box<dyn Peer>> = (makes.iter())
        .map(|make| {
            let mut peer = make();
            peer.apply(stores_8, w, false);
            peer
        })
        .collect();
    let views: Vec<&dyn Peer> = peers.iter().map(|p| p.as_ref()).collect();
    let mut by_set: Vec<_> = (queries.sets.iter())
        .map(|set| latencies(&views, set, w).into_iter())
        .collect();
    let mut warm_by_set: Vec<_> = (queries.sets.iter())
        .map(|set| warm_latencies(&views, set, w).into_iter())
        .collect();
    (0..makes.len())
        .map(|i| Column {
            store_1: store_1[i].0,
            store_8: store_8[i].0,
            store_8_nohash: store_8_nohash[i].0,
            remove: remove[i].0,
            clear: clear[i].0,
            bytes_per_entry: bytes_per_entry[i],
            queries: by_set.iter_mut().filter_map(Iterator::next).collect(),
            warm: warm_by_set.iter_mut().filter_map(Iterator::next).collect(),
            refused: store_1[i].1 + store_8[i].1 + remove[i].1 + clear[i].1,
        })
        .collect()
}

/// Matched blocks per pod that a chain-verified index must report: the longest prefix of
/// `prompt` the pod holds as one chain.
fn chain_truth(held: &[HashSet<usize>], prompt: &[usize]) -> Vec<u32> {
    held.iter()
        .map(|h| prompt.iter().take_while(|n| h.contains(n)).count() as u32)
        .collect()
}

/// Each pod's held blocks as content (std hashes): what kthena's layout can express.
fn contents(w: &Workload, held: &[HashSet<usize>]) -> Vec<HashSet<u64>> {
    held.iter()
        .map(|h| h.iter().map(|&n| w.nodes[n].std).collect())
        .collect()
}

/// Matched blocks per pod under kthena's content-only std hashes.
fn content_truth(w: &Workload, contents: &[HashSet<u64>], prompt: &[usize]) -> Vec<u32> {
    contents
        .iter()
        .map(|c| {
            prompt
                .iter()
                .take_while(|&&n| c.contains(&w.nodes[n].std))
                .count() as u32
        })
        .collect()
}

/// System prompt A, then a conversation and turn of system prompt B (same tokens, new
/// chain): a pod holding B's prompt can reuse A's system blocks only.
fn spliced(w: &mut Workload, rng: &mut fastrand::Rng) -> Vec<Vec<usize>> {
    (0..250)
        .map(|_| {
            let a = rng.usize(..SYSTEMS);
            let b = (a + 1 + rng.usize(..SYSTEMS - 1)) % SYSTEMS;
            let of_b = &w.prompts[b * CONVS * TURNS + rng.usize(..CONVS * TURNS)];
            let mut prompt = w.prompts[a * CONVS * TURNS][..SYS_BLOCKS].to_vec();
            let mut parent = prompt.last().copied();
            for &n in &of_b[SYS_BLOCKS..].to_vec() {
                let tokens = w.nodes[n].tokens;
                let id = node_with(&mut w.nodes, tokens, parent);
                prompt.push(id);
                parent = Some(id);
            }
            prompt
        })
        .collect()
}

fn mismatches(
    peer: &dyn Peer,
    w: &Workload,
    prompts: &[Vec<usize>],
    truth: &dyn Fn(&[usize]) -> Vec<u32>,
) -> (usize, usize) {
    let mut wrong = 0;
    let mut checks = 0;
    for p in prompts {
        let got = peer.matched(p, w);
        let want = truth(p);
        checks += pods();
        wrong += got.iter().zip(&want).filter(|(g, t)| g != t).count();
    }
    (wrong, checks)
}

/// Keeps the pages glibc's malloc has in the process (no trimming, no per-allocation maps
/// below 32 MiB), unless `PEER_MALLOC=default`: each figure is the best of fresh builds in one
/// process, and with glibc's defaults a peer that frees few large tables (kvindex's maps) gets
/// them back from the kernel as new pages, faulted in again on every build (~4,000 faults a
/// build of the 8-block stores, 15–20 % of its time), while one that frees many small nodes
/// (the trees) keeps them in the heap and builds on them without a fault. Kept pages put the
/// peers on one footing: what a daemon past its first minutes runs on.
fn keep_pages() {
    if std::env::var("PEER_MALLOC").is_ok_and(|m| m == "default") {
        println!("malloc: glibc defaults (PEER_MALLOC=default)");
        return;
    }
    // SAFETY: `mallopt` only sets malloc parameters; called before other threads start.
    let kept = unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20) == 1
            && libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX) == 1
    };
    if !kept {
        println!("malloc: parameters refused, glibc defaults");
    }
}

/// Minor page faults of the process so far.
fn page_faults() -> i64 {
    // SAFETY: `getrusage` fills the struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    usage.ru_minflt
}

fn main() {
    keep_pages();
    let mut rng = fastrand::Rng::with_seed(SEED);
    let mut w = Workload::new(&mut rng);
    let stores_8 = w.stores(&mut fastrand::Rng::with_seed(SEED + 1), 8);
    let stores_1 = w.stores(&mut fastrand::Rng::with_seed(SEED + 1), 1);
    let removes = w.removes(&mut rng);
    let clears: Vec<Op> = (0..CLEARED_PODS).map(|pod| Op::Clear { pod }).collect();
    // What the cleared pods hold after the removes.
    let mut after_removes = w.held.clone();
    for op in &removes {
        if let Op::Remove { pod, nodes } = op {
            for n in nodes {
                after_removes[*pod].remove(n);
            }
        }
    }
    let cleared_entries: usize = after_removes[..CLEARED_PODS].iter().map(HashSet::len).sum();
    let queries = query_sets(&mut w, &mut rng);
    let splices = spliced(&mut w, &mut rng);

    let profiled: Option<Vec<&[Op]>> = match std::env::args().nth(1).as_deref() {
        Some("profile") => Some(vec![&stores_8, &stores_1, &removes, &clears]),
        Some("profile-store1") => Some(vec![&stores_1]),
        Some("profile-store8") => Some(vec![&stores_8]),
        Some("profile-remove") => Some(vec![&stores_8, &removes]),
        _ => None,
    };
    if let Some(set) = std::env::args().nth(1).and_then(|a| {
        let kind = a.strip_prefix("profile-query-")?.to_string();
        queries
            .names
            .iter()
            .position(|n| n.starts_with(kind.as_str()))
    }) {
        // One query kind on kvindex's `prefix`-only index after the 8-block stores, for a
        // profiler; prints the kind's latency. `PROFILE_PEER=crtc` (or `radix`) queries
        // Dynamo's index instead.
        let mut peer: Box<dyn Peer> = match std::env::var("PROFILE_PEER").as_deref() {
            Ok("crtc") => Box::new(Crtc::new()),
            Ok("radix") => Box::new(Dynamo {
                tree: RadixTree::new(),
            }),
            _ => Box::new(Kvindex::prefix_only()),
        };
        peer.apply(&stores_8, &w, true);
        let peer = &*peer;
        let Passes { first, steady } = latency(peer, &queries.sets[set], &w);
        println!(
            "{}: p50 {:.3} µs, p99 {:.3} µs (first pass after the build: p50 {:.3} µs, p99 {:.3} µs)",
            queries.names[set], steady.p50, steady.p99, first.p50, first.p99
        );
        let warm = warm_latency(peer, &queries.sets[set], &w);
        println!(
            "each prompt's fastest of {WARM_REPEATS} in a row: p50 {:.3} µs, p99 {:.3} µs",
            warm.p50, warm.p99
        );
        return;
    }
    if let Some(phases) = profiled {
        // Only kvindex's `prefix`-only edits, for a profiler: all of them (`profile`) or one
        // kind on a fresh index (a remove profile includes the stores it needs).
        // Each phase's best apply time over the runs, for comparing builds.
        // `PROFILE_STD=1` profiles the default index, with the std layer, instead.
        // `PROFILE_PEER=radix` profiles Dynamo's RadixTree on the same phases (the yardstick:
        // toggle `*apply_event_with_counters*` and `*compute_block_hash_for_seq*` in
        // callgrind: its hashing is done outside its apply).
        let kind = if std::env::var("PROFILE_PEER").is_ok_and(|p| p == "radix") {
            RADIX
        } else if std::env::var_os("PROFILE_STD").is_some() {
            KVINDEX
        } else {
            KVINDEX_PREFIX_ONLY
        };
        let kinds = peer_kinds();
        let make = &kinds[kind];
        let mut best = vec![(Duration::MAX, 0); phases.len()];
        for _ in 0..RUNS {
            let mut peer = make();
            for (ops, best) in phases.iter().zip(&mut best) {
                let faults = page_faults();
                let took = peer.apply(ops, &w, true).1;
                *best = (*best).min((took, page_faults() - faults));
            }
        }
        let best: Vec<String> = (best.iter())
            .map(|(took, faults)| format!("{took:.1?} ({faults} page faults)"))
            .collect();
        println!(
            "{} apply, best of {RUNS} per phase: {}",
            make().name(),
            best.join(", ")
        );
        return;
    }
    println!(
        "workload: {} pods, {} prompts × {PROMPT_BLOCKS} blocks × {BLOCK} tokens, {} resident (block, pod) entries, {} store events of 1 block / {} of 8, {} blocks removed, {} cleared",
        pods(),
        w.prompts.len(),
        w.resident_entries(),
        stores_1.len(),
        stores_8.len(),
        blocks_in(&removes),
        cleared_entries,
    );

    let peers = peer_kinds();
    // Two kvindex builds: `prefix`-only (no std layer: the in-memory index a router needs)
    // and with kthena's std layer (what a Redis mirror or `kthena` matching needs), both
    // queried in `prefix` mode; `kthena` queries of the latter are timed apart.
    let makes: Vec<&MakePeer> = peers[..4].iter().map(AsRef::as_ref).collect();
    let phases = Phases {
        stores_1: &stores_1,
        stores_8: &stores_8,
        removes: &removes,
        clears: &clears,
        cleared_entries,
    };
    let columns = measure(&makes, &w, &phases, &queries);
    print_table(&columns, &queries);
    let mut kthena = Kvindex::new(MatchMode::Kthena);
    kthena.apply(&stores_8, &w, false);
    for (name, set) in queries.names.iter().zip(&queries.sets) {
        let l = latency(&kthena, set, &w).steady;
        println!(
            "kvindex in kthena mode, {name}: p50 {:.2} µs, p99 {:.2} µs",
            l.p50, l.p99
        );
    }

    println!("\ncross-check (matched blocks per pod; mismatching pod checks / all):");
    let natural = &queries.sets[0];
    let held_contents = contents(&w, &w.held);
    for make in &peers {
        let mut peer = make();
        peer.apply(&stores_8, &w, false);
        let chain = |p: &[usize]| chain_truth(&w.held, p);
        let content = |p: &[usize]| content_truth(&w, &held_contents, p);
        let (n_wrong, n_all) = mismatches(peer.as_ref(), &w, natural, &chain);
        let (s_chain, s_all) = mismatches(peer.as_ref(), &w, &splices, &chain);
        let (s_content, _) = mismatches(peer.as_ref(), &w, &splices, &content);
        println!(
            "  {:<17} natural vs chain truth {n_wrong}/{n_all}; spliced vs chain truth {s_chain}/{s_all}, vs content truth {s_content}/{s_all}",
            peer.name()
        );
    }
}

fn print_table(c: &[Column], q: &QuerySets) {
    let [radix, crtc, kv, kv_std] = [&c[0], &c[1], &c[2], &c[3]];
    println!(
        "\n| figure | Dynamo RadixTree | Dynamo CRTC | kvindex prefix-only | ÷ RadixTree | kvindex + std layer | ÷ RadixTree |"
    );
    println!("|---|---|---|---|---|---|---|");
    // `crtc_has`: whether the CRTC column has the figure; `higher`: whether more is better (the
    // ratio is then kvindex ÷ RadixTree, else RadixTree ÷ kvindex: > 1 is kvindex ahead).
    let row = |name: &str, figure: &dyn Fn(&Column) -> f64, crtc_has: bool, higher: bool| {
        let r = figure(radix);
        let ratio = |k: f64| if higher { k / r } else { r / k };
        let t = if crtc_has {
            format!("{:.2}", figure(crtc))
        } else {
            "–".to_owned()
        };
        let (k, k_std) = (figure(kv), figure(kv_std));
        println!(
            "| {name} | {r:.2} | {t} | {k:.2} | {:.2}× | {k_std:.2} | {:.2}× |",
            ratio(k),
            ratio(k_std)
        );
    };
    row(
        "store, 1-block events, with hashing (M blocks/s)",
        &|c| c.store_1,
        false,
        true,
    );
    row(
        "store, 8-block events, with hashing",
        &|c| c.store_8,
        false,
        true,
    );
    row(
        "store, 8-block, no hashing",
        &|c| c.store_8_nohash,
        true,
        true,
    );
    row("remove", &|c| c.remove, true, true);
    row("clear", &|c| c.clear, true, true);
    row(
        "memory after store (B per resident entry; ratio: RadixTree ÷ kvindex)",
        &|c| c.bytes_per_entry,
        true,
        false,
    );
    for (i, name) in q.names.iter().enumerate() {
        row(
            &format!(
                "query 128 blocks × {} pods, {name}, p50 (µs; ratio: RadixTree ÷ kvindex)",
                pods()
            ),
            &|c| c.queries[i].steady.p50,
            true,
            false,
        );
        let views: [(&str, PassFigure); 3] = [
            ("p99", |p| p.steady.p99),
            ("first pass after the build, p50", |p| p.first.p50),
            ("first pass after the build, p99", |p| p.first.p99),
        ];
        for (view, value) in views {
            let label = format!("same, {name}, {view} (µs)");
            row(&label, &|c| value(&c.queries[i]), true, false);
        }
        row(
            &format!("same, {name}, each prompt's fastest of {WARM_REPEATS} in a row, p50 (µs)"),
            &|c| c.warm[i].p50,
            true,
            false,
        );
    }
    println!(
        "events refused: RadixTree {}, CRTC {}, kvindex prefix-only {}, kvindex {}",
        radix.refused, crtc.refused, kv.refused, kv_std.refused
    );
    println!(
        "no hashing: Dynamo's events carry content hashes computed before the clock (its \
         publisher hashes on the engine's side); kvindex's carry tokens, as vLLM and SGLang \
         send them, and it computes chain hashes in both store rows"
    );
}

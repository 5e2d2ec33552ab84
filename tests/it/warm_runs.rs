//! A warm start keeps the chain layer's runs: the checkpoint in Redis keeps each
//! chain block's parent and a restore places parents first, so the restarted index holds
//! its chains in as many runs as the index it replaces, with the same checkpoint entries,
//! and scores every prompt alike. Its own `redis-server` on a free port.

use crate::util;

use std::time::Duration;

use kvindex::index::{Checkpoint, Delta, Index, SourceId, SourceSpec};
use kvindex::medium::{Medium, TierWeights};
use kvindex::score::{score_candidates, Candidates, MatchMode};
use kvindex::store::redis::{MirrorHandle, RedisConfig, RedisTarget};
use kvindex::wire::{BlockHash, BlockStored, Engine, EngineBatch, Event};
use util::own_redis::OwnRedis;

/// Upper bound for anything that waits on Redis.
const WAIT: Duration = Duration::from_secs(30);
const MODEL: &str = "runs-model";
const PODS: [&str; 2] = ["runs-a.ns", "runs-b.ns"];
const BLOCK: usize = 4;
/// Blocks of a system prompt, and of each conversation after it.
const SYSTEM_BLOCKS: u64 = 8;
const CONVERSATION_BLOCKS: u64 = 16;
/// Blocks an event stores.
const PER_EVENT: u64 = 8;

/// The tokens of block `i` of `prompt` (a system prompt's own, or a conversation's).
fn tokens(prompt: u64, i: u64) -> Vec<u32> {
    (0..BLOCK as u64)
        .map(|t| (prompt * 1_000 + i * 10 + t) as u32)
        .collect()
}

/// Stores blocks `from..to` of `prompt` under engine hashes `base + i`, after `parent`.
fn store(prompt: u64, base: u64, (from, to): (u64, u64), parent: Option<u64>) -> Event {
    let mut event = BlockStored::new(
        (from..to).map(|i| BlockHash::Int(base + i)).collect(),
        (from..to).flat_map(|i| tokens(prompt, i)).collect(),
        BLOCK as u32,
        Medium::GPU,
    );
    event.parent_block_hash = parent.map(BlockHash::Int);
    Event::BlockStored(event)
}

/// What pod `pod` stores, as an engine does: `systems` system prompts, each followed by
/// conversations stored in events of [`PER_EVENT`] blocks after their parents (pods share
/// the system prompts and some conversations).
fn events(pod: u64, systems: u64, conversations: u64) -> Vec<Event> {
    let mut out = Vec::new();
    for s in 0..systems {
        // Engine hashes of their own per prompt (an engine does not reuse them).
        let system = (s + 1) << 40;
        out.push(store(s, system, (0, SYSTEM_BLOCKS), None));
        for c in 0..conversations {
            // Pod 1's later conversations are its own.
            let prompt = 100 + s * 100 + c + if c >= conversations / 2 { pod * 50 } else { 0 };
            let base = prompt << 20;
            let mut parent = system + SYSTEM_BLOCKS - 1;
            for from in (0..CONVERSATION_BLOCKS).step_by(PER_EVENT as usize) {
                out.push(store(prompt, base, (from, from + PER_EVENT), Some(parent)));
                parent = base + from + PER_EVENT - 1;
            }
        }
    }
    out
}

fn config(url: &str) -> RedisConfig {
    RedisConfig {
        target: RedisTarget::Single(url.to_owned()),
        flush_interval: Duration::from_millis(1),
        checkpoint: true,
        verify: false,
        anti_entropy_interval: Duration::from_secs(86_400),
        anti_entropy_max_commands_per_s: 1,
        ..RedisConfig::default()
    }
}

/// Every source's checkpoint entries, as the index would write them, in one order.
fn entries(index: &Index) -> Vec<(String, u8, String, kvindex::index::EngineState)> {
    let mut all = Vec::new();
    index.for_each_engine_state(|pod, rank, _, hash, state| {
        all.push((
            index.pod_name(pod).to_string(),
            rank,
            hash.to_string(),
            state,
        ));
    });
    all.sort_by(|x, y| (&x.0, x.1, &x.2).cmp(&(&y.0, y.1, &y.2)));
    all
}

/// The scores of the prompt of system prompt `s` and conversation `prompt`, whole.
fn scores(index: &Index, s: u64, prompt: u64) -> Vec<(usize, u32)> {
    let tokens: Vec<u32> = (0..SYSTEM_BLOCKS)
        .flat_map(|i| tokens(s, i))
        .chain((0..CONVERSATION_BLOCKS).flat_map(|i| tokens(prompt, i)))
        .collect();
    let hashes = kvindex::hash::prompt_chain_hashes(MODEL, &tokens, BLOCK, usize::MAX);
    let candidates = Candidates::new(index, &PODS);
    let weights = TierWeights::default();
    let found = score_candidates(
        index,
        MODEL,
        &hashes,
        &candidates,
        &weights,
        &[],
        MatchMode::Prefix,
    );
    found
        .into_iter()
        .map(|s| (s.candidate, s.matched_blocks))
        .collect()
}

#[tokio::test]
async fn a_warm_start_rebuilds_the_chains_in_as_many_runs_with_the_same_checkpoint() {
    let server = OwnRedis::start(None, &[]);
    let url = server.url();
    let live = Index::new();
    let sources: Vec<SourceId> = (PODS.iter())
        .map(|pod| {
            let spec = SourceSpec {
                pod: (*pod).to_owned(),
                model: MODEL.to_owned(),
                engine: Engine::Vllm,
                dp_rank: 0,
            };
            live.register_source(&spec).unwrap()
        })
        .collect();
    let mirror = MirrorHandle::start(config(&url), live.clone(), TierWeights::default())
        .await
        .unwrap();
    let sender = mirror.sender();
    for (pod, source) in sources.iter().enumerate() {
        for (seq, event) in events(pod as u64, 4, 6).into_iter().enumerate() {
            let mut deltas: Vec<Delta> = Vec::new();
            let batch = EngineBatch::of(vec![event]);
            live.apply(*source, &batch, 1_767_225_600, &mut deltas)
                .unwrap();
            let mark = Checkpoint {
                source: *source,
                seq: seq as u64 + 1,
            };
            sender.send(deltas, Some(mark)).await;
        }
    }
    tokio::time::timeout(WAIT, mirror.flush())
        .await
        .unwrap()
        .unwrap();
    mirror.shutdown(WAIT).await;
    let live_runs = live.stats().chain_runs;
    // A run per system prompt, which its first conversation extends, and one per other
    // conversation (3 both pods store, 3 of each pod's own).
    assert_eq!(live_runs, 4 * 9, "{:?}", live.stats());

    let restarted = Index::new();
    let mirror = MirrorHandle::start(config(&url), restarted.clone(), TierWeights::default())
        .await
        .unwrap();
    let summary = mirror.restored().cloned().unwrap();
    mirror.shutdown(WAIT).await;
    assert_eq!(summary.bad_entries, 0);
    assert_eq!(summary.engine_blocks as usize, entries(&live).len());
    let (now, then) = (entries(&restarted), entries(&live));
    assert_eq!(now.len(), then.len());
    for (now, then) in now.iter().zip(&then) {
        assert_eq!(now, then);
    }
    assert_eq!(restarted.stats().chain_runs, live_runs);
    for s in 0..4 {
        for prompt in [100 + s * 100, 100 + s * 100 + 5, 100 + s * 100 + 55] {
            assert_eq!(
                scores(&restarted, s, prompt),
                scores(&live, s, prompt),
                "system prompt {s}, conversation {prompt}"
            );
        }
    }
}

//! The mirror's writer with several flushes in flight over one to four connections: stores,
//! removes and clears of the same few blocks from two DP ranks of one pod, interleaved across
//! many tiny flushes and spread over the connections, must leave Redis exactly what the index
//! holds, and the checkpoint's watermark at the last seq. A real redis-server of the test's
//! own, on a free port, flushed between cases.

use crate::util;

use std::time::Duration;

use kvindex::index::{Checkpoint, Delta, DeltaChunk, EngineState, Index, SourceId, SourceSpec};
use kvindex::ingest::{unix_now, MirrorSink, CHUNK_DELTAS};
use kvindex::medium::{Medium, TierWeights};
use kvindex::store::redis::checkpoint;
use kvindex::store::redis::{block_key, field_value, mapping_key, ValueFormat};
use kvindex::store::redis::{dump, MappingEntry, MirrorHandle, RedisConfig, RedisDump};
use kvindex::wire::{BlockHash, BlockRemoved, BlockStored, Engine, EngineBatch, Event};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use util::own_redis::OwnRedis;
use util::redis_proxy::RedisProxy;

/// Upper bound for anything that waits on Redis.
const WAIT: Duration = Duration::from_secs(30);
const POD: &str = "order-pod.ns";
const MODEL: &str = "order-model";

/// One message of one DP rank.
#[derive(Debug, Clone)]
enum Op {
    /// Store engine block `hash` (one of a few, so keys repeat) on a medium.
    Store { rank: u8, hash: u64, cpu: bool },
    /// Remove it from a medium (`None` = every medium).
    Remove {
        rank: u8,
        hash: u64,
        cpu: Option<bool>,
    },
    /// `AllBlocksCleared`.
    Clear { rank: u8 },
}

fn op() -> impl Strategy<Value = Op> {
    let rank = 0u8..2;
    let hash = 0u64..6;
    prop_oneof![
        5 => (rank.clone(), hash.clone(), any::<bool>())
            .prop_map(|(rank, hash, cpu)| Op::Store { rank, hash, cpu }),
        4 => (rank.clone(), hash, proptest::option::of(any::<bool>()))
            .prop_map(|(rank, hash, cpu)| Op::Remove { rank, hash, cpu }),
        1 => rank.prop_map(|rank| Op::Clear { rank }),
    ]
}

fn medium(cpu: bool) -> Medium {
    if cpu {
        Medium::intern("CPU")
    } else {
        Medium::GPU
    }
}

fn event(op: &Op) -> (u8, Event) {
    match *op {
        Op::Store { rank, hash, cpu } => {
            // Tokens depend on the hash only, so both ranks store the same std hash.
            let tokens = vec![hash as u32 + 1; 4];
            let stored = BlockStored::new(vec![BlockHash::Int(hash)], tokens, 4, medium(cpu));
            (rank, Event::BlockStored(stored))
        }
        Op::Remove { rank, hash, cpu } => {
            let m = cpu.map_or(Medium::NONE, medium);
            let removed = BlockRemoved::new(vec![BlockHash::Int(hash)], m);
            (rank, Event::BlockRemoved(removed))
        }
        Op::Clear { rank } => (rank, Event::AllBlocksCleared),
    }
}

/// What Redis should hold for the pod given the index.
fn expected_of(index: &Index) -> RedisDump {
    let weights = TierWeights::default();
    let mut want = RedisDump::default();
    index.for_each_field(|model, std, p, value| {
        if &*index.pod_name(p) == POD {
            want.blocks
                .entry(block_key(&index.model_name(model), std))
                .or_default()
                .insert(
                    POD.to_owned(),
                    field_value(value, ValueFormat::Tiered, &weights),
                );
        }
    });
    index.for_each_mapping(|p, engine, hash, std| {
        if &*index.pod_name(p) == POD {
            let entry = MappingEntry {
                value: std.to_string(),
                ttl: 86_400,
            };
            want.mappings.insert(mapping_key(engine, POD, &hash), entry);
        }
    });
    want
}

async fn flushall(url: &str) {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
}

async fn watermark_seq(url: &str) -> Option<u64> {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let json: Option<String> = redis::cmd("HGET")
        .arg("kvindex:wm")
        .arg(format!("{POD}#0"))
        .query_async(&mut conn)
        .await
        .unwrap();
    let mark: serde_json::Value = serde_json::from_str(&json?).unwrap();
    mark["seq"].as_u64()
}

/// An index with the two DP ranks of `POD` registered.
fn two_rank_index() -> (Index, Vec<SourceId>) {
    let index = Index::new();
    let sources = (0..2u8)
        .map(|rank| {
            index
                .register_source(&SourceSpec {
                    pod: POD.to_owned(),
                    model: MODEL.to_owned(),
                    engine: Engine::Vllm,
                    dp_rank: rank,
                })
                .unwrap()
        })
        .collect();
    (index, sources)
}

/// A mirror of `url` flushing `flush` commands at most over `connections`, with no
/// background passes.
fn mirror_config(url: &str, flush: usize, checkpoint: bool, connections: usize) -> RedisConfig {
    RedisConfig {
        target: kvindex::store::redis::RedisTarget::Single(url.to_owned()),
        flush_max_commands: flush,
        connections,
        flush_interval: Duration::from_millis(1),
        checkpoint,
        verify: false,
        anti_entropy_interval: Duration::from_secs(86_400),
        anti_entropy_max_commands_per_s: 1,
        ..RedisConfig::default()
    }
}

/// A mirror of `index` past its start-up reconcile, so what follows goes through flushes,
/// not the rewrite.
async fn started_mirror(config: RedisConfig, index: &Index) -> MirrorHandle {
    let mirror = MirrorHandle::start(config, index.clone(), TierWeights::default())
        .await
        .unwrap();
    tokio::time::timeout(WAIT, mirror.flush())
        .await
        .unwrap()
        .unwrap();
    mirror
}

/// How one case's mirror writes.
#[derive(Debug, Clone, Copy)]
struct Writes {
    /// Commands per flush at most.
    flush: usize,
    /// With the checkpoint (its watermark is checked against the last seq).
    checkpoint: bool,
    /// Connections the flushes spread over.
    connections: usize,
}

/// Runs `ops` through a mirror writing as `how` and checks the watermark of rank 0 against
/// its last seq (checkpoint on); returns what Redis holds, what the index says it should,
/// and the most flushes that were in flight at once.
async fn run(url: &str, ops: &[Op], how: Writes) -> (RedisDump, RedisDump, u64) {
    let Writes {
        flush,
        checkpoint,
        connections,
    } = how;
    flushall(url).await;
    let (index, sources) = two_rank_index();
    let config = mirror_config(url, flush, checkpoint, connections);
    let mirror = started_mirror(config.clone(), &index).await;
    let sender = mirror.sender();
    let mut seqs = [0u64; 2];
    for op in ops {
        let (rank, event) = event(op);
        let source = sources[usize::from(rank)];
        let mut deltas: Vec<Delta> = Vec::new();
        index
            .apply(
                source,
                &EngineBatch::of(vec![event]),
                unix_now(),
                &mut deltas,
            )
            .unwrap();
        seqs[usize::from(rank)] += 1;
        let seq = seqs[usize::from(rank)];
        let mark = checkpoint.then_some(Checkpoint { source, seq });
        sender.send(deltas, mark).await;
    }
    tokio::time::timeout(WAIT, mirror.flush())
        .await
        .unwrap()
        .unwrap();
    let peak = mirror.stats().in_flight_peak;
    let mut got = dump(url, None, Some(POD)).await.unwrap();
    for m in got.mappings.values_mut() {
        assert!((86_000..=86_400).contains(&m.ttl), "TTL {}", m.ttl);
        m.ttl = 86_400;
    }
    if checkpoint && seqs[0] > 0 {
        assert_eq!(
            watermark_seq(url).await,
            Some(seqs[0]),
            "watermark of rank 0"
        );
    }
    mirror.shutdown(WAIT).await;
    if checkpoint {
        // The checkpoint's log, whatever order its segments landed in, rebuilds the index.
        assert_checkpoint_rebuilds(config, &index).await;
    }
    (got, expected_of(&index), peak)
}

#[test]
fn stores_and_removes_of_the_same_fields_across_flushes_and_connections_end_equal_to_the_index() {
    let server = OwnRedis::start(None, &[]);
    let url = server.url();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut runner = TestRunner::new(Config {
        cases: 64,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (
        proptest::collection::vec(op(), 1..120),
        1usize..6,
        any::<bool>(),
        1usize..5,
    );
    runner
        .run(&strategy, |(ops, flush, checkpoint, connections)| {
            let how = Writes {
                flush,
                checkpoint,
                connections,
            };
            let (got, want, _) = rt.block_on(run(&url, &ops, how));
            prop_assert_eq!(got, want);
            Ok(())
        })
        .unwrap();
}

#[test]
fn a_long_churn_of_few_keys_with_every_pipeline_slot_busy_ends_equal_to_the_index() {
    let server = OwnRedis::start(None, &[]);
    let url = server.url();
    let rt = tokio::runtime::Runtime::new().unwrap();
    // Deterministic: 20,000 messages over 6 hashes, flushes of 2 commands.
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let ops: Vec<Op> = (0..20_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let rank = (x & 1) as u8;
            let hash = (x >> 8) % 6;
            match (x >> 16) % 10 {
                0 => Op::Clear { rank },
                1..=4 => Op::Remove {
                    rank,
                    hash,
                    cpu: None,
                },
                _ => Op::Store {
                    rank,
                    hash,
                    cpu: x >> 20 & 1 == 1,
                },
            }
        })
        .collect();
    for connections in [1, 4] {
        let how = Writes {
            flush: 2,
            checkpoint: true,
            connections,
        };
        let (got, want, peak) = rt.block_on(run(&url, &ops, how));
        assert_eq!(got, want, "{connections} connections");
        assert!(peak >= 2, "flushes in flight at once: {peak}");
    }
}

/// The checkpoint's log is compacted as it goes: ten thousand stores and removes of a few
/// blocks, each in a flush of its own, leave rank 0's state key a snapshot and a short log
/// (not a segment per flush), which still rebuilds the index; once the rank holds nothing,
/// its state key is gone.
#[test]
fn a_churned_checkpoint_log_is_compacted_and_still_rebuilds_the_index() {
    let server = OwnRedis::start(None, &[]);
    let url = server.url();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        flushall(&url).await;
        let (index, sources) = two_rank_index();
        let config = mirror_config(&url, 2, true, 1);
        let mirror = started_mirror(config, &index).await;
        let ops = (0..10_000u64).map(|i| match i % 3 {
            2 => Op::Remove {
                rank: 0,
                hash: i % 5,
                cpu: None,
            },
            _ => Op::Store {
                rank: 0,
                hash: i % 5,
                cpu: false,
            },
        });
        for (seq, op) in (1..).zip(ops) {
            let (_, event) = event(&op);
            let mut deltas = Vec::new();
            let batch = EngineBatch::of(vec![event]);
            index
                .apply(sources[0], &batch, unix_now(), &mut deltas)
                .unwrap();
            let mark = Checkpoint {
                source: sources[0],
                seq,
            };
            mirror.sender().send(deltas, Some(mark)).await;
        }
        tokio::time::timeout(WAIT, mirror.flush())
            .await
            .unwrap()
            .unwrap();
        let key = checkpoint::state_key(POD, 0, MODEL);
        // Compaction keeps the log under the blocks held plus its slack, plus the snapshot.
        let bound = MIN_LOG_BOUND;
        let fields = wait_for_fields(&url, &key, |n| n <= bound).await;
        assert!(fields <= bound, "{fields} fields after the churn");
        // What a restore reads is what the index holds (a second mirror would be a second
        // writer: this one goes on below).
        let blocks = util::checkpoint_blocks(&url, &key).await;
        assert_eq!(sorted_entries(blocks), engine_states_of_rank0(&index));

        let clear = EngineBatch::of(vec![Event::AllBlocksCleared]);
        let mut deltas = Vec::new();
        index
            .apply(sources[0], &clear, unix_now(), &mut deltas)
            .unwrap();
        mirror.sender().send(deltas, None).await;
        tokio::time::timeout(WAIT, mirror.flush())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(wait_for_fields(&url, &key, |n| n == 0).await, 0);
        mirror.shutdown(WAIT).await;
    });
}

/// Checkpoint entries as their field and value texts, sorted.
fn sorted_entries(blocks: Vec<(BlockHash, EngineState)>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = (blocks.iter())
        .map(|(hash, state)| {
            (
                checkpoint::engine_field(hash),
                checkpoint::engine_value(state),
            )
        })
        .collect();
    out.sort();
    out
}

/// The checkpoint entries the index holds for rank 0 of `POD`.
fn engine_states_of_rank0(index: &Index) -> Vec<(String, String)> {
    let mut blocks = Vec::new();
    index.for_each_engine_state(|pod, rank, _, hash, state| {
        if &*index.pod_name(pod) == POD && rank == 0 {
            blocks.push((hash, state));
        }
    });
    assert!(!blocks.is_empty(), "the churn leaves blocks held");
    sorted_entries(blocks)
}

/// At most this many fields in a compacted state key of a few blocks: the log's slack of
/// entries (`MIN_LOG` in `src/store/redis/log.rs`), one per segment at worst, the blocks
/// held, and the snapshot.
const MIN_LOG_BOUND: usize = 1024 + 5 + 1;

/// Fields of hash `key` once `done` says so, or when the wait runs out.
async fn wait_for_fields(url: &str, key: &str, done: impl Fn(usize) -> bool) -> usize {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let n: usize = redis::cmd("HLEN")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        if done(n) || tokio::time::Instant::now() >= deadline {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One `BlockStored` of engine block `hash` (tokens from the hash alone, so every rank maps
/// it to the same std block).
fn store(hash: u64) -> Event {
    let tokens = vec![hash as u32 + 1; 4];
    Event::BlockStored(BlockStored::new(
        vec![BlockHash::Int(hash)],
        tokens,
        4,
        Medium::GPU,
    ))
}

/// Applies `events` to `source` through a [`MirrorSink`] and hands it over with the
/// source's checkpoint at `seq`.
async fn apply_and_hand_over(
    index: &Index,
    sender: &kvindex::store::redis::MirrorSender,
    source: kvindex::index::SourceId,
    events: Vec<Event>,
    seq: u64,
) {
    let mut sink = MirrorSink::new();
    index
        .apply(source, &EngineBatch::of(events), unix_now(), &mut sink)
        .unwrap();
    sink.hand_over(sender, Some(Checkpoint { source, seq }))
        .await;
}

/// A clear of more engine blocks than a chunk holds, in the middle of a message, reaches
/// Redis through ingest's [`MirrorSink`]: the cleared blocks go to the writer whole and are
/// expanded over many small pipelines. Redis ends equal to the index (the fields another DP
/// rank still holds are kept), a warm start from the checkpoint rebuilds the same index, and
/// the watermark of the clear's message, written after all of its data, is never seen
/// while Redis still lacks any of it.
#[test]
fn a_clear_larger_than_a_chunk_reaches_redis_in_slices_before_its_watermark() {
    let server = OwnRedis::start(None, &[]);
    let url = server.url();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(clear_in_slices(&url));
}

async fn clear_in_slices(url: &str) {
    flushall(url).await;
    let (index, sources) = two_rank_index();
    let config = mirror_config(url, 256, true, 4);
    let mirror = started_mirror(config.clone(), &index).await;
    let sender = mirror.sender();
    // Rank 0 holds 2 chunks' worth of engine blocks (three deltas each when cleared one by
    // one), rank 1 every seventh of them.
    let blocks = 2 * CHUNK_DELTAS as u64;
    let mut seqs = [0u64; 2];
    for (rank, step) in [(0usize, 1u64), (1, 7)] {
        let hashes: Vec<u64> = (0..blocks).step_by(step as usize).collect();
        for part in hashes.chunks(500) {
            seqs[rank] += 1;
            let events = part.iter().map(|h| store(*h)).collect();
            apply_and_hand_over(&index, &sender, sources[rank], events, seqs[rank]).await;
        }
    }
    tokio::time::timeout(WAIT, mirror.flush())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        redis_now(url).await,
        expected_of(&index),
        "before the clear"
    );

    seqs[0] += 1;
    let clear_seq = seqs[0];
    // Watches the watermark while the clear is written: the first time it shows the clear's
    // seq, Redis must already hold everything the clear did.
    let watcher = {
        let url = url.to_owned();
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + WAIT;
            while tokio::time::Instant::now() < deadline {
                if watermark_seq(&url).await == Some(clear_seq) {
                    return Some(redis_now(&url).await);
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            None
        })
    };
    let events = vec![
        store(blocks + 1),
        Event::AllBlocksCleared,
        store(blocks + 2),
    ];
    let mut sink = MirrorSink::new();
    index
        .apply(sources[0], &EngineBatch::of(events), unix_now(), &mut sink)
        .unwrap();
    let cleared: Vec<usize> = sink
        .chunks()
        .iter()
        .filter_map(|c| match c {
            DeltaChunk::Cleared(cleared) => Some(cleared.len()),
            DeltaChunk::Deltas(_) => None,
        })
        .collect();
    assert_eq!(
        cleared,
        vec![blocks as usize + 1],
        "the clear's blocks go whole"
    );
    assert_eq!(sink.chunks().len(), 3, "stores, the clear, stores");
    let checkpoint = Checkpoint {
        source: sources[0],
        seq: clear_seq,
    };
    sink.hand_over(&sender, Some(checkpoint)).await;
    tokio::time::timeout(WAIT, mirror.flush())
        .await
        .unwrap()
        .unwrap();
    let want = expected_of(&index);
    assert_eq!(
        want.blocks.len() as u64,
        blocks / 7 + 2,
        "rank 1's and the new"
    );
    assert_eq!(redis_now(url).await, want, "after the clear");
    assert_eq!(watermark_seq(url).await, Some(clear_seq));
    let at_watermark = watcher.await.unwrap().expect("the watermark was written");
    assert_eq!(at_watermark, want, "Redis when the watermark first showed");
    mirror.shutdown(WAIT).await;

    // The checkpoint written with the clear rebuilds the same index.
    assert_checkpoint_rebuilds(config, &index).await;
}

/// A warm start from the checkpoint in Redis rebuilds `index`.
async fn assert_checkpoint_rebuilds(config: RedisConfig, index: &Index) {
    let restored = Index::new();
    let again = MirrorHandle::start(config, restored.clone(), TierWeights::default())
        .await
        .unwrap();
    again.shutdown(WAIT).await;
    assert_eq!(restored.dump(), index.dump());
}

/// Kthena's keys of the pod in Redis now, TTLs checked and normalised.
async fn redis_now(url: &str) -> RedisDump {
    let mut got = dump(url, None, Some(POD)).await.unwrap();
    for m in got.mappings.values_mut() {
        assert!((86_000..=86_400).contains(&m.ttl), "TTL {}", m.ttl);
        m.ttl = 86_400;
    }
    got
}

/// One of four writer connections is cut in the middle of a flush, while the others go on:
/// the reconcile repairs every key the cut connection carried (Redis ends equal to the index,
/// the watermark at the last seq, and a warm start from the checkpoint rebuilds the same
/// index), and it writes back only the outage record, not the index: Redis kept everything
/// else, as the watchdog vouches.
#[test]
fn a_connection_cut_mid_flush_is_repaired_without_rewriting_the_rest() {
    let server = OwnRedis::start(None, &[]);
    let url = server.url();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(connection_cut(&url, server.port));
}

async fn connection_cut(url: &str, port: u16) {
    const BEFORE: u64 = 20_000;
    const AFTER: u64 = 2_000;
    flushall(url).await;
    let proxy = RedisProxy::start(port).await;
    let (index, sources) = two_rank_index();
    let config = mirror_config(&proxy.url(), 64, true, 4);
    let mirror = started_mirror(config.clone(), &index).await;
    // Stores of engine hashes `hashes` from rank 0 (seq = hash + 1), until Redis has them.
    let store_all = async |hashes: std::ops::Range<u64>| {
        let sender = mirror.sender();
        for hash in hashes {
            apply_and_hand_over(&index, &sender, sources[0], vec![store(hash)], hash + 1).await;
        }
        tokio::time::timeout(WAIT, mirror.flush())
            .await
            .unwrap()
            .unwrap();
    };
    store_all(0..BEFORE).await;
    let before = mirror.stats();
    // Lanes open in order: lane 0 first, then lanes 1, 2 and 3.
    proxy.cut_after(2, 1000);
    store_all(BEFORE..BEFORE + AFTER).await;
    let after = mirror.stats();
    assert!(
        after.reconciles > before.reconciles,
        "the cut was noticed and reconciled: {after:?}"
    );
    let background = after.background_commands - before.background_commands;
    assert!(
        background < BEFORE,
        "{background} background commands: the reconcile wrote back the outage record, not the index"
    );
    assert_eq!(redis_now(url).await, expected_of(&index));
    assert_eq!(watermark_seq(url).await, Some(BEFORE + AFTER));
    mirror.shutdown(WAIT).await;

    // The repaired checkpoint rebuilds the same index.
    assert_checkpoint_rebuilds(config, &index).await;
}

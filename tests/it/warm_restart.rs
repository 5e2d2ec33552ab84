//! Warm restart: the built `kvindex` binary, killed mid-stream and started again on
//! the same Redis, goes on from its checkpoint. Each test runs its own `redis-server`, a
//! fake engine (PUB, and a replay ROUTER where the case needs one) publishing a churning
//! vLLM stream byte for byte, and compares Redis with an offline replay of what the engine
//! really holds, timestamps aside.

use crate::util;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use kvindex::index::{EngineState, Index};
use kvindex::ingest::fixture::RecordedMessage;
use kvindex::medium::TierWeights;
use kvindex::store::redis::{block_key, field_value, mapping_key, ValueFormat};
use kvindex::store::redis::{checkpoint, dump, RedisDump};
use kvindex::wire::Engine;
use redis::AsyncCommands;
use rmpv::Value as V;
use util::own_redis::OwnRedis;
use util::{http_get, spawn_router, write_fixture, FakePub, RouterMode};

const POD: &str = "engine-0.test";
const MODEL: &str = "churn-model";
/// Upper bound for anything these tests wait on.
const WAIT: Duration = Duration::from_secs(30);

/// One message of a churning vLLM stream (array era, int hashes, GPU and CPU tiers): message
/// `i` stores four new GPU blocks, copies an older block to CPU (a tokenless store), takes an
/// older block off GPU only, and removes two older blocks from every tier. Removes reach
/// back six messages, so after a restart they hit blocks stored by the previous process.
fn churn_message(i: u64, salt: u64) -> Vec<Vec<u8>> {
    let hash = |msg: u64, k: u64| V::from(salt * 1_000_000 + msg * 4 + k);
    let mut events = Vec::new();
    let hashes: Vec<V> = (0..4).map(|k| hash(i, k)).collect();
    let tokens: Vec<V> = (0..64)
        .map(|t| V::from((salt * 7_919 + i * 64 + t) % 150_000))
        .collect();
    let parent = if i == 0 { V::Nil } else { hash(i - 1, 3) };
    events.push(V::Array(vec![
        V::from("BlockStored"),
        V::Array(hashes),
        parent,
        V::Array(tokens),
        V::from(16),
        V::Nil,
        V::from("GPU"),
    ]));
    let removed = |hashes: Vec<V>, medium: V| {
        V::Array(vec![V::from("BlockRemoved"), V::Array(hashes), medium])
    };
    if i >= 3 {
        events.push(V::Array(vec![
            V::from("BlockStored"),
            V::Array(vec![hash(i - 3, 0)]),
            V::Nil,
            V::Array(Vec::new()),
            V::from(16),
            V::Nil,
            V::from("CPU"),
        ]));
    }
    if i >= 5 {
        events.push(removed(vec![hash(i - 5, 1)], V::from("GPU")));
    }
    if i >= 6 {
        events.push(removed(vec![hash(i - 6, 0), hash(i - 6, 2)], V::Nil));
    }
    let batch = V::Array(vec![V::F64(1_767_225_600.0 + i as f64), V::Array(events)]);
    let mut payload = Vec::new();
    rmpv::encode::write_value(&mut payload, &batch).unwrap();
    vec![Vec::new(), i.to_be_bytes().to_vec(), payload]
}

/// Messages `seqs` of the stream of `salt`, with their seq as sent.
fn stream(seqs: std::ops::Range<u64>, salt: u64) -> Vec<RecordedMessage> {
    seqs.map(|i| RecordedMessage {
        line: i as usize + 1,
        endpoint_index: 0,
        frames: churn_message(i, salt),
    })
    .collect()
}

/// What Redis must hold for `POD` after the engine sent `messages` (one engine run): the
/// offline replay's index in kthena's layout, timestamps aside.
fn expected(dir: &Path, messages: &[RecordedMessage]) -> RedisDump {
    let file = write_fixture(dir, "expected.jsonl", messages);
    let index = Index::new();
    let replay = kvindex::ingest::replay_files(index, POD, MODEL, Engine::Vllm, &[file]).unwrap();
    let index = replay.index();
    let weights = TierWeights::default();
    let mut want = RedisDump::default();
    index.for_each_field(|model, std, _, value| {
        want.blocks
            .entry(block_key(&index.model_name(model), std))
            .or_default()
            .insert(
                POD.to_owned(),
                field_value(value, ValueFormat::Tiered, &weights),
            );
    });
    index.for_each_mapping(|_, engine, hash, std| {
        let entry = kvindex::store::redis::MappingEntry {
            value: std.to_string(),
            ttl: 86_400,
        };
        want.mappings.insert(mapping_key(engine, POD, &hash), entry);
    });
    without_times(want)
}

/// Field values without their timestamp, TTLs checked and normalised.
fn without_times(mut d: RedisDump) -> RedisDump {
    for fields in d.blocks.values_mut() {
        for value in fields.values_mut() {
            *value = value
                .split_once('|')
                .map_or(String::new(), |(_, m)| m.to_owned());
        }
    }
    for (key, m) in d.mappings.iter_mut() {
        assert!((86_000..=86_400).contains(&m.ttl), "{key}: TTL {}", m.ttl);
        m.ttl = 86_400;
    }
    d
}

async fn redis_now(url: &str) -> RedisDump {
    without_times(dump(url, None, Some(POD)).await.unwrap())
}

/// The built binary running `serve`, its metrics address read from its JSON log.
struct Kvindex {
    child: Child,
    metrics: SocketAddr,
}

impl Kvindex {
    fn start(config: &Path) -> Kvindex {
        let (mut child, rx) = util::spawn_serve(config, &[]);
        match started_at(&rx) {
            Some(metrics) => Kvindex { child, metrics },
            None => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("kvindex serve never logged its start");
            }
        }
    }

    /// Sends `signal` and waits for the process to exit.
    fn stop(mut self, signal: i32) {
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as i32, signal);
        }
        let _ = self.child.wait();
    }

    async fn metric(&self, name: &str, label: &str) -> f64 {
        let (_, text) = http_get(self.metrics, "/metrics").await;
        text.lines()
            .filter(|l| l.starts_with(name) && l.contains(label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    async fn probes(&self) -> f64 {
        self.metric("kvindex_decode_errors_total", "not_a_batch")
            .await
    }

    /// Sends probes (seq `u64::MAX`, `nil` payload: a counted decode error that leaves seq
    /// tracking alone) until the subscriber has seen one: its subscription has arrived.
    async fn wait_subscribed(&self, publisher: &mut FakePub) {
        let before = self.probes().await;
        let end = Instant::now() + WAIT;
        while Instant::now() < end {
            publisher.send_probe().await;
            tokio::time::sleep(Duration::from_millis(40)).await;
            if self.probes().await > before {
                return;
            }
        }
        panic!("the subscriber never saw a probe");
    }
}

impl Drop for Kvindex {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The metrics address from the daemon's "Listening." log line of its metrics listener.
fn started_at(lines: &mpsc::Receiver<String>) -> Option<SocketAddr> {
    let end = Instant::now() + WAIT;
    loop {
        let line = lines
            .recv_timeout(end.saturating_duration_since(Instant::now()))
            .ok()?;
        let Ok(json) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        // The JSON log flattens an event's fields into the line.
        if json["message"] == "Listening." && json["listener"] == "metrics" {
            return json["addr"].as_str()?.parse().ok();
        }
    }
}

/// The seq of `POD` rank 0's watermark in Redis.
async fn watermark(url: &str) -> Option<u64> {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.ok()?;
    let value: Option<String> = redis::cmd("HGET")
        .arg("kvindex:wm")
        .arg(format!("{POD}#0"))
        .query_async(&mut conn)
        .await
        .ok()?;
    let json: serde_json::Value = serde_json::from_str(&value?).ok()?;
    json["seq"].as_u64()
}

async fn wait_watermark(url: &str, seq: u64) {
    let end = Instant::now() + WAIT;
    while Instant::now() < end {
        if watermark(url).await == Some(seq) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("watermark never reached {seq}: {:?}", watermark(url).await);
}

fn write_config(dir: &Path, redis: &str, port: u16, replay: Option<u16>) -> PathBuf {
    let mut text = format!(
        "redis:\n  url: {redis}\nmetrics:\n  listen: 127.0.0.1:0\ntargets:\n  - pod: engine-0\n    namespace: test\n    model: {MODEL}\n    engine: vllm\n    endpoint: tcp://127.0.0.1:{port}\n"
    );
    if let Some(r) = replay {
        text.push_str(&format!("    replay_endpoint: tcp://127.0.0.1:{r}\n"));
    }
    let path = dir.join("kvindex.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

async fn publish(publisher: &mut FakePub, messages: &[RecordedMessage]) {
    for m in messages {
        publisher.send(&m.frames).await;
    }
}

/// One kvindex process: starts, waits for its subscription, publishes `messages` and waits
/// until Redis holds their watermark (`last`); returns it still running.
async fn run_through(
    config: &Path,
    publisher: &mut FakePub,
    url: &str,
    messages: &[RecordedMessage],
    last: u64,
) -> Kvindex {
    let kvindex = Kvindex::start(config);
    kvindex.wait_subscribed(publisher).await;
    publish(publisher, messages).await;
    wait_watermark(url, last).await;
    kvindex
}

/// What happens to Redis while no kvindex runs.
enum Meanwhile {
    /// Nothing.
    Nothing,
    /// The checkpoint is rewritten in the decimal form an older kvindex wrote (an upgrade):
    /// the new process must restore every entry.
    CheckpointInDecimal,
}

/// The stream a restart test runs.
struct Stream {
    /// Messages in all.
    messages: u64,
    /// The first process stops only once its checkpoint's log was compacted.
    compacted: bool,
}

/// [`restart_mid`] of a short stream.
async fn restart_mid_stream(signal: i32, meanwhile: Meanwhile) {
    let short = Stream {
        messages: 60,
        compacted: false,
    };
    restart_mid(short, signal, meanwhile).await;
}

/// Runs the first half of `stream` through one kvindex process, stops it with `signal`,
/// starts a new one and publishes the rest; Redis must equal the whole stream.
async fn restart_mid(stream_of: Stream, signal: i32, meanwhile: Meanwhile) {
    let dir = tempfile::tempdir().unwrap();
    let redis = OwnRedis::start(None, &[]);
    let url = redis.url();
    let all = stream(0..stream_of.messages, 1);
    let half = all.len() / 2;
    let (mut publisher, port) = FakePub::bind_any().await;
    let config = write_config(dir.path(), &url, port, None);

    let first = run_through(&config, &mut publisher, &url, &all[..half], half as u64 - 1).await;
    if stream_of.compacted {
        wait_for_snapshot(&url, &checkpoint::state_key(POD, 0, MODEL)).await;
    }
    first.stop(signal);
    let rewritten = match meanwhile {
        Meanwhile::Nothing => None,
        Meanwhile::CheckpointInDecimal => Some(rewrite_checkpoint_as_decimal(&url).await),
    };

    let last = stream_of.messages - 1;
    let second = run_through(&config, &mut publisher, &url, &all[half..], last).await;
    if let Some(entries) = rewritten {
        // Set once at start-up, before the stream went on.
        let restored = second.metric("kvindex_warm_start_engine_blocks", "").await;
        assert!(entries >= 30, "only {entries} checkpoint entries rewritten");
        assert_eq!(restored, entries as f64, "every decimal entry restored");
    }
    let resumed = second
        .metric("kvindex_warm_starts_total", "outcome=\"resumed\"")
        .await;
    assert_eq!(resumed, 1.0, "the source went on from its watermark");
    assert_eq!(redis_now(&url).await, expected(dir.path(), &all));
    second.stop(libc::SIGTERM);
}

/// The checkpoint value as kvindex wrote it before the compact form: decimal numbers,
/// `{std}|{stored_at}|{media}`, then `|{chain}` and `|{parent}` when known.
fn decimal_value(state: &EngineState) -> String {
    let media = state.media.iter().map(|m| m.spelling()).collect::<Vec<_>>();
    let mut value = format!("{}|{}|{}", state.std_hash, state.stored_at, media.join(","));
    if state.chain != 0 {
        value.push_str(&format!("|{}", state.chain));
        if state.parent != 0 {
            value.push_str(&format!("|{}", state.parent));
        }
    }
    value
}

/// Rewrites every checkpoint state key as one field per engine block in the decimal form
/// (what a kvindex from before the log and the compact form leaves behind); returns how many
/// entries there were.
async fn rewrite_checkpoint_as_decimal(url: &str) -> usize {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = conn.keys("kvindex:src:*").await.unwrap();
    let mut entries = 0;
    for key in keys {
        let blocks = util::checkpoint_blocks(url, &key).await;
        let _: () = conn.del(&key).await.unwrap();
        for (hash, state) in blocks {
            let field = checkpoint::engine_field(&hash);
            let _: () = conn.hset(&key, field, decimal_value(&state)).await.unwrap();
            entries += 1;
        }
    }
    entries
}

#[tokio::test]
async fn an_upgraded_kvindex_restores_a_checkpoint_written_in_the_decimal_form() {
    restart_mid_stream(libc::SIGTERM, Meanwhile::CheckpointInDecimal).await;
}

/// A process that ran long enough to compact its checkpoint's log, SIGKILLed: the next one
/// restores from the snapshot and the segments after it, and Redis ends equal to the stream.
#[tokio::test]
async fn a_sigkilled_kvindex_goes_on_from_a_compacted_checkpoint_log() {
    let long = Stream {
        messages: 500,
        compacted: true,
    };
    restart_mid(long, libc::SIGKILL, Meanwhile::Nothing).await;
}

/// Waits until state key `key` holds a snapshot segment (its log was compacted).
async fn wait_for_snapshot(url: &str, key: &str) {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let end = Instant::now() + WAIT;
    loop {
        let fields: Vec<(Vec<u8>, Vec<u8>)> = conn.hgetall(key).await.unwrap();
        let snapshot = |(field, body): &(Vec<u8>, Vec<u8>)| {
            checkpoint::segment::Stamp::of_field(field).is_some()
                && body.first() == Some(&checkpoint::segment::SNAPSHOT)
        };
        if fields.iter().any(snapshot) {
            return;
        }
        assert!(Instant::now() < end, "{key} was never compacted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_sigkilled_kvindex_goes_on_from_its_checkpoint_with_nothing_stale_or_missing() {
    restart_mid_stream(libc::SIGKILL, Meanwhile::Nothing).await;
}

#[tokio::test]
async fn a_sigterm_restart_goes_on_from_its_checkpoint_with_nothing_stale_or_missing() {
    restart_mid_stream(libc::SIGTERM, Meanwhile::Nothing).await;
}

#[tokio::test]
async fn messages_published_while_kvindex_was_down_are_replayed_by_the_engine() {
    let dir = tempfile::tempdir().unwrap();
    let redis = OwnRedis::start(None, &[]);
    let url = redis.url();
    let all = stream(0..60, 2);
    let (mut publisher, port) = FakePub::bind_any().await;
    let (_router, replay_port) = spawn_router(all.clone(), RouterMode::New).await;
    let config = write_config(dir.path(), &url, port, Some(replay_port));

    let first = run_through(&config, &mut publisher, &url, &all[..25], 24).await;
    first.stop(libc::SIGKILL);
    // Nobody subscribes: the PUB drops these, only the engine's replay buffer keeps them.
    publish(&mut publisher, &all[25..40]).await;

    let second = run_through(&config, &mut publisher, &url, &all[40..], 59).await;
    let replayed = second
        .metric("kvindex_warm_starts_total", "outcome=\"replayed\"")
        .await;
    assert_eq!(replayed, 1.0);
    assert_eq!(redis_now(&url).await, expected(dir.path(), &all));
}

#[tokio::test]
async fn a_gap_replay_cannot_fill_drops_the_inherited_blocks_and_leaves_nothing_stale() {
    let dir = tempfile::tempdir().unwrap();
    let redis = OwnRedis::start(None, &[]);
    let url = redis.url();
    let all = stream(0..60, 3);
    let (mut publisher, port) = FakePub::bind_any().await;
    // The engine's buffer no longer reaches back to what was missed.
    let (_router, replay_port) = spawn_router(all[38..].to_vec(), RouterMode::New).await;
    let config = write_config(dir.path(), &url, port, Some(replay_port));

    let first = run_through(&config, &mut publisher, &url, &all[..25], 24).await;
    first.stop(libc::SIGKILL);
    publish(&mut publisher, &all[25..40]).await;

    let second = run_through(&config, &mut publisher, &url, &all[40..], 59).await;
    let reset = second
        .metric("kvindex_warm_starts_total", "outcome=\"reset\"")
        .await;
    assert_eq!(reset, 1.0);
    let got = redis_now(&url).await;
    // What was applied after the reset alone: every inherited block was dropped first.
    assert_eq!(got, expected(dir.path(), &all[40..]));
    // So nothing is stale: every field is one the engine really holds.
    let truth = expected(dir.path(), &all);
    for (key, fields) in &got.blocks {
        assert_eq!(truth.blocks.get(key), Some(fields), "{key} is stale");
    }
}

#[tokio::test]
async fn an_engine_restarted_while_kvindex_was_down_leaves_none_of_its_old_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let redis = OwnRedis::start(None, &[]);
    let url = redis.url();
    let old_run = stream(0..30, 4);
    let new_run = stream(0..20, 5);
    let (mut publisher, port) = FakePub::bind_any().await;
    let config = write_config(dir.path(), &url, port, None);

    let first = run_through(&config, &mut publisher, &url, &old_run, 29).await;
    first.stop(libc::SIGKILL);

    let second = run_through(&config, &mut publisher, &url, &new_run, 19).await;
    let restarted = second
        .metric("kvindex_warm_starts_total", "outcome=\"restarted\"")
        .await;
    assert_eq!(restarted, 1.0);
    assert_eq!(redis_now(&url).await, expected(dir.path(), &new_run));
}

#[tokio::test]
async fn a_pod_dropped_from_the_config_while_kvindex_was_down_is_forgotten_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let redis = OwnRedis::start(None, &[]);
    let url = redis.url();
    let (mut publisher, port) = FakePub::bind_any().await;
    let config = write_config(dir.path(), &url, port, None);
    let first = Kvindex::start(&config);
    first.wait_subscribed(&mut publisher).await;
    publish(&mut publisher, &stream(0..10, 6)).await;
    wait_watermark(&url, 9).await;
    first.stop(libc::SIGKILL);
    assert!(!redis_now(&url).await.blocks.is_empty());

    let empty = dir.path().join("empty.yaml");
    std::fs::write(
        &empty,
        format!("redis:\n  url: {url}\nmetrics:\n  listen: 127.0.0.1:0\ntargets: []\n"),
    )
    .unwrap();
    let second = Kvindex::start(&empty);
    let end = Instant::now() + WAIT;
    while watermark(&url).await.is_some() || !redis_now(&url).await.blocks.is_empty() {
        assert!(Instant::now() < end, "the unclaimed pod's keys stayed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let got = redis_now(&url).await;
    assert!(got.mappings.is_empty(), "{:?}", got.mappings);
    second.stop(libc::SIGTERM);
}

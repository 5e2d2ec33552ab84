//! High availability: built `kvindex` binaries with `ha:` share one
//! `redis-server` of the test and a lease in it; fake engines (PUB sockets, a replay ROUTER
//! where a restart needs one) publish a churning vLLM stream to every replica. Whoever
//! leads, Redis must end equal to an offline replay of the whole stream (timestamps aside),
//! a standby must keep answering queries, and a replica that lost the lease must write
//! nothing until it holds it again. Takeover times are printed, not asserted (they are
//! measured as figures by `examples/ha_takeover.rs`); the waits only bound them.

use crate::util;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvindex::config::Shard;
use kvindex::index::Index;
use kvindex::ingest::fixture::RecordedMessage;
use kvindex::medium::TierWeights;
use kvindex::store::redis::{block_key, field_value, mapping_key, ValueFormat};

fn owner(pod_id: &str, count: u32) -> u32 {
    Shard { index: 0, count }.owner_of(pod_id)
}
use kvindex::store::redis::lease::lease_key;
use kvindex::store::redis::{checkpoint, dump, MappingEntry, RedisDump};
use kvindex::wire::Engine;
use rmpv::Value as V;
use util::own_redis::OwnRedis;
use util::redis_proxy::RedisProxy;
use util::{
    body_of, http_get, http_request, listeners, spawn_router, vllm_frames, write_fixture, FakePub,
};

const MODEL: &str = "ha-model";
/// The lease of these tests: short, so takeovers are quick.
const TTL_MS: u64 = 800;
/// Upper bound for anything these tests wait on (several debug binaries on a shared box).
const WAIT: Duration = Duration::from_secs(60);
/// Message of rank 0 that clears every block (an engine's cache reset).
const CLEAR_AT: u64 = 20;

fn pod_id(pod: &str) -> String {
    format!("{pod}.test")
}

/// Message `i` of DP rank `rank` of a churning stream: four new GPU blocks in a chain, a
/// CPU copy of an older block (a tokenless store), an older block taken off GPU only, two
/// older blocks removed from every tier; rank 0 clears everything at [`CLEAR_AT`] (removes
/// never reach back past the clear). `salt` keeps pods apart.
fn churn(salt: u64, rank: u64, i: u64) -> Vec<Vec<u8>> {
    let hash = |msg: u64, k: u64| V::from((salt * 10 + rank + 1) * 1_000_000 + msg * 4 + k);
    if rank == 0 && i == CLEAR_AT {
        return vllm_frames::message(i, vec![V::Array(vec![V::from("AllBlocksCleared")])]);
    }
    let since = if rank == 0 && i > CLEAR_AT {
        CLEAR_AT + 1
    } else {
        0
    };
    let back = |n: u64| i.checked_sub(n).filter(|j| *j >= since);
    let tokens: Vec<V> = (0..64)
        .map(|t| V::from((salt * 7_919 + rank * 131 + i * 64 + t) % 150_000))
        .collect();
    let parent = back(1).map_or(V::Nil, |j| hash(j, 3));
    let mut events = vec![V::Array(vec![
        V::from("BlockStored"),
        V::Array((0..4).map(|k| hash(i, k)).collect()),
        parent,
        V::Array(tokens),
        V::from(16),
        V::Nil,
        V::from("GPU"),
    ])];
    if let Some(j) = back(3) {
        events.push(V::Array(vec![
            V::from("BlockStored"),
            V::Array(vec![hash(j, 0)]),
            V::Nil,
            V::Array(Vec::new()),
            V::from(16),
            V::Nil,
            V::from("CPU"),
        ]));
    }
    let removed = |hashes: Vec<V>, medium: V| {
        V::Array(vec![V::from("BlockRemoved"), V::Array(hashes), medium])
    };
    if let Some(j) = back(5) {
        events.push(removed(vec![hash(j, 1)], V::from("GPU")));
    }
    if let Some(j) = back(6) {
        events.push(removed(vec![hash(j, 0), hash(j, 2)], V::Nil));
    }
    vllm_frames::message(i, events)
}

/// Messages `seqs` of every rank of one pod, as recorded (endpoint index = rank).
fn stream(salt: u64, ranks: u64, seqs: std::ops::Range<u64>) -> Vec<RecordedMessage> {
    seqs.flat_map(|i| {
        (0..ranks).map(move |rank| RecordedMessage {
            line: 0,
            endpoint_index: rank as u32,
            frames: churn(salt, rank, i),
        })
    })
    .collect()
}

/// What Redis must hold for `pod` after `messages`: the offline replay's index in kthena's
/// layout, timestamps aside.
fn expected(dir: &Path, pod: &str, messages: &[RecordedMessage]) -> RedisDump {
    let file = write_fixture(dir, &format!("{pod}.jsonl"), messages);
    let replay =
        kvindex::ingest::replay_files(Index::new(), pod, MODEL, Engine::Vllm, &[file]).unwrap();
    let index = replay.index();
    let weights = TierWeights::default();
    let mut want = RedisDump::default();
    index.for_each_field(|model, std, _, value| {
        want.blocks
            .entry(block_key(&index.model_name(model), std))
            .or_default()
            .insert(
                pod.to_owned(),
                field_value(value, ValueFormat::Tiered, &weights),
            );
    });
    index.for_each_mapping(|_, engine, hash, std| {
        let entry = MappingEntry {
            value: std.to_string(),
            ttl: 86_400,
        };
        want.mappings.insert(mapping_key(engine, pod, &hash), entry);
    });
    without_times(want)
}

/// The engine hashes the checkpoint must hold for `pod` after `messages`, as its entries'
/// field names (every rank's state keys together).
fn expected_checkpoint(dir: &Path, pod: &str, messages: &[RecordedMessage]) -> BTreeSet<String> {
    let file = write_fixture(dir, &format!("{pod}-cp.jsonl"), messages);
    let replay =
        kvindex::ingest::replay_files(Index::new(), pod, MODEL, Engine::Vllm, &[file]).unwrap();
    let mut want = BTreeSet::new();
    replay.index().for_each_mapping(|_, _, hash, _| {
        want.insert(checkpoint::engine_field(&hash));
    });
    want
}

/// The checkpoint entries in Redis for `pod`: the engine fields of every state key, its log folded.
async fn checkpoint_now(url: &str, pod: &str) -> BTreeSet<String> {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}{pod}#*", checkpoint::STATE_PREFIX))
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut fields = BTreeSet::new();
    for key in keys {
        let blocks = util::checkpoint_blocks(url, &key).await;
        fields.extend(
            blocks
                .iter()
                .map(|(hash, _)| checkpoint::engine_field(hash)),
        );
    }
    fields
}

/// Field values without their timestamp, TTLs normalised.
fn without_times(mut d: RedisDump) -> RedisDump {
    for fields in d.blocks.values_mut() {
        for value in fields.values_mut() {
            *value = value
                .split_once('|')
                .map_or(String::new(), |(_, m)| m.to_owned());
        }
    }
    for m in d.mappings.values_mut() {
        m.ttl = 86_400;
    }
    d
}

async fn redis_now(url: &str, pod: &str) -> RedisDump {
    without_times(dump(url, None, Some(pod)).await.unwrap())
}

/// Waits until Redis holds exactly `want` for `pod` (a takeover's verify pass deletes what
/// it finds stale after a short grace, so equality comes a moment after the last write).
async fn wait_redis_equals(url: &str, pod: &str, want: &RedisDump) {
    let end = Instant::now() + WAIT;
    loop {
        let got = redis_now(url, pod).await;
        if &got == want {
            return;
        }
        if Instant::now() > end {
            let stale: Vec<_> = got
                .blocks
                .iter()
                .filter(|(k, f)| want.blocks.get(*k) != Some(*f))
                .map(|(k, _)| k)
                .take(5)
                .collect();
            let missing: Vec<_> = want
                .blocks
                .keys()
                .filter(|k| !got.blocks.contains_key(*k))
                .take(5)
                .collect();
            panic!(
                "Redis never equalled the replay for {pod}: {} blocks vs {}, {} mappings vs {}; stale or different {stale:?}, missing {missing:?}",
                got.blocks.len(),
                want.blocks.len(),
                got.mappings.len(),
                want.mappings.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The watermark of `pod` rank `rank` in Redis.
async fn watermark(url: &str, pod: &str, rank: u8) -> Option<u64> {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.ok()?;
    let value: Option<String> = redis::cmd("HGET")
        .arg("kvindex:wm")
        .arg(format!("{pod}#{rank}"))
        .query_async(&mut conn)
        .await
        .ok()?;
    let json: serde_json::Value = serde_json::from_str(&value?).ok()?;
    json["seq"].as_u64()
}

async fn wait_watermarks(url: &str, pod: &str, ranks: u8, seq: u64) {
    let end = Instant::now() + WAIT;
    for rank in 0..ranks {
        while watermark(url, pod, rank).await != Some(seq) {
            assert!(
                Instant::now() < end,
                "{pod} rank {rank}: watermark {:?}, never {seq}",
                watermark(url, pod, rank).await
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The lease holder's token (`{identity}#{random}`) of `shard`, if any.
async fn lease_holder(url: &str, shard: Shard) -> Option<String> {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.ok()?;
    redis::cmd("GET")
        .arg(lease_key(shard))
        .query_async(&mut conn)
        .await
        .ok()?
}

/// A `kvindex serve` child with `ha:`; its listeners' addresses are read from its log.
struct Replica {
    child: Child,
    metrics: SocketAddr,
    api: SocketAddr,
}

impl Replica {
    fn start(config: &Path, env: &[(&str, String)]) -> Replica {
        let (mut child, rx) = util::spawn_serve(config, env);
        match listeners(&rx, WAIT) {
            Some((metrics, api)) => Replica {
                child,
                metrics,
                api,
            },
            None => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("kvindex serve never logged its listeners");
            }
        }
    }

    fn signal(&self, signal: i32) {
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as i32, signal);
        }
    }

    /// Sends `signal` and waits for the exit.
    fn stop(mut self, signal: i32) {
        self.signal(signal);
        let _ = self.child.wait();
    }

    async fn metric(&self, name: &str, label: &str) -> Option<f64> {
        let (_, text) = http_get(self.metrics, "/metrics").await;
        let values: Vec<f64> = text
            .lines()
            .filter(|l| l.starts_with(name) && l.contains(label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .collect();
        (!values.is_empty()).then(|| values.iter().sum())
    }

    /// Waits until series `name` is exported, failing with `what` at the deadline.
    async fn wait_metric(&self, name: &str, what: &str) {
        let end = Instant::now() + WAIT;
        while self.metric(name, "").await.is_none() {
            assert!(Instant::now() < end, "{what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn leads(&self) -> bool {
        self.metric("kvindex_ha_leader{", "").await == Some(1.0)
    }

    async fn wait_leads(&self) -> Duration {
        let started = Instant::now();
        while !self.leads().await {
            assert!(started.elapsed() < WAIT, "the replica never led");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        started.elapsed()
    }

    /// `/v1/pods`' `writer` object.
    async fn writer(&self) -> serde_json::Value {
        let (code, reply) = http_get(self.api, "/v1/pods").await;
        assert_eq!(code, 200, "{reply}");
        let body: serde_json::Value = serde_json::from_str(body_of(&reply)).unwrap();
        body["writer"].clone()
    }

    async fn wait_ready_to_lead(&self) {
        let end = Instant::now() + WAIT;
        while self.writer().await["ready_to_lead"] != true {
            assert!(Instant::now() < end, "the replica never caught up");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn decode_errors(&self, pod: &str) -> u64 {
        let (_, reply) = http_get(self.api, "/v1/pods").await;
        let body: serde_json::Value =
            serde_json::from_str(body_of(&reply)).unwrap_or(serde_json::Value::Null);
        let pods = body["pods"].as_array().cloned().unwrap_or_default();
        pods.iter()
            .find(|p| p["pod"] == pod)
            .and_then(|p| p["counters"]["decode_errors"].as_u64())
            .unwrap_or(0)
    }

    /// Sends probes (a counted decode error that leaves seq tracking alone) on each rank in
    /// turn until this replica has seen one: every subscription has arrived.
    async fn wait_subscribed(&self, pod: &str, pubs: &mut [FakePub]) {
        let end = Instant::now() + WAIT;
        for publisher in pubs.iter_mut() {
            let before = self.decode_errors(pod).await;
            loop {
                assert!(Instant::now() < end, "the subscriber never saw a probe");
                publisher.send_probe().await;
                tokio::time::sleep(Duration::from_millis(40)).await;
                if self.decode_errors(pod).await > before {
                    break;
                }
            }
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One engine pod of a test: its name, PUB ports and replay port.
struct Engine0 {
    pod: String,
    port: u16,
    replay: Option<u16>,
    ranks: u32,
}

fn write_config(dir: &Path, name: &str, url: &str, engines: &[&Engine0], shards: u32) -> PathBuf {
    let mut text = format!(
        "redis:\n  url: {url}\n  anti_entropy_interval_s: 600\nha:\n  lease_ttl_ms: {TTL_MS}\napi:\n  listen: 127.0.0.1:0\nmetrics:\n  listen: 127.0.0.1:0\n"
    );
    if shards > 1 {
        text.push_str(&format!("shard:\n  count: {shards}\n"));
    }
    text.push_str("targets:\n");
    for e in engines {
        text.push_str(&util::target_yaml(
            &e.pod, MODEL, "vllm", e.port, e.replay, e.ranks,
        ));
    }
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// Publishes `messages` on the rank sockets `pubs` (endpoint index = rank).
async fn publish(pubs: &mut [FakePub], messages: &[RecordedMessage]) {
    for m in messages {
        pubs[m.endpoint_index as usize].send(&m.frames).await;
    }
}

/// Asks `api` for a score every 50 ms until stopped; counts answers and non-200 ones.
struct Poller {
    stop: Arc<AtomicBool>,
    asked: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

fn score_body(pod: &str) -> String {
    let tokens: Vec<u64> = (0..64)
        .map(|t| (10 * 7_919 + 40 * 64 + t) % 150_000)
        .collect();
    serde_json::json!({"model": MODEL, "tokens": tokens, "pods": [pod], "match": "kthena"})
        .to_string()
}

impl Poller {
    fn start(api: SocketAddr, pod: &str) -> Poller {
        let stop = Arc::new(AtomicBool::new(false));
        let asked = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let body = score_body(pod);
        let task = {
            let (stop, asked, failed) = (stop.clone(), asked.clone(), failed.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let (code, _) = http_request(api, "POST", "/v1/score", &body).await;
                    asked.fetch_add(1, Ordering::Relaxed);
                    if code != 200 {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
        };
        Poller {
            stop,
            asked,
            failed,
            task,
        }
    }

    async fn finish(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap();
        (
            self.asked.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        )
    }
}

/// The score the offline replay's index gives the poller's prompt (the API over it).
async fn replay_score(dir: &Path, pod: &str, messages: &[RecordedMessage]) -> serde_json::Value {
    use tower::ServiceExt;
    let file = write_fixture(dir, "score.jsonl", messages);
    let replay =
        kvindex::ingest::replay_files(Index::new(), pod, MODEL, Engine::Vllm, &[file]).unwrap();
    struct NoPods;
    impl kvindex::ingest::PodsView for NoPods {
        fn pods(&self) -> Vec<kvindex::ingest::PodStatus> {
            Vec::new()
        }
    }
    let state = kvindex::api::ApiState::new(
        kvindex::score::ScoreBackend::Index(replay.index().clone()),
        TierWeights::default(),
        None,
        Arc::new(NoPods),
    );
    let req = axum::http::Request::post("/v1/score")
        .header("content-type", "application/json")
        .body(axum::body::Body::from(score_body(pod)))
        .unwrap();
    let resp = kvindex::api::router(state).oneshot(req).await.unwrap();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    serde_json::from_slice::<serde_json::Value>(&bytes).unwrap()["scores"].clone()
}

async fn score_of(api: SocketAddr, pod: &str) -> serde_json::Value {
    let (code, reply) = http_request(api, "POST", "/v1/score", &score_body(pod)).await;
    assert_eq!(code, 200, "{reply}");
    serde_json::from_str::<serde_json::Value>(body_of(&reply)).unwrap()["scores"].clone()
}

/// Two replicas, one stream: the first leads, the second stands by.
async fn leader_and_standby(config: &Path, pod: &str, pubs: &mut [FakePub]) -> (Replica, Replica) {
    let a = Replica::start(config, &[("POD_NAME", "replica-a".to_owned())]);
    a.wait_subscribed(pod, pubs).await;
    a.wait_leads().await;
    let b = Replica::start(config, &[("POD_NAME", "replica-b".to_owned())]);
    b.wait_subscribed(pod, pubs).await;
    b.wait_ready_to_lead().await;
    assert_eq!(b.writer().await["role"], "standby");
    assert!(!b.leads().await);
    // A standby serves queries from its own index: it is ready.
    let (code, body) = http_get(b.metrics, "/readyz").await;
    assert_eq!(code, 200, "{body}");
    assert!(
        body.contains("ha: standby (lease holder: replica-a/"),
        "{body}"
    );
    (a, b)
}

#[tokio::test]
async fn a_sigkilled_leader_is_replaced_and_redis_ends_equal_to_the_replay() {
    let dir = tempfile::tempdir().unwrap();
    let redis = OwnRedis::start(None, &[]);
    let url = redis.url();
    let (mut pubs, port) = FakePub::bind_ranks(2).await;
    let engine = Engine0 {
        pod: "engine-0".into(),
        port,
        replay: None,
        ranks: 2,
    };
    let pod = pod_id(&engine.pod);
    let config = write_config(dir.path(), "kvindex.yaml", &url, &[&engine], 1);
    let all = stream(1, 2, 0..70);
    let (a, b) = leader_and_standby(&config, &pod, &mut pubs).await;
    let writer = b.writer().await;
    assert_eq!(
        writer["holder"]
            .as_str()
            .map(|h| h.starts_with("replica-a/")),
        Some(true),
        "{writer}"
    );

    publish(&mut pubs, &all[..60]).await;
    wait_watermarks(&url, &pod, 2, 29).await;
    let poller = Poller::start(b.api, &pod);
    publish(&mut pubs, &all[60..90]).await;
    let killed = Instant::now();
    a.stop(libc::SIGKILL);
    publish(&mut pubs, &all[90..]).await;
    b.wait_leads().await;
    let led_after = killed.elapsed();

    wait_watermarks(&url, &pod, 2, 69).await;
    wait_redis_equals(&url, &pod, &expected(dir.path(), &pod, &all)).await;
    eprintln!(
        "ha figure: SIGKILL -> standby leads after {led_after:?} (ttl {TTL_MS} ms); lease end -> first write {:?} s",
        b.metric("kvindex_ha_takeover_seconds_sum", "").await
    );
    // Every HA metric the user docs name is exported (tests/ops_dashboards.rs runs without
    // `ha:`), once the new leader has renewed its lease.
    b.wait_metric(
        "kvindex_ha_lease_renew_seconds_count",
        "the new leader never renewed its lease",
    )
    .await;
    let docs: String = ["README.md", "docs/operating.md", "docs/deploying.md"]
        .iter()
        .map(|f| std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(f)).unwrap())
        .collect();
    let (_, text) = http_get(b.metrics, "/metrics").await;
    let names = docs
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("kvindex_ha_"));
    for name in names {
        assert!(text.contains(name), "{name} is not exported");
    }
    assert_eq!(
        checkpoint_now(&url, &pod).await,
        expected_checkpoint(dir.path(), &pod, &all),
        "the checkpoint holds exactly the engine's blocks"
    );
    let (asked, failed) = poller.finish().await;
    assert!(asked > 0);
    assert_eq!(
        failed, 0,
        "{failed} of {asked} scores failed on the standby"
    );
    assert_eq!(
        score_of(b.api, &pod).await,
        replay_score(dir.path(), &pod, &all).await
    );
    assert_eq!(b.writer().await["role"], "leader");
    // A third replica warm-starts from the new leader's checkpoint and agrees.
    let c = Replica::start(&config, &[("POD_NAME", "replica-c".to_owned())]);
    c.wait_subscribed(&pod, &mut pubs).await;
    c.wait_ready_to_lead().await;
    assert_eq!(score_of(c.api, &pod).await, score_of(b.api, &pod).await);
    assert_eq!(c.writer().await["role"], "standby");
    c.stop(libc::SIGTERM);
    b.stop(libc::SIGTERM);
}

#[tokio::test]
async fn a_rolling_restart_hands_over_twice_with_nothing_stale() {
    let dir = tempfile::tempdir().unwrap();
    let redis = OwnRedis::start(None, &[]);
    let url = redis.url();
    let all = stream(2, 1, 0..90);
    let (mut publisher, port) = FakePub::bind_any().await;
    let (_router, replay) = spawn_router(all.clone(), util::RouterMode::New).await;
    let engine = Engine0 {
        pod: "engine-1".into(),
        port,
        replay: Some(replay),
        ranks: 1,
    };
    let pod = pod_id(&engine.pod);
    let pubs = std::slice::from_mut(&mut publisher);
    let config = write_config(dir.path(), "kvindex.yaml", &url, &[&engine], 1);
    let (a, b) = leader_and_standby(&config, &pod, pubs).await;
    publish(pubs, &all[..30]).await;
    wait_watermarks(&url, &pod, 1, 29).await;

    // SIGTERM the leader: the standby takes the released lease.
    let asked = Instant::now();
    a.stop(libc::SIGTERM);
    let first = asked.elapsed() + b.wait_leads().await;
    publish(pubs, &all[30..50]).await;
    // The old leader comes back as a standby, catching up by replay from the checkpoint.
    let a = Replica::start(&config, &[("POD_NAME", "replica-a".to_owned())]);
    a.wait_subscribed(&pod, pubs).await;
    publish(pubs, &all[50..60]).await;
    a.wait_ready_to_lead().await;
    assert_eq!(a.writer().await["role"], "standby");
    wait_watermarks(&url, &pod, 1, 59).await;

    let asked = Instant::now();
    b.stop(libc::SIGTERM);
    let second = asked.elapsed() + a.wait_leads().await;
    publish(pubs, &all[60..]).await;
    wait_watermarks(&url, &pod, 1, 89).await;
    wait_redis_equals(&url, &pod, &expected(dir.path(), &pod, &all)).await;
    eprintln!(
        "ha figure: SIGTERM handovers took {first:?} and {second:?} (signal to the standby's leader gauge); loss -> first write of the last: {:?} s",
        a.metric("kvindex_ha_takeover_seconds_sum", "").await
    );
    a.stop(libc::SIGTERM);
}

#[tokio::test]
async fn a_frozen_leader_writes_nothing_after_it_wakes_and_its_late_writes_are_repaired() {
    let dir = tempfile::tempdir().unwrap();
    let redis = OwnRedis::start(None, &[]);
    let url = redis.url();
    let all = stream(3, 1, 0..60);
    let (mut publisher, port) = FakePub::bind_any().await;
    let engine = Engine0 {
        pod: "engine-2".into(),
        port,
        replay: None,
        ranks: 1,
    };
    let pod = pod_id(&engine.pod);
    let pubs = std::slice::from_mut(&mut publisher);
    let config = write_config(dir.path(), "kvindex.yaml", &url, &[&engine], 1);
    let (a, b) = leader_and_standby(&config, &pod, pubs).await;
    publish(pubs, &all[..30]).await;
    wait_watermarks(&url, &pod, 1, 29).await;
    let commands = a.metric("kvindex_mirror_commands_total", "").await;

    a.signal(libc::SIGSTOP);
    // What a frozen leader's last pipelines could leave behind: a field and a mapping key
    // of blocks the engine never held.
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let stale_block = block_key(MODEL, 424_242);
    let stale_mapping = format!("vllm:kv:block:{pod}@999999999");
    redis::pipe()
        .hset(&stale_block, &pod, "1|GPU")
        .ignore()
        .set_ex(&stale_mapping, "424242", 86_400)
        .ignore()
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    publish(pubs, &all[30..45]).await;
    b.wait_leads().await;
    wait_watermarks(&url, &pod, 1, 44).await;
    wait_redis_equals(&url, &pod, &expected(dir.path(), &pod, &all[..45])).await;

    // Bytes of the frozen leader that land after the takeover's verify pass read Redis (the
    // periodic pass is 10 minutes away here): the pass two ttls later deletes them.
    b.wait_metric(
        "kvindex_anti_entropy_pass_seconds",
        "the takeover's verify pass never ended",
    )
    .await;
    let late_block = block_key(MODEL, 434_343);
    redis::pipe()
        .hset(&late_block, &pod, "2|GPU")
        .ignore()
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    wait_redis_equals(&url, &pod, &expected(dir.path(), &pod, &all[..45])).await;

    a.signal(libc::SIGCONT);
    // Awake, it finds its lease gone: it stands by and sees the new holder.
    let end = Instant::now() + WAIT;
    loop {
        let w = a.writer().await;
        if w["role"] == "standby"
            && w["holder"]
                .as_str()
                .is_some_and(|h| h.starts_with("replica-b/"))
        {
            break;
        }
        assert!(Instant::now() < end, "the woken leader never stood by: {w}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    publish(pubs, &all[45..]).await;
    wait_watermarks(&url, &pod, 1, 59).await;
    wait_redis_equals(&url, &pod, &expected(dir.path(), &pod, &all)).await;
    assert_eq!(
        checkpoint_now(&url, &pod).await,
        expected_checkpoint(dir.path(), &pod, &all)
    );
    assert_eq!(
        a.metric("kvindex_mirror_commands_total", "").await,
        commands,
        "the woken leader wrote to Redis"
    );
    assert!(!a.leads().await);
    a.stop(libc::SIGTERM);
    b.stop(libc::SIGTERM);
}

// Multi-threaded: the proxy must forward while the test blocks on a child's start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_redis_loses_the_lease_and_stays_standby_when_back() {
    let dir = tempfile::tempdir().unwrap();
    let redis = OwnRedis::start(None, &[]);
    let url = redis.url();
    let proxy = RedisProxy::start(redis.port).await;
    let proxied = proxy.url();
    let all = stream(4, 1, 0..60);
    let (mut publisher, port) = FakePub::bind_any().await;
    let engine = Engine0 {
        pod: "engine-3".into(),
        port,
        replay: None,
        ranks: 1,
    };
    let pod = pod_id(&engine.pod);
    let pubs = std::slice::from_mut(&mut publisher);
    let via_proxy = write_config(dir.path(), "a.yaml", &proxied, &[&engine], 1);
    let direct = write_config(dir.path(), "b.yaml", &url, &[&engine], 1);
    let a = Replica::start(&via_proxy, &[("POD_NAME", "replica-a".to_owned())]);
    a.wait_subscribed(&pod, pubs).await;
    a.wait_leads().await;
    let b = Replica::start(&direct, &[("POD_NAME", "replica-b".to_owned())]);
    b.wait_subscribed(&pod, pubs).await;
    b.wait_ready_to_lead().await;
    publish(pubs, &all[..30]).await;
    wait_watermarks(&url, &pod, 1, 29).await;

    proxy.set_cut(true);
    publish(pubs, &all[30..40]).await;
    b.wait_leads().await;
    let end = Instant::now() + WAIT;
    while a.leads().await {
        assert!(Instant::now() < end, "the cut-off leader kept the lease");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    proxy.set_cut(false);
    // Back in touch, it sees the new holder and stays a standby.
    let end = Instant::now() + WAIT;
    loop {
        let w = a.writer().await;
        if w["holder"]
            .as_str()
            .is_some_and(|h| h.starts_with("replica-b/"))
        {
            assert_eq!(w["role"], "standby", "{w}");
            break;
        }
        assert!(
            Instant::now() < end,
            "the old leader never saw the new one: {w}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    publish(pubs, &all[40..]).await;
    wait_watermarks(&url, &pod, 1, 59).await;
    wait_redis_equals(&url, &pod, &expected(dir.path(), &pod, &all)).await;
    assert!(b.leads().await && !a.leads().await);
    a.stop(libc::SIGTERM);
    b.stop(libc::SIGTERM);
}

#[tokio::test]
async fn killing_one_replica_of_one_shard_moves_only_that_shards_lease() {
    let dir = tempfile::tempdir().unwrap();
    let redis = OwnRedis::start(None, &[]);
    let url = redis.url();
    // One pod per shard.
    let first_of = |shard: u32| {
        (0..)
            .map(|i| format!("sharded-{i}"))
            .find(|name| owner(&pod_id(name), 2) == shard)
            .unwrap()
    };
    let names = vec![first_of(0), first_of(1)];
    assert_eq!(names.len(), 2);
    let mut engines = Vec::new();
    let mut pubs = Vec::new();
    for name in &names {
        let (publisher, port) = FakePub::bind_any().await;
        pubs.push(publisher);
        engines.push(Engine0 {
            pod: name.clone(),
            port,
            replay: None,
            ranks: 1,
        });
    }
    let config = write_config(
        dir.path(),
        "kvindex.yaml",
        &url,
        &engines.iter().collect::<Vec<_>>(),
        2,
    );
    let shard_of = |name: &str| owner(&pod_id(name), 2);
    let mut replicas = Vec::new();
    for shard in 0..2u32 {
        for r in ["a", "b"] {
            let env = [
                ("KVINDEX_SHARD_INDEX", shard.to_string()),
                ("POD_NAME", format!("shard{shard}-{r}")),
            ];
            let replica = Replica::start(&config, &env);
            let i = names.iter().position(|n| shard_of(n) == shard).unwrap();
            replica
                .wait_subscribed(&pod_id(&names[i]), std::slice::from_mut(&mut pubs[i]))
                .await;
            replica.wait_ready_to_lead().await;
            replicas.push((shard, replica));
        }
    }
    let holders_before = [
        lease_holder(&url, Shard { index: 0, count: 2 }).await,
        lease_holder(&url, Shard { index: 1, count: 2 }).await,
    ];
    assert!(
        holders_before.iter().all(Option::is_some),
        "{holders_before:?}"
    );
    // Kill shard 0's leader.
    let mut leader_at = None;
    for (i, (shard, r)) in replicas.iter().enumerate() {
        if *shard == 0 && r.leads().await {
            leader_at = Some(i);
        }
    }
    let (_, leader) = replicas.remove(leader_at.expect("shard 0 has a leader"));
    leader.stop(libc::SIGKILL);
    let standby = replicas
        .iter()
        .find(|(shard, _)| *shard == 0)
        .map(|(_, r)| r)
        .unwrap();
    standby.wait_leads().await;
    let holders_after = [
        lease_holder(&url, Shard { index: 0, count: 2 }).await,
        lease_holder(&url, Shard { index: 1, count: 2 }).await,
    ];
    assert_ne!(holders_after[0], holders_before[0], "shard 0's lease moved");
    assert_eq!(
        holders_after[1], holders_before[1],
        "shard 1's lease stayed"
    );
    for (shard, r) in &replicas {
        if *shard == 1 {
            let takeovers = r.metric("kvindex_ha_takeovers_total", "").await;
            assert!(takeovers.unwrap_or(0.0) <= 1.0, "shard 1 took over again");
        }
    }
    // Every pod is written by its shard's leader.
    for (i, e) in engines.iter().enumerate() {
        let msgs = stream(5 + i as u64, 1, 0..20);
        publish(std::slice::from_mut(&mut pubs[i]), &msgs).await;
        let pod = pod_id(&e.pod);
        wait_watermarks(&url, &pod, 1, 19).await;
        wait_redis_equals(&url, &pod, &expected(dir.path(), &pod, &msgs)).await;
    }
    for (_, r) in replicas {
        r.stop(libc::SIGTERM);
    }
}

//! Sharded replicas: built `kvindex` binaries, each `serve` with the same
//! config file and its shard from the environment, share one `redis-server` of the test;
//! a reference unsharded `kvindex` subscribes to the same 12 fake engines and writes its own
//! `redis-server`. Each target is subscribed by exactly one replica, the replicas' writes
//! together equal the reference's, any replica scores any pod (from Redis), and growing
//! from 3 to 4 replicas moves only the pods whose owner changed, with no old owner deleting
//! what the new owner wrote.

use crate::util;

use std::collections::{BTreeMap, BTreeSet};

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use kvindex::config::Shard;

fn owner(pod_id: &str, count: u32) -> u32 {
    Shard { index: 0, count }.owner_of(pod_id)
}
use kvindex::store::redis::{dump, RedisDump};
use rmpv::Value as V;
use util::own_redis::OwnRedis;
use util::{body_of, http_get, http_request, listeners, vllm_frames, FakePub};

const MODEL: &str = "shard-model";
const PODS: usize = 12;
/// Upper bound for anything these tests wait on (several debug binaries on a shared box).
const WAIT: Duration = Duration::from_secs(60);

fn pod_name(i: usize) -> String {
    format!("engine-{i}")
}

/// `engine-{i}.team-a`: the namespace is chosen so 3 shards get 2–6 pods each and the
/// move to 4 shards moves 4 of them (owners pinned in `shard.rs`'s unit tests).
fn pod_id(i: usize) -> String {
    format!("{}.team-a", pod_name(i))
}

/// Engine hash `k` (0 or 1) of message `seq` of pod `i`.
fn engine_hash(i: usize, seq: u64, k: u64) -> u64 {
    (i as u64 + 1) * 1_000_000 + seq * 2 + k
}

/// Message `seq` of pod `i`: stores two GPU blocks and, from seq 3 on, removes one block
/// stored three messages earlier (so later messages delete what earlier ones wrote).
fn message(i: usize, seq: u64) -> Vec<Vec<u8>> {
    let mut events = vec![
        vllm_frames::store_one(engine_hash(i, seq, 0), "GPU", None),
        vllm_frames::store_one(engine_hash(i, seq, 1), "GPU", None),
    ];
    if seq >= 3 {
        events.push(V::Array(vec![
            V::from("BlockRemoved"),
            V::Array(vec![V::from(engine_hash(i, seq - 3, 1))]),
            V::Nil,
        ]));
    }
    vllm_frames::message(seq, events)
}

/// The tokens of block `(i, seq, k)` as `store_one` builds them (one 16-token block).
fn block_tokens(i: usize, seq: u64, k: u64) -> Vec<u64> {
    let hash = engine_hash(i, seq, k);
    (0..16).map(|t| hash * 100 + t).collect()
}

/// A `kvindex serve` child; its listeners' addresses are read from its JSON log.
struct Kvindex {
    child: Child,
    metrics: SocketAddr,
    api: SocketAddr,
}

impl Kvindex {
    fn start(config: &Path, env: &[(&str, String)]) -> Kvindex {
        let (mut child, rx) = util::spawn_serve(config, env);
        match listeners(&rx, WAIT) {
            Some((metrics, api)) => Kvindex {
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

    /// SIGTERM, and wait for the exit (the orderly shutdown flushes the mirror).
    fn stop(mut self) {
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let _ = self.child.wait();
    }

    /// `GET /v1/pods`, by pod identifier.
    async fn pods(&self) -> BTreeMap<String, serde_json::Value> {
        let (code, reply) = http_get(self.api, "/v1/pods").await;
        assert_eq!(code, 200, "{reply}");
        let body: serde_json::Value = serde_json::from_str(body_of(&reply)).unwrap();
        body["pods"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p["pod"].as_str().unwrap().to_owned(), p.clone()))
            .collect()
    }

    /// `GET /v1/pods` once it lists every configured pod (the listeners are up a moment
    /// before the target set is applied).
    async fn all_pods(&self) -> BTreeMap<String, serde_json::Value> {
        let end = Instant::now() + WAIT;
        loop {
            let pods = self.pods().await;
            if pods.len() == PODS {
                return pods;
            }
            assert!(Instant::now() < end, "{} pods listed", pods.len());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The pods this process subscribes to (every state but `other_shard`).
    async fn own_pods(&self) -> BTreeSet<String> {
        self.all_pods()
            .await
            .into_iter()
            .filter(|(_, p)| p["state"] != "other_shard")
            .map(|(id, _)| id)
            .collect()
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

    /// `POST /v1/score` of one prompt over every pod; the body's `scores`.
    async fn score(&self, tokens: &[u64]) -> serde_json::Value {
        let pods: Vec<String> = (0..PODS).map(pod_id).collect();
        let body =
            serde_json::json!({"model": MODEL, "tokens": tokens, "pods": pods, "match": "kthena"});
        let (code, reply) = http_request(self.api, "POST", "/v1/score", &body.to_string()).await;
        assert_eq!(code, 200, "{reply}");
        let body: serde_json::Value = serde_json::from_str(body_of(&reply)).unwrap();
        body["scores"].clone()
    }
}

impl Drop for Kvindex {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One config file for every replica (the shard count in the file, the index from the
/// environment), and one for the reference.
fn write_config(dir: &Path, name: &str, url: &str, ports: &[u16], shard: bool) -> PathBuf {
    let mut text = format!(
        "redis:\n  url: {url}\n  anti_entropy_interval_s: 1\napi:\n  listen: 127.0.0.1:0\nmetrics:\n  listen: 127.0.0.1:0\n"
    );
    if shard {
        text.push_str("shard:\n  count: 3\n");
    }
    text.push_str("targets:\n");
    for (i, port) in ports.iter().enumerate() {
        text.push_str(&format!(
            "  - pod: {}\n    namespace: team-a\n    model: {MODEL}\n    engine: vllm\n    endpoint: tcp://127.0.0.1:{port}\n",
            pod_name(i)
        ));
    }
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// Shard `index` of `count`: the index as a StatefulSet pod name, the count over the file's.
fn shard_env(index: u32, count: u32) -> Vec<(&'static str, String)> {
    vec![
        ("KVINDEX_SHARD_INDEX", format!("kvindex-{index}")),
        ("KVINDEX_SHARD_COUNT", count.to_string()),
    ]
}

/// Probes every publisher whose pod `ready` does not yet report as having seen a probe in
/// `process`'s `/v1/pods` (its subscription has arrived: no slow joiner), until all have.
async fn wait_subscribed(process: &Kvindex, pubs: &mut [FakePub], pods: &BTreeSet<String>) {
    let end = Instant::now() + WAIT;
    loop {
        let seen = process.pods().await;
        let waiting: Vec<usize> = (0..PODS)
            .filter(|i| pods.contains(&pod_id(*i)))
            .filter(|i| {
                seen.get(&pod_id(*i)).is_none_or(|p| {
                    p["state"] == "other_shard" || p["counters"]["decode_errors"] == 0
                })
            })
            .collect();
        if waiting.is_empty() {
            return;
        }
        assert!(Instant::now() < end, "never subscribed: {waiting:?}");
        for i in waiting {
            pubs[i].send_probe().await;
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
}

async fn publish(pubs: &mut [FakePub], seqs: std::ops::Range<u64>) {
    for seq in seqs {
        for (i, p) in pubs.iter_mut().enumerate() {
            p.send(&message(i, seq)).await;
        }
    }
}

/// Every pod's rank-0 watermark in Redis.
async fn watermarks(url: &str) -> BTreeMap<String, u64> {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let all: BTreeMap<String, String> = redis::cmd("HGETALL")
        .arg("kvindex:wm")
        .query_async(&mut conn)
        .await
        .unwrap();
    all.into_iter()
        .filter_map(|(field, value)| {
            let json: serde_json::Value = serde_json::from_str(&value).ok()?;
            Some((field.strip_suffix("#0")?.to_owned(), json["seq"].as_u64()?))
        })
        .collect()
}

async fn wait_watermarks(url: &str, last: u64) {
    let end = Instant::now() + WAIT;
    loop {
        let marks = watermarks(url).await;
        if marks.len() == PODS && marks.values().all(|s| *s == last) {
            return;
        }
        assert!(
            Instant::now() < end,
            "watermarks never reached {last}: {marks:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// kthena's keys without field timestamps (the processes stored at different seconds).
async fn redis_now(url: &str) -> RedisDump {
    let mut d = dump(url, None, None).await.unwrap();
    for fields in d.blocks.values_mut() {
        for value in fields.values_mut() {
            *value = value
                .split_once('|')
                .map_or(String::new(), |(_, m)| m.to_owned());
        }
    }
    for m in d.mappings.values_mut() {
        assert!((86_000..=86_400).contains(&m.ttl), "TTL {}", m.ttl);
        m.ttl = 86_400;
    }
    d
}

/// Asserts that each pod is subscribed by exactly one of `replicas`, its rendezvous owner,
/// and that every replica names that owner for it; returns the owner of each pod.
async fn check_ownership(replicas: &[Kvindex]) -> BTreeMap<String, u32> {
    let count = replicas.len() as u32;
    let mut owners = BTreeMap::new();
    for (r, replica) in replicas.iter().enumerate() {
        let pods = replica.all_pods().await;
        for (id, p) in &pods {
            let want = owner(id, count);
            assert_eq!(p["shard"], want, "replica {r} names the owner of {id}");
            let own = p["state"] != "other_shard";
            assert_eq!(own, want == r as u32, "replica {r} subscribes to {id}: {p}");
            if own {
                assert!(owners.insert(id.clone(), r as u32).is_none(), "{id} twice");
            }
        }
    }
    assert_eq!(owners.len(), PODS, "every pod has a subscriber: {owners:?}");
    let owned: f64 = {
        let mut sum = 0.0;
        for replica in replicas {
            sum += replica
                .metric("kvindex_shard_owned_targets", "")
                .await
                .unwrap_or(0.0);
        }
        sum
    };
    assert_eq!(
        owned, PODS as f64,
        "kvindex_shard_owned_targets over the replicas"
    );
    owners
}

/// `POST /v1/pd/schedule` of a prompt of pod `i`'s blocks: every pod a decode, the prefill
/// groups by pod number modulo 3; the body's `pairs`.
async fn pd_pairs(process: &Kvindex, i: usize, seq: u64) -> serde_json::Value {
    let mut tokens = block_tokens(i, seq, 0);
    tokens.extend(block_tokens(i, seq, 1));
    let decode: Vec<serde_json::Value> = (0..PODS)
        .map(|d| serde_json::json!({"pod": pod_id(d), "group": format!("g{}", d % 3)}))
        .collect();
    let prefill: BTreeMap<String, Vec<String>> = (0..3)
        .map(|g| {
            let pods = (0..PODS).filter(|p| p % 3 == g).map(pod_id).collect();
            (format!("g{g}"), pods)
        })
        .collect();
    let body = serde_json::json!({"model": MODEL, "tokens": tokens, "decode": decode, "prefill": prefill, "match": "kthena"});
    let (code, reply) =
        http_request(process.api, "POST", "/v1/pd/schedule", &body.to_string()).await;
    assert_eq!(code, 200, "{reply}");
    let body: serde_json::Value = serde_json::from_str(body_of(&reply)).unwrap();
    body["pairs"].clone()
}

/// Scores of one block of every pod, from every replica and the reference: all equal, and
/// each prompt scores its pod 100 (the replicas read Redis, the reference its index; both
/// asked for `kthena` matching, the only mode Redis can answer). The PD route likewise
/// pairs as the reference does.
async fn check_scores(replicas: &[Kvindex], reference: &Kvindex, seq: u64) {
    for i in [1, 5] {
        let want = pd_pairs(reference, i, seq).await;
        let first = &want[0];
        assert_eq!(first["decode"], pod_id(i), "{want}");
        for (r, replica) in replicas.iter().enumerate() {
            assert_eq!(
                pd_pairs(replica, i, seq).await,
                want,
                "replica {r}, pod {i}"
            );
        }
    }
    for i in 0..PODS {
        let tokens = block_tokens(i, seq, 0);
        let want = reference.score(&tokens).await;
        assert_eq!(want[0]["pod"], pod_id(i), "{want}");
        assert_eq!(want[0]["score"], 100, "{want}");
        for (r, replica) in replicas.iter().enumerate() {
            assert_eq!(replica.score(&tokens).await, want, "replica {r}, pod {i}");
        }
    }
}

/// Fails with the keys that differ (a whole dump is too long to read).
fn assert_same(got: &RedisDump, want: &RedisDump, what: &str) {
    if got == want {
        return;
    }
    let differ = |a: &BTreeMap<String, BTreeMap<String, String>>,
                  b: &BTreeMap<String, BTreeMap<String, String>>| {
        a.iter()
            .filter(|(k, v)| b.get(*k) != Some(*v))
            .map(|(k, v)| format!("{k}={v:?}"))
            .take(5)
            .collect::<Vec<_>>()
    };
    let mappings = |a: &RedisDump, b: &RedisDump| {
        a.mappings
            .keys()
            .filter(|k| !b.mappings.contains_key(*k))
            .take(5)
            .cloned()
            .collect::<Vec<_>>()
    };
    panic!(
        "{what}: {} vs {} block keys, {} vs {} mapping keys; only in the replicas' Redis: {:?} {:?}; only in the reference: {:?} {:?}",
        got.blocks.len(),
        want.blocks.len(),
        got.mappings.len(),
        want.mappings.len(),
        differ(&got.blocks, &want.blocks),
        mappings(got, want),
        differ(&want.blocks, &got.blocks),
        mappings(want, got),
    );
}

async fn checkpoint_sources(url: &str) -> BTreeSet<String> {
    watermarks(url).await.into_keys().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_replicas_split_the_pods_write_what_one_daemon_writes_and_grow_without_loss() {
    let dir = tempfile::tempdir().unwrap();
    let shared = OwnRedis::start(None, &[]);
    let single = OwnRedis::start(None, &[]);
    let mut pubs = Vec::new();
    let mut ports = Vec::new();
    for _ in 0..PODS {
        let (p, port) = FakePub::bind_any().await;
        pubs.push(p);
        ports.push(port);
    }
    let sharded_config = write_config(dir.path(), "sharded.yaml", &shared.url(), &ports, true);
    let single_config = write_config(dir.path(), "single.yaml", &single.url(), &ports, false);
    let all: BTreeSet<String> = (0..PODS).map(pod_id).collect();

    // Three replicas and the reference.
    let reference = Kvindex::start(&single_config, &[]);
    let mut replicas: Vec<Kvindex> = (0..3)
        .map(|r| Kvindex::start(&sharded_config, &shard_env(r, 3)))
        .collect();
    let before = check_ownership(&replicas).await;
    for replica in &replicas {
        let own = replica.own_pods().await;
        wait_subscribed(replica, &mut pubs, &own).await;
    }
    wait_subscribed(&reference, &mut pubs, &all).await;
    publish(&mut pubs, 0..12).await;
    wait_watermarks(&shared.url(), 11).await;
    wait_watermarks(&single.url(), 11).await;
    let got = redis_now(&shared.url()).await;
    assert!(
        got.blocks.len() > PODS * 10,
        "{} block keys",
        got.blocks.len()
    );
    assert_same(
        &got,
        &redis_now(&single.url()).await,
        "3 replicas vs one daemon",
    );
    assert_eq!(
        checkpoint_sources(&shared.url()).await,
        checkpoint_sources(&single.url()).await
    );
    check_scores(&replicas, &reference, 11).await;
    // A replica that scores from Redis cannot match chains: `prefix` is refused by name.
    let body = serde_json::json!({"model": MODEL, "tokens": block_tokens(0, 11, 0), "pods": [pod_id(0)], "match": "prefix"});
    let (code, reply) = http_request(replicas[0].api, "POST", "/v1/score", &body.to_string()).await;
    assert_eq!(code, 400, "{reply}");
    assert!(reply.contains("\"field\":\"match\""), "{reply}");

    // Growing to 4: the new replica starts first, while the old three still run with 3.
    let newcomer = Kvindex::start(&sharded_config, &shard_env(3, 4));
    let moved: BTreeSet<String> = all
        .iter()
        .filter(|p| owner(p, 3) != owner(p, 4))
        .cloned()
        .collect();
    assert!(!moved.is_empty() && moved.len() < PODS / 2, "{moved:?}");
    assert_eq!(
        newcomer.own_pods().await,
        moved,
        "the newcomer takes the moved pods"
    );
    wait_subscribed(&newcomer, &mut pubs, &moved).await;
    let restored = newcomer
        .metric("kvindex_warm_start_engine_blocks", "")
        .await
        .unwrap_or(0.0);
    assert!(
        restored > 0.0,
        "the newcomer restored the moved pods' checkpoint"
    );
    // Moved pods have two owners for now: both write the same stream.
    publish(&mut pubs, 12..18).await;
    wait_watermarks(&shared.url(), 17).await;

    // Rolling restart of the old three with the new count.
    for r in 0..3 {
        let old = replicas.remove(r);
        old.stop();
        let new = Kvindex::start(&sharded_config, &shard_env(r as u32, 4));
        let own: BTreeSet<String> = all
            .iter()
            .filter(|p| owner(p, 4) == r as u32)
            .cloned()
            .collect();
        assert_eq!(new.own_pods().await, own, "replica {r} with 4 shards");
        wait_subscribed(&new, &mut pubs, &own).await;
        replicas.insert(r, new);
    }
    replicas.push(newcomer);
    let after = check_ownership(&replicas).await;
    let changed: BTreeSet<String> = all
        .iter()
        .filter(|p| before[*p] != after[*p])
        .cloned()
        .collect();
    assert_eq!(changed, moved, "only the pods whose owner changed moved");
    for p in &moved {
        assert_eq!(after[p], 3, "{p} moved to the new shard");
    }

    // Every restarted replica ran an anti-entropy pass; none deleted anything.
    for (r, replica) in replicas.iter().enumerate() {
        let end = Instant::now() + WAIT;
        while replica
            .metric("kvindex_anti_entropy_pass_seconds", "")
            .await
            .is_none()
        {
            assert!(
                Instant::now() < end,
                "replica {r} never finished an anti-entropy pass"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    publish(&mut pubs, 18..24).await;
    wait_watermarks(&shared.url(), 23).await;
    wait_watermarks(&single.url(), 23).await;
    // The old owners (restarted with 4 shards) deleted nothing. The newcomer is left out:
    // while it and an old owner both wrote a moved pod, one could briefly see the other's
    // newer write before applying the same message itself, a transient repair both ways.
    for (r, replica) in replicas.iter().enumerate().take(3) {
        let deleted = replica
            .metric(
                "kvindex_anti_entropy_repairs_total",
                "direction=\"deleted\"",
            )
            .await;
        assert_eq!(
            deleted,
            Some(0.0),
            "replica {r} deleted keys by anti-entropy"
        );
    }
    // The moved pods' keys written by their new owner are all there: the union still equals
    // the single daemon's, the moved pods included.
    let got = redis_now(&shared.url()).await;
    assert_same(
        &got,
        &redis_now(&single.url()).await,
        "4 replicas vs one daemon",
    );
    for p in &moved {
        let i: usize = p
            .trim_start_matches("engine-")
            .trim_end_matches(".team-a")
            .parse()
            .unwrap();
        let key = kvindex::store::redis::mapping_key(
            kvindex::wire::Engine::Vllm,
            p,
            &kvindex::wire::BlockHash::Int(engine_hash(i, 23, 0)),
        );
        assert!(
            got.mappings.contains_key(&key),
            "{key} written by the new owner"
        );
    }
    check_scores(&replicas, &reference, 23).await;
    for replica in replicas {
        replica.stop();
    }
    reference.stop();
}

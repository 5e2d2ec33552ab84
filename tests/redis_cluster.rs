//! Redis Cluster: a real cluster of `redis-server --cluster-enabled yes` nodes on
//! free 127.0.0.1 ports, created by `redis-cli --cluster create`, holds exactly what a single
//! Redis holds after the same replay, scores the same, is reconciled by the mirror after a
//! master is killed and its replica takes over, and holds a checkpoint a restart warm-starts
//! from. Every server is killed on drop.

mod util;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use kvindex::config::Config;
use kvindex::hash::prompt_block_hashes;
use kvindex::index::Index;
use kvindex::ingest::fixture::RecordedMessage;
use kvindex::medium::TierWeights;
use kvindex::store::redis::{block_key, field_value, mapping_key, ValueFormat};
use kvindex::store::redis::{dump_target, MappingEntry, RedisDump, RedisTarget};
use kvindex::wire::Engine;
use rmpv::Value as V;
use util::own_redis::OwnRedis;
use util::{unbound_port, vllm_frames, wait_connected, wait_messages, write_fixture, FakePub};

/// Upper bound for anything these tests wait on.
const WAIT: Duration = Duration::from_secs(30);

/// A Redis Cluster of test-owned servers.
struct Cluster {
    nodes: Vec<Option<OwnRedis>>,
    /// `requirepass` (and `masterauth`) of every node.
    password: Option<String>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    /// `masters` masters with `replicas` replicas each; a node is failed after 1 s of silence.
    fn start(masters: usize, replicas: usize) -> Cluster {
        Cluster::start_with(masters, replicas, None)
    }

    /// The same, every node requiring `password`.
    fn start_with(masters: usize, replicas: usize, password: Option<&str>) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let dir_arg = dir.path().display().to_string();
        let mut nodes = Vec::new();
        for _ in 0..masters * (1 + replicas) {
            nodes.push(Some(Cluster::start_node(&dir_arg, password)));
        }
        let password = password.map(str::to_owned);
        let cluster = Cluster {
            nodes,
            password,
            _dir: dir,
        };
        let addrs: Vec<String> = cluster
            .live()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let auth: Vec<&str> = match &cluster.password {
            Some(pw) => vec!["-a", pw, "--no-auth-warning"],
            None => Vec::new(),
        };
        let out = Command::new("redis-cli")
            .args(&auth)
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("redis-cli must be installed");
        assert!(out.status.success(), "cluster create: {out:?}");
        cluster.wait_ready(masters, masters * replicas);
        cluster
    }

    /// One cluster node on free ports (chosen again while another test takes one first).
    fn start_node(dir: &str, password: Option<&str>) -> OwnRedis {
        OwnRedis::start_free(|port| {
            let mut extra = vec![
                "--cluster-enabled".to_string(),
                "yes".into(),
                "--cluster-config-file".into(),
                format!("nodes-{port}.conf"),
                "--cluster-port".into(),
                unbound_port().to_string(),
                "--cluster-node-timeout".into(),
                "1000".into(),
                "--dir".into(),
                dir.into(),
            ];
            if let Some(pw) = password {
                extra.extend(["--requirepass", pw, "--masterauth", pw].map(String::from));
            }
            extra
        })
    }

    fn live(&self) -> impl Iterator<Item = &OwnRedis> {
        self.nodes.iter().flatten()
    }

    /// A node's URL, with the password when there is one.
    fn url(&self, node: &OwnRedis) -> String {
        match &self.password {
            Some(pw) => format!("redis://:{pw}@127.0.0.1:{}/0", node.port),
            None => node.url(),
        }
    }

    /// Seed URLs of the live nodes.
    fn urls(&self) -> Vec<String> {
        self.live().map(|n| self.url(n)).collect()
    }

    fn target(&self) -> RedisTarget {
        RedisTarget::Cluster(self.urls())
    }

    /// Every live node says `cluster_state:ok` and sees `masters` masters with slots and
    /// `replicas` replicas in all, connected and in sync.
    fn wait_ready(&self, masters: usize, replicas: usize) {
        let end = Instant::now() + WAIT;
        loop {
            let ready = self.live().all(|n| {
                let url = self.url(n);
                let info = query::<String>(&url, redis::cmd("CLUSTER").arg("INFO"));
                let ok = info.is_some_and(|i| i.contains("cluster_state:ok"));
                ok && roles(&url) == Some((masters, replicas)) && synced(&url)
            });
            if ready {
                return;
            }
            assert!(Instant::now() < end, "the cluster never became ready");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The live masters' URLs.
    fn masters(&self) -> Vec<String> {
        self.live()
            .map(|n| self.url(n))
            .filter(|u| role(u).as_deref() == Some("master"))
            .collect()
    }

    /// Empties every master.
    fn flush(&self) {
        for url in self.masters() {
            let _: () = query(&url, &redis::cmd("FLUSHALL")).unwrap();
        }
    }

    /// Every key of every master, sorted.
    fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.masters().iter().flat_map(|u| all_keys(u)).collect();
        keys.sort();
        keys
    }

    /// Kills (SIGKILL) a live master; returns its URL.
    fn kill_master(&mut self) -> String {
        let victim = self.masters()[0].clone();
        let at = self
            .nodes
            .iter()
            .position(|n| n.as_ref().is_some_and(|n| self.url(n) == victim));
        if let Some(mut node) = at.and_then(|i| self.nodes[i].take()) {
            node.kill();
        }
        victim
    }
}

fn query<T: redis::FromRedisValue>(url: &str, cmd: &redis::Cmd) -> Option<T> {
    let mut conn = redis::Client::open(url).ok()?.get_connection().ok()?;
    cmd.query(&mut conn).ok()
}

/// `master` or `slave`.
fn role(url: &str) -> Option<String> {
    let reply: Vec<redis::Value> = query(url, &redis::cmd("ROLE"))?;
    redis::from_redis_value(reply.into_iter().next()?).ok()
}

/// Masters with slots and connected replicas, as `CLUSTER NODES` on `url` tells.
fn roles(url: &str) -> Option<(usize, usize)> {
    let text: String = query(url, redis::cmd("CLUSTER").arg("NODES"))?;
    let mut masters = 0;
    let mut replicas = 0;
    for line in text.lines() {
        let parts: Vec<&str> = line.split(' ').collect();
        let (flags, link) = (parts.get(2)?, parts.get(7)?);
        if flags.contains("fail") || *link != "connected" {
            continue;
        }
        if flags.contains("master") && parts.len() > 8 {
            masters += 1;
        } else if flags.contains("slave") {
            replicas += 1;
        }
    }
    Some((masters, replicas))
}

/// A master, or a replica whose replication link is up (only such a replica can take over).
fn synced(url: &str) -> bool {
    let info: Option<String> = query(url, redis::cmd("INFO").arg("replication"));
    info.is_some_and(|i| i.contains("role:master") || i.contains("master_link_status:up"))
}

fn all_keys(url: &str) -> Vec<String> {
    query(url, redis::cmd("KEYS").arg("*")).unwrap_or_default()
}

fn kvindex(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kvindex"))
        .args(args)
        .output()
        .unwrap()
}

/// `redis-dump` of `flag value` as JSON, TTLs checked and normalised.
fn redis_dump(flag: &str, value: &str) -> RedisDump {
    let out = kvindex(&["redis-dump", flag, value]);
    assert!(out.status.success(), "{out:?}");
    normalise_ttls(serde_json::from_slice(&out.stdout).unwrap())
}

fn normalise_ttls(mut d: RedisDump) -> RedisDump {
    for (key, m) in d.mappings.iter_mut() {
        assert!((86_000..=86_400).contains(&m.ttl), "{key}: TTL {}", m.ttl);
        m.ttl = 86_400;
    }
    d
}

/// Field values without their timestamp (a refresh rewrites it), TTLs normalised.
fn without_times(mut d: RedisDump) -> RedisDump {
    for fields in d.blocks.values_mut() {
        for value in fields.values_mut() {
            *value = value
                .split_once('|')
                .map_or(String::new(), |(_, m)| m.to_owned());
        }
    }
    normalise_ttls(d)
}

fn stream_fixtures() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(util::fixtures())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name.ends_with(".jsonl") && !name.ends_with(".replay.jsonl")
        })
        .collect();
    files.sort();
    files
}

#[test]
fn every_fixture_replayed_into_a_cluster_leaves_what_a_single_redis_holds() {
    let cluster = Cluster::start(3, 0);
    let single = OwnRedis::start(None, &[]);
    let seeds = cluster.urls().join(",");
    let files = stream_fixtures();
    assert!(files.len() >= 7, "{files:?}");
    let mut masters_used = 0;
    for file in &files {
        let name = file.display().to_string();
        cluster.flush();
        let _: () = query(&single.url(), &redis::cmd("FLUSHALL")).unwrap();
        let common = ["replay", &name, "--pod", "p.ns", "--model", "m"];
        let out = kvindex(&[&common[..], &["--redis", &single.url()]].concat());
        assert!(out.status.success(), "{name}: {out:?}");
        let out = kvindex(&[&common[..], &["--redis-cluster", &seeds]].concat());
        assert!(out.status.success(), "{name}: {out:?}");

        // The store time is the second each replay applied the store: compared apart.
        let want = redis_dump("--redis", &single.url());
        assert!(!want.blocks.is_empty(), "{name}: nothing replayed");
        let got = redis_dump("--redis-cluster", &seeds);
        assert_eq!(
            without_times(got.clone()),
            without_times(want.clone()),
            "{name}"
        );
        let times = |d: &RedisDump| -> Vec<u64> {
            let fields = d.blocks.values().flat_map(|f| f.values());
            fields
                .map(|v| v.split('|').next().unwrap().parse().unwrap())
                .collect()
        };
        let apart = times(&got)
            .iter()
            .zip(times(&want))
            .all(|(g, w)| g.abs_diff(w) <= 5);
        assert!(
            apart,
            "{name}: store times differ by more than the replays' gap"
        );
        // Nothing else either (but the mirror's sentinel, one per master), and the keys
        // really are spread over the masters.
        let (sentinels, keys): (Vec<String>, Vec<String>) = cluster
            .keys()
            .into_iter()
            .partition(|k| k.starts_with("kvindex:sentinel:"));
        assert_eq!(sentinels.len(), 3, "{sentinels:?}");
        let mut single_keys = all_keys(&single.url());
        single_keys.retain(|k| !k.starts_with("kvindex:sentinel:"));
        single_keys.sort();
        assert_eq!(keys, single_keys, "{name}");
        let used = cluster
            .masters()
            .iter()
            .filter(|u| !all_keys(u).is_empty())
            .count();
        masters_used = masters_used.max(used);
    }
    assert_eq!(masters_used, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scores_from_a_cluster_equal_scores_from_a_single_redis() {
    let cluster = Cluster::start(3, 0);
    let single = OwnRedis::start(None, &[]);
    let tokens: Vec<u32> = (1000..2024).collect();
    let hashes = prompt_block_hashes(&tokens, 16, 128);
    assert_eq!(hashes.len(), 64);
    // Pod a holds the whole prompt on GPU, b the first half on CPU, c every third block.
    let mut pipe = redis::pipe();
    for (i, h) in hashes.iter().enumerate() {
        let key = block_key("m", *h);
        pipe.hset(&key, "a.ns", "100|GPU").ignore();
        if i < 32 {
            pipe.hset(&key, "b.ns", "100|CPU").ignore();
        }
        if i % 3 == 0 {
            pipe.hset(&key, "c.ns", "100").ignore();
        }
    }
    let mut conn = redis::Client::open(single.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let () = pipe.query(&mut conn).unwrap();
    let mut conn = redis::cluster::ClusterClient::new(cluster.urls())
        .unwrap()
        .get_connection()
        .unwrap();
    for cmd in pipe.cmd_iter() {
        let () = cmd.query(&mut conn).unwrap();
    }
    let used = cluster
        .masters()
        .iter()
        .filter(|u| !all_keys(u).is_empty())
        .count();
    assert_eq!(used, 3, "the prompt's keys span every master");

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens.json");
    std::fs::write(&file, serde_json::to_string(&tokens).unwrap()).unwrap();
    let file = file.display().to_string();
    let score = |flag: &str, value: &str| {
        let out = kvindex(&[
            "score",
            "--model",
            "m",
            "--tokens",
            &file,
            "--pods",
            "a.ns,b.ns,c.ns,d.ns",
            flag,
            value,
            "--json",
        ]);
        assert!(out.status.success(), "{out:?}");
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let from_single = score("--redis", &single.url());
    let from_cluster = score("--redis-cluster", &cluster.urls().join(","));
    assert_eq!(from_cluster, from_single);
    let scores = from_single["scores"].as_array().unwrap();
    assert_eq!(scores[0]["pod"], "a.ns");
    assert_eq!(scores[0]["matched_blocks"], 64);
    assert!(scores
        .iter()
        .any(|s| s["pod"] == "b.ns" && s["matched_blocks"] == 32));
}

/// Message `i` of a churning vLLM stream: stores two blocks, removes one stored three
/// messages earlier.
fn churn(i: u64) -> RecordedMessage {
    let mut events = vec![
        vllm_frames::store_one(i * 2 + 1, "GPU", None),
        vllm_frames::store_one(i * 2 + 2, "CPU", None),
    ];
    if i >= 3 {
        let gone = V::from((i - 3) * 2 + 1);
        events.push(V::Array(vec![
            V::from("BlockRemoved"),
            V::Array(vec![gone]),
            V::Nil,
        ]));
    }
    RecordedMessage {
        line: i as usize + 1,
        endpoint_index: 0,
        frames: vllm_frames::message(i, events),
    }
}

/// What Redis must hold for `pod` after `messages`: the offline replay's index in kthena's
/// layout, timestamps aside.
fn expected(dir: &Path, messages: &[RecordedMessage], pod: &str, model: &str) -> RedisDump {
    let file = write_fixture(dir, "expected.jsonl", messages);
    let replay =
        kvindex::ingest::replay_files(Index::new(), pod, model, Engine::Vllm, &[file]).unwrap();
    let index = replay.index();
    let weights = TierWeights::default();
    let mut want = RedisDump::default();
    index.for_each_field(|m, std, _, value| {
        want.blocks
            .entry(block_key(&index.model_name(m), std))
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

/// Polls the cluster's dump until it equals `want`; returns the last dump seen.
async fn wait_equal(cluster: &Cluster, want: &RedisDump) -> Option<RedisDump> {
    let end = Instant::now() + WAIT;
    let mut last = None;
    while Instant::now() < end {
        if let Ok(d) = dump_target(&cluster.target(), None, None).await {
            let d = without_times(d);
            if &d == want {
                return None;
            }
            last = Some(d);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Some(last.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_over_master_is_reconciled_by_the_running_mirror() {
    const MODEL: &str = "fo-model";
    const POD: &str = "fo.test";
    let mut cluster = Cluster::start(3, 1);
    let (mut publisher, port) = FakePub::bind_any().await;
    let nodes: Vec<String> = cluster.urls().iter().map(|u| format!("'{u}'")).collect();
    let text = format!(
        "redis:\n  cluster_nodes: [{}]\n  flush_interval_ms: 2\nmetrics:\n  listen: 127.0.0.1:0\ntargets:\n{}",
        nodes.join(", "),
        util::target_yaml("fo", MODEL, "vllm", port, None, 1)
    );
    let config = Config::from_str(&text).unwrap();
    let daemon = kvindex::Daemon::start(config, None, util::test_limits())
        .await
        .unwrap();
    wait_connected(&daemon, POD, 0, 1, &mut publisher).await;
    let dir = tempfile::tempdir().unwrap();
    let msgs: Vec<RecordedMessage> = (0..60).map(churn).collect();
    for m in &msgs[..30] {
        publisher.send(&m.frames).await;
    }
    wait_messages(&daemon, POD, 0, 30).await;
    let want = expected(dir.path(), &msgs[..30], POD, MODEL);
    assert!(!want.blocks.is_empty());
    let diff = wait_equal(&cluster, &want).await;
    assert!(diff.is_none(), "before the failover: {diff:?}");

    // A master dies with the stream still flowing; its replica is promoted after the node
    // timeout, and the mirror must bring the cluster back to the index.
    let victim = cluster.kill_master();
    for m in &msgs[30..] {
        publisher.send(&m.frames).await;
    }
    wait_messages(&daemon, POD, 0, 60).await;
    // The victim's replica is a master now; the other two masters keep theirs.
    cluster.wait_ready(3, 2);
    assert!(!cluster.urls().contains(&victim));
    let want = expected(dir.path(), &msgs, POD, MODEL);
    let diff = wait_equal(&cluster, &want).await;
    assert!(
        diff.is_none(),
        "after the failover: {diff:?}\nwant {want:?}"
    );
    // The watchdog saw the master set change (a promoted replica may lack acknowledged
    // writes) and had the mirror rewritten and verified.
    let resets = || async {
        let (_, text) = util::http_get(daemon.metrics_addr, "/metrics").await;
        text.lines()
            .filter(|l| l.starts_with("kvindex_redis_resets_detected_total{kind=\"restart\"}"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    let end = Instant::now() + WAIT;
    while resets().await < 1.0 {
        assert!(Instant::now() < end, "no failover was detected");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A restart warm-starts from the checkpoint spread over the cluster.
    let before = util::strip(daemon.index.dump());
    daemon.shutdown(Duration::from_secs(5)).await;
    let config = Config::from_str(&text).unwrap();
    let again = kvindex::Daemon::start(config, None, util::test_limits())
        .await
        .unwrap();
    assert_eq!(util::strip(again.index.dump()), before);
    again.shutdown(Duration::from_secs(5)).await;
}

#[test]
fn a_cluster_with_auth_is_written_and_a_wrong_password_is_never_shown() {
    let cluster = Cluster::start_with(3, 0, Some("s3cret-pw"));
    let fixture = util::fixtures()
        .join("vllm-e01-0.9.0.jsonl")
        .display()
        .to_string();
    let seeds = cluster.urls().join(",");
    let common = ["replay", &fixture, "--pod", "p.ns", "--model", "m"];
    let out = kvindex(&[&common[..], &["--redis-cluster", &seeds]].concat());
    assert!(out.status.success(), "{out:?}");
    assert!(!redis_dump("--redis-cluster", &seeds).blocks.is_empty());

    let wrong = seeds.replace("s3cret-pw", "wrong-pw");
    let out = kvindex(&[&common[..], &["--redis-cluster", &wrong]].concat());
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("redis://:***@127.0.0.1"), "{stderr}");
    assert!(
        !stderr.contains("wrong-pw") && !stderr.contains("s3cret"),
        "{stderr}"
    );
}

/// The holder's token of `shard`'s HA lease on the cluster (routed by the key's slot).
async fn lease_holder(cluster: &Cluster, shard: kvindex::config::Shard) -> Option<String> {
    let client = redis::cluster::ClusterClient::new(cluster.urls()).ok()?;
    let mut conn = client.get_async_connection().await.ok()?;
    redis::cmd("GET")
        .arg(kvindex::store::redis::lease::lease_key(shard))
        .query_async(&mut conn)
        .await
        .ok()?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ha_lease_on_a_cluster_hands_the_writer_over() {
    const MODEL: &str = "ha-model";
    const POD: &str = "ha.test";
    let cluster = Cluster::start(3, 0);
    let (mut publisher, port) = FakePub::bind_any().await;
    let nodes: Vec<String> = cluster.urls().iter().map(|u| format!("'{u}'")).collect();
    let text = format!(
        "redis:\n  cluster_nodes: [{}]\nha:\n  lease_ttl_ms: 600\nmetrics:\n  listen: 127.0.0.1:0\ntargets:\n{}",
        nodes.join(", "),
        util::target_yaml("ha", MODEL, "vllm", port, None, 1)
    );
    let start = || async {
        let config = Config::from_str(&text).unwrap();
        kvindex::Daemon::start(config, None, util::test_limits())
            .await
            .unwrap()
    };
    let first = start().await;
    wait_connected(&first, POD, 0, 1, &mut publisher).await;
    let shard = kvindex::config::Shard::SINGLE;
    let end = Instant::now() + WAIT;
    while lease_holder(&cluster, shard).await.is_none() {
        assert!(Instant::now() < end, "nobody took the lease");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let held = lease_holder(&cluster, shard).await;
    let second = start().await;
    wait_connected(&second, POD, 0, 1, &mut publisher).await;
    let dir = tempfile::tempdir().unwrap();
    let msgs: Vec<RecordedMessage> = (0..40).map(churn).collect();
    for m in &msgs[..20] {
        publisher.send(&m.frames).await;
    }
    wait_messages(&second, POD, 0, 20).await;
    let diff = wait_equal(&cluster, &expected(dir.path(), &msgs[..20], POD, MODEL)).await;
    assert!(diff.is_none(), "written by the first: {diff:?}");

    // The first releases the lease on shutdown; the second takes it and writes the rest.
    first.shutdown(Duration::from_secs(5)).await;
    let end = Instant::now() + WAIT;
    loop {
        let now = lease_holder(&cluster, shard).await;
        if now.is_some() && now != held {
            break;
        }
        assert!(Instant::now() < end, "the standby never took the lease");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for m in &msgs[20..] {
        publisher.send(&m.frames).await;
    }
    wait_messages(&second, POD, 0, 40).await;
    let diff = wait_equal(&cluster, &expected(dir.path(), &msgs, POD, MODEL)).await;
    assert!(diff.is_none(), "written by the second: {diff:?}");
    second.shutdown(Duration::from_secs(5)).await;
}

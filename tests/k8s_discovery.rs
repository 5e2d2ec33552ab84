//! Kubernetes discovery end to end: the real kube-rs client (through a kubeconfig file)
//! against a stand-in API server on 127.0.0.1 that speaks list/watch with pod objects, and
//! fake engines on 127.0.0.1 publishing fixture frames. Redis cases run a `redis-server` of
//! their own: a daemon owns the checkpoint of its Redis db (it forgets restored sources no
//! target claims), so two daemons must never share one.

#[path = "util/kube_api.rs"]
mod kube_api;
mod util;

use std::time::Duration;

use kube_api::{FakeApiServer, FakePod};
use kvindex::config::Config;
use kvindex::ingest::subscriber::LinkState;
use kvindex::ingest::supervisor::TargetSource;
use kvindex::Daemon;
use util::own_redis::OwnRedis;
use util::*;

const E01: &str = "vllm-e01-0.9.0.jsonl";
const E03: &str = "vllm-e03-0.13.0-int.jsonl";
const S02: &str = "sglang-s02-0.5.8.post1.jsonl";
const WAIT: Duration = Duration::from_secs(15);

struct Rig {
    api: FakeApiServer,
    daemon: Daemon,
    dir: tempfile::TempDir,
    model: String,
    redis: Option<OwnRedis>,
}

impl Rig {
    /// The rig's own Redis.
    fn redis_url(&self) -> String {
        self.redis.as_ref().expect("a rig with redis").url()
    }
}

/// Options of one rig.
#[derive(Default)]
struct Setup<'a> {
    redis: bool,
    grace_s: u64,
    namespaces: Option<&'a str>,
    statics: &'a str,
    api: bool,
    reload: bool,
    /// `shard:` as flow YAML (`{index: 1, count: 2}`).
    shard: Option<&'a str>,
}

fn unique_model(tag: &str) -> String {
    format!("k8s-{tag}-{}", std::process::id())
}

fn config_text(
    s: &Setup,
    kubeconfig: &std::path::Path,
    model: &str,
    redis: Option<&OwnRedis>,
) -> String {
    let mut text = String::from("metrics:\n  listen: 127.0.0.1:0\n");
    if let Some(redis) = redis {
        text += &format!("redis:\n  url: {}\n  flush_interval_ms: 2\n", redis.url());
    }
    if s.api {
        text += "api:\n  listen: 127.0.0.1:0\n";
    }
    if let Some(shard) = s.shard {
        text += &format!("shard: {shard}\n");
    }
    text += &format!(
        "discovery:\n  kubernetes:\n    kubeconfig: {}\n    label_selector: app=engine\n    engine: vllm\n    model: {model}\n    not_ready_grace_s: {}\n",
        kubeconfig.display(),
        s.grace_s
    );
    if let Some(ns) = s.namespaces {
        text += &format!("    namespaces: {ns}\n");
    }
    text += &format!("targets:\n{}", s.statics);
    if s.statics.is_empty() {
        text = text.replace("targets:\n", "targets: []\n");
    }
    text
}

async fn rig(tag: &str, setup: Setup<'_>, pods: &[FakePod]) -> Rig {
    let api = FakeApiServer::start().await;
    for p in pods {
        api.apply(p);
    }
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.kubeconfig(dir.path());
    let model = unique_model(tag);
    let redis = setup.redis.then(|| OwnRedis::start(None, &[]));
    let text = config_text(&setup, &kubeconfig, &model, redis.as_ref());
    let path = dir.path().join("kvindex.yaml");
    std::fs::write(&path, &text).unwrap();
    let config = Config::from_str(&text).unwrap();
    let reload = setup.reload.then(|| path.clone());
    let daemon = Daemon::start(config, reload, test_limits()).await.unwrap();
    Rig {
        api,
        daemon,
        dir,
        model,
        redis,
    }
}

fn target_ids(d: &Daemon, source: TargetSource) -> Vec<String> {
    d.supervisor
        .status()
        .into_iter()
        .filter(|t| t.source == source)
        .map(|t| t.target.pod_id())
        .collect()
}

async fn wait_targets(d: &Daemon, source: TargetSource, want: &[&str]) {
    let ok = wait_until(WAIT, || target_ids(d, source) == want).await;
    assert!(
        ok,
        "{source:?} targets {:?}, want {want:?}",
        target_ids(d, source)
    );
}

/// Sends a whole fixture (all endpoint indexes to rank 0 only) and waits until it arrived.
async fn publish(d: &Daemon, publisher: &mut FakePub, pod: &str, file: &str, before: u64) {
    let msgs = messages(file, Some(0));
    for m in &msgs {
        publisher.send(&m.frames).await;
    }
    wait_messages(d, pod, 0, before + msgs.len() as u64).await;
}

/// What `replay` leaves for rank 0 of `file` as `pod`.
fn offline_rank0(file: &str, pod: &str, model: &str) -> Vec<kvindex::index::DumpEntry> {
    let dir = tempfile::tempdir().unwrap();
    let path = write_fixture(dir.path(), "rank0.jsonl", &messages(file, Some(0)));
    offline(&[path.to_str().unwrap()], pod, model)
}

async fn redis_conn(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// Block keys of `model` in Redis and the fields of `pod` among them.
async fn redis_fields(url: &str, model: &str, pod: &str) -> usize {
    let mut conn = redis_conn(url).await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("matrix:kv:block:{model}@*"))
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut n = 0;
    for k in keys {
        let v: Option<String> = redis::cmd("HGET")
            .arg(&k)
            .arg(pod)
            .query_async(&mut conn)
            .await
            .unwrap();
        n += usize::from(v.is_some());
    }
    n
}

async fn wait_redis_fields(
    url: &str,
    model: &str,
    pod: &str,
    want: impl Fn(usize) -> bool,
) -> usize {
    let end = std::time::Instant::now() + WAIT;
    loop {
        let n = redis_fields(url, model, pod).await;
        if want(n) || std::time::Instant::now() > end {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn body(reply: &str) -> &str {
    reply.split_once("\r\n\r\n").map_or("", |(_, b)| b)
}

async fn metrics_text(d: &Daemon) -> String {
    body(&http_get(d.metrics_addr, "/metrics").await.1).to_owned()
}

async fn readyz(d: &Daemon) -> (u16, String) {
    let (code, reply) = http_get(d.metrics_addr, "/readyz").await;
    (code, body(&reply).to_owned())
}

async fn wait_readyz(d: &Daemon, code: u16, contains: &str) -> String {
    let end = std::time::Instant::now() + WAIT;
    loop {
        let (c, text) = readyz(d).await;
        if (c == code && text.contains(contains)) || std::time::Instant::now() > end {
            assert_eq!(c, code, "{text}");
            assert!(text.contains(contains), "{text}");
            return text;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovered_pods_are_subscribed_indexed_and_listed_with_static_targets() {
    let ((mut pub0, p0), (mut pub1, p1)) = (FakePub::bind_any().await, FakePub::bind_any().await);
    let ps = unbound_port();
    let e0 = FakePod::new("e0", "llm", p0);
    let e1 = FakePod::new("e1", "llm", p1)
        .annotate("kvindex.io/engine", "sglang")
        .annotate("kvindex.io/model", "sg-model");
    // Not selected: another label.
    let mut other = FakePod::new("web", "llm", 1);
    other.labels.insert("app".into(), "web".into());
    // Both a static target and a discovered pod: the static one wins, named in the log.
    let clash = FakePod::new("s", "test", unbound_port());
    let statics = target_yaml("s", "static-model", "vllm", ps, None, 1);
    let setup = Setup {
        api: true,
        grace_s: 30,
        statics: &statics,
        ..Setup::default()
    };
    let r = rig("appear", setup, &[e0.clone(), e1.clone(), other, clash]).await;
    wait_targets(&r.daemon, TargetSource::Kubernetes, &["e0.llm", "e1.llm"]).await;
    assert_eq!(target_ids(&r.daemon, TargetSource::Static), ["s.test"]);

    wait_connected(&r.daemon, "e0.llm", 0, 1, &mut pub0).await;
    wait_connected(&r.daemon, "e1.llm", 0, 1, &mut pub1).await;
    publish(&r.daemon, &mut pub0, "e0.llm", E01, 0).await;
    publish(&r.daemon, &mut pub1, "e1.llm", S02, 0).await;
    let dump = strip(r.daemon.index.dump());
    assert_eq!(
        of_pod(&dump, "e0.llm"),
        offline_rank0(E01, "e0.llm", &r.model)
    );
    assert_eq!(
        of_pod(&dump, "e1.llm"),
        offline_rank0(S02, "e1.llm", "sg-model")
    );

    // GET /v1/pods lists both kinds, labelled with their source.
    let (code, reply) = http_get(r.daemon.api_addr.unwrap(), "/v1/pods").await;
    assert_eq!(code, 200, "{reply}");
    let pods: serde_json::Value = serde_json::from_str(body(&reply)).unwrap();
    let sources: Vec<(String, String, String)> = pods["pods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let s = |k: &str| p[k].as_str().unwrap().to_owned();
            (s("pod"), s("source"), s("engine"))
        })
        .collect();
    let want = [
        ("e0.llm", "kubernetes", "vllm"),
        ("e1.llm", "kubernetes", "sglang"),
        ("s.test", "static", "vllm"),
    ]
    .map(|(a, b, c)| (a.to_owned(), b.to_owned(), c.to_owned()));
    assert_eq!(sources, want);
    let endpoint = &pods["pods"][2]["endpoint"];
    assert_eq!(
        endpoint,
        &format!("tcp://127.0.0.1:{ps}"),
        "the static definition wins"
    );

    // Gauges are per process and the tests of this file share one: check the series
    // exist here; their values are per daemon above.
    let metrics = metrics_text(&r.daemon).await;
    for series in [
        "kvindex_targets{source=\"kubernetes\"}",
        "kvindex_targets{source=\"static\"}",
        "kvindex_discovery_conflicts",
    ] {
        assert!(metrics.contains(series), "{series}: {metrics}");
    }
    wait_readyz(&r.daemon, 200, "ready").await;
    r.daemon.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_replica_runs_only_the_discovered_and_static_pods_it_owns() {
    let pods: Vec<FakePod> = (0..6)
        .map(|i| FakePod::new(&format!("e{i}"), "llm", unbound_port()))
        .collect();
    let statics = target_yaml("s", "static-model", "vllm", unbound_port(), None, 1)
        + &target_yaml("t", "static-model", "vllm", unbound_port(), None, 1);
    let setup = Setup {
        redis: true,
        api: true,
        grace_s: 30,
        statics: &statics,
        shard: Some("{index: 1, count: 2}"),
        ..Setup::default()
    };
    let r = rig("shard", setup, &pods).await;
    let owned = |ids: Vec<String>| -> Vec<String> {
        ids.into_iter()
            .filter(|id| kvindex::config::Shard { index: 0, count: 2 }.owner_of(id) == 1)
            .collect()
    };
    let discovered = owned(pods.iter().map(FakePod::id).collect());
    let want: Vec<&str> = discovered.iter().map(String::as_str).collect();
    assert!(!want.is_empty() && want.len() < pods.len(), "{want:?}");
    wait_targets(&r.daemon, TargetSource::Kubernetes, &want).await;
    let statics = owned(vec!["s.test".to_owned(), "t.test".to_owned()]);
    assert_eq!(target_ids(&r.daemon, TargetSource::Static), statics);

    // `GET /v1/pods` lists every known pod with its owner; only the own ones are subscribed.
    let (code, reply) = http_get(r.daemon.api_addr.unwrap(), "/v1/pods").await;
    assert_eq!(code, 200, "{reply}");
    let listed: serde_json::Value = serde_json::from_str(body(&reply)).unwrap();
    let listed = listed["pods"].as_array().unwrap();
    assert_eq!(listed.len(), pods.len() + 2);
    for p in listed {
        let id = p["pod"].as_str().unwrap();
        let owner = kvindex::config::Shard { index: 0, count: 2 }.owner_of(id);
        assert_eq!(p["shard"], owner, "{p}");
        assert_eq!(p["state"] == "other_shard", owner != 1, "{p}");
    }
    let metrics = metrics_text(&r.daemon).await;
    assert!(
        metrics.contains("kvindex_shard_info{index=\"1\",count=\"2\"} 1"),
        "{metrics}"
    );
    r.daemon.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_readiness_flap_keeps_state_and_a_long_one_forgets_the_pod_in_redis() {
    let (mut publisher, port) = FakePub::bind_any().await;
    let mut pod = FakePod::new("flap", "llm", port);
    let setup = Setup {
        redis: true,
        grace_s: 2,
        ..Setup::default()
    };
    let r = rig("flap", setup, std::slice::from_ref(&pod)).await;
    wait_connected(&r.daemon, "flap.llm", 0, 1, &mut publisher).await;
    publish(&r.daemon, &mut publisher, "flap.llm", E01, 0).await;
    let fields = wait_redis_fields(&r.redis_url(), &r.model, "flap.llm", |n| n > 0).await;
    assert!(fields > 0);

    // A flap shorter than the grace: same subscription, same state.
    let health = r.daemon.discovery.clone().unwrap();
    pod.ready = false;
    r.api.apply(&pod);
    let in_grace = wait_until(WAIT, || health.status().not_ready == ["flap.llm"]).await;
    assert!(in_grace, "{:?}", health.status());
    pod.ready = true;
    r.api.apply(&pod);
    let ready_again = wait_until(WAIT, || health.status().not_ready.is_empty()).await;
    assert!(ready_again, "{:?}", health.status());
    let st = rank(&r.daemon, "flap.llm", 0).unwrap();
    assert_eq!((st.connects, st.state), (1, LinkState::Connected));
    assert_eq!(
        redis_fields(&r.redis_url(), &r.model, "flap.llm").await,
        fields
    );
    assert!(!of_pod(&r.daemon.index.dump(), "flap.llm").is_empty());

    // Not Ready past the grace: forgotten in the index and in Redis.
    pod.ready = false;
    r.api.apply(&pod);
    let not_ready_at = std::time::Instant::now();
    let in_grace = wait_until(WAIT, || health.status().not_ready == ["flap.llm"]).await;
    assert!(in_grace, "{:?}", health.status());
    assert_eq!(
        target_ids(&r.daemon, TargetSource::Kubernetes),
        ["flap.llm"]
    );
    wait_targets(&r.daemon, TargetSource::Kubernetes, &[]).await;
    assert!(not_ready_at.elapsed() >= Duration::from_secs(2));
    let forgotten = wait_until(WAIT, || {
        of_pod(&r.daemon.index.dump(), "flap.llm").is_empty()
    })
    .await;
    assert!(forgotten);
    assert_eq!(
        wait_redis_fields(&r.redis_url(), &r.model, "flap.llm", |n| n == 0).await,
        0
    );
    r.daemon.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_pod_is_forgotten_at_once() {
    let ((mut pub_a, pa), (mut pub_b, pb)) = (FakePub::bind_any().await, FakePub::bind_any().await);
    let (a, b) = (FakePod::new("a", "llm", pa), FakePod::new("b", "llm", pb));
    let setup = Setup {
        redis: true,
        grace_s: 300,
        namespaces: Some("[llm]"),
        ..Setup::default()
    };
    let r = rig("delete", setup, &[a.clone(), b.clone()]).await;
    wait_connected(&r.daemon, "a.llm", 0, 1, &mut pub_a).await;
    wait_connected(&r.daemon, "b.llm", 0, 1, &mut pub_b).await;
    publish(&r.daemon, &mut pub_a, "a.llm", E01, 0).await;
    publish(&r.daemon, &mut pub_b, "b.llm", E03, 0).await;
    assert!(wait_redis_fields(&r.redis_url(), &r.model, "a.llm", |n| n > 0).await > 0);
    r.api.delete(&a);
    wait_targets(&r.daemon, TargetSource::Kubernetes, &["b.llm"]).await;
    // The target leaves the running set first; its state goes once its task has stopped.
    let forgotten = wait_until(WAIT, || of_pod(&r.daemon.index.dump(), "a.llm").is_empty()).await;
    assert!(forgotten);
    assert_eq!(
        wait_redis_fields(&r.redis_url(), &r.model, "a.llm", |n| n == 0).await,
        0
    );
    assert!(!of_pod(&r.daemon.index.dump(), "b.llm").is_empty());
    r.daemon.shutdown(Duration::from_secs(5)).await;
}

/// Waits until the pod's blocks are gone, then until its new subscriber is connected.
async fn wait_dropped_and_resubscribed(d: &Daemon, pod: &str, publisher: &mut FakePub) {
    let ok = wait_until(WAIT, || of_pod(&d.index.dump(), pod).is_empty()).await;
    assert!(ok, "the old state of {pod} was not dropped");
    wait_connected(d, pod, 0, 1, publisher).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_restart_or_new_uid_drops_state_before_the_new_stream() {
    let (mut publisher, port) = FakePub::bind_any().await;
    let mut pod = FakePod::new("r", "llm", port);
    let setup = Setup {
        grace_s: 30,
        ..Setup::default()
    };
    let r = rig("restart", setup, std::slice::from_ref(&pod)).await;
    wait_connected(&r.daemon, "r.llm", 0, 1, &mut publisher).await;
    let old = messages(E03, Some(0));
    for m in &old[..3] {
        publisher.send(&m.frames).await;
    }
    wait_messages(&r.daemon, "r.llm", 0, 3).await;
    assert!(!r.daemon.index.dump().is_empty());

    // The engine container restarted; it started a few seconds "from now" (a node clock
    // ahead of ours), so every store time must land after that second.
    let started = i64::from(kvindex::ingest::unix_now()) + 5;
    pod.restarts = 1;
    pod.started_at = started;
    r.api.apply(&pod);
    wait_dropped_and_resubscribed(&r.daemon, "r.llm", &mut publisher).await;
    publish(&r.daemon, &mut publisher, "r.llm", E01, 0).await;
    let dump = r.daemon.index.dump();
    assert!(
        dump.iter().all(|e| i64::from(e.stored_at) > started),
        "{dump:?}"
    );
    assert_eq!(strip(dump), offline_rank0(E01, "r.llm", &r.model));

    // A new pod under the same name (new UID): dropped again, rebuilt from its stream.
    pod.uid = "uid-r-2".into();
    pod.restarts = 0;
    r.api.apply(&pod);
    wait_dropped_and_resubscribed(&r.daemon, "r.llm", &mut publisher).await;
    publish(&r.daemon, &mut publisher, "r.llm", E03, 0).await;
    assert_eq!(
        strip(r.daemon.index.dump()),
        offline_rank0(E03, "r.llm", &r.model)
    );
    let metrics = metrics_text(&r.daemon).await;
    for change in ["uid", "container"] {
        let line = format!("kvindex_discovery_identity_restarts_total{{change=\"{change}\"}}");
        assert!(metrics.contains(&line), "{line}: {metrics}");
    }
    r.daemon.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_with_bad_annotations_are_skipped_and_counted() {
    let good_port = unbound_port();
    let good = FakePod::new("good", "llm", good_port);
    let bad_port = FakePod::new("bad-port", "llm", 1).annotate("kvindex.io/port", "http");
    let bad_ranks = FakePod::new("bad-ranks", "llm", 2).annotate("kvindex.io/dp-ranks", "0");
    let bad_engine = FakePod::new("bad-engine", "llm", 3).annotate("kvindex.io/engine", "tgi");
    let setup = Setup {
        grace_s: 30,
        ..Setup::default()
    };
    let pods = [good, bad_port.clone(), bad_ranks, bad_engine];
    let r = rig("annotations", setup, &pods).await;
    wait_targets(&r.daemon, TargetSource::Kubernetes, &["good.llm"]).await;
    let health = r.daemon.discovery.clone().unwrap();
    let ok = wait_until(WAIT, || health.status().skipped.len() == 3).await;
    assert!(ok, "{:?}", health.status());
    let skipped = health.status().skipped;
    assert_eq!(skipped[0].0, "bad-engine.llm");
    assert!(skipped[0].1.contains("unknown engine `tgi`"), "{skipped:?}");
    assert!(skipped[1].1.starts_with("kvindex.io/port:"), "{skipped:?}");
    assert!(
        skipped[2].1.starts_with("kvindex.io/dp-ranks:"),
        "{skipped:?}"
    );
    let metrics = metrics_text(&r.daemon).await;
    for reason in ["port", "dp_ranks", "engine"] {
        let line = format!("kvindex_discovery_pods_skipped_total{{reason=\"{reason}\"}}");
        assert!(metrics.contains(&line), "{line}: {metrics}");
    }
    assert!(
        metrics.contains("kvindex_discovery_pods_skipped "),
        "{metrics}"
    );

    // Fixing the annotation makes it a target; the daemon never stopped serving.
    let fixed_port = unbound_port();
    r.api
        .apply(&bad_port.annotate("kvindex.io/port", &fixed_port.to_string()));
    wait_targets(
        &r.daemon,
        TargetSource::Kubernetes,
        &["bad-port.llm", "good.llm"],
    )
    .await;
    r.daemon.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_or_forbidding_api_server_keeps_targets_and_readyz_says_why() {
    let (mut publisher, port) = FakePub::bind_any().await;
    let pod = FakePod::new("keep", "llm", port);
    let setup = Setup {
        grace_s: 30,
        ..Setup::default()
    };
    let mut r = rig("down", setup, std::slice::from_ref(&pod)).await;
    wait_connected(&r.daemon, "keep.llm", 0, 1, &mut publisher).await;
    wait_readyz(&r.daemon, 200, "ready").await;

    r.api.stop().await;
    let why = wait_readyz(&r.daemon, 503, "unreachable").await;
    assert!(why.contains("keeping the 1 discovered targets"), "{why}");
    assert_eq!(
        target_ids(&r.daemon, TargetSource::Kubernetes),
        ["keep.llm"]
    );
    let st = rank(&r.daemon, "keep.llm", 0).unwrap();
    assert_eq!((st.connects, st.state), (1, LinkState::Connected));
    let metrics = metrics_text(&r.daemon).await;
    assert!(
        metrics.contains("kvindex_discovery_watch_errors_total{reason=\"unreachable\"}"),
        "{metrics}"
    );
    assert!(metrics.contains("kvindex_discovery_healthy "), "{metrics}");

    r.api.resume().await;
    wait_readyz(&r.daemon, 200, "ready").await;

    r.api.set_forbidden(true);
    wait_readyz(&r.daemon, 503, "forbidden").await;
    assert_eq!(
        target_ids(&r.daemon, TargetSource::Kubernetes),
        ["keep.llm"]
    );
    r.api.set_forbidden(false);
    wait_readyz(&r.daemon, 200, "ready").await;
    assert_eq!(rank(&r.daemon, "keep.llm", 0).unwrap().connects, 1);
    r.daemon.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relist_after_410_and_a_bookmark_resume_make_no_duplicate_subscriptions() {
    let ((mut pub_a, pa), (mut pub_b, pb)) = (FakePub::bind_any().await, FakePub::bind_any().await);
    let (pc, pd) = (unbound_port(), unbound_port());
    let pods = [FakePod::new("a", "llm", pa), FakePod::new("b", "llm", pb)];
    let setup = Setup {
        grace_s: 30,
        namespaces: Some("[llm]"),
        ..Setup::default()
    };
    let r = rig("relist", setup, &pods).await;
    wait_connected(&r.daemon, "a.llm", 0, 1, &mut pub_a).await;
    wait_connected(&r.daemon, "b.llm", 0, 1, &mut pub_b).await;
    assert_eq!(r.api.lists(), 1);

    // A BOOKMARK in the stream is taken in stride: the next event still arrives on the same
    // watch, with no error and no list.
    let ok = wait_until(WAIT, || !r.api.watch_rvs().is_empty()).await;
    assert!(ok);
    r.api.bookmark();
    r.api.apply(&FakePod::new("c", "llm", pc));
    wait_targets(
        &r.daemon,
        TargetSource::Kubernetes,
        &["a.llm", "b.llm", "c.llm"],
    )
    .await;
    let health = r.daemon.discovery.clone().unwrap();
    assert_eq!((r.api.lists(), health.status().errors), (1, 0));

    // 410 Gone: the watcher lists again; the same pods mean the same subscriptions.
    r.api.compact();
    let relisted = wait_until(WAIT, || r.api.lists() >= 2).await;
    assert!(relisted, "no relist after 410");
    // One more pod after the relist: once it is a target, the relist has been applied.
    r.api.apply(&FakePod::new("d", "llm", pd));
    let all = ["a.llm", "b.llm", "c.llm", "d.llm"];
    wait_targets(&r.daemon, TargetSource::Kubernetes, &all).await;
    assert!(health.status().lists >= 2, "{:?}", health.status());
    for pod in ["a.llm", "b.llm"] {
        let st = rank(&r.daemon, pod, 0).unwrap();
        assert_eq!((st.connects, st.state), (1, LinkState::Connected), "{pod}");
    }
    assert_eq!(r.daemon.supervisor.status().len(), 4);
    let metrics = metrics_text(&r.daemon).await;
    assert!(
        metrics.contains("kvindex_discovery_watch_errors_total{reason=\"gone\"}"),
        "{metrics}"
    );
    wait_readyz(&r.daemon, 200, "ready").await;
    r.daemon.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_reload_of_static_targets_keeps_the_discovered_ones() {
    let ((mut pub_d, pd), ps) = (FakePub::bind_any().await, unbound_port());
    let setup = Setup {
        grace_s: 30,
        reload: true,
        ..Setup::default()
    };
    let r = rig("reload", setup, &[FakePod::new("d", "llm", pd)]).await;
    wait_connected(&r.daemon, "d.llm", 0, 1, &mut pub_d).await;
    let path = r.dir.path().join("kvindex.yaml");
    let text = std::fs::read_to_string(&path).unwrap().replace(
        "targets: []\n",
        &format!("targets:\n{}", target_yaml("s", "m", "vllm", ps, None, 1)),
    );
    std::fs::write(&path, text).unwrap();
    wait_targets(&r.daemon, TargetSource::Static, &["s.test"]).await;
    assert_eq!(target_ids(&r.daemon, TargetSource::Kubernetes), ["d.llm"]);
    assert_eq!(rank(&r.daemon, "d.llm", 0).unwrap().connects, 1);
    r.daemon.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_kubeconfig_fails_the_start_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing-kubeconfig");
    let text = format!(
        "metrics:\n  listen: 127.0.0.1:0\ndiscovery:\n  kubernetes:\n    kubeconfig: {}\n",
        path.display()
    );
    let config = Config::from_str(&text).unwrap();
    let Err(err) = Daemon::start(config, None, test_limits()).await else {
        panic!("started with a missing kubeconfig");
    };
    let mut text = err.to_string();
    let mut cause = std::error::Error::source(&err);
    while let Some(c) = cause {
        text += &format!(": {c}");
        cause = c.source();
    }
    assert!(text.contains("Kubernetes discovery"), "{text}");
    assert!(text.contains("missing-kubeconfig"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_library_entry_point_takes_a_kube_config_of_its_own() {
    use kvindex::index::Index;
    use kvindex::ingest::discovery::{self, DiscoveryHealth};
    use kvindex::ingest::supervisor::Supervisor;

    let api = FakeApiServer::start().await;
    api.apply(&FakePod::new("lib", "llm", unbound_port()));
    let section =
        "discovery:\n  kubernetes:\n    engine: vllm\n    model: m\n    namespaces: [llm]\n";
    let config = Config::from_str(section).unwrap().discovery.unwrap();
    let client = kube::Client::try_from(kube::Config::new(api.url().parse().unwrap())).unwrap();
    let cancel = tokio_util::sync::CancellationToken::new();
    let supervisor = Supervisor::new(Index::new(), None, cancel.child_token(), test_limits());
    let health = DiscoveryHealth::default();
    let running = discovery::spawn(
        config,
        client,
        supervisor.clone(),
        health.clone(),
        cancel.child_token(),
    );
    let found = wait_until(WAIT, || {
        supervisor
            .status()
            .iter()
            .map(|t| t.target.pod_id())
            .collect::<Vec<_>>()
            == ["lib.llm"]
    })
    .await;
    assert!(found, "{:?}", health.status());
    assert_eq!(health.not_ready_reason(), None);
    let endpoint = supervisor.status()[0].target.endpoint.to_string();
    assert!(endpoint.starts_with("tcp://127.0.0.1:"), "{endpoint}");
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(5), running.task)
        .await
        .expect("discovery stops when cancelled")
        .unwrap();
    supervisor.shutdown(Duration::from_secs(2)).await;
}

/// Messages of `file` (rank 0) with their seq renumbered from `first`.
fn renumbered(file: &str, first: u64) -> Vec<kvindex::ingest::fixture::RecordedMessage> {
    let mut msgs = messages(file, Some(0));
    for (i, m) in msgs.iter_mut().enumerate() {
        m.frames[1] = (first + i as u64).to_be_bytes().to_vec();
    }
    msgs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_uid_while_kvindex_was_down_drops_the_checkpointed_state_even_past_the_watermark() {
    let (mut publisher, port) = FakePub::bind_any().await;
    let mut pod = FakePod::new("w", "llm", port);
    let setup = Setup {
        redis: true,
        grace_s: 30,
        ..Setup::default()
    };
    let Rig {
        api,
        daemon,
        dir,
        model,
        redis,
    } = rig("warm-uid", setup, std::slice::from_ref(&pod)).await;
    wait_connected(&daemon, "w.llm", 0, 1, &mut publisher).await;
    publish(&daemon, &mut publisher, "w.llm", E01, 0).await;
    assert!(!daemon.index.dump().is_empty());
    let old_last = messages(E01, Some(0)).len() as u64 - 1;
    daemon.shutdown(Duration::from_secs(5)).await;

    // While kvindex is down the pod is replaced (new UID) and its new engine has already
    // published past the old watermark: seq alone would take it for the old stream going on.
    pod.uid = "uid-w-2".into();
    api.apply(&pod);
    let text = std::fs::read_to_string(dir.path().join("kvindex.yaml")).unwrap();
    let config = Config::from_str(&text).unwrap();
    let daemon = Daemon::start(config, None, test_limits()).await.unwrap();
    wait_connected(&daemon, "w.llm", 0, 1, &mut publisher).await;
    let new_run = renumbered(E03, old_last + 1);
    for m in &new_run {
        publisher.send(&m.frames).await;
    }
    wait_messages(&daemon, "w.llm", 0, new_run.len() as u64).await;
    assert_eq!(
        strip(daemon.index.dump()),
        offline_rank0(E03, "w.llm", &model)
    );
    let url = redis.as_ref().unwrap().url();
    let fields = wait_redis_fields(&url, &model, "w.llm", |n| {
        n == offline_rank0(E03, "w.llm", &model).len()
    })
    .await;
    assert_eq!(fields, offline_rank0(E03, "w.llm", &model).len());
    let metrics = metrics_text(&daemon).await;
    assert!(
        metrics.contains("kvindex_warm_starts_total{engine=\"vllm\",outcome=\"restarted\"} 1"),
        "{metrics}"
    );
    daemon.shutdown(Duration::from_secs(5)).await;
}

//! Operating the daemon: the shipped example config, hot reload, metrics and health
//! endpoints, `record`, and 200 publishing targets on one daemon.

mod util;

use std::time::Duration;

use kvindex::config::Config;
use util::*;

const E01: &str = "vllm-e01-0.9.0.jsonl";

#[test]
fn shipped_example_config_loads() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/kvindex.yaml");
    let config = Config::from_path(&path, &kvindex::config::NoEnv).unwrap();
    assert_eq!(config.targets.len(), 2);
    assert_eq!(config.targets[0].dp_ranks, 2);
    assert!(config.redis.is_some() && config.api.is_some());
}

#[test]
fn schema_is_json_and_lists_every_section() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/config.schema.json");
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    for key in [
        "redis",
        "api",
        "metrics",
        "tier_weights",
        "unknown_medium_weight",
        "targets",
    ] {
        assert!(schema["properties"].get(key).is_some(), "{key}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_adds_and_removes_targets_at_run_time() {
    let (mut pub_a, pa) = FakePub::bind_any().await;
    let (mut pub_b, pb) = FakePub::bind_any().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kvindex.yaml");
    let write = |targets: String| {
        std::fs::write(
            &path,
            format!("metrics:\n  listen: 127.0.0.1:0\ntargets:\n{targets}"),
        )
        .unwrap();
    };
    write(target_yaml("a", "m", "vllm", pa, None, 1));
    let config = Config::from_path(&path, &kvindex::config::NoEnv).unwrap();
    let daemon = kvindex::Daemon::start(config, Some(path.clone()), test_limits())
        .await
        .unwrap();
    wait_connected(&daemon, "a.test", 0, 1, &mut pub_a).await;
    let msgs = messages(E01, None);
    for m in &msgs {
        pub_a.send(&m.frames).await;
    }
    wait_messages(&daemon, "a.test", 0, msgs.len() as u64).await;
    assert!(!of_pod(&daemon.index.dump(), "a.test").is_empty());

    write(target_yaml("b", "m", "vllm", pb, None, 1));
    let ids = |d: &kvindex::Daemon| {
        d.supervisor
            .status()
            .iter()
            .map(|t| t.target.pod_id())
            .collect::<Vec<_>>()
    };
    assert!(
        wait_until(Duration::from_secs(10), || ids(&daemon) == ["b.test"]).await,
        "{:?}",
        ids(&daemon)
    );
    // The removed pod is forgotten; the added one ingests.
    assert!(of_pod(&daemon.index.dump(), "a.test").is_empty());
    assert!(daemon.index.sources_of_pod("a.test").is_empty());
    wait_connected(&daemon, "b.test", 0, 1, &mut pub_b).await;
    for m in &msgs {
        pub_b.send(&m.frames).await;
    }
    wait_messages(&daemon, "b.test", 0, msgs.len() as u64).await;
    assert_eq!(strip(daemon.index.dump()), offline(&[E01], "b.test", "m"));

    // An invalid file is refused (the reload ran: the refusal is counted) and the running
    // target stays.
    let refused_before = reloads_refused(daemon.metrics_addr).await;
    std::fs::write(&path, "targets: [{pod: x}]\n").unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while reloads_refused(daemon.metrics_addr).await <= refused_before {
        assert!(
            std::time::Instant::now() < deadline,
            "the invalid rewrite was never refused"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(ids(&daemon), ["b.test"]);
    daemon.shutdown(Duration::from_secs(5)).await;
}

/// `kvindex_reloads_refused_total` as served on `/metrics` (0 before the first refusal).
async fn reloads_refused(addr: std::net::SocketAddr) -> u64 {
    let (code, body) = http_get(addr, "/metrics").await;
    assert_eq!(code, 200);
    body.lines()
        .find_map(|l| l.strip_prefix("kvindex_reloads_refused_total "))
        .map_or(0, |v| v.trim().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_health_and_readiness_are_served() {
    let (mut publisher, port) = FakePub::bind_any().await;
    let daemon = start_daemon(&target_yaml("mx", "m", "vllm", port, None, 1), None).await;
    wait_connected(&daemon, "mx.test", 0, 1, &mut publisher).await;
    for m in messages(E01, None) {
        publisher.send(&m.frames).await;
    }
    wait_messages(&daemon, "mx.test", 0, 6).await;
    assert_eq!(http_get(daemon.metrics_addr, "/healthz").await.0, 200);
    assert_eq!(http_get(daemon.metrics_addr, "/readyz").await.0, 200);
    let (code, body) = http_get(daemon.metrics_addr, "/metrics").await;
    assert_eq!(code, 200);
    assert!(body.contains("kvindex_messages_total"), "{body}");
    assert!(body.contains("kvindex_events_total"), "{body}");
    daemon.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_writes_what_replay_reads() {
    let (mut publisher, port) = FakePub::bind_any().await;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("rec.jsonl");
    let msgs = messages(E01, None);
    let mut recorder = std::process::Command::new(env!("CARGO_BIN_EXE_kvindex"))
        .args([
            "record",
            "--endpoint",
            &format!("tcp://127.0.0.1:{port}"),
            "--out",
        ])
        .arg(&out)
        .args(["--duration", "20", "--count", &msgs.len().to_string()])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Resend until the recorder has joined (slow joiner): it stops after `count` lines, so
    // repeat the whole stream until it exits.
    let status = loop {
        if let Some(status) = recorder.try_wait().unwrap() {
            break status;
        }
        for m in &msgs {
            publisher.send(&m.frames).await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "{status}");
    let back = kvindex::ingest::fixture::read_file(&out).unwrap();
    assert_eq!(back.len(), msgs.len());
    assert!(back.iter().all(|m| m.as_ref().unwrap().frames.len() == 3));
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_publishing_targets_lose_nothing() {
    const N: usize = 200;
    let before = rss_kib();
    let mut pubs = Vec::new();
    let mut ports = Vec::new();
    for _ in 0..N {
        let (p, port) = FakePub::bind_any().await;
        pubs.push(p);
        ports.push(port);
    }
    let yaml: String = ports
        .iter()
        .enumerate()
        .map(|(i, p)| target_yaml(&format!("p{i}"), "m", "vllm", *p, None, 1))
        .collect();
    let bound = rss_kib();
    let daemon = start_daemon(&yaml, None).await;
    for (i, p) in pubs.iter_mut().enumerate() {
        wait_connected(&daemon, &format!("p{i}.test"), 0, 1, p).await;
    }
    let connected = rss_kib();
    eprintln!(
        "RSS KiB: start {before}, {N} PUBs bound {bound}, daemon connected to all {connected}"
    );
    let msgs = messages(E01, None);
    let tasks: Vec<_> = pubs
        .into_iter()
        .map(|mut p| {
            let msgs = msgs.clone();
            tokio::spawn(async move {
                for m in &msgs {
                    p.send(&m.frames).await;
                }
                p
            })
        })
        .collect();
    let mut keep = Vec::new();
    for t in tasks {
        keep.push(t.await.unwrap());
    }
    for i in 0..N {
        wait_messages(&daemon, &format!("p{i}.test"), 0, msgs.len() as u64).await;
    }
    let want = offline(&[E01], "x", "m");
    let dump = strip(daemon.index.dump());
    for i in 0..N {
        let pod = format!("p{i}.test");
        let got: Vec<_> = of_pod(&dump, &pod)
            .into_iter()
            .map(|mut e| {
                e.pod = "x".into();
                e
            })
            .collect();
        assert_eq!(got, want, "{pod}");
        assert_eq!(rank(&daemon, &pod, 0).unwrap().stats.seq_gaps, 0);
    }
    let after = rss_kib();
    let daemon_kib = after.saturating_sub(bound);
    eprintln!("RSS KiB after ingest {after}: the daemon's share (after - PUBs bound) {daemon_kib}");
    // Bounded memory: the daemon's share (the test's own PUB sockets take ~4 MB each in the
    // zeromq crate, so they are measured apart); a ceiling that catches a per-target leak.
    assert!(daemon_kib < 128 * 1024, "daemon RSS share {daemon_kib} KiB");
    daemon.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_scores_what_the_daemon_ingested() {
    let (mut publisher, port) = FakePub::bind_any().await;
    let text = format!(
        "api:\n  listen: 127.0.0.1:0\nmetrics:\n  listen: 127.0.0.1:0\ntargets:\n{}",
        target_yaml("ap", "m", "vllm", port, None, 1)
    );
    let config = Config::from_str(&text).unwrap();
    let daemon = kvindex::Daemon::start(config, None, test_limits())
        .await
        .unwrap();
    let api = daemon.api_addr.expect("api listener bound");
    wait_connected(&daemon, "ap.test", 0, 1, &mut publisher).await;
    let msgs = messages(E01, None);
    for m in &msgs {
        publisher.send(&m.frames).await;
    }
    wait_messages(&daemon, "ap.test", 0, msgs.len() as u64).await;
    // The stream ends with the 3-block system prompt stored again: its tokens score 100.
    let want: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("vllm-e01-0.9.0.expected.json")).unwrap(),
    )
    .unwrap();
    let last = want["batches"].as_array().unwrap().last().unwrap();
    let tokens = &last["events"][0]["token_ids"];
    let body =
        serde_json::json!({"model": "m", "tokens": tokens, "pods": ["ap.test", "other.test"]});
    let (code, reply) = http_request(api, "POST", "/v1/score", &body.to_string()).await;
    assert_eq!(code, 200, "{reply}");
    let json: serde_json::Value =
        serde_json::from_str(reply.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(json["total_blocks"], 3);
    assert_eq!(json["scores"][0]["pod"], "ap.test");
    assert_eq!(json["scores"][0]["score"], 100);
    assert_eq!(json["scores"].as_array().unwrap().len(), 1);
    let (code, pods) = http_get(api, "/v1/pods").await;
    assert_eq!(code, 200);
    assert!(pods.contains("ap.test"), "{pods}");
    daemon.shutdown(Duration::from_secs(5)).await;
}

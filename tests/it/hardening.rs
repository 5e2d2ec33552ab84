//! Hardening: auth that cannot be switched off by accident, bounded model/LoRA
//! names, HTTP connection limits and timeouts, frame size caps and true gauges — each on
//! the built binary or the daemon, over real sockets on 127.0.0.1.

use crate::util;

use std::process::Command;
use std::time::{Duration, Instant};

use kvindex::config::Config;
use kvindex::Daemon;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use util::*;

const E03: &str = "vllm-e03-0.13.0-int.jsonl";

/// Starts a daemon from config text (metrics on an ephemeral port).
async fn daemon(text: &str) -> Daemon {
    let text = format!("metrics:\n  listen: 127.0.0.1:0\n{text}");
    let config = Config::from_str(&text).unwrap();
    Daemon::start(config, None, test_limits()).await.unwrap()
}

/// What offline replay of rank 0's messages of `file` leaves, as pod `a.test`, model `m`.
fn offline_rank0(file: &str) -> Vec<kvindex::index::DumpEntry> {
    let dir = tempfile::tempdir().unwrap();
    let path = write_fixture(dir.path(), "rank0.jsonl", &messages(file, Some(0)));
    offline(&[path.to_str().unwrap()], "a.test", "m")
}

/// Whether the server closed `stream` within `timeout` (EOF or reset; data read is ignored).
async fn closed_within(stream: &mut TcpStream, timeout: Duration) -> bool {
    let end = tokio::time::Instant::now() + timeout;
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout_at(end, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
        }
    }
}

/// A batch of `BlockStored` events, one per hash: a 16-token block stored under LoRA
/// `lora-{hash}`.
fn lora_stores(seq: u64, hashes: std::ops::Range<u64>) -> Vec<Vec<u8>> {
    let events = hashes
        .map(|h| vllm_frames::store_one(h, "GPU", Some(format!("lora-{h}"))))
        .collect();
    vllm_frames::message(seq, events)
}

/// A config file in a temporary directory (kept alive by the returned guard).
fn config_file(text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kvindex.yaml");
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

#[test]
fn an_empty_api_token_from_the_environment_exits_64_naming_the_variable() {
    let (_dir, path) = config_file("api:\n  listen: 127.0.0.1:0\n  token: secret\n");
    for command in ["serve", "check-config"] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kvindex"));
        cmd.arg(command);
        if command == "serve" {
            cmd.arg("--config");
        }
        let out = cmd
            .arg(&path)
            .env("KVINDEX_API_TOKEN", "")
            .env("KVINDEX_METRICS_LISTEN", "127.0.0.1:0")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{command}: {stderr}");
        assert!(stderr.contains("KVINDEX_API_TOKEN"), "{command}: {stderr}");
    }
}

#[test]
fn check_config_shows_the_environment_token_as_set_never_its_value() {
    let (_dir, path) = config_file("api:\n  listen: 127.0.0.1:0\n");
    let run = |token: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kvindex"));
        cmd.arg("check-config")
            .arg(&path)
            .env_remove("KVINDEX_API_TOKEN");
        if let Some(t) = token {
            cmd.env("KVINDEX_API_TOKEN", t);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(!json.to_string().contains("s3cret"), "{json}");
        json["api"]["token"].as_str().unwrap().to_owned()
    };
    assert_eq!(run(None), "not set");
    assert_eq!(run(Some("s3cret")), "set");
}

/// Idle connections must not stay open for good and starve ingest of descriptors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_api_connections_are_closed_while_a_target_is_indexed() {
    let (mut pubs, port) = FakePub::bind_ranks(1).await;
    let yaml = format!(
        "api:\n  listen: 127.0.0.1:0\n  header_read_timeout_ms: 600\ntargets:\n{}",
        target_yaml("a", "m", "vllm", port, None, 1)
    );
    let d = daemon(&yaml).await;
    let api = d.api_addr.unwrap();
    wait_connected(&d, "a.test", 0, 1, &mut pubs[0]).await;
    let mut idle = Vec::new();
    for _ in 0..1000 {
        idle.push(TcpStream::connect(api).await.unwrap());
    }
    let stream = messages(E03, Some(0));
    for m in &stream {
        pubs[0].send(&m.frames).await;
    }
    // A new client is served while the idle ones are open.
    let (code, body) = http_get(api, "/v1/pods").await;
    assert_eq!(code, 200, "{body}");
    wait_messages(&d, "a.test", 0, stream.len() as u64).await;
    assert_eq!(strip(d.index.dump()), offline_rank0(E03));
    let closes = idle
        .iter_mut()
        .map(|s| closed_within(s, Duration::from_secs(10)));
    let closed = futures::future::join_all(closes).await;
    let open = closed.iter().filter(|c| !**c).count();
    assert_eq!(open, 0, "{open} idle connections are still open");
    let (code, _) = http_get(api, "/v1/pods").await;
    assert_eq!(code, 200);
    d.shutdown(Duration::from_secs(5)).await;
}

/// A client sending its request head a byte at a time is cut off by the header timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_header_client_is_cut_off() {
    let d = daemon("api:\n  listen: 127.0.0.1:0\n  header_read_timeout_ms: 300\n").await;
    let api = d.api_addr.unwrap();
    let mut slow = TcpStream::connect(api).await.unwrap();
    let started = Instant::now();
    slow.write_all(b"GET /v1/pods HTTP/1.1\r\n").await.unwrap();
    let mut cut = false;
    // Far longer than the timeout: one header byte every 20 ms for up to 10 s.
    while started.elapsed() < Duration::from_secs(10) {
        if slow.write_all(b"X").await.is_err()
            || closed_within(&mut slow, Duration::from_millis(20)).await
        {
            cut = true;
            break;
        }
    }
    assert!(cut, "the slow client was never cut off");
    let (code, _) = http_get(api, "/v1/pods").await;
    assert_eq!(code, 200);
    d.shutdown(Duration::from_secs(5)).await;
}

/// At `max_connections` the listener stops accepting; a closed connection makes room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_cap_wait_for_room() {
    let d = daemon("api:\n  listen: 127.0.0.1:0\n  max_connections: 4\n").await;
    let api = d.api_addr.unwrap();
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(TcpStream::connect(api).await.unwrap());
    }
    let waiting = tokio::spawn(http_get(api, "/v1/pods"));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiting.is_finished(), "served past the cap");
    held.pop();
    let (code, _) = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("served once a connection closed")
        .unwrap();
    assert_eq!(code, 200);
    drop(held);
    d.shutdown(Duration::from_secs(5)).await;
}

/// A message with a frame over `ingest.max_frame_bytes` is dropped and counted; its seq is
/// used up, so the next message applies without a gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_frame_is_dropped_and_counted_and_the_next_applied() {
    let (mut pubs, port) = FakePub::bind_ranks(1).await;
    let yaml = format!(
        "ingest:\n  max_frame_bytes: 65536\ntargets:\n{}",
        target_yaml("a", "m", "vllm", port, None, 1)
    );
    let d = daemon(&yaml).await;
    wait_connected(&d, "a.test", 0, 1, &mut pubs[0]).await;
    let stream = messages(E03, Some(0));
    // The stream with an oversized message slipped in after the first: later seqs shift.
    let mut sent = 0;
    for (i, m) in stream.iter().enumerate() {
        let mut frames = m.frames.clone();
        let seq = u64::from_be_bytes(frames[1].clone().try_into().unwrap());
        if i > 0 {
            frames[1] = (seq + 1).to_be_bytes().to_vec();
        }
        pubs[0].send(&frames).await;
        sent += 1;
        if i == 0 {
            let big = vec![
                b"kv".to_vec(),
                (seq + 1).to_be_bytes().to_vec(),
                vec![0x90; 70_000],
            ];
            pubs[0].send(&big).await;
            sent += 1;
        }
    }
    wait_messages(&d, "a.test", 0, sent).await;
    let st = rank(&d, "a.test", 0).unwrap().stats;
    assert_eq!(st.decode_errors.get("frame_too_large"), Some(&1), "{st:?}");
    assert_eq!((st.seq_gaps, st.source_resets), (0, 0), "{st:?}");
    assert_eq!(strip(d.index.dump()), offline_rank0(E03));
    d.shutdown(Duration::from_secs(5)).await;
}

/// A target's own `max_frame_bytes` caps its frames whatever `ingest.max_frame_bytes` lets
/// the others take: the same ~9 kB message is applied on one target and dropped and counted
/// on the other, whose next message still applies without a gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_targets_own_frame_cap_overrides_the_ingest_one() {
    let (mut pubs_a, port_a) = FakePub::bind_ranks(1).await;
    let (mut pubs_b, port_b) = FakePub::bind_ranks(1).await;
    let open = target_yaml("a", "m", "vllm", port_a, None, 1);
    let capped = target_yaml("b", "m", "vllm", port_b, None, 1) + "    max_frame_bytes: 4096\n";
    let d = daemon(&format!(
        "ingest:\n  max_frame_bytes: 1048576\ntargets:\n{open}{capped}"
    ))
    .await;
    wait_connected(&d, "a.test", 0, 1, &mut pubs_a[0]).await;
    wait_connected(&d, "b.test", 0, 1, &mut pubs_b[0]).await;
    let events = (1..=100).map(|h| vllm_frames::store_one(h, "GPU", None));
    let big = vllm_frames::message(0, events.collect());
    assert!((4096..1 << 20).contains(&big[2].len()), "{}", big[2].len());
    let small = vllm_frames::message(1, vec![vllm_frames::store_one(1000, "GPU", None)]);
    for publisher in [&mut pubs_a[0], &mut pubs_b[0]] {
        publisher.send(&big).await;
        publisher.send(&small).await;
    }
    wait_messages(&d, "a.test", 0, 2).await;
    wait_messages(&d, "b.test", 0, 2).await;
    let (a, b) = (
        rank(&d, "a.test", 0).unwrap(),
        rank(&d, "b.test", 0).unwrap(),
    );
    assert_eq!(a.stats.decode_errors.get("frame_too_large"), None, "{a:?}");
    assert_eq!(
        b.stats.decode_errors.get("frame_too_large"),
        Some(&1),
        "{b:?}"
    );
    assert_eq!(b.stats.seq_gaps, 0, "{b:?}");
    let held = |pod: &str| d.index.dump().iter().filter(|e| e.pod == pod).count();
    assert_eq!((held("a.test"), held("b.test")), (101, 1));
    d.shutdown(Duration::from_secs(5)).await;
}

/// 20k distinct LoRA names over ZMQ: the first `max_models_per_source` are indexed, the
/// rest dropped and counted; once their blocks leave, the names are freed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lora_names_past_the_cap_are_dropped_and_counted() {
    const NAMES: u64 = 20_000;
    const CAP: u64 = 64;
    let (mut pubs, port) = FakePub::bind_ranks(1).await;
    let yaml = format!(
        "ingest:\n  max_models_per_source: {CAP}\ntargets:\n{}",
        target_yaml("a", "m", "vllm", port, None, 1)
    );
    let d = daemon(&yaml).await;
    wait_connected(&d, "a.test", 0, 1, &mut pubs[0]).await;
    // The base model holds one of the cap's places only while it has blocks: none here.
    const PER_MESSAGE: u64 = 100;
    let started = Instant::now();
    for seq in 0..NAMES / PER_MESSAGE {
        let first = seq * PER_MESSAGE;
        pubs[0]
            .send(&lora_stores(seq, first..first + PER_MESSAGE))
            .await;
    }
    wait_messages(&d, "a.test", 0, NAMES / PER_MESSAGE).await;
    let elapsed = started.elapsed();
    let st = rank(&d, "a.test", 0).unwrap().stats;
    assert_eq!(st.apply.too_many_models, NAMES - CAP, "{st:?}");
    assert_eq!(
        st.invalid_events.get("too_many_models"),
        Some(&(NAMES - CAP))
    );
    assert_eq!(d.index.dump().len() as u64, CAP);
    // One model per base source plus the LoRAs held.
    assert_eq!(d.index.live_models() as u64, CAP + 1);
    println!("20k LoRA stores over ZMQ: {elapsed:?}");
    d.shutdown(Duration::from_secs(5)).await;
}

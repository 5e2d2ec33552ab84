//! The daemon over real ZMQ sockets on 127.0.0.1: fixture streams in, index out, and every
//! seq fault of docs/architecture.md §3 (restart, gaps with and without replay, bad replays, bad frames).

use crate::util;

use std::time::Duration;

use util::*;

const E03: &str = "vllm-e03-0.13.0-int.jsonl";
const E01: &str = "vllm-e01-0.9.0.jsonl";
const S02: &str = "sglang-s02-0.5.8.post1.jsonl";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_targets_index_equals_offline_replay() {
    let (a, pa) = FakePub::bind_ranks(1).await;
    let (b, pb) = FakePub::bind_ranks(2).await;
    let (c, pc) = FakePub::bind_ranks(2).await;
    let mut pubs = [a, b, c];
    let yaml = target_yaml("a", "m-a", "vllm", pa, None, 1)
        + &target_yaml("b", "m-b", "sglang", pb, None, 2)
        + &target_yaml("c", "m-c", "vllm", pc, None, 2);
    let daemon = start_daemon(&yaml, None).await;
    for (pod, ranks) in ["a.test", "b.test", "c.test"]
        .into_iter()
        .zip(pubs.iter_mut())
    {
        for (r, publisher) in ranks.iter_mut().enumerate() {
            wait_connected(&daemon, pod, r, 1, publisher).await;
        }
    }
    for (i, file) in [E01, S02, E03].iter().enumerate() {
        for m in messages(file, None) {
            pubs[i][m.endpoint_index as usize].send(&m.frames).await;
        }
    }
    for (pod, file) in [("a.test", E01), ("b.test", S02), ("c.test", E03)] {
        for r in 0..=1u32 {
            let n = messages(file, Some(r)).len() as u64;
            if n > 0 {
                wait_messages(&daemon, pod, r as usize, n).await;
            }
        }
    }
    let mut want = offline(&[E01], "a.test", "m-a");
    want.extend(offline(&[S02], "b.test", "m-b"));
    want.extend(offline(&[E03], "c.test", "m-c"));
    want.sort();
    assert!(!want.is_empty());
    assert_eq!(strip(daemon.index.dump()), want);
    daemon.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_before_bind_then_ingests() {
    let port = unbound_port();
    let daemon = start_daemon(&target_yaml("late", "m", "vllm", port, None, 1), None).await;
    // Nothing listens yet: the subscriber's first connects are refused at once and it
    // backs off (50 ms first); bind once it has been through that at least once.
    assert!(
        wait_until(Duration::from_secs(5), || rank(&daemon, "late.test", 0)
            .is_some())
        .await
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut publisher = FakePub::bind(port).await;
    wait_connected(&daemon, "late.test", 0, 1, &mut publisher).await;
    let msgs = messages(E01, None);
    for m in &msgs {
        publisher.send(&m.frames).await;
    }
    wait_messages(&daemon, "late.test", 0, msgs.len() as u64).await;
    assert_eq!(
        strip(daemon.index.dump()),
        offline(&[E01], "late.test", "m")
    );
    daemon.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publisher_restart_drops_old_blocks_and_indexes_new() {
    let (mut first, port) = FakePub::bind_any().await;
    let daemon = start_daemon(&target_yaml("r", "m", "vllm", port, None, 1), None).await;
    wait_connected(&daemon, "r.test", 0, 1, &mut first).await;
    let old = messages(E03, Some(0));
    for m in &old[..3] {
        first.send(&m.frames).await;
    }
    wait_messages(&daemon, "r.test", 0, 3).await;
    assert!(!daemon.index.dump().is_empty());
    first.close().await;
    let mut second = FakePub::bind(port).await;
    wait_connected(&daemon, "r.test", 0, 2, &mut second).await;
    let new = messages(E01, None);
    for m in &new {
        second.send(&m.frames).await;
    }
    wait_messages(&daemon, "r.test", 0, 3 + new.len() as u64).await;
    let st = rank(&daemon, "r.test", 0).unwrap();
    assert_eq!(st.stats.restarts, 1);
    assert_eq!(strip(daemon.index.dump()), offline(&[E01], "r.test", "m"));
    daemon.shutdown(Duration::from_secs(5)).await;
}

/// Publishes rank 0 of E03 skipping seqs 2 and 3; returns the daemon after it saw the rest,
/// and the publisher, still bound: dropping it would disconnect the subscriber, and a test
/// that checks the link is still up after a failed replay would then race the disconnect.
async fn gap_run(mode: Option<RouterMode>) -> (kvindex::Daemon, FakePub) {
    let (mut publisher, port) = FakePub::bind_any().await;
    let stream = messages(E03, Some(0));
    let router = match mode {
        Some(mode) => Some(spawn_router(stream.clone(), mode).await),
        None => None,
    };
    let replay = router.as_ref().map(|(_, port)| *port);
    let daemon = start_daemon(&target_yaml("g", "m", "vllm", port, replay, 1), None).await;
    wait_connected(&daemon, "g.test", 0, 1, &mut publisher).await;
    let sent: Vec<_> = stream
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 2 && *i != 3)
        .map(|(_, m)| m.clone())
        .collect();
    for m in &sent {
        publisher.send(&m.frames).await;
    }
    wait_messages(&daemon, "g.test", 0, sent.len() as u64).await;
    // Keep the publisher open until the daemon is done with the last seq.
    let last = stream.len() as u64 - 1;
    assert!(
        wait_until(Duration::from_secs(10), || {
            rank(&daemon, "g.test", 0).is_some_and(|s| s.last_seq == Some(last))
        })
        .await
    );
    (daemon, publisher)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gap_is_filled_by_replay_of_either_shape() {
    for mode in [RouterMode::Old, RouterMode::New] {
        let (daemon, _publisher) = gap_run(Some(mode)).await;
        let st = rank(&daemon, "g.test", 0).unwrap();
        assert_eq!(st.stats.seq_gaps, 1, "{mode:?}");
        assert_eq!(
            (st.stats.replays_succeeded, st.stats.source_resets),
            (1, 0),
            "{mode:?}"
        );
        let dir = tempfile::tempdir().unwrap();
        let full = write_fixture(dir.path(), "full.jsonl", &messages(E03, Some(0)));
        assert_eq!(
            strip(daemon.index.dump()),
            offline(&[full.to_str().unwrap()], "g.test", "m"),
            "{mode:?}"
        );
        daemon.shutdown(Duration::from_secs(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gap_without_replay_endpoint_resets_the_source() {
    let (daemon, _publisher) = gap_run(None).await;
    let st = rank(&daemon, "g.test", 0).unwrap();
    assert_eq!((st.stats.seq_gaps, st.stats.source_resets), (1, 1));
    assert_eq!(st.stats.replays_requested, 0);
    daemon.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_replay_routers_reset_and_the_daemon_keeps_serving() {
    for mode in [RouterMode::NoEndMarker, RouterMode::Holes] {
        let (daemon, _publisher) = gap_run(Some(mode)).await;
        let st = rank(&daemon, "g.test", 0).unwrap();
        assert_eq!(
            (st.stats.replays_failed, st.stats.source_resets),
            (1, 1),
            "{mode:?}"
        );
        // Still (or again) connected: a failed replay does not take the subscription down.
        assert!(
            wait_until(Duration::from_secs(10), || {
                rank(&daemon, "g.test", 0)
                    .is_some_and(|s| s.state == kvindex::ingest::subscriber::LinkState::Connected)
            })
            .await,
            "{mode:?}"
        );
        // Rebuilt from what followed the gap: the last batch's blocks are indexed.
        assert!(!daemon.index.dump().is_empty(), "{mode:?}");
        daemon.shutdown(Duration::from_secs(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_frames_are_counted_and_the_rest_applied() {
    let (mut publisher, port) = FakePub::bind_any().await;
    let daemon = start_daemon(&target_yaml("bad", "m", "vllm", port, None, 1), None).await;
    wait_connected(&daemon, "bad.test", 0, 1, &mut publisher).await;
    let good = messages(E03, Some(0));
    let mut bad = Vec::new();
    for f in ["truncated.jsonl", "two_frames.jsonl", "empty_payload.jsonl"] {
        bad.extend(messages(&format!("malformed/{f}"), None));
    }
    let mut sent = 0u64;
    for (i, m) in good.iter().enumerate() {
        publisher.send(&m.frames).await;
        sent += 1;
        if let Some(b) = bad.get(i) {
            publisher.send(&b.frames).await;
            sent += 1;
        }
    }
    wait_messages(&daemon, "bad.test", 0, sent).await;
    let st = rank(&daemon, "bad.test", 0).unwrap();
    assert_eq!(
        st.stats.decode_errors.values().sum::<u64>() - probes_seen(&st),
        3,
        "{:?}",
        st.stats
    );
    assert_eq!(st.stats.restarts, 0);
    let dir = tempfile::tempdir().unwrap();
    let full = write_fixture(dir.path(), "full.jsonl", &good);
    assert_eq!(
        strip(daemon.index.dump()),
        offline(&[full.to_str().unwrap()], "bad.test", "m")
    );
    daemon.shutdown(Duration::from_secs(5)).await;
}

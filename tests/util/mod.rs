//! Test helpers: a fake engine (paced PUB sending fixture frames byte for byte, and a
//! ROUTER serving replay), free ports, polling, and an in-process daemon.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kvindex::commands::serve::Daemon;
use kvindex::config::Config;
use kvindex::index::DumpEntry;
use kvindex::ingest::fixture::{self, RecordedMessage};
use kvindex::ingest::replay_client::ReplayLimits;
use kvindex::ingest::subscriber::{LinkState, RankStatus};
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

/// The repo's fixtures folder.
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// Every message of a fixture file (one endpoint index, or all with `None`).
pub fn messages(file: &str, endpoint: Option<u32>) -> Vec<RecordedMessage> {
    fixture::read_file(&fixtures().join(file))
        .unwrap()
        .into_iter()
        .map(Result::unwrap)
        .filter(|m| endpoint.is_none_or(|e| m.endpoint_index == e))
        .collect()
}

/// A port `p` with `p..p+n` all free right now.
pub fn free_ports(n: u16) -> u16 {
    for _ in 0..200 {
        let first = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let p = first.local_addr().unwrap().port();
        if p > 65000 {
            continue;
        }
        let rest: Vec<_> = (1..n)
            .map(|i| std::net::TcpListener::bind(("127.0.0.1", p + i)))
            .collect();
        if rest.iter().all(Result::is_ok) {
            return p;
        }
    }
    panic!("no run of {n} free ports");
}

/// Polls `cond` every 20 ms until it holds or `timeout` passes; returns whether it held.
pub async fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cond()
}

/// A PUB socket bound on one port.
pub struct FakePub {
    socket: PubSocket,
}

impl FakePub {
    /// Binds `127.0.0.1:port`.
    pub async fn bind(port: u16) -> FakePub {
        let mut socket = PubSocket::new();
        let mut tries = 0;
        loop {
            match socket.bind(&format!("tcp://127.0.0.1:{port}")).await {
                Ok(_) => break,
                Err(e) if tries < 50 => {
                    tries += 1;
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("bind {port}: {e}"),
            }
        }
        FakePub { socket }
    }

    /// Binds an ephemeral port on 127.0.0.1; returns the socket and its port.
    pub async fn bind_any() -> (FakePub, u16) {
        let mut socket = PubSocket::new();
        let endpoint = socket.bind("tcp://127.0.0.1:0").await.unwrap();
        let zeromq::Endpoint::Tcp(_, port) = endpoint else {
            panic!("not tcp: {endpoint}");
        };
        (FakePub { socket }, port)
    }

    /// Sends frames exactly as recorded, paced (the crate's PUB drops under a flat-out loop).
    pub async fn send(&mut self, frames: &[Vec<u8>]) {
        let frames: Vec<Bytes> = frames.iter().map(|f| Bytes::copy_from_slice(f)).collect();
        self.socket
            .send(ZmqMessage::try_from(frames).unwrap())
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(3)).await;
    }

    /// Closes the socket (the port is released).
    pub async fn close(self) {
        let _ = self.socket.close().await;
    }
}

/// How the fake replay ROUTER misbehaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouterMode {
    /// Every buffered batch ≥ start, then the end marker; `[seq, payload]` replies.
    Old,
    /// Same with `[topic, seq, payload]` replies.
    New,
    /// Never sends the end marker.
    NoEndMarker,
    /// Skips one batch in the middle.
    Holes,
}

/// Serves replay of `buffer` (well-formed 3-frame messages) on `127.0.0.1:port`.
pub async fn spawn_router(
    port: u16,
    buffer: Vec<RecordedMessage>,
    mode: RouterMode,
) -> tokio::task::JoinHandle<()> {
    let mut socket = RouterSocket::new();
    socket
        .bind(&format!("tcp://127.0.0.1:{port}"))
        .await
        .unwrap();
    tokio::spawn(async move {
        loop {
            let Ok(request) = socket.recv().await else {
                return;
            };
            let frames = request.into_vec();
            // [identity, "", start_seq]
            let identity = frames[0].clone();
            let start = u64::from_be_bytes(frames[2][..8].try_into().unwrap());
            let mut skipped = false;
            for m in &buffer {
                let seq = u64::from_be_bytes(m.frames[1][..8].try_into().unwrap());
                if seq < start {
                    continue;
                }
                if mode == RouterMode::Holes && !skipped && seq > start {
                    skipped = true;
                    continue;
                }
                let mut reply = vec![identity.clone(), Bytes::new()];
                if mode == RouterMode::New {
                    reply.push(Bytes::copy_from_slice(&m.frames[0]));
                }
                reply.push(Bytes::copy_from_slice(&m.frames[1]));
                reply.push(Bytes::copy_from_slice(&m.frames[2]));
                socket
                    .send(ZmqMessage::try_from(reply).unwrap())
                    .await
                    .unwrap();
            }
            if mode != RouterMode::NoEndMarker {
                let end = vec![
                    identity,
                    Bytes::new(),
                    Bytes::copy_from_slice(&u64::MAX.to_be_bytes()),
                    Bytes::new(),
                ];
                socket
                    .send(ZmqMessage::try_from(end).unwrap())
                    .await
                    .unwrap();
            }
        }
    })
}

/// Short replay timeouts so failing replays stay quick.
pub fn test_limits() -> ReplayLimits {
    ReplayLimits {
        connect: Duration::from_millis(500),
        recv: Duration::from_millis(300),
        max_batches: 10_000,
    }
}

/// A target line of a config.
pub fn target_yaml(
    pod: &str,
    model: &str,
    engine: &str,
    port: u16,
    replay: Option<u16>,
    dp: u32,
) -> String {
    let mut s = format!(
        "  - pod: {pod}\n    namespace: test\n    model: {model}\n    engine: {engine}\n    endpoint: tcp://127.0.0.1:{port}\n    dp_ranks: {dp}\n"
    );
    if let Some(r) = replay {
        s.push_str(&format!("    replay_endpoint: tcp://127.0.0.1:{r}\n"));
    }
    s
}

/// Starts an in-process daemon (metrics on an ephemeral port, no Redis, no API).
pub async fn start_daemon(targets_yaml: &str, path: Option<PathBuf>) -> Daemon {
    let text = format!("metrics:\n  listen: 127.0.0.1:0\ntargets:\n{targets_yaml}");
    let config = Config::from_str(&text).unwrap();
    Daemon::start(config, path, test_limits()).await.unwrap()
}

/// Status of a target's rank.
pub fn rank(d: &Daemon, pod_id: &str, rank: usize) -> Option<RankStatus> {
    d.supervisor
        .status()
        .into_iter()
        .find(|t| t.target.pod_id() == pod_id)
        .and_then(|t| t.ranks.get(rank).cloned())
}

/// Waits until a rank is connected at least `connects` times, then a short grace for the
/// subscription to reach the publisher (slow joiner).
pub async fn wait_connected(d: &Daemon, pod_id: &str, r: usize, connects: u64) {
    let ok = wait_until(Duration::from_secs(15), || {
        rank(d, pod_id, r)
            .is_some_and(|s| s.state == LinkState::Connected && s.connects >= connects)
    })
    .await;
    assert!(ok, "{pod_id} rank {r} never connected");
    // Generous: on a loaded 2-core CI box the subscription can take a while to arrive.
    tokio::time::sleep(Duration::from_millis(1000)).await;
}

/// Waits until a rank has seen `n` messages.
pub async fn wait_messages(d: &Daemon, pod_id: &str, r: usize, n: u64) {
    let ok = wait_until(Duration::from_secs(15), || {
        rank(d, pod_id, r).is_some_and(|s| s.stats.messages >= n)
    })
    .await;
    assert!(
        ok,
        "{pod_id} rank {r}: {:?}",
        rank(d, pod_id, r).map(|s| s.stats)
    );
}

/// A dump without store times, for comparing runs made at different seconds.
pub fn strip(dump: Vec<DumpEntry>) -> Vec<DumpEntry> {
    let mut d: Vec<DumpEntry> = dump
        .into_iter()
        .map(|mut e| {
            e.stored_at = 0;
            e
        })
        .collect();
    d.sort();
    d
}

/// What `replay` leaves for these files as pod `pod_id`.
pub fn offline(files: &[&str], pod_id: &str, model: &str) -> Vec<DumpEntry> {
    let args = kvindex::commands::replay::ReplayArgs {
        files: files.iter().map(|f| fixtures().join(f)).collect(),
        pod: pod_id.to_owned(),
        model: model.to_owned(),
        engine: kvindex::commands::decode::EngineArg::Auto,
        dump: None,
        json: false,
        redis: None,
        value_format: kvindex::commands::replay::ValueFormatArg::Tiered,
        no_mapping_keys: false,
    };
    let (index, _) = kvindex::commands::replay::replay_into_index(&args).unwrap();
    strip(index.dump())
}

/// Writes messages to a temp fixture file (for offline expectations of a subset).
pub fn write_fixture(dir: &Path, name: &str, msgs: &[RecordedMessage]) -> PathBuf {
    let path = dir.join(name);
    let text: String = msgs
        .iter()
        .map(|m| fixture::format_line(m.endpoint_index, &m.frames) + "\n")
        .collect();
    std::fs::write(&path, text).unwrap();
    path
}

/// Dump entries of one pod.
pub fn of_pod(dump: &[DumpEntry], pod_id: &str) -> Vec<DumpEntry> {
    dump.iter().filter(|e| e.pod == pod_id).cloned().collect()
}

//! Test helpers: a fake engine (paced PUB sending fixture frames byte for byte, and a
//! ROUTER serving replay), free ports, polling, and an in-process daemon.
#![allow(dead_code)]

pub mod own_redis;
pub mod redis_proxy;
pub mod vllm_frames;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kvindex::config::Config;
use kvindex::index::DumpEntry;
use kvindex::ingest::fixture::{self, RecordedMessage};
use kvindex::ingest::replay_client::ReplayLimits;
use kvindex::ingest::subscriber::{LinkState, RankStatus};
use kvindex::Daemon;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

/// The engine blocks checkpoint state key `key` holds in the Redis at `url` (its log
/// folded), every field and entry of it parsing.
pub async fn checkpoint_blocks(
    url: &str,
    key: &str,
) -> Vec<(kvindex::wire::BlockHash, kvindex::index::EngineState)> {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let read = kvindex::store::redis::checkpoint::read_state(&mut conn, key).await;
    let (blocks, bad) = read.unwrap();
    assert_eq!(bad, 0, "{key}: every field of the log parses");
    blocks
}

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

/// A port that was free a moment ago, for the few tests whose point is that nothing is bound
/// there yet (connect before bind, a publisher that restarts on its port). Everything else
/// binds port 0 and passes the bound port on, which cannot race.
pub fn unbound_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
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

    /// Binds `n` consecutive ports (a target's DP ranks: port, port + 1, …), the first chosen
    /// by the OS; returns the sockets (rank order) and the first port.
    pub async fn bind_ranks(n: u16) -> (Vec<FakePub>, u16) {
        for _ in 0..100 {
            let (first, port) = FakePub::bind_any().await;
            let mut pubs = vec![first];
            for r in 1..n {
                let Some(next) = port.checked_add(r) else {
                    break;
                };
                let mut socket = PubSocket::new();
                if socket
                    .bind(&format!("tcp://127.0.0.1:{next}"))
                    .await
                    .is_err()
                {
                    break;
                }
                pubs.push(FakePub { socket });
            }
            if pubs.len() == usize::from(n) {
                return (pubs, port);
            }
            for p in pubs {
                p.close().await;
            }
        }
        panic!("no run of {n} free ports");
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

    /// Sends one readiness probe: seq `u64::MAX` and a `nil` payload (see [`wait_connected`]).
    pub async fn send_probe(&mut self) {
        let probe = vec![Vec::new(), u64::MAX.to_be_bytes().to_vec(), vec![0xc0]];
        self.send(&probe).await;
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

/// Serves replay of `buffer` (well-formed 3-frame messages) on an ephemeral port of
/// 127.0.0.1; returns the task and the port.
pub async fn spawn_router(
    buffer: Vec<RecordedMessage>,
    mode: RouterMode,
) -> (tokio::task::JoinHandle<()>, u16) {
    let mut socket = RouterSocket::new();
    let endpoint = socket.bind("tcp://127.0.0.1:0").await.unwrap();
    let zeromq::Endpoint::Tcp(_, port) = endpoint else {
        panic!("not tcp: {endpoint}");
    };
    let task = tokio::spawn(async move {
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
    });
    (task, port)
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

/// The decode-error reason probes are counted under: a probe's payload is msgpack `nil`,
/// which no real stream in these tests sends, so the count is the probes seen.
pub const PROBE_REASON: &str = "not_a_batch";

/// Probes a rank has seen.
pub fn probes_seen(st: &RankStatus) -> u64 {
    st.stats
        .decode_errors
        .get(PROBE_REASON)
        .copied()
        .unwrap_or(0)
}

/// Messages a rank has seen, probes left out.
pub fn stream_messages(st: &RankStatus) -> u64 {
    st.stats.messages - probes_seen(st)
}

/// Waits until a rank is connected at least `connects` times, then until its subscription
/// has reached `publisher` (the slow joiner): probes are sent until the rank has seen one.
/// A probe's seq is `u64::MAX`, which never counts as the next seq, so the stream's seq
/// bookkeeping is untouched; it is counted as one decode error ([`PROBE_REASON`]).
pub async fn wait_connected(
    d: &Daemon,
    pod_id: &str,
    r: usize,
    connects: u64,
    publisher: &mut FakePub,
) {
    let ok = wait_until(Duration::from_secs(15), || {
        rank(d, pod_id, r)
            .is_some_and(|s| s.state == LinkState::Connected && s.connects >= connects)
    })
    .await;
    assert!(ok, "{pod_id} rank {r} never connected");
    let before = rank(d, pod_id, r).map_or(0, |s| probes_seen(&s));
    let end = Instant::now() + Duration::from_secs(15);
    while Instant::now() < end {
        publisher.send_probe().await;
        let seen = wait_until(Duration::from_millis(40), || {
            rank(d, pod_id, r).is_some_and(|s| probes_seen(&s) > before)
        })
        .await;
        if seen {
            return;
        }
    }
    panic!("{pod_id} rank {r} never received a probe");
}

/// Waits until a rank has seen `n` messages of the stream (probes left out).
pub async fn wait_messages(d: &Daemon, pod_id: &str, r: usize, n: u64) {
    let ok = wait_until(Duration::from_secs(15), || {
        rank(d, pod_id, r).is_some_and(|s| stream_messages(&s) >= n)
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
    let files: Vec<PathBuf> = files.iter().map(|f| fixtures().join(f)).collect();
    let engine = kvindex::ingest::fixture::engine_of_file(&files[0]);
    let index = kvindex::index::Index::new();
    let replay = kvindex::ingest::replay_files(index, pod_id, model, engine, &files).unwrap();
    strip(replay.index().dump())
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

/// One HTTP/1.1 GET on a fresh connection; returns the status and the whole reply.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    http_request(addr, "GET", path, "").await
}

/// One HTTP/1.1 request on a fresh connection; returns the status and the whole reply.
pub async fn http_request(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let code = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, out)
}

/// `kvindex demo` on free ports (API, metrics, engines) for at most two minutes, with its
/// stdout lines arriving on the returned channel.
pub fn spawn_demo() -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    let mut demo = Command::new(env!("CARGO_BIN_EXE_kvindex"))
        .args([
            "demo",
            "--api-listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
        ])
        .args(["--engine-port", "0", "--duration", "120"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = demo.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    (demo, rx)
}

/// Starts the built binary as `kvindex --log-format json --log info serve --config CONFIG`
/// with `env` set (and the shard variables cleared unless `env` sets them), and forwards its
/// stderr lines to the returned receiver, so a test can wait for a log line.
pub fn spawn_serve(
    config: &Path,
    env: &[(&str, String)],
) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_kvindex"))
        .args(["--log-format", "json", "--log", "info", "serve", "--config"])
        .arg(config)
        .env_remove("KVINDEX_SHARD_INDEX")
        .env_remove("KVINDEX_SHARD_COUNT")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // Lines nobody reads any more are dropped with the receiver.
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    (child, rx)
}

/// The body of a raw HTTP/1 reply.
pub fn body_of(reply: &str) -> &str {
    reply.split_once("\r\n\r\n").map_or("", |(_, b)| b)
}

/// The metrics and API addresses from a daemon's "Listening." log lines, waiting up to
/// `wait` for both.
pub fn listeners(
    lines: &std::sync::mpsc::Receiver<String>,
    wait: Duration,
) -> Option<(std::net::SocketAddr, std::net::SocketAddr)> {
    let end = Instant::now() + wait;
    let (mut metrics, mut api) = (None, None);
    while metrics.is_none() || api.is_none() {
        let line = lines
            .recv_timeout(end.saturating_duration_since(Instant::now()))
            .ok()?;
        let Ok(json) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if json["message"] == "Listening." {
            let addr = json["addr"].as_str()?.parse().ok();
            match json["listener"].as_str() {
                Some("metrics") => metrics = addr,
                Some("API") => api = addr,
                _ => {}
            }
        }
    }
    // Later lines are not read; the channel's buffer is unbounded and small.
    Some((metrics?, api?))
}

/// POSTs `body` as JSON to `uri` of `app`: the status and the JSON answer (null when none).
pub async fn post_json(
    app: &axum::Router,
    uri: &str,
    body: &serde_json::Value,
) -> (axum::http::StatusCode, serde_json::Value) {
    use tower::ServiceExt;
    let req = axum::http::Request::builder()
        .method("POST")
        .uri(uri)
        .header(axum::http::header::CONTENT_TYPE, "application/json")
        .body(axum::body::Body::from(body.to_string()))
        .expect("a valid request");
    let resp = app.clone().oneshot(req).await.expect("the router answers");
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .expect("a readable body");
    let value = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    (status, value)
}

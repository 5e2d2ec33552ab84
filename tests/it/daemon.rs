//! The daemon as a library: started through the crate's by-name re-exports, its listeners
//! stop on shutdown, and start-up failures are typed errors.

use std::time::Duration;

use kvindex::ingest::replay_client::ReplayLimits;
use kvindex::{config::Config, Daemon, DaemonError};

fn listeners_on_free_ports() -> Config {
    Config::from_str("metrics:\n  listen: 127.0.0.1:0\napi:\n  listen: 127.0.0.1:0\n").unwrap()
}

#[tokio::test]
async fn shutdown_stops_both_listeners() {
    let daemon = Daemon::start(listeners_on_free_ports(), None, ReplayLimits::default())
        .await
        .unwrap();
    let metrics = daemon.metrics_addr;
    let api = daemon.api_addr.expect("the API was configured");
    for addr in [metrics, api] {
        assert!(tokio::net::TcpStream::connect(addr).await.is_ok(), "{addr}");
    }
    tokio::time::timeout(
        Duration::from_secs(10),
        daemon.shutdown(Duration::from_secs(5)),
    )
    .await
    .expect("shutdown keeps its deadline");
    for addr in [metrics, api] {
        // Probed until refused, with a deadline: a child process another test is spawning
        // holds a copy of every open descriptor, the closed listener's too, from its fork
        // until its exec closes them (CLOEXEC), and the kernel keeps answering handshakes on
        // that copy meanwhile (seen twice in full runs on a loaded machine). A listener the
        // daemon kept open would accept throughout.
        let end = tokio::time::Instant::now() + Duration::from_secs(5);
        while tokio::net::TcpStream::connect(addr).await.is_ok() {
            assert!(
                tokio::time::Instant::now() < end,
                "{addr} still accepts 5 s after shutdown"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test]
async fn a_taken_port_is_a_typed_bind_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let config = Config::from_str(&format!("metrics:\n  listen: {addr}\n")).unwrap();
    match Daemon::start(config, None, ReplayLimits::default()).await {
        Err(DaemonError::Bind {
            listener, addr: a, ..
        }) => {
            assert_eq!((listener, a), ("metrics", addr));
        }
        Err(other) => panic!("expected a bind error, got {other}"),
        Ok(_) => panic!("started on a taken port"),
    }
}

#[tokio::test]
async fn an_unreachable_redis_is_a_typed_mirror_error() {
    // Port 1 on loopback: nothing listens there, so the connection is refused at once.
    let config = Config::from_str("redis:\n  url: redis://127.0.0.1:1/0\n").unwrap();
    let started = tokio::time::timeout(
        Duration::from_secs(30),
        Daemon::start(config, None, ReplayLimits::default()),
    )
    .await
    .expect("start-up gives up on an unreachable Redis");
    assert!(
        matches!(started, Err(DaemonError::Mirror(_))),
        "{:?}",
        started.err()
    );
}

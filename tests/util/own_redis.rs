//! A `redis-server` child of the test on a free 127.0.0.1 port, without persistence, for
//! tests that flush, kill or restart Redis; killed on drop.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Upper bound for redis-server to accept connections.
const START_DEADLINE: Duration = Duration::from_secs(30);

/// A running `redis-server` child.
pub struct OwnRedis {
    child: Child,
    /// The port it listens on.
    pub port: u16,
}

impl OwnRedis {
    /// Starts one on `port` (a free one when `None`) with `extra` arguments.
    pub fn start(port: Option<u16>, extra: &[&str]) -> OwnRedis {
        let port = port.unwrap_or_else(super::unbound_port);
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed");
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < START_DEADLINE,
                "redis-server did not come up"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        OwnRedis { child, port }
    }

    /// `redis://127.0.0.1:{port}/0`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Its process id (to pause it with SIGSTOP).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills it and waits for it to exit.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

//! A `redis-server` of a test's own, for tests that kill, restart or flush Redis.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Upper bound for a server to come up.
const WAIT: Duration = Duration::from_secs(30);

/// A `redis-server` child on a free port, without persistence; killed on drop.
pub struct OwnRedis {
    child: Child,
    /// The port it listens on.
    pub port: u16,
}

impl OwnRedis {
    /// Starts `redis-server` on `port` (a free one when `None`) with `extra` arguments.
    pub fn start(port: Option<u16>, extra: &[&str]) -> OwnRedis {
        let port = port.unwrap_or_else(|| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port()
        });
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed");
        let started = std::time::Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(started.elapsed() < WAIT, "redis-server did not come up");
            std::thread::sleep(Duration::from_millis(20));
        }
        OwnRedis { child, port }
    }

    /// Its URL (db 0).
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// The server's process id (to pause it with SIGSTOP).
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

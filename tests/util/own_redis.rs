//! A `redis-server` child of the test on a free 127.0.0.1 port, without persistence, for
//! tests that flush, kill or restart Redis; killed on drop.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Upper bound for redis-server to accept connections.
const START_DEADLINE: Duration = Duration::from_secs(30);

/// Free ports tried for one server before giving up.
const START_TRIES: usize = 20;

/// A running `redis-server` child.
pub struct OwnRedis {
    child: Child,
    /// The port it listens on.
    pub port: u16,
}

impl OwnRedis {
    /// Starts one on `port` (a free one when `None`) with `extra` arguments.
    pub fn start(port: Option<u16>, extra: &[&str]) -> OwnRedis {
        match port {
            Some(port) => OwnRedis::try_start(port, extra)
                .unwrap_or_else(|| panic!("redis-server could not listen on port {port}")),
            None => OwnRedis::start_free(|_| extra.iter().map(|a| a.to_string()).collect()),
        }
    }

    /// Starts one on a free port with the arguments `extra` gives for that port. A port
    /// found free may be taken again before redis-server binds it (tests run in parallel):
    /// the server then exits, and another port is chosen.
    pub fn start_free(extra: impl Fn(u16) -> Vec<String>) -> OwnRedis {
        for _ in 0..START_TRIES {
            let port = super::unbound_port();
            let args = extra(port);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            if let Some(redis) = OwnRedis::try_start(port, &args) {
                return redis;
            }
        }
        panic!("redis-server found no free port in {START_TRIES} tries");
    }

    /// Starts one on `port` with `extra` arguments; `None` when it exits before it serves
    /// (its port, or another port `extra` asks it to bind, is taken).
    fn try_start(port: u16, extra: &[&str]) -> Option<OwnRedis> {
        let mut child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed");
        let password = (extra.iter())
            .position(|a| *a == "--requirepass")
            .and_then(|i| extra.get(i + 1).copied());
        let started = Instant::now();
        // Whatever answers on the port must be this child: a listener of another test that
        // took the same port accepts connections too.
        while !serves(port, child.id(), password) {
            if child.try_wait().ok().flatten().is_some() {
                return None;
            }
            assert!(
                started.elapsed() < START_DEADLINE,
                "redis-server did not come up"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(OwnRedis { child, port })
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

/// Whether the Redis answering on `port` is the process `pid`.
fn serves(port: u16, pid: u32, password: Option<&str>) -> bool {
    let url = match password {
        Some(pw) => format!("redis://:{pw}@127.0.0.1:{port}/0"),
        None => format!("redis://127.0.0.1:{port}/0"),
    };
    let Ok(client) = redis::Client::open(url) else {
        return false;
    };
    let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_secs(1)) else {
        return false;
    };
    let info: Option<String> = redis::cmd("INFO").arg("server").query(&mut conn).ok();
    let own = format!("process_id:{pid}");
    info.is_some_and(|info| info.lines().any(|line| line.trim() == own))
}

//! A `redis-server` of a bench's own on 127.0.0.1 (no persistence), killed on drop, and
//! `redis-benchmark -P 64` against it: the references the Redis benches divide by (its
//! built-in `SET`/`HSET` tests, or any command with random new keys). Shared by
//! `benches/redis_ingest.rs` and the `shard_scale`, `state_soak`, `cluster_ingest` and
//! `ha_takeover` examples.

use std::process::{Child, Command, Stdio};

// Its process clock reads the server's CPU; the rest serves the benches.
#[allow(dead_code)]
#[path = "../../benches/common/thread_cpu.rs"]
pub mod thread_cpu;
use std::time::{Duration, Instant};

/// A `redis-server` child, killed on drop.
pub struct RedisServer {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

impl RedisServer {
    /// Starts one on a free port and waits until it accepts connections.
    pub fn start() -> RedisServer {
        RedisServer::start_on(free_port(), &[])
    }

    /// Starts one on `port` with `extra` arguments (a cluster node's, say) and waits until it
    /// accepts connections; a soak restarts Redis on the port its daemon knows.
    pub fn start_on(port: u16, extra: &[String]) -> RedisServer {
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server on the PATH");
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "redis-server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        RedisServer { child, port }
    }

    /// CPU seconds the server has used so far (user + system, from `/proc`), 0 where that
    /// cannot be read: what a run's share of Redis's one thread is measured by.
    pub fn cpu_seconds(&self) -> f64 {
        thread_cpu::process_cpu_and_faults(self.child.id())
            .0
            .as_secs_f64()
    }

    /// `redis://127.0.0.1:{port}/0`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// `redis-cli -p {port} ARGS…`, its stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli on the PATH");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// FLUSHALL, then waits until its lazy free is done (it would slow the next case).
    pub fn flush(&self) {
        self.cli(&["FLUSHALL"]);
        while !self
            .cli(&["INFO", "memory"])
            .contains("lazyfree_pending_objects:0")
        {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `redis-benchmark -P 64 -c 50 -r 100000000 -n {requests} COMMAND…`: requests/s of one
    /// command from 50 clients, each `__rand_int__` in it replaced by a random 12-digit number
    /// per request, so nearly every request writes a new key or field.
    pub fn benchmark_command(&self, requests: u64, command: &[&str]) -> f64 {
        let out = Command::new("redis-benchmark")
            .args([
                "-p",
                &self.port.to_string(),
                "-P",
                "64",
                "-c",
                "50",
                "-q",
                "--csv",
            ])
            .args(["-r", "100000000", "-n", &requests.to_string()])
            .args(command)
            .output()
            .expect("redis-benchmark on the PATH");
        let text = String::from_utf8_lossy(&out.stdout);
        // `"test","rps",…` then one row; the test's name is the command, so its columns are
        // counted from the end (rps is the seventh of eight).
        text.lines()
            .nth(1)
            .and_then(|row| row.rsplit(',').nth(6))
            .and_then(|rps| rps.trim_matches('"').parse().ok())
            .unwrap_or_else(|| panic!("no figure in redis-benchmark's output: {text}"))
    }

    /// `redis-benchmark -P 64 -t set,hset -n 1000000`: (SET/s, HSET/s). Both tests rewrite one
    /// existing key with a 3-byte value.
    pub fn benchmark(&self) -> (f64, f64) {
        let out = Command::new("redis-benchmark")
            .args(["-p", &self.port.to_string(), "-P", "64", "-q", "--csv"])
            .args(["-t", "set,hset", "-n", "1000000"])
            .output()
            .expect("redis-benchmark on the PATH");
        let text = String::from_utf8_lossy(&out.stdout);
        let rps = |name: &str| {
            text.lines()
                .find_map(|l| {
                    let mut cols = l.split(',').map(|c| c.trim_matches('"'));
                    (cols.next() == Some(name)).then(|| cols.next()?.parse::<f64>().ok())?
                })
                .unwrap_or_else(|| panic!("no {name} figure in redis-benchmark's output: {text}"))
        };
        (rps("SET"), rps("HSET"))
    }
}

/// A 127.0.0.1 port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

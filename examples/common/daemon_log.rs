//! What the examples that start `kvindex serve` as a process read from its JSON log lines.

use std::io::{BufRead, Read};
use std::net::SocketAddr;
use std::time::Duration;

/// The address the daemon logs for `listener` (`"API"`, `"metrics"`) as it binds, read from
/// its JSON log lines on `stderr` by a thread of its own; `None` past `timeout`. The thread
/// reads and drops every later line, so the daemon never blocks on its stderr.
pub fn listener_address(
    stderr: impl Read + Send + 'static,
    listener: &'static str,
    timeout: Duration,
) -> Option<SocketAddr> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let lines = std::io::BufReader::new(stderr).lines();
        for line in lines.map_while(Result::ok) {
            let Ok(json) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            if json["message"] == "Listening." && json["listener"] == listener {
                if let Some(addr) = json["addr"].as_str().and_then(|a| a.parse().ok()) {
                    let _ = tx.send(addr);
                }
            }
        }
    });
    rx.recv_timeout(timeout).ok()
}

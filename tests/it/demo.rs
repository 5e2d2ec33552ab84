//! `kvindex demo` as a new user runs it: the binary on free ports, its printed `curl` lines
//! pasted into a shell, their answers compared with the printed expectations, then Ctrl-C.

use crate::util;

use std::io::{Read, Write};
use std::process::Command;
use std::time::{Duration, Instant};

/// Runs one printed `curl` line: through a shell when curl is installed (exactly as pasted),
/// otherwise as the same HTTP request made here.
fn run_curl(line: &str) -> String {
    let has_curl = Command::new("curl").arg("--version").output().is_ok();
    if has_curl {
        let out = Command::new("sh").arg("-c").arg(line).output().unwrap();
        assert!(out.status.success(), "{line}: {out:?}");
        return String::from_utf8(out.stdout).unwrap();
    }
    let url = line.split_whitespace().nth(2).unwrap();
    let (host, path) = url["http://".len()..].split_once('/').unwrap();
    let body = line
        .split_once(" -d '")
        .map_or("", |(_, b)| b.trim_end_matches('\''));
    let mut s = std::net::TcpStream::connect(host).unwrap();
    let method = if body.is_empty() { "GET" } else { "POST" };
    write!(
        s,
        "{method} /{path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    reply.split_once("\r\n\r\n").unwrap().1.to_owned()
}

#[test]
fn the_printed_queries_get_the_printed_answers_and_ctrl_c_exits_cleanly() {
    let (mut child, rx) = util::spawn_demo();
    let mut printed = Vec::new();
    let end = Instant::now() + Duration::from_secs(60);
    while Instant::now() < end {
        let Ok(line) = rx.recv_timeout(Duration::from_millis(100)) else {
            continue;
        };
        let done = line.contains("Ctrl-C stops the demo");
        printed.push(line);
        if done {
            break;
        }
    }
    let text = printed.join("\n");
    assert!(
        text.contains("The live index holds exactly what the engines hold"),
        "{text}"
    );
    assert!(text.contains("1 seq gaps, 1/1 replays filled"), "{text}");
    assert!(text.contains("1 decode errors"), "{text}");
    assert!(text.contains("2 restarts"), "{text}");
    let mut checked = 0;
    for pair in printed.windows(2) {
        let (curl, expected) = (pair[0].trim(), pair[1].trim());
        let Some(expected) = expected.strip_prefix("expected: ") else {
            continue;
        };
        assert!(curl.starts_with("curl -s http://127.0.0.1:"), "{curl}");
        let got: serde_json::Value = serde_json::from_str(&run_curl(curl)).unwrap();
        let want: serde_json::Value = serde_json::from_str(expected).unwrap();
        assert_eq!(got, want, "{curl}");
        checked += 1;
    }
    assert_eq!(
        checked, 2,
        "a /v1/score and a /v1/pd/schedule query: {text}"
    );
    // The score query is not trivial: pods differ, and the best holds the whole prompt.
    assert!(text.contains("\"score\":100"), "{text}");

    // Ctrl-C: the demo drains and exits 0.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let end = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < end, "the demo did not exit after SIGINT");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
    // The reader thread ends at EOF, closing the channel.
    let mut rest = Vec::new();
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(5)) {
        rest.push(line);
    }
    assert!(rest.iter().any(|l| l.contains("Stopped.")), "{rest:?}");
}

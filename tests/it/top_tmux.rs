//! `kvindex top` the way a person uses it: in a terminal (tmux), against the running demo;
//! the screen is read with `capture-pane`. Skipped, with a message, where tmux is missing
//! (`.ci/run` installs it).

use crate::util;

use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// A private tmux server (its own socket), killed when dropped.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn run(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap()
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.run(&["capture-pane", "-p", "-t", "top"]).stdout).into_owned()
    }

    /// Polls the screen until `cond` holds; returns the last screen and whether it held.
    fn wait_screen(&self, timeout: Duration, cond: impl Fn(&str) -> bool) -> (String, bool) {
        let end = Instant::now() + timeout;
        loop {
            let s = self.screen();
            if cond(&s) {
                return (s, true);
            }
            if Instant::now() > end {
                return (s, false);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

/// The demo on free ports; returns it and its (metrics, API) URLs once its queries print.
fn start_demo() -> (Child, String, String) {
    let (mut demo, rx) = util::spawn_demo();
    let (mut metrics, mut api) = (String::new(), String::new());
    let end = Instant::now() + Duration::from_secs(60);
    while Instant::now() < end {
        let Ok(line) = rx.recv_timeout(Duration::from_millis(100)) else {
            continue;
        };
        let url = line
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_owned();
        if line.starts_with("  metrics ") {
            metrics = url;
        } else if line.starts_with("  API ") {
            api = url;
        } else if line.contains("Ctrl-C stops the demo") {
            return (demo, metrics, api);
        }
    }
    let _ = demo.kill();
    let _ = demo.wait();
    panic!("the demo did not come up");
}

/// The cells of a target's row on the screen (split on the table's column gaps).
fn row<'a>(screen: &'a str, pod: &str) -> Vec<&'a str> {
    let line = screen.lines().find(|l| l.contains(pod)).unwrap_or_default();
    line.trim_matches(['│', ' '])
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect()
}

#[test]
fn top_shows_the_demo_targets_live_then_the_daemon_gone_and_quits_on_q() {
    if Command::new("tmux").arg("-V").output().is_err() {
        eprintln!("SKIPPED: tmux is not installed (`.ci/run` installs it); kvindex top was not tested in a terminal.");
        return;
    }
    let (mut demo, metrics, api) = start_demo();
    let tmux = Tmux {
        socket: format!("kvindex-top-test-{}", std::process::id()),
    };
    let top = format!(
        "{} top --url {metrics} --api-url {api} --interval 0.3",
        env!("CARGO_BIN_EXE_kvindex")
    );
    let started = tmux.run(&[
        "new-session",
        "-d",
        "-s",
        "top",
        "-x",
        "180",
        "-y",
        "24",
        &top,
    ]);
    assert!(started.status.success(), "{started:?}");

    // Every target with its state, ranks and tiers; the busy engine's events/s is live.
    let (screen, ok) = tmux.wait_screen(Duration::from_secs(30), |s| {
        let busy = row(s, "vllm-2.demo");
        s.contains("daemon up")
            && ["vllm-0.demo", "vllm-1.demo", "sglang-0.demo"]
                .iter()
                .all(|p| row(s, p).contains(&"connected"))
            && busy
                .get(4)
                .and_then(|v| v.parse::<f64>().ok())
                .is_some_and(|v| v > 0.0)
    });
    assert!(ok, "{screen}");
    let vllm0 = row(&screen, "vllm-0.demo");
    assert_eq!(
        &vllm0[..4],
        ["vllm-0.demo", "vllm", "connected", "2/2"],
        "{screen}"
    );
    assert!(
        vllm0
            .iter()
            .any(|c| c.contains("CPU 1") && c.contains("STORAGE 2")),
        "{screen}"
    );
    assert!(
        row(&screen, "sglang-0.demo")
            .iter()
            .any(|c| c.contains("CPU_PINNED 2")),
        "{screen}"
    );
    // vllm-0's lost message: one gap, filled by one replay (LAST MSG, GAPS, REPLAYS).
    assert_eq!(&vllm0[9..11], ["1", "1/1"], "{screen}");
    assert!(vllm0[8].ends_with(" s"), "{screen}");
    assert!(screen.contains("mirror   off"), "{screen}");
    eprintln!("kvindex top against the demo:\n{screen}");

    // The daemon goes away: shown as unreachable, not a crash.
    unsafe { libc::kill(demo.id() as i32, libc::SIGINT) };
    let _ = demo.wait();
    let (screen, ok) = tmux.wait_screen(Duration::from_secs(15), |s| {
        s.contains("daemon UNREACHABLE")
    });
    assert!(ok, "{screen}");
    assert!(
        screen.contains("vllm-0.demo") || screen.contains("/v1/pods:"),
        "{screen}"
    );

    // q quits: the session (whose only program is top) ends.
    tmux.run(&["send-keys", "-t", "top", "q"]);
    let end = Instant::now() + Duration::from_secs(10);
    while tmux.run(&["has-session", "-t", "top"]).status.success() {
        assert!(
            Instant::now() < end,
            "top did not quit on q:\n{}",
            tmux.screen()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

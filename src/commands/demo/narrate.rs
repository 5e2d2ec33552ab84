//! The demo's narration: timestamped lines on stdout saying what each engine does and what
//! the daemon saw (from its own counters), then the queries to paste.

use std::io::Write;
use std::time::Instant;

use super::queries;
use super::scenario::{self, DemoPod, Role, CORRUPT_SEQ, DROPPED_SEQ, PODS};
use crate::sim::SimEngine;
use kvindex::ingest::subscriber::RankStatus;
use kvindex::ingest::{unix_now, PodsView};
use kvindex::Daemon;

/// What an engine is about to do, in words.
pub(super) fn intent(pod: &DemoPod) -> String {
    let what = match pod.role {
        Role::DropAndCorrupt => format!(
            "publishes its recording; seq {DROPPED_SEQ} of rank 0 is lost on the wire (the engine's replay buffer keeps it) and seq {CORRUPT_SEQ} goes out with its payload cut in half"
        ),
        Role::Full => "publishes its whole recording (ending in AllBlocksCleared and a new chain)".to_owned(),
        Role::Restart => format!(
            "publishes its recording, then the engine restarts (sockets close, seq starts over at 0) and publishes its first {} messages again",
            scenario::AFTER_RESTART
        ),
        Role::Busy => "keeps publishing".to_owned(),
    };
    format!(
        "{} ({}, {} DP ranks) {what}.",
        pod.id(),
        pod.recording.label,
        pod.ranks
    )
}

/// What the daemon saw of an engine, from its own counters and index.
pub(super) fn seen(daemon: &Daemon, pod: &DemoPod) -> String {
    let ranks: Vec<RankStatus> = (0..usize::from(pod.ranks))
        .filter_map(|r| rank_status(daemon, pod, r))
        .collect();
    let sum = |f: fn(&RankStatus) -> u64| ranks.iter().map(f).sum::<u64>();
    let id = pod.id();
    let resident: Vec<String> = daemon
        .supervisor
        .pods()
        .into_iter()
        .filter(|p| p.pod == id)
        .flat_map(|p| p.resident_blocks)
        .map(|(m, n)| format!("{m} {n}"))
        .collect();
    format!(
        "  daemon: {} messages, {} seq gaps, {}/{} replays filled, {} restarts (counted per DP rank), {} decode errors; resident blocks: {}.",
        sum(|s| s.stats.messages),
        sum(|s| s.stats.seq_gaps),
        sum(|s| s.stats.replays_succeeded),
        sum(|s| s.stats.replays_requested),
        sum(|s| s.stats.restarts),
        sum(|s| s.stats.decode_errors.values().sum()),
        if resident.is_empty() { "none".to_owned() } else { resident.join(", ") }
    )
}

/// The status of DP rank `rank` of `pod`, as the daemon's supervisor reports it.
pub(super) fn rank_status(daemon: &Daemon, pod: &DemoPod, rank: usize) -> Option<RankStatus> {
    let id = pod.id();
    daemon
        .supervisor
        .status()
        .into_iter()
        .find(|t| t.target.pod_id() == id)
        .and_then(|t| t.ranks.get(rank).cloned())
}

/// Timestamped lines on stdout (a closed stdout is ignored, never a panic).
pub(super) struct Narrator {
    start: Instant,
}

impl Narrator {
    pub(super) fn new() -> Narrator {
        Narrator {
            start: Instant::now(),
        }
    }

    pub(super) fn line(&mut self, text: &str) {
        let t = self.start.elapsed().as_secs_f64();
        self.raw(&format!("[{t:5.1}s] {text}"));
    }

    fn raw(&mut self, text: &str) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{text}");
        let _ = out.flush();
    }

    /// The daemon's and engines' addresses; `redis`: whether the index is mirrored.
    pub(super) fn header(&mut self, redis: bool, daemon: &Daemon, engines: &[SimEngine]) {
        let store = if redis {
            "the in-memory index, mirrored into Redis"
        } else {
            "the in-memory index (no Redis)"
        };
        self.raw(&format!(
            "kvindex demo: the daemon on {store}, and {} simulated engines on 127.0.0.1 publishing recordings of the engines' own encoders.",
            engines.len()
        ));
        if let Some(api) = daemon.api_addr {
            self.raw(&format!(
                "  API      http://{api}  (/v1/score, /v1/pd/schedule, /v1/pods)"
            ));
        }
        self.raw(&format!(
            "  metrics  http://{}  (/metrics, /healthz, /readyz)",
            daemon.metrics_addr
        ));
        for (pod, e) in PODS.iter().zip(engines) {
            self.raw(&format!(
                "  engine   {:<14} {:<24} model {:<34} PUB tcp://127.0.0.1:{} (+rank), replay tcp://127.0.0.1:{} (+rank)",
                pod.id(),
                pod.recording.label,
                pod.model,
                e.pub_port(),
                e.replay_port()
            ));
        }
    }

    /// The queries to paste; `default_ports`: the engines listen where
    /// `examples/kvindex-demo.yaml` expects them.
    pub(super) fn queries(
        &mut self,
        daemon: &Daemon,
        weights: &kvindex::medium::TierWeights,
        default_ports: bool,
    ) {
        let expected = scenario::expected_index(unix_now());
        let Some(api) = daemon.api_addr else {
            return;
        };
        self.line("Ask the daemon (paste into another terminal):");
        for q in [
            queries::score(&expected, weights),
            queries::pd(&expected, weights),
        ] {
            self.raw(&format!("  {}", q.curl(api)));
            self.raw(&format!("    expected: {}", q.expected));
        }
        self.raw(&format!("  curl -s http://{api}/v1/pods"));
        self.raw(&format!(
            "  curl -s http://{}/metrics | grep ^kvindex_",
            daemon.metrics_addr
        ));
        self.raw(&format!(
            "  kvindex top --url http://{} --api-url http://{api}",
            daemon.metrics_addr
        ));
        if default_ports {
            self.raw("  kvindex serve --config examples/kvindex-demo.yaml   # a second daemon on the same engines");
        }
        let busy = &PODS[PODS.len() - 1];
        self.line(&format!(
            "{} keeps publishing (model {}), so the counters move. Ctrl-C stops the demo.",
            busy.id(),
            busy.model
        ));
    }
}

//! `kvindex demo`: the daemon on the in-memory index, fed live by simulated engines that
//! publish the bundled recordings over real ZeroMQ sockets on 127.0.0.1, narrated as it goes,
//! ending with ready-to-paste queries and the answers they must give.
//!
//! | file | job |
//! | --- | --- |
//! | `mod.rs` | arguments, start and stop, the narration |
//! | `narrate.rs` | the narration: what each engine does and what the daemon saw |
//! | `scenario.rs` | the engines, their script, the index they should leave |
//! | `queries.rs` | the printed `curl` lines and their expected answers |

mod narrate;
pub mod queries;
pub mod scenario;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::Context;

use self::narrate::{intent, rank_status, seen, Narrator};
use self::scenario::{DemoPod, Role, BUSY_PACE, NAMESPACE, PODS};
use super::UsageError;
use crate::sim::SimEngine;
use kvindex::config::Config;
use kvindex::index::DumpEntry;
use kvindex::ingest::replay_client::ReplayLimits;
use kvindex::ingest::subscriber::LinkState;
use kvindex::ingest::unix_now;
use kvindex::Daemon;

/// First port of the simulated engines by default (`examples/kvindex-demo.yaml` uses it).
pub const DEFAULT_ENGINE_PORT: u16 = 25557;
/// How long the demo waits for the daemon to see what an engine did.
const SETTLE: Duration = Duration::from_secs(15);
/// Pause between two scripted messages, so the stream is seen as one.
const PACE: Duration = Duration::from_millis(30);
/// How long a first message may take to arrive before it is sent again (the subscription
/// may not have reached the PUB socket yet: ZeroMQ's slow joiner).
const FIRST_MESSAGE_WAIT: Duration = Duration::from_secs(1);

/// Arguments of `kvindex demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Where the HTTP API listens (`127.0.0.1:0` for a free port).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub api_listen: SocketAddr,
    /// Where `/metrics`, `/healthz` and `/readyz` are served (`127.0.0.1:0` for a free port).
    #[arg(long, default_value = "127.0.0.1:9090")]
    pub metrics_listen: SocketAddr,
    /// First port of the simulated engines; each takes four (two PUB ranks, then two replay
    /// ranks). 0 picks free ports.
    #[arg(long, default_value_t = DEFAULT_ENGINE_PORT)]
    pub engine_port: u16,
    /// Also mirror the index into this Redis (kthena's layout).
    #[arg(long)]
    pub redis: Option<String>,
    /// Stop after this many seconds (default: run until Ctrl-C).
    #[arg(long)]
    pub duration: Option<f64>,
}

/// Runs the demo until Ctrl-C or `--duration`.
///
/// # Errors
/// A port that cannot be bound, a Redis that cannot be reached, or a daemon that never sees
/// the engines.
pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let mut engines = bind_engines(args.engine_port).await?;
    let config = Config::from_str(&config_yaml(&args, &engines))
        .map_err(|e| anyhow::Error::new(UsageError(e.to_string())))?;
    let weights = config.weights.clone();
    let daemon = Daemon::start(config, None, ReplayLimits::default()).await?;
    let mut say = Narrator::new();
    say.header(args.redis.is_some(), &daemon, &engines);
    let stop = stop_signal(args.duration);
    let (scripted, busy) = engines.split_at_mut(PODS.len() - 1);
    let outcome = tokio::select! {
        r = async {
            play_all(&daemon, scripted, &mut say).await?;
            say.queries(&daemon, &weights, args.engine_port == DEFAULT_ENGINE_PORT);
            heartbeats(scripted).await;
            Ok(())
        } => r,
        r = busy_loop(&daemon, &mut busy[0], &PODS[PODS.len() - 1]) => r,
        () = stop => Ok(()),
    };
    say.line("Stopping: the daemon drains, the engines close.");
    daemon.shutdown(Duration::from_secs(5)).await;
    for engine in engines {
        engine.close().await;
    }
    say.line("Stopped.");
    outcome
}

/// Ctrl-C, or the end of `--duration`.
async fn stop_signal(duration: Option<f64>) {
    let limit = async {
        match duration.filter(|d| d.is_finite() && *d >= 0.0) {
            Some(d) => tokio::time::sleep(Duration::from_secs_f64(d)).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = limit => {}
    }
}

/// Binds every engine: from `base` in steps of four ports, or on free ports.
async fn bind_engines(base: u16) -> anyhow::Result<Vec<SimEngine>> {
    let mut engines = Vec::new();
    for (i, pod) in PODS.iter().enumerate() {
        let (pub_port, replay_port) = match base {
            0 => (0, 0),
            b => {
                // Engine i takes ports b + 4i .. b + 4i + 3.
                let first = u16::try_from(i)
                    .ok()
                    .and_then(|i| i.checked_mul(scenario::PORTS_PER_ENGINE))
                    .and_then(|o| b.checked_add(o))
                    .filter(|f| f.checked_add(scenario::PORTS_PER_ENGINE - 1).is_some())
                    .context("--engine-port is too high for four engines")?;
                (first, first + 2)
            }
        };
        let engine = SimEngine::bind(pod.ranks, pub_port, replay_port)
            .await
            .with_context(|| format!("cannot start the simulated engine {}", pod.id()))?;
        engines.push(engine);
    }
    Ok(engines)
}

/// The `targets:` section for engines on these ports (what `examples/kvindex-demo.yaml`
/// holds for the default ports).
pub fn targets_yaml(ports: &[(u16, u16)]) -> String {
    let mut out = String::from("targets:\n");
    for (pod, (pub_port, replay_port)) in PODS.iter().zip(ports) {
        out.push_str(&format!(
            "  - pod: {}\n    namespace: {NAMESPACE}\n    model: {}\n    engine: {}\n    endpoint: tcp://127.0.0.1:{pub_port}\n    replay_endpoint: tcp://127.0.0.1:{replay_port}\n    dp_ranks: {}\n",
            pod.name,
            pod.model,
            pod.recording.engine.as_str(),
            pod.ranks
        ));
    }
    out
}

/// The daemon's config: listeners, the engines as targets, Redis when asked for.
fn config_yaml(args: &DemoArgs, engines: &[SimEngine]) -> String {
    let ports: Vec<(u16, u16)> = engines
        .iter()
        .map(|e| (e.pub_port(), e.replay_port()))
        .collect();
    let mut text = format!(
        "api:\n  listen: {}\nmetrics:\n  listen: {}\n",
        args.api_listen, args.metrics_listen
    );
    if let Some(url) = &args.redis {
        // A JSON string is a YAML string: the URL is quoted whatever it holds.
        text.push_str(&format!(
            "redis:\n  url: {}\n",
            serde_json::Value::from(url.as_str())
        ));
    }
    text + &targets_yaml(&ports)
}

/// Plays every scripted engine in turn, narrating what the daemon saw.
async fn play_all(
    daemon: &Daemon,
    engines: &mut [SimEngine],
    say: &mut Narrator,
) -> anyhow::Result<()> {
    wait_for(daemon, "every DP rank to connect", |d| {
        d.supervisor.connected_ranks() == PODS.iter().map(|p| usize::from(p.ranks)).sum::<usize>()
    })
    .await?;
    say.line("The daemon is connected to every DP rank of every engine.");
    for (pod, engine) in PODS.iter().zip(engines.iter_mut()) {
        say.line(&intent(pod));
        play(daemon, engine, pod).await?;
        say.line(&seen(daemon, pod));
    }
    let expected = scenario::expected_index(unix_now());
    let live = scripted_dump(&daemon.index.dump());
    let want = scripted_dump(&expected.dump());
    if live == want {
        say.line(&format!(
            "The live index holds exactly what the engines hold ({} resident (block, pod) entries), checked against the recordings applied without sockets.",
            live.len()
        ));
    } else {
        say.line(&format!(
            "WARNING: the live index ({} entries) differs from the recordings applied without sockets ({} entries).",
            live.len(),
            want.len()
        ));
    }
    Ok(())
}

/// The scripted pods' entries without store times, sorted.
fn scripted_dump(dump: &[DumpEntry]) -> Vec<DumpEntry> {
    let ids: Vec<String> = PODS
        .iter()
        .filter(|p| p.role != Role::Busy)
        .map(DemoPod::id)
        .collect();
    let mut out: Vec<DumpEntry> = dump
        .iter()
        .filter(|e| ids.contains(&e.pod))
        .cloned()
        .map(|mut e| {
            e.stored_at = 0;
            e
        })
        .collect();
    out.sort();
    out
}

/// Publishes one engine's script and waits until the daemon has applied all of it.
async fn play(daemon: &Daemon, engine: &mut SimEngine, pod: &DemoPod) -> anyhow::Result<()> {
    for (run, ranks) in pod.runs().iter().enumerate() {
        if run > 0 {
            restart(daemon, engine, pod).await?;
        }
        for (rank, messages) in ranks.iter().enumerate() {
            for (i, m) in messages.iter().enumerate() {
                if !pod.on_the_wire(rank, m) {
                    engine.drop_on_wire(rank, &m.frames)?;
                } else if i == 0 {
                    publish_first(daemon, engine, pod, rank, &m.frames).await?;
                } else {
                    engine.publish(rank, &m.frames).await?;
                }
                tokio::time::sleep(PACE).await;
            }
            let last = messages.last().map(scenario::seq_of);
            wait_for(daemon, &format!("{} rank {rank} to apply", pod.id()), |d| {
                rank_status(d, pod, rank).is_some_and(|s| s.last_seq == last)
            })
            .await?;
        }
    }
    Ok(())
}

/// Publishes a rank's first message until the daemon has it: until the SUB's subscription
/// reaches the PUB socket, ZeroMQ drops what is published (the slow joiner).
async fn publish_first(
    daemon: &Daemon,
    engine: &mut SimEngine,
    pod: &DemoPod,
    rank: usize,
    frames: &[Vec<u8>],
) -> anyhow::Result<()> {
    let before = rank_status(daemon, pod, rank).map_or(0, |s| s.stats.messages);
    for _ in 0..20 {
        engine.publish(rank, frames).await?;
        let seen = poll(FIRST_MESSAGE_WAIT, || {
            rank_status(daemon, pod, rank).is_some_and(|s| s.stats.messages > before)
        })
        .await;
        if seen {
            return Ok(());
        }
    }
    anyhow::bail!("{} rank {rank} never received its first message", pod.id())
}

/// Stops the engine (its sockets close, its replay buffer is lost), starts it again on the
/// same ports and waits until the daemon has reconnected to every rank.
async fn restart(daemon: &Daemon, engine: &mut SimEngine, pod: &DemoPod) -> anyhow::Result<()> {
    let connects: Vec<u64> = (0..engine.ranks())
        .map(|r| rank_status(daemon, pod, r).map_or(0, |s| s.connects))
        .collect();
    engine.stop().await;
    engine.start_again().await?;
    wait_for(daemon, &format!("{} to reconnect", pod.id()), |d| {
        connects.iter().enumerate().all(|(r, before)| {
            rank_status(d, pod, r)
                .is_some_and(|s| s.state == LinkState::Connected && s.connects > *before)
        })
    })
    .await
}

/// Sends an empty batch on every rank of every idle scripted engine once a second, forever:
/// a daemon that joins later (`examples/kvindex-demo.yaml`) learns the seq and replays the
/// engines' history from their replay endpoints.
async fn heartbeats(engines: &mut [SimEngine]) {
    let mut next: Vec<Vec<u64>> = PODS.iter().map(DemoPod::next_seqs).collect();
    let mut tick = tokio::time::interval(scenario::HEARTBEAT_EVERY);
    loop {
        tick.tick().await;
        for (engine, seqs) in engines.iter_mut().zip(next.iter_mut()) {
            for (rank, seq) in seqs.iter_mut().enumerate() {
                let _ = engine
                    .publish(rank, &crate::sim::bundled::heartbeat(*seq))
                    .await;
                *seq += 1;
            }
        }
    }
}

/// Loops the busy engine's rank 0 forever, with seqs that keep counting up; its first
/// message waits for the daemon like the scripted ones, so no replay is needed at the start.
async fn busy_loop(daemon: &Daemon, engine: &mut SimEngine, pod: &DemoPod) -> anyhow::Result<()> {
    let payloads: Vec<Vec<Vec<u8>>> = pod
        .recording
        .rank(0)
        .into_iter()
        .map(|m| m.frames)
        .collect();
    let Some(first) = payloads.first() else {
        return std::future::pending().await;
    };
    wait_for(daemon, &format!("{} to connect", pod.id()), |d| {
        rank_status(d, pod, 0).is_some_and(|s| s.state == LinkState::Connected)
    })
    .await?;
    publish_first(daemon, engine, pod, 0, first).await?;
    let mut tick = tokio::time::interval(BUSY_PACE);
    for seq in 1u64.. {
        tick.tick().await;
        let Some(frames) = payloads.get((seq % payloads.len() as u64) as usize) else {
            continue;
        };
        let mut frames = frames.clone();
        frames[1] = seq.to_be_bytes().to_vec();
        engine.publish(0, &frames).await?;
    }
    Ok(())
}

/// Polls `cond` every 20 ms until it holds or `timeout` passes.
async fn poll(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_for(
    daemon: &Daemon,
    what: &str,
    cond: impl Fn(&Daemon) -> bool,
) -> anyhow::Result<()> {
    if poll(SETTLE, || cond(daemon)).await {
        Ok(())
    } else {
        anyhow::bail!("gave up waiting for {what} after {} s", SETTLE.as_secs())
    }
}

#[cfg(test)]
mod tests {
    use super::{targets_yaml, DEFAULT_ENGINE_PORT};

    #[test]
    fn the_second_example_config_subscribes_to_the_demo_engines() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/kvindex-demo.yaml");
        let example =
            kvindex::config::Config::from_path(&path, &kvindex::config::ProcessEnv).unwrap();
        // The demo's default layout: four ports per engine, PUB ranks then replay ranks.
        let ports: Vec<(u16, u16)> = (0..4)
            .map(|i| (DEFAULT_ENGINE_PORT + 4 * i, DEFAULT_ENGINE_PORT + 4 * i + 2))
            .collect();
        let demo = kvindex::config::Config::from_str(&targets_yaml(&ports)).unwrap();
        assert_eq!(example.targets, demo.targets);
        assert_ne!(
            example.metrics_listen.port(),
            9090,
            "beside the demo's own listeners"
        );
    }
}

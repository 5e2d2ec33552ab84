//! One run: P simulated pods publishing to a real in-process daemon over real ZeroMQ, a
//! workload placed by one router, in real time.
//!
//! Timing of a request placed at `t` on a pod (prefill starts at once; the engine batches):
//! its hit is taken and its missing blocks stored at `t` (the oracle sees them from then
//! on); its prefill ends at `t + prefill`, `prefill = base + per-token × uncached tokens`;
//! the pod's event batch for these changes is published at `t + lag-scale × prefill`, and
//! never before an earlier change of that pod (a pod's batches leave in the order its cache
//! changed); the request stays in flight (its blocks referenced, counted as load) through
//! its decode, `output tokens × per-token decode time`; when it ends, the full blocks its
//! output completed are stored (vLLM caches decode blocks too) and published at once.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::sim::SimEngine;
use anyhow::{bail, Context};
use kvindex::ingest::replay_client::ReplayLimits;
use kvindex::{config::Config, Daemon};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::engine::{block_ids, max_hit_blocks, BlockId, PrefixCache, BLOCK_SIZE};
use crate::http::{get_text, metric_sum, Api};
use crate::report::{
    DaemonPredictions, EngineTotals, IngestCheck, Latency, Placements, Predictions, RunStats,
};
use crate::routers::{Router, RouterKind};
use crate::vllm;
use crate::workloads::{RequestSpec, Workload};

/// The served model every pod runs.
const MODEL: &str = "bench-model";
/// The namespace of every pod.
const NAMESPACE: &str = "bench";
/// How long the daemon may take to connect to every pod and to see a probe.
const CONNECT_DEADLINE: Duration = Duration::from_secs(30);
/// How long the daemon may take to receive the last published batch after a run.
const INGEST_DEADLINE: Duration = Duration::from_secs(5);

/// Everything about a run but the workload and the router.
#[derive(Debug, Clone)]
pub struct Setup {
    /// Simulated pods.
    pub pods: usize,
    /// GPU blocks per pod.
    pub gpu_blocks: usize,
    /// CPU offload blocks per pod (0: none).
    pub cpu_blocks: usize,
    /// Multiplies the engines' event delays (0: published at placement).
    pub lag_scale: f64,
    /// Matched blocks one request in flight costs a pod in the prefix rule.
    pub load_penalty: f64,
    /// Prefill time of a fully cached prompt, ms.
    pub prefill_base_ms: f64,
    /// Prefill time per uncached token, ms.
    pub prefill_ms_per_token: f64,
    /// Decode time per output token, ms.
    pub decode_ms_per_token: f64,
    /// `max_blocks` sent with every `/v1/score` (none: the daemon's default).
    pub max_blocks: Option<usize>,
    /// The daemon's `api.max_blocks` (none: its default).
    pub api_max_blocks: Option<usize>,
    /// The daemon's `speculative.ttl_ms` (none: its default).
    pub speculative_ttl_ms: Option<u64>,
    /// Sessions start within this; each then runs to its end.
    pub window: Duration,
    /// How long a run may go on after the window at most (later arrivals are cut).
    pub drain: Duration,
    /// The run's seed (router ties, engine hash salts).
    pub seed: u64,
}

/// A simulated pod: its cache, its publisher, its order of batches.
struct Pod {
    cache: PrefixCache,
    salt: u64,
    name: String,
    load: u32,
    routed: u64,
    /// When its last batch was (or will be) published: later batches never leave earlier.
    last_release: Duration,
    next_seq: u64,
    /// The pod's publisher task: frames and when to send them.
    outbox: mpsc::UnboundedSender<(Instant, Vec<Vec<u8>>)>,
}

/// A request in flight.
struct Flight {
    pod: usize,
    session: usize,
    ids: Vec<BlockId>,
    request: RequestSpec,
}

/// What happens at an instant of the run.
enum Due {
    Step { session: usize, step: usize },
    Feedback { request: usize },
    Finish { request: usize },
}

/// The run's state besides the daemon.
struct Run<'a> {
    setup: &'a Setup,
    workload: &'a Workload,
    kind: RouterKind,
    router: Router,
    pods: Vec<Pod>,
    queue: BTreeMap<(Duration, u64), Due>,
    order: u64,
    flights: Vec<Option<Flight>>,
    /// Each request's hit, blocks.
    hits: Vec<usize>,
    /// Each session's current step and its unfinished requests.
    progress: Vec<(usize, usize)>,
    arrivals_queued: usize,
    feedback_queued: usize,
    /// Sessions started whose last step has not finished.
    open_sessions: usize,
    start: Instant,
    stats: RunStats,
    predictions: Predictions,
    hidden: u64,
    truncated: u64,
    latencies: Vec<f64>,
    unknown_feedback: u64,
}

impl Run<'_> {
    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    fn at(&mut self, when: Duration, due: Due) {
        match due {
            Due::Step { .. } => self.arrivals_queued += 1,
            Due::Feedback { .. } => self.feedback_queued += 1,
            _ => {}
        }
        self.order += 1;
        self.queue.insert((when, self.order), due);
    }

    /// Hands a pod's batch to its publisher, to be sent no earlier than `due` nor than its
    /// previous batch. The publisher runs on its own clock, as an engine does: a batch
    /// leaves at its time whatever the router is doing.
    fn publish_after(&mut self, pod: usize, due: Duration, changes: &[crate::engine::Change]) {
        if changes.is_empty() {
            return;
        }
        let start = self.start;
        let p = &mut self.pods[pod];
        let when = due.max(p.last_release);
        p.last_release = when;
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let frames = vllm::frames(p.next_seq, vllm::payload(ts, p.salt, changes));
        p.next_seq += 1;
        // A closed outbox means the publisher failed, which the ingest check reports.
        let _ = p.outbox.send((start + when, frames));
    }

    async fn route(
        &mut self,
        api: &mut Api,
        request: &RequestSpec,
        ids: &[BlockId],
        id: usize,
    ) -> anyhow::Result<(usize, Option<usize>)> {
        let loads: Vec<u32> = self.pods.iter().map(|p| p.load).collect();
        let true_hits: Vec<u32> = self
            .pods
            .iter()
            .map(|p| p.cache.prefix_len(ids) as u32)
            .collect();
        if !self.kind.asks_kvindex() {
            let chosen = self.router.choose(&loads, &true_hits);
            return Ok((chosen, None));
        }
        let asked = Instant::now();
        let answer = api.score(&request.prompt, self.setup.max_blocks).await?;
        self.latencies.push(asked.elapsed().as_secs_f64() * 1000.0);
        let mut matched = vec![0u32; self.pods.len()];
        for s in &answer.scores {
            if let Some(i) = self.pods.iter().position(|p| p.name == s.pod) {
                matched[i] = s.matched_blocks;
            }
        }
        let chosen = self.router.choose(&loads, &matched);
        let longest = true_hits.iter().copied().max().unwrap_or(0) as usize;
        if longest > answer.total_blocks {
            self.hidden += 1;
        }
        if request.prompt.len().div_ceil(BLOCK_SIZE) > answer.total_blocks {
            self.truncated += 1;
        }
        if self.kind == RouterKind::KvindexSpeculative {
            let pod = self.pods[chosen].name.clone();
            api.routed(&request.prompt, &pod, &request_id(id)).await?;
        }
        // Capped like the daemon's own prediction: an engine always computes the last token.
        let predicted = (matched[chosen] as usize).min(max_hit_blocks(request.prompt.len()));
        Ok((chosen, Some(predicted)))
    }

    async fn arrive(&mut self, api: &mut Api, session: usize, step: usize) -> anyhow::Result<()> {
        let requests = self.workload.sessions[session].steps[step].requests.clone();
        self.progress[session] = (step, requests.len());
        for request in requests {
            let id = self.flights.len();
            let ids = block_ids(&request.prompt);
            let (chosen, predicted) = self.route(api, &request, &ids, id).await?;
            let admission = self.pods[chosen].cache.admit(&ids, &request.prompt);
            let hit = admission.hit_blocks;
            if let Some(predicted) = predicted {
                self.predictions.count(predicted, hit);
            }
            let len = request.prompt.len();
            self.stats.requests += 1;
            self.stats.prompt_tokens += len as u64;
            self.stats.cached_tokens += (hit * BLOCK_SIZE) as u64;
            self.stats.engines.cpu_cached_tokens += (admission.cpu_hit_blocks * BLOCK_SIZE) as u64;
            let pod = &mut self.pods[chosen];
            pod.load += 1;
            pod.routed += 1;
            let now = self.now();
            let prefill = ms(self.setup.prefill_base_ms
                + self.setup.prefill_ms_per_token * (len - hit * BLOCK_SIZE) as f64);
            let decode = ms(self.setup.decode_ms_per_token * request.output.len() as f64);
            self.publish_after(
                chosen,
                now + prefill.mul_f64(self.setup.lag_scale),
                &admission.changes,
            );
            if self.kind == RouterKind::KvindexSpeculative {
                self.at(now + prefill, Due::Feedback { request: id });
            }
            self.at(now + prefill + decode, Due::Finish { request: id });
            self.flights.push(Some(Flight {
                pod: chosen,
                session,
                ids,
                request,
            }));
            self.hits.push(hit);
        }
        Ok(())
    }

    fn finish(&mut self, request: usize) {
        let Some(flight) = self.flights[request].take() else {
            return;
        };
        let full: Vec<u32> = [
            flight.request.prompt.as_slice(),
            flight.request.output.as_slice(),
        ]
        .concat();
        let ids_full = block_ids(&full);
        let pod = &mut self.pods[flight.pod];
        let changes = pod.cache.acquire(&ids_full, &full);
        pod.cache.release(&ids_full);
        pod.cache.release(&flight.ids);
        pod.load -= 1;
        let now = self.now();
        self.publish_after(flight.pod, now, &changes);
        let session = flight.session;
        let (step, remaining) = &mut self.progress[session];
        *remaining -= 1;
        if *remaining == 0 {
            let next = *step + 1;
            match self.workload.sessions[session].steps.get(next) {
                Some(s) => {
                    let after = s.after;
                    self.at(
                        now + after,
                        Due::Step {
                            session,
                            step: next,
                        },
                    );
                }
                None => self.open_sessions -= 1,
            }
        }
    }

    async fn feedback(&mut self, api: &mut Api, request: usize) -> anyhow::Result<()> {
        let cached = self.hits[request] * BLOCK_SIZE;
        if !api.feedback(&request_id(request), cached).await? {
            self.unknown_feedback += 1;
        }
        Ok(())
    }

    async fn handle(&mut self, api: &mut Api, due: Due) -> anyhow::Result<()> {
        match due {
            Due::Step { session, step } => {
                self.arrivals_queued -= 1;
                self.arrive(api, session, step).await?;
            }
            Due::Feedback { request } => {
                self.feedback_queued -= 1;
                self.feedback(api, request).await?;
            }
            Due::Finish { request } => self.finish(request),
        }
        Ok(())
    }

    /// Plays the workload until no arrival is left and every feedback is sent (or the
    /// run's time is up).
    async fn play(&mut self, api: &mut Api) -> anyhow::Result<()> {
        for (session, s) in self.workload.sessions.iter().enumerate() {
            if s.start < self.setup.window && !s.steps.is_empty() {
                self.order += 1;
                self.arrivals_queued += 1;
                self.open_sessions += 1;
                self.queue.insert(
                    (s.start + s.steps[0].after, self.order),
                    Due::Step { session, step: 0 },
                );
            }
        }
        let deadline = self.setup.window + self.setup.drain;
        while self.arrivals_queued > 0 || self.feedback_queued > 0 || self.open_sessions > 0 {
            let Some(((when, _), _)) = self.queue.first_key_value() else {
                break;
            };
            if *when > deadline {
                self.stats.cut_requests = self
                    .queue
                    .values()
                    .map(|d| match d {
                        Due::Step { session, step } => {
                            let steps = &self.workload.sessions[*session].steps;
                            steps[*step..].iter().map(|s| s.requests.len() as u64).sum()
                        }
                        _ => 0,
                    })
                    .sum();
                break;
            }
            tokio::time::sleep_until((self.start + *when).into()).await;
            let Some((_, due)) = self.queue.pop_first() else {
                break;
            };
            self.handle(api, due).await?;
        }
        Ok(())
    }
}

/// A duration of `ms` milliseconds (negative: none).
fn ms(ms: f64) -> Duration {
    Duration::from_secs_f64(ms.max(0.0) / 1000.0)
}

fn request_id(id: usize) -> String {
    format!("bench-{id}")
}

/// Binds the pods' sockets, starts the daemon on them and waits until it has seen a
/// message of every pod.
async fn start(setup: &Setup) -> anyhow::Result<(Daemon, Vec<SimEngine>, Vec<String>)> {
    let mut engines = Vec::new();
    for _ in 0..setup.pods {
        engines.push(
            SimEngine::bind(1, 0, 0)
                .await
                .context("binding a pod's sockets")?,
        );
    }
    let mut yaml = String::from("api:\n  listen: 127.0.0.1:0\n");
    if let Some(n) = setup.api_max_blocks {
        yaml.push_str(&format!("  max_blocks: {n}\n"));
    }
    if let Some(ttl) = setup.speculative_ttl_ms {
        yaml.push_str(&format!("speculative:\n  ttl_ms: {ttl}\n"));
    }
    yaml.push_str("metrics:\n  listen: 127.0.0.1:0\ntargets:\n");
    let mut names = Vec::new();
    for (i, e) in engines.iter().enumerate() {
        yaml.push_str(&format!(
            "  - {{pod: pod-{i}, namespace: {NAMESPACE}, model: {MODEL}, engine: vllm, \
             endpoint: 'tcp://127.0.0.1:{}', replay_endpoint: 'tcp://127.0.0.1:{}'}}\n",
            e.pub_port(),
            e.replay_port()
        ));
        names.push(format!("pod-{i}.{NAMESPACE}"));
    }
    let config = Config::from_str(&yaml).context("the bench's daemon config")?;
    let daemon = Daemon::start(config, None, ReplayLimits::default())
        .await
        .context("starting the daemon")?;
    let deadline = Instant::now() + CONNECT_DEADLINE;
    while daemon.supervisor.connected_ranks() < setup.pods {
        if Instant::now() > deadline {
            bail!("the daemon did not connect to every pod within {CONNECT_DEADLINE:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok((daemon, engines, names))
}

/// What the daemon saw of one pod.
#[derive(Debug, Default)]
struct Seen {
    messages: u64,
    gaps: u64,
    resets: u64,
    invalid: u64,
}

/// What the daemon received from each pod, by pod name.
fn received(daemon: &Daemon) -> BTreeMap<String, Seen> {
    daemon
        .supervisor
        .status()
        .into_iter()
        .map(|t| {
            let mut seen = Seen::default();
            for r in &t.ranks {
                seen.messages += r.stats.messages;
                seen.gaps += r.stats.seq_gaps;
                seen.resets += r.stats.source_resets;
                seen.invalid +=
                    r.stats.invalid_events.values().sum::<u64>() + r.stats.apply.unresolved_stores;
            }
            (t.target.pod_id(), seen)
        })
        .collect()
}

/// Publishes empty batches (vLLM's heartbeat shape) on each pod until the daemon has seen
/// one: a PUB drops what it sends before the subscription arrives. Returns the next seq of
/// each pod.
async fn probe(
    daemon: &Daemon,
    engines: &mut [SimEngine],
    names: &[String],
) -> anyhow::Result<Vec<u64>> {
    let mut seqs = vec![0u64; engines.len()];
    let deadline = Instant::now() + CONNECT_DEADLINE;
    loop {
        let seen = received(daemon);
        let mut waiting = false;
        for (i, engine) in engines.iter_mut().enumerate() {
            if seen.get(&names[i]).is_some_and(|s| s.messages > 0) {
                continue;
            }
            waiting = true;
            let frames = vllm::frames(seqs[i], vllm::payload(0.0, 0, &[]));
            engine.publish(0, &frames).await?;
            seqs[i] += 1;
        }
        if !waiting {
            return Ok(seqs);
        }
        if Instant::now() > deadline {
            bail!("the daemon saw no probe of some pod within {CONNECT_DEADLINE:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The daemon's prediction counters now.
async fn daemon_counters(daemon: &Daemon) -> anyhow::Result<[f64; 3]> {
    let text = get_text(daemon.metrics_addr, "/metrics").await?;
    let m = "kvindex_route_predictions_total";
    Ok([
        metric_sum(&text, m, "outcome=\"exact\""),
        metric_sum(&text, m, "outcome=\"over\""),
        metric_sum(&text, m, "outcome=\"under\""),
    ])
}

/// Runs `workload` placed by `kind` and returns what it measured.
///
/// # Errors
/// When the daemon cannot start, the API fails, or a router's endpoint is missing.
pub async fn run(setup: &Setup, workload: &Workload, kind: RouterKind) -> anyhow::Result<RunStats> {
    let (daemon, mut engines, names) = start(setup).await?;
    let seqs = probe(&daemon, &mut engines, &names).await?;
    let probes: u64 = seqs.iter().sum();
    let stop = CancellationToken::new();
    let mut outboxes = Vec::new();
    let mut publishers = Vec::new();
    for engine in engines {
        let (tx, rx) = mpsc::unbounded_channel();
        outboxes.push(tx);
        publishers.push(tokio::spawn(publisher(engine, rx, stop.clone())));
    }
    let api_addr = daemon.api_addr.context("the daemon serves no API")?;
    let mut api = Api::connect(api_addr, MODEL, &names).await?;
    let before = daemon_counters(&daemon).await?;
    let pods = outboxes
        .into_iter()
        .zip(seqs)
        .enumerate()
        .map(|(i, (outbox, next_seq))| Pod {
            cache: PrefixCache::new(setup.gpu_blocks, setup.cpu_blocks),
            salt: vllm::pod_salt(setup.seed, i),
            name: names[i].clone(),
            load: 0,
            routed: 0,
            last_release: Duration::ZERO,
            next_seq,
            outbox,
        })
        .collect();
    let mut run = Run {
        setup,
        workload,
        kind,
        router: Router::new(kind, setup.load_penalty, setup.seed),
        pods,
        queue: BTreeMap::new(),
        order: 0,
        flights: Vec::new(),
        hits: Vec::new(),
        progress: vec![(0, 0); workload.sessions.len()],
        arrivals_queued: 0,
        feedback_queued: 0,
        open_sessions: 0,
        start: Instant::now(),
        stats: RunStats {
            workload: workload.name.clone(),
            router: kind.name().to_owned(),
            ..RunStats::default()
        },
        predictions: Predictions::default(),
        hidden: 0,
        truncated: 0,
        latencies: Vec::new(),
        unknown_feedback: 0,
    };
    let played = run.play(&mut api).await;
    run.stats.seconds = run.start.elapsed().as_secs_f64();
    let mut stats = run.finish_stats();
    drop(run);
    // Batches still waiting for their time are never sent: the run is over.
    stop.cancel();
    let mut sent = 0;
    for p in publishers {
        sent += p.await.unwrap_or(0);
    }
    let published = sent + probes;
    let ingest = wait_ingest(&daemon, published).await;
    stats.ingest = ingest;
    if kind == RouterKind::KvindexSpeculative {
        let p = daemon.index.speculative().stats();
        stats.placements = Some(Placements {
            placed: p.placed,
            confirmed: p.confirmed,
            expired: p.expired,
            dropped: p.dropped,
            evicted: p.evicted,
        });
        let after = daemon_counters(&daemon).await?;
        stats.daemon_predictions = Some(DaemonPredictions {
            exact: (after[0] - before[0]) as u64,
            over: (after[1] - before[1]) as u64,
            under: (after[2] - before[2]) as u64,
            unknown_feedback: stats.daemon_predictions.map_or(0, |d| d.unknown_feedback),
        });
    }
    daemon.shutdown(Duration::from_secs(5)).await;
    played?;
    Ok(stats)
}

/// One pod's publisher: sends each batch at its time, in order, until the outbox closes or
/// the run stops; returns how many it sent.
async fn publisher(
    mut engine: SimEngine,
    mut outbox: mpsc::UnboundedReceiver<(Instant, Vec<Vec<u8>>)>,
    stop: CancellationToken,
) -> u64 {
    let mut sent = 0u64;
    loop {
        let next = tokio::select! {
            biased;
            () = stop.cancelled() => break,
            next = outbox.recv() => next,
        };
        let Some((when, frames)) = next else {
            break;
        };
        tokio::select! {
            biased;
            () = stop.cancelled() => break,
            () = tokio::time::sleep_until(when.into()) => {}
        }
        if engine.publish(0, &frames).await.is_ok() {
            sent += 1;
        }
        // The zeromq crate's PUB stalls under a flat-out loop.
        tokio::task::yield_now().await;
    }
    engine.close().await;
    sent
}

/// Waits (bounded) until the daemon has received `published` messages; what it saw.
async fn wait_ingest(daemon: &Daemon, published: u64) -> IngestCheck {
    let deadline = Instant::now() + INGEST_DEADLINE;
    loop {
        let seen = received(daemon);
        let check = IngestCheck {
            published,
            received: seen.values().map(|s| s.messages).sum(),
            gaps: seen.values().map(|s| s.gaps).sum(),
            resets: seen.values().map(|s| s.resets).sum(),
            invalid: seen.values().map(|s| s.invalid).sum(),
        };
        if check.received >= published || Instant::now() > deadline {
            return check;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

impl Run<'_> {
    fn finish_stats(&mut self) -> RunStats {
        let mut stats = std::mem::take(&mut self.stats);
        stats.per_pod = self.pods.iter().map(|p| p.routed).collect();
        let mut engines = EngineTotals {
            cpu_cached_tokens: stats.engines.cpu_cached_tokens,
            ..EngineTotals::default()
        };
        for p in &self.pods {
            let c = p.cache.stats();
            engines.gpu_evictions += c.gpu_evictions;
            engines.cpu_evictions += c.cpu_evictions;
            engines.overflows += c.overflows;
        }
        stats.engines = engines;
        if self.kind.asks_kvindex() {
            stats.predictions = Some(self.predictions);
            stats.hidden_prefix_routes = Some(self.hidden);
            stats.truncated_prompts = Some(self.truncated);
            stats.score_latency = Latency::of(std::mem::take(&mut self.latencies));
        }
        if self.kind == RouterKind::KvindexSpeculative {
            stats.daemon_predictions = Some(DaemonPredictions {
                unknown_feedback: self.unknown_feedback,
                ..DaemonPredictions::default()
            });
        }
        stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workloads::{Rng, Session, Step};

    fn request(prompt: Vec<u32>, output: usize, rng: &mut Rng) -> RequestSpec {
        RequestSpec {
            prompt: prompt.into(),
            output: rng.tokens(output).into(),
        }
    }

    /// Two chats over one system prompt and a fan-out round, small enough to evict.
    fn tiny() -> Workload {
        let mut rng = Rng::new(9, 9);
        let system = rng.tokens(64);
        let chat = |rng: &mut Rng, start_ms: u64| {
            let first = [system.clone(), rng.tokens(40)].concat();
            let one = request(first.clone(), 20, rng);
            let second = [first, one.output.to_vec(), rng.tokens(30)].concat();
            Session {
                start: Duration::from_millis(start_ms),
                steps: vec![
                    Step {
                        after: Duration::ZERO,
                        requests: vec![one],
                    },
                    Step {
                        after: Duration::from_millis(30),
                        requests: vec![request(second, 10, rng)],
                    },
                ],
            }
        };
        let sessions = vec![chat(&mut rng, 0), chat(&mut rng, 50), {
            let context = rng.tokens(100);
            let requests = (0..3)
                .map(|_| {
                    let prompt = [context.clone(), rng.tokens(20)].concat();
                    request(prompt, 5, &mut rng)
                })
                .collect();
            Session {
                start: Duration::from_millis(100),
                steps: vec![Step {
                    after: Duration::ZERO,
                    requests,
                }],
            }
        }];
        Workload {
            name: "tiny".into(),
            sessions,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_daemon_receives_and_accepts_every_batch_the_pods_publish() {
        let setup = Setup {
            pods: 2,
            gpu_blocks: 12,
            cpu_blocks: 4,
            lag_scale: 0.5,
            load_penalty: 8.0,
            prefill_base_ms: 5.0,
            prefill_ms_per_token: 0.08,
            decode_ms_per_token: 1.0,
            max_blocks: None,
            api_max_blocks: None,
            speculative_ttl_ms: None,
            window: Duration::from_secs(1),
            drain: Duration::from_secs(10),
            seed: 1,
        };
        let workload = tiny();
        for kind in [RouterKind::Kvindex, RouterKind::Oracle] {
            let stats = run(&setup, &workload, kind).await.expect("a run");
            assert_eq!(stats.requests, workload.requests() as u64, "{kind:?}");
            assert_eq!(stats.cut_requests, 0);
            assert!(
                stats.engines.gpu_evictions > 0,
                "the pools are small enough to evict"
            );
            let ingest = stats.ingest;
            assert_eq!(ingest.received, ingest.published, "{kind:?}: {ingest:?}");
            assert_eq!(
                (ingest.gaps, ingest.resets, ingest.invalid),
                (0, 0, 0),
                "{kind:?}"
            );
            assert!(stats.cached_tokens > 0);
        }
    }
}

//! The daemon behind `kvindex serve`, as a library: [`Daemon`] is the composition root that
//! wires config → index → mirror → subscribers → HTTP, so tests and embedders start the same
//! thing the binary does.
//!
//! | file | job |
//! | --- | --- |
//! | `mod.rs` | [`Daemon`]: start in order, shut down in order, [`DaemonError`] |
//! | `health.rs` | the `/metrics`, `/healthz`, `/readyz` router |
//! | `gauges.rs` | the loop that refreshes gauges computed from state |
//! | `fds.rs` | the descriptor budget: raise `RLIMIT_NOFILE`, keep a reserve, share the rest |
//! | `reload.rs` | hot reload: config file changes (notify) and SIGHUP → the supervisor's new target set |
//!
//! Shutdown follows one order, bounded by one deadline: stop accepting (listeners, config
//! reload, gauges) → stop subscribers → flush the mirror → exit.

mod fds;
mod gauges;
mod health;
mod reload;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::api::ConnLimits;
use crate::config::{ApiConfig, Config};
use crate::index::Index;
use crate::ingest::discovery::{self, DiscoveryError, DiscoveryHealth};
use crate::ingest::replay_client::ReplayLimits;
use crate::ingest::supervisor::Supervisor;
use crate::score::ScoreBackend;
use crate::store::redis::lease::{
    replica_identity, Eligibility, LeaseGate, LeaseSettings, LeaseThread,
};
use crate::store::redis::{MirrorError, MirrorHandle, MirrorStop};
use reload::reload_loop;

/// Header-read (and idle) timeout of the metrics listener: scrapers and probes send at once.
const METRICS_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a daemon could not start.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The Redis mirror could not connect or authenticate.
    #[error("cannot start the Redis mirror")]
    Mirror(#[source] MirrorError),
    /// A listen address could not be bound.
    #[error("cannot bind the {listener} listener on {addr}")]
    Bind {
        /// Which listener (`metrics` or `API`).
        listener: &'static str,
        /// The configured address.
        addr: SocketAddr,
        /// What the OS reported.
        #[source]
        source: std::io::Error,
    },
    /// The API's Redis scoring backend (sharded replicas) could not connect.
    #[error("cannot start the API's Redis scoring backend")]
    ScoreBackend(#[source] crate::score::RedisLookupError),
    /// The Kubernetes client for `discovery.kubernetes` could not be built.
    #[error("cannot start Kubernetes discovery")]
    Discovery(#[source] DiscoveryError),
    /// The HA lease's connection to Redis could not be opened.
    #[error("cannot start the HA lease")]
    Lease(#[source] MirrorError),
}

/// How long a connected rank without messages waits before it counts as caught up (an idle
/// engine has nothing newer to tell), for a standby's eligibility to lead.
const CAUGHT_UP_SETTLE: Duration = Duration::from_secs(1);

/// The running lease task (`ha:` with `redis:`).
struct LeaseRun {
    gate: Arc<LeaseGate>,
    stop: CancellationToken,
    thread: LeaseThread,
}

/// A running daemon.
pub struct Daemon {
    /// The in-memory index (the truth).
    pub index: Index,
    /// The targets.
    pub supervisor: Arc<Supervisor>,
    /// Where `/metrics`, `/healthz`, `/readyz` are served.
    pub metrics_addr: SocketAddr,
    /// Where the API is served, when configured.
    pub api_addr: Option<SocketAddr>,
    /// Kubernetes discovery's health, when discovery is configured.
    pub discovery: Option<DiscoveryHealth>,
    cancel: CancellationToken,
    /// Child of `cancel` for what accepts work from outside (listeners, reload, gauges):
    /// cancelled first on shutdown.
    accept: CancellationToken,
    mirror: Option<Arc<MirrorHandle>>,
    tasks: Vec<JoinHandle<()>>,
    lease: Option<LeaseRun>,
}

/// The listeners, bound before any task is spawned so a failed bind leaves nothing running.
struct Listeners {
    metrics: Bound,
    api: Option<(Bound, ApiConfig)>,
}

/// A bound listener and the address it got (the port the OS chose for `:0`).
struct Bound {
    listener: TcpListener,
    addr: SocketAddr,
}

impl Daemon {
    /// Starts everything a config asks for. `config_path` enables hot reload.
    ///
    /// # Errors
    /// [`DaemonError`] when a listener cannot bind or the mirror cannot start.
    pub async fn start(
        config: Config,
        config_path: Option<PathBuf>,
        replay_limits: ReplayLimits,
    ) -> Result<Daemon, DaemonError> {
        let cancel = CancellationToken::new();
        let accept = cancel.child_token();
        let index = Index::with_options(config.index_options());
        let fds = fds::raise_and_split();
        // Installed before the mirror starts, so its start-up counts are kept.
        let metrics = crate::metrics::install();
        let lease = connect_lease(&config).await?;
        let mirror = start_mirror(&config, &index, lease.as_ref().map(LeaseThread::gate)).await?;
        // Built before any port is bound: a bad kubeconfig fails the start.
        let kube_client = match &config.discovery {
            Some(k) => Some(
                discovery::client_for(&k.access)
                    .await
                    .map_err(DaemonError::Discovery)?,
            ),
            None => None,
        };
        let backend = score_backend(&config, &index).await?;
        let listeners = bind_listeners(&config).await?;
        let metrics_addr = listeners.metrics.addr;
        let api_addr = listeners.api.as_ref().map(|(bound, _)| bound.addr);
        let supervisor = Supervisor::new(
            index.clone(),
            mirror
                .as_ref()
                .map(|m| Arc::new(m.sender()) as Arc<dyn crate::index::DeltaMirror>),
            cancel.child_token(),
            replay_limits,
        );
        supervisor.set_max_frame_bytes(config.ingest.max_frame_bytes);
        supervisor.set_shard(config.shard);
        let mut daemon = Daemon {
            index,
            supervisor,
            metrics_addr,
            api_addr,
            discovery: kube_client.as_ref().map(|_| DiscoveryHealth::default()),
            cancel,
            accept,
            mirror,
            tasks: Vec::new(),
            lease: None,
        };
        daemon.spawn_lease(lease, config.shard);
        daemon.serve(listeners, metrics.clone(), &config, fds, backend);
        daemon.claim_restored(&config);
        daemon.start_targets(&config, config_path).await;
        daemon.start_discovery(&config, kube_client);
        daemon.spawn_gauges(metrics);
        log_started(&config, metrics_addr, api_addr);
        Ok(daemon)
    }

    /// Runs the lease task: the writer of this replica's shard is whoever holds it, and a
    /// standby may take it only once its sources are caught up.
    fn spawn_lease(&mut self, lease: Option<LeaseThread>, shard: crate::shard::Shard) {
        let Some(mut thread) = lease else {
            return;
        };
        let supervisor = self.supervisor.clone();
        let discovery = self.discovery.clone();
        // Discovery must have listed the pods once: before that, "every target caught up"
        // is true of an empty set. A later watch error keeps the targets, so it does not
        // keep a standby from leading.
        let eligible: Eligibility = Arc::new(move || {
            let listed = discovery.as_ref().is_none_or(|d| d.status().synced);
            listed && supervisor.caught_up(CAUGHT_UP_SETTLE)
        });
        let gate = thread.gate();
        let stop = CancellationToken::new();
        thread.begin(eligible, shard, stop.clone());
        self.lease = Some(LeaseRun { gate, stop, thread });
    }

    /// Serves the health router and, when configured, the API.
    fn serve(
        &mut self,
        listeners: Listeners,
        metrics: Option<PrometheusHandle>,
        config: &Config,
        fds: fds::FdBudget,
        backend: ScoreBackend,
    ) {
        let gate = self.lease.as_ref().map(|l| l.gate.clone());
        let health = health::router(
            metrics,
            self.mirror.clone(),
            self.discovery.clone(),
            self.supervisor.clone(),
            gate.clone(),
        );
        let limits = ConnLimits {
            max_connections: fds.metrics,
            header_read_timeout: METRICS_HEADER_READ_TIMEOUT,
        };
        let metrics = spawn_server("metrics", listeners.metrics, health, limits, &self.accept);
        self.tasks.push(metrics);
        if let Some((bound, api)) = listeners.api {
            let auth = api.token.is_some();
            let prompt = prompt_limits(&api);
            let state = crate::api::ApiState::new(
                backend,
                config.weights.clone(),
                api.token,
                self.supervisor.clone(),
            )
            .with_prompt(prompt)
            .with_writer(gate);
            if !auth {
                warn!("The API is served without auth: api.token is not set.");
            }
            let router = crate::api::router(state);
            let limits = ConnLimits {
                max_connections: api.max_connections.min(fds.api),
                header_read_timeout: api.header_read_timeout,
            };
            if limits.max_connections < api.max_connections {
                warn!(
                    configured = api.max_connections,
                    allowed = limits.max_connections,
                    "The open-file limit leaves fewer API connections than api.max_connections."
                );
            }
            self.tasks
                .push(spawn_server("API", bound, router, limits, &self.accept));
        }
    }

    /// Hands the sources the warm start rebuilt to the supervisor, which forgets those no
    /// target claims once the target set is known.
    fn claim_restored(&self, config: &Config) {
        let Some(restored) = self.mirror.as_ref().and_then(|m| m.restored()) else {
            return;
        };
        info!(
            sources = restored.sources.len(),
            engine_blocks = restored.engine_blocks,
            bad_entries = restored.bad_entries,
            other_shards = restored.other_shards,
            took_ms = restored.took_ms,
            "Warm start: rebuilt the index from the Redis checkpoint."
        );
        crate::metrics::restored(restored.engine_blocks, restored.took_ms);
        let sources = restored
            .sources
            .iter()
            .map(|(spec, _)| (spec.pod.clone(), spec.dp_rank))
            .collect();
        self.supervisor
            .expect_restored(sources, config.discovery.is_some());
    }

    /// Subscribes to the configured targets and, with a config file, follows its changes.
    async fn start_targets(&mut self, config: &Config, config_path: Option<PathBuf>) {
        self.supervisor.apply(config.targets.clone()).await;
        if let Some(path) = config_path {
            let reload = reload_loop(path, self.supervisor.clone(), self.accept.child_token());
            self.tasks.push(tokio::spawn(reload));
        }
    }

    /// Feeds the supervisor the pods that `discovery.kubernetes` finds, next to the static
    /// targets; it stops with the listeners, before the subscribers.
    fn start_discovery(&mut self, config: &Config, client: Option<kube::Client>) {
        let (Some(k), Some(client), Some(health)) =
            (config.discovery.clone(), client, self.discovery.clone())
        else {
            return;
        };
        let supervisor = self.supervisor.clone();
        let running = discovery::spawn(k, client, supervisor, health, self.accept.child_token());
        self.tasks.push(running.task);
    }

    /// Refreshes the gauges, and keeps `recorder` (when installed) from piling up samples.
    fn spawn_gauges(&mut self, recorder: Option<PrometheusHandle>) {
        self.tasks.push(tokio::spawn(gauges::refresh_loop(
            self.supervisor.clone(),
            self.index.clone(),
            self.mirror.clone(),
            recorder,
            self.accept.child_token(),
        )));
    }

    /// The Redis mirror's current figures, when Redis is configured.
    pub fn mirror_stats(&self) -> Option<crate::store::redis::MirrorStats> {
        self.mirror.as_ref().map(|m| m.stats())
    }

    /// Stops accepting, stops subscribers, flushes and stops the mirror and exits, within
    /// `deadline`. Returns how the mirror stopped, when Redis is configured.
    pub async fn shutdown(self, deadline: Duration) -> Option<MirrorStop> {
        let ends = Instant::now() + deadline;
        self.accept.cancel();
        let stopped = futures::future::join_all(self.tasks);
        if tokio::time::timeout(deadline / 4, stopped).await.is_err() {
            warn!("Listeners did not stop in time; going on with the shutdown.");
        }
        if let Some(lease) = &self.lease {
            lease.gate.stop_acquiring();
        }
        let left = ends.saturating_duration_since(Instant::now());
        self.supervisor.shutdown(left.min(deadline / 2)).await;
        let mirror_stop = match &self.mirror {
            Some(mirror) => Some(shut_mirror_down(mirror, ends).await),
            None => None,
        };
        if let Some(lease) = self.lease {
            release_lease(lease, ends).await;
        }
        self.cancel.cancel();
        log_stopped(&self.index, self.mirror.as_deref(), mirror_stop);
        mirror_stop
    }
}

/// Says where every listener is and what the daemon subscribes to, at start.
fn log_started(config: &Config, metrics: SocketAddr, api: Option<SocketAddr>) {
    let api = api.map_or_else(|| "off".to_owned(), |a| format!("http://{a}"));
    let redis = config.redis.as_ref().map_or_else(
        || "off (in-memory index only)".to_owned(),
        |r| r.target.shown(),
    );
    info!(
        api = %api,
        metrics = %format!("http://{metrics}/metrics"),
        health = %format!("http://{metrics}/readyz"),
        targets = config.targets.len(),
        shard_index = config.shard.index,
        shard_count = config.shard.count,
        discovery = config.discovery.is_some(),
        redis = %redis,
        "kvindex serve started: API at {api}, metrics at http://{metrics}/metrics, {} static targets.",
        config.targets.len()
    );
}

/// Says what the shutdown left behind: the index's size and how the mirror flushed.
fn log_stopped(index: &Index, mirror: Option<&MirrorHandle>, stop: Option<MirrorStop>) {
    let resident = index
        .stats()
        .entries_by_medium
        .iter()
        .map(|(_, n)| n)
        .sum::<usize>();
    match (mirror, stop) {
        (Some(m), Some(stop)) => {
            let st = m.stats();
            info!(
                resident_entries = resident,
                mirror = ?stop,
                redis_commands = st.commands,
                redis_pipelines = st.pipelines,
                queue_left = st.queue_depth,
                "kvindex serve stopped: the Redis mirror flushed ({stop:?}); {} commands in {} pipelines written in total.",
                st.commands,
                st.pipelines
            );
        }
        _ => info!(
            resident_entries = resident,
            "kvindex serve stopped: no Redis mirror to flush; the in-memory index ({resident} entries) ends with the process."
        ),
    }
}

/// Shuts the mirror down: the one place the daemon's shutdown stops the Redis writer, with
/// whatever is left of the deadline.
async fn shut_mirror_down(mirror: &MirrorHandle, ends: Instant) -> MirrorStop {
    mirror
        .shutdown(ends.saturating_duration_since(Instant::now()))
        .await
}

/// Releases the lease after the mirror's last flush (a leader's compare-and-delete), so a
/// standby takes over at once rather than after the ttl.
async fn release_lease(lease: LeaseRun, ends: Instant) {
    lease.stop.cancel();
    let left = ends.saturating_duration_since(Instant::now());
    if tokio::time::timeout(left, lease.thread.finished())
        .await
        .is_err()
    {
        warn!("The HA lease was not released in time; a standby takes it when it expires.");
    }
}

/// The HA lease's connection, when the config has `ha:` and `redis:`.
async fn connect_lease(config: &Config) -> Result<Option<LeaseThread>, DaemonError> {
    let (Some(ha), Some(redis)) = (config.ha, &config.redis) else {
        if config.ha.is_some() {
            warn!("ha: has no effect without redis: there is no writer to elect, and replicas are independent.");
        }
        return Ok(None);
    };
    let settings = LeaseSettings {
        ttl: ha.lease_ttl,
        shard: config.shard,
        replica: replica_identity(),
    };
    let lease = LeaseThread::start(&redis.target, settings)
        .await
        .map_err(DaemonError::Lease)?;
    info!(
        lease_ttl_ms = ha.lease_ttl.as_millis() as u64,
        replica = %lease.gate().view().replica,
        "HA: this replica starts as a standby; it writes Redis once it holds the lease."
    );
    Ok(Some(lease))
}

/// The Redis mirror, when the config has one; behind `lease` with `ha:`.
async fn start_mirror(
    config: &Config,
    index: &Index,
    lease: Option<Arc<LeaseGate>>,
) -> Result<Option<Arc<MirrorHandle>>, DaemonError> {
    let Some(redis) = &config.redis else {
        return Ok(None);
    };
    // The daemon keeps a checkpoint next to kthena's keys, so a restart goes on where it was.
    let redis = crate::store::redis::RedisConfig {
        checkpoint: true,
        shard: config.shard,
        ..redis.clone()
    };
    let mirror = MirrorHandle::start_behind(redis, index.clone(), config.weights.clone(), lease)
        .await
        .map_err(DaemonError::Mirror)?;
    Ok(Some(Arc::new(mirror)))
}

/// What the API scores from: the in-memory index with one replica; Redis with several, as
/// this replica's index holds only the pods it owns and Redis holds every replica's.
async fn score_backend(config: &Config, index: &Index) -> Result<ScoreBackend, DaemonError> {
    match &config.redis {
        Some(redis) if config.shard.is_sharded() && config.api.is_some() => {
            ScoreBackend::redis(&redis.target)
                .await
                .map_err(DaemonError::ScoreBackend)
        }
        _ => Ok(ScoreBackend::Index(index.clone())),
    }
}

async fn bind_listeners(config: &Config) -> Result<Listeners, DaemonError> {
    let metrics = bind("metrics", config.metrics_listen).await?;
    let api = match &config.api {
        Some(api) => Some((bind("API", api.listen).await?, api.clone())),
        None => None,
    };
    Ok(Listeners { metrics, api })
}

async fn bind(listener: &'static str, addr: SocketAddr) -> Result<Bound, DaemonError> {
    let failed = |source| DaemonError::Bind {
        listener,
        addr,
        source,
    };
    let bound = TcpListener::bind(addr).await.map_err(failed)?;
    let addr = bound.local_addr().map_err(failed)?;
    Ok(Bound {
        listener: bound,
        addr,
    })
}

/// Serves `router` within `limits` until `accept` is cancelled, then drains open requests.
fn spawn_server(
    name: &'static str,
    bound: Bound,
    router: axum::Router,
    limits: ConnLimits,
    accept: &CancellationToken,
) -> JoinHandle<()> {
    let stop = accept.child_token();
    info!(listener = name, addr = %bound.addr, max_connections = limits.max_connections,
        header_read_timeout_ms = limits.header_read_timeout.as_millis() as u64, "Listening.");
    tokio::spawn(async move {
        let shutdown = async move { stop.cancelled().await };
        let served = crate::api::serve_limited(bound.listener, router, shutdown, limits).await;
        if let Err(err) = served {
            warn!(error = %err, listener = name, "A listener failed.");
        }
    })
}

/// How the API cuts prompts: `api.max_blocks` for `prefix`, `api.kthena_max_blocks` for
/// `kthena`, kthena's block size for both.
fn prompt_limits(api: &crate::config::ApiConfig) -> crate::api::PromptLimits {
    let defaults = crate::api::PromptLimits::default();
    let cut =
        |max_blocks| crate::score::PromptSettings::new(crate::hash::DEFAULT_BLOCK_SIZE, max_blocks);
    crate::api::PromptLimits {
        prefix: cut(api.max_blocks).unwrap_or(defaults.prefix),
        kthena: cut(api.kthena_max_blocks).unwrap_or(defaults.kthena),
    }
}

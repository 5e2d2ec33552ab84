//! `kvindex serve`: the daemon. [`Daemon`] wires config → index → subscribers → mirror →
//! HTTP, so tests start the same thing in-process.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::UsageError;
use crate::config::{Config, ProcessEnv};
use crate::index::Index;
use crate::ingest::replay_client::ReplayLimits;
use crate::ingest::supervisor::{reload_loop, Supervisor};
use crate::store::redis::{MirrorHandle, MirrorStop};

/// Arguments of `kvindex serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// The YAML config file (reloaded on change or SIGHUP).
    #[arg(long, short, env = "KVINDEX_CONFIG")]
    pub config: PathBuf,
    /// Seconds allowed for draining on SIGINT / SIGTERM.
    #[arg(long, default_value_t = 10)]
    pub shutdown_deadline: u64,
}

/// How often gauges computed from state (ages, residency, mirror) are refreshed.
const GAUGE_INTERVAL: Duration = Duration::from_secs(5);

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
    cancel: CancellationToken,
    mirror: Option<Arc<MirrorHandle>>,
    tasks: Vec<JoinHandle<()>>,
}

#[derive(Clone)]
struct HealthState {
    metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    mirror: Option<Arc<MirrorHandle>>,
}

async fn metrics_page(State(s): State<HealthState>) -> (StatusCode, String) {
    match &s.metrics {
        Some(h) => (StatusCode::OK, crate::metrics::render(h)),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            "no metrics recorder\n".to_owned(),
        ),
    }
}

async fn readyz(State(s): State<HealthState>) -> (StatusCode, &'static str) {
    // Config is loaded by construction; Redis must answer when one is configured.
    match &s.mirror {
        Some(m) if !m.is_healthy() => (StatusCode::SERVICE_UNAVAILABLE, "redis unreachable\n"),
        _ => (StatusCode::OK, "ready\n"),
    }
}

impl Daemon {
    /// Starts everything a config asks for. `config_path` enables hot reload.
    ///
    /// # Errors
    /// When a listener cannot bind or the mirror cannot start.
    pub async fn start(
        config: Config,
        config_path: Option<PathBuf>,
        replay_limits: ReplayLimits,
    ) -> anyhow::Result<Daemon> {
        let cancel = CancellationToken::new();
        let index = Index::new();
        let metrics = crate::metrics::install();
        let mirror = match &config.redis {
            Some(redis) => Some(Arc::new(
                MirrorHandle::start(redis.clone(), index.clone(), config.weights.clone())
                    .await
                    .context("cannot start the Redis mirror")?,
            )),
            None => None,
        };
        let supervisor = Supervisor::new(
            index.clone(),
            mirror
                .as_ref()
                .map(|m| Arc::new(m.sender()) as Arc<dyn crate::index::DeltaMirror>),
            cancel.child_token(),
            replay_limits,
        );
        let mut tasks = Vec::new();

        let listener = tokio::net::TcpListener::bind(config.metrics_listen)
            .await
            .with_context(|| format!("cannot bind metrics on {}", config.metrics_listen))?;
        let metrics_addr = listener.local_addr()?;
        let app = axum::Router::new()
            .route("/metrics", get(metrics_page))
            .route("/healthz", get(|| async { "ok\n" }))
            .route("/readyz", get(readyz))
            .with_state(HealthState {
                metrics,
                mirror: mirror.clone(),
            });
        let c = cancel.child_token();
        tasks.push(tokio::spawn(async move {
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(async move { c.cancelled().await })
                .await;
            if let Err(err) = served {
                warn!(error = %err, "Metrics listener failed.");
            }
        }));

        let mut api_addr = None;
        if let Some(api) = &config.api {
            let listener = tokio::net::TcpListener::bind(api.listen)
                .await
                .with_context(|| format!("cannot bind the API on {}", api.listen))?;
            api_addr = Some(listener.local_addr()?);
            let state = crate::api::ApiState::new(
                index.clone(),
                config.weights.clone(),
                api.token.clone(),
                supervisor.clone(),
            );
            let app = crate::api::router(state);
            let c = cancel.child_token();
            tasks.push(tokio::spawn(async move {
                let served = axum::serve(listener, app)
                    .with_graceful_shutdown(async move { c.cancelled().await })
                    .await;
                if let Err(err) = served {
                    warn!(error = %err, "API listener failed.");
                }
            }));
        }

        supervisor.apply(config.targets.clone()).await;
        if let Some(path) = config_path {
            tasks.push(tokio::spawn(reload_loop(
                path,
                supervisor.clone(),
                cancel.child_token(),
            )));
        }
        let (s, i, m, c) = (
            supervisor.clone(),
            index.clone(),
            mirror.clone(),
            cancel.child_token(),
        );
        tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(GAUGE_INTERVAL);
            loop {
                tokio::select! {
                    biased;
                    _ = c.cancelled() => return,
                    _ = tick.tick() => {}
                }
                s.publish_ages();
                for (medium, n) in i.stats().entries_by_medium {
                    crate::metrics::resident_blocks(&medium, n);
                }
                if let Some(m) = &m {
                    let st = m.stats();
                    crate::metrics::mirror(
                        st.queue_depth,
                        st.dirty,
                        st.reconciling,
                        st.flush_p99_us,
                    );
                }
            }
        }));
        info!(
            targets = config.targets.len(),
            metrics = %metrics_addr,
            redis = config.redis.is_some(),
            "kvindex serve started."
        );
        Ok(Daemon {
            index,
            supervisor,
            metrics_addr,
            api_addr,
            cancel,
            mirror,
            tasks,
        })
    }

    /// The daemon's cancellation token (cancelling it starts shutdown).
    pub fn cancel_token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Stops subscribers, flushes and stops the mirror, and stops the listeners, within
    /// `deadline`. Returns how the mirror stopped, when Redis is configured.
    pub async fn shutdown(self, deadline: Duration) -> Option<MirrorStop> {
        let started = tokio::time::Instant::now();
        self.supervisor.shutdown(deadline / 2).await;
        let left = deadline.saturating_sub(started.elapsed());
        let mirror_stop = match &self.mirror {
            Some(mirror) => Some(mirror.shutdown(left).await),
            None => None,
        };
        self.cancel.cancel();
        let left = deadline.saturating_sub(started.elapsed());
        let _ = tokio::time::timeout(left, futures::future::join_all(self.tasks)).await;
        info!("kvindex serve stopped.");
        mirror_stop
    }
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// Runs the command until SIGINT / SIGTERM.
///
/// # Errors
/// An invalid config (exit 64) or a listener / mirror that cannot start.
pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let config = Config::from_path(&args.config, &ProcessEnv)
        .map_err(|e| anyhow::Error::new(UsageError(e.to_string())))?;
    let daemon = Daemon::start(config, Some(args.config.clone()), ReplayLimits::default()).await?;
    shutdown_signal().await;
    info!("Shutdown signal received; draining.");
    daemon
        .shutdown(Duration::from_secs(args.shutdown_deadline))
        .await;
    Ok(())
}

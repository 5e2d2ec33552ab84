//! The Kubernetes side of discovery: a kube-rs client, one `watcher` + reflector store per
//! watched namespace (or one for all), and the loop that turns store snapshots into the
//! supervisor's discovered target set through [`Roster`].
//!
//! Watch errors (API server unreachable, 410 Gone, 401/403) are retried with a capped
//! backoff; the running target set is kept meanwhile, and [`DiscoveryHealth`] tells
//! `/readyz` why discovery is not healthy. The kube watcher relists by itself after 410
//! Gone; relisting yields the same targets, so the supervisor changes nothing.

use std::sync::Arc;
use std::time::Duration;

use futures::stream::{BoxStream, SelectAll};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use parking_lot::Mutex;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::model::{observe, Roster, RosterUpdate};
use super::{ClusterAccess, KubernetesConfig};
use crate::ingest::supervisor::{DiscoveredTarget, Supervisor};

/// Why a Kubernetes list or watch failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchErrorReason {
    /// The API server could not be reached (connection, TLS, timeout).
    Unreachable,
    /// 410 Gone: the resource version expired; the watcher lists again.
    Gone,
    /// 401/403: the service account lacks get/list/watch on pods.
    Forbidden,
    /// Anything else the API server answered.
    Other,
}

impl WatchErrorReason {
    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            WatchErrorReason::Unreachable => "unreachable",
            WatchErrorReason::Gone => "gone",
            WatchErrorReason::Forbidden => "forbidden",
            WatchErrorReason::Other => "other",
        }
    }
}

/// First pause after a watch error.
pub const MIN_BACKOFF: Duration = Duration::from_millis(250);
/// Longest pause between retries.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Time allowed for one health probe (a one-item list) while the watch is failing.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why discovery could not start.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// The kubeconfig file could not be read or used.
    #[error("cannot use kubeconfig {path}: {source}")]
    Kubeconfig {
        /// Path.
        path: String,
        /// Cause.
        source: kube::config::KubeconfigError,
    },
    /// `KUBECONFIG` names files that could not be used.
    #[error("cannot use the kubeconfig that KUBECONFIG names: {0}")]
    KubeconfigEnv(#[source] kube::config::KubeconfigError),
    /// Not in a pod with a service account.
    #[error("no kubeconfig given and not running in a cluster: {0}")]
    InCluster(#[source] kube::config::InClusterError),
    /// The client could not be built from the config.
    #[error("cannot build the Kubernetes client: {0}")]
    Client(#[source] kube::Error),
}

/// Builds the client the section asks for: a kubeconfig file, `KUBECONFIG`, or in-cluster.
///
/// # Errors
/// [`DiscoveryError`] naming the source that failed.
pub async fn client_for(access: &ClusterAccess) -> Result<kube::Client, DiscoveryError> {
    let options = KubeConfigOptions::default();
    let config = match access {
        ClusterAccess::Kubeconfig(path) => {
            let kubeconfig_error = |source| DiscoveryError::Kubeconfig {
                path: path.display().to_string(),
                source,
            };
            let file = Kubeconfig::read_from(path).map_err(kubeconfig_error)?;
            kube::Config::from_custom_kubeconfig(file, &options)
                .await
                .map_err(kubeconfig_error)?
        }
        ClusterAccess::KubeconfigEnv => kube::Config::from_kubeconfig(&options)
            .await
            .map_err(DiscoveryError::KubeconfigEnv)?,
        ClusterAccess::InCluster => kube::Config::incluster().map_err(DiscoveryError::InCluster)?,
    };
    kube::Client::try_from(config).map_err(DiscoveryError::Client)
}

/// What discovery reports about itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiscoveryStatus {
    /// Every watched namespace has been listed at least once.
    pub synced: bool,
    /// The last list/watch error, while it is not resolved.
    pub error: Option<(WatchErrorReason, String)>,
    /// List/watch errors so far.
    pub errors: u64,
    /// Full lists received (the first one and every relist).
    pub lists: u64,
    /// Discovered targets handed to the supervisor.
    pub targets: usize,
    /// Pods skipped now, as `(pod id, reason)`.
    pub skipped: Vec<(String, String)>,
    /// Targets kept while their pod is not Ready (inside the grace period).
    pub not_ready: Vec<String>,
}

/// Shared view of discovery's state, for `/readyz` and tests.
#[derive(Debug, Clone, Default)]
pub struct DiscoveryHealth(Arc<Mutex<DiscoveryStatus>>);

impl DiscoveryHealth {
    /// A copy of the current status.
    pub fn status(&self) -> DiscoveryStatus {
        self.0.lock().clone()
    }

    /// Why the daemon is not ready on account of discovery, or `None` when it is.
    pub fn not_ready_reason(&self) -> Option<String> {
        let s = self.0.lock();
        match (&s.error, s.synced) {
            (Some((reason, what)), synced) => Some(format!(
                "kubernetes discovery {}: {what}; {}",
                reason.as_str(),
                if synced {
                    format!("keeping the {} discovered targets", s.targets)
                } else {
                    "no pods listed yet".to_owned()
                }
            )),
            (None, false) => Some("kubernetes discovery has not listed the pods yet".to_owned()),
            (None, true) => None,
        }
    }

    fn update(&self, f: impl FnOnce(&mut DiscoveryStatus)) {
        let mut s = self.0.lock();
        f(&mut s);
        crate::metrics::discovery_healthy(s.synced && s.error.is_none());
    }
}

/// A running discovery task.
pub struct KubernetesDiscovery {
    /// Its health, for `/readyz`.
    pub health: DiscoveryHealth,
    /// The task (ends when the token is cancelled).
    pub task: JoinHandle<()>,
}

/// One watched scope: the pods of a namespace, or of the whole cluster.
struct Scope {
    api: Api<Pod>,
    store: Store<Pod>,
    synced: bool,
}

type ScopedEvents = SelectAll<BoxStream<'static, (usize, watcher::Result<watcher::Event<Pod>>)>>;

/// Starts watching with `client` and feeding `supervisor` until `cancel` fires; `health`
/// is where it reports (shared with `/readyz`).
pub fn spawn(
    config: KubernetesConfig,
    client: kube::Client,
    supervisor: Arc<Supervisor>,
    health: DiscoveryHealth,
    cancel: CancellationToken,
) -> KubernetesDiscovery {
    crate::metrics::discovery_healthy(false);
    let runner = Runner {
        roster: Roster::new(config.not_ready_grace),
        config,
        supervisor,
        health: health.clone(),
        pushed: None,
    };
    let task = tokio::spawn(runner.run(client, cancel));
    KubernetesDiscovery { health, task }
}

struct Runner {
    config: KubernetesConfig,
    supervisor: Arc<Supervisor>,
    health: DiscoveryHealth,
    roster: Roster,
    pushed: Option<Vec<DiscoveredTarget>>,
}

impl Runner {
    fn scopes(&self, client: kube::Client) -> (Vec<Scope>, ScopedEvents) {
        let apis: Vec<Api<Pod>> = if self.config.namespaces.is_empty() {
            vec![Api::all(client)]
        } else {
            let ns = &self.config.namespaces;
            ns.iter()
                .map(|n| Api::namespaced(client.clone(), n))
                .collect()
        };
        let mut watch_config = watcher::Config::default();
        if let Some(selector) = &self.config.label_selector {
            watch_config = watch_config.labels(selector);
        }
        let mut scopes = Vec::new();
        let mut events = SelectAll::new();
        for (i, api) in apis.into_iter().enumerate() {
            let (store, writer) = reflector::store();
            // The store keeps what `observe` reads: metadata (less managed fields) and status.
            let pods = watcher(api.clone(), watch_config.clone()).modify(|pod: &mut Pod| {
                pod.metadata.managed_fields = None;
                pod.spec = None;
            });
            let stream = reflector::reflector(writer, pods);
            events.push(stream.map(move |e| (i, e)).boxed());
            scopes.push(Scope {
                api,
                store,
                synced: false,
            });
        }
        (scopes, events)
    }

    async fn run(mut self, client: kube::Client, cancel: CancellationToken) {
        let (mut scopes, mut events) = self.scopes(client);
        let mut backoff = MIN_BACKOFF;
        let mut resume_at = Instant::now();
        let mut probe_at: Option<Instant> = None;
        info!(
            namespaces = ?self.config.namespaces,
            label_selector = ?self.config.label_selector,
            "Kubernetes discovery started."
        );
        loop {
            let deadline = self.roster.next_deadline().map(Instant::from_std);
            tokio::select! {
                biased;
                _ = cancel.cancelled() => break,
                _ = sleep_until(deadline) => {}
                _ = sleep_until(probe_at) => {
                    probe_at = if probe(&scopes).await {
                        self.health.update(|s| s.error = None);
                        info!("Kubernetes API server answers again.");
                        None
                    } else {
                        Some(Instant::now() + backoff)
                    };
                    continue;
                }
                item = async {
                    tokio::time::sleep_until(resume_at).await;
                    events.next().await
                } => match item {
                    None => break,
                    Some((scope, Ok(event))) => {
                        backoff = MIN_BACKOFF;
                        probe_at = None;
                        self.on_event(&mut scopes, scope, &event);
                    }
                    Some((_, Err(err))) => {
                        self.on_error(&err, backoff);
                        resume_at = Instant::now() + backoff;
                        probe_at = Some(resume_at);
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                        continue;
                    }
                },
            }
            if scopes.iter().all(|s| s.synced) {
                self.push(&scopes).await;
            }
        }
        info!("Kubernetes discovery stopped.");
    }

    fn on_event(&self, scopes: &mut [Scope], scope: usize, event: &watcher::Event<Pod>) {
        if matches!(event, watcher::Event::InitDone) {
            if let Some(s) = scopes.get_mut(scope) {
                s.synced = true;
            }
            let all = scopes.iter().all(|s| s.synced);
            self.health.update(|s| {
                s.lists += 1;
                s.synced = all;
            });
        }
        self.health.update(|s| s.error = None);
    }

    fn on_error(&self, err: &watcher::Error, backoff: Duration) {
        let (reason, what) = classify(err);
        crate::metrics::discovery_watch_error(reason.as_str());
        warn!(
            reason = reason.as_str(),
            backoff_ms = backoff.as_millis() as u64,
            "Kubernetes watch failed; retrying and keeping the running targets: {what}."
        );
        self.health.update(|s| {
            s.errors += 1;
            s.error = Some((reason, what));
        });
    }

    /// Recomputes the discovered set from every store and hands a changed set over.
    async fn push(&mut self, scopes: &[Scope]) {
        let pods: Vec<_> = scopes
            .iter()
            .flat_map(|s| s.store.state())
            .map(|pod| observe(&pod, &self.config.defaults))
            .collect();
        let update = self.roster.update(pods, std::time::Instant::now());
        report(&update);
        let targets = self.roster.targets();
        let skipped: Vec<(String, String)> = self
            .roster
            .skipped()
            .iter()
            .map(|(id, e)| (id.clone(), e.to_string()))
            .collect();
        crate::metrics::discovery_pods_skipped(skipped.len());
        let n = targets.len();
        let not_ready = self.roster.in_grace();
        self.health.update(|s| {
            s.targets = n;
            s.skipped = skipped;
            s.not_ready = not_ready;
        });
        if self.pushed.as_ref() != Some(&targets) {
            self.supervisor.apply_discovered(targets.clone()).await;
            self.pushed = Some(targets);
        }
    }
}

/// Logs and counts what a roster update changed.
fn report(update: &RosterUpdate) {
    for (pod, error) in &update.newly_skipped {
        crate::metrics::discovery_pod_skipped(error.reason.as_str());
        warn!(pod = %pod, reason = error.reason.as_str(), "Skipping a discovered pod: {error}.");
    }
    for (pod, change) in &update.restarts {
        crate::metrics::discovery_identity_restart(change.as_str());
        info!(pod = %pod, change = change.as_str(), "Engine restart seen in the pod's identity; dropping its state before the new stream.");
    }
    for pod in &update.expired {
        info!(pod = %pod, "Pod not Ready for the whole grace period; forgetting it.");
    }
}

/// Sleeps until `at`, or forever when there is nothing to wait for.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Whether every scope's API answers a one-item list now.
async fn probe(scopes: &[Scope]) -> bool {
    let params = ListParams::default().limit(1);
    for scope in scopes {
        let listed = tokio::time::timeout(PROBE_TIMEOUT, scope.api.list(&params)).await;
        if !matches!(listed, Ok(Ok(_))) {
            return false;
        }
    }
    true
}

/// The metric reason and a one-line description of a watch error.
fn classify(err: &watcher::Error) -> (WatchErrorReason, String) {
    let client_error = match err {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => e,
        watcher::Error::WatchError(status) => return from_status(status.code, &status.message),
        watcher::Error::NoResourceVersion => {
            return (WatchErrorReason::Other, err.to_string());
        }
    };
    match client_error {
        kube::Error::Api(status) => from_status(status.code, &status.message),
        other => (WatchErrorReason::Unreachable, other.to_string()),
    }
}

fn from_status(code: u16, message: &str) -> (WatchErrorReason, String) {
    let reason = match code {
        410 => WatchErrorReason::Gone,
        401 | 403 => WatchErrorReason::Forbidden,
        _ => WatchErrorReason::Other,
    };
    (reason, format!("HTTP {code}: {message}"))
}

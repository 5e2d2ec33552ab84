//! [`Supervisor`]: the running targets and their subscriber tasks.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::sourced::{DiscoveredTarget, EngineIdentity, TargetSource};
use crate::index::{DeltaMirror, Index};
use crate::ingest::replay_client::ReplayLimits;
use crate::ingest::status::{resident_blocks, PodCounters, PodStatus, PodsView};
use crate::ingest::subscriber::{self, LinkState, RankStatus, SubscriberCtx, SubscriberSpec};
use crate::ingest::MirrorSink;
use crate::ingest::Target;
use crate::shard::Shard;

/// How long a stopping target's tasks may take before they are aborted.
const STOP_DEADLINE: Duration = Duration::from_secs(2);

struct Running {
    target: Target,
    source: TargetSource,
    identity: Option<EngineIdentity>,
    cancel: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    ranks: Vec<Arc<Mutex<RankStatus>>>,
}

/// What a reload changed.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ReloadSummary {
    /// Pod identifiers started.
    pub added: Vec<String>,
    /// Pod identifiers stopped and forgotten.
    pub removed: Vec<String>,
    /// Pod identifiers restarted with a changed definition.
    pub restarted: Vec<String>,
}

/// One target with the status of each of its ranks.
#[derive(Debug, Clone)]
pub struct TargetStatus {
    /// The target.
    pub target: Target,
    /// Where it came from.
    pub source: TargetSource,
    /// Per DP rank.
    pub ranks: Vec<RankStatus>,
}

/// Owns the subscriber tasks of every target.
pub struct Supervisor {
    index: Index,
    mirror: Option<Arc<dyn DeltaMirror>>,
    cancel: CancellationToken,
    replay_limits: ReplayLimits,
    /// `ingest.max_frame_bytes`, read when a subscriber starts.
    max_frame_bytes: AtomicUsize,
    running: Mutex<BTreeMap<String, Running>>,
    wanted: Mutex<WantedSets>,
    // Reloads are serialized so two cannot interleave their stop/start halves.
    reload_lock: tokio::sync::Mutex<()>,
}

impl Supervisor {
    /// A supervisor with no targets; `cancel` is the daemon's token (each target gets a child).
    pub fn new(
        index: Index,
        mirror: Option<Arc<dyn DeltaMirror>>,
        cancel: CancellationToken,
        replay_limits: ReplayLimits,
    ) -> Arc<Supervisor> {
        Arc::new(Supervisor {
            index,
            mirror,
            cancel,
            replay_limits,
            max_frame_bytes: AtomicUsize::new(crate::ingest::DEFAULT_MAX_FRAME_BYTES),
            running: Mutex::new(BTreeMap::new()),
            wanted: Mutex::new(WantedSets::default()),
            reload_lock: tokio::sync::Mutex::new(()),
        })
    }

    /// Sets this replica's shard: from the next change of the target set on, only the
    /// targets it owns run, and restored sources of other shards' pods are never forgotten.
    /// Set once, before the first [`Supervisor::apply`]: ownership changes only at start.
    pub fn set_shard(&self, shard: Shard) {
        self.wanted.lock().shard = shard;
    }

    /// This replica's shard.
    pub fn shard(&self) -> Shard {
        self.wanted.lock().shard
    }

    /// Caps the frames of subscribers started from now on (`ingest.max_frame_bytes`).
    pub fn set_max_frame_bytes(&self, max: usize) {
        self.max_frame_bytes.store(max, Ordering::Relaxed);
    }

    /// Makes the static targets equal `targets` (discovered ones are kept): new ones start,
    /// removed ones stop and are forgotten (index and mirror), changed ones restart from a
    /// clean state.
    pub async fn apply(&self, targets: Vec<Target>) -> ReloadSummary {
        self.wanted.lock().statics = targets;
        self.reconcile().await
    }

    /// Makes the discovered targets equal `targets` (static ones are kept). A changed
    /// [`EngineIdentity`] is an engine restart: the old state is dropped (index and mirror)
    /// before the new subscriber applies anything.
    pub async fn apply_discovered(&self, targets: Vec<DiscoveredTarget>) -> ReloadSummary {
        {
            let mut wanted = self.wanted.lock();
            wanted.discovered = targets;
            wanted.discovery_listed = true;
        }
        self.reconcile().await
    }

    /// Sources a warm start rebuilt from the checkpoint: each is claimed by the target of its
    /// pod, and those no target claims are forgotten (index and mirror) at the next change of
    /// the target set — the first one when targets are static, the first discovery listing
    /// when `after_discovery`. Call before the first [`Supervisor::apply`].
    pub fn expect_restored(&self, sources: Vec<(String, u8)>, after_discovery: bool) {
        self.wanted.lock().restored = Some(Restored {
            sources,
            after_discovery,
        });
    }

    /// Forgets restored sources no target claimed: their blocks leave the index and Redis.
    async fn forget_orphans(&self, orphans: Vec<(String, u8)>) {
        let mut deltas = MirrorSink::new();
        for (pod, rank) in &orphans {
            let source = self
                .index
                .pod_id(pod)
                .and_then(|p| self.index.source_of(p, *rank));
            if let Some(source) = source {
                // Gone already is as good as removed.
                let _ = self.index.remove_source(source, &mut deltas);
            }
            info!(pod = %pod, rank, "Forgot a source restored from the checkpoint that no target claims.");
        }
        if let Some(mirror) = &self.mirror {
            deltas.hand_over(mirror.as_ref(), None).await;
        }
    }

    async fn reconcile(&self) -> ReloadSummary {
        let _guard = self.reload_lock.lock().await;
        if self.wanted.lock().closed {
            // Shutting down: a late reload or discovery event must not start subscribers.
            return ReloadSummary::default();
        }
        let (wanted, orphans) = {
            let mut sets = self.wanted.lock();
            let wanted = sets.merged();
            let orphans = sets.take_orphans(&wanted);
            (wanted, orphans)
        };
        if !orphans.is_empty() {
            self.forget_orphans(orphans).await;
        }
        let mut summary = ReloadSummary::default();
        let mut to_stop = Vec::new();
        let mut to_start = Vec::new();
        {
            let mut running = self.running.lock();
            let ids: Vec<String> = running.keys().cloned().collect();
            for id in ids {
                match wanted.get(&id) {
                    None => {
                        summary.removed.push(id.clone());
                        if let Some(r) = running.remove(&id) {
                            to_stop.push((id, r));
                        }
                    }
                    Some(t) if running.get(&id).is_some_and(|r| !t.same_run(r)) => {
                        summary.restarted.push(id.clone());
                        if let Some(r) = running.remove(&id) {
                            to_stop.push((id.clone(), r));
                        }
                        to_start.push(t.clone());
                    }
                    Some(_) => {}
                }
            }
            for (id, t) in &wanted {
                if !running.contains_key(id) && !summary.restarted.contains(id) {
                    summary.added.push(id.clone());
                    to_start.push(t.clone());
                }
            }
        }
        for (id, r) in to_stop {
            self.stop(&id, r).await;
        }
        for t in to_start {
            let id = t.target.pod_id();
            let r = self.start(t);
            self.running.lock().insert(id, r);
        }
        self.publish_counts();
        if summary != ReloadSummary::default() {
            info!(
                added = ?summary.added,
                removed = ?summary.removed,
                restarted = ?summary.restarted,
                "Target set changed."
            );
        }
        summary
    }

    fn publish_counts(&self) {
        let running = self.running.lock();
        for source in TargetSource::ALL {
            let n = running.values().filter(|r| r.source == source).count();
            crate::metrics::targets(source.as_str(), n);
        }
        let (shard, others) = {
            let wanted = self.wanted.lock();
            (wanted.shard, wanted.others.len())
        };
        crate::metrics::shard_targets(shard, running.len(), others);
    }

    fn start(&self, wanted: Wanted) -> Running {
        let Wanted {
            target,
            source,
            identity,
        } = wanted;
        let min_store_time = identity.as_ref().map_or(0, EngineIdentity::min_store_time);
        let cancel = self.cancel.child_token();
        let mut tasks = Vec::new();
        let mut ranks = Vec::new();
        for rank in 0..target.dp_ranks {
            let status = Arc::new(Mutex::new(RankStatus::default()));
            let (Some(endpoint), Ok(rank_u8)) =
                (target.endpoint.for_rank(rank), u8::try_from(rank))
            else {
                warn!(pod = %target.pod_id(), rank, "DP rank out of range; not subscribed.");
                continue;
            };
            let spec = SubscriberSpec {
                pod: target.pod_id(),
                model: target.model.clone(),
                engine: target.engine,
                rank: rank_u8,
                endpoint,
                replay_endpoint: target
                    .replay_endpoint
                    .as_ref()
                    .and_then(|e| e.for_rank(rank)),
                topic: target.topic.clone(),
                replay_limits: self.replay_limits,
                min_store_time,
                run: identity.as_ref().map(EngineIdentity::run),
                max_frame_bytes: (target.max_frame_bytes)
                    .unwrap_or_else(|| self.max_frame_bytes.load(Ordering::Relaxed)),
            };
            let ctx = SubscriberCtx {
                index: self.index.clone(),
                mirror: self.mirror.clone(),
                status: status.clone(),
                cancel: cancel.child_token(),
            };
            tasks.push(tokio::spawn(subscriber::run(spec, ctx)));
            ranks.push(status);
        }
        Running {
            target,
            source,
            identity,
            cancel,
            tasks,
            ranks,
        }
    }

    async fn stop(&self, id: &str, running: Running) {
        running.cancel.cancel();
        for task in running.tasks {
            let abort = task.abort_handle();
            if tokio::time::timeout(STOP_DEADLINE, task).await.is_err() {
                abort.abort();
            }
        }
        let mut deltas = MirrorSink::new();
        self.index.forget_pod(id, &mut deltas);
        crate::metrics::forget_target(id);
        if let Some(mirror) = &self.mirror {
            deltas.hand_over(mirror.as_ref(), None).await;
        }
    }

    /// Stops every target (the index keeps their blocks: the process is exiting).
    pub async fn shutdown(&self, deadline: Duration) {
        // Wait (boundedly) for a reconcile in flight, so none starts targets after this.
        let guard = tokio::time::timeout(deadline / 2, self.reload_lock.lock()).await;
        self.wanted.lock().closed = true;
        drop(guard);
        let all: Vec<Running> = std::mem::take(&mut *self.running.lock())
            .into_values()
            .collect();
        for r in &all {
            r.cancel.cancel();
        }
        let joins = futures::future::join_all(all.into_iter().flat_map(|r| r.tasks));
        if tokio::time::timeout(deadline, joins).await.is_err() {
            warn!("Subscribers did not stop in time.");
        }
    }

    /// The status of every target, sorted by pod identifier.
    pub fn status(&self) -> Vec<TargetStatus> {
        self.running
            .lock()
            .values()
            .map(|r| TargetStatus {
                target: r.target.clone(),
                source: r.source,
                ranks: r.ranks.iter().map(|s| s.lock().clone()).collect(),
            })
            .collect()
    }

    /// Whether every rank of every target follows its engine with nothing to catch up
    /// ([`RankStatus::caught_up`]): what a standby needs before it may take the HA lease.
    pub fn caught_up(&self, settle: Duration) -> bool {
        self.running
            .lock()
            .values()
            .flat_map(|r| r.ranks.iter())
            .all(|s| s.lock().caught_up(settle))
    }

    /// DP-rank sockets connected now, over all targets.
    pub fn connected_ranks(&self) -> usize {
        self.running
            .lock()
            .values()
            .flat_map(|r| r.ranks.iter())
            .filter(|s| s.lock().state == LinkState::Connected)
            .count()
    }

    /// Publishes the per-target gauges: last-message age, DP ranks connected.
    pub fn publish_ages(&self) {
        for t in self.status() {
            let connected = t
                .ranks
                .iter()
                .filter(|r| r.state == LinkState::Connected)
                .count() as u32;
            crate::metrics::target_ranks(
                &t.target.pod_id(),
                t.source.as_str(),
                connected,
                t.target.dp_ranks,
            );
            if let Some(age) = t
                .ranks
                .iter()
                .filter_map(|r| r.last_message)
                .map(|i| i.elapsed().as_secs_f64())
                .reduce(f64::min)
            {
                crate::metrics::last_message_age(&t.target.pod_id(), t.source.as_str(), age);
            }
        }
    }
}

impl Supervisor {
    /// The targets this replica runs, as `GET /v1/pods` lists them.
    fn own_pods(&self) -> Vec<PodStatus> {
        let shard = self.shard().index;
        self.status()
            .into_iter()
            .map(|t| {
                let state = if t.ranks.iter().all(|r| r.state == LinkState::Connected) {
                    LinkState::Connected
                } else if t.ranks.iter().any(|r| r.state == LinkState::Disconnected) {
                    LinkState::Disconnected
                } else if t.ranks.iter().all(|r| r.state == LinkState::Stopped) {
                    LinkState::Stopped
                } else {
                    LinkState::Connecting
                };
                let age = t
                    .ranks
                    .iter()
                    .filter_map(|r| r.last_message)
                    .map(|i| i.elapsed().as_secs_f64())
                    .reduce(f64::min);
                let pod = t.target.pod_id();
                let resident = resident_blocks(&self.index, &pod);
                let mut counters = PodCounters::default();
                t.ranks.iter().for_each(|r| counters.add(&r.stats));
                let last_error = t
                    .ranks
                    .iter()
                    .enumerate()
                    .find_map(|(i, r)| r.last_error.as_ref().map(|e| format!("rank {i}: {e}")));
                let connected = t.ranks.iter().filter(|r| r.state == LinkState::Connected);
                PodStatus {
                    pod,
                    model: t.target.model.clone(),
                    engine: t.target.engine.as_str().to_owned(),
                    endpoint: t.target.endpoint.to_string(),
                    dp_ranks: t.target.dp_ranks,
                    source: t.source.as_str().to_owned(),
                    state: state.as_str().to_owned(),
                    last_message_age_seconds: age,
                    resident_blocks: resident,
                    ranks_connected: connected.count() as u32,
                    last_error,
                    counters,
                    shard,
                }
            })
            .collect()
    }

    /// The targets other shards own, as `GET /v1/pods` lists them: known from the config or
    /// discovery, not connected here.
    fn other_shards_pods(&self) -> Vec<PodStatus> {
        let wanted = self.wanted.lock();
        wanted
            .others
            .iter()
            .map(|(id, (w, owner))| PodStatus {
                pod: id.clone(),
                model: w.target.model.clone(),
                engine: w.target.engine.as_str().to_owned(),
                endpoint: w.target.endpoint.to_string(),
                dp_ranks: w.target.dp_ranks,
                source: w.source.as_str().to_owned(),
                state: OTHER_SHARD.to_owned(),
                shard: *owner,
                ..PodStatus::default()
            })
            .collect()
    }
}

/// The state `GET /v1/pods` reports for a pod another replica owns.
const OTHER_SHARD: &str = "other_shard";

impl PodsView for Supervisor {
    fn pods(&self) -> Vec<PodStatus> {
        let mut pods = self.own_pods();
        pods.extend(self.other_shards_pods());
        pods.sort_by(|a, b| a.pod.cmp(&b.pod));
        pods
    }
}

/// A target the supervisor should run, with its origin.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Wanted {
    target: Target,
    source: TargetSource,
    identity: Option<EngineIdentity>,
}

impl Wanted {
    /// Whether `running` is this target's current run (same definition, same engine run).
    fn same_run(&self, running: &Running) -> bool {
        self.target == running.target
            && self.source == running.source
            && self.identity == running.identity
    }
}

/// What each source asks for; merged into one set on every change.
#[derive(Default)]
struct WantedSets {
    statics: Vec<Target>,
    discovered: Vec<DiscoveredTarget>,
    // Pods reported as both static and discovered, so each is logged once.
    conflicts: BTreeSet<String>,
    // Set by `shutdown`: no target starts after it.
    closed: bool,
    // Sources rebuilt from a checkpoint, waiting for the target set to claim them.
    restored: Option<Restored>,
    // Set by the first discovery listing.
    discovery_listed: bool,
    // This replica's shard: targets of other shards are not run.
    shard: Shard,
    // The targets other shards own, with their owner (for `GET /v1/pods`).
    others: BTreeMap<String, (Wanted, u32)>,
}

/// Sources a warm start rebuilt, not yet matched against the target set.
struct Restored {
    sources: Vec<(String, u8)>,
    after_discovery: bool,
}

impl WantedSets {
    /// The restored sources no wanted target claims (its pod is not wanted, or the rank is
    /// past its DP ranks), once the target set is known: at once for static targets, after
    /// discovery's first listing when discovery runs.
    fn take_orphans(&mut self, wanted: &BTreeMap<String, Wanted>) -> Vec<(String, u8)> {
        let ready = self
            .restored
            .as_ref()
            .is_some_and(|r| !r.after_discovery || self.discovery_listed);
        if !ready {
            return Vec::new();
        }
        let Some(restored) = self.restored.take() else {
            return Vec::new();
        };
        restored
            .sources
            .into_iter()
            .filter(|(pod, rank)| {
                // Another shard's source is never this replica's to forget.
                self.shard.owns(pod)
                    && wanted
                        .get(pod)
                        .is_none_or(|w| u32::from(*rank) >= w.target.dp_ranks)
            })
            .collect()
    }
}

impl WantedSets {
    /// The targets this shard owns, from [`WantedSets::all`]; the others are kept aside with
    /// their owner.
    fn merged(&mut self) -> BTreeMap<String, Wanted> {
        let shard = self.shard;
        let mut others = BTreeMap::new();
        let owned = self
            .all()
            .into_iter()
            .filter_map(|(id, w)| {
                let owner = shard.owner_of(&id);
                if shard.owns(&id) {
                    Some((id, w))
                } else {
                    others.insert(id, (w, owner));
                    None
                }
            })
            .collect();
        self.others = others;
        owned
    }

    /// Static targets, then discovered ones; a pod in both keeps its static definition and
    /// is reported as an error naming both.
    fn all(&mut self) -> BTreeMap<String, Wanted> {
        let mut wanted: BTreeMap<String, Wanted> = self
            .statics
            .iter()
            .map(|t| {
                let w = Wanted {
                    target: t.clone(),
                    source: TargetSource::Static,
                    identity: None,
                };
                (t.pod_id(), w)
            })
            .collect();
        let mut conflicts = BTreeSet::new();
        for d in &self.discovered {
            let id = d.target.pod_id();
            if wanted.contains_key(&id) {
                if !self.conflicts.contains(&id) {
                    warn!(
                        pod = %id,
                        "Pod `{id}` is both a static target (targets:) and a pod discovered by discovery.kubernetes; the static target is used and the discovered one ignored."
                    );
                }
                conflicts.insert(id);
                continue;
            }
            let w = Wanted {
                target: d.target.clone(),
                source: TargetSource::Kubernetes,
                identity: Some(d.identity.clone()),
            };
            wanted.insert(id, w);
        }
        crate::metrics::discovery_conflicts(conflicts.len());
        self.conflicts = conflicts;
        wanted
    }
}

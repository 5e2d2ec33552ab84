//! Pure pod → target mapping: annotations over defaults, readiness, identity, and the
//! [`Roster`] that turns pod snapshots into the discovered target set (readiness grace,
//! restarts, skips). No I/O: tests drive it with pod objects and instants.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;

use super::PodDefaults;
use crate::ingest::supervisor::{DiscoveredTarget, EngineIdentity};
use crate::ingest::{Target, TcpEndpoint, MAX_DP_RANKS};
use crate::settings::kubernetes::{check_port_ranges, port_number};
use crate::wire::Engine;

/// Annotation overriding the engine family.
pub const ANNOTATION_ENGINE: &str = "kvindex.io/engine";
/// Annotation overriding the served model.
pub const ANNOTATION_MODEL: &str = "kvindex.io/model";
/// Annotation overriding DP rank 0's PUB port.
pub const ANNOTATION_PORT: &str = "kvindex.io/port";
/// Annotation overriding DP rank 0's replay port (`none` turns a default off).
pub const ANNOTATION_REPLAY_PORT: &str = "kvindex.io/replay-port";
/// Annotation overriding the DP rank count.
pub const ANNOTATION_DP_RANKS: &str = "kvindex.io/dp-ranks";
/// Annotation overriding the subscription filter.
pub const ANNOTATION_TOPIC: &str = "kvindex.io/topic";

/// Longest topic accepted from an annotation (a subscription prefix, not a payload).
const MAX_TOPIC_LEN: usize = 256;

/// Why a discovered pod was skipped: the annotation (or default) that is missing or invalid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodSkipReason {
    /// `kvindex.io/engine`.
    Engine,
    /// `kvindex.io/model`.
    Model,
    /// `kvindex.io/port`.
    Port,
    /// `kvindex.io/replay-port`.
    ReplayPort,
    /// `kvindex.io/dp-ranks`.
    DpRanks,
    /// `kvindex.io/topic`.
    Topic,
    /// The pod's metadata lacks a name or namespace.
    Metadata,
}

impl PodSkipReason {
    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            PodSkipReason::Engine => "engine",
            PodSkipReason::Model => "model",
            PodSkipReason::Port => "port",
            PodSkipReason::ReplayPort => "replay_port",
            PodSkipReason::DpRanks => "dp_ranks",
            PodSkipReason::Topic => "topic",
            PodSkipReason::Metadata => "metadata",
        }
    }
}

/// Why a discovered target was restarted by identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdentityChange {
    /// A new pod UID under the same name.
    Uid,
    /// A container restarted (restart count or start time changed).
    Container,
}

impl IdentityChange {
    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            IdentityChange::Uid => "uid",
            IdentityChange::Container => "container",
        }
    }
}

/// Why a pod cannot be a target: which annotation (or missing default) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{annotation}: {what}")]
pub struct AnnotationError {
    /// Metric label.
    pub reason: PodSkipReason,
    /// The annotation name (or the pod field) at fault.
    pub annotation: &'static str,
    /// What is wrong, with the value.
    pub what: String,
}

/// What one pod object says about its target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodObservation {
    /// Running, Ready, with an IP: subscribe.
    Serving(DiscoveredTarget),
    /// Exists but is not (yet, or no longer) serving.
    NotServing {
        /// Pod identifier.
        id: String,
        /// The engine run, to tell a readiness flap from a restart.
        identity: EngineIdentity,
    },
    /// Annotations (or missing defaults) make it unusable.
    Skipped {
        /// Pod identifier.
        id: String,
        /// Why.
        error: AnnotationError,
    },
    /// Being deleted (a deletion timestamp is set): treated as gone.
    Terminating,
}

/// The per-pod settings after annotations are applied.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PodSettings {
    engine: Engine,
    model: String,
    port: u16,
    replay_port: Option<u16>,
    dp_ranks: u32,
    topic: String,
}

/// Reads one pod object.
pub fn observe(pod: &Pod, defaults: &PodDefaults) -> PodObservation {
    let meta = &pod.metadata;
    let (Some(name), Some(namespace)) = (meta.name.as_deref(), meta.namespace.as_deref()) else {
        return PodObservation::Skipped {
            id: meta.name.clone().unwrap_or_default(),
            error: AnnotationError {
                reason: PodSkipReason::Metadata,
                annotation: "metadata",
                what: "the pod has no name or namespace".to_owned(),
            },
        };
    };
    let id = format!("{name}.{namespace}");
    if meta.deletion_timestamp.is_some() {
        return PodObservation::Terminating;
    }
    let settings = match settings(pod, defaults) {
        Ok(s) => s,
        Err(error) => return PodObservation::Skipped { id, error },
    };
    let identity = identity(pod);
    match serving_ip(pod) {
        Some(ip) => PodObservation::Serving(DiscoveredTarget {
            target: Target {
                pod: name.to_owned(),
                namespace: namespace.to_owned(),
                model: settings.model,
                engine: settings.engine,
                endpoint: TcpEndpoint {
                    host: ip.to_owned(),
                    port: settings.port,
                },
                replay_endpoint: settings.replay_port.map(|port| TcpEndpoint {
                    host: ip.to_owned(),
                    port,
                }),
                topic: settings.topic,
                dp_ranks: settings.dp_ranks,
                max_frame_bytes: None,
            },
            identity,
        }),
        None => PodObservation::NotServing { id, identity },
    }
}

/// The pod IP when the pod is Running and Ready, else `None`.
fn serving_ip(pod: &Pod) -> Option<&str> {
    let status = pod.status.as_ref()?;
    if status.phase.as_deref() != Some("Running") {
        return None;
    }
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let ip = status.pod_ip.as_deref().filter(|ip| !ip.is_empty())?;
    ready.then_some(ip)
}

/// The engine run: pod UID, restarts over every container, latest container start.
///
/// Every container counts, not only the engine's: kthena's router ignores fields written
/// at or before the pod's latest container start, whichever container it was.
fn identity(pod: &Pod) -> EngineIdentity {
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_deref())
        .unwrap_or_default();
    EngineIdentity {
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        restarts: statuses
            .iter()
            .map(|c| u64::try_from(c.restart_count).unwrap_or(0))
            .sum(),
        started_at: statuses
            .iter()
            .filter_map(|c| c.state.as_ref()?.running.as_ref()?.started_at.as_ref())
            .map(|t| t.0.as_second())
            .max(),
    }
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(|v| v.trim())
}

fn bad(reason: PodSkipReason, annotation: &'static str, what: String) -> AnnotationError {
    AnnotationError {
        reason,
        annotation,
        what,
    }
}

fn port_annotation(
    pod: &Pod,
    key: &'static str,
    reason: PodSkipReason,
) -> Result<Option<u16>, AnnotationError> {
    let Some(text) = annotation(pod, key) else {
        return Ok(None);
    };
    let value: u32 = text
        .parse()
        .map_err(|_| bad(reason, key, format!("`{text}` is not a port number")))?;
    port_number(value)
        .map(Some)
        .map_err(|e| bad(reason, key, e.to_string()))
}

/// Annotations over defaults; every required value must come from one of them.
fn settings(pod: &Pod, defaults: &PodDefaults) -> Result<PodSettings, AnnotationError> {
    let engine = match annotation(pod, ANNOTATION_ENGINE) {
        Some(text) => text
            .parse::<Engine>()
            .map_err(|what| bad(PodSkipReason::Engine, ANNOTATION_ENGINE, what))?,
        None => defaults.engine.ok_or_else(|| {
            let what = "missing, and discovery.kubernetes.engine sets no default".to_owned();
            bad(PodSkipReason::Engine, ANNOTATION_ENGINE, what)
        })?,
    };
    let model = match annotation(pod, ANNOTATION_MODEL) {
        Some("") => {
            let what = "is empty".to_owned();
            return Err(bad(PodSkipReason::Model, ANNOTATION_MODEL, what));
        }
        Some(text) => text.to_owned(),
        None => defaults.model.clone().ok_or_else(|| {
            let what = "missing, and discovery.kubernetes.model sets no default".to_owned();
            bad(PodSkipReason::Model, ANNOTATION_MODEL, what)
        })?,
    };
    let port = match port_annotation(pod, ANNOTATION_PORT, PodSkipReason::Port)? {
        Some(p) => p,
        None => defaults.port.ok_or_else(|| {
            let what = "missing, and discovery.kubernetes.port sets no default".to_owned();
            bad(PodSkipReason::Port, ANNOTATION_PORT, what)
        })?,
    };
    let replay_port = match annotation(pod, ANNOTATION_REPLAY_PORT) {
        Some("none") => None,
        Some(_) => port_annotation(pod, ANNOTATION_REPLAY_PORT, PodSkipReason::ReplayPort)?,
        None => defaults.replay_port,
    };
    let dp_ranks = match annotation(pod, ANNOTATION_DP_RANKS) {
        Some(text) => match text.parse::<u32>() {
            Ok(n) if (1..=MAX_DP_RANKS).contains(&n) => n,
            _ => {
                let what = format!("`{text}` is not a rank count in 1..={MAX_DP_RANKS}");
                return Err(bad(PodSkipReason::DpRanks, ANNOTATION_DP_RANKS, what));
            }
        },
        None => defaults.dp_ranks,
    };
    check_port_ranges(port, replay_port, dp_ranks).map_err(|e| {
        bad(
            PodSkipReason::ReplayPort,
            ANNOTATION_REPLAY_PORT,
            e.to_string(),
        )
    })?;
    let topic = match pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_TOPIC))
    {
        // Not trimmed: a topic is a byte prefix and spaces are part of it.
        Some(t) if t.len() > MAX_TOPIC_LEN => {
            let what = format!("is longer than {MAX_TOPIC_LEN} bytes");
            return Err(bad(PodSkipReason::Topic, ANNOTATION_TOPIC, what));
        }
        Some(t) => t.clone(),
        None => defaults.topic.clone(),
    };
    Ok(PodSettings {
        engine,
        model,
        port,
        replay_port,
        dp_ranks,
        topic,
    })
}

/// What one [`Roster::update`] changed, for logs and metrics.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RosterUpdate {
    /// Pods newly skipped (or skipped for a new reason).
    pub newly_skipped: Vec<(String, AnnotationError)>,
    /// Targets whose engine run changed: their state is dropped.
    pub restarts: Vec<(String, IdentityChange)>,
    /// Targets forgotten after being not Ready for the whole grace period.
    pub expired: Vec<String>,
}

struct Entry {
    target: DiscoveredTarget,
    not_ready_since: Option<Instant>,
}

/// The discovered target set, kept across pod snapshots.
pub struct Roster {
    grace: Duration,
    entries: BTreeMap<String, Entry>,
    skipped: BTreeMap<String, AnnotationError>,
}

impl Roster {
    /// An empty roster; a not-Ready pod keeps its target for `grace`.
    pub fn new(grace: Duration) -> Roster {
        Roster {
            grace,
            entries: BTreeMap::new(),
            skipped: BTreeMap::new(),
        }
    }

    /// Takes a full snapshot of the watched pods at `now`. Pods absent from it (deleted)
    /// are forgotten at once; a not-Ready pod keeps its target until `grace` has passed,
    /// unless its engine run changed (its state is gone either way).
    pub fn update(&mut self, pods: Vec<PodObservation>, now: Instant) -> RosterUpdate {
        let mut out = RosterUpdate::default();
        let mut seen = BTreeSet::new();
        for pod in pods {
            match pod {
                PodObservation::Serving(target) => {
                    let id = target.target.pod_id();
                    if let Some(change) = self.change_of(&id, &target.identity) {
                        out.restarts.push((id.clone(), change));
                    }
                    self.skipped.remove(&id);
                    let entry = Entry {
                        target,
                        not_ready_since: None,
                    };
                    self.entries.insert(id.clone(), entry);
                    seen.insert(id);
                }
                PodObservation::NotServing { id, identity } => {
                    self.skipped.remove(&id);
                    self.not_serving(&id, &identity, now, &mut out);
                    seen.insert(id);
                }
                PodObservation::Skipped { id, error } => {
                    self.entries.remove(&id);
                    if self.skipped.get(&id) != Some(&error) {
                        out.newly_skipped.push((id.clone(), error.clone()));
                        self.skipped.insert(id.clone(), error);
                    }
                    seen.insert(id);
                }
                PodObservation::Terminating => {}
            }
        }
        self.entries.retain(|id, _| seen.contains(id));
        self.skipped.retain(|id, _| seen.contains(id));
        out
    }

    fn not_serving(
        &mut self,
        id: &str,
        identity: &EngineIdentity,
        now: Instant,
        out: &mut RosterUpdate,
    ) {
        if let Some(change) = self.change_of(id, identity) {
            // The engine behind the target is gone: nothing of its state is worth keeping.
            self.entries.remove(id);
            out.restarts.push((id.to_owned(), change));
            return;
        }
        let Some(entry) = self.entries.get_mut(id) else {
            return;
        };
        let since = *entry.not_ready_since.get_or_insert(now);
        if now.saturating_duration_since(since) >= self.grace {
            self.entries.remove(id);
            out.expired.push(id.to_owned());
        }
    }

    /// How `identity` differs from the running target's, if it does.
    fn change_of(&self, id: &str, identity: &EngineIdentity) -> Option<IdentityChange> {
        let old = &self.entries.get(id)?.target.identity;
        if old.uid != identity.uid {
            Some(IdentityChange::Uid)
        } else if old != identity {
            Some(IdentityChange::Container)
        } else {
            None
        }
    }

    /// The targets to run now, sorted by pod identifier.
    pub fn targets(&self) -> Vec<DiscoveredTarget> {
        self.entries.values().map(|e| e.target.clone()).collect()
    }

    /// When the next not-Ready pod's grace runs out.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.entries
            .values()
            .filter_map(|e| e.not_ready_since)
            .map(|since| since + self.grace)
            .min()
    }

    /// Targets kept while their pod is not Ready (inside the grace period).
    pub fn in_grace(&self) -> Vec<String> {
        self.entries
            .iter()
            .filter(|(_, e)| e.not_ready_since.is_some())
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Pods skipped right now, with why.
    pub fn skipped(&self) -> &BTreeMap<String, AnnotationError> {
        &self.skipped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn defaults() -> PodDefaults {
        PodDefaults {
            engine: Some(Engine::Vllm),
            model: Some("m".to_owned()),
            port: Some(5557),
            replay_port: None,
            topic: String::new(),
            dp_ranks: 1,
        }
    }

    /// A pod in Kubernetes' JSON, parsed by k8s-openapi as the watcher would.
    fn pod(name: &str, ready: bool, annotations: serde_json::Value, restarts: i32) -> Pod {
        serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"), "annotations": annotations},
            "status": {
                "phase": "Running",
                "podIP": "10.1.2.3",
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
                "containerStatuses": [{
                    "name": "engine", "image": "vllm", "imageID": "", "ready": ready,
                    "restartCount": restarts,
                    "state": {"running": {"startedAt": "2026-12-01T10:00:07Z"}}
                }]
            }
        }))
        .unwrap()
    }

    fn serving(p: &Pod) -> DiscoveredTarget {
        match observe(p, &defaults()) {
            PodObservation::Serving(t) => t,
            other => panic!("not serving: {other:?}"),
        }
    }

    fn skipped(annotations: serde_json::Value) -> AnnotationError {
        match observe(&pod("a", true, annotations, 0), &defaults()) {
            PodObservation::Skipped { error, .. } => error,
            other => panic!("not skipped: {other:?}"),
        }
    }

    #[test]
    fn a_ready_pod_is_a_target_at_its_ip_with_defaults() {
        let t = serving(&pod("vllm-0", true, json!({}), 0));
        assert_eq!(t.target.pod_id(), "vllm-0.ns");
        assert_eq!(t.target.endpoint.to_string(), "tcp://10.1.2.3:5557");
        assert_eq!(
            (t.target.model.as_str(), t.target.engine),
            ("m", Engine::Vllm)
        );
        assert_eq!(t.identity.uid, "uid-vllm-0");
        assert_eq!(t.identity.started_at, Some(1_796_119_207));
        assert_eq!(t.identity.min_store_time(), 1_796_119_208);
    }

    #[test]
    fn annotations_override_every_default() {
        let t = serving(&pod(
            "a",
            true,
            json!({"kvindex.io/engine": "sglang", "kvindex.io/model": "llama", "kvindex.io/port": "6000",
                   "kvindex.io/replay-port": "7000", "kvindex.io/dp-ranks": "4", "kvindex.io/topic": "kv@"}),
            0,
        ));
        let t = t.target;
        assert_eq!((t.engine, t.model.as_str()), (Engine::Sglang, "llama"));
        assert_eq!(
            (t.endpoint.port, t.dp_ranks, t.topic.as_str()),
            (6000, 4, "kv@")
        );
        assert_eq!(
            t.replay_endpoint.unwrap().to_string(),
            "tcp://10.1.2.3:7000"
        );
    }

    #[test]
    fn invalid_annotations_skip_the_pod_with_the_reason() {
        let cases = [
            (json!({"kvindex.io/engine": "tgi"}), PodSkipReason::Engine),
            (json!({"kvindex.io/model": ""}), PodSkipReason::Model),
            (json!({"kvindex.io/port": "http"}), PodSkipReason::Port),
            (json!({"kvindex.io/port": "0"}), PodSkipReason::Port),
            (json!({"kvindex.io/port": "70000"}), PodSkipReason::Port),
            (
                json!({"kvindex.io/replay-port": "-1"}),
                PodSkipReason::ReplayPort,
            ),
            (
                json!({"kvindex.io/replay-port": "5558", "kvindex.io/dp-ranks": "2"}),
                PodSkipReason::ReplayPort,
            ),
            (json!({"kvindex.io/dp-ranks": "0"}), PodSkipReason::DpRanks),
            (
                json!({"kvindex.io/dp-ranks": "999"}),
                PodSkipReason::DpRanks,
            ),
            (
                json!({"kvindex.io/topic": "x".repeat(300)}),
                PodSkipReason::Topic,
            ),
        ];
        for (annotations, reason) in cases {
            let e = skipped(annotations.clone());
            assert_eq!(e.reason, reason, "{annotations}: {e}");
        }
        let e = skipped(json!({"kvindex.io/port": "http"}));
        assert_eq!(
            e.to_string(),
            "kvindex.io/port: `http` is not a port number"
        );
    }

    #[test]
    fn a_missing_default_needs_the_annotation() {
        let none = PodDefaults {
            model: None,
            ..defaults()
        };
        let p = pod("a", true, json!({}), 0);
        assert!(matches!(
            observe(&p, &none),
            PodObservation::Skipped {
                error: AnnotationError {
                    reason: PodSkipReason::Model,
                    ..
                },
                ..
            }
        ));
        let with = pod("a", true, json!({"kvindex.io/model": "m2"}), 0);
        assert!(matches!(observe(&with, &none), PodObservation::Serving(_)));
    }

    #[test]
    fn replay_port_none_turns_the_default_off() {
        let d = PodDefaults {
            replay_port: Some(5558),
            ..defaults()
        };
        let p = pod("a", true, json!({"kvindex.io/replay-port": "none"}), 0);
        let PodObservation::Serving(t) = observe(&p, &d) else {
            panic!("not serving");
        };
        assert!(t.target.replay_endpoint.is_none());
    }

    #[test]
    fn not_ready_pending_and_terminating_pods_are_not_serving() {
        assert!(matches!(
            observe(&pod("a", false, json!({}), 0), &defaults()),
            PodObservation::NotServing { .. }
        ));
        let mut pending = pod("a", true, json!({}), 0);
        pending.status.as_mut().unwrap().phase = Some("Pending".to_owned());
        assert!(matches!(
            observe(&pending, &defaults()),
            PodObservation::NotServing { .. }
        ));
        let mut no_ip = pod("a", true, json!({}), 0);
        no_ip.status.as_mut().unwrap().pod_ip = None;
        assert!(matches!(
            observe(&no_ip, &defaults()),
            PodObservation::NotServing { .. }
        ));
        let mut gone: Pod = pod("a", true, json!({}), 0);
        gone.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert_eq!(observe(&gone, &defaults()), PodObservation::Terminating);
    }

    #[test]
    fn roster_keeps_a_flapping_pod_for_the_grace_then_forgets_it() {
        let t0 = Instant::now();
        let grace = Duration::from_secs(30);
        let mut r = Roster::new(grace);
        let obs = |ready| observe(&pod("a", ready, json!({}), 0), &defaults());
        r.update(vec![obs(true)], t0);
        assert_eq!(r.targets().len(), 1);
        r.update(vec![obs(false)], t0 + Duration::from_secs(1));
        assert_eq!(r.targets().len(), 1, "kept during the grace");
        assert_eq!(r.next_deadline(), Some(t0 + Duration::from_secs(31)));
        // Ready again: the timer is reset.
        r.update(vec![obs(true)], t0 + Duration::from_secs(20));
        assert_eq!(r.next_deadline(), None);
        r.update(vec![obs(false)], t0 + Duration::from_secs(40));
        let u = r.update(vec![obs(false)], t0 + Duration::from_secs(69));
        assert!(u.expired.is_empty() && r.targets().len() == 1);
        let u = r.update(vec![obs(false)], t0 + Duration::from_secs(70));
        assert_eq!(u.expired, ["a.ns"]);
        assert!(r.targets().is_empty());
        // A pod first seen not Ready is not a target at all.
        let mut fresh = Roster::new(grace);
        fresh.update(vec![obs(false)], t0);
        assert!(fresh.targets().is_empty() && fresh.next_deadline().is_none());
    }

    #[test]
    fn roster_forgets_deleted_pods_at_once() {
        let t0 = Instant::now();
        let mut r = Roster::new(Duration::from_secs(30));
        let a = observe(&pod("a", true, json!({}), 0), &defaults());
        let b = observe(&pod("b", true, json!({}), 0), &defaults());
        r.update(vec![a.clone(), b], t0);
        assert_eq!(r.targets().len(), 2);
        r.update(vec![a], t0);
        let ids: Vec<_> = r.targets().iter().map(|t| t.target.pod_id()).collect();
        assert_eq!(ids, ["a.ns"]);
    }

    #[test]
    fn roster_reports_restarts_by_uid_and_by_container() {
        let t0 = Instant::now();
        let mut r = Roster::new(Duration::from_secs(30));
        let first = pod("a", true, json!({}), 0);
        r.update(vec![observe(&first, &defaults())], t0);
        let mut restarted = pod("a", true, json!({}), 1);
        let u = r.update(vec![observe(&restarted, &defaults())], t0);
        assert_eq!(u.restarts, [("a.ns".to_owned(), IdentityChange::Container)]);
        assert_eq!(r.targets()[0].identity.restarts, 1);
        restarted.metadata.uid = Some("other".to_owned());
        let u = r.update(vec![observe(&restarted, &defaults())], t0);
        assert_eq!(u.restarts, [("a.ns".to_owned(), IdentityChange::Uid)]);
        // A restart seen while not Ready forgets the target at once (its engine is gone).
        let mut crashed = restarted.clone();
        crashed
            .status
            .as_mut()
            .unwrap()
            .container_statuses
            .as_mut()
            .unwrap()[0]
            .restart_count = 2;
        crashed
            .status
            .as_mut()
            .unwrap()
            .conditions
            .as_mut()
            .unwrap()[0]
            .status = "False".to_owned();
        let u = r.update(vec![observe(&crashed, &defaults())], t0);
        assert_eq!(u.restarts.len(), 1);
        assert!(r.targets().is_empty());
    }

    #[test]
    fn roster_counts_a_skip_once_until_its_reason_changes() {
        let t0 = Instant::now();
        let mut r = Roster::new(Duration::from_secs(30));
        let bad = |v: &str| {
            observe(
                &pod("a", true, json!({"kvindex.io/port": v}), 0),
                &defaults(),
            )
        };
        assert_eq!(r.update(vec![bad("x")], t0).newly_skipped.len(), 1);
        assert_eq!(r.update(vec![bad("x")], t0).newly_skipped.len(), 0);
        assert_eq!(r.update(vec![bad("y")], t0).newly_skipped.len(), 1);
        assert_eq!(r.skipped().len(), 1);
        // A serving pod whose annotation turns invalid stops being a target.
        r.update(
            vec![observe(&pod("a", true, json!({}), 0), &defaults())],
            t0,
        );
        assert_eq!(r.targets().len(), 1);
        assert!(r.skipped().is_empty());
        r.update(vec![bad("z")], t0);
        assert!(r.targets().is_empty());
    }
}

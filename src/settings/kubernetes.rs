//! What `discovery.kubernetes` resolves to: how to reach the API server, which pods to watch,
//! and the per-pod defaults that annotations override. `config` validates the file into
//! these types; discovery only reads them.

use std::path::PathBuf;
use std::time::Duration;

use crate::wire::Engine;

/// Default time a target stays subscribed while its pod is not Ready (a readiness flap).
pub const DEFAULT_NOT_READY_GRACE: Duration = Duration::from_secs(30);

/// How the daemon reaches the API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterAccess {
    /// A kubeconfig file named in the config.
    Kubeconfig(PathBuf),
    /// The kubeconfig file(s) that `KUBECONFIG` names.
    KubeconfigEnv,
    /// The pod's service account (token and CA mounted by Kubernetes).
    InCluster,
}

/// Per-pod settings that annotations override.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodDefaults {
    /// Engine family.
    pub engine: Option<Engine>,
    /// Served model.
    pub model: Option<String>,
    /// PUB port of DP rank 0.
    pub port: Option<u16>,
    /// Replay ROUTER port of DP rank 0.
    pub replay_port: Option<u16>,
    /// Subscription filter.
    pub topic: String,
    /// DP ranks.
    pub dp_ranks: u32,
}

/// The validated `discovery.kubernetes` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubernetesConfig {
    /// Where the client's credentials come from.
    pub access: ClusterAccess,
    /// Namespaces to watch; empty = every namespace.
    pub namespaces: Vec<String>,
    /// Label selector passed to the API server.
    pub label_selector: Option<String>,
    /// Defaults for every discovered pod.
    pub defaults: PodDefaults,
    /// How long a not-Ready pod keeps its state.
    pub not_ready_grace: Duration,
}

/// Why a pod's ports cannot work together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PortsError {
    /// Port 0 was given.
    #[error("port 0 is not a port")]
    Zero,
    /// A port above 65535 was given.
    #[error("{0} is not a port (1..=65535)")]
    OutOfRange(u32),
    /// `port + dp_ranks - 1` passes 65535.
    #[error("port {port} + {dp_ranks} DP ranks passes 65535")]
    RanksOverflow {
        /// First port.
        port: u16,
        /// DP ranks.
        dp_ranks: u32,
    },
    /// The replay ports of the ranks overlap their PUB ports.
    #[error("replay ports {replay}.. overlap the PUB ports {port}.. of {dp_ranks} DP ranks")]
    Overlap {
        /// PUB port of rank 0.
        port: u16,
        /// Replay port of rank 0.
        replay: u16,
        /// DP ranks.
        dp_ranks: u32,
    },
}

/// A written port number as a `u16` in 1..=65535.
///
/// # Errors
/// [`PortsError::Zero`] or [`PortsError::OutOfRange`].
pub fn port_number(value: u32) -> Result<u16, PortsError> {
    match u16::try_from(value) {
        Ok(0) => Err(PortsError::Zero),
        Ok(p) => Ok(p),
        Err(_) => Err(PortsError::OutOfRange(value)),
    }
}

/// Checks that rank r's PUB port (`port + r`) and replay port (`replay + r`) all exist and
/// never coincide: rank 1's PUB port must not be rank 0's replay port.
///
/// # Errors
/// The first conflict found.
pub fn check_port_ranges(port: u16, replay: Option<u16>, dp_ranks: u32) -> Result<(), PortsError> {
    let last = |p: u16| u32::from(p) + dp_ranks.saturating_sub(1);
    for p in std::iter::once(port).chain(replay) {
        if last(p) > u32::from(u16::MAX) {
            return Err(PortsError::RanksOverflow { port: p, dp_ranks });
        }
    }
    if let Some(replay) = replay {
        let (pub_end, replay_end) = (last(port), last(replay));
        if u32::from(port) <= replay_end && u32::from(replay) <= pub_end {
            return Err(PortsError::Overlap {
                port,
                replay,
                dp_ranks,
            });
        }
    }
    Ok(())
}

impl KubernetesConfig {
    /// The section as JSON, for `check-config`.
    pub fn to_json(&self) -> serde_json::Value {
        let access = match &self.access {
            ClusterAccess::Kubeconfig(p) => format!("kubeconfig {}", p.display()),
            ClusterAccess::KubeconfigEnv => "KUBECONFIG".to_owned(),
            ClusterAccess::InCluster => "in-cluster service account".to_owned(),
        };
        let d = &self.defaults;
        serde_json::json!({
            "access": access,
            "namespaces": if self.namespaces.is_empty() { serde_json::json!("all") } else { serde_json::json!(self.namespaces) },
            "label_selector": self.label_selector,
            "engine": d.engine,
            "model": d.model,
            "port": d.port,
            "replay_port": d.replay_port,
            "topic": d.topic,
            "dp_ranks": d.dp_ranks,
            "not_ready_grace_s": self.not_ready_grace.as_secs(),
        })
    }
}

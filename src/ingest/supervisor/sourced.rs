//! Where a target came from, and what identifies the engine process behind it.

use crate::ingest::Target;

/// Which part of the daemon asked for a target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TargetSource {
    /// `targets:` in the config file.
    Static,
    /// `discovery.kubernetes`.
    Kubernetes,
}

impl TargetSource {
    /// Every source, for per-source gauges.
    pub const ALL: [TargetSource; 2] = [TargetSource::Static, TargetSource::Kubernetes];

    /// Label value (`static`, `kubernetes`).
    pub fn as_str(self) -> &'static str {
        match self {
            TargetSource::Static => "static",
            TargetSource::Kubernetes => "kubernetes",
        }
    }
}

/// What tells one run of an engine from the next: a change is an engine restart, so the
/// target's old state is dropped before its new stream is applied.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct EngineIdentity {
    /// The pod's UID (a new pod under the same name has a new one).
    pub uid: String,
    /// Restarts over the pod's containers.
    pub restarts: u64,
    /// Unix second of the latest container start, when known.
    pub started_at: Option<i64>,
}

impl EngineIdentity {
    /// This run as one string (pod UID and container restarts), as a checkpoint records it.
    pub fn run(&self) -> String {
        format!("{}/{}", self.uid, self.restarts)
    }

    /// The lowest store time that kthena's router will accept for this run: it ignores
    /// fields written at or before the pod's latest container start (whole seconds), so
    /// every write must carry at least that second + 1.
    pub fn min_store_time(&self) -> u32 {
        self.started_at.map_or(0, |s| {
            s.saturating_add(1).clamp(0, i64::from(u32::MAX)) as u32
        })
    }
}

/// A target found by a discovery source, with the identity of its engine run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveredTarget {
    /// Where and what to subscribe to.
    pub target: Target,
    /// The engine run behind it.
    pub identity: EngineIdentity,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_write_after_a_start_is_one_second_later() {
        let id = EngineIdentity {
            started_at: Some(1_700_000_000),
            ..EngineIdentity::default()
        };
        assert_eq!(id.min_store_time(), 1_700_000_001);
        assert_eq!(EngineIdentity::default().min_store_time(), 0);
        let odd = EngineIdentity {
            started_at: Some(-5),
            ..EngineIdentity::default()
        };
        assert_eq!(odd.min_store_time(), 0);
    }
}

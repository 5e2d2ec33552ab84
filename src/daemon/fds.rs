//! The descriptor budget: the soft `RLIMIT_NOFILE` is raised to the hard limit at start-up,
//! a reserve is kept for ingest (a SUB socket per DP rank, replay DEALERs, reconnects),
//! Redis, the config watcher and Kubernetes, and only the rest is shared by the HTTP
//! listeners, so no number of HTTP clients can make a ZMQ reconnect or a Redis write fail
//! for want of a descriptor.

use tracing::{info, warn};

/// Descriptors never given to HTTP clients, at most (half the limit when it is lower).
const RESERVE: usize = 1024;
/// Connections of the metrics listener at most (scrapers and probes).
const METRICS_MAX: usize = 64;

/// How many connections each listener may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FdBudget {
    /// The API listener's share.
    pub(super) api: usize,
    /// The metrics listener's share.
    pub(super) metrics: usize,
}

/// Raises the descriptor limit and splits what is above the reserve between the listeners.
pub(super) fn raise_and_split() -> FdBudget {
    split(raise_nofile_limit())
}

/// The budget for a soft limit of `limit` descriptors: half of it (at most [`RESERVE`]) is
/// kept, an eighth of the rest (at most [`METRICS_MAX`]) goes to metrics, the rest to the API.
pub(super) fn split(limit: usize) -> FdBudget {
    let reserve = (limit / 2).min(RESERVE);
    let spare = limit.saturating_sub(reserve);
    let metrics = (spare / 8).clamp(1, METRICS_MAX);
    FdBudget {
        api: spare.saturating_sub(metrics).max(1),
        metrics,
    }
}

/// Sets the soft limit to the hard one; returns the soft limit in force afterwards.
#[cfg(unix)]
fn raise_nofile_limit() -> usize {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let before = getrlimit(Resource::Nofile);
    let as_count =
        |v: Option<u64>| v.map_or(usize::MAX, |v| usize::try_from(v).unwrap_or(usize::MAX));
    let current = as_count(before.current);
    if before.maximum == before.current {
        return current;
    }
    let raised = Rlimit {
        current: before.maximum,
        maximum: before.maximum,
    };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => {
            let now = as_count(getrlimit(Resource::Nofile).current);
            info!(
                from = current,
                to = now,
                "Raised the open-file limit to its hard limit."
            );
            now
        }
        Err(err) => {
            warn!(error = %err, limit = current, "Could not raise the open-file limit; keeping it.");
            current
        }
    }
}

/// Elsewhere the limit is not known: assume a common default.
#[cfg(not(unix))]
fn raise_nofile_limit() -> usize {
    8192
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_is_kept_whatever_the_limit() {
        // The fault campaign's limit: 256 descriptors.
        assert_eq!(
            split(256),
            FdBudget {
                api: 112,
                metrics: 16
            }
        );
        assert_eq!(
            split(1024),
            FdBudget {
                api: 448,
                metrics: 64
            }
        );
        let large = split(1 << 20);
        assert_eq!(large.metrics, METRICS_MAX);
        assert_eq!(large.api + large.metrics + RESERVE, 1 << 20);
        assert!(split(1).api >= 1);
    }
}

//! What the daemon reports about its targets ([`PodStatus`]), and the [`PodsView`] trait the
//! HTTP API reads it through: ingest owns the targets, so the types live here and `api`
//! imports them from below.

use std::collections::BTreeMap;

use crate::index::Index;

/// One target pod's state, as `GET /v1/pods` reports it.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct PodStatus {
    /// Pod identifier `{pod}.{namespace}`.
    pub pod: String,
    /// Served model.
    pub model: String,
    /// Engine family (`vllm`, `sglang`, `trtllm`).
    pub engine: String,
    /// ZMQ endpoint of DP rank 0.
    pub endpoint: String,
    /// DP ranks subscribed.
    pub dp_ranks: u32,
    /// Where the target came from: `static` (config file) or `kubernetes` (discovery).
    pub source: String,
    /// `connected`, `connecting`, `disconnected` or `stopped`.
    pub state: String,
    /// Seconds since the last message from any rank (`None` before the first).
    pub last_message_age_seconds: Option<f64>,
    /// Resident (block, pod) entries per medium spelling.
    pub resident_blocks: BTreeMap<String, u64>,
}

/// Where `GET /v1/pods` gets the targets from (the daemon's supervisor implements it).
pub trait PodsView: Send + Sync + 'static {
    /// The current targets.
    fn pods(&self) -> Vec<PodStatus>;
}

/// Resident (block, pod) entries of `pod` per reported medium spelling, from the index's
/// per-pod counters (O(1), no walk). Entries stored without a medium have no spelling and
/// are left out, as they always were.
pub(crate) fn resident_blocks(index: &Index, pod: &str) -> BTreeMap<String, u64> {
    let Some(id) = index.pod_id(pod) else {
        return BTreeMap::new();
    };
    index
        .pod_entry_counts(id)
        .1
        .into_iter()
        .filter(|(medium, _)| !medium.is_empty())
        .map(|(medium, n)| (medium.to_owned(), n))
        .collect()
}

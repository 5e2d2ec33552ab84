//! HTTP query service (axum).
//!
//! API CONTRACT (skeleton; issue 5 fills it in — the daemon codes against these
//! signatures, so keep them).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::index::Index;
use crate::medium::TierWeights;

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

/// Everything the handlers need.
#[derive(Clone)]
pub struct ApiState {
    _index: Index,
    _weights: TierWeights,
    _token: Option<String>,
    _pods: Arc<dyn PodsView>,
}

impl ApiState {
    /// State over the in-memory index; `token` enables bearer auth.
    pub fn new(
        index: Index,
        weights: TierWeights,
        token: Option<String>,
        pods: Arc<dyn PodsView>,
    ) -> ApiState {
        ApiState {
            _index: index,
            _weights: weights,
            _token: token,
            _pods: pods,
        }
    }
}

/// The HTTP app.
pub fn router(_state: ApiState) -> axum::Router {
    unimplemented!("issue 5")
}

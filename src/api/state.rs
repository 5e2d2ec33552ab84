//! What every handler shares: the scoring backend, weights, token, targets and limits.

use std::sync::Arc;
use std::time::Duration;

use super::error::ApiError;
use crate::ingest::PodsView;
use crate::medium::TierWeights;
use crate::score::{MatchMode, Predictions, PromptSettings, ScoreBackend};
use crate::store::redis::lease::LeaseGate;

/// Protective limits of the service (axum's key-value-store example: shed, limit, time out).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiLimits {
    /// Largest request body accepted, in bytes (413 beyond).
    pub max_body_bytes: usize,
    /// Requests served at once; more are shed with 503.
    pub concurrency: usize,
    /// Deadline of one request (503 past it).
    pub timeout: Duration,
    /// Candidate pods accepted in one request.
    pub max_pods: usize,
}

impl Default for ApiLimits {
    fn default() -> Self {
        ApiLimits {
            max_body_bytes: 4 << 20,
            concurrency: 512,
            timeout: Duration::from_secs(5),
            max_pods: 4096,
        }
    }
}

/// How prompts are cut, per match mode: `prefix` scores long prompts whole, `kthena` keeps
/// the cap kthena's router computes with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptLimits {
    /// `prefix` mode's block size and cap (`api.max_blocks`).
    pub prefix: PromptSettings,
    /// `kthena` mode's block size and cap (`api.kthena_max_blocks`).
    pub kthena: PromptSettings,
}

impl Default for PromptLimits {
    fn default() -> Self {
        let kthena = PromptSettings::default();
        let prefix =
            PromptSettings::new(kthena.block_size(), DEFAULT_PREFIX_MAX_BLOCKS).unwrap_or(kthena);
        PromptLimits { prefix, kthena }
    }
}

impl PromptLimits {
    /// The settings of `mode`, cut at a request's own `max_blocks` when it asks for fewer.
    ///
    /// # Errors
    /// [`ApiError`] naming `max_blocks` when it is 0 or above the server's cap.
    pub(super) fn settings(
        &self,
        mode: MatchMode,
        asked: Option<usize>,
    ) -> Result<PromptSettings, ApiError> {
        let (settings, setting) = match mode {
            MatchMode::Prefix => (self.prefix, "api.max_blocks"),
            MatchMode::Kthena => (self.kthena, "api.kthena_max_blocks"),
        };
        match asked {
            None => Ok(settings),
            Some(0) => Err(ApiError::bad_field(
                "max_blocks",
                "max_blocks must be at least 1",
            )),
            Some(n) if n > settings.max_blocks() => Err(ApiError::bad_field(
                "max_blocks",
                format!(
                    "at most {} blocks in {} mode ({setting})",
                    settings.max_blocks(),
                    mode.as_str()
                ),
            )),
            Some(n) => Ok(settings.capped(n)),
        }
    }
}

/// Default of `api.max_blocks`: `prefix` mode scores prompts of up to 131,072 tokens whole.
pub const DEFAULT_PREFIX_MAX_BLOCKS: usize = 8192;

/// Everything the handlers need.
#[derive(Clone)]
pub struct ApiState {
    pub(super) backend: ScoreBackend,
    /// Shared: every request's state is a clone, and most requests use these weights as
    /// they are (a deep copy of the map was a handful of allocations a request).
    pub(super) weights: Arc<TierWeights>,
    pub(super) token: Option<Arc<str>>,
    pub(super) pods: Arc<dyn PodsView>,
    pub(super) limits: ApiLimits,
    pub(super) prompt: PromptLimits,
    pub(super) predictions: Arc<Predictions>,
    /// With `ha:`: who writes Redis for this replica's shard (`/v1/pods`).
    pub(super) writer: Option<Arc<LeaseGate>>,
}

impl ApiState {
    /// State scoring from `backend` (the in-memory index, or Redis for sharded replicas);
    /// `token` enables bearer auth.
    pub fn new(
        backend: ScoreBackend,
        weights: TierWeights,
        token: Option<String>,
        pods: Arc<dyn PodsView>,
    ) -> ApiState {
        ApiState {
            backend,
            weights: Arc::new(weights),
            token: token.filter(|t| !t.is_empty()).map(Arc::from),
            pods,
            limits: ApiLimits::default(),
            prompt: PromptLimits::default(),
            predictions: Arc::new(Predictions::default()),
            writer: None,
        }
    }

    /// Reports the HA writer of this replica's shard in `/v1/pods` (`None`: no `ha:`).
    pub fn with_writer(mut self, writer: Option<Arc<LeaseGate>>) -> ApiState {
        self.writer = writer;
        self
    }

    /// Replaces the protective limits.
    pub fn with_limits(mut self, limits: ApiLimits) -> ApiState {
        self.limits = limits;
        self
    }

    /// Replaces how prompts are cut into blocks, per match mode (block size, max blocks).
    pub fn with_prompt(mut self, prompt: PromptLimits) -> ApiState {
        self.prompt = prompt;
        self
    }
}

//! What the daemon reports about its targets ([`PodStatus`]), and the [`PodsView`] trait the
//! HTTP API reads it through: ingest owns the targets, so the types live here and `api`
//! imports them from below.

use std::collections::BTreeMap;

use crate::index::Index;

/// One target pod's state, as `GET /v1/pods` reports it. Fields a reader can do without
/// default when absent, so `kvindex top` reads older daemons' bodies.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PodStatus {
    /// Pod identifier `{pod}.{namespace}`.
    pub pod: String,
    /// Served model.
    #[serde(default)]
    pub model: String,
    /// Engine family (`vllm`, `sglang`, `trtllm`).
    pub engine: String,
    /// ZMQ endpoint of DP rank 0.
    #[serde(default)]
    pub endpoint: String,
    /// DP ranks subscribed.
    pub dp_ranks: u32,
    /// Where the target came from: `static` (config file) or `kubernetes` (discovery).
    #[serde(default)]
    pub source: String,
    /// `connected`, `connecting`, `disconnected` or `stopped`; `other_shard` for a pod
    /// another replica owns (not subscribed here).
    pub state: String,
    /// Seconds since the last message from any rank (`None` before the first).
    pub last_message_age_seconds: Option<f64>,
    /// Resident (block, pod) entries per medium spelling.
    #[serde(default)]
    pub resident_blocks: BTreeMap<String, u64>,
    /// DP ranks connected now.
    #[serde(default)]
    pub ranks_connected: u32,
    /// Why a rank's last connect attempt failed (`rank N: reason`), while one is failing.
    #[serde(default)]
    pub last_error: Option<String>,
    /// Ingest counters over every rank since the target started.
    #[serde(default)]
    pub counters: PodCounters,
    /// The replica (shard number) that owns the pod; 0 without sharding.
    #[serde(default)]
    pub shard: u32,
}

/// Ingest counters of one target, summed over its DP ranks (`kvindex top` turns them into
/// rates).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PodCounters {
    /// Messages received.
    pub messages: u64,
    /// Events decoded (stored, removed, cleared).
    pub events: u64,
    /// Blocks the index stored.
    pub blocks_stored: u64,
    /// Blocks the index removed.
    pub blocks_removed: u64,
    /// Messages rejected whole.
    pub decode_errors: u64,
    /// Events rejected alone.
    pub invalid_events: u64,
    /// Seq gaps seen.
    pub seq_gaps: u64,
    /// Replays that filled their gap.
    pub replays_succeeded: u64,
    /// Replays that failed.
    pub replays_failed: u64,
    /// Sources reset (state unknown).
    pub source_resets: u64,
    /// Engine restarts detected.
    pub restarts: u64,
}

impl PodCounters {
    /// Adds one rank's counters.
    pub fn add(&mut self, s: &super::IngestStats) {
        self.messages += s.messages;
        self.events += s.block_stored_events + s.block_removed_events + s.all_blocks_cleared_events;
        self.blocks_stored += s.apply.blocks_stored;
        self.blocks_removed += s.apply.blocks_removed;
        self.decode_errors += s.decode_errors.values().sum::<u64>();
        self.invalid_events += s.invalid_events.values().sum::<u64>();
        self.seq_gaps += s.seq_gaps;
        self.replays_succeeded += s.replays_succeeded;
        self.replays_failed += s.replays_failed;
        self.source_resets += s.source_resets;
        self.restarts += s.restarts;
    }
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

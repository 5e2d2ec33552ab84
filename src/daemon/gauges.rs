//! Gauges computed from state (ages, residency, mirror), refreshed on a timer rather than
//! on every event, so the hot path never touches them.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::index::Index;
use crate::ingest::supervisor::Supervisor;
use crate::store::redis::MirrorHandle;

/// How often the gauges are refreshed.
const GAUGE_INTERVAL: Duration = Duration::from_secs(5);

/// Refreshes the gauges every [`GAUGE_INTERVAL`] until cancelled.
pub(super) async fn refresh_loop(
    supervisor: Arc<Supervisor>,
    index: Index,
    mirror: Option<Arc<MirrorHandle>>,
    cancel: CancellationToken,
) {
    let mut tick = tokio::time::interval(GAUGE_INTERVAL);
    loop {
        tokio::select! {
            biased;
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        supervisor.publish_ages();
        for (medium, n) in index.stats().entries_by_medium {
            crate::metrics::resident_blocks(&medium, n);
        }
        if let Some(m) = &mirror {
            let st = m.stats();
            crate::metrics::mirror(st.queue_depth, st.dirty, st.reconciling, st.flush_p99_us);
        }
    }
}

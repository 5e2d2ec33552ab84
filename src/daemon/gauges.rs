//! Gauges computed from state (ages, residency, connections, mirror), refreshed on a timer
//! rather than on every event, so the hot path never touches them.
//!
//! Every figure comes from a counter kept in O(1) (the index's entry counters, the mirror's
//! queue length) or from the target list, so a short interval costs nothing: a gauge is
//! true within [`GAUGE_INTERVAL`]. A medium whose count drops to zero is set to zero, not
//! left at its last value.
//!
//! The same timer runs the Prometheus recorder's upkeep: it is installed without an exporter
//! of its own (`install_recorder`), which spawns none, so without it every histogram sample
//! (one per message, per request, per mirror write) would wait for a scrape to be folded into
//! its buckets, and a daemon nobody scrapes would grow without bound.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;

use crate::index::Index;
use crate::ingest::subscriber::LinkState;
use crate::ingest::supervisor::Supervisor;
use crate::store::redis::MirrorHandle;

/// How often the gauges are refreshed (the promise: true within this).
const GAUGE_INTERVAL: Duration = Duration::from_secs(1);

/// Refreshes the gauges and runs `recorder`'s upkeep every [`GAUGE_INTERVAL`] until
/// cancelled.
pub(super) async fn refresh_loop(
    supervisor: Arc<Supervisor>,
    index: Index,
    mirror: Option<Arc<MirrorHandle>>,
    recorder: Option<PrometheusHandle>,
    cancel: CancellationToken,
) {
    let mut tick = tokio::time::interval(GAUGE_INTERVAL);
    let mut media_seen: BTreeSet<&'static str> = BTreeSet::new();
    loop {
        tokio::select! {
            biased;
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        refresh(&supervisor, &index, mirror.as_deref(), &mut media_seen);
        if let Some(recorder) = &recorder {
            recorder.run_upkeep();
        }
    }
}

/// One refresh; `media_seen` remembers every medium reported, so one that empties reads 0.
fn refresh(
    supervisor: &Supervisor,
    index: &Index,
    mirror: Option<&MirrorHandle>,
    media_seen: &mut BTreeSet<&'static str>,
) {
    supervisor.publish_ages();
    let speculative = index.speculative();
    speculative.purge(std::time::Instant::now());
    crate::metrics::speculative(&speculative.stats());
    let (_, by_medium) = index.entry_counts();
    for medium in media_seen.iter() {
        if !by_medium.iter().any(|(m, _)| m == medium) {
            crate::metrics::resident_blocks(medium, 0);
        }
    }
    for (medium, n) in by_medium {
        media_seen.insert(medium);
        crate::metrics::resident_blocks(medium, n as usize);
    }
    let connected = supervisor
        .status()
        .iter()
        .flat_map(|t| &t.ranks)
        .filter(|r| r.state == LinkState::Connected)
        .count();
    crate::metrics::targets_connected(connected);
    if let Some(m) = mirror {
        let st = m.stats();
        crate::metrics::mirror(st.queue_depth, st.dirty, st.reconciling, st.flush_p99_us);
    }
}

//! `/metrics`, `/healthz`, `/readyz`: what Prometheus and Kubernetes probes read.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::ingest::discovery::DiscoveryHealth;
use crate::ingest::PodsView;
use crate::store::redis::lease::LeaseGate;
use crate::store::redis::MirrorHandle;

#[derive(Clone)]
struct HealthState {
    metrics: Option<PrometheusHandle>,
    mirror: Option<Arc<MirrorHandle>>,
    discovery: Option<DiscoveryHealth>,
    pods: Arc<dyn PodsView>,
    lease: Option<Arc<LeaseGate>>,
}

/// The health and metrics router; `metrics` is `None` when another recorder was installed.
pub(super) fn router(
    metrics: Option<PrometheusHandle>,
    mirror: Option<Arc<MirrorHandle>>,
    discovery: Option<DiscoveryHealth>,
    pods: Arc<dyn PodsView>,
    lease: Option<Arc<LeaseGate>>,
) -> axum::Router {
    let state = HealthState {
        metrics,
        mirror,
        discovery,
        pods,
        lease,
    };
    axum::Router::new()
        .route("/metrics", get(metrics_page))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(state)
}

async fn metrics_page(State(s): State<HealthState>) -> (StatusCode, String) {
    match &s.metrics {
        Some(h) => (StatusCode::OK, crate::metrics::render(h)),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            "no metrics recorder\n".to_owned(),
        ),
    }
}

async fn readyz(State(s): State<HealthState>) -> (StatusCode, String) {
    // Config is loaded by construction; Redis must answer when one is configured, and
    // discovery must have listed the pods without a standing watch error. Targets that are
    // not connected are listed but do not make the daemon unready: one engine down must not
    // take the API (and every other target's index) out of service.
    let (status, head) = if s.mirror.as_ref().is_some_and(|m| !m.is_healthy()) {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "redis unreachable".to_owned(),
        )
    } else {
        match s
            .discovery
            .as_ref()
            .and_then(DiscoveryHealth::not_ready_reason)
        {
            Some(why) => (StatusCode::SERVICE_UNAVAILABLE, why.to_string()),
            None => (StatusCode::OK, "ready".to_owned()),
        }
    };
    let mut body = head + "\n";
    // A standby is ready: it serves queries from its own live index.
    if let Some(view) = s.lease.as_ref().map(|l| l.view()) {
        let holder = view.holder.as_deref().unwrap_or("nobody");
        body.push_str(&format!(
            "ha: {} (lease holder: {holder}, ready to lead: {})\n",
            view.role, view.ready_to_lead
        ));
    }
    for pod in s.pods.pods() {
        if pod.ranks_connected < pod.dp_ranks {
            body.push_str(&format!(
                "target {} not connected: {} ({}/{} ranks){}\n",
                pod.pod,
                pod.state,
                pod.ranks_connected,
                pod.dp_ranks,
                pod.last_error
                    .map(|e| format!(", last error: {e}"))
                    .unwrap_or_default()
            ));
        }
    }
    (status, body)
}

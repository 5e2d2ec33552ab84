//! `/metrics`, `/healthz`, `/readyz`: what Prometheus and Kubernetes probes read.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::ingest::discovery::DiscoveryHealth;
use crate::store::redis::MirrorHandle;

#[derive(Clone)]
struct HealthState {
    metrics: Option<PrometheusHandle>,
    mirror: Option<Arc<MirrorHandle>>,
    discovery: Option<DiscoveryHealth>,
}

/// The health and metrics router; `metrics` is `None` when another recorder was installed.
pub(super) fn router(
    metrics: Option<PrometheusHandle>,
    mirror: Option<Arc<MirrorHandle>>,
    discovery: Option<DiscoveryHealth>,
) -> axum::Router {
    let state = HealthState {
        metrics,
        mirror,
        discovery,
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
    // discovery must have listed the pods without a standing watch error.
    if s.mirror.as_ref().is_some_and(|m| !m.is_healthy()) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "redis unreachable\n".to_owned(),
        );
    }
    match s
        .discovery
        .as_ref()
        .and_then(DiscoveryHealth::not_ready_reason)
    {
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
        None => (StatusCode::OK, "ready\n".to_owned()),
    }
}

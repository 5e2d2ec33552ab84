//! `/metrics`, `/healthz`, `/readyz`: what Prometheus and Kubernetes probes read.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::store::redis::MirrorHandle;

#[derive(Clone)]
struct HealthState {
    metrics: Option<PrometheusHandle>,
    mirror: Option<Arc<MirrorHandle>>,
}

/// The health and metrics router; `metrics` is `None` when another recorder was installed.
pub(super) fn router(
    metrics: Option<PrometheusHandle>,
    mirror: Option<Arc<MirrorHandle>>,
) -> axum::Router {
    axum::Router::new()
        .route("/metrics", get(metrics_page))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(HealthState { metrics, mirror })
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

async fn readyz(State(s): State<HealthState>) -> (StatusCode, &'static str) {
    // Config is loaded by construction; Redis must answer when one is configured.
    match &s.mirror {
        Some(m) if !m.is_healthy() => (StatusCode::SERVICE_UNAVAILABLE, "redis unreachable\n"),
        _ => (StatusCode::OK, "ready\n"),
    }
}

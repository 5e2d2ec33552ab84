//! The app: routes, auth, body limit, load shedding, a concurrency limit and a timeout.

use std::future::Future;

use axum::error_handling::HandleErrorLayer;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::middleware;
use axum::routing::{get, post};
use tower::ServiceBuilder;

use super::auth::require_token;
use super::error::ApiError;
use super::observe::track;
use super::pd::pd_handler;
use super::pods::pods_handler;
use super::routed::{feedback_handler, routed_handler};
use super::score::score_handler;
use super::state::ApiState;

async fn not_found() -> ApiError {
    ApiError::status(StatusCode::NOT_FOUND, "no such endpoint")
}

async fn overloaded(err: tower::BoxError) -> ApiError {
    if err.is::<tower::timeout::error::Elapsed>() {
        ApiError::status(StatusCode::SERVICE_UNAVAILABLE, "request timed out")
    } else if err.is::<tower::load_shed::error::Overloaded>() {
        ApiError::status(StatusCode::SERVICE_UNAVAILABLE, "service is overloaded")
    } else {
        tracing::error!(error = %err, "An API request failed inside the service stack.");
        ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, "internal error")
    }
}

/// The HTTP app.
pub fn router(state: ApiState) -> axum::Router {
    let limits = state.limits;
    axum::Router::new()
        .route("/v1/score", post(score_handler))
        .route("/v1/pd/schedule", post(pd_handler))
        .route("/v1/pods", get(pods_handler))
        .route("/v1/routed", post(routed_handler))
        .route("/v1/feedback", post(feedback_handler))
        .fallback(not_found)
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token))
        .layer(DefaultBodyLimit::max(limits.max_body_bytes))
        .layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::new(overloaded))
                .load_shed()
                .concurrency_limit(limits.concurrency.max(1))
                .timeout(limits.timeout),
        )
        // Outermost, so shed (503), oversized (413) and refused (401) answers are counted.
        .layer(middleware::from_fn(track))
        .with_state(state)
}

/// Serves `router` on `listener` until `shutdown` resolves, then drains open requests.
/// Connections are not bounded here; the daemon serves through [`super::serve_limited`].
///
/// # Errors
/// When accepting connections fails.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}

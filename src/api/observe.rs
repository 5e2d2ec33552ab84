//! Request metrics: every answer counted by route and status, its latency per route, so a
//! dashboard sees the API as the routers do (401s, 413s and 503s included).

use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;

/// The route label: the fixed paths of the API, `other` for anything else (so a scanner
/// cannot grow the label set).
fn route_label(path: Option<&str>) -> &'static str {
    match path {
        Some("/v1/score") => "/v1/score",
        Some("/v1/pd/schedule") => "/v1/pd/schedule",
        Some("/v1/pods") => "/v1/pods",
        Some("/v1/routed") => "/v1/routed",
        Some("/v1/feedback") => "/v1/feedback",
        _ => "other",
    }
}

/// Times the request and records it under its route and status.
pub(super) async fn track(request: Request, next: Next) -> Response {
    let route = route_label(
        request
            .extensions()
            .get::<MatchedPath>()
            .map(MatchedPath::as_str),
    );
    let started = Instant::now();
    let response = next.run(request).await;
    crate::metrics::api_request(
        route,
        response.status().as_u16(),
        started.elapsed().as_secs_f64(),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::route_label;

    #[test]
    fn unknown_paths_share_one_label() {
        assert_eq!(route_label(Some("/v1/score")), "/v1/score");
        assert_eq!(route_label(Some("/etc/passwd")), "other");
        assert_eq!(route_label(None), "other");
    }
}

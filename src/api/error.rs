//! [`ApiError`]: every refusal as a JSON body `{"error": message, "field": name|null}`.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

/// An error answered to the client as `{"error": message, "field": name|null}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    status: StatusCode,
    field: Option<String>,
    message: String,
}

impl ApiError {
    /// A 400 naming the bad field.
    pub fn bad_field(field: impl Into<String>, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            field: Some(field.into()),
            message: message.into(),
        }
    }

    /// A 422: the request is well-formed but names nothing that can be served.
    pub(super) fn unprocessable(field: impl Into<String>, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            field: Some(field.into()),
            message: message.into(),
        }
    }

    /// A 503: the scoring backend (Redis) failed. The cause is logged, never shown: it may
    /// name internal hosts.
    pub(super) fn backend(err: crate::score::RedisLookupError) -> ApiError {
        tracing::warn!(error = %err, "The Redis scoring backend failed; answering 503.");
        ApiError::status(
            StatusCode::SERVICE_UNAVAILABLE,
            "the scoring backend (Redis) is unavailable",
        )
    }

    /// An error of the request as a whole (no field), with its status.
    pub(super) fn status(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            field: None,
            message: message.into(),
        }
    }
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
    field: Option<&'a str>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Json(ErrorBody {
            error: &self.message,
            field: self.field.as_deref(),
        });
        let mut response = (self.status, body).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
        }
        response
    }
}

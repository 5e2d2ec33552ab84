//! HTTP query service (axum): `POST /v1/score`, `POST /v1/pd/schedule`, `GET /v1/pods`.
//!
//! | file | job |
//! | --- | --- |
//! | `router.rs` | [`router()`]: the app with its protective layers; [`serve`] with graceful shutdown |
//! | `state.rs` | [`ApiState`] (what handlers share) and [`ApiLimits`] |
//! | `error.rs` | [`ApiError`]: JSON error bodies `{"error", "field"}`; internals never shown |
//! | `body.rs` | body parsing and the checks both scoring routes share |
//! | `tokens.rs` | the fast path for a body's `tokens` array |
//! | `score.rs` | `POST /v1/score`: request, validation, [`ScoreBody`] |
//! | `pd.rs` | `POST /v1/pd/schedule`: request, validation, pairing |
//! | `pods.rs` | `GET /v1/pods`: [`PodsBody`], the targets from [`crate::ingest::PodsView`] |
//! | `auth.rs` | the bearer-token middleware |
//! | `conn.rs` | [`serve_limited`]: bounded connections, header-read and idle timeout |
//! | `observe.rs` | request metrics: count by route and status, latency histogram per route |
//!
//! Request bodies are parsed by hand from bytes (not axum's `Json` extractor) so that every
//! refusal is a JSON body naming the bad field, including size-limit refusals. Each request
//! type validates itself into a checked form, so handlers only call the scorer.

mod auth;
mod body;
mod conn;
mod error;
mod observe;
mod pd;
mod pods;
mod routed;
mod router;
mod score;
mod state;
mod tokens;

pub use conn::{serve_limited, ConnLimits};
pub use error::ApiError;
pub use pods::{PodsBody, WriterStatus};
pub use router::{router, serve};
pub use score::ScoreBody;
pub use state::{ApiLimits, ApiState, PromptLimits, DEFAULT_PREFIX_MAX_BLOCKS};

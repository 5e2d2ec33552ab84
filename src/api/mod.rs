//! HTTP query service (axum): `POST /v1/score`, `POST /v1/pd/schedule`, `GET /v1/pods`.
//!
//! | item | job |
//! | --- | --- |
//! | [`router`] | the app, built from [`ApiState`] (tested with `oneshot`) |
//! | [`serve`] | runs a router on a listener until a shutdown future resolves |
//! | [`ApiError`] | JSON error bodies `{"error", "field"}`; internals are never shown |
//!
//! Request bodies are parsed by hand from bytes (not axum's `Json` extractor) so that every
//! refusal is a JSON body naming the bad field, including size-limit refusals.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::error_handling::HandleErrorLayer;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Json;
use serde::{Deserialize, Serialize};
use tower::ServiceBuilder;

use crate::hash::StdHash;
use crate::index::Index;
use crate::medium::TierWeights;
use crate::score::{
    schedule, score_index, DecodeCandidate, KvScorer, PdError, PrefixScores, PromptSettings,
    DEFAULT_TOP_N,
};

/// One target pod's state, as `GET /v1/pods` reports it.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct PodStatus {
    /// Pod identifier `{pod}.{namespace}`.
    pub pod: String,
    /// Served model.
    pub model: String,
    /// Engine family (`vllm`, `sglang`, `trtllm`).
    pub engine: String,
    /// ZMQ endpoint of DP rank 0.
    pub endpoint: String,
    /// DP ranks subscribed.
    pub dp_ranks: u32,
    /// Where the target came from: `static` (config file) or `kubernetes` (discovery).
    pub source: String,
    /// `connected`, `connecting`, `disconnected` or `stopped`.
    pub state: String,
    /// Seconds since the last message from any rank (`None` before the first).
    pub last_message_age_seconds: Option<f64>,
    /// Resident (block, pod) entries per medium spelling.
    pub resident_blocks: BTreeMap<String, u64>,
}

/// Where `GET /v1/pods` gets the targets from (the daemon's supervisor implements it).
pub trait PodsView: Send + Sync + 'static {
    /// The current targets.
    fn pods(&self) -> Vec<PodStatus>;
}

/// Protective limits of the service (axum's key-value-store example: shed, limit, time out).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiLimits {
    /// Largest request body accepted, in bytes (413 beyond).
    pub max_body_bytes: usize,
    /// Requests served at once; more are shed with 503.
    pub concurrency: usize,
    /// Deadline of one request (503 past it).
    pub timeout: Duration,
    /// Candidate pods accepted in one request.
    pub max_pods: usize,
}

impl Default for ApiLimits {
    fn default() -> Self {
        ApiLimits {
            max_body_bytes: 1 << 20,
            concurrency: 512,
            timeout: Duration::from_secs(5),
            max_pods: 4096,
        }
    }
}

/// Everything the handlers need.
#[derive(Clone)]
pub struct ApiState {
    index: Index,
    weights: TierWeights,
    token: Option<Arc<str>>,
    pods: Arc<dyn PodsView>,
    limits: ApiLimits,
    prompt: PromptSettings,
}

impl ApiState {
    /// State over the in-memory index; `token` enables bearer auth.
    pub fn new(
        index: Index,
        weights: TierWeights,
        token: Option<String>,
        pods: Arc<dyn PodsView>,
    ) -> ApiState {
        ApiState {
            index,
            weights,
            token: token.filter(|t| !t.is_empty()).map(Arc::from),
            pods,
            limits: ApiLimits::default(),
            prompt: PromptSettings::default(),
        }
    }

    /// Replaces the protective limits.
    pub fn with_limits(mut self, limits: ApiLimits) -> ApiState {
        self.limits = limits;
        self
    }

    /// Replaces how prompts are cut into blocks (block size, max blocks).
    pub fn with_prompt(mut self, prompt: PromptSettings) -> ApiState {
        self.prompt = prompt;
        self
    }
}

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

    fn status(status: StatusCode, message: impl Into<String>) -> ApiError {
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

/// Parses a JSON body, naming the field serde stopped at.
fn parse_body<T: serde::de::DeserializeOwned>(
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    let body = body.map_err(|rejection| {
        let status = rejection.status();
        let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "request body is too large".to_owned()
        } else {
            "request body could not be read".to_owned()
        };
        ApiError::status(status, message)
    })?;
    if let Some(ct) = headers.get(header::CONTENT_TYPE) {
        let ct = ct.to_str().unwrap_or("");
        let json = ct
            .split(';')
            .next()
            .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"));
        if !json {
            return Err(ApiError::status(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "content type must be application/json",
            ));
        }
    }
    let de = &mut serde_json::Deserializer::from_slice(&body);
    serde_path_to_error::deserialize(de).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        let message = inner.to_string();
        let field = missing_field(&message)
            .map(|name| {
                if path == "." {
                    name.to_owned()
                } else {
                    format!("{path}.{name}")
                }
            })
            .unwrap_or_else(|| if path == "." { "body".to_owned() } else { path });
        ApiError::bad_field(field, message)
    })
}

fn missing_field(message: &str) -> Option<&str> {
    let rest = message.strip_prefix("missing field `")?;
    rest.split('`').next()
}

/// A block hash given as a JSON number or a decimal string (JSON numbers lose bits past 2^53
/// in most clients).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
enum HashArg {
    Num(u64),
    Str(#[serde(deserialize_with = "de_decimal")] u64),
}

fn de_decimal<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let s = String::deserialize(d)?;
    s.trim().parse().map_err(serde::de::Error::custom)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScoreRequest {
    model: String,
    #[serde(default)]
    tokens: Option<Vec<u32>>,
    #[serde(default)]
    block_hashes: Option<Vec<HashArg>>,
    pods: Vec<String>,
    #[serde(default)]
    weights: Option<BTreeMap<String, f64>>,
}

#[derive(Debug, Serialize)]
struct ScoreEntry<'a> {
    pod: &'a str,
    score: u32,
    matched_blocks: u32,
}

/// The body of `POST /v1/score` (also what `kvindex score --json` prints).
#[derive(Debug, Serialize)]
pub struct ScoreBody<'a> {
    total_blocks: usize,
    scores: Vec<ScoreEntry<'a>>,
}

impl<'a> ScoreBody<'a> {
    /// The response body for `scores`.
    pub fn new(scores: &'a PrefixScores) -> ScoreBody<'a> {
        ScoreBody {
            total_blocks: scores.total_blocks,
            scores: scores
                .scores
                .iter()
                .map(|s| ScoreEntry {
                    pod: &s.pod,
                    score: s.score,
                    matched_blocks: s.matched_blocks,
                })
                .collect(),
        }
    }
}

fn check_model(model: &str) -> Result<(), ApiError> {
    if model.trim().is_empty() {
        return Err(ApiError::bad_field("model", "model must not be empty"));
    }
    Ok(())
}

fn check_pods(field: &str, pods: &[String], limits: &ApiLimits) -> Result<(), ApiError> {
    if pods.len() > limits.max_pods {
        return Err(ApiError::bad_field(
            field,
            format!("at most {} pods per request", limits.max_pods),
        ));
    }
    if let Some(i) = pods.iter().position(|p| p.trim().is_empty()) {
        return Err(ApiError::bad_field(
            format!("{field}[{i}]"),
            "pod identifier must not be empty",
        ));
    }
    Ok(())
}

fn request_weights(
    base: &TierWeights,
    overrides: Option<&BTreeMap<String, f64>>,
) -> Result<TierWeights, ApiError> {
    let Some(overrides) = overrides else {
        return Ok(base.clone());
    };
    let entries = base
        .entries()
        .chain(overrides.iter().map(|(k, v)| (k.as_str(), *v)));
    TierWeights::new(entries, base.unknown_medium_weight()).map_err(|errors| {
        let bad = overrides
            .iter()
            .find(|(k, v)| k.trim().is_empty() || !(0.0..=1.0).contains(*v))
            .map_or_else(|| "weights".to_owned(), |(k, _)| format!("weights.{k}"));
        let message = errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ");
        ApiError::bad_field(bad, message)
    })
}

fn prompt_blocks(
    prompt: &PromptSettings,
    tokens: Option<&[u32]>,
    hashes: Option<&[HashArg]>,
) -> Result<Vec<StdHash>, ApiError> {
    match (tokens, hashes) {
        (Some(_), Some(_)) => Err(ApiError::bad_field(
            "block_hashes",
            "give either tokens or block_hashes, not both",
        )),
        (None, None) => Err(ApiError::bad_field(
            "tokens",
            "missing field `tokens` (or `block_hashes`)",
        )),
        (Some(tokens), None) => Ok(prompt.hash(tokens)),
        (None, Some(hashes)) => {
            let mut out = Vec::with_capacity(hashes.len().min(prompt.max_blocks()));
            for (i, h) in hashes.iter().take(prompt.max_blocks()).enumerate() {
                let (HashArg::Num(v) | HashArg::Str(v)) = *h;
                if v > i64::MAX as u64 {
                    return Err(ApiError::bad_field(
                        format!("block_hashes[{i}]"),
                        "a standardized block hash is below 2^63",
                    ));
                }
                out.push(v);
            }
            Ok(out)
        }
    }
}

async fn score_handler(
    State(state): State<ApiState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: ScoreRequest = parse_body(&headers, body)?;
    check_model(&req.model)?;
    check_pods("pods", &req.pods, &state.limits)?;
    let weights = request_weights(&state.weights, req.weights.as_ref())?;
    let blocks = prompt_blocks(
        &state.prompt,
        req.tokens.as_deref(),
        req.block_hashes.as_deref(),
    )?;
    let scores = score_index(&state.index, &req.model, &blocks, &req.pods, &weights, &[]);
    Ok(Json(ScoreBody::new(&scores)).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DecodeArg {
    pod: String,
    group: String,
    #[serde(default)]
    score: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PdRequest {
    model: String,
    #[serde(default)]
    tokens: Option<Vec<u32>>,
    #[serde(default)]
    block_hashes: Option<Vec<HashArg>>,
    decode: Vec<DecodeArg>,
    prefill: BTreeMap<String, Vec<String>>,
    #[serde(default)]
    top_n: Option<usize>,
    #[serde(default)]
    weights: Option<BTreeMap<String, f64>>,
}

#[derive(Debug, Serialize)]
struct PairEntry<'a> {
    decode: &'a str,
    prefill: &'a str,
    prefill_score: f64,
}

#[derive(Debug, Serialize)]
struct PdBody<'a> {
    pairs: Vec<PairEntry<'a>>,
}

async fn pd_handler(
    State(state): State<ApiState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: PdRequest = parse_body(&headers, body)?;
    check_model(&req.model)?;
    if req.decode.is_empty() {
        return Err(ApiError::bad_field(
            "decode",
            "at least one decode candidate",
        ));
    }
    let total_pods = req.decode.len() + req.prefill.values().map(Vec::len).sum::<usize>();
    if total_pods > state.limits.max_pods {
        return Err(ApiError::bad_field(
            "decode",
            format!("at most {} pods per request", state.limits.max_pods),
        ));
    }
    for (i, d) in req.decode.iter().enumerate() {
        if d.pod.trim().is_empty() {
            return Err(ApiError::bad_field(
                format!("decode[{i}].pod"),
                "pod identifier must not be empty",
            ));
        }
        if d.score.is_some_and(|s| !s.is_finite()) {
            return Err(ApiError::bad_field(
                format!("decode[{i}].score"),
                "score must be a finite number",
            ));
        }
    }
    for (group, pods) in &req.prefill {
        check_pods(&format!("prefill.{group}"), pods, &state.limits)?;
    }
    let top_n = req.top_n.unwrap_or(DEFAULT_TOP_N);
    if top_n == 0 {
        return Err(ApiError::bad_field("top_n", "top_n must be at least 1"));
    }
    let weights = request_weights(&state.weights, req.weights.as_ref())?;
    let blocks = prompt_blocks(
        &state.prompt,
        req.tokens.as_deref(),
        req.block_hashes.as_deref(),
    )?;
    let decodes: Vec<DecodeCandidate<'_>> = req
        .decode
        .iter()
        .map(|d| DecodeCandidate {
            pod: &d.pod,
            group: &d.group,
            score: d.score,
        })
        .collect();
    let groups: BTreeMap<&str, Vec<&str>> = req
        .prefill
        .iter()
        .map(|(g, pods)| (g.as_str(), pods.iter().map(String::as_str).collect()))
        .collect();
    // Hashed once and looked up once for every pod the call may ask about.
    let mut all: Vec<&str> = decodes.iter().map(|d| d.pod).collect();
    all.extend(groups.values().flatten().copied());
    let mut scorer = KvScorer::from_index(&state.index, &req.model, &blocks, &all, &weights);
    let pairs = schedule(&decodes, &groups, top_n, &mut scorer).map_err(|err| match err {
        PdError::NoDecode => ApiError::bad_field("decode", err.to_string()),
        PdError::NoPair { .. } => ApiError {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            field: Some("prefill".to_owned()),
            message: err.to_string(),
        },
    })?;
    let body = PdBody {
        pairs: pairs
            .iter()
            .map(|p| PairEntry {
                decode: p.decode,
                prefill: p.prefill,
                prefill_score: p.prefill_score,
            })
            .collect(),
    };
    Ok(Json(body).into_response())
}

#[derive(Serialize)]
struct PodsBody {
    pods: Vec<PodStatus>,
}

async fn pods_handler(State(state): State<ApiState>) -> Json<PodsBody> {
    Json(PodsBody {
        pods: state.pods.pods(),
    })
}

async fn not_found() -> ApiError {
    ApiError::status(StatusCode::NOT_FOUND, "no such endpoint")
}

async fn require_token(State(state): State<ApiState>, request: Request, next: Next) -> Response {
    if let Some(token) = &state.token {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        if !given.is_some_and(|g| constant_time_eq(g.as_bytes(), token.as_bytes())) {
            return ApiError::status(StatusCode::UNAUTHORIZED, "a valid bearer token is required")
                .into_response();
        }
    }
    next.run(request).await
}

/// Compares without an early exit, so response times do not leak the token's prefix.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
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
        .with_state(state)
}

/// Serves `router` on `listener` until `shutdown` resolves, then drains open requests.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_field_names_are_extracted() {
        assert_eq!(
            missing_field("missing field `model` at line 1 column 2"),
            Some("model")
        );
        assert_eq!(missing_field("invalid type"), None);
    }

    #[test]
    fn token_comparison_needs_equal_bytes() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}

//! `POST /v1/routed` and `POST /v1/feedback`: a router reports where it placed a request, and
//! later what the engine reused.
//!
//! A placement makes the prompt's chain blocks speculative residents of the chosen pod
//! ([`crate::index::Speculative`]) until the engine's own events confirm them or the TTL
//! passes; with a `request_id`, the index's confirmed match on that pod is kept as the
//! prediction the engine's reported reuse is judged against
//! ([`crate::score::Predictions`]).
//!
//! Only a prompt's whole blocks are placed: engines never store a partial last block, so
//! its placement could never be confirmed.

use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::body::{
    check_model, parse_body, parse_plain_body, prompt_blocks, HashArg, PromptArgs, TokensField,
};
use super::error::ApiError;
use super::state::ApiState;
use crate::index::Index;
use crate::score::{confirmed_match, MatchMode, Prediction};

/// Longest request id kept (a router's id is a UUID or alike).
const MAX_REQUEST_ID_BYTES: usize = 256;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RoutedRequest {
    model: String,
    #[serde(default)]
    tokens: Option<Vec<u32>>,
    #[serde(default)]
    block_hashes: Option<Vec<HashArg>>,
    pod: String,
    #[serde(default)]
    cache_salt: Option<String>,
    #[serde(default)]
    request_id: Option<String>,
    #[serde(default)]
    max_blocks: Option<usize>,
}

impl TokensField for RoutedRequest {
    fn tokens_mut(&mut self) -> &mut Option<Vec<u32>> {
        &mut self.tokens
    }
}

impl RoutedRequest {
    fn prompt(&self) -> PromptArgs<'_> {
        PromptArgs {
            model: &self.model,
            tokens: self.tokens.as_deref(),
            hashes: self.block_hashes.as_deref(),
            mode: None,
            max_blocks: self.max_blocks,
            salt: self.cache_salt.as_deref(),
        }
    }

    fn check(&self) -> Result<(), ApiError> {
        check_model(&self.model)?;
        if self.pod.trim().is_empty() {
            return Err(ApiError::bad_field(
                "pod",
                "pod identifier must not be empty",
            ));
        }
        self.request_id.as_deref().map_or(Ok(()), check_request_id)
    }
}

/// A request id of 1 to [`MAX_REQUEST_ID_BYTES`] bytes.
fn check_request_id(id: &str) -> Result<(), ApiError> {
    if id.is_empty() || id.len() > MAX_REQUEST_ID_BYTES {
        return Err(ApiError::bad_field(
            "request_id",
            format!("a request id has 1 to {MAX_REQUEST_ID_BYTES} bytes"),
        ));
    }
    Ok(())
}

/// The in-memory index placements go to, or the answer for a replica that scores from Redis.
fn placement_index(state: &ApiState) -> Result<&Index, ApiError> {
    state.backend.index().ok_or_else(|| {
        ApiError::unprocessable(
            "pod",
            "placements need the in-memory index: this replica scores from Redis (sharded)",
        )
    })
}

/// Places chain `blocks` of `model` on `pod` as speculative residents, after the prefix the
/// pod already holds (the engine will not store those again, so a placement of them could
/// only expire); `false` when the index does not know the pod.
pub(super) fn place(
    state: &ApiState,
    model: &str,
    pod: &str,
    blocks: &[u64],
) -> Result<bool, ApiError> {
    let index = placement_index(state)?;
    let Some(id) = index.pod_id(pod) else {
        return Ok(false);
    };
    let held = confirmed_match(index, model, blocks, pod, MatchMode::Prefix) as usize;
    let new = blocks.get(held..).unwrap_or_default();
    index.speculative().place(id.0, new, Instant::now());
    Ok(true)
}

pub(super) async fn routed_handler(
    State(state): State<ApiState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: RoutedRequest = parse_body(&headers, body)?;
    req.check()?;
    let index = placement_index(&state)?;
    if index.pod_id(&req.pod).is_none() {
        return Err(ApiError::unprocessable(
            "pod",
            format!("pod `{}` is not a target of this kvindex", req.pod),
        ));
    }
    let (blocks, mode) = prompt_blocks(&state.prompt, &state.backend, &req.prompt())?;
    if let Some(request_id) = &req.request_id {
        let matched = confirmed_match(index, &req.model, &blocks, &req.pod, mode);
        let prompt_tokens = req.tokens.as_ref().map(Vec::len);
        let prediction = Prediction::new(matched, prompt_tokens, block_size(&state, mode)?);
        state
            .predictions
            .record(request_id, prediction, Instant::now());
    }
    // Speculative entries are chain blocks: a prompt sent as kthena's std hashes only
    // records its prediction.
    if let Some(tokens) = req.tokens.as_deref().filter(|_| mode == MatchMode::Prefix) {
        place(
            &state,
            &req.model,
            &req.pod,
            whole_blocks(&blocks, tokens, block_size(&state, mode)?),
        )?;
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Tokens per block in `mode`.
fn block_size(state: &ApiState, mode: MatchMode) -> Result<usize, ApiError> {
    Ok(state.prompt.settings(mode, None)?.block_size())
}

/// The chain hashes of `blocks` that name whole blocks of `tokens`.
pub(super) fn whole_blocks<'b>(blocks: &'b [u64], tokens: &[u32], block_size: usize) -> &'b [u64] {
    &blocks[..blocks.len().min(tokens.len() / block_size.max(1))]
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FeedbackRequest {
    request_id: String,
    cached_tokens: u64,
}

pub(super) async fn feedback_handler(
    State(state): State<ApiState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: FeedbackRequest = parse_plain_body(&headers, body)?;
    check_request_id(&req.request_id)?;
    let Some(judged) = state
        .predictions
        .judge(&req.request_id, req.cached_tokens, Instant::now())
    else {
        crate::metrics::route_feedback_unknown();
        return Err(ApiError::status(
            StatusCode::NOT_FOUND,
            format!(
                "no prediction for request_id `{}` (never routed with it, already judged, or expired)",
                req.request_id
            ),
        ));
    };
    crate::metrics::route_prediction(judged.outcome.as_str(), judged.error_blocks());
    Ok(StatusCode::NO_CONTENT.into_response())
}

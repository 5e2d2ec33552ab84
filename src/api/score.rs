//! `POST /v1/score`: longest-prefix scores of candidate pods for one prompt.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::body::{
    check_model, check_pods, parse_body, prompt_blocks, request_weights, HashArg, PromptArgs,
    TokensField,
};
use super::error::ApiError;
use super::state::ApiState;
use crate::medium::TierWeights;
use crate::score::{MatchMode, PrefixScores};

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
    /// `prefix` (default with tokens) or `kthena` (the only mode for block_hashes).
    #[serde(default, rename = "match")]
    match_mode: Option<MatchMode>,
    /// At most this many blocks (up to the server's cap for the mode).
    #[serde(default)]
    max_blocks: Option<usize>,
    /// The tenant salt the prompt is sent under (`prefix` mode matches only blocks stored
    /// under it).
    #[serde(default)]
    cache_salt: Option<String>,
}

/// A score request that passed every check: what the scorer is called with.
struct ValidScore {
    blocks: Vec<u64>,
    mode: MatchMode,
    weights: Arc<TierWeights>,
}

impl TokensField for ScoreRequest {
    fn tokens_mut(&mut self) -> &mut Option<Vec<u32>> {
        &mut self.tokens
    }
}

impl ScoreRequest {
    fn prompt(&self) -> PromptArgs<'_> {
        PromptArgs {
            model: &self.model,
            tokens: self.tokens.as_deref(),
            hashes: self.block_hashes.as_deref(),
            mode: self.match_mode,
            max_blocks: self.max_blocks,
            salt: self.cache_salt.as_deref(),
        }
    }

    /// Checks the request against the server's limits, in the order fields are reported.
    fn validate(&self, state: &ApiState) -> Result<ValidScore, ApiError> {
        check_model(&self.model)?;
        check_pods("pods", &self.pods, &state.limits)?;
        let weights = request_weights(&state.weights, self.weights.as_ref())?;
        let (blocks, mode) = prompt_blocks(&state.prompt, &state.backend, &self.prompt())?;
        Ok(ValidScore {
            blocks,
            mode,
            weights,
        })
    }
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

pub(super) async fn score_handler(
    State(state): State<ApiState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: ScoreRequest = parse_body(&headers, body)?;
    let valid = req.validate(&state)?;
    let scores = state
        .backend
        .prefix_scores(
            &req.model,
            &valid.blocks,
            &req.pods,
            &valid.weights,
            valid.mode,
        )
        .await
        .map_err(ApiError::backend)?;
    Ok(Json(ScoreBody::new(&scores)).into_response())
}

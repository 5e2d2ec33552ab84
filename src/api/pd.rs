//! `POST /v1/pd/schedule`: decode pods paired with the best prefill pod of their PD group.

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
use super::routed::{place, whole_blocks};
use super::state::{ApiLimits, ApiState};
use crate::medium::TierWeights;
use crate::score::{schedule, DecodeCandidate, KvScorer, MatchMode, Pair, PdError, DEFAULT_TOP_N};

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
    /// `prefix` (default with tokens) or `kthena` (the only mode for block_hashes).
    #[serde(default, rename = "match")]
    match_mode: Option<MatchMode>,
    #[serde(default)]
    max_blocks: Option<usize>,
    #[serde(default)]
    cache_salt: Option<String>,
    /// Record the first pair's prefill pod as holding the prompt ([`super::routed`]).
    #[serde(default)]
    speculate: bool,
}

/// A PD request that passed every check, borrowing its pods from the request.
struct ValidPd<'a> {
    blocks: Vec<u64>,
    mode: MatchMode,
    weights: Arc<TierWeights>,
    top_n: usize,
    decodes: Vec<DecodeCandidate<'a>>,
    groups: BTreeMap<&'a str, Vec<&'a str>>,
}

impl TokensField for PdRequest {
    fn tokens_mut(&mut self) -> &mut Option<Vec<u32>> {
        &mut self.tokens
    }
}

impl PdRequest {
    /// Checks the request against the server's limits, in the order fields are reported.
    fn validate(&self, state: &ApiState) -> Result<ValidPd<'_>, ApiError> {
        check_model(&self.model)?;
        self.check_decodes(&state.limits)?;
        for (group, pods) in &self.prefill {
            check_pods(&format!("prefill.{group}"), pods, &state.limits)?;
        }
        let top_n = self.top_n.unwrap_or(DEFAULT_TOP_N);
        if top_n == 0 {
            return Err(ApiError::bad_field("top_n", "top_n must be at least 1"));
        }
        let weights = request_weights(&state.weights, self.weights.as_ref())?;
        let prompt = PromptArgs {
            model: &self.model,
            tokens: self.tokens.as_deref(),
            hashes: self.block_hashes.as_deref(),
            mode: self.match_mode,
            max_blocks: self.max_blocks,
            salt: self.cache_salt.as_deref(),
        };
        let (blocks, mode) = prompt_blocks(&state.prompt, &state.backend, &prompt)?;
        if self.speculate && mode != MatchMode::Prefix {
            return Err(ApiError::bad_field(
                "speculate",
                "speculative entries are chain blocks: they need `tokens` in prefix mode",
            ));
        }
        Ok(ValidPd {
            blocks,
            mode,
            weights,
            top_n,
            decodes: self.decode.iter().map(DecodeArg::candidate).collect(),
            groups: self
                .prefill
                .iter()
                .map(|(g, pods)| (g.as_str(), pods.iter().map(String::as_str).collect()))
                .collect(),
        })
    }

    /// At least one decode, the pod limit over decodes and prefills, each decode well-formed.
    fn check_decodes(&self, limits: &ApiLimits) -> Result<(), ApiError> {
        if self.decode.is_empty() {
            return Err(ApiError::bad_field(
                "decode",
                "at least one decode candidate",
            ));
        }
        let total_pods = self.decode.len() + self.prefill.values().map(Vec::len).sum::<usize>();
        if total_pods > limits.max_pods {
            return Err(ApiError::bad_field(
                "decode",
                format!("at most {} pods per request", limits.max_pods),
            ));
        }
        for (i, d) in self.decode.iter().enumerate() {
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
        Ok(())
    }
}

impl DecodeArg {
    fn candidate(&self) -> DecodeCandidate<'_> {
        DecodeCandidate {
            pod: &self.pod,
            group: &self.group,
            score: self.score,
        }
    }
}

impl ValidPd<'_> {
    /// Every pod the call may ask about, so the prompt is looked up once for all of them.
    fn all_pods(&self) -> Vec<&str> {
        let mut all: Vec<&str> = self.decodes.iter().map(|d| d.pod).collect();
        all.extend(self.groups.values().flatten().copied());
        all
    }
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

impl<'a> PdBody<'a> {
    fn new(pairs: &[Pair<'a>]) -> PdBody<'a> {
        PdBody {
            pairs: pairs
                .iter()
                .map(|p| PairEntry {
                    decode: p.decode,
                    prefill: p.prefill,
                    prefill_score: p.prefill_score,
                })
                .collect(),
        }
    }
}

fn pd_error(err: PdError) -> ApiError {
    match err {
        PdError::NoDecode => ApiError::bad_field("decode", err.to_string()),
        PdError::NoPair { .. } => ApiError::unprocessable("prefill", err.to_string()),
    }
}

pub(super) async fn pd_handler(
    State(state): State<ApiState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: PdRequest = parse_body(&headers, body)?;
    let pd = req.validate(&state)?;
    // The prompt is looked up once, for every pod the call may ask about.
    let scores = state
        .backend
        .prefix_scores(&req.model, &pd.blocks, &pd.all_pods(), &pd.weights, pd.mode)
        .await
        .map_err(ApiError::backend)?;
    let mut scorer = KvScorer::from_scores(&scores);
    let pairs = schedule(&pd.decodes, &pd.groups, pd.top_n, &mut scorer).map_err(pd_error)?;
    if let Some(first) = pairs.first().filter(|_| req.speculate) {
        let tokens = req.tokens.as_deref().unwrap_or_default();
        let whole = whole_blocks(&pd.blocks, tokens, state.prompt.prefix.block_size());
        place(&state, &req.model, first.prefill, whole)?;
    }
    Ok(Json(PdBody::new(&pairs)).into_response())
}

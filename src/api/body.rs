//! Request bodies: JSON parsing that names the bad field, and the checks both scoring routes
//! share (model, pods, weight overrides, prompt blocks).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::{header, HeaderMap, StatusCode};
use serde::Deserialize;

use super::error::ApiError;
use super::state::{ApiLimits, PromptLimits};
use super::tokens::split_tokens;
use crate::medium::TierWeights;
use crate::score::{MatchMode, ScoreBackend};

/// A request type with a top-level `tokens` field, which [`parse_body`] reads by the fast
/// path ([`split_tokens`]).
pub(super) trait TokensField {
    /// The request's `tokens`.
    fn tokens_mut(&mut self) -> &mut Option<Vec<u32>>;
}

/// Parses a JSON request body, naming the field serde stopped at. A top-level `tokens`
/// array of integers is read by [`split_tokens`] and the rest by serde; whatever the fast
/// path does not take whole is parsed as it always was, so values and errors are serde's.
pub(super) fn parse_body<T: serde::de::DeserializeOwned + TokensField>(
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    let body = json_body(headers, body)?;
    if let Some(split) = split_tokens(&body) {
        if let Ok(mut parsed) = serde_json::from_slice::<T>(&split.rest) {
            // The rest has `null` there (a second `tokens` key is serde's duplicate error).
            *parsed.tokens_mut() = Some(split.tokens);
            return Ok(parsed);
        }
    }
    parse_json(&body)
}

/// Parses a JSON request body without a `tokens` array.
pub(super) fn parse_plain_body<T: serde::de::DeserializeOwned>(
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    parse_json(&json_body(headers, body)?)
}

/// The body of a request that may be read as JSON: refused when it could not be read, is
/// over the size limit or declares another content type.
fn json_body(headers: &HeaderMap, body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
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
    Ok(body)
}

/// Parses JSON `body` with serde, naming the field it stopped at.
fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    // The happy path parses without path tracking, which costs a wrapper per value (most of
    // a 2,048-token body's parse); only a refused body is parsed again to name the field.
    if let Ok(parsed) = serde_json::from_slice(body) {
        return Ok(parsed);
    }
    let de = &mut serde_json::Deserializer::from_slice(body);
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
pub(super) enum HashArg {
    Num(u64),
    Str(#[serde(deserialize_with = "de_decimal")] u64),
}

fn de_decimal<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let s = String::deserialize(d)?;
    s.trim().parse().map_err(serde::de::Error::custom)
}

pub(super) fn check_model(model: &str) -> Result<(), ApiError> {
    if model.trim().is_empty() {
        return Err(ApiError::bad_field("model", "model must not be empty"));
    }
    Ok(())
}

pub(super) fn check_pods(field: &str, pods: &[String], limits: &ApiLimits) -> Result<(), ApiError> {
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

/// The server's weights with the request's overrides applied, validated like the config's.
pub(super) fn request_weights(
    base: &Arc<TierWeights>,
    overrides: Option<&BTreeMap<String, f64>>,
) -> Result<Arc<TierWeights>, ApiError> {
    let Some(overrides) = overrides else {
        return Ok(Arc::clone(base));
    };
    let entries = base
        .entries()
        .chain(overrides.iter().map(|(k, v)| (k.as_str(), *v)));
    let weights = TierWeights::new(entries, base.unknown_medium_weight()).map_err(|errors| {
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
    })?;
    Ok(Arc::new(weights))
}

/// What a request says of its prompt: the fields every prompt-taking endpoint shares.
pub(super) struct PromptArgs<'a> {
    pub model: &'a str,
    pub tokens: Option<&'a [u32]>,
    pub hashes: Option<&'a [HashArg]>,
    pub mode: Option<MatchMode>,
    pub max_blocks: Option<usize>,
    pub salt: Option<&'a str>,
}

/// The prompt's blocks and the match mode they are for, cut at the request's `max_blocks`
/// or the server's cap for that mode. `tokens` are matched in the mode asked for, or the
/// backend's default (`prefix` over the in-memory index, `kthena` over Redis);
/// `block_hashes` are kthena's std hashes, so they are matched in `kthena` mode. Asking for
/// `prefix` with block hashes (a chain hash needs the tokens) or from a backend that holds
/// only kthena's keys is refused.
pub(super) fn prompt_blocks(
    prompts: &PromptLimits,
    backend: &ScoreBackend,
    args: &PromptArgs<'_>,
) -> Result<(Vec<u64>, MatchMode), ApiError> {
    let mode = args.mode;
    if mode == Some(MatchMode::Prefix) && !backend.matches_prefix() {
        return Err(ApiError::bad_field(
            "match",
            "prefix matching needs the in-memory index: this replica scores from Redis, which holds kthena's keys",
        ));
    }
    let kthena =
        mode == Some(MatchMode::Kthena) || (args.tokens.is_none() && args.hashes.is_some());
    if kthena && !backend.matches_kthena() {
        return Err(ApiError::bad_field(
            if mode.is_some() { "match" } else { "block_hashes" },
            "kthena matching needs kthena's std hashes: this index is prefix-only (ingest.std_hashes: false); send `tokens` with `\"match\": \"prefix\"`",
        ));
    }
    match (args.tokens, args.hashes) {
        (Some(_), Some(_)) => Err(ApiError::bad_field(
            "block_hashes",
            "give either tokens or block_hashes, not both",
        )),
        (None, None) => Err(ApiError::bad_field(
            "tokens",
            "missing field `tokens` (or `block_hashes`)",
        )),
        (Some(tokens), None) => {
            let mode = mode.unwrap_or(backend.default_mode());
            let prompt = prompts.settings(mode, args.max_blocks)?;
            let blocks = backend.prompt_blocks(&prompt, args.model, args.salt, tokens, mode);
            Ok((blocks, mode))
        }
        (None, Some(_)) if mode == Some(MatchMode::Prefix) => Err(ApiError::bad_field(
            "match",
            "prefix matching needs `tokens`: block_hashes are kthena std hashes",
        )),
        (None, Some(hashes)) => {
            let prompt = prompts.settings(MatchMode::Kthena, args.max_blocks)?;
            Ok((std_hashes(hashes, prompt.max_blocks())?, MatchMode::Kthena))
        }
    }
}

/// Caller-supplied std hashes, at most `max_blocks` of them.
fn std_hashes(hashes: &[HashArg], max_blocks: usize) -> Result<Vec<u64>, ApiError> {
    let mut out = Vec::with_capacity(hashes.len().min(max_blocks));
    for (i, h) in hashes.iter().take(max_blocks).enumerate() {
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
}

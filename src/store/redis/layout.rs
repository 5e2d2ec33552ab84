//! kthena's key and value spellings (DESIGN.md §6), byte for byte, and URL redaction.

use std::fmt::Write as _;

use super::ValueFormat;
use crate::index::FieldValue;
use crate::medium::TierWeights;
use crate::wire::{BlockHash, Engine};

/// Prefix of every block key.
pub const BLOCK_PREFIX: &str = "matrix:kv:block:";

/// Lifetime of a mapping key, refreshed on every store (kthena: 24 h).
pub const MAPPING_TTL_SECS: u64 = 86_400;

/// `matrix:kv:block:{model}@{std_hash}`.
pub fn block_key(model: &str, std_hash: u64) -> String {
    let mut key = String::with_capacity(BLOCK_PREFIX.len() + model.len() + 21);
    key.push_str(BLOCK_PREFIX);
    key.push_str(model);
    // Writing into a String cannot fail.
    let _ = write!(key, "@{std_hash}");
    key
}

/// `{vllm|sglang}:kv:block:{pod}@{engine_hash}` (engine hash in its text form).
pub fn mapping_key(engine: Engine, pod: &str, engine_hash: &BlockHash) -> String {
    let mut key = String::with_capacity(16 + pod.len() + 24);
    key.push_str(engine.mapping_prefix());
    key.push_str(":kv:block:");
    key.push_str(pod);
    let _ = write!(key, "@{engine_hash}");
    key
}

/// Prefix of the mapping keys of `engine`.
pub fn mapping_prefix(engine: Engine) -> String {
    format!("{}:kv:block:", engine.mapping_prefix())
}

/// The field value: `"{ts}"`, or `"{ts}|{MEDIUM}"` in the tiered format when a medium is known.
pub fn field_value(value: FieldValue, format: ValueFormat, weights: &TierWeights) -> String {
    let ts = value.stored_at.to_string();
    if format == ValueFormat::Timestamp {
        return ts;
    }
    match value.media.best(weights) {
        Some(medium) if !medium.is_none() => format!("{ts}|{}", medium.spelling()),
        _ => ts,
    }
}

/// The URL with its password replaced by `***`, for errors and logs.
pub fn redact_url(url: &str) -> String {
    let mut out = url.to_owned();
    if let Some(scheme_end) = url.find("://") {
        let start = scheme_end + 3;
        let rest = &url[start..];
        let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        if let Some(at) = rest[..authority_end].rfind('@') {
            if let Some(colon) = rest[..at].find(':') {
                out.replace_range(start + colon + 1..start + at, "***");
            }
        }
    }
    // Query-style passwords (`?pass=…`) are redacted too.
    if let Some(q) = out.find("pass=") {
        let end = out[q..].find('&').map_or(out.len(), |e| q + e);
        out.replace_range(q + 5..end, "***");
    }
    out
}

/// Escapes Redis glob characters so a name matches only itself in `SCAN MATCH`.
pub fn glob_escape(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

//! kthena's Redis layout (docs/architecture.md §6), both directions, byte for byte: the mirror in
//! [`crate::store`] writes it and the Redis scoring backend in [`crate::score`] reads it, so
//! a spelling can change in one place only. It also owns the one Redis URL redactor, since
//! every layer that reports a Redis error needs it.
//!
//! It sits above `index` (a field value is computed from [`FieldValue`]) and below `store`
//! and `score`, which are siblings and never import each other.
//!
//! | item | job |
//! | --- | --- |
//! | [`block_key`], [`push_block_key`], [`split_block_key`] | `matrix:kv:block:{model}@{std_hash}` |
//! | [`ValueFormat`], [`field_value`], [`push_field_value`], [`parse_field_value`] | a field's `"{ts}"` / `"{ts}\|{MEDIUM}"` value |
//! | [`mapping_key`], [`push_mapping_key`], [`mapping_prefix`], [`mapping_value`] | `{vllm\|sglang}:kv:block:{pod}@{engine_hash}` = std hash |
//! | [`block_key_pattern`], [`mapping_key_pattern`] | `SCAN MATCH` patterns for offline tools |
//! | [`redact_url`], [`scrub_secrets`] | passwords kept out of every error and log line |

use std::fmt::Write as _;
use std::ops::Range;

use crate::hash::StdHash;
use crate::index::FieldValue;
use crate::medium::TierWeights;
use crate::wire::{BlockHash, Engine};

/// Prefix of every block key.
pub const BLOCK_PREFIX: &str = "matrix:kv:block:";

/// Lifetime of a mapping key, refreshed on every store (kthena: 24 h).
pub const MAPPING_TTL_SECS: u64 = 86_400;

/// How field values are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ValueFormat {
    /// `"{ts}"` without a medium, `"{ts}|{MEDIUM}"` with one (default).
    #[default]
    Tiered,
    /// Always a bare `"{ts}"`, for kthena routers that predate tier support.
    Timestamp,
}

/// `matrix:kv:block:{model}@{std_hash}` (std hash in decimal).
pub fn block_key(model: &str, std_hash: StdHash) -> String {
    let mut key = String::with_capacity(BLOCK_PREFIX.len() + model.len() + 21);
    push_block_key(&mut key, model, std_hash);
    key
}

/// Writes the block key into `key` (cleared first), so a pipeline of lookups reuses one buffer.
pub fn push_block_key(key: &mut String, model: &str, std_hash: StdHash) {
    key.clear();
    key.push_str(BLOCK_PREFIX);
    key.push_str(model);
    // Writing into a String cannot fail.
    let _ = write!(key, "@{std_hash}");
}

/// A block key's model and std hash text, or `None` when `key` is not a block key. The model
/// may contain `@` itself, so the hash is what follows the last one.
pub fn split_block_key(key: &str) -> Option<(&str, &str)> {
    key.strip_prefix(BLOCK_PREFIX)?.rsplit_once('@')
}

/// The `SCAN MATCH` pattern of the block keys of `model`, or of every model.
pub fn block_key_pattern(model: Option<&str>) -> String {
    match model {
        Some(m) => format!("{BLOCK_PREFIX}{}@*", glob_escape(m)),
        None => format!("{BLOCK_PREFIX}*"),
    }
}

/// The field value: `"{ts}"`, or `"{ts}|{MEDIUM}"` in the tiered format when a medium is known.
pub fn field_value(value: FieldValue, format: ValueFormat, weights: &TierWeights) -> String {
    let mut out = String::with_capacity(16);
    push_field_value(&mut out, value, format, weights);
    out
}

/// Writes the field value into `out` (cleared first), so a mirror reuses one buffer.
pub fn push_field_value(
    out: &mut String,
    value: FieldValue,
    format: ValueFormat,
    weights: &TierWeights,
) {
    out.clear();
    // Writing into a String cannot fail.
    let _ = write!(out, "{}", value.stored_at);
    if format == ValueFormat::Timestamp {
        return;
    }
    if let Some(medium) = value.media.best(weights).filter(|m| !m.is_none()) {
        out.push('|');
        out.push_str(medium.spelling());
    }
}

/// A field value as read back: the write time and the medium spelling (`""` when none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldOwner<'v> {
    /// Unix second of the write; `None` when the timestamp does not parse.
    pub written_at: Option<u64>,
    /// Medium as written (`""` for a timestamp-only value).
    pub medium: &'v str,
}

/// Parses `"{ts}"` or `"{ts}|{MEDIUM}"`, the inverse of [`field_value`]. A timestamp that
/// does not parse is kept as unknown (kthena keeps such an owner as fresh) rather than
/// dropping the owner.
pub fn parse_field_value(value: &str) -> FieldOwner<'_> {
    let (ts, medium) = match value.split_once('|') {
        Some((ts, medium)) => (ts, medium.trim()),
        None => (value, ""),
    };
    FieldOwner {
        written_at: ts.trim().parse::<u64>().ok(),
        medium,
    }
}

/// Prefix of the mapping keys of `engine`; TensorRT-LLM speaks vLLM's format and uses its keys.
pub fn mapping_prefix(engine: Engine) -> &'static str {
    match engine {
        Engine::Sglang => "sglang:kv:block:",
        Engine::Vllm | Engine::Trtllm => "vllm:kv:block:",
    }
}

/// `{vllm|sglang}:kv:block:{pod}@{engine_hash}` (engine hash in its text form).
pub fn mapping_key(engine: Engine, pod: &str, engine_hash: &BlockHash) -> String {
    let mut key = String::with_capacity(mapping_prefix(engine).len() + pod.len() + 24);
    push_mapping_key(&mut key, engine, pod, engine_hash);
    key
}

/// Writes the mapping key into `key` (cleared first), so a mirror reuses one buffer.
pub fn push_mapping_key(key: &mut String, engine: Engine, pod: &str, engine_hash: &BlockHash) {
    key.clear();
    key.push_str(mapping_prefix(engine));
    key.push_str(pod);
    let _ = write!(key, "@{engine_hash}");
}

/// A mapping key's value: the std hash in decimal.
pub fn mapping_value(std_hash: StdHash) -> String {
    std_hash.to_string()
}

/// The `SCAN MATCH` pattern of `engine`'s mapping keys of `pod`, or of every pod.
pub fn mapping_key_pattern(engine: Engine, pod: Option<&str>) -> String {
    let prefix = mapping_prefix(engine);
    match pod {
        Some(p) => format!("{prefix}{}@*", glob_escape(p)),
        None => format!("{prefix}*"),
    }
}

/// Escapes Redis glob characters so a name matches only itself in `SCAN MATCH`.
fn glob_escape(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Shown in place of a password.
const MASK: &str = "***";

/// The URL with every password replaced by `***`, for errors and logs: the userinfo password
/// (`redis://user:PASS@host`) and `pass=` / `password=` query values (`redis+unix` URLs).
/// A URL that does not parse is redacted the same way, so even a bad URL can be shown.
pub fn redact_url(url: &str) -> String {
    let mut out = url.to_owned();
    // Right to left, so earlier ranges stay valid.
    for span in secret_spans(url).into_iter().rev() {
        out.replace_range(span, MASK);
    }
    out
}

/// `message` without the URL's passwords: the URL itself becomes its redacted form, and each
/// password, as written and percent-decoded (the driver may echo either), becomes `***`.
pub fn scrub_secrets(url: &str, message: &str) -> String {
    let mut out = message.to_owned();
    if !url.is_empty() {
        out = out.replace(url, &redact_url(url));
    }
    let mut secrets: Vec<String> = Vec::new();
    for span in secret_spans(url) {
        let raw = &url[span];
        secrets.push(raw.to_owned());
        secrets.push(percent_decode(raw));
    }
    // Longest first, so a password that contains another is masked whole.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    for secret in secrets.iter().filter(|s| !s.is_empty()) {
        out = out.replace(secret.as_str(), MASK);
    }
    out
}

/// Byte ranges of the passwords in `url`, in order. The userinfo ends at the last `@` (a raw
/// `@`, `/` or `#` in a password is then still hidden, at worst with part of the host).
fn secret_spans(url: &str) -> Vec<Range<usize>> {
    let mut spans = Vec::new();
    let start = url.find("://").map_or(0, |i| i + 3);
    let mut query_from = start;
    if let Some(at) = url[start..].rfind('@').map(|i| start + i) {
        if let Some(colon) = url[start..at].find(':').map(|i| start + i) {
            if colon + 1 < at {
                spans.push(colon + 1..at);
            }
        }
        query_from = at + 1;
    }
    let mut from = query_from;
    while let Some(sep) = url[from..].find(['?', '&']).map(|i| from + i) {
        let param = sep + 1;
        let end = url[param..].find('&').map_or(url.len(), |i| param + i);
        if let Some((name, _)) = url[param..end].split_once('=') {
            let value_at = param + name.len() + 1;
            let is_secret = ["pass", "password"]
                .iter()
                .any(|n| name.eq_ignore_ascii_case(n));
            if is_secret && value_at < end {
                spans.push(value_at..end);
            }
        }
        from = end;
    }
    spans
}

/// `%XX` sequences decoded (invalid ones kept as written); not UTF-8 → lossy.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::medium::{MediaSet, Medium};

    fn value(media: &[Medium]) -> FieldValue {
        let mut set = MediaSet::EMPTY;
        for m in media {
            set.insert(*m);
        }
        FieldValue {
            stored_at: 1_700_000_000,
            media: set,
        }
    }

    #[test]
    fn block_and_mapping_keys_use_kthenas_spelling() {
        assert_eq!(
            block_key("llama-3", 18_446_744_073_709_551_615),
            "matrix:kv:block:llama-3@18446744073709551615"
        );
        assert_eq!(
            block_key("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", 12345),
            "matrix:kv:block:deepseek-ai/DeepSeek-R1-Distill-Qwen-7B@12345"
        );
        assert_eq!(
            mapping_key(Engine::Vllm, "pod-a.ns", &BlockHash::from_i64(-5)),
            "vllm:kv:block:pod-a.ns@-5"
        );
        assert_eq!(
            mapping_key(Engine::Sglang, "p.n", &BlockHash::Int(42)),
            "sglang:kv:block:p.n@42"
        );
        assert_eq!(
            mapping_key(Engine::Trtllm, "p.n", &BlockHash::Int(1)),
            "vllm:kv:block:p.n@1"
        );
        assert_eq!(mapping_value(7), "7");
    }

    #[test]
    fn block_keys_split_back_into_model_and_hash() {
        let key = block_key("org/m@v2", 99);
        assert_eq!(split_block_key(&key), Some(("org/m@v2", "99")));
        assert_eq!(split_block_key("vllm:kv:block:p@1"), None);
    }

    #[test]
    fn field_values_follow_the_value_format_and_parse_back() {
        let w = TierWeights::default();
        let cpu = Medium::intern("CPU");
        let cases = [
            (value(&[Medium::GPU]), ValueFormat::Tiered, "1700000000|GPU"),
            (value(&[Medium::GPU]), ValueFormat::Timestamp, "1700000000"),
            (
                value(&[cpu, Medium::GPU]),
                ValueFormat::Tiered,
                "1700000000|GPU",
            ),
            (value(&[cpu]), ValueFormat::Tiered, "1700000000|CPU"),
            (value(&[Medium::NONE]), ValueFormat::Tiered, "1700000000"),
        ];
        for (v, format, want) in cases {
            let written = field_value(v, format, &w);
            assert_eq!(written, want);
            let read = parse_field_value(&written);
            assert_eq!(read.written_at, Some(1_700_000_000), "{written}");
            assert_eq!(read.medium, want.split_once('|').map_or("", |(_, m)| m));
        }
    }

    #[test]
    fn values_of_other_writers_parse_leniently() {
        assert_eq!(
            parse_field_value("1703123789|CPU_PINNED"),
            FieldOwner {
                written_at: Some(1703123789),
                medium: "CPU_PINNED"
            }
        );
        assert_eq!(parse_field_value("x|GPU").written_at, None);
        assert_eq!(parse_field_value("7|").medium, "");
    }

    #[test]
    fn scan_patterns_escape_glob_characters() {
        assert_eq!(
            block_key_pattern(Some("a*b?[c]\\")),
            "matrix:kv:block:a\\*b\\?\\[c\\]\\\\@*"
        );
        assert_eq!(block_key_pattern(None), "matrix:kv:block:*");
        assert_eq!(
            mapping_key_pattern(Engine::Sglang, Some("p.n")),
            "sglang:kv:block:p.n@*"
        );
        assert_eq!(mapping_key_pattern(Engine::Trtllm, None), "vllm:kv:block:*");
    }

    #[test]
    fn redaction_hides_passwords_only() {
        let cases = [
            (
                "redis://user:s3cret@127.0.0.1:6379/2",
                "redis://user:***@127.0.0.1:6379/2",
            ),
            ("rediss://:s3cret@127.0.0.1/0", "rediss://:***@127.0.0.1/0"),
            ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
            ("redis://user@127.0.0.1/0", "redis://user@127.0.0.1/0"),
            (
                "redis://127.0.0.1/0?pass=s3cret",
                "redis://127.0.0.1/0?pass=***",
            ),
            (
                "redis+unix:///run/r.sock?db=1&password=s3cret&user=u",
                "redis+unix:///run/r.sock?db=1&password=***&user=u",
            ),
            // Not URLs a driver accepts, but they must not leak either.
            ("redis://u:p@ss/w#rd@h:1/0", "redis://u:***@h:1/0"),
            ("u:s3cret@h", "u:***@h"),
        ];
        for (url, want) in cases {
            assert_eq!(redact_url(url), want, "{url}");
        }
    }

    #[test]
    fn scrubbing_removes_raw_and_decoded_passwords_and_the_raw_url() {
        let url = "redis://u:p%40ss%3Aw0rd@h:1/0";
        let message = format!("failed at {url}: AUTH u p@ss:w0rd rejected; raw p%40ss%3Aw0rd");
        let scrubbed = scrub_secrets(url, &message);
        assert_eq!(
            scrubbed,
            "failed at redis://u:***@h:1/0: AUTH u *** rejected; raw ***"
        );
        assert_eq!(scrub_secrets("redis://h:1/0", "plain"), "plain");
    }
}

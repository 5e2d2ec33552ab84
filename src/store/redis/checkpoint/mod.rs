//! kvindex's own checkpoint in Redis (docs/architecture.md §7): what a restarted kvindex needs to go on
//! exactly where the previous one stopped. It lives under the `kvindex:` prefix, apart from
//! kthena's keys, and is written by the mirror in the same pipeline as the data it covers.
//!
//! | key | type | content |
//! | --- | --- | --- |
//! | `kvindex:wm` | hash | field `{pod}#{rank}` → [`Watermark`] as JSON: the last seq whose effects are in Redis, the engine, the base model and the models the source holds blocks of |
//! | `kvindex:src:{pod}#{rank}@{model}` | hash | the source's engine blocks of that model as a log: field `+{generation}.{n}` → one flush's entries ([`segment`]); each entry maps the engine hash (decimal, `-` for negative, `x{hex}` for byte strings) to `~{std}\|{stored_at}\|{media,…}`, then `\|{chain}` and `\|{parent chain}` for a block with a chain, numbers in base64 ([`engine_value`]) |
//! | `kvindex:gen` | string | the last writer generation handed out ([`next_generation`]) |
//!
//! The kthena field holds only a pod's best medium and its mapping keys have no DP rank or
//! model, so they cannot rebuild the index; this checkpoint can. Within one flush the data
//! commands come first, the checkpoint entries next and the watermark last, so a watermark
//! in Redis never runs ahead of the data it covers: a crash between them leaves an older
//! watermark, and re-applying those seqs is harmless.

use std::fmt::Write as _;
use std::time::Instant;

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine as _;
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};

pub mod segment;

use super::error::MirrorError;
use crate::index::{EngineState, Index, SourceId, SourceSpec};
use crate::medium::{MediaSet, Medium};
use crate::redis_conn::{RedisConn, RedisTarget};
use crate::shard::Shard;
use crate::wire::{BlockHash, Engine};

/// The hash of every source's watermark.
pub const WATERMARKS_KEY: &str = "kvindex:wm";
/// Prefix of the per-source, per-model engine-block hashes.
pub const STATE_PREFIX: &str = "kvindex:src:";
/// The writer generation counter.
pub const GENERATION_KEY: &str = "kvindex:gen";
/// Fields read per `HSCAN` round trip during a restore.
const RESTORE_SCAN_COUNT: usize = 10_000;

/// Hands out a generation larger than the counter, than `after` and than Redis's clock in
/// milliseconds: larger than any an earlier writer took even when the counter was lost
/// with a restart (the clock kept going), or when another writer took one in the same
/// millisecond (the counter).
const NEXT_GENERATION: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local g = math.max((tonumber(redis.call('GET', KEYS[1])) or 0) + 1, now, tonumber(ARGV[1]) + 1)
redis.call('SET', KEYS[1], string.format('%d', g))
return g
";

/// A new writer generation for checkpoint segments, larger than `after` (the writer's
/// last one) and than any generation handed out before.
///
/// # Errors
/// When Redis fails.
pub async fn next_generation(
    conn: &mut impl redis::aio::ConnectionLike,
    after: u64,
) -> Result<u64, redis::RedisError> {
    redis::cmd("EVAL")
        .arg(NEXT_GENERATION)
        .arg(1)
        .arg(GENERATION_KEY)
        .arg(after)
        .query_async(conn)
        .await
}

/// One source's watermark entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Watermark {
    /// The last seq whose effects are in Redis.
    pub seq: u64,
    /// Engine family of the source.
    pub engine: Engine,
    /// The source's base (served) model.
    pub model: String,
    /// Every model (base or LoRA adapter) the source has state keys for.
    pub models: Vec<String>,
    /// The engine run the blocks come from (discovered pods: UID and container restarts), so
    /// a restart while kvindex was down is caught even when the new seq ran past `seq`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
}

/// The `kvindex:wm` field of source `(pod, rank)`.
pub fn source_field(pod: &str, rank: u8) -> String {
    format!("{pod}#{rank}")
}

/// Splits a `kvindex:wm` field into pod and rank. Pod identifiers are DNS names joined by a
/// dot, so they hold no `#`.
pub fn parse_source_field(field: &str) -> Option<(&str, u8)> {
    let (pod, rank) = field.rsplit_once('#')?;
    Some((pod, rank.parse().ok()?))
}

/// `kvindex:src:{pod}#{rank}@{model}`.
pub fn state_key(pod: &str, rank: u8, model: &str) -> String {
    let mut key = String::with_capacity(STATE_PREFIX.len() + pod.len() + model.len() + 6);
    key.push_str(STATE_PREFIX);
    key.push_str(pod);
    let _ = write!(key, "#{rank}@{model}");
    key
}

/// An engine hash as a state field: unambiguous between ints and byte strings (the kthena
/// text form is not: a hex digest may consist of digits only).
pub fn engine_field(hash: &BlockHash) -> String {
    let mut out = String::new();
    push_engine_field(&mut out, hash);
    out
}

/// Writes [`engine_field`] into `out` (cleared first), so the mirror reuses one buffer.
pub fn push_engine_field(out: &mut String, hash: &BlockHash) {
    out.clear();
    if matches!(hash, BlockHash::Bytes(_)) {
        out.push('x');
    }
    let _ = write!(out, "{hash}");
}

/// The inverse of [`engine_field`].
pub fn parse_engine_field(field: &str) -> Option<BlockHash> {
    if let Some(hex) = field.strip_prefix('x') {
        return BlockHash::from_hex(hex);
    }
    if field.starts_with('-') {
        return field.parse::<i64>().ok().map(BlockHash::from_i64);
    }
    field.parse::<u64>().ok().map(BlockHash::Int)
}

/// `~{std}|{stored_at}|{media spellings joined by ','}` (the empty spelling = no medium),
/// then `|{chain}` when the block has a chain hash and `|{parent}` after it when the block's
/// parent is known; the numbers big-endian in unpadded URL-safe base64 (11 characters a
/// 64-bit hash, 6 the store time), so an entry with a chain and a parent takes 47 bytes
/// where decimal took ~76: Redis keeps every byte of every entry, in its log's segments.
/// The leading `~` tells it from the decimal form kvindex wrote before (a number first),
/// which [`parse_engine_value`] still reads, so an upgraded kvindex restores an older one's
/// checkpoint.
pub fn engine_value(state: &EngineState) -> String {
    let mut out = String::with_capacity(48);
    push_engine_value(&mut out, state);
    out
}

/// Marks an entry in the compact form ([`engine_value`]).
const COMPACT: char = '~';

/// Writes [`engine_value`] into `out` (cleared first), so the mirror reuses one buffer.
pub fn push_engine_value(out: &mut String, state: &EngineState) {
    out.clear();
    out.push(COMPACT);
    B64.encode_string(state.std_hash.to_be_bytes(), out);
    out.push('|');
    B64.encode_string(state.stored_at.to_be_bytes(), out);
    out.push('|');
    for (i, medium) in state.media.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(medium.spelling());
    }
    if state.chain != 0 {
        out.push('|');
        B64.encode_string(state.chain.to_be_bytes(), out);
        if state.parent != 0 {
            out.push('|');
            B64.encode_string(state.parent.to_be_bytes(), out);
        }
    }
}

/// The inverse of [`engine_value`]; also reads the decimal form written before it
/// (`{std}|{stored_at}|{media}[|{chain}[|{parent}]]`), entries without a chain or a parent
/// reading as 0 (checkpoints written before chains or parents were kept).
pub fn parse_engine_value(value: &str) -> Option<EngineState> {
    match value.strip_prefix(COMPACT) {
        Some(compact) => parse_fields(
            compact,
            |t| decode_exact(t).map(u64::from_be_bytes),
            |t| decode_exact(t).map(u32::from_be_bytes),
        ),
        None => parse_fields(value, |t| t.parse().ok(), |t| t.parse().ok()),
    }
}

/// An entry's `|`-separated fields, its numbers read by `hash` and `time`.
fn parse_fields(
    value: &str,
    hash: impl Fn(&str) -> Option<u64>,
    time: impl Fn(&str) -> Option<u32>,
) -> Option<EngineState> {
    let mut parts = value.splitn(5, '|');
    let std_hash = hash(parts.next()?)?;
    let stored_at = time(parts.next()?)?;
    let mut media = MediaSet::EMPTY;
    for spelling in parts.next()?.split(',') {
        media.insert(Medium::intern(spelling));
    }
    let mut hash_part = || match parts.next() {
        Some(text) => hash(text),
        None => Some(0),
    };
    let chain = hash_part()?;
    let parent = hash_part()?;
    Some(EngineState {
        std_hash,
        media,
        stored_at,
        chain,
        parent,
    })
}

/// Exactly `N` big-endian bytes from their base64 characters (11 for 8 bytes, 6 for 4).
fn decode_exact<const N: usize>(text: &str) -> Option<[u8; N]> {
    let mut bytes = [0u8; N];
    let n = B64.decode_slice(text, &mut bytes).ok()?;
    (n == N).then_some(bytes)
}

/// What a warm start found and rebuilt.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RestoreSummary {
    /// Sources rebuilt, with the watermark each resumes after.
    pub sources: Vec<(SourceSpec, u64)>,
    /// Engine blocks rebuilt over all sources.
    pub engine_blocks: u64,
    /// Checkpoint entries that did not parse (skipped, logged).
    pub bad_entries: u64,
    /// Sources left alone because another shard owns their pod.
    pub other_shards: u64,
    /// Wall time of the restore, milliseconds.
    pub took_ms: u64,
}

impl RestoreSummary {
    /// Distinct pod identifiers restored.
    pub fn pods(&self) -> Vec<String> {
        let mut pods: Vec<String> = self.sources.iter().map(|(s, _)| s.pod.clone()).collect();
        pods.sort();
        pods.dedup();
        pods
    }
}

/// Rebuilds `index` from the checkpoint in Redis: every source in `kvindex:wm` whose pod
/// `shard` owns is registered, its engine blocks restored without deltas, and its watermark
/// recorded as the seq its pipeline resumes after. Returns the watermarks so the mirror
/// knows them too. Sources of other shards' pods are not read at all: they never enter the
/// index, so nothing this replica does later (forgetting unclaimed sources, anti-entropy,
/// rewrites) can touch their keys.
///
/// # Errors
/// [`MirrorError::Command`] when Redis fails mid-way (the caller starts cold instead).
pub async fn restore(
    conn: &mut RedisConn,
    target: &RedisTarget,
    index: &Index,
    shard: Shard,
) -> Result<(RestoreSummary, Vec<(SourceId, Watermark)>), MirrorError> {
    let started = Instant::now();
    let failed = |e: redis::RedisError| MirrorError::Command {
        url: target.shown(),
        reason: target.scrub(&e.to_string()),
    };
    let entries: Vec<(String, String)> = conn.hgetall(WATERMARKS_KEY).await.map_err(failed)?;
    let mut summary = RestoreSummary::default();
    let mut marks = Vec::new();
    for (field, value) in entries {
        let parsed = parse_source_field(&field).zip(serde_json::from_str::<Watermark>(&value).ok());
        let Some(((pod, rank), mark)) = parsed else {
            summary.bad_entries += 1;
            tracing::warn!(field = %field, "Skipped a checkpoint watermark that does not parse.");
            continue;
        };
        if !shard.owns(pod) {
            summary.other_shards += 1;
            continue;
        }
        let spec = SourceSpec {
            pod: pod.to_owned(),
            model: mark.model.clone(),
            engine: mark.engine,
            dp_rank: rank,
        };
        let Ok(source) = index.register_source(&spec) else {
            summary.bad_entries += 1;
            continue;
        };
        for model in &mark.models {
            let key = state_key(pod, rank, model);
            restore_state_key(conn, &key, index, source, model, &mut summary)
                .await
                .map_err(failed)?;
        }
        // Registered above, so neither can fail.
        let _ = index.set_resume_seq(source, mark.seq);
        let _ = index.set_source_run(source, mark.run.clone());
        summary.sources.push((spec, mark.seq));
        marks.push((source, mark));
    }
    summary.took_ms = started.elapsed().as_millis() as u64;
    Ok((summary, marks))
}

/// Restores one state key: its fields are read whole first, since a log applies in stamp
/// order and a chain block restored after its parent goes right after it
/// ([`Index::restore_blocks`]).
async fn restore_state_key(
    conn: &mut RedisConn,
    key: &str,
    index: &Index,
    source: SourceId,
    model: &str,
    summary: &mut RestoreSummary,
) -> Result<(), redis::RedisError> {
    let (blocks, bad) = read_state(conn, key).await?;
    summary.bad_entries += bad;
    // The source was registered by the caller: nothing here can fail.
    let restored = index.restore_blocks(source, model, &blocks).unwrap_or(0);
    summary.engine_blocks += restored as u64;
    Ok(())
}

/// One `HSCAN` answer: the next cursor and the fields with their values, as bytes.
type ScanPage = (u64, Vec<(Vec<u8>, Vec<u8>)>);

/// The engine blocks state key `key` holds, and how many of its fields or entries did not
/// parse: per-block fields, then its log's segments in stamp order ([`segment::StateFold`]).
///
/// # Errors
/// When Redis fails.
pub async fn read_state(
    conn: &mut impl redis::aio::ConnectionLike,
    key: &str,
) -> Result<(Vec<(BlockHash, EngineState)>, u64), redis::RedisError> {
    let mut fold = segment::StateFold::default();
    let mut cursor: u64 = 0;
    loop {
        let (next, page): ScanPage = redis::cmd("HSCAN")
            .arg(key)
            .arg(cursor)
            .arg("COUNT")
            .arg(RESTORE_SCAN_COUNT)
            .query_async(conn)
            .await?;
        for (field, value) in page {
            fold.add(field, value);
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
    Ok(fold.blocks())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_fields_round_trip_and_never_confuse_ints_and_digests() {
        for hash in [
            BlockHash::Int(u64::MAX),
            BlockHash::Int(0),
            BlockHash::from_i64(-42),
            BlockHash::Bytes(vec![0x12, 0x34].into()),
            BlockHash::Bytes(Vec::new().into()),
        ] {
            assert_eq!(parse_engine_field(&engine_field(&hash)), Some(hash));
        }
        assert_eq!(engine_field(&BlockHash::Bytes(vec![0x12].into())), "x12");
        assert_eq!(parse_engine_field("x1"), None);
        assert_eq!(parse_engine_field("abc"), None);
    }

    #[test]
    fn byte_string_fields_take_hex_digits_only_in_either_case() {
        let bytes = |b: &[u8]| Some(BlockHash::Bytes(b.into()));
        assert_eq!(parse_engine_field("xAb01"), bytes(&[0xab, 0x01]));
        // `u8::from_str_radix` took a sign: "+1" read as 0x01.
        assert_eq!(parse_engine_field("x+1+2"), None);
        assert_eq!(parse_engine_field("x0g"), None);
    }

    #[test]
    fn engine_values_round_trip_with_several_media_and_none() {
        let mut media = MediaSet::single(Medium::GPU);
        media.insert(Medium::intern("CPU"));
        media.insert(Medium::NONE);
        let state = EngineState {
            std_hash: 1 << 62,
            media,
            stored_at: 1_700_000_000,
            chain: 0,
            parent: 0,
        };
        assert_eq!(parse_engine_value(&engine_value(&state)), Some(state));
    }

    #[test]
    fn engine_values_keep_the_chain_hash_and_the_parent_when_known() {
        let state = EngineState {
            std_hash: 7,
            media: MediaSet::single(Medium::GPU),
            stored_at: 9,
            chain: u64::MAX,
            parent: 1 << 63,
        };
        let value = engine_value(&state);
        assert_eq!(value, "~AAAAAAAAAAc|AAAACQ|GPU|__________8|gAAAAAAAAAA");
        assert_eq!(parse_engine_value(&value), Some(state));
        let start = EngineState { parent: 0, ..state };
        assert_eq!(engine_value(&start), "~AAAAAAAAAAc|AAAACQ|GPU|__________8");
        assert_eq!(parse_engine_value(&engine_value(&start)), Some(start));
        // A parent goes only with a chain.
        let chainless = EngineState { chain: 0, ..state };
        assert_eq!(engine_value(&chainless), "~AAAAAAAAAAc|AAAACQ|GPU");
        assert_eq!(
            parse_engine_value(&engine_value(&chainless)),
            Some(EngineState {
                parent: 0,
                ..chainless
            })
        );
    }

    #[test]
    fn compact_values_with_a_number_of_the_wrong_size_or_alphabet_do_not_parse() {
        for bad in [
            "~AAAAAAAAAA|AAAACQ|GPU",    // 10 characters: 7 bytes
            "~AAAAAAAAAAAA|AAAACQ|GPU",  // 12: 9 bytes
            "~AAAAAAAAAAc|AAAAACQ|GPU",  // a time of 7 characters
            "~AAAAAAAAAA=|AAAACQ|GPU",   // padding
            "~AAAAAAAAA+c|AAAACQ|GPU",   // the standard alphabet's `+`
            "~AAAAAAAAAAc|AAAACQ|GPU|x", // a chain of one character
            "~AAAAAAAAAAc|AAAACQ",       // no media
            "~7|9|GPU",                  // decimal after the mark
            "~",
        ] {
            assert_eq!(parse_engine_value(bad), None, "{bad}");
        }
    }

    proptest::proptest! {
        /// Checkpoint values come from Redis: any text, alone or after an entry, is read
        /// without a panic, and an entry cut by a character never reads as itself.
        #[test]
        fn any_value_text_is_read_without_a_panic(
            text in "\\PC{0,80}",
            std in 0u64..1 << 63,
            chain: u64,
            parent: u64,
            at: u32,
        ) {
            let _ = parse_engine_value(&text);
            let state = EngineState {
                std_hash: std,
                media: MediaSet::single(Medium::GPU),
                stored_at: at,
                chain,
                parent: if chain == 0 { 0 } else { parent },
            };
            let value = engine_value(&state);
            proptest::prop_assert_eq!(parse_engine_value(&value), Some(state));
            let cut = &value[..value.len() - 1];
            proptest::prop_assert_ne!(parse_engine_value(cut), Some(state));
            let _ = parse_engine_value(&format!("{value}{text}"));
        }
    }

    #[test]
    fn decimal_values_written_before_the_compact_form_still_restore() {
        let state = EngineState {
            std_hash: 7,
            media: MediaSet::single(Medium::GPU),
            stored_at: 9,
            chain: 11,
            parent: u64::MAX,
        };
        let decimal = format!("7|9|GPU|11|{}", u64::MAX);
        assert_eq!(parse_engine_value(&decimal), Some(state));
        // Written before parents were kept: a chain start; before chains: chain 0.
        let start = EngineState { parent: 0, ..state };
        assert_eq!(parse_engine_value("7|9|GPU|11"), Some(start));
        let old = EngineState { chain: 0, ..start };
        assert_eq!(parse_engine_value("7|9|GPU"), Some(old));
        for bad in [
            "7|9|GPU|x",
            "7|9|GPU|11|x",
            "7|9|GPU|11|12|13",
            "1|2",
            "x|2|GPU",
        ] {
            assert_eq!(parse_engine_value(bad), None, "{bad}");
        }
    }

    #[test]
    fn keys_and_fields_name_pod_rank_and_model() {
        assert_eq!(state_key("p.ns", 1, "m@x"), "kvindex:src:p.ns#1@m@x");
        assert_eq!(
            parse_source_field(&source_field("p.ns", 3)),
            Some(("p.ns", 3))
        );
        assert_eq!(parse_source_field("p.ns#300"), None);
    }
}

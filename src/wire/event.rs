//! Normalized events: what every engine era decodes to.

use std::fmt;

use crate::medium::Medium;

/// Which engine family produced a stream; decides map-form field names (and, in
/// `redis_layout`, mapping-key prefixes), never the decoding rules (every era is recognised
/// from its shape).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    /// vLLM (and anything else that speaks its format).
    Vllm,
    /// SGLang.
    Sglang,
    /// TensorRT-LLM (vLLM's format with map events).
    Trtllm,
}

impl Engine {
    /// The lowercase name used in config, metrics and CLI flags.
    pub fn as_str(self) -> &'static str {
        match self {
            Engine::Vllm => "vllm",
            Engine::Sglang => "sglang",
            Engine::Trtllm => "trtllm",
        }
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Engine {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "vllm" => Ok(Engine::Vllm),
            "sglang" => Ok(Engine::Sglang),
            "trtllm" | "tensorrt-llm" | "tensorrt_llm" => Ok(Engine::Trtllm),
            other => Err(format!(
                "unknown engine `{other}` (expected vllm, sglang or trtllm)"
            )),
        }
    }
}

/// An engine block hash, exactly as sent: no bit and no sign is lost.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BlockHash {
    /// A non-negative msgpack integer (0 … 2^64−1).
    Int(u64),
    /// A negative msgpack integer (−2^63 … −1).
    Neg(i64),
    /// A byte string (vLLM's bytes mode: a 32-byte digest).
    Bytes(Box<[u8]>),
}

impl BlockHash {
    /// Builds a hash from a signed value, normalizing non-negative values to [`BlockHash::Int`].
    pub fn from_i64(v: i64) -> BlockHash {
        if v < 0 {
            BlockHash::Neg(v)
        } else {
            BlockHash::Int(v as u64)
        }
    }

    /// A byte-string hash from its hex text form (the inverse of [`fmt::Display`] for bytes;
    /// either case); `None` for an odd length or a character that is not a hex digit.
    pub fn from_hex(text: &str) -> Option<BlockHash> {
        let digits = text.as_bytes();
        if !digits.len().is_multiple_of(2) {
            return None;
        }
        let nibble = |d: u8| char::from(d).to_digit(16);
        let bytes = (digits.chunks_exact(2))
            .map(|pair| Some((nibble(pair[0])? << 4 | nibble(pair[1])?) as u8))
            .collect::<Option<Box<[u8]>>>()?;
        Some(BlockHash::Bytes(bytes))
    }
}

impl fmt::Display for BlockHash {
    /// The text form: decimal as sent for integers, lowercase hex for bytes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BlockHash::Int(v) => write!(f, "{v}"),
            BlockHash::Neg(v) => write!(f, "{v}"),
            BlockHash::Bytes(b) => {
                for byte in b.iter() {
                    write!(f, "{byte:02x}")?;
                }
                Ok(())
            }
        }
    }
}

impl fmt::Debug for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlockHash({self})")
    }
}

/// A passthrough field the index does not use, kept for `decode` output.
pub type Passthrough = Option<rmpv::Value>;

/// Fields of a `BlockStored` that only `decode` shows; boxed so the hot path stays small.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StoredExtras {
    /// Per-block extra hash keys (vLLM 0.17+).
    pub extra_keys: Passthrough,
    /// Ownership marker (vLLM 0.29+).
    pub ownership: Passthrough,
    /// Session id (vLLM 0.30+, SGLang 0.5.20+).
    pub session_id: Passthrough,
    /// Speculative lookahead tokens (vLLM 0.33).
    pub lookahead_token_ids: Passthrough,
    /// Cache salt (SGLang 0.5.18+).
    pub cache_salt: Passthrough,
    /// Multimodal keys per block (TensorRT-LLM).
    pub mm_keys: Passthrough,
}

impl StoredExtras {
    /// Whether every field is absent.
    pub fn is_empty(&self) -> bool {
        *self == StoredExtras::default()
    }
}

/// `BlockStored`: one or more consecutive blocks became resident on a medium.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockStored {
    /// Engine hashes, one per block (never empty after decoding).
    pub block_hashes: Vec<BlockHash>,
    /// Engine hash of the block before the first one, `None` at a chain start.
    pub parent_block_hash: Option<BlockHash>,
    /// The blocks' tokens, concatenated; empty for a tier copy of known blocks.
    pub token_ids: Vec<u32>,
    /// Tokens per block as sent (`None` when absent).
    pub block_size: Option<u32>,
    /// Deprecated numeric LoRA id.
    pub lora_id: Option<i64>,
    /// Medium the blocks are now on ([`Medium::NONE`] when not reported).
    pub medium: Medium,
    /// Served LoRA adapter name; blocks belong to this model name when set.
    pub lora_name: Option<String>,
    /// KV-cache group of hybrid models.
    pub group_idx: Option<i64>,
    /// KV-cache spec kind (`full_attention`, `sliding_window`, `mamba`, …).
    pub kv_cache_spec_kind: Option<String>,
    /// Sliding window size of that spec.
    pub kv_cache_spec_sliding_window: Option<i64>,
    /// `LOCAL` or `REMOTE` for storage tiers (vLLM 0.26+).
    pub locality: Option<String>,
    /// The tenant salt the blocks were stored under (vLLM: in the first block's
    /// `extra_keys`; SGLang: `cache_salt`): a chain it starts matches only prompts with the
    /// same salt.
    pub cache_salt: Option<String>,
    /// Fields kept only for display (present only when the decoder was asked to keep them).
    pub extras: Option<Box<StoredExtras>>,
}

impl BlockStored {
    /// A store of consecutive blocks with only the fields every era has; the optional ones
    /// (LoRA, KV-cache group, locality, display-only extras) absent.
    pub fn new(
        block_hashes: Vec<BlockHash>,
        token_ids: Vec<u32>,
        block_size: u32,
        medium: Medium,
    ) -> BlockStored {
        BlockStored {
            block_hashes,
            parent_block_hash: None,
            token_ids,
            block_size: Some(block_size),
            lora_id: None,
            medium,
            lora_name: None,
            group_idx: None,
            kv_cache_spec_kind: None,
            kv_cache_spec_sliding_window: None,
            locality: None,
            cache_salt: None,
            extras: None,
        }
    }

    /// Tokens per block: the sent `block_size`, else tokens ÷ blocks when that divides.
    pub fn effective_block_size(&self) -> Option<usize> {
        match self.block_size {
            Some(bs) => Some(bs as usize),
            None => {
                let n = self.block_hashes.len();
                let t = self.token_ids.len();
                (n > 0 && t > 0 && t.is_multiple_of(n)).then(|| t / n)
            }
        }
    }

    /// The tokens of block `i` (the last block may be partial); empty when tokenless.
    #[inline]
    pub fn block_tokens(&self, i: usize) -> &[u32] {
        let Some(bs) = self.effective_block_size() else {
            return &[];
        };
        let start = (i * bs).min(self.token_ids.len());
        let end = ((i + 1) * bs).min(self.token_ids.len());
        &self.token_ids[start..end]
    }
}

/// `BlockRemoved`: blocks left a medium (or every medium when none is given).
#[derive(Debug, Clone, PartialEq)]
pub struct BlockRemoved {
    /// Engine hashes of the removed blocks.
    pub block_hashes: Vec<BlockHash>,
    /// The medium they left; [`Medium::NONE`] = all media.
    pub medium: Medium,
    /// KV-cache group of hybrid models.
    pub group_idx: Option<i64>,
    /// `LOCAL` or `REMOTE` (vLLM 0.26+).
    pub locality: Option<String>,
    /// Ownership marker (vLLM 0.29+), display only.
    pub ownership: Passthrough,
}

impl BlockRemoved {
    /// A remove of `block_hashes` from `medium` ([`Medium::NONE`] = every medium), with the
    /// optional fields (KV-cache group, locality, ownership) absent.
    pub fn new(block_hashes: Vec<BlockHash>, medium: Medium) -> BlockRemoved {
        BlockRemoved {
            block_hashes,
            medium,
            group_idx: None,
            locality: None,
            ownership: None,
        }
    }
}

/// One normalized KV-cache event.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Blocks stored.
    BlockStored(BlockStored),
    /// Blocks removed.
    BlockRemoved(BlockRemoved),
    /// The engine dropped its whole cache.
    AllBlocksCleared,
}

impl Event {
    /// The wire tag of this event.
    pub fn kind(&self) -> EventKind {
        match self {
            Event::BlockStored(_) => EventKind::BlockStored,
            Event::BlockRemoved(_) => EventKind::BlockRemoved,
            Event::AllBlocksCleared => EventKind::AllBlocksCleared,
        }
    }
}

/// The three event types, for counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// `BlockStored`.
    BlockStored,
    /// `BlockRemoved`.
    BlockRemoved,
    /// `AllBlocksCleared`.
    AllBlocksCleared,
}

impl EventKind {
    /// The wire tag.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::BlockStored => "BlockStored",
            EventKind::BlockRemoved => "BlockRemoved",
            EventKind::AllBlocksCleared => "AllBlocksCleared",
        }
    }
}

/// An event of a batch that was not turned into an [`Event`]; the rest of the batch stands.
#[derive(Debug, Clone, PartialEq)]
pub struct SkippedEvent {
    /// Position of the event in the batch.
    pub index: usize,
    /// Why it was skipped.
    pub reason: SkipReason,
}

/// Why one event of a batch was skipped.
#[derive(Debug, Clone, PartialEq)]
pub enum SkipReason {
    /// A tag this decoder does not know (e.g. `RequestAccess`, `BlockPinned`).
    UnknownTag(String),
    /// The event was well-formed msgpack but invalid.
    Invalid(super::EventError),
}

/// One decoded batch (a ZMQ payload), normalized.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineBatch {
    /// Batch time, unix seconds as a float.
    pub ts: f64,
    /// DP rank the engine stamped on the batch (`None` when absent or nil).
    pub dp_rank: Option<i64>,
    /// The usable events, in order.
    pub events: Vec<Event>,
    /// Events that were skipped, with their positions.
    pub skipped: Vec<SkippedEvent>,
}

impl EngineBatch {
    /// A batch of events built by the caller (ts 0, no DP rank, nothing skipped).
    pub fn of(events: Vec<Event>) -> EngineBatch {
        EngineBatch {
            ts: 0.0,
            dp_rank: None,
            events,
            skipped: Vec::new(),
        }
    }
}

//! msgpack payload → [`EngineBatch`]: every era of vLLM, SGLang and TensorRT-LLM.
//!
//! Eras are recognised from the shape of the data, never from a version flag: a batch is an
//! array or a map, an event is a tagged array (positional, trailing defaults omitted or nil)
//! or a tagged map (any subset of keys). See WIRE-FORMATS.md for the field tables.

use super::error::{DecodeError, EventError};
use super::event::{
    BlockHash, BlockRemoved, BlockStored, EngineBatch, Event, SkipReason, SkippedEvent,
    StoredExtras,
};
use super::msgpack::{Int, Kind, Reader};
use crate::medium::Medium;

/// What the decoder keeps beyond what the index needs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DecodeOptions {
    /// Keep display-only fields (`extra_keys`, `session_id`, …) in [`StoredExtras`].
    pub keep_extras: bool,
}

impl DecodeOptions {
    /// Everything, for `decode` output.
    pub const FULL: DecodeOptions = DecodeOptions { keep_extras: true };
    /// Only what the index uses (the ingest hot path).
    pub const INDEX: DecodeOptions = DecodeOptions { keep_extras: false };
}

/// Decodes one payload into a normalized batch.
///
/// ```
/// use kvindex::wire::{decode_batch, DecodeOptions, Event};
/// // vLLM 0.9's array form: [ts, [["AllBlocksCleared"]]]
/// let payload = [0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x91, 0xb0,
///     b'A', b'l', b'l', b'B', b'l', b'o', b'c', b'k', b's', b'C', b'l', b'e', b'a', b'r', b'e', b'd'];
/// let batch = decode_batch(&payload, DecodeOptions::INDEX).unwrap();
/// assert_eq!(batch.events, vec![Event::AllBlocksCleared]);
/// ```
///
/// # Errors
/// A [`DecodeError`] when the payload is not a batch at all; events that are bad on their
/// own are reported in [`EngineBatch::skipped`] and the rest of the batch is kept.
pub fn decode_batch(payload: &[u8], options: DecodeOptions) -> Result<EngineBatch, DecodeError> {
    if payload.is_empty() {
        return Err(DecodeError::EmptyPayload);
    }
    let mut r = Reader::new(payload);
    let batch = match r.peek_kind()? {
        Kind::Array => decode_array_batch(&mut r, options)?,
        Kind::Map => decode_map_batch(&mut r, options)?,
        _ => return Err(DecodeError::NotABatch),
    };
    if r.remaining() > 0 {
        return Err(DecodeError::TrailingBytes {
            extra: r.remaining(),
        });
    }
    Ok(batch)
}

fn decode_array_batch(
    r: &mut Reader<'_>,
    options: DecodeOptions,
) -> Result<EngineBatch, DecodeError> {
    let len = r.read_array_len()?;
    if len < 2 {
        return Err(DecodeError::NotABatch);
    }
    let ts = r.read_number()?.ok_or(DecodeError::BadTs)?;
    let (events, skipped) = decode_events(r, options)?;
    let dp_rank = if len >= 3 { read_dp_rank(r)? } else { None };
    r.skip_n(len.saturating_sub(3))?;
    Ok(EngineBatch {
        ts,
        dp_rank,
        events,
        skipped,
    })
}

fn decode_map_batch(
    r: &mut Reader<'_>,
    options: DecodeOptions,
) -> Result<EngineBatch, DecodeError> {
    let len = r.read_map_len()?;
    let mut ts = None;
    let mut decoded = None;
    let mut dp_rank = None;
    for _ in 0..len {
        let key = read_key(r)?;
        match key {
            Some(b"ts") => ts = Some(r.read_number()?.ok_or(DecodeError::BadTs)?),
            Some(b"events") => decoded = Some(decode_events(r, options)?),
            Some(b"data_parallel_rank" | b"attn_dp_rank" | b"dp_rank") => {
                dp_rank = read_dp_rank(r)?
            }
            _ => r.skip()?,
        }
    }
    let ts = ts.ok_or(DecodeError::BadTs)?;
    let (events, skipped) = decoded.ok_or(DecodeError::BadEvents)?;
    Ok(EngineBatch {
        ts,
        dp_rank,
        events,
        skipped,
    })
}

/// A map key as bytes; `None` (key consumed) when the key is not a string.
fn read_key<'a>(r: &mut Reader<'a>) -> Result<Option<&'a [u8]>, DecodeError> {
    if r.peek_kind()? == Kind::Str {
        Ok(Some(r.read_str_bytes()?))
    } else {
        r.skip()?;
        Ok(None)
    }
}

fn read_dp_rank(r: &mut Reader<'_>) -> Result<Option<i64>, DecodeError> {
    match r.peek_kind()? {
        Kind::Nil => {
            r.eat_nil()?;
            Ok(None)
        }
        Kind::Int => r
            .read_int()?
            .as_i64()
            .map(Some)
            .ok_or(DecodeError::BadDpRank),
        _ => Err(DecodeError::BadDpRank),
    }
}

type Decoded = (Vec<Event>, Vec<SkippedEvent>);

/// The fewest payload bytes an event can take: `["AllBlocksCleared"]` (fixarray marker,
/// str marker, 16 bytes of tag).
const MIN_EVENT_BYTES: usize = 18;
/// The most elements reserved up front; past that a vector grows as elements really decode.
const MAX_RESERVATION: usize = 4096;

/// Up-front capacity for an array whose header claims `len` elements of at least
/// `min_bytes` each: bounded by what the remaining bytes can hold and by
/// [`MAX_RESERVATION`], so a lying header (an array32 of 4 billion) cannot reserve gigabytes.
fn reservation(len: usize, remaining: usize, min_bytes: usize) -> usize {
    len.min(remaining / min_bytes).min(MAX_RESERVATION)
}

fn decode_events(r: &mut Reader<'_>, options: DecodeOptions) -> Result<Decoded, DecodeError> {
    if r.peek_kind()? != Kind::Array {
        return Err(DecodeError::BadEvents);
    }
    let len = r.read_array_len()?;
    let mut events = Vec::with_capacity(reservation(len, r.remaining(), MIN_EVENT_BYTES));
    let mut skipped = Vec::new();
    for index in 0..len {
        match decode_event(r, index, options)? {
            Ok(event) => events.push(event),
            Err(reason) => skipped.push(SkippedEvent { index, reason }),
        }
    }
    Ok((events, skipped))
}

/// Decodes one event; the outer error aborts the batch, the inner one skips this event.
fn decode_event(
    r: &mut Reader<'_>,
    index: usize,
    options: DecodeOptions,
) -> Result<Result<Event, SkipReason>, DecodeError> {
    let mut fields = Fields::new(options);
    match r.peek_kind()? {
        Kind::Array => fields.read_array(r)?,
        Kind::Map => fields.read_map(r)?,
        _ => return Err(DecodeError::NotAnEvent { index }),
    }
    Ok(fields.finish())
}

/// Positional layout of array-encoded events (after the tag at position 0).
const STORED_POSITIONS: [Field; 11] = [
    Field::BlockHashes,
    Field::ParentBlockHash,
    Field::TokenIds,
    Field::BlockSize,
    Field::LoraId,
    Field::Medium,
    Field::LoraNameOrMetadata,
    Field::ExtraKeys,
    Field::GroupIdx,
    Field::KvCacheSpecKind,
    Field::KvCacheSpecSlidingWindow,
];
const REMOVED_POSITIONS: [Field; 3] = [Field::BlockHashes, Field::Medium, Field::GroupIdx];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    BlockHashes,
    ParentBlockHash,
    TokenIds,
    BlockSize,
    LoraId,
    Medium,
    LoraNameOrMetadata,
    ExtraKeys,
    GroupIdx,
    KvCacheSpecKind,
    KvCacheSpecSlidingWindow,
    Locality,
    Ownership,
    SessionId,
    LookaheadTokenIds,
    CacheSalt,
    MmKeys,
    Ignored,
}

impl Field {
    fn from_key(key: &[u8]) -> Field {
        match key {
            b"block_hashes" => Field::BlockHashes,
            b"parent_block_hash" => Field::ParentBlockHash,
            b"token_ids" => Field::TokenIds,
            b"block_size" => Field::BlockSize,
            b"lora_id" => Field::LoraId,
            b"medium" => Field::Medium,
            b"lora_name" => Field::LoraNameOrMetadata,
            b"extra_keys" => Field::ExtraKeys,
            b"group_idx" => Field::GroupIdx,
            b"kv_cache_spec_kind" => Field::KvCacheSpecKind,
            b"kv_cache_spec_sliding_window" => Field::KvCacheSpecSlidingWindow,
            b"locality" => Field::Locality,
            b"ownership" => Field::Ownership,
            b"session_id" => Field::SessionId,
            b"lookahead_token_ids" => Field::LookaheadTokenIds,
            b"cache_salt" => Field::CacheSalt,
            b"mm_keys" => Field::MmKeys,
            _ => Field::Ignored,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Field::BlockHashes => "block_hashes",
            Field::ParentBlockHash => "parent_block_hash",
            Field::TokenIds => "token_ids",
            Field::BlockSize => "block_size",
            Field::LoraId => "lora_id",
            Field::Medium => "medium",
            Field::LoraNameOrMetadata => "lora_name",
            Field::ExtraKeys => "extra_keys",
            Field::GroupIdx => "group_idx",
            Field::KvCacheSpecKind => "kv_cache_spec_kind",
            Field::KvCacheSpecSlidingWindow => "kv_cache_spec_sliding_window",
            Field::Locality => "locality",
            Field::Ownership => "ownership",
            Field::SessionId => "session_id",
            Field::LookaheadTokenIds => "lookahead_token_ids",
            Field::CacheSalt => "cache_salt",
            Field::MmKeys => "mm_keys",
            Field::Ignored => "",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tag {
    Stored,
    Removed,
    Cleared,
    Unknown,
}

/// The union of every event's fields, filled in whatever order the wire gives them.
struct Fields {
    options: DecodeOptions,
    tag: Option<Tag>,
    unknown_tag: Option<String>,
    block_hashes: Option<Vec<BlockHash>>,
    parent_block_hash: Option<BlockHash>,
    token_ids: Vec<u32>,
    block_size: Option<u32>,
    lora_id: Option<i64>,
    medium: Medium,
    lora_name: Option<String>,
    group_idx: Option<i64>,
    kv_cache_spec_kind: Option<String>,
    kv_cache_spec_sliding_window: Option<i64>,
    locality: Option<String>,
    /// The tenant salt sent as a field (SGLang's `cache_salt`).
    cache_salt: Option<String>,
    /// The strings among the first block's `extra_keys` (vLLM), one of which is the salt.
    first_block_keys: Vec<String>,
    /// Boxed and created on first use: most events carry no display-only field, and an
    /// inline `StoredExtras` made every event pay for building, moving and dropping it.
    extras: Option<Box<StoredExtras>>,
    error: Option<EventError>,
}

impl Fields {
    fn new(options: DecodeOptions) -> Self {
        Fields {
            options,
            tag: None,
            unknown_tag: None,
            block_hashes: None,
            parent_block_hash: None,
            token_ids: Vec::new(),
            block_size: None,
            lora_id: None,
            medium: Medium::NONE,
            lora_name: None,
            group_idx: None,
            kv_cache_spec_kind: None,
            kv_cache_spec_sliding_window: None,
            locality: None,
            cache_salt: None,
            first_block_keys: Vec::new(),
            extras: None,
            error: None,
        }
    }

    fn read_tag(&mut self, r: &mut Reader<'_>) -> Result<(), DecodeError> {
        if r.peek_kind()? != Kind::Str {
            r.skip()?;
            self.fail(EventError::MissingTag);
            return Ok(());
        }
        let tag = r.read_str_bytes()?;
        self.tag = Some(match tag {
            b"BlockStored" => Tag::Stored,
            b"BlockRemoved" => Tag::Removed,
            b"AllBlocksCleared" => Tag::Cleared,
            other => {
                self.unknown_tag = Some(String::from_utf8_lossy(other).into_owned());
                Tag::Unknown
            }
        });
        Ok(())
    }

    fn read_array(&mut self, r: &mut Reader<'_>) -> Result<(), DecodeError> {
        let len = r.read_array_len()?;
        if len == 0 {
            self.fail(EventError::MissingTag);
            return Ok(());
        }
        self.read_tag(r)?;
        let positions: &[Field] = match self.tag {
            Some(Tag::Stored) => &STORED_POSITIONS,
            Some(Tag::Removed) => &REMOVED_POSITIONS,
            _ => &[],
        };
        for pos in 1..len {
            let field = positions.get(pos - 1).copied().unwrap_or(Field::Ignored);
            self.read_field(r, field)?;
        }
        Ok(())
    }

    fn read_map(&mut self, r: &mut Reader<'_>) -> Result<(), DecodeError> {
        let len = r.read_map_len()?;
        for _ in 0..len {
            match read_key(r)? {
                Some(b"type") => self.read_tag(r)?,
                Some(key) => self.read_field(r, Field::from_key(key))?,
                None => r.skip()?,
            }
        }
        Ok(())
    }

    fn fail(&mut self, error: EventError) {
        self.error.get_or_insert(error);
    }

    /// Reads one field's value; a type error marks the event bad but consumes the value.
    fn read_field(&mut self, r: &mut Reader<'_>, field: Field) -> Result<(), DecodeError> {
        if field == Field::Ignored {
            return r.skip();
        }
        if r.eat_nil()? {
            return Ok(());
        }
        let keep = self.options.keep_extras;
        let outcome = match field {
            Field::BlockHashes => read_hash_list(r)?.map(|h| self.block_hashes = Some(h)),
            Field::ParentBlockHash => read_hash(r)?.map(|h| self.parent_block_hash = Some(h)),
            Field::TokenIds => read_tokens(r)?.map(|t| self.token_ids = t),
            Field::BlockSize => read_u32(r)?.map(|v| self.block_size = Some(v)),
            Field::LoraId => read_i64(r)?.map(|v| self.lora_id = Some(v)),
            Field::Medium => read_medium(r)?.map(|m| self.medium = m),
            Field::LoraNameOrMetadata => self.read_lora_name_or_metadata(r)?,
            Field::GroupIdx => read_i64(r)?.map(|v| self.group_idx = Some(v)),
            Field::KvCacheSpecKind => read_string(r)?.map(|s| self.kv_cache_spec_kind = Some(s)),
            Field::KvCacheSpecSlidingWindow => {
                read_i64(r)?.map(|v| self.kv_cache_spec_sliding_window = Some(v))
            }
            Field::Locality => read_string(r)?.map(|s| self.locality = Some(s)),
            Field::ExtraKeys => self.read_extra_keys(r)?,
            Field::CacheSalt => self.read_cache_salt(r)?,
            Field::Ownership | Field::SessionId | Field::LookaheadTokenIds | Field::MmKeys
                if keep =>
            {
                let value = r.read_value()?;
                *self.extras.get_or_insert_with(Box::default).slot(field) = Some(value);
                Ok(())
            }
            _ => Ok(r.skip()?),
        };
        if let Err(kind) = outcome {
            self.fail(match kind {
                FieldErr::Type => EventError::FieldType {
                    field: field.name(),
                },
                FieldErr::Event(e) => e,
            });
        }
        Ok(())
    }

    /// Position 7 of an array `BlockStored` is `lora_name` (vLLM 0.14+) or, in SGLang
    /// 0.5.18–0.5.19, a metadata map `{"cache_salt": …}`.
    fn read_lora_name_or_metadata(
        &mut self,
        r: &mut Reader<'_>,
    ) -> Result<Result<(), FieldErr>, DecodeError> {
        if r.peek_kind()? != Kind::Map {
            return Ok(read_string(r)?.map(|s| self.lora_name = Some(s)));
        }
        let len = r.read_map_len()?;
        for _ in 0..len {
            // A nil value is consumed inside the arm: eating it in a match guard and then
            // falling through to `skip` would skip the next key and desync the cursor.
            match read_key(r)? {
                Some(b"cache_salt") => {
                    if !r.eat_nil()? {
                        // A salt of another type is no salt: the metadata map is optional.
                        let _ = self.read_cache_salt(r)?;
                    }
                }
                Some(b"lora_name") => {
                    if !r.eat_nil()? {
                        if let Ok(name) = read_string(r)? {
                            self.lora_name = Some(name);
                        }
                    }
                }
                _ => r.skip()?,
            }
        }
        Ok(Ok(()))
    }

    /// vLLM's per-block `extra_keys`: the strings of the first block's entry are kept (the
    /// salt is among them, [`tenant_salt`]); the value itself only for display.
    fn read_extra_keys(&mut self, r: &mut Reader<'_>) -> FieldResult<()> {
        if self.options.keep_extras {
            let mut probe = r.clone();
            self.first_block_keys = first_block_strings(&mut probe)?;
            let value = r.read_value()?;
            self.extras.get_or_insert_with(Box::default).extra_keys = Some(value);
        } else {
            self.first_block_keys = first_block_strings(r)?;
        }
        Ok(Ok(()))
    }

    /// SGLang's `cache_salt` (a field from 0.5.20, in a metadata map in 0.5.18–0.5.19).
    fn read_cache_salt(&mut self, r: &mut Reader<'_>) -> FieldResult<()> {
        if self.options.keep_extras {
            let value = r.clone().read_value()?;
            self.extras.get_or_insert_with(Box::default).cache_salt = Some(value);
        }
        Ok(read_string(r)?.map(|salt| self.cache_salt = Some(salt)))
    }

    fn finish(self) -> Result<Event, SkipReason> {
        if let Some(error) = self.error {
            // An unknown tag wins over its (unknown) field layout being "wrong".
            if self.tag == Some(Tag::Unknown) {
                return Err(SkipReason::UnknownTag(self.unknown_tag.unwrap_or_default()));
            }
            return Err(SkipReason::Invalid(error));
        }
        match self.tag {
            None => Err(SkipReason::Invalid(EventError::MissingTag)),
            Some(Tag::Unknown) => Err(SkipReason::UnknownTag(self.unknown_tag.unwrap_or_default())),
            Some(Tag::Cleared) => Ok(Event::AllBlocksCleared),
            Some(Tag::Removed) => {
                let block_hashes = self.block_hashes.unwrap_or_default();
                if block_hashes.is_empty() {
                    return Err(SkipReason::Invalid(EventError::EmptyBlockHashes));
                }
                Ok(Event::BlockRemoved(BlockRemoved {
                    block_hashes,
                    medium: self.medium,
                    group_idx: self.group_idx,
                    locality: self.locality,
                    ownership: self.extras.and_then(|e| e.ownership),
                }))
            }
            Some(Tag::Stored) => {
                let lora = self.lora_name.as_deref();
                let cache_salt = tenant_salt(self.cache_salt, self.first_block_keys, lora);
                let stored = BlockStored {
                    block_hashes: self.block_hashes.unwrap_or_default(),
                    parent_block_hash: self.parent_block_hash,
                    token_ids: self.token_ids,
                    block_size: self.block_size,
                    lora_id: self.lora_id,
                    medium: self.medium,
                    lora_name: self.lora_name,
                    group_idx: self.group_idx,
                    kv_cache_spec_kind: self.kv_cache_spec_kind,
                    kv_cache_spec_sliding_window: self.kv_cache_spec_sliding_window,
                    locality: self.locality,
                    cache_salt,
                    // Only ever created to hold a value, so never empty.
                    extras: self.extras,
                };
                validate_stored(&stored).map_err(SkipReason::Invalid)?;
                Ok(Event::BlockStored(stored))
            }
        }
    }
}

impl StoredExtras {
    /// The display-only slot a field is kept in.
    fn slot(&mut self, field: Field) -> &mut Option<rmpv::Value> {
        match field {
            Field::ExtraKeys => &mut self.extra_keys,
            Field::Ownership => &mut self.ownership,
            Field::SessionId => &mut self.session_id,
            Field::LookaheadTokenIds => &mut self.lookahead_token_ids,
            Field::CacheSalt => &mut self.cache_salt,
            _ => &mut self.mm_keys,
        }
    }
}

/// The strings of the first entry of a per-block `extra_keys` list (a tuple per block, or
/// nil); anything else in it is skipped. A value that is not a list holds none.
fn first_block_strings(r: &mut Reader<'_>) -> Result<Vec<String>, DecodeError> {
    if r.peek_kind()? != Kind::Array {
        r.skip()?;
        return Ok(Vec::new());
    }
    let blocks = r.read_array_len()?;
    let mut strings = Vec::new();
    if blocks > 0 && r.peek_kind()? == Kind::Array {
        for _ in 0..r.read_array_len()? {
            match r.peek_kind()? {
                Kind::Str => strings.extend(r.read_str()?.map(str::to_owned)),
                _ => r.skip()?,
            }
        }
    } else if blocks > 0 {
        r.skip()?;
    }
    r.skip_n(blocks.saturating_sub(1))?;
    Ok(strings)
}

/// The tenant salt of a store: SGLang's `cache_salt` field, else the last string among the
/// first block's vLLM `extra_keys` that is not the LoRA name (vLLM orders them LoRA name,
/// multimodal identifiers, cache salt, prompt-embedding digests; digests are bytes). An
/// empty salt is none, as in the engines. A multimodal identifier sent as a bare string by
/// older eras is taken for a salt too, which only keeps such a chain apart from text-only
/// prompts: never a false hit.
fn tenant_salt(
    field: Option<String>,
    first_keys: Vec<String>,
    lora: Option<&str>,
) -> Option<String> {
    let from_keys = || (first_keys.into_iter().rev()).find(|key| Some(key.as_str()) != lora);
    field.or_else(from_keys).filter(|salt| !salt.is_empty())
}

/// The checks DESIGN.md §2 asks for: each failure rejects only this event.
fn validate_stored(stored: &BlockStored) -> Result<(), EventError> {
    let blocks = stored.block_hashes.len();
    if blocks == 0 {
        return Err(EventError::EmptyBlockHashes);
    }
    if let Some(parent) = &stored.parent_block_hash {
        if stored.block_hashes.contains(parent) {
            return Err(EventError::SelfParent);
        }
    }
    if stored.block_size == Some(0) {
        return Err(EventError::ZeroBlockSize);
    }
    let tokens = stored.token_ids.len();
    if tokens == 0 {
        // A tier copy of blocks the engine already reported: resolved by engine hash.
        return Ok(());
    }
    let mismatch = |block_size| EventError::TokenCountMismatch {
        tokens,
        blocks,
        block_size,
    };
    let block_size = stored.effective_block_size().ok_or(mismatch(0))?;
    // Every block is full except possibly the last one.
    if tokens > blocks * block_size || tokens <= (blocks - 1) * block_size {
        return Err(mismatch(block_size));
    }
    Ok(())
}

/// A field-level failure: a wrong type, or a more specific event error.
enum FieldErr {
    Type,
    Event(EventError),
}

type FieldResult<T> = Result<Result<T, FieldErr>, DecodeError>;

fn type_error<T>(r: &mut Reader<'_>) -> FieldResult<T> {
    r.skip()?;
    Ok(Err(FieldErr::Type))
}

fn read_i64(r: &mut Reader<'_>) -> FieldResult<i64> {
    if r.peek_kind()? != Kind::Int {
        return type_error(r);
    }
    Ok(r.read_int()?.as_i64().ok_or(FieldErr::Type))
}

fn read_u32(r: &mut Reader<'_>) -> FieldResult<u32> {
    if r.peek_kind()? != Kind::Int {
        return type_error(r);
    }
    Ok(r.read_int()?
        .as_u64()
        .and_then(|v| u32::try_from(v).ok())
        .ok_or(FieldErr::Type))
}

fn read_string(r: &mut Reader<'_>) -> FieldResult<String> {
    if r.peek_kind()? != Kind::Str {
        return type_error(r);
    }
    Ok(r.read_str()?.map(str::to_owned).ok_or(FieldErr::Type))
}

/// A medium spelling, interned straight from the payload (no `String` per event).
fn read_medium(r: &mut Reader<'_>) -> FieldResult<Medium> {
    if r.peek_kind()? != Kind::Str {
        return type_error(r);
    }
    Ok(r.read_str()?.map(Medium::intern).ok_or(FieldErr::Type))
}

fn read_hash(r: &mut Reader<'_>) -> FieldResult<BlockHash> {
    Ok(match r.peek_kind()? {
        Kind::Int => Ok(match r.read_int()? {
            Int::U(v) => BlockHash::Int(v),
            Int::I(v) => BlockHash::Neg(v),
        }),
        Kind::Bin => Ok(BlockHash::Bytes(r.read_bin()?.into())),
        _ => {
            r.skip()?;
            Err(FieldErr::Event(EventError::BadHash))
        }
    })
}

fn read_hash_list(r: &mut Reader<'_>) -> FieldResult<Vec<BlockHash>> {
    if r.peek_kind()? != Kind::Array {
        return type_error(r);
    }
    let len = r.read_array_len()?;
    let mut hashes = Vec::with_capacity(reservation(len, r.remaining(), 1));
    let mut failed = None;
    for _ in 0..len {
        match read_hash(r)? {
            Ok(h) if failed.is_none() => hashes.push(h),
            Ok(_) => {}
            Err(e) => failed = failed.or(Some(e)),
        }
    }
    Ok(failed.map_or(Ok(hashes), Err))
}

fn read_tokens(r: &mut Reader<'_>) -> FieldResult<Vec<u32>> {
    if r.peek_kind()? != Kind::Array {
        return type_error(r);
    }
    let len = r.read_array_len()?;
    let mut tokens = Vec::with_capacity(reservation(len, r.remaining(), 1));
    let mut failed = None;
    for position in 0..len {
        // Almost every token id is a small unsigned int: read those without the general
        // marker dispatch (the same values the general path below accepts).
        if let Some(t) = r.try_read_small_uint() {
            if failed.is_none() {
                tokens.push(t);
            }
            continue;
        }
        let token = match r.peek_kind()? {
            Kind::Int => r.read_int()?.as_u64().and_then(|v| u32::try_from(v).ok()),
            // TensorRT-LLM may send token ids as strings.
            Kind::Str => r.read_str()?.and_then(|s| s.trim().parse::<u32>().ok()),
            _ => {
                r.skip()?;
                None
            }
        };
        match token {
            Some(t) if failed.is_none() => tokens.push(t),
            Some(_) => {}
            None => failed = failed.or(Some(EventError::BadToken { position })),
        }
    }
    Ok(failed.map_or(Ok(tokens), |e| Err(FieldErr::Event(e))))
}

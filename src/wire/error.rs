//! Typed decode errors; cheap to build (no allocation) because a bad frame is a hot path too.

use std::fmt;

/// Why a whole batch (one payload) could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The payload was empty (only legal as a replay end marker).
    #[error("empty payload")]
    EmptyPayload,
    /// The payload ended inside a msgpack value.
    #[error("payload truncated at byte {offset}")]
    Truncated {
        /// Byte offset where more input was needed.
        offset: usize,
    },
    /// A byte that starts no msgpack value (0xc1).
    #[error("invalid msgpack marker at byte {offset}")]
    InvalidMarker {
        /// Byte offset of the marker.
        offset: usize,
    },
    /// The batch was not an array `[ts, events, dp_rank?]` or a map `{ts, events, …}`.
    #[error("batch is not an array or map of [ts, events, dp_rank]")]
    NotABatch,
    /// The batch had no `ts`, or it was not a number.
    #[error("batch ts is missing or not a number")]
    BadTs,
    /// The batch had no `events`, or it was not an array.
    #[error("batch events are missing or not an array")]
    BadEvents,
    /// The dp rank was neither an integer nor nil.
    #[error("batch dp rank is not an integer or nil")]
    BadDpRank,
    /// An event was neither a tagged array nor a tagged map.
    #[error("event {index} is not a tagged array or map")]
    NotAnEvent {
        /// Position of the event in the batch.
        index: usize,
    },
    /// Bytes were left after the batch.
    #[error("{extra} trailing bytes after the batch")]
    TrailingBytes {
        /// How many bytes were left.
        extra: usize,
    },
    /// Values nested deeper than the decoder accepts.
    #[error("values nested deeper than {limit} levels")]
    TooDeep {
        /// The nesting limit.
        limit: usize,
    },
}

impl DecodeError {
    /// A short, fixed label for metrics (`reason` label values never grow).
    pub fn reason(&self) -> &'static str {
        match self {
            DecodeError::EmptyPayload => "empty_payload",
            DecodeError::Truncated { .. } => "truncated",
            DecodeError::InvalidMarker { .. } => "invalid_marker",
            DecodeError::NotABatch => "not_a_batch",
            DecodeError::BadTs => "bad_ts",
            DecodeError::BadEvents => "bad_events",
            DecodeError::BadDpRank => "bad_dp_rank",
            DecodeError::NotAnEvent { .. } => "not_an_event",
            DecodeError::TrailingBytes { .. } => "trailing_bytes",
            DecodeError::TooDeep { .. } => "too_deep",
        }
    }
}

/// Why one event was rejected while the rest of its batch was kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    /// A field had the wrong msgpack type.
    #[error("field `{field}` has the wrong type")]
    FieldType {
        /// The field's name.
        field: &'static str,
    },
    /// A block hash that is neither an integer nor a byte string.
    #[error("a block hash is neither an integer nor bytes")]
    BadHash,
    /// A token id that is not an integer in 0 … 2^32−1.
    #[error("token id at position {position} is not an integer in 0..2^32")]
    BadToken {
        /// Position in `token_ids`.
        position: usize,
    },
    /// `block_hashes` was missing or empty.
    #[error("block_hashes is missing or empty")]
    EmptyBlockHashes,
    /// `parent_block_hash` equals one of the event's own block hashes.
    #[error("parent_block_hash equals the event's own block hash")]
    SelfParent,
    /// `block_size` was 0.
    #[error("block_size is 0")]
    ZeroBlockSize,
    /// Token count does not fit the number of blocks and the block size.
    #[error("{tokens} tokens do not fit {blocks} blocks of block_size {block_size}")]
    TokenCountMismatch {
        /// Tokens sent.
        tokens: usize,
        /// Blocks sent.
        blocks: usize,
        /// Block size sent or inferred (0 = could not be inferred).
        block_size: usize,
    },
    /// The tag was missing or not a string.
    #[error("event tag is missing or not a string")]
    MissingTag,
}

impl EventError {
    /// A short, fixed label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            EventError::FieldType { .. } => "field_type",
            EventError::BadHash => "bad_hash",
            EventError::BadToken { .. } => "bad_token",
            EventError::EmptyBlockHashes => "empty_block_hashes",
            EventError::SelfParent => "self_parent",
            EventError::ZeroBlockSize => "zero_block_size",
            EventError::TokenCountMismatch { .. } => "token_count_mismatch",
            EventError::MissingTag => "missing_tag",
        }
    }
}

/// Why a ZMQ multipart message is not `[topic, seq, payload]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Not three frames.
    #[error("expected 3 frames [topic, seq, payload], got {0}")]
    FrameCount(usize),
    /// The seq frame was shorter than 8 bytes.
    #[error("seq frame has {0} bytes, expected 8")]
    ShortSeq(usize),
}

impl FrameError {
    /// A short, fixed label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            FrameError::FrameCount(_) => "frame_count",
            FrameError::ShortSeq(_) => "short_seq",
        }
    }
}

/// Any error the wire layer reports for one message, with where it happened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct MessageError {
    /// The message's seq, when the frames got that far.
    pub seq: Option<u64>,
    /// What was wrong.
    pub kind: MessageErrorKind,
}

/// The kinds of [`MessageError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageErrorKind {
    /// Bad framing.
    Frame(FrameError),
    /// Bad payload.
    Decode(DecodeError),
}

impl MessageError {
    /// A short, fixed label for metrics.
    pub fn reason(&self) -> &'static str {
        match self.kind {
            MessageErrorKind::Frame(e) => e.reason(),
            MessageErrorKind::Decode(e) => e.reason(),
        }
    }
}

impl fmt::Display for MessageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(seq) = self.seq {
            write!(f, "seq {seq}: ")?;
        }
        match self.kind {
            MessageErrorKind::Frame(e) => write!(f, "framing error: {e}"),
            MessageErrorKind::Decode(e) => write!(f, "decode error: {e}"),
        }
    }
}

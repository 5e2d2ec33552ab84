//! Bytes → normalized events: the only layer that knows msgpack and engine quirks.
//!
//! | file | job |
//! | --- | --- |
//! | `frames.rs` | ZMQ multipart frames → topic, seq, payload (live and replay shapes) |
//! | `msgpack.rs` | zero-copy msgpack cursor (markers from `rmp`), iterative skipping |
//! | `decode.rs` | payload → [`EngineBatch`] for every vLLM / SGLang / TRT-LLM era |
//! | `event.rs` | the normalized [`Event`] types the rest of the crate sees |
//! | `error.rs` | typed errors with fixed metric labels |
//! | `text.rs` | the stable JSON text form printed by `kvindex decode` |

mod decode;
mod error;
mod event;
mod frames;
mod msgpack;
mod text;

pub use decode::{decode_batch, DecodeOptions};
pub use error::{DecodeError, EventError, FrameError, MessageError, MessageErrorKind};
pub use event::{
    BlockHash, BlockRemoved, BlockStored, Engine, EngineBatch, Event, EventKind, Passthrough,
    SkipReason, SkippedEvent, StoredExtras,
};
pub use frames::{read_seq, split_message, split_replay_reply, Message, END_MARKER_SEQ};
pub use text::{batch_to_json, error_to_json, hash_to_json};

/// Splits and decodes one live multipart message.
///
/// # Errors
/// A [`MessageError`] naming the seq (when known) and what was wrong.
pub fn decode_message<F: AsRef<[u8]>>(
    frames: &[F],
    options: DecodeOptions,
) -> Result<(u64, EngineBatch), MessageError> {
    let message = split_message(frames).map_err(|e| MessageError {
        seq: None,
        kind: MessageErrorKind::Frame(e),
    })?;
    let batch = decode_batch(message.payload, options).map_err(|e| MessageError {
        seq: Some(message.seq),
        kind: MessageErrorKind::Decode(e),
    })?;
    Ok((message.seq, batch))
}

#[cfg(test)]
mod tests;

//! ZMQ multipart `[topic, seq, payload]` → a [`Message`].

use super::error::FrameError;

/// The replay end marker's seq (`-1` as 8 big-endian bytes).
pub const END_MARKER_SEQ: u64 = u64::MAX;

/// One live message, borrowed from its frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message<'a> {
    /// Topic frame (often empty).
    pub topic: &'a [u8],
    /// Batch sequence number.
    pub seq: u64,
    /// msgpack payload.
    pub payload: &'a [u8],
}

/// Reads a seq frame: 8 bytes big-endian; a longer frame (a publisher identity appended, as
/// one vLLM fork does) is read from its first 8 bytes.
///
/// # Errors
/// [`FrameError::ShortSeq`] when the frame has fewer than 8 bytes.
pub fn read_seq(frame: &[u8]) -> Result<u64, FrameError> {
    let bytes: [u8; 8] = frame
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or(FrameError::ShortSeq(frame.len()))?;
    Ok(u64::from_be_bytes(bytes))
}

/// Splits a live multipart message into topic, seq and payload.
///
/// # Errors
/// [`FrameError`] when there are not exactly three frames or the seq frame is short.
pub fn split_message<F: AsRef<[u8]>>(frames: &[F]) -> Result<Message<'_>, FrameError> {
    match frames {
        [topic, seq, payload] => Ok(Message {
            topic: topic.as_ref(),
            seq: read_seq(seq.as_ref())?,
            payload: payload.as_ref(),
        }),
        other => Err(FrameError::FrameCount(other.len())),
    }
}

/// Splits a replay reply (after the DEALER's empty delimiter): `[seq, payload]` (older
/// engines) or `[topic, seq, payload]` (vLLM 0.26+, SGLang 0.5.22+).
///
/// # Errors
/// [`FrameError`] for any other shape.
pub fn split_replay_reply<F: AsRef<[u8]>>(frames: &[F]) -> Result<Message<'_>, FrameError> {
    match frames {
        [seq, payload] => Ok(Message {
            topic: &[],
            seq: read_seq(seq.as_ref())?,
            payload: payload.as_ref(),
        }),
        [_, _, _] => split_message(frames),
        other => Err(FrameError::FrameCount(other.len())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_seq_frames_read_their_first_eight_bytes() {
        let mut frame = 7u64.to_be_bytes().to_vec();
        frame.extend_from_slice(&[0xAA; 16]);
        assert_eq!(read_seq(&frame), Ok(7));
        assert_eq!(read_seq(&[1, 2]), Err(FrameError::ShortSeq(2)));
    }

    #[test]
    fn two_frames_are_a_framing_error() {
        let frames: [&[u8]; 2] = [b"topic", b"payload"];
        assert_eq!(split_message(&frames), Err(FrameError::FrameCount(2)));
    }

    #[test]
    fn replay_replies_of_both_shapes_split() {
        let seq = 3u64.to_be_bytes();
        let old: [&[u8]; 2] = [&seq, b"p"];
        let new: [&[u8]; 3] = [b"t", &seq, b"p"];
        assert_eq!(split_replay_reply(&old).unwrap().seq, 3);
        assert_eq!(split_replay_reply(&new).unwrap().topic, b"t");
    }
}

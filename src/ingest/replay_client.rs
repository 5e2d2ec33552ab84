//! The replay DEALER: asks an engine's ROUTER for buffered batches from a seq on.
//!
//! Request `["", start_seq BE]`; replies `["", seq, payload]` or `["", topic, seq, payload]`
//! (both accepted), then an end marker with seq `u64::MAX`. Replay is best-effort (libzmq
//! ROUTERs drop past their high-water mark), so every step has a timeout and the result
//! must be contiguous from `from` through at least `need_through`.

use std::time::Duration;

use bytes::Bytes;
use zeromq::{DealerSocket, Socket, SocketOptions, SocketRecv, SocketSend, ZmqMessage};

use crate::metrics::ReplayFailure;
use crate::wire::{split_replay_reply, END_MARKER_SEQ};

/// Timeouts and limits of one replay.
#[derive(Debug, Clone, Copy)]
pub struct ReplayLimits {
    /// Connect (and send) timeout.
    pub connect: Duration,
    /// Timeout of every recv.
    pub recv: Duration,
    /// Most batches one replay may return (bounds memory).
    pub max_batches: usize,
}

impl Default for ReplayLimits {
    fn default() -> Self {
        ReplayLimits {
            connect: Duration::from_millis(500),
            recv: Duration::from_millis(500),
            max_batches: 100_000,
        }
    }
}

/// One replayed batch: its seq and the frames a live message would have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replayed {
    /// The batch's seq.
    pub seq: u64,
    /// `[topic, seq, payload]`, ready for the live decoder.
    pub frames: [Bytes; 3],
}

/// Requests batches `from..` and checks they are contiguous through `need_through`
/// (inclusive). Batches past `need_through` are kept too, in order.
///
/// # Errors
/// The [`ReplayFailure`] that made the replay unusable.
pub async fn replay(
    endpoint: &str,
    from: u64,
    need_through: u64,
    limits: ReplayLimits,
) -> Result<Vec<Replayed>, ReplayFailure> {
    let mut options = SocketOptions::default();
    options.connect_timeout(limits.connect);
    let mut socket = DealerSocket::with_options(options);
    match tokio::time::timeout(limits.connect, socket.connect(endpoint)).await {
        Ok(Ok(())) => {}
        _ => return Err(ReplayFailure::Connect),
    }
    let request = ZmqMessage::try_from(vec![
        Bytes::new(),
        Bytes::copy_from_slice(&from.to_be_bytes()),
    ])
    .map_err(|_| ReplayFailure::Malformed)?;
    match tokio::time::timeout(limits.connect, socket.send(request)).await {
        Ok(Ok(())) => {}
        _ => return Err(ReplayFailure::Connect),
    }
    let mut out: Vec<Replayed> = Vec::new();
    loop {
        let message = match tokio::time::timeout(limits.recv, socket.recv()).await {
            Ok(Ok(m)) => m,
            Ok(Err(_)) | Err(_) => return Err(ReplayFailure::Timeout),
        };
        let mut frames = message.into_vec();
        // The DEALER sees the ROUTER's empty delimiter first; tolerate its absence.
        if frames.first().is_some_and(Bytes::is_empty) && frames.len() >= 3 {
            frames.remove(0);
        }
        let (topic, seq, payload) = {
            let reply = split_replay_reply(&frames).map_err(|_| ReplayFailure::Malformed)?;
            (
                Bytes::copy_from_slice(reply.topic),
                reply.seq,
                Bytes::copy_from_slice(reply.payload),
            )
        };
        if seq == END_MARKER_SEQ {
            break;
        }
        let expected = out.last().map_or(from, |r| r.seq.saturating_add(1));
        if seq < expected {
            // A repeated reply: already have it.
            continue;
        }
        if seq != expected {
            return Err(ReplayFailure::Holes);
        }
        if out.len() >= limits.max_batches {
            return Err(ReplayFailure::TooLarge);
        }
        out.push(Replayed {
            seq,
            frames: [topic, Bytes::copy_from_slice(&seq.to_be_bytes()), payload],
        });
    }
    let reached = out.last().map(|r| r.seq);
    if need_through >= from && reached.is_none_or(|last| last < need_through) {
        return Err(ReplayFailure::Holes);
    }
    Ok(out)
}

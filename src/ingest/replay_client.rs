//! The replay DEALER: asks an engine's ROUTER for buffered batches from a seq on.
//!
//! Request `["", start_seq BE]`; replies `["", seq, payload]` or `["", topic, seq, payload]`
//! (both accepted), then an end marker with seq `u64::MAX`. Replay is best-effort (libzmq
//! ROUTERs drop past their high-water mark), so every step has a timeout and the result
//! must be contiguous from `from` through at least `need_through`.

use std::time::Duration;

use bytes::Bytes;
use tokio_util::sync::CancellationToken;
use zeromq::{DealerSocket, Socket, SocketOptions, SocketRecv, SocketSend, ZmqMessage};

use crate::wire::{split_replay_reply, END_MARKER_SEQ};

/// Why a replay gave no usable result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReplayError {
    /// Could not connect or send the request in time.
    #[error("could not connect to the replay endpoint or send the request in time")]
    Connect,
    /// A recv timed out (no end marker).
    #[error("a reply did not arrive in time (no end marker)")]
    Timeout,
    /// Seqs were missing (or the reply started after the wanted seq).
    #[error("the replayed seqs have holes")]
    Holes,
    /// A reply frame was malformed.
    #[error("a reply was malformed")]
    Malformed,
    /// More batches than the replay cap.
    #[error("the replay exceeded its batch cap")]
    TooLarge,
    /// The task was stopped while waiting: not a failure of the engine.
    #[error("the replay was cancelled")]
    Cancelled,
}

impl ReplayError {
    /// Metric label value.
    pub fn reason(self) -> &'static str {
        match self {
            ReplayError::Connect => "connect",
            ReplayError::Timeout => "timeout",
            ReplayError::Holes => "holes",
            ReplayError::Malformed => "malformed",
            ReplayError::TooLarge => "too_large",
            ReplayError::Cancelled => "cancelled",
        }
    }
}

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

/// [`replay`] that stops with [`ReplayError::Cancelled`] as soon as `cancel` fires.
///
/// # Errors
/// As [`replay`], plus [`ReplayError::Cancelled`].
pub async fn replay_or_cancel(
    endpoint: &str,
    from: u64,
    need_through: u64,
    limits: ReplayLimits,
    cancel: &CancellationToken,
) -> Result<Vec<Replayed>, ReplayError> {
    tokio::select! {
        biased;
        _ = cancel.cancelled() => Err(ReplayError::Cancelled),
        r = replay(endpoint, from, need_through, limits) => r,
    }
}

/// Requests batches `from..` and checks they are contiguous through `need_through`
/// (inclusive). Batches past `need_through` are kept too, in order.
///
/// # Errors
/// The [`ReplayError`] that made the replay unusable.
pub async fn replay(
    endpoint: &str,
    from: u64,
    need_through: u64,
    limits: ReplayLimits,
) -> Result<Vec<Replayed>, ReplayError> {
    let mut options = SocketOptions::default();
    options.connect_timeout(limits.connect);
    let mut socket = DealerSocket::with_options(options);
    match tokio::time::timeout(limits.connect, socket.connect(endpoint)).await {
        Ok(Ok(())) => {}
        _ => return Err(ReplayError::Connect),
    }
    let request = ZmqMessage::try_from(vec![
        Bytes::new(),
        Bytes::copy_from_slice(&from.to_be_bytes()),
    ])
    .map_err(|_| ReplayError::Malformed)?;
    match tokio::time::timeout(limits.connect, socket.send(request)).await {
        Ok(Ok(())) => {}
        _ => return Err(ReplayError::Connect),
    }
    let mut out: Vec<Replayed> = Vec::new();
    loop {
        let message = match tokio::time::timeout(limits.recv, socket.recv()).await {
            Ok(Ok(m)) => m,
            Ok(Err(_)) | Err(_) => return Err(ReplayError::Timeout),
        };
        let mut frames = message.into_vec();
        // The DEALER sees the ROUTER's empty delimiter first; tolerate its absence.
        if frames.first().is_some_and(Bytes::is_empty) && frames.len() >= 3 {
            frames.remove(0);
        }
        let (topic, seq, payload) = {
            let reply = split_replay_reply(&frames).map_err(|_| ReplayError::Malformed)?;
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
            return Err(ReplayError::Holes);
        }
        if out.len() >= limits.max_batches {
            return Err(ReplayError::TooLarge);
        }
        out.push(Replayed {
            seq,
            frames: [topic, Bytes::copy_from_slice(&seq.to_be_bytes()), payload],
        });
    }
    let reached = out.last().map(|r| r.seq);
    if need_through >= from && reached.is_none_or(|last| last < need_through) {
        return Err(ReplayError::Holes);
    }
    Ok(out)
}

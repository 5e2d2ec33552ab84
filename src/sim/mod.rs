//! Simulated engines on 127.0.0.1: what `kvindex demo` (and tests) publish to the daemon.
//!
//! A [`SimEngine`] is one engine pod as the daemon sees it: a ZeroMQ PUB socket per DP rank
//! on consecutive ports, and a replay ROUTER per DP rank that serves what that rank published
//! (a bounded buffer, as engines keep). It sends frames exactly as given, so the bundled
//! recordings of the engines' own encoders ([`bundled`]) go over the wire byte for byte.
//!
//! | file | job |
//! | --- | --- |
//! | `mod.rs` | [`SimEngine`]: bind, publish, drop on the wire, restart |
//! | `router.rs` | the replay ROUTER task of one rank |
//! | `bundled.rs` | [`bundled::Recording`]: fixtures compiled into the binary |

pub mod bundled;
mod router;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::task::JoinHandle;
use zeromq::{PubSocket, Socket, SocketSend, ZmqError, ZmqMessage};

/// Messages each rank keeps for replay (an engine's buffer is bounded too).
pub const REPLAY_BUFFER: usize = 10_000;
/// Attempts to re-bind a port a closed socket just released.
const REBIND_TRIES: u32 = 100;
/// Pause between re-bind attempts.
const REBIND_PAUSE: Duration = Duration::from_millis(20);

/// Why a simulated engine could not bind or send.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A port could not be bound.
    #[error("cannot bind tcp://127.0.0.1:{port}: {source}")]
    Bind {
        /// The port.
        port: u16,
        /// What ZeroMQ reported.
        #[source]
        source: ZmqError,
    },
    /// No run of consecutive free ports was found for the DP ranks.
    #[error("no run of {ranks} consecutive free ports on 127.0.0.1")]
    NoPortRun {
        /// DP ranks asked for.
        ranks: u16,
    },
    /// A message could not be sent.
    #[error("cannot publish on rank {rank}: {source}")]
    Send {
        /// The DP rank.
        rank: usize,
        /// What ZeroMQ reported.
        #[source]
        source: ZmqError,
    },
    /// The rank does not exist or its socket is closed.
    #[error("rank {rank} is not bound")]
    NoRank {
        /// The DP rank.
        rank: usize,
    },
    /// Frames that are not `[topic, 8-byte seq, payload]`.
    #[error("a published message needs [topic, 8-byte seq, payload] frames")]
    Frames,
}

/// What one rank published, oldest first, as `(seq, frames)`.
type Buffer = Arc<Mutex<VecDeque<(u64, Vec<Bytes>)>>>;

/// One DP rank: its PUB socket (closed while the engine is down), replay buffer and ROUTER.
struct Rank {
    publisher: Option<PubSocket>,
    buffer: Buffer,
    router: JoinHandle<()>,
}

/// One simulated engine pod: PUB ranks on `pub_port + r`, replay ROUTERs on
/// `replay_port + r`.
pub struct SimEngine {
    pub_port: u16,
    replay_port: u16,
    ranks: Vec<Rank>,
}

impl SimEngine {
    /// Binds `ranks` PUB sockets from `pub_port` and `ranks` replay ROUTERs from
    /// `replay_port` (each `0`: the first port is chosen by the OS, the rest follow it).
    ///
    /// # Errors
    /// [`SimError`] when a port is taken.
    pub async fn bind(ranks: u16, pub_port: u16, replay_port: u16) -> Result<SimEngine, SimError> {
        let ranks = ranks.max(1);
        let (publishers, pub_port) = bind_run(ranks, pub_port, PubSocket::new).await?;
        let (routers, replay_port) =
            bind_run(ranks, replay_port, zeromq::RouterSocket::new).await?;
        let ranks = publishers
            .into_iter()
            .zip(routers)
            .map(|(publisher, router)| {
                let buffer = Buffer::default();
                Rank {
                    publisher: Some(publisher),
                    router: tokio::spawn(router::serve(router, buffer.clone())),
                    buffer,
                }
            })
            .collect();
        Ok(SimEngine {
            pub_port,
            replay_port,
            ranks,
        })
    }

    /// PUB port of DP rank 0.
    pub fn pub_port(&self) -> u16 {
        self.pub_port
    }

    /// Replay port of DP rank 0.
    pub fn replay_port(&self) -> u16 {
        self.replay_port
    }

    /// DP ranks.
    pub fn ranks(&self) -> usize {
        self.ranks.len()
    }

    /// Keeps a message for replay and publishes it on `rank`.
    ///
    /// # Errors
    /// [`SimError`] for a bad rank, bad frames or a failed send.
    pub async fn publish(&mut self, rank: usize, frames: &[Vec<u8>]) -> Result<(), SimError> {
        let message = self.keep(rank, frames)?;
        let publisher = self
            .ranks
            .get_mut(rank)
            .and_then(|r| r.publisher.as_mut())
            .ok_or(SimError::NoRank { rank })?;
        let message = ZmqMessage::try_from(message).map_err(|_| SimError::Frames)?;
        publisher
            .send(message)
            .await
            .map_err(|source| SimError::Send { rank, source })
    }

    /// Keeps a message for replay without sending it: a message lost on the wire (the
    /// subscriber sees a gap and the replay endpoint has the message).
    ///
    /// # Errors
    /// [`SimError`] for a bad rank or bad frames.
    pub fn drop_on_wire(&mut self, rank: usize, frames: &[Vec<u8>]) -> Result<(), SimError> {
        self.keep(rank, frames).map(drop)
    }

    fn keep(&mut self, rank: usize, frames: &[Vec<u8>]) -> Result<Vec<Bytes>, SimError> {
        let [_, seq, _] = frames else {
            return Err(SimError::Frames);
        };
        let seq = kvindex::wire::read_seq(seq).map_err(|_| SimError::Frames)?;
        let buffer = &self
            .ranks
            .get(rank)
            .ok_or(SimError::NoRank { rank })?
            .buffer;
        let message: Vec<Bytes> = frames.iter().map(|f| Bytes::copy_from_slice(f)).collect();
        let mut buffer = buffer.lock();
        if buffer.len() >= REPLAY_BUFFER {
            buffer.pop_front();
        }
        buffer.push_back((seq, message.clone()));
        Ok(message)
    }

    /// Stops the engine's PUB sockets (subscribers see the peer go away) and forgets the
    /// replay buffers: the process died. [`SimEngine::start_again`] brings it back.
    pub async fn stop(&mut self) {
        for rank in &mut self.ranks {
            if let Some(publisher) = rank.publisher.take() {
                let _ = publisher.close().await;
            }
            rank.buffer.lock().clear();
        }
    }

    /// Binds the PUB sockets again on the same ports (a restarted engine, whose seq starts
    /// over at 0).
    ///
    /// # Errors
    /// [`SimError::Bind`] when a port stays taken.
    pub async fn start_again(&mut self) -> Result<(), SimError> {
        for (r, rank) in self.ranks.iter_mut().enumerate() {
            if rank.publisher.is_some() {
                continue;
            }
            let port = self.pub_port.saturating_add(r as u16);
            rank.publisher = Some(rebind(port).await?);
        }
        Ok(())
    }

    /// Closes every socket.
    pub async fn close(mut self) {
        self.stop().await;
        for rank in self.ranks {
            rank.router.abort();
        }
    }
}

/// Binds a PUB socket on a port a closed socket may still hold for a moment.
async fn rebind(port: u16) -> Result<PubSocket, SimError> {
    let mut tries = 0;
    loop {
        let mut socket = PubSocket::new();
        match socket.bind(&endpoint(port)).await {
            Ok(_) => return Ok(socket),
            Err(_) if tries < REBIND_TRIES => {
                tries += 1;
                tokio::time::sleep(REBIND_PAUSE).await;
            }
            Err(source) => return Err(SimError::Bind { port, source }),
        }
    }
}

fn endpoint(port: u16) -> String {
    format!("tcp://127.0.0.1:{port}")
}

/// Binds `n` sockets on consecutive ports from `first` (`0`: the OS picks the first, and the
/// run is retried until the following ports are free too).
async fn bind_run<S: Socket>(
    n: u16,
    first: u16,
    new: fn() -> S,
) -> Result<(Vec<S>, u16), SimError> {
    let tries = if first == 0 { 100 } else { 1 };
    for _ in 0..tries {
        let mut sockets = Vec::new();
        let mut socket = new();
        let bound = socket
            .bind(&endpoint(first))
            .await
            .map_err(|source| SimError::Bind {
                port: first,
                source,
            })?;
        let zeromq::Endpoint::Tcp(_, port) = bound else {
            return Err(SimError::NoPortRun { ranks: n });
        };
        sockets.push(socket);
        for r in 1..n {
            let Some(next) = port.checked_add(r) else {
                break;
            };
            let mut socket = new();
            match socket.bind(&endpoint(next)).await {
                Ok(_) => sockets.push(socket),
                Err(source) if first != 0 => return Err(SimError::Bind { port: next, source }),
                Err(_) => break,
            }
        }
        if sockets.len() == usize::from(n) {
            return Ok((sockets, port));
        }
        for s in sockets {
            let _ = s.close().await;
        }
    }
    Err(SimError::NoPortRun { ranks: n })
}

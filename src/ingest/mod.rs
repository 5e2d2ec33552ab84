//! Getting engine messages into the index: recorded fixtures and live ZMQ subscribers.
//!
//! | file | job |
//! | --- | --- |
//! | `fixture.rs` | the fixture line format: read and write recorded messages |
//! | `seq.rs` | [`SeqTracker`]: in order, gap, duplicate, restart — pure |
//! | `pipeline.rs` | [`SourcePipeline`]: frames → seq tracking → index for one source, pure; [`Observer`]: counters, metrics and logs in one place |
//! | `stats.rs` | [`IngestStats`] counters |
//! | `mirror_sink.rs` | [`MirrorSink`]: a message's deltas to a mirror in bounded chunks, clears whole |
//! | `offline.rs` | [`OfflineReplay`], [`replay_files`]: recorded streams through the same path; [`Recording`]: files read and decoded ahead on a thread of their own |
//! | `failure_log.rs` | `FailureLog`: which connect failures are logged at WARN (first, then rate-limited) |
//! | `subscriber.rs` | one SUB socket + task per (target, DP rank): connect loop, recv, replay I/O |
//! | `replay_client.rs` | the replay DEALER: request, both reply shapes, contiguity |
//! | `supervisor/` | the target set: start, stop, restart and forget targets; `PodsView` |
//! | `status.rs` | [`PodStatus`] and [`PodsView`]: what `GET /v1/pods` reads from ingest |
//! | `discovery/` | targets from the Kubernetes API (pods → targets, restarts by identity) |
//!
//! [`Target`] and [`TcpEndpoint`] (one engine pod to subscribe to) are settings vocabulary:
//! defined below `config`, which fills them in, and public here.

pub mod discovery;
mod failure_log;
pub mod fixture;
mod mirror_sink;
mod offline;
mod pipeline;
pub mod replay_client;
mod seq;
mod stats;
mod status;
pub mod subscriber;
pub mod supervisor;

pub use crate::settings::target::{Target, TcpEndpoint, DEFAULT_MAX_FRAME_BYTES, MAX_DP_RANKS};
pub(crate) use failure_log::WARN_EVERY;
pub use mirror_sink::{MirrorSink, CHUNK_DELTAS};
pub use offline::{replay_files, OfflineError, OfflineReplay, Recording};
pub use pipeline::{Decoded, Observer, Outcome, SourcePipeline};
pub use seq::{SeqDecision, SeqTracker};
pub use stats::IngestStats;
pub use status::{PodCounters, PodStatus, PodsView};

/// The current unix second, the store time recorded in the index.
pub fn unix_now() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs().min(u64::from(u32::MAX)) as u32)
}

//! Getting engine messages into the index: recorded fixtures now, ZMQ subscribers (issue 4).
//!
//! | file | job |
//! | --- | --- |
//! | `fixture.rs` | the fixture line format: read and write recorded messages |
//! | `seq.rs` | [`SeqTracker`]: in order, gap, duplicate, restart — pure |
//! | `feed.rs` | [`SourceFeed`]: frames → seq tracking → index for one source |
//! | `stats.rs` | [`IngestStats`] counters |
//! | `offline.rs` | [`OfflineReplay`]: recorded streams through the same path |

mod feed;
pub mod fixture;
mod offline;
mod seq;
mod stats;

pub use feed::{FeedOutcome, SourceFeed};
pub use offline::OfflineReplay;
pub use seq::{SeqDecision, SeqTracker};
pub use stats::IngestStats;

/// The current unix second, the store time recorded in the index.
pub fn unix_now() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs().min(u64::from(u32::MAX)) as u32)
}

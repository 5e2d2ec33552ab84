//! Replaying recorded streams through the live ingest path (same seq tracking per
//! endpoint index / DP rank), for `kvindex replay` and tests.

use std::collections::BTreeMap;

use tracing::warn;

use crate::index::{DeltaSink, Index, IndexError, SourceSpec};
use crate::wire::Engine;

use super::feed::{FeedOutcome, SourceFeed};
use super::fixture::RecordedMessage;
use super::stats::IngestStats;

/// Feeds recorded messages of one pod into an index.
pub struct OfflineReplay {
    index: Index,
    pod: String,
    model: String,
    engine: Engine,
    feeds: BTreeMap<u32, SourceFeed>,
    stats: IngestStats,
    file: String,
}

impl OfflineReplay {
    /// A replay of pod `pod` (`{pod}.{namespace}`) serving `model`.
    pub fn new(index: Index, pod: &str, model: &str, engine: Engine) -> OfflineReplay {
        OfflineReplay {
            index,
            pod: pod.to_owned(),
            model: model.to_owned(),
            engine,
            feeds: BTreeMap::new(),
            stats: IngestStats::default(),
            file: String::new(),
        }
    }

    /// Starts the next recording: like a reconnect, so a seq that goes back is a restart.
    pub fn start_file(&mut self, name: &str) {
        self.file = name.to_owned();
        for feed in self.feeds.values_mut() {
            feed.tracker.reconnected();
        }
    }

    /// Counts a line of the file that was not a fixture object.
    pub fn count_bad_line(&mut self) {
        self.stats.messages += 1;
        *self
            .stats
            .decode_errors
            .entry("bad_fixture_line")
            .or_default() += 1;
    }

    /// Applies one recorded message; bad input is logged and counted, never fatal.
    ///
    /// # Errors
    /// [`IndexError`] only when the index refuses the source (too many pods).
    pub fn offer(
        &mut self,
        message: &RecordedMessage,
        now: u32,
        sink: &mut impl DeltaSink,
    ) -> Result<FeedOutcome, IndexError> {
        let rank = u8::try_from(message.endpoint_index).unwrap_or(u8::MAX);
        let feed = match self.feeds.get_mut(&message.endpoint_index) {
            Some(feed) => feed,
            None => {
                let source = self.index.register_source(&SourceSpec {
                    pod: self.pod.clone(),
                    model: self.model.clone(),
                    engine: self.engine,
                    dp_rank: rank,
                })?;
                self.feeds
                    .entry(message.endpoint_index)
                    .or_insert_with(|| SourceFeed::new(source))
            }
        };
        let outcome = feed.offer(&self.index, &message.frames, now, sink, &mut self.stats)?;
        if let FeedOutcome::Rejected(err) = &outcome {
            warn!(
                file = %self.file,
                line = message.line,
                endpoint_index = message.endpoint_index,
                pod = %self.pod,
                reason = err.reason(),
                "Rejected a recorded message: {err}."
            );
        }
        Ok(outcome)
    }

    /// Counters so far.
    pub fn stats(&self) -> &IngestStats {
        &self.stats
    }

    /// The index being filled.
    pub fn index(&self) -> &Index {
        &self.index
    }
}

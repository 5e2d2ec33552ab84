//! Replaying recorded streams through the live ingest path ([`SourcePipeline`], one per
//! endpoint index / DP rank), for `kvindex replay`, `kvindex score --replay` and tests.

use std::collections::BTreeMap;
use std::path::PathBuf;

use tracing::Instrument;

use crate::index::{DeltaMirror, DeltaSink, Discard, Index, IndexError, SourceSpec};
use crate::wire::Engine;

use super::fixture::{self, FixtureError, RecordedMessage};
use super::mirror_sink::MirrorSink;
use super::pipeline::{Observer, Outcome, SourcePipeline};
use super::stats::IngestStats;
use super::unix_now;

/// Why an offline replay stopped.
#[derive(Debug, thiserror::Error)]
pub enum OfflineError {
    /// A file could not be read.
    #[error(transparent)]
    Fixture(#[from] FixtureError),
    /// A line names an endpoint index that is no DP rank (ranks are 0..=255).
    #[error("line {line}: endpoint_index {endpoint_index} is out of range (DP ranks are 0..=255)")]
    EndpointIndex {
        /// 1-based line number.
        line: usize,
        /// The index given.
        endpoint_index: u32,
    },
    /// The index refused the source (too many pods).
    #[error(transparent)]
    Index(#[from] IndexError),
}

/// One recorded file, read whole: its path and every line, good or bad.
pub type LoadedFile = (PathBuf, Vec<Result<RecordedMessage, FixtureError>>);

/// Reads every file up front (so a caller can size a progress bar).
///
/// # Errors
/// [`FixtureError::Io`] when a file cannot be read.
pub fn load_files(files: &[PathBuf]) -> Result<Vec<LoadedFile>, FixtureError> {
    files
        .iter()
        .map(|f| Ok((f.clone(), fixture::read_file(f)?)))
        .collect()
}

/// Replays `files`, in order, as the history of pod `pod` serving `model`, into `index`
/// (no mirror): the library form of `kvindex replay`.
///
/// # Errors
/// [`OfflineError`]: an unreadable file, an out-of-range endpoint index, a refused source.
pub fn replay_files(
    index: Index,
    pod: &str,
    model: &str,
    engine: Engine,
    files: &[PathBuf],
) -> Result<OfflineReplay, OfflineError> {
    let mut replay = OfflineReplay::new(index, pod, model, engine);
    for file in &load_files(files)? {
        replay.replay_loaded(file, &mut Discard, || {})?;
    }
    Ok(replay)
}

/// Feeds recorded messages of one pod into an index.
pub struct OfflineReplay {
    index: Index,
    pod: String,
    model: String,
    engine: Engine,
    pipelines: BTreeMap<u8, SourcePipeline>,
    observer: Observer,
}

impl OfflineReplay {
    /// A replay of pod `pod` (`{pod}.{namespace}`) serving `model`.
    pub fn new(index: Index, pod: &str, model: &str, engine: Engine) -> OfflineReplay {
        OfflineReplay {
            index,
            pod: pod.to_owned(),
            model: model.to_owned(),
            engine,
            pipelines: BTreeMap::new(),
            observer: Observer::new(engine),
        }
    }

    /// Starts the next recording: like a reconnect, so a seq that goes back is a restart.
    pub fn start_file(&mut self) {
        for pipeline in self.pipelines.values_mut() {
            pipeline.reconnected();
        }
    }

    /// Replays one loaded file (a new recording: see [`OfflineReplay::start_file`]), calling
    /// `tick` once per line; bad lines and bad messages are logged and counted, never fatal.
    ///
    /// # Errors
    /// As [`OfflineReplay::offer`].
    pub fn replay_loaded(
        &mut self,
        (path, lines): &LoadedFile,
        sink: &mut impl DeltaSink,
        mut tick: impl FnMut(),
    ) -> Result<(), OfflineError> {
        let span = tracing::info_span!("replay", file = %path.display(), pod = %self.pod);
        let _entered = span.enter();
        self.start_file();
        for line in lines {
            tick();
            self.offer_line(line, sink)?;
        }
        Ok(())
    }

    /// [`OfflineReplay::replay_loaded`] handing each message's deltas to `mirror` (which may
    /// hold the replay back: backpressure).
    ///
    /// # Errors
    /// As [`OfflineReplay::offer`].
    pub async fn replay_loaded_mirrored(
        &mut self,
        (path, lines): &LoadedFile,
        mirror: &dyn DeltaMirror,
        mut tick: impl FnMut(),
    ) -> Result<(), OfflineError> {
        let span = tracing::info_span!("replay", file = %path.display(), pod = %self.pod);
        async {
            self.start_file();
            for line in lines {
                tick();
                let mut deltas = MirrorSink::new();
                self.offer_line(line, &mut deltas)?;
                deltas.hand_over(mirror, None).await;
            }
            Ok(())
        }
        .instrument(span)
        .await
    }

    fn offer_line(
        &mut self,
        line: &Result<RecordedMessage, FixtureError>,
        sink: &mut impl DeltaSink,
    ) -> Result<(), OfflineError> {
        match line {
            Ok(message) => self.offer(message, unix_now(), sink).map(drop),
            Err(err) => {
                self.count_bad_line(err);
                Ok(())
            }
        }
    }

    /// Counts (and logs) a line of the file that was not a fixture object.
    pub fn count_bad_line(&mut self, err: &FixtureError) {
        self.observer.bad_line(err);
    }

    /// Applies one recorded message; bad input is logged and counted, never fatal.
    ///
    /// # Errors
    /// [`OfflineError::EndpointIndex`] for an endpoint index above 255 (it would name no DP
    /// rank), [`OfflineError::Index`] when the index refuses the source (too many pods).
    pub fn offer(
        &mut self,
        message: &RecordedMessage,
        now: u32,
        sink: &mut impl DeltaSink,
    ) -> Result<Outcome, OfflineError> {
        let rank =
            u8::try_from(message.endpoint_index).map_err(|_| OfflineError::EndpointIndex {
                line: message.line,
                endpoint_index: message.endpoint_index,
            })?;
        let pipeline = match self.pipelines.get_mut(&rank) {
            Some(pipeline) => pipeline,
            None => {
                let source = self.index.register_source(&SourceSpec {
                    pod: self.pod.clone(),
                    model: self.model.clone(),
                    engine: self.engine,
                    dp_rank: rank,
                })?;
                // Recordings have no replay endpoint: a gap resets the source.
                self.pipelines
                    .entry(rank)
                    .or_insert_with(|| SourcePipeline::new(source, false))
            }
        };
        self.observer.set_line(Some(message.line));
        let outcome = pipeline.offer(&self.index, &message.frames, now, sink, &mut self.observer);
        self.observer.set_line(None);
        Ok(outcome?)
    }

    /// Counters so far.
    pub fn stats(&self) -> &IngestStats {
        self.observer.stats()
    }

    /// The index being filled.
    pub fn index(&self) -> &Index {
        &self.index
    }
}

//! Replaying recorded streams through the live ingest path ([`SourcePipeline`], one per
//! endpoint index / DP rank), for `kvindex replay`, `kvindex score --replay` and tests.

use std::collections::BTreeMap;
use std::path::PathBuf;

use std::io::BufRead;

use futures::channel::mpsc;
use futures::executor::block_on;
use futures::{SinkExt, StreamExt};

use crate::index::{DeltaMirror, DeltaSink, Discard, Index, IndexError, SourceSpec};
use crate::settings::target::DEFAULT_MAX_FRAME_BYTES;
use crate::wire::Engine;

use super::fixture::{self, FixtureError, RecordedMessage};
use super::mirror_sink::MirrorSink;
use super::pipeline::{Decoded, Observer, Outcome, SourcePipeline};
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

/// Messages the reader thread hands over at a time.
const READ_CHUNK: usize = 256;
/// Chunks queued between the reader and the index (the channel keeps one more, and the
/// reader fills another): what bounds a replay's memory, whatever the size of its files.
const READ_AHEAD_CHUNKS: usize = 8;

/// Recorded files being read, parsed and decoded in order on a thread of their own, a
/// bounded distance ahead of the index: a replay's file reading, JSON, base64 and msgpack
/// run beside its index work instead of before it.
pub struct Recording {
    chunks: mpsc::Receiver<Vec<ReadAhead>>,
    bytes: u64,
}

/// What the reader thread hands over, in file order.
enum ReadAhead {
    /// The next file begins (a new recording: like a reconnect).
    File(PathBuf),
    /// One non-blank line and its length in bytes.
    Line(Result<DecodedLine, FixtureError>, u64),
}

/// A recorded line, decoded.
struct DecodedLine {
    line: usize,
    endpoint_index: u32,
    decoded: Decoded,
}

impl DecodedLine {
    /// `message` decoded under the default frame cap (a recording's pipelines keep it).
    fn of(message: &RecordedMessage) -> DecodedLine {
        DecodedLine {
            line: message.line,
            endpoint_index: message.endpoint_index,
            decoded: Decoded::of(&message.frames, DEFAULT_MAX_FRAME_BYTES),
        }
    }
}

impl Recording {
    /// Opens every file first (so a missing one fails before anything is applied), then
    /// starts reading them in order.
    ///
    /// # Errors
    /// [`FixtureError::Io`] when a file cannot be opened.
    pub fn open(files: &[PathBuf]) -> Result<Recording, FixtureError> {
        let mut opened = Vec::with_capacity(files.len());
        let mut bytes = 0;
        for path in files {
            let file = std::fs::File::open(path).map_err(|source| io_error(path, source))?;
            bytes += file.metadata().map_or(0, |m| m.len());
            opened.push((path.clone(), file));
        }
        let (tx, chunks) = mpsc::channel(READ_AHEAD_CHUNKS);
        let reader = std::thread::Builder::new()
            .name("replay-reader".into())
            .spawn(move || read_ahead(opened, tx));
        if let Err(source) = reader {
            let path = files.first().cloned().unwrap_or_default();
            return Err(io_error(&path, source));
        }
        Ok(Recording { chunks, bytes })
    }

    /// The files' total size in bytes (what a progress bar counts).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The next chunk, waiting for the reader; `None` once every file is read.
    async fn next_chunk(&mut self) -> Option<Vec<ReadAhead>> {
        self.chunks.next().await
    }
}

fn io_error(path: &std::path::Path, source: std::io::Error) -> FixtureError {
    FixtureError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// The reader thread: every file's lines, parsed and decoded, in chunks. Stops at the first
/// read error (handed over last) or when the replay stops taking chunks.
fn read_ahead(files: Vec<(PathBuf, std::fs::File)>, mut tx: mpsc::Sender<Vec<ReadAhead>>) {
    let mut chunk = vec![];
    for (path, file) in files {
        chunk.push(ReadAhead::File(path.clone()));
        let mut reader = std::io::BufReader::new(file);
        let mut bytes = Vec::new();
        let mut number = 0;
        loop {
            bytes.clear();
            match reader.read_until(b'\n', &mut bytes) {
                Ok(0) => break,
                Ok(_) => number += 1,
                Err(source) => {
                    chunk.push(ReadAhead::Line(Err(io_error(&path, source)), 0));
                    let _ = block_on(tx.send(chunk));
                    return;
                }
            }
            if let Some(line) = fixture::parse_bytes(number, &bytes) {
                let line = line.map(|message| DecodedLine::of(&message));
                chunk.push(ReadAhead::Line(line, bytes.len() as u64));
            }
            if chunk.len() >= READ_CHUNK && block_on(tx.send(std::mem::take(&mut chunk))).is_err() {
                return;
            }
        }
    }
    if !chunk.is_empty() {
        let _ = block_on(tx.send(chunk));
    }
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
    replay.replay(Recording::open(files)?, &mut Discard, |_| {})?;
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
    /// The file being replayed, named in what its lines log.
    span: tracing::Span,
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
            span: tracing::Span::none(),
        }
    }

    /// Starts the next recording: like a reconnect, so a seq that goes back is a restart.
    pub fn start_file(&mut self) {
        for pipeline in self.pipelines.values_mut() {
            pipeline.reconnected();
        }
    }

    /// Replays every file of `recording` (each a new recording: see
    /// [`OfflineReplay::start_file`]), handing deltas to `sink` and each line's bytes to
    /// `progress`; bad lines and bad messages are logged and counted, never fatal.
    ///
    /// # Errors
    /// A file that cannot be read, or as [`OfflineReplay::offer`].
    pub fn replay(
        &mut self,
        mut recording: Recording,
        sink: &mut impl DeltaSink,
        mut progress: impl FnMut(u64),
    ) -> Result<(), OfflineError> {
        while let Some(chunk) = block_on(recording.next_chunk()) {
            for item in chunk {
                if let Some(line) = self.take(item)? {
                    progress(line.1);
                    self.offer_read(line.0, sink)?;
                }
            }
        }
        Ok(())
    }

    /// [`OfflineReplay::replay`] handing each message's deltas to `mirror` (which may hold
    /// the replay back: backpressure).
    ///
    /// # Errors
    /// As [`OfflineReplay::replay`].
    pub async fn replay_mirrored(
        &mut self,
        mut recording: Recording,
        mirror: &dyn DeltaMirror,
        mut progress: impl FnMut(u64),
    ) -> Result<(), OfflineError> {
        while let Some(chunk) = recording.next_chunk().await {
            for item in chunk {
                if let Some(line) = self.take(item)? {
                    progress(line.1);
                    let mut deltas = MirrorSink::new();
                    self.offer_read(line.0, &mut deltas)?;
                    deltas.hand_over(mirror, None).await;
                }
            }
        }
        Ok(())
    }

    /// Handles what the reader handed over but a line to offer: a new file starts, a bad
    /// line is counted, a read error ends the replay.
    fn take(&mut self, item: ReadAhead) -> Result<Option<(DecodedLine, u64)>, OfflineError> {
        match item {
            ReadAhead::File(path) => {
                self.span = tracing::info_span!("replay", file = %path.display(), pod = %self.pod);
                self.start_file();
                Ok(None)
            }
            ReadAhead::Line(Ok(line), bytes) => Ok(Some((line, bytes))),
            ReadAhead::Line(Err(err @ FixtureError::Io { .. }), _) => Err(err.into()),
            ReadAhead::Line(Err(err), _) => {
                self.count_bad_line(&err);
                Ok(None)
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
        self.apply(DecodedLine::of(message), now, sink)
    }

    /// Applies a line the reader decoded, stored now, in its file's span.
    fn offer_read(
        &mut self,
        line: DecodedLine,
        sink: &mut impl DeltaSink,
    ) -> Result<(), OfflineError> {
        let span = self.span.clone();
        span.in_scope(|| self.apply(line, unix_now(), sink).map(drop))
    }

    /// Sends a decoded line through its DP rank's pipeline.
    fn apply(
        &mut self,
        message: DecodedLine,
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
        let outcome =
            pipeline.offer_decoded(&self.index, message.decoded, now, sink, &mut self.observer);
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

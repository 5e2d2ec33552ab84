//! `kvindex replay FILE…`: recorded streams through the live ingest path into the index.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;

use super::EngineArg;
use kvindex::index::{Discard, Index, IndexStats};
use kvindex::ingest::{IngestStats, OfflineReplay, Recording};
use kvindex::medium::TierWeights;
use kvindex::store::redis::{MirrorHandle, MirrorStats, RedisConfig, RedisTarget, ValueFormat};

/// Recordings smaller than this replay without a progress bar.
const PROGRESS_MIN_BYTES: u64 = 8 << 20;
/// How long the end of a replay waits for Redis to take the last writes.
const REDIS_DRAIN_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

/// Arguments of `kvindex replay`.
#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    /// Recorded streams (fixture JSON lines), applied in order as one pod's history.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Pod identifier as written to Redis: `{pod}.{namespace}`.
    #[arg(long, default_value = "replay-0.default")]
    pub pod: String,
    /// Served model name of the pod.
    #[arg(long, default_value = "default-model")]
    pub model: String,
    /// Engine of the streams (`auto` guesses from the first file's name).
    #[arg(long, value_enum, default_value_t = EngineArg::Auto)]
    pub engine: EngineArg,
    /// Write the resulting index in canonical sorted JSON to this file.
    #[arg(long)]
    pub dump: Option<PathBuf>,
    /// Print the summary as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also mirror into Redis at this URL (`redis://[user:pass@]host:port/db`, `rediss://…`)
    /// and wait until everything is written.
    #[arg(long, conflicts_with = "redis_cluster")]
    pub redis: Option<String>,
    /// Mirror into a Redis Cluster instead, through these seed node URLs (comma-separated).
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub redis_cluster: Vec<String>,
    /// Field value format in Redis: `tiered` (`ts|MEDIUM`) or `timestamp` (bare `ts`, for
    /// kthena routers that predate tier support).
    #[arg(long, value_enum, default_value_t = ValueFormatArg::Tiered)]
    pub value_format: ValueFormatArg,
    /// Do not write the engine-hash mapping keys.
    #[arg(long)]
    pub no_mapping_keys: bool,
}

impl ReplayArgs {
    /// The Redis to mirror into: `--redis` or `--redis-cluster`, if either was given.
    pub fn redis_target(&self) -> Option<RedisTarget> {
        match (&self.redis, self.redis_cluster.is_empty()) {
            (Some(url), _) => Some(RedisTarget::Single(url.clone())),
            (None, false) => Some(RedisTarget::Cluster(self.redis_cluster.clone())),
            (None, true) => None,
        }
    }
}

/// `--value-format`: the CLI's spelling of the store's [`ValueFormat`], kept at the edge so
/// the store does not depend on clap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ValueFormatArg {
    /// `ts|MEDIUM` when a medium is known, bare `ts` otherwise.
    Tiered,
    /// Always a bare `ts`.
    Timestamp,
}

impl From<ValueFormatArg> for ValueFormat {
    fn from(arg: ValueFormatArg) -> ValueFormat {
        match arg {
            ValueFormatArg::Tiered => ValueFormat::Tiered,
            ValueFormatArg::Timestamp => ValueFormat::Timestamp,
        }
    }
}

/// What a replay did, printed at the end.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ReplaySummary {
    /// Files replayed.
    pub files: usize,
    /// Ingest counters.
    pub ingest: IngestStats,
    /// Index size figures afterwards.
    pub index: IndexStats,
    /// Wall time of the replay.
    pub elapsed_ms: u128,
    /// Redis mirror figures, when `--redis` was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis: Option<MirrorStats>,
}

impl ReplaySummary {
    /// The summary as an aligned two-column table.
    pub fn render_table(&self) -> String {
        let i = &self.ingest;
        let mut rows: Vec<(String, String)> = vec![
            ("files".into(), self.files.to_string()),
            ("messages".into(), i.messages.to_string()),
            ("batches".into(), i.batches.to_string()),
            (
                "empty batches (heartbeats)".into(),
                i.empty_batches.to_string(),
            ),
            (
                "events BlockStored".into(),
                i.block_stored_events.to_string(),
            ),
            (
                "events BlockRemoved".into(),
                i.block_removed_events.to_string(),
            ),
            (
                "events AllBlocksCleared".into(),
                i.all_blocks_cleared_events.to_string(),
            ),
            ("blocks stored".into(), i.apply.blocks_stored.to_string()),
            ("blocks removed".into(), i.apply.blocks_removed.to_string()),
        ];
        let total_errors: u64 = i.decode_errors.values().sum();
        rows.push(("decode errors".into(), total_errors.to_string()));
        rows.extend(
            i.decode_errors
                .iter()
                .map(|(k, v)| (format!("  {k}"), v.to_string())),
        );
        let skipped: u64 =
            i.unknown_tags.values().sum::<u64>() + i.invalid_events.values().sum::<u64>();
        rows.push(("skipped events".into(), skipped.to_string()));
        rows.extend(
            i.unknown_tags
                .iter()
                .map(|(k, v)| (format!("  unknown tag {k}"), v.to_string())),
        );
        rows.extend(
            i.invalid_events
                .iter()
                .map(|(k, v)| (format!("  invalid {k}"), v.to_string())),
        );
        rows.extend([
            (
                "skipped non-main group blocks".into(),
                i.apply.skipped_group_blocks.to_string(),
            ),
            (
                "unresolved tokenless stores".into(),
                i.apply.unresolved_stores.to_string(),
            ),
            (
                "removes of unknown hashes".into(),
                i.apply.unknown_removes.to_string(),
            ),
            (
                "duplicate engine hashes".into(),
                i.apply.duplicate_engine_hashes.to_string(),
            ),
            ("seq gaps".into(), i.seq_gaps.to_string()),
            ("source resets".into(), i.source_resets.to_string()),
            ("restarts detected".into(), i.restarts.to_string()),
            ("duplicates dropped".into(), i.duplicates.to_string()),
            ("resident blocks".into(), self.index.blocks.to_string()),
            (
                "resident (block, pod) entries".into(),
                self.index.entries.to_string(),
            ),
        ]);
        rows.extend(self.index.entries_by_medium.iter().map(|(m, n)| {
            let name = if m.is_empty() { "(none)" } else { m.as_str() };
            (format!("  on {name}"), n.to_string())
        }));
        rows.push((
            "index memory (estimate)".into(),
            format!("{} bytes", self.index.heap_bytes),
        ));
        if let Some(r) = &self.redis {
            rows.extend([
                ("redis commands".into(), r.commands.to_string()),
                ("redis pipelines".into(), r.pipelines.to_string()),
                ("redis flush p50".into(), format!("{} us", r.flush_p50_us)),
                ("redis flush p99".into(), format!("{} us", r.flush_p99_us)),
            ]);
        }
        rows.push(("elapsed".into(), format!("{} ms", self.elapsed_ms)));
        let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        rows.iter()
            .map(|(k, v)| format!("{k:<width$}  {v}\n"))
            .collect()
    }
}

/// Replays every file into a fresh in-memory index; returns the index and the summary.
///
/// # Errors
/// When a file cannot be read or the dump cannot be written.
pub fn replay_into_index(args: &ReplayArgs) -> anyhow::Result<(Index, ReplaySummary)> {
    let started = Instant::now();
    let engine = args.engine.resolve(&args.files[0]);
    let mut replay = OfflineReplay::new(Index::new(), &args.pod, &args.model, engine);
    let (recording, progress) = open(args)?;
    replay.replay(recording, &mut Discard, |bytes| progress.inc(bytes))?;
    progress.finish_and_clear();
    finish(args, &replay, started, None)
}

/// Replays every file into a fresh index and mirrors it into Redis (`args.redis`), waiting
/// until the mirror has written everything.
///
/// # Errors
/// When a file cannot be read, the mirror cannot start, or the dump cannot be written.
pub async fn replay_into_redis(args: &ReplayArgs) -> anyhow::Result<(Index, ReplaySummary)> {
    let target = args
        .redis_target()
        .context("replay into Redis needs --redis URL or --redis-cluster URL,…")?;
    let started = Instant::now();
    let engine = args.engine.resolve(&args.files[0]);
    let index = Index::new();
    let config = RedisConfig {
        target,
        value_format: args.value_format.into(),
        mapping_keys: !args.no_mapping_keys,
        // A replay's index is not the live pods' truth: it must never delete their fields.
        verify: false,
        ..RedisConfig::default()
    };
    let mirror = MirrorHandle::start(config, index.clone(), TierWeights::default()).await?;
    let sender = mirror.sender();
    let mut replay = OfflineReplay::new(index.clone(), &args.pod, &args.model, engine);
    let (recording, progress) = open(args)?;
    replay
        .replay_mirrored(recording, &sender, |bytes| progress.inc(bytes))
        .await?;
    progress.finish_and_clear();
    tokio::time::timeout(REDIS_DRAIN_DEADLINE, mirror.flush())
        .await
        .context("Redis did not take the last writes in time")??;
    let stats = mirror.stats();
    mirror.shutdown(REDIS_DRAIN_DEADLINE).await;
    finish(args, &replay, started, Some(stats))
}

/// The files, opened and being read, with a progress bar sized to their bytes.
fn open(args: &ReplayArgs) -> anyhow::Result<(Recording, indicatif::ProgressBar)> {
    let recording = Recording::open(&args.files)?;
    let bar = progress_bar(recording.bytes());
    Ok((recording, bar))
}

/// Builds the summary (and writes the dump when asked) once every file was replayed.
fn finish(
    args: &ReplayArgs,
    replay: &OfflineReplay,
    started: Instant,
    redis: Option<MirrorStats>,
) -> anyhow::Result<(Index, ReplaySummary)> {
    let index = replay.index().clone();
    let summary = ReplaySummary {
        files: args.files.len(),
        ingest: replay.stats().clone(),
        index: index.stats(),
        elapsed_ms: started.elapsed().as_millis(),
        redis,
    };
    if let Some(path) = &args.dump {
        write_dump(&index, path)?;
    }
    Ok((index, summary))
}

/// Writes the canonical index dump.
///
/// # Errors
/// When the file cannot be written.
pub fn write_dump(index: &Index, path: &std::path::Path) -> anyhow::Result<()> {
    let json = serde_json::to_string_pretty(&index.dump())?;
    std::fs::write(path, json + "\n").with_context(|| format!("cannot write {}", path.display()))
}

fn progress_bar(total_bytes: u64) -> indicatif::ProgressBar {
    // Only worth drawing for long inputs, and never into a pipe.
    if total_bytes < PROGRESS_MIN_BYTES || !std::io::stdout().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total_bytes);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{bar:40} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec}",
    ) {
        bar.set_style(style);
    }
    bar
}

/// Runs the command.
///
/// # Errors
/// When a file cannot be read or the dump cannot be written.
pub async fn run(args: ReplayArgs) -> anyhow::Result<()> {
    let (_, summary) = if args.redis_target().is_some() {
        replay_into_redis(&args).await?
    } else {
        replay_into_index(&args)?
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print!("{}", summary.render_table());
    }
    Ok(())
}

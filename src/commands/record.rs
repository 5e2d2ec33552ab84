//! `kvindex record`: live engine frames → fixture lines (`schemas/fixture-line.schema.json`).

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use zeromq::{Socket, SocketOptions, SocketRecv, SubSocket};

use kvindex::ingest::fixture::format_line;
use kvindex::ingest::replay_client::{self, ReplayLimits};

/// Arguments of `kvindex record`.
#[derive(Debug, clap::Args)]
pub struct RecordArgs {
    /// The engine's PUB endpoint, `tcp://host:port`.
    #[arg(long)]
    pub endpoint: String,
    /// The engine's replay ROUTER: first fetch what it buffered from seq 0.
    #[arg(long)]
    pub replay_endpoint: Option<String>,
    /// Subscription filter.
    #[arg(long, default_value = "")]
    pub topic: String,
    /// Endpoint index written on each line (DP rank of this endpoint).
    #[arg(long, default_value_t = 0)]
    pub endpoint_index: u32,
    /// Output file (fixture JSON lines).
    #[arg(long)]
    pub out: PathBuf,
    /// Stop after this many seconds.
    #[arg(long)]
    pub duration: Option<f64>,
    /// Stop after this many messages.
    #[arg(long)]
    pub count: Option<u64>,
}

/// Records until the duration or count is reached, or SIGINT; returns messages written.
///
/// # Errors
/// When the file cannot be written or the endpoint cannot be reached in 30 s.
pub async fn record(args: &RecordArgs) -> anyhow::Result<u64> {
    let file = std::fs::File::create(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let mut out = std::io::BufWriter::new(file);
    let mut written = 0u64;
    let done = |n: u64| args.count.is_some_and(|c| n >= c);
    let mut options = SocketOptions::default();
    options.connect_timeout(Duration::from_secs(30));
    let mut socket = SubSocket::with_options(options);
    socket.subscribe(&args.topic).await?;
    socket
        .connect(&args.endpoint)
        .await
        .with_context(|| format!("cannot connect to {}", args.endpoint))?;
    if let Some(replay) = &args.replay_endpoint {
        match replay_client::replay(replay, 0, 0, ReplayLimits::default()).await {
            Ok(batches) => {
                for b in batches {
                    if done(written) {
                        break;
                    }
                    writeln!(out, "{}", format_line(args.endpoint_index, &b.frames))?;
                    written += 1;
                }
            }
            Err(f) => tracing::warn!(failure = f.reason(), "Replay before recording failed."),
        }
    }
    let deadline = args
        .duration
        .map(|s| tokio::time::Instant::now() + Duration::from_secs_f64(s.max(0.0)));
    while !done(written) {
        let sleep = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            _ = tokio::signal::ctrl_c() => break,
            _ = sleep => break,
            m = socket.recv() => match m {
                Ok(m) => {
                    let frames = m.into_vec();
                    writeln!(out, "{}", format_line(args.endpoint_index, &frames))?;
                    written += 1;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
        }
    }
    out.flush()?;
    Ok(written)
}

/// Runs the command.
///
/// # Errors
/// As [`record`].
pub async fn run(args: RecordArgs) -> anyhow::Result<()> {
    let n = record(&args).await?;
    eprintln!("kvindex: recorded {n} messages to {}", args.out.display());
    Ok(())
}

//! `kvindex serve`: loads the config, starts the [`Daemon`], waits for SIGINT / SIGTERM and
//! drains. The daemon itself is the library's [`kvindex::Daemon`].

use std::path::PathBuf;
use std::time::Duration;

use tracing::info;

use super::UsageError;
use kvindex::config::{Config, ProcessEnv};
use kvindex::ingest::replay_client::ReplayLimits;

use kvindex::Daemon;

/// Arguments of `kvindex serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// The YAML config file (reloaded on change or SIGHUP).
    #[arg(long, short, env = "KVINDEX_CONFIG")]
    pub config: PathBuf,
    /// Seconds allowed for draining on SIGINT / SIGTERM.
    #[arg(long, default_value_t = 10)]
    pub shutdown_deadline: u64,
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// Runs the command until SIGINT / SIGTERM.
///
/// # Errors
/// An invalid config (exit 64) or a listener / mirror that cannot start.
pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let config = Config::from_path(&args.config, &ProcessEnv)
        .map_err(|e| anyhow::Error::new(UsageError(e.to_string())))?;
    let daemon = Daemon::start(config, Some(args.config.clone()), ReplayLimits::default()).await?;
    shutdown_signal().await;
    info!("Shutdown signal received; draining.");
    daemon
        .shutdown(Duration::from_secs(args.shutdown_deadline))
        .await;
    Ok(())
}

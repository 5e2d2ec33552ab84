//! `kvindex check-config FILE`: validates a config and prints it resolved.

use std::path::PathBuf;

use super::UsageError;
use kvindex::config::{Config, ProcessEnv};

/// Arguments of `kvindex check-config`.
#[derive(Debug, clap::Args)]
pub struct CheckConfigArgs {
    /// The YAML config file.
    pub file: PathBuf,
}

/// Runs the command: the resolved config (with environment overrides) as JSON on stdout.
///
/// # Errors
/// A [`UsageError`] listing every problem, each with its field and line.
pub fn run(args: CheckConfigArgs) -> anyhow::Result<()> {
    let config = Config::from_path(&args.file, &ProcessEnv)
        .map_err(|e| anyhow::Error::new(UsageError(e.to_string())))?;
    println!("{}", serde_json::to_string_pretty(&config.to_json())?);
    Ok(())
}

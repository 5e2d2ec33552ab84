//! `kvindex score`: not built yet (see its issue).

/// Arguments of `kvindex score`.
#[derive(Debug, clap::Args)]
pub struct ScoreArgs {}

/// Runs the command.
///
/// # Errors
/// Always, until the command is built.
pub async fn run(_args: ScoreArgs) -> anyhow::Result<()> {
    anyhow::bail!("this command is not built yet")
}

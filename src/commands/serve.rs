//! `kvindex serve`: not built yet (see its issue).

/// Arguments of `kvindex serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {}

/// Runs the command.
///
/// # Errors
/// Always, until the command is built.
pub async fn run(_args: ServeArgs) -> anyhow::Result<()> {
    anyhow::bail!("this command is not built yet")
}

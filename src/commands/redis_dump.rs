//! `kvindex redis-dump`: not built yet (see its issue).

/// Arguments of `kvindex redis-dump`.
#[derive(Debug, clap::Args)]
pub struct RedisDumpArgs {}

/// Runs the command.
///
/// # Errors
/// Always, until the command is built.
pub async fn run(_args: RedisDumpArgs) -> anyhow::Result<()> {
    anyhow::bail!("this command is not built yet")
}

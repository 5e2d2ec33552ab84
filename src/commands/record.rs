//! `kvindex record`: not built yet (see its issue).

/// Arguments of `kvindex record`.
#[derive(Debug, clap::Args)]
pub struct RecordArgs {}

/// Runs the command.
///
/// # Errors
/// Always, until the command is built.
pub async fn run(_args: RecordArgs) -> anyhow::Result<()> {
    anyhow::bail!("this command is not built yet")
}

//! `kvindex check-config`: not built yet (see its issue).

/// Arguments of `kvindex check-config`.
#[derive(Debug, clap::Args)]
pub struct CheckConfigArgs {}

/// Runs the command.
///
/// # Errors
/// Always, until the command is built.
pub fn run(_args: CheckConfigArgs) -> anyhow::Result<()> {
    anyhow::bail!("this command is not built yet")
}

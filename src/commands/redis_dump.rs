//! `kvindex redis-dump`: kvindex's Redis keys in a canonical sorted JSON form.

use kvindex::store::redis::{dump_target, RedisTarget};

/// Arguments of `kvindex redis-dump`.
#[derive(Debug, clap::Args)]
pub struct RedisDumpArgs {
    /// Redis URL (`redis://[user:pass@]host:port/db` or `rediss://…`).
    #[arg(long, default_value = "redis://127.0.0.1:6379/0")]
    pub redis: String,
    /// Read a Redis Cluster instead (every master), through these seed node URLs
    /// (comma-separated).
    #[arg(long, value_delimiter = ',', num_args = 1.., conflicts_with = "redis")]
    pub redis_cluster: Vec<String>,
    /// Only block keys of this model (and mapping keys pointing at their hashes).
    #[arg(long)]
    pub model: Option<String>,
    /// Only this pod's fields and mapping keys (`{pod}.{namespace}`).
    #[arg(long)]
    pub pod: Option<String>,
}

/// Runs the command.
///
/// # Errors
/// When Redis cannot be reached or a command fails.
pub async fn run(args: RedisDumpArgs) -> anyhow::Result<()> {
    let target = if args.redis_cluster.is_empty() {
        RedisTarget::Single(args.redis)
    } else {
        RedisTarget::Cluster(args.redis_cluster)
    };
    let dump = dump_target(&target, args.model.as_deref(), args.pod.as_deref()).await?;
    println!("{}", serde_json::to_string_pretty(&dump)?);
    Ok(())
}

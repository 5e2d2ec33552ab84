//! The `kvindex` binary: parses the command line and hands off to `commands`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use commands::LogFormat;

// `NAME` and `JEMALLOC_CONF` are for the benches and examples that include this file.
#[allow(dead_code)]
mod allocator;
mod commands;
mod sim;

// The allocator is chosen by cargo feature; see `allocator` for why.
#[global_allocator]
static GLOBAL: allocator::Chosen = allocator::Chosen;

/// KV-cache event ingester and prefix index for LLM serving clusters.
#[derive(Debug, Parser)]
#[command(name = "kvindex", version, about, propagate_version = true)]
struct Cli {
    /// Log line format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Log filter (tracing `EnvFilter` syntax, e.g. `info,kvindex=debug`).
    #[arg(
        long,
        global = true,
        env = "KVINDEX_LOG",
        default_value = "info,zeromq=warn"
    )]
    log: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the daemon live on simulated engines and print queries to try (no Redis, no config).
    Demo(commands::demo::DemoArgs),
    /// Decode a recorded stream and print one JSON object per message.
    Decode(commands::decode::DecodeArgs),
    /// Feed recorded streams through the ingest path into the index and print a summary.
    Replay(commands::replay::ReplayArgs),
    /// Run the daemon: subscribe to every target, index, mirror to Redis, serve the API.
    Serve(commands::serve::ServeArgs),
    /// Record a live engine stream into the fixture format.
    Record(commands::record::RecordArgs),
    /// Validate a config file and print the resolved config.
    CheckConfig(commands::check_config::CheckConfigArgs),
    /// Score pods for a prompt from the index or from Redis.
    Score(commands::score::ScoreArgs),
    /// Watch a running daemon: targets, rates, tiers, mirror (q quits).
    Top(commands::top::TopArgs),
    /// Print kvindex's Redis keys in a canonical sorted JSON form.
    RedisDump(commands::redis_dump::RedisDumpArgs),
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(err) = commands::init_logging(cli.log_format, &cli.log) {
        eprintln!("kvindex: {err:#}");
        return ExitCode::from(64);
    }
    let result = match cli.command {
        Command::Demo(args) => commands::demo::run(args).await,
        Command::Decode(args) => commands::decode::run(args),
        Command::Replay(args) => commands::replay::run(args).await,
        Command::Serve(args) => commands::serve::run(args).await,
        Command::Record(args) => commands::record::run(args).await,
        Command::CheckConfig(args) => commands::check_config::run(args),
        Command::Score(args) => commands::score::run(args).await,
        Command::Top(args) => commands::top::run(args).await,
        Command::RedisDump(args) => commands::redis_dump::run(args).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("kvindex: {err:#}");
            ExitCode::from(commands::exit_code(&err))
        }
    }
}

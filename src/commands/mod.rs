//! The CLI commands, as library functions: the binary's edge, so `anyhow` is used here.
//!
//! | file | command |
//! | --- | --- |
//! | `decode.rs` | `kvindex decode` |
//! | `demo/` | `kvindex demo` |
//! | `replay.rs` | `kvindex replay` |
//! | `serve.rs` | `kvindex serve` |
//! | `record.rs` | `kvindex record` |
//! | `check_config.rs` | `kvindex check-config` |
//! | `score.rs` | `kvindex score` |
//! | `top/` | `kvindex top` |
//! | `redis_dump.rs` | `kvindex redis-dump` |

pub mod check_config;
pub mod decode;
pub mod demo;
pub mod record;
pub mod redis_dump;
pub mod replay;
pub mod score;
pub mod serve;
pub mod top;

use tracing_subscriber::EnvFilter;

use kvindex::ingest::fixture;
use kvindex::wire;

/// Engine of recorded streams on the command line (`replay`, `score`): `auto` guesses from
/// the file name, else vLLM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EngineArg {
    /// Guess from the file name (`sglang-…`, `trtllm-…`), vLLM otherwise.
    Auto,
    /// vLLM.
    Vllm,
    /// SGLang.
    Sglang,
    /// TensorRT-LLM.
    Trtllm,
}

impl EngineArg {
    /// The engine for a file: explicit, or guessed from its name.
    pub fn resolve(self, file: &std::path::Path) -> wire::Engine {
        match self {
            EngineArg::Vllm => wire::Engine::Vllm,
            EngineArg::Sglang => wire::Engine::Sglang,
            EngineArg::Trtllm => wire::Engine::Trtllm,
            EngineArg::Auto => fixture::engine_of_file(file),
        }
    }
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable text.
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the global `tracing` subscriber (logs go to stderr; stdout is for output).
///
/// # Errors
/// When the filter does not parse.
pub fn init_logging(format: LogFormat, filter: &str) -> anyhow::Result<()> {
    let filter = EnvFilter::try_new(filter)
        .map_err(|e| anyhow::anyhow!("invalid log filter `{filter}`: {e}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let installed = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    installed.map_err(|e| anyhow::anyhow!("cannot install the logger: {e}"))
}

/// Marks an error as a usage or configuration problem (exit code 64, as `EX_USAGE`).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// The process exit code for a command error: 64 for usage/config errors, 1 otherwise.
pub fn exit_code(err: &anyhow::Error) -> u8 {
    if err.chain().any(|e| e.is::<UsageError>()) {
        64
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/commands.md (replay): "`--engine auto` takes the engine from the file name (`sglang-…`,
    /// `trtllm-…`), vLLM otherwise".
    #[test]
    fn auto_engine_comes_from_the_file_name() {
        let auto = |name: &str| EngineArg::Auto.resolve(std::path::Path::new(name));
        assert_eq!(auto("dir/sglang-s06.jsonl"), wire::Engine::Sglang);
        assert_eq!(auto("TRTLLM-x.jsonl"), wire::Engine::Trtllm);
        assert_eq!(auto("vllm-e13.jsonl"), wire::Engine::Vllm);
        assert_eq!(auto("capture.jsonl"), wire::Engine::Vllm);
        assert_eq!(
            EngineArg::Sglang.resolve(std::path::Path::new("vllm-x")),
            wire::Engine::Sglang
        );
    }
}

//! `kvindex decode FILE`: the decoder's output as JSON lines, one object per message.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;

use crate::ingest::fixture;
use crate::wire::{self, DecodeOptions, MessageErrorKind};

/// Engine selection on the command line (`auto` = guess from the file name, else vLLM).
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
            EngineArg::Auto => {
                let name = file
                    .file_name()
                    .map(|n| n.to_string_lossy().to_ascii_lowercase())
                    .unwrap_or_default();
                if name.starts_with("sglang") {
                    wire::Engine::Sglang
                } else if name.starts_with("trtllm") || name.starts_with("tensorrt") {
                    wire::Engine::Trtllm
                } else {
                    wire::Engine::Vllm
                }
            }
        }
    }
}

/// Arguments of `kvindex decode`.
#[derive(Debug, clap::Args)]
pub struct DecodeArgs {
    /// A recorded stream (fixture JSON lines).
    pub file: PathBuf,
    /// Engine of the stream. Decoding recognises every era from its shape; this only
    /// labels the stream.
    #[arg(long, value_enum, default_value_t = EngineArg::Auto)]
    pub engine: EngineArg,
}

/// Prints one JSON object per message of the file.
///
/// # Errors
/// When the file cannot be read or stdout cannot be written; bad messages are printed as
/// `{"seq", "error"}` objects and decoding goes on.
pub fn run(args: DecodeArgs) -> anyhow::Result<()> {
    let messages = fixture::read_file(&args.file)?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    for message in messages {
        let line = match message {
            Err(err) => wire::error_to_json(None, &err),
            Ok(message) => match wire::decode_message(&message.frames, DecodeOptions::FULL) {
                Ok((seq, batch)) => wire::batch_to_json(seq, message.endpoint_index, &batch),
                Err(err) => {
                    let described: &dyn std::fmt::Display = match err.kind {
                        MessageErrorKind::Frame(ref e) => e,
                        MessageErrorKind::Decode(ref e) => e,
                    };
                    wire::error_to_json(err.seq, described)
                }
            },
        };
        writeln!(out, "{line}").context("cannot write to stdout")?;
    }
    out.flush().context("cannot write to stdout")?;
    Ok(())
}

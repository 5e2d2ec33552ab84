//! `kvindex decode FILE`: the decoder's output as JSON lines, one object per message.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;

use kvindex::ingest::fixture;
use kvindex::wire::{self, DecodeOptions, MessageErrorKind};

/// Arguments of `kvindex decode`.
// No engine flag: decoding recognises every engine and era from the data's shape, and the
// engine only decides Redis key prefixes, which `decode` never writes.
#[derive(Debug, clap::Args)]
pub struct DecodeArgs {
    /// A recorded stream (fixture JSON lines).
    pub file: PathBuf,
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

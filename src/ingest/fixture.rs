//! The fixture line format (`schemas/fixture-line.schema.json`): one recorded ZMQ message per
//! JSON line.

use std::io::BufRead;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde::{Deserialize, Serialize};

/// The engine that encoded a fixture file, guessed from its name: `sglang…` is SGLang,
/// `trtllm…` or `tensorrt…` TensorRT-LLM, anything else vLLM.
pub fn engine_of_file(file: &std::path::Path) -> crate::wire::Engine {
    let name = file
        .file_name()
        .map(|n| n.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    if name.starts_with("sglang") {
        crate::wire::Engine::Sglang
    } else if name.starts_with("trtllm") || name.starts_with("tensorrt") {
        crate::wire::Engine::Trtllm
    } else {
        crate::wire::Engine::Vllm
    }
}

/// One recorded message: which endpoint it came from and its frames.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedMessage {
    /// 1-based line number in its file.
    pub line: usize,
    /// 0 = DP rank 0's port, 1 = port + 1, …
    pub endpoint_index: u32,
    /// The multipart frames (three for a well-formed message).
    pub frames: Vec<Vec<u8>>,
}

/// Why a fixture line could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FixtureError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// File path.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// A line is not a fixture object.
    #[error("line {line}: {what}")]
    Line {
        /// 1-based line number.
        line: usize,
        /// What was wrong.
        what: String,
    },
}

#[derive(Debug, Deserialize, Serialize)]
struct Line {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    topic: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    seq: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    payload_b64: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    frames_b64: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    endpoint_index: Option<u32>,
}

fn b64(line: usize, field: &str, text: &str) -> Result<Vec<u8>, FixtureError> {
    B64.decode(text).map_err(|e| FixtureError::Line {
        line,
        what: format!("`{field}` is not base64: {e}"),
    })
}

/// Parses one fixture line (`line` is its 1-based number, for errors).
///
/// # Errors
/// [`FixtureError::Line`] when the line is not JSON of either form or holds bad base64.
pub fn parse_line(line: usize, text: &str) -> Result<RecordedMessage, FixtureError> {
    let parsed: Line = serde_json::from_str(text).map_err(|e| FixtureError::Line {
        line,
        what: format!("not a fixture object: {e}"),
    })?;
    let endpoint_index = parsed.endpoint_index.unwrap_or(0);
    if let Some(frames) = parsed.frames_b64 {
        let frames = frames
            .iter()
            .map(|f| b64(line, "frames_b64", f))
            .collect::<Result<_, _>>()?;
        return Ok(RecordedMessage {
            line,
            endpoint_index,
            frames,
        });
    }
    let (Some(seq), Some(payload)) = (parsed.seq, parsed.payload_b64) else {
        return Err(FixtureError::Line {
            line,
            what: "needs `seq` and `payload_b64`, or `frames_b64`".to_owned(),
        });
    };
    Ok(RecordedMessage {
        line,
        endpoint_index,
        frames: vec![
            parsed.topic.unwrap_or_default().into_bytes(),
            seq.to_be_bytes().to_vec(),
            b64(line, "payload_b64", &payload)?,
        ],
    })
}

/// Reads one line of a fixture file as read from it (`line` is its 1-based number): `None`
/// for a blank line, an error for one that is not UTF-8 text or not a fixture object.
pub fn parse_bytes(line: usize, bytes: &[u8]) -> Option<Result<RecordedMessage, FixtureError>> {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Some(Err(FixtureError::Line {
            line,
            what: "not UTF-8 text".to_owned(),
        }));
    };
    let text = text.trim();
    (!text.is_empty()).then(|| parse_line(line, text))
}

/// Reads every line of a fixture file; blank lines are skipped, bad lines are returned as
/// errors in place so callers can report them and go on.
///
/// # Errors
/// [`FixtureError::Io`] when the file cannot be opened or read.
pub fn read_file(
    path: &std::path::Path,
) -> Result<Vec<Result<RecordedMessage, FixtureError>>, FixtureError> {
    let io = |source| FixtureError::Io {
        path: path.display().to_string(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut out = Vec::new();
    for (i, line) in std::io::BufReader::new(file).split(b'\n').enumerate() {
        out.extend(parse_bytes(i + 1, &line.map_err(io)?));
    }
    Ok(out)
}

/// Formats one message as a fixture line: the `seq`/`payload_b64` form when the frames are a
/// well-formed `[utf-8 topic, 8-byte seq, payload]`, `frames_b64` otherwise.
pub fn format_line<F: AsRef<[u8]>>(endpoint_index: u32, frames: &[F]) -> String {
    let line = match frames {
        [topic, seq, payload] if seq.as_ref().len() == 8 => {
            match std::str::from_utf8(topic.as_ref()) {
                Ok(topic) => Line {
                    topic: Some(topic.to_owned()),
                    seq: crate::wire::read_seq(seq.as_ref()).ok(),
                    payload_b64: Some(B64.encode(payload)),
                    frames_b64: None,
                    endpoint_index: Some(endpoint_index),
                },
                Err(_) => raw_line(endpoint_index, frames),
            }
        }
        _ => raw_line(endpoint_index, frames),
    };
    // Serializing plain strings and integers cannot fail.
    serde_json::to_string(&line).unwrap_or_default()
}

fn raw_line<F: AsRef<[u8]>>(endpoint_index: u32, frames: &[F]) -> Line {
    Line {
        topic: None,
        seq: None,
        payload_b64: None,
        frames_b64: Some(frames.iter().map(|f| B64.encode(f)).collect()),
        endpoint_index: Some(endpoint_index),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_forms_round_trip() {
        let frames = vec![
            b"kv".to_vec(),
            5u64.to_be_bytes().to_vec(),
            vec![0x93, 1, 2, 3],
        ];
        let line = format_line(1, &frames);
        assert!(line.contains("payload_b64"));
        let back = parse_line(1, &line).unwrap();
        assert_eq!((back.endpoint_index, back.frames), (1, frames));
        let odd = vec![b"kv".to_vec(), vec![1, 2]];
        let line = format_line(0, &odd);
        assert!(line.contains("frames_b64"));
        assert_eq!(parse_line(1, &line).unwrap().frames, odd);
    }

    #[test]
    fn lines_read_as_bytes_skip_blanks_take_crlf_and_refuse_what_is_not_text() {
        let line = format_line(
            0,
            &[b"kv".to_vec(), 1u64.to_be_bytes().to_vec(), vec![0x90]],
        );
        assert!(parse_bytes(1, b" \r\n").is_none());
        let with_crlf = format!("{line}\r\n");
        assert!(parse_bytes(2, with_crlf.as_bytes()).unwrap().is_ok());
        let err = parse_bytes(3, b"\xff{}").unwrap().unwrap_err();
        assert_eq!(err.to_string(), "line 3: not UTF-8 text");
    }

    #[test]
    fn bad_lines_name_their_line() {
        let err = parse_line(7, "{\"seq\": 1}").unwrap_err();
        assert!(err.to_string().starts_with("line 7:"));
        assert!(parse_line(3, "not json").is_err());
    }
}

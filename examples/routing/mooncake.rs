//! Mooncake traces: JSON lines `{"timestamp", "input_length", "output_length", "hash_ids"}`,
//! `timestamp` in milliseconds from the trace's start, each hash id naming one 512-token
//! block of the prompt (the same id, the same block with the same prefix; the last may be
//! partial). Tokens are synthesised from the ids, so requests sharing leading ids share
//! those tokens; `input_length` is authoritative (ids beyond it are cut, a shortfall is
//! filled with tokens of that request alone). Every line is one request of its own session.

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::workloads::{RequestSpec, Rng, Session, Step, Workload};

/// Tokens one hash id stands for.
pub const TRACE_BLOCK_TOKENS: usize = 512;

/// One line of a trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Arrival, ms from the trace's start.
    pub timestamp: u64,
    /// Prompt tokens.
    pub input_length: usize,
    /// Output tokens.
    pub output_length: usize,
    /// One id per 512-token block of the prompt.
    pub hash_ids: Vec<u64>,
}

/// Why a trace could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file could not be read.
    #[error("cannot read {path}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A line is not a trace record.
    #[error("line {line}: {source}")]
    Line {
        /// 1-based line number.
        line: usize,
        /// What serde said.
        #[source]
        source: serde_json::Error,
    },
}

/// Parses a trace's text (blank lines skipped).
///
/// # Errors
/// [`TraceError::Line`] naming the first bad line.
pub fn parse(text: &str) -> Result<Vec<Record>, TraceError> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|source| TraceError::Line {
                line: i + 1,
                source,
            })
        })
        .collect()
}

/// Reads a trace file.
///
/// # Errors
/// [`TraceError`] when it cannot be read or a line is bad.
pub fn read(path: &Path) -> Result<Vec<Record>, TraceError> {
    let text = std::fs::read_to_string(path).map_err(|source| TraceError::Io {
        path: path.display().to_string(),
        source,
    })?;
    parse(&text)
}

/// The tokens of one record.
pub fn prompt_tokens(record: &Record, line: usize) -> Vec<u32> {
    let mut tokens = Vec::with_capacity(record.input_length);
    for id in &record.hash_ids {
        if tokens.len() >= record.input_length {
            break;
        }
        let take = TRACE_BLOCK_TOKENS.min(record.input_length - tokens.len());
        tokens.extend(
            Rng::new(*id, 0x6d6f_6f6e)
                .tokens(TRACE_BLOCK_TOKENS)
                .into_iter()
                .take(take),
        );
    }
    let short = record.input_length - tokens.len();
    tokens.extend(Rng::new(line as u64, 0x6669_6c6c).tokens(short));
    tokens
}

/// A trace as a workload: arrivals at `timestamp ÷ speed` from the first record's, those
/// within `window` kept.
pub fn workload(records: &[Record], speed: f64, window: Duration) -> Workload {
    let first = records.iter().map(|r| r.timestamp).min().unwrap_or(0);
    let sessions = records
        .iter()
        .enumerate()
        .filter_map(|(line, r)| {
            let start = Duration::from_secs_f64((r.timestamp - first) as f64 / 1000.0 / speed);
            (start < window).then(|| Session {
                start,
                steps: vec![Step {
                    after: Duration::ZERO,
                    requests: vec![RequestSpec {
                        prompt: prompt_tokens(r, line).into(),
                        output: Rng::new(line as u64, 0x6f75_7470)
                            .tokens(r.output_length)
                            .into(),
                    }],
                }],
            })
        })
        .collect::<Vec<_>>();
    let mut sessions = sessions;
    sessions.sort_by_key(|s| s.start);
    Workload {
        name: "mooncake".into(),
        sessions,
    }
}

/// A small trace in Mooncake's format (what `sample-mooncake.jsonl` holds): 40
/// conversations starting within 3 s, each opening with one of 6 shared system prefixes
/// (1–2 blocks, Zipf), then 2–6 turns 150–500 ms apart, each adding 1–2 blocks of its own;
/// the last block is partial; 50–400 output tokens.
pub fn sample(seed: u64) -> Vec<Record> {
    let mut rng = Rng::new(seed, 0x7361_6d70);
    let mut next_id = 0u64;
    let mut fresh = |n: usize| -> Vec<u64> {
        (0..n)
            .map(|_| {
                next_id += 1;
                next_id
            })
            .collect()
    };
    let prefixes: Vec<Vec<u64>> = (0..6)
        .map(|_| {
            let n = rng.range(1, 2);
            fresh(n)
        })
        .collect();
    let zipf = crate::workloads::Zipf::new(prefixes.len(), 1.0);
    let mut records = Vec::new();
    for _ in 0..40 {
        let mut ids = prefixes[zipf.sample(&mut rng)].clone();
        let mut t = rng.below(3000);
        for _ in 0..rng.range(2, 6) {
            ids.extend(fresh(rng.range(1, 2)));
            let input_length = (ids.len() - 1) * TRACE_BLOCK_TOKENS + rng.range(1, 512);
            records.push(Record {
                timestamp: t,
                input_length,
                output_length: rng.range(50, 400),
                hash_ids: ids.clone(),
            });
            t += rng.range(150, 500) as u64;
        }
    }
    records.sort_by_key(|r| r.timestamp);
    records
}

/// The trace as JSON lines.
pub fn to_jsonl(records: &[Record]) -> String {
    records
        .iter()
        .filter_map(|r| serde_json::to_string(r).ok())
        .map(|l| l + "\n")
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACE: &str = r#"{"timestamp": 1000, "input_length": 1100, "output_length": 20, "hash_ids": [1, 2, 3]}
{"timestamp": 1500, "input_length": 700, "output_length": 5, "hash_ids": [1, 4]}

{"timestamp": 4000, "input_length": 1200, "output_length": 5, "hash_ids": [9]}
"#;

    #[test]
    fn shared_ids_share_tokens_and_lengths_are_kept() {
        let records = parse(TRACE).expect("parses");
        assert_eq!(records.len(), 3);
        let a = prompt_tokens(&records[0], 0);
        let b = prompt_tokens(&records[1], 1);
        assert_eq!((a.len(), b.len()), (1100, 700));
        assert_eq!(a[..512], b[..512], "hash id 1");
        assert_ne!(a[512..700], b[512..700], "ids 2 and 4");
        assert_eq!(prompt_tokens(&records[0], 0), a, "deterministic");
        // One id for 1,200 tokens: the rest is the request's own.
        let c = prompt_tokens(&records[2], 3);
        assert_eq!(c.len(), 1200);
    }

    #[test]
    fn timestamps_are_ms_from_the_first_and_the_window_cuts() {
        let records = parse(TRACE).expect("parses");
        let w = workload(&records, 1.0, Duration::from_secs(2));
        let starts: Vec<Duration> = w.sessions.iter().map(|s| s.start).collect();
        assert_eq!(starts, vec![Duration::ZERO, Duration::from_millis(500)]);
        let fast = workload(&records, 2.0, Duration::from_secs(2));
        assert_eq!(fast.sessions.len(), 3);
        assert_eq!(fast.sessions[1].steps[0].requests[0].output.len(), 5);
    }

    #[test]
    fn a_bad_line_is_named() {
        let err = parse("{\"timestamp\": 1}\n").expect_err("missing fields");
        assert!(err.to_string().starts_with("line 1:"), "{err}");
    }

    #[test]
    fn the_shipped_sample_is_the_generator_output_and_reads_back() {
        let shipped =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/routing/sample-mooncake.jsonl");
        let records = read(&shipped).expect("the sample reads");
        assert_eq!(records, sample(1));
        assert!(records.len() >= 100);
        assert!(records
            .iter()
            .all(|r| r.hash_ids.len() * TRACE_BLOCK_TOKENS >= r.input_length));
    }
}

//! Recordings of the engines' own encoders, compiled into the binary so `kvindex demo` runs
//! from an installed binary as well as from a clone (no path to the repo's `fixtures/`).

use kvindex::ingest::fixture::{self, RecordedMessage};
use kvindex::wire::Engine;

/// One bundled recording: a fixture file of the repo, embedded.
#[derive(Debug, Clone, Copy)]
pub struct Recording {
    /// The engine that encoded it.
    pub engine: Engine,
    /// Engine and version, for people.
    pub label: &'static str,
    text: &'static str,
}

/// vLLM 0.33, 32-byte hashes, two DP ranks, GPU / CPU / STORAGE tiers.
pub const VLLM_0_33: Recording = Recording {
    engine: Engine::Vllm,
    label: "vLLM 0.33 (byte hashes)",
    text: include_str!("../../fixtures/vllm-e13-0.33.0-bytes.jsonl"),
};

/// vLLM 0.25, integer hashes, two DP ranks, GPU / CPU tiers.
pub const VLLM_0_25: Recording = Recording {
    engine: Engine::Vllm,
    label: "vLLM 0.25 (int hashes)",
    text: include_str!("../../fixtures/vllm-e08-0.25.1-int.jsonl"),
};

/// vLLM 0.13, integer hashes, two DP ranks, GPU / CPU tiers.
pub const VLLM_0_13: Recording = Recording {
    engine: Engine::Vllm,
    label: "vLLM 0.13 (int hashes)",
    text: include_str!("../../fixtures/vllm-e03-0.13.0-int.jsonl"),
};

/// SGLang 0.5.21, two DP ranks, GPU / CPU_PINNED tiers.
pub const SGLANG_0_5_21: Recording = Recording {
    engine: Engine::Sglang,
    label: "SGLang 0.5.21",
    text: include_str!("../../fixtures/sglang-s06-0.5.21.jsonl"),
};

/// vLLM 0.33's encoding of an empty batch (`[ts, [], 0]`): what an idle engine may send.
const HEARTBEAT: &str = include_str!("../../fixtures/malformed/empty_batch_heartbeat.jsonl");

/// The frames of an empty batch at `seq` (no events: it only moves the seq forward, so a
/// subscriber that joins late sees where the stream is and replays what it missed).
pub fn heartbeat(seq: u64) -> Vec<Vec<u8>> {
    let payload = fixture::parse_line(1, HEARTBEAT.trim())
        .ok()
        .and_then(|m| m.frames.into_iter().nth(2))
        .unwrap_or_default();
    vec![Vec::new(), seq.to_be_bytes().to_vec(), payload]
}

impl Recording {
    /// The recorded messages of DP rank `rank` (endpoint index), in file order. The bundled
    /// files are checked by tests, so a line that does not parse is left out rather than
    /// reported.
    pub fn rank(&self, rank: u32) -> Vec<RecordedMessage> {
        self.text
            .lines()
            .enumerate()
            .filter(|(_, line)| !line.trim().is_empty())
            .filter_map(|(i, line)| fixture::parse_line(i + 1, line).ok())
            .filter(|m| m.endpoint_index == rank)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bundled_line_parses() {
        for r in [VLLM_0_33, VLLM_0_25, VLLM_0_13, SGLANG_0_5_21] {
            let lines = r.text.lines().filter(|l| !l.trim().is_empty()).count();
            assert_eq!(r.rank(0).len() + r.rank(1).len(), lines, "{}", r.label);
            assert_eq!(r.rank(1).len(), 1, "{}", r.label);
        }
    }

    #[test]
    fn the_heartbeat_is_an_empty_batch_at_its_seq() {
        let (seq, batch) =
            kvindex::wire::decode_message(&heartbeat(41), kvindex::wire::DecodeOptions::INDEX)
                .unwrap();
        assert_eq!(seq, 41);
        assert!(batch.events.is_empty() && batch.skipped.is_empty());
    }
}

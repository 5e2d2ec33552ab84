//! The demo's engines and what each one does: the script, and the index it should leave.

use std::time::Duration;

use crate::sim::bundled::{self, Recording};
use kvindex::index::{Discard, Index, SourceSpec};
use kvindex::ingest::fixture::RecordedMessage;
use kvindex::wire::{decode_message, DecodeOptions};

/// Namespace of every demo pod.
pub const NAMESPACE: &str = "demo";
/// The model the scripted pods serve (so their scores compare).
pub const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";
/// The model of the pod that keeps publishing (apart, so the printed answers stay true).
pub const BUSY_MODEL: &str = "Qwen/Qwen2.5-7B-Instruct";
/// Ports each engine takes from the base: PUB ranks at +0/+1, replay ranks at +2/+3.
pub const PORTS_PER_ENGINE: u16 = 4;
/// The seq of vLLM 0.33's rank 0 that is lost on the wire (replay fills it).
pub const DROPPED_SEQ: u64 = 2;
/// The seq of vLLM 0.33's rank 0 sent with its payload cut in half (counted, skipped).
pub const CORRUPT_SEQ: u64 = 6;
/// Messages the SGLang pod publishes on rank 0 after its restart.
pub const AFTER_RESTART: usize = 5;

/// What a demo engine does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Publishes its recording with one message lost on the wire and one corrupted.
    DropAndCorrupt,
    /// Publishes its whole recording.
    Full,
    /// Publishes its whole recording, restarts, and publishes the start of it again.
    Restart,
    /// Loops its recording's rank 0 forever (a live stream for `kvindex top`).
    Busy,
}

/// One demo engine pod.
#[derive(Debug, Clone, Copy)]
pub struct DemoPod {
    /// Pod name (the namespace is [`NAMESPACE`]).
    pub name: &'static str,
    /// Served model.
    pub model: &'static str,
    /// What it publishes.
    pub recording: Recording,
    /// DP ranks.
    pub ranks: u16,
    /// What it does.
    pub role: Role,
}

/// The demo's engines, in port order.
pub const PODS: [DemoPod; 4] = [
    DemoPod {
        name: "vllm-0",
        model: MODEL,
        recording: bundled::VLLM_0_33,
        ranks: 2,
        role: Role::DropAndCorrupt,
    },
    DemoPod {
        name: "vllm-1",
        model: MODEL,
        recording: bundled::VLLM_0_25,
        ranks: 2,
        role: Role::Full,
    },
    DemoPod {
        name: "sglang-0",
        model: MODEL,
        recording: bundled::SGLANG_0_5_21,
        ranks: 2,
        role: Role::Restart,
    },
    DemoPod {
        name: "vllm-2",
        model: BUSY_MODEL,
        recording: bundled::VLLM_0_13,
        ranks: 1,
        role: Role::Busy,
    },
];

/// Pause between two heartbeats of an idle scripted engine.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);
/// Pause between two messages of the busy engine.
pub const BUSY_PACE: Duration = Duration::from_millis(200);

impl DemoPod {
    /// `{pod}.{namespace}`.
    pub fn id(&self) -> String {
        format!("{}.{NAMESPACE}", self.name)
    }

    /// The engine's runs (a restart starts a new one): per run, per rank, the messages the
    /// engine produces in order, whether or not they reach the wire intact.
    pub fn runs(&self) -> Vec<Vec<Vec<RecordedMessage>>> {
        let ranks: Vec<Vec<RecordedMessage>> = (0..u32::from(self.ranks))
            .map(|r| self.recording.rank(r))
            .collect();
        match self.role {
            Role::DropAndCorrupt => {
                let mut ranks = ranks;
                ranks[0].retain(|m| seq_of(m) <= CORRUPT_SEQ);
                for m in &mut ranks[0] {
                    if seq_of(m) == CORRUPT_SEQ {
                        let half = m.frames[2].len() / 2;
                        m.frames[2].truncate(half);
                    }
                }
                vec![ranks]
            }
            Role::Full | Role::Busy => vec![ranks],
            Role::Restart => {
                let mut again = ranks.clone();
                again[0].truncate(AFTER_RESTART);
                vec![ranks, again]
            }
        }
    }

    /// Per rank, the seq that follows the engine's last message (where heartbeats go on).
    pub fn next_seqs(&self) -> Vec<u64> {
        let runs = self.runs();
        let Some(last) = runs.last() else {
            return Vec::new();
        };
        last.iter()
            .map(|m| m.last().map_or(0, |m| seq_of(m).saturating_add(1)))
            .collect()
    }

    /// Whether the message is sent (`false`: lost on the wire, kept for replay).
    pub fn on_the_wire(&self, rank: usize, message: &RecordedMessage) -> bool {
        !(self.role == Role::DropAndCorrupt && rank == 0 && seq_of(message) == DROPPED_SEQ)
    }
}

/// The seq of a well-formed recorded message (`u64::MAX` for one without a seq frame).
pub fn seq_of(message: &RecordedMessage) -> u64 {
    message
        .frames
        .get(1)
        .and_then(|f| kvindex::wire::read_seq(f).ok())
        .unwrap_or(u64::MAX)
}

/// The index the scripted pods should leave: every message each engine produced, applied
/// in order straight to an index (a restart clears the source first), without sockets,
/// sequence tracking or replay. The live daemon must end in the same state.
pub fn expected_index(now: u32) -> Index {
    let index = Index::new();
    for pod in PODS.iter().filter(|p| p.role != Role::Busy) {
        for run in pod.runs() {
            for (rank, messages) in run.iter().enumerate() {
                let spec = SourceSpec {
                    pod: pod.id(),
                    model: pod.model.to_owned(),
                    engine: pod.recording.engine,
                    dp_rank: rank as u8,
                };
                let Ok(source) = index.register_source(&spec) else {
                    continue;
                };
                let _ = index.clear_source(source, &mut Discard);
                for m in messages {
                    if let Ok((_, batch)) = decode_message(&m.frames, DecodeOptions::INDEX) {
                        let _ = index.apply(source, &batch, now, &mut Discard);
                    }
                }
            }
        }
    }
    index
}

/// The prompt the printed queries ask about: the conversation's first request (the token
/// ids of vLLM 0.33's first stored chain, five blocks of 16).
pub fn prompt() -> Vec<u32> {
    let first = bundled::VLLM_0_33.rank(0);
    first
        .first()
        .and_then(|m| decode_message(&m.frames, DecodeOptions::INDEX).ok())
        .and_then(|(_, batch)| {
            batch.events.into_iter().find_map(|e| match e {
                kvindex::wire::Event::BlockStored(s) => Some(s.token_ids),
                _ => None,
            })
        })
        .unwrap_or_default()
}

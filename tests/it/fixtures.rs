//! Golden tests over the recorded engine streams in `fixtures/`: decoding matches what was
//! fed to the engines' own encoders, replaying leaves the residency each scenario implies,
//! and the malformed cases behave as `fixtures/malformed/README.md` says.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use kvindex::hash::std_hash;
use kvindex::index::{Discard, Index};
use kvindex::ingest::{fixture, unix_now, OfflineReplay, Outcome};
use kvindex::wire::{self, DecodeOptions, Engine};
use serde_json::Value;

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

const STREAMS: [&str; 7] = [
    "sglang-s02-0.5.8.post1",
    "sglang-s06-0.5.21",
    "vllm-e01-0.9.0",
    "vllm-e03-0.13.0-bytes",
    "vllm-e03-0.13.0-int",
    "vllm-e08-0.25.1-int",
    "vllm-e13-0.33.0-bytes",
];

fn expected(stream: &str) -> Value {
    let path = fixtures_dir().join(format!("{stream}.expected.json"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn messages(stream: &str) -> Vec<fixture::RecordedMessage> {
    fixture::read_file(&fixtures_dir().join(format!("{stream}.jsonl")))
        .unwrap()
        .into_iter()
        .map(Result::unwrap)
        .collect()
}

#[test]
fn every_stream_decodes_to_what_its_engine_encoded() {
    for stream in STREAMS {
        let want = expected(stream);
        let batches = want["batches"].as_array().unwrap();
        let got: Vec<Value> = messages(stream)
            .iter()
            .map(|m| {
                let (seq, batch) = wire::decode_message(&m.frames, DecodeOptions::FULL).unwrap();
                assert!(
                    batch.skipped.is_empty(),
                    "{stream}: skipped {:?}",
                    batch.skipped
                );
                wire::batch_to_json(seq, m.endpoint_index, &batch)
            })
            .collect();
        assert_eq!(got.len(), batches.len(), "{stream}: message count");
        for (g, w) in got.iter().zip(batches) {
            let at = format!("{stream} endpoint {} seq {}", w["endpoint_index"], w["seq"]);
            assert_eq!(g["seq"], w["seq"], "{at}");
            assert_eq!(g["endpoint_index"], w["endpoint_index"], "{at}");
            assert_eq!(g["ts"].as_f64(), w["ts"].as_f64(), "{at}: ts");
            let want_rank = if w["dp_rank"] == "absent" {
                Value::Null
            } else {
                w["dp_rank"].clone()
            };
            assert_eq!(g["dp_rank"], want_rank, "{at}: dp_rank");
            let (ge, we) = (
                g["events"].as_array().unwrap(),
                w["events"].as_array().unwrap(),
            );
            assert_eq!(ge.len(), we.len(), "{at}: event count");
            for (i, (ge, we)) in ge.iter().zip(we).enumerate() {
                for (field, value) in we.as_object().unwrap() {
                    assert_eq!(&ge[field], value, "{at} event {i} field {field}");
                }
            }
        }
    }
}

/// Identifies one block of the scenario by where `expected.json` lists its tokens.
#[derive(Clone, Copy)]
struct At {
    endpoint: u64,
    seq: u64,
    event: usize,
    block: usize,
}

const fn at(endpoint: u64, seq: u64, event: usize, block: usize) -> At {
    At {
        endpoint,
        seq,
        event,
        block,
    }
}

fn std_of(want: &Value, at: At) -> String {
    let batch = want["batches"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["endpoint_index"] == at.endpoint && b["seq"] == at.seq)
        .unwrap();
    let event = &batch["events"][at.event];
    let size = event["block_size"].as_u64().unwrap() as usize;
    let tokens: Vec<u32> = event["token_ids"].as_array().unwrap()
        [at.block * size..(at.block + 1) * size]
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect();
    std_hash(&tokens).to_string()
}

type Residency = BTreeSet<(String, String, Vec<String>)>;

fn replay_until(stream: &str, stop: Option<(u32, u64)>) -> Index {
    let engine = if stream.starts_with("sglang") {
        Engine::Sglang
    } else {
        Engine::Vllm
    };
    let mut replay = OfflineReplay::new(Index::new(), "pod-a.ns", "base-model", engine);
    for m in messages(stream) {
        let outcome = replay.offer(&m, unix_now(), &mut Discard).unwrap();
        // Offline there is no replay endpoint: every kind of seq step applies the batch.
        let (Outcome::Applied { seq }
        | Outcome::MidStreamStart { seq }
        | Outcome::Restart { seq, .. }
        | Outcome::Gap { to: seq, .. }) = outcome
        else {
            panic!("{stream}: message not applied: {outcome:?}");
        };
        if stop == Some((m.endpoint_index, seq)) {
            break;
        }
    }
    replay.index().clone()
}

fn residency(index: &Index) -> Residency {
    let now = unix_now();
    index
        .dump()
        .into_iter()
        .map(|e| {
            assert_eq!(e.pod, "pod-a.ns");
            assert!(
                e.stored_at <= now && now - e.stored_at < 3600,
                "implausible stored_at {}",
                e.stored_at
            );
            (e.model, e.std_hash, e.media)
        })
        .collect()
}

fn expect(want: &Value, rows: &[(&str, At, &[&str])]) -> Residency {
    rows.iter()
        .map(|(model, at, media)| {
            (
                model.to_string(),
                std_of(want, *at),
                media.iter().map(|m| m.to_string()).collect(),
            )
        })
        .collect()
}

// The scenario (WIRE-FORMATS.md "Fixtures"), in the block names used below:
// seq 0 stores the 3-block system prompt A B C plus D E of the first request; seq 1 stores
// F G (second request, after C) and H (decode block after E); seq 2 stores the LoRA
// request's 4 blocks L1–L4; seq 3 evicts H G F; the next batch moves D E from GPU to CPU
// (and, on vLLM 0.26+, also to STORAGE); DP rank 1 stores A B C X; then D is evicted from
// CPU; rank 0 clears everything; A B C are stored again.

const A: At = at(0, 0, 0, 0);
const B: At = at(0, 0, 0, 1);
const C: At = at(0, 0, 0, 2);
const D: At = at(0, 0, 0, 3);
const E: At = at(0, 0, 0, 4);
const L1: At = at(0, 2, 0, 0);
const L2: At = at(0, 2, 0, 1);
const L3: At = at(0, 2, 0, 2);
const L4: At = at(0, 2, 0, 3);
const X: At = at(1, 0, 0, 3);

fn vllm_mid_and_final(stream: &str, lora_model: &str, e_media: &[&str], d_media: Option<&[&str]>) {
    let want = expected(stream);
    let gpu: &[&str] = &["GPU"];
    let mut rows = vec![
        ("base-model", A, gpu),
        ("base-model", B, gpu),
        ("base-model", C, gpu),
        ("base-model", E, e_media),
        (lora_model, L1, gpu),
        (lora_model, L2, gpu),
        (lora_model, L3, gpu),
        (lora_model, L4, gpu),
        ("base-model", X, gpu),
    ];
    if let Some(d) = d_media {
        rows.push(("base-model", D, d));
    }
    assert_eq!(
        residency(&replay_until(stream, Some((0, 5)))),
        expect(&want, &rows),
        "{stream} before the clear"
    );
    let rows = [
        ("base-model", A, gpu),
        ("base-model", B, gpu),
        ("base-model", C, gpu),
        ("base-model", X, gpu),
    ];
    assert_eq!(
        residency(&replay_until(stream, None)),
        expect(&want, &rows),
        "{stream} at the end"
    );
}

#[test]
fn vllm_0_13_int_replays_to_its_scenario() {
    // No lora_name before 0.14: LoRA blocks stay under the base model. D left CPU: gone.
    vllm_mid_and_final("vllm-e03-0.13.0-int", "base-model", &["CPU"], None);
}

#[test]
fn vllm_0_13_bytes_replays_to_its_scenario() {
    vllm_mid_and_final("vllm-e03-0.13.0-bytes", "base-model", &["CPU"], None);
}

#[test]
fn vllm_0_25_replays_to_its_scenario() {
    vllm_mid_and_final("vllm-e08-0.25.1-int", "sql-adapter", &["CPU"], None);
}

#[test]
fn vllm_0_33_replays_to_its_scenario_with_storage_tier() {
    // D and E also went to STORAGE; D then left CPU only.
    vllm_mid_and_final(
        "vllm-e13-0.33.0-bytes",
        "sql-adapter",
        &["CPU", "STORAGE"],
        Some(&["STORAGE"]),
    );
}

#[test]
fn vllm_0_9_replays_to_its_scenario() {
    let stream = "vllm-e01-0.9.0";
    let want = expected(stream);
    let none: &[&str] = &[];
    let mid = [A, B, C, D, E, L1, L2, L3, L4].map(|b| ("base-model", b, none));
    assert_eq!(
        residency(&replay_until(stream, Some((0, 3)))),
        expect(&want, &mid)
    );
    let end = [A, B, C].map(|b| ("base-model", b, none));
    assert_eq!(residency(&replay_until(stream, None)), expect(&want, &end));
}

#[test]
fn sglang_0_5_8_replays_to_its_scenario() {
    // One block per event; the LoRA-less request of seq 2 stores A B C again plus I.
    let stream = "sglang-s02-0.5.8.post1";
    let want = expected(stream);
    let none: &[&str] = &[];
    let i = at(0, 2, 3, 0);
    let one = |seq, event| at(0, seq, event, 0);
    let mid = [
        one(0, 0),
        one(0, 1),
        one(0, 2),
        one(0, 3),
        one(0, 4),
        i,
        at(1, 0, 3, 0),
    ]
    .map(|b| ("base-model", b, none));
    assert_eq!(
        residency(&replay_until(stream, Some((1, 0)))),
        expect(&want, &mid)
    );
    let end = [one(0, 0), one(0, 1), one(0, 2), at(1, 0, 3, 0)].map(|b| ("base-model", b, none));
    assert_eq!(residency(&replay_until(stream, None)), expect(&want, &end));
}

#[test]
fn sglang_0_5_21_replays_to_its_scenario_with_cpu_pinned() {
    let stream = "sglang-s06-0.5.21";
    let want = expected(stream);
    let gpu: &[&str] = &["GPU"];
    let one = |seq, event| at(0, seq, event, 0);
    let mid = [
        ("base-model", one(0, 0), gpu),
        ("base-model", one(0, 1), gpu),
        ("base-model", one(0, 2), gpu),
        ("base-model", one(0, 4), &["CPU_PINNED"][..]),
        ("base-model", at(0, 2, 3, 0), gpu),
        ("base-model", at(1, 0, 3, 0), gpu),
    ];
    assert_eq!(
        residency(&replay_until(stream, Some((0, 5)))),
        expect(&want, &mid)
    );
    let end = [one(0, 0), one(0, 1), one(0, 2), at(1, 0, 3, 0)].map(|b| ("base-model", b, gpu));
    assert_eq!(residency(&replay_until(stream, None)), expect(&want, &end));
}

fn malformed(name: &str) -> fixture::RecordedMessage {
    let path = fixtures_dir().join("malformed").join(name);
    fixture::read_file(&path).unwrap().remove(0).unwrap()
}

#[test]
fn truncated_payload_is_rejected_and_applies_nothing() {
    let m = malformed("truncated.jsonl");
    let err = wire::decode_message(&m.frames, DecodeOptions::FULL).unwrap_err();
    assert_eq!(err.reason(), "truncated");
    assert_eq!(err.seq, Some(0));
    let mut replay = OfflineReplay::new(Index::new(), "p.ns", "m", Engine::Vllm);
    assert!(matches!(
        replay.offer(&m, 1, &mut Discard).unwrap(),
        Outcome::DecodeError(_)
    ));
    assert!(replay.index().dump().is_empty());
    assert_eq!(replay.stats().decode_errors.get("truncated"), Some(&1));
}

#[test]
fn unknown_tag_is_skipped_and_the_other_events_apply() {
    let m = malformed("unknown_tag_array.jsonl");
    let (_, batch) = wire::decode_message(&m.frames, DecodeOptions::FULL).unwrap();
    assert_eq!(batch.events.len(), 2);
    assert_eq!(batch.skipped.len(), 1);
    assert_eq!(batch.skipped[0].index, 1);
    assert!(
        matches!(&batch.skipped[0].reason, wire::SkipReason::UnknownTag(t) if t == "BlockPinned")
    );
    let mut replay = OfflineReplay::new(Index::new(), "p.ns", "m", Engine::Vllm);
    replay.offer(&m, 1, &mut Discard).unwrap();
    assert_eq!(replay.stats().unknown_tags.get("BlockPinned"), Some(&1));
    assert_eq!(replay.stats().apply.blocks_stored, 3);
    assert_eq!(replay.stats().apply.blocks_removed, 1);
}

#[test]
fn empty_payload_is_malformed() {
    let m = malformed("empty_payload.jsonl");
    let err = wire::decode_message(&m.frames, DecodeOptions::FULL).unwrap_err();
    assert_eq!(err.reason(), "empty_payload");
}

#[test]
fn two_frames_is_a_framing_error() {
    let m = malformed("two_frames.jsonl");
    let err = wire::decode_message(&m.frames, DecodeOptions::FULL).unwrap_err();
    assert_eq!(err.reason(), "frame_count");
    assert_eq!(err.seq, None);
}

#[test]
fn empty_batch_is_a_heartbeat_that_advances_seq() {
    let m = malformed("empty_batch_heartbeat.jsonl");
    let mut replay = OfflineReplay::new(Index::new(), "p.ns", "m", Engine::Vllm);
    let outcome = replay.offer(&m, 1, &mut Discard).unwrap();
    assert!(matches!(outcome, Outcome::Applied { seq: 0 }));
    assert_eq!(replay.stats().empty_batches, 1);
    assert!(replay.index().dump().is_empty());
}

#[test]
fn bad_messages_inside_a_stream_keep_what_was_indexed() {
    let stream = "vllm-e13-0.33.0-bytes";
    let mut replay = OfflineReplay::new(Index::new(), "pod-a.ns", "base-model", Engine::Vllm);
    let all = messages(stream);
    replay.offer(&all[0], 1, &mut Discard).unwrap();
    let before = replay.index().dump();
    for bad in ["truncated.jsonl", "empty_payload.jsonl", "two_frames.jsonl"] {
        let outcome = replay.offer(&malformed(bad), 1, &mut Discard).unwrap();
        assert!(matches!(outcome, Outcome::DecodeError(_)), "{bad}");
    }
    assert_eq!(replay.index().dump(), before);
    assert_eq!(replay.stats().decode_errors.values().sum::<u64>(), 3);
}

/// An endpoint index above 255 names no DP rank; it used to become rank
/// 255 silently.
#[test]
fn an_endpoint_index_past_255_is_rejected_not_folded_into_rank_255() {
    let mut m = messages("vllm-e01-0.9.0").remove(0);
    let mut replay = OfflineReplay::new(Index::new(), "p.ns", "m", Engine::Vllm);
    m.endpoint_index = 255;
    assert!(replay.offer(&m, 1, &mut Discard).is_ok());
    m.endpoint_index = 256;
    let err = replay.offer(&m, 1, &mut Discard).unwrap_err();
    assert!(
        matches!(
            err,
            kvindex::ingest::OfflineError::EndpointIndex {
                endpoint_index: 256,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("256"), "{err}");
    assert!(replay.index().sources_of_pod("p.ns").len() == 1);
}

/// A recording read ahead on a thread of its own applies exactly what offering its lines
/// one by one applies: several files in one replay (each a new recording), blank and bad
/// lines between messages, and far more lines than the reader may hold ahead.
#[test]
fn a_recording_read_ahead_replays_as_its_lines_offered_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let lines = |stream: &str| -> Vec<String> {
        std::fs::read_to_string(fixtures_dir().join(format!("{stream}.jsonl")))
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    };
    let mut long = String::new();
    for round in 0..1000 {
        for line in lines("vllm-e08-0.25.1-int") {
            long.push_str(&line);
            long.push('\n');
        }
        if round % 125 == 0 {
            long.push_str("\n{\"seq\": 1}\nnot json\n");
        }
    }
    let files = [
        dir.path().join("long.jsonl"),
        dir.path().join("second.jsonl"),
    ];
    std::fs::write(&files[0], &long).unwrap();
    // A line that is not UTF-8 is a bad line like any other, never the end of the replay.
    let mut second = lines("vllm-e13-0.33.0-bytes").join("\r\n").into_bytes();
    second.extend_from_slice(b"\r\n\xff\xfe not text\r\n");
    std::fs::write(&files[1], second).unwrap();

    let read_ahead =
        kvindex::ingest::replay_files(Index::new(), "p.ns", "m", Engine::Vllm, &files).unwrap();

    let mut one_by_one = OfflineReplay::new(Index::new(), "p.ns", "m", Engine::Vllm);
    for file in &files {
        one_by_one.start_file();
        for line in fixture::read_file(file).unwrap() {
            match line {
                Ok(message) => drop(one_by_one.offer(&message, unix_now(), &mut Discard)),
                Err(err) => one_by_one.count_bad_line(&err),
            }
        }
    }
    assert!(read_ahead.stats().messages > 2 * 8 * 256);
    assert_eq!(
        read_ahead.stats().decode_errors.get("bad_fixture_line"),
        Some(&17)
    );
    assert_eq!(read_ahead.stats(), one_by_one.stats());
    // Store times are the seconds each replay ran in.
    let untimed = |index: &Index| -> Vec<_> {
        let mut dump = index.dump();
        dump.iter_mut().for_each(|entry| entry.stored_at = 0);
        dump
    };
    assert_eq!(untimed(read_ahead.index()), untimed(one_by_one.index()));
}

/// Every file is opened before the first line applies: a missing one fails the replay with
/// its path and leaves the index empty.
#[test]
fn a_missing_file_fails_the_replay_before_anything_applies() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.jsonl");
    let files = [fixtures_dir().join("vllm-e01-0.9.0.jsonl"), missing.clone()];
    let index = Index::new();
    let err = kvindex::ingest::replay_files(index.clone(), "p.ns", "m", Engine::Vllm, &files)
        .err()
        .unwrap();
    assert!(err.to_string().contains("missing.jsonl"), "{err}");
    assert!(index.dump().is_empty());
}

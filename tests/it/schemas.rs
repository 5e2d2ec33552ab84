//! The JSON Schemas in `schemas/` describe what the code reads and prints: every fixture
//! line validates against the fixture schema, every `decode` output line against the decode
//! schema, and the schemas reject what they should.

use std::path::{Path, PathBuf};

use kvindex::ingest::fixture;
use kvindex::wire::{self, DecodeOptions, MessageErrorKind};
use serde_json::{json, Value};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

fn validator(name: &str) -> jsonschema::Validator {
    let text = std::fs::read_to_string(root().join("schemas").join(name)).unwrap();
    let schema: Value = serde_json::from_str(&text).unwrap();
    jsonschema::validator_for(&schema).unwrap()
}

fn fixture_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("fixtures"))
        .unwrap()
        .chain(std::fs::read_dir(root().join("fixtures/malformed")).unwrap())
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.to_string_lossy().ends_with(".jsonl")
                && !p.to_string_lossy().ends_with(".replay.jsonl")
        })
        .collect();
    files.sort();
    files
}

fn assert_valid(v: &jsonschema::Validator, instance: &Value, what: &str) {
    let errors: Vec<String> = v.iter_errors(instance).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{what}: {errors:?}");
}

#[test]
fn every_fixture_line_matches_the_fixture_schema() {
    let v = validator("fixture-line.schema.json");
    for file in fixture_files() {
        for (i, line) in std::fs::read_to_string(&file).unwrap().lines().enumerate() {
            let instance: Value = serde_json::from_str(line).unwrap();
            assert_valid(&v, &instance, &format!("{}:{}", file.display(), i + 1));
        }
    }
    // And what `record` writes, in both forms.
    let good = fixture::format_line(1, &[b"t".to_vec(), 3u64.to_be_bytes().to_vec(), vec![0x90]]);
    let raw = fixture::format_line(0, &[b"t".to_vec()]);
    for line in [good, raw] {
        assert_valid(&v, &serde_json::from_str(&line).unwrap(), &line);
    }
    assert!(
        !v.is_valid(&json!({"seq": 1})),
        "a line without payload must be invalid"
    );
}

#[test]
fn every_decode_output_line_matches_the_decode_schema() {
    let v = validator("decode-output.schema.json");
    let mut errors_seen = 0;
    for file in fixture_files() {
        for message in fixture::read_file(&file).unwrap() {
            let message = message.unwrap();
            let line = match wire::decode_message(&message.frames, DecodeOptions::FULL) {
                Ok((seq, batch)) => wire::batch_to_json(seq, message.endpoint_index, &batch),
                Err(err) => {
                    errors_seen += 1;
                    let d: &dyn std::fmt::Display = match err.kind {
                        MessageErrorKind::Frame(ref e) => e,
                        MessageErrorKind::Decode(ref e) => e,
                    };
                    wire::error_to_json(err.seq, d)
                }
            };
            assert_valid(
                &v,
                &line,
                &format!("{} line {}", file.display(), message.line),
            );
        }
    }
    assert_eq!(
        errors_seen, 3,
        "the three malformed messages print as errors"
    );
    assert!(!v.is_valid(&json!({"seq": 0, "events": []})));
}

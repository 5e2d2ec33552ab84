//! The JSON Schemas in `schemas/` describe what the code reads and prints: every fixture
//! line validates against the fixture schema, every `decode` output line against the decode
//! schema, the routing requests' schemas and the config schema's newer fields accept what the
//! server and the loader accept, and the schemas reject what they should.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::http::StatusCode;
use kvindex::api::{router, ApiState};
use kvindex::config::Config;
use kvindex::index::{Index, SourceSpec};
use kvindex::ingest::fixture;
use kvindex::ingest::{PodStatus, PodsView};
use kvindex::medium::TierWeights;
use kvindex::score::ScoreBackend;
use kvindex::wire::{self, DecodeOptions, Engine, MessageErrorKind};
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

/// The API over an index holding target `a.ns` (model `m`, nothing stored), for bodies to
/// be checked against the server.
fn routing_app() -> axum::Router {
    struct NoPods;
    impl PodsView for NoPods {
        fn pods(&self) -> Vec<PodStatus> {
            Vec::new()
        }
    }
    let index = Index::new();
    let spec = SourceSpec {
        pod: "a.ns".into(),
        model: "m".into(),
        engine: Engine::Vllm,
        dp_rank: 0,
    };
    index.register_source(&spec).unwrap();
    router(ApiState::new(
        ScoreBackend::Index(index),
        TierWeights::default(),
        None,
        Arc::new(NoPods),
    ))
}

async fn post(app: &axum::Router, uri: &str, body: &Value) -> (StatusCode, Value) {
    crate::util::post_json(app, uri, body).await
}

/// The routing requests' schemas (`/v1/routed`, `/v1/feedback`, and the prompt fields
/// `max_blocks`, `cache_salt`, `speculate` of score and PD) describe what the server accepts:
/// a body the schema refuses is a 400, and a body it accepts never is.
#[tokio::test]
async fn routing_request_schemas_agree_with_the_server() {
    let routed = [
        json!({"model": "m", "tokens": [1, 2], "pod": "a.ns"}),
        json!({"model": "m", "tokens": [1], "pod": "a.ns", "cache_salt": "t", "request_id": "r1", "max_blocks": 4}),
        json!({"model": "m", "block_hashes": ["1", 2], "pod": "a.ns", "request_id": "r2"}),
        json!({"model": "m", "tokens": [1], "pod": "nobody.ns"}),
        json!({"model": "m", "tokens": [1], "block_hashes": [1], "pod": "a.ns"}),
        json!({"model": "m", "pod": "a.ns"}),
        json!({"model": "m", "tokens": [1]}),
        json!({"model": "", "tokens": [1], "pod": "a.ns"}),
        json!({"model": "m", "tokens": [1], "pod": " "}),
        json!({"model": "m", "tokens": [-1], "pod": "a.ns"}),
        json!({"model": "m", "tokens": [1], "pod": "a.ns", "request_id": ""}),
        json!({"model": "m", "tokens": [1], "pod": "a.ns", "request_id": "x".repeat(257)}),
        json!({"model": "m", "tokens": [1], "pod": "a.ns", "max_blocks": 0}),
        json!({"model": "m", "tokens": [1], "pod": "a.ns", "cache_salt": 7}),
        json!({"model": "m", "tokens": [1], "pod": "a.ns", "match": "prefix"}),
    ];
    let feedback = [
        json!({"request_id": "r1", "cached_tokens": 16}),
        json!({"request_id": "never", "cached_tokens": 0}),
        json!({"request_id": "r2", "cached_tokens": -1}),
        json!({"request_id": "r2", "cached_tokens": 1.5}),
        json!({"request_id": "r2"}),
        json!({"cached_tokens": 0}),
        json!({"request_id": "r2", "cached_tokens": 0, "pod": "a.ns"}),
    ];
    let score = [
        json!({"model": "m", "tokens": [1], "pods": ["a.ns"], "max_blocks": 1, "cache_salt": "t"}),
        json!({"model": "m", "block_hashes": [1], "pods": [], "cache_salt": ""}),
        json!({"model": "m", "tokens": [1], "pods": [], "max_blocks": 0}),
        json!({"model": "m", "tokens": [1], "pods": [], "max_blocks": -1}),
        json!({"model": "m", "tokens": [1], "pods": [], "cache_salt": ["t"]}),
    ];
    let decode = json!([{"pod": "a.ns", "group": "g"}]);
    let prefill = json!({"g": ["a.ns"]});
    let pd = [
        json!({"model": "m", "tokens": [1], "decode": decode, "prefill": prefill, "speculate": true, "cache_salt": "t", "max_blocks": 2}),
        json!({"model": "m", "tokens": [1], "decode": decode, "prefill": prefill, "speculate": true, "match": "prefix"}),
        json!({"model": "m", "block_hashes": [1], "decode": decode, "prefill": prefill, "speculate": false}),
        json!({"model": "m", "tokens": [1], "decode": decode, "prefill": prefill, "speculate": true, "match": "kthena"}),
        json!({"model": "m", "block_hashes": [1], "decode": decode, "prefill": prefill, "speculate": true}),
        json!({"model": "m", "tokens": [1], "decode": decode, "prefill": prefill, "speculate": "yes"}),
        json!({"model": "m", "tokens": [1], "decode": decode, "prefill": prefill, "max_blocks": 0}),
    ];
    let routes = [
        ("/v1/routed", "api-routed-request.schema.json", &routed[..]),
        (
            "/v1/feedback",
            "api-feedback-request.schema.json",
            &feedback[..],
        ),
        ("/v1/score", "api-score-request.schema.json", &score[..]),
        (
            "/v1/pd/schedule",
            "api-pd-schedule-request.schema.json",
            &pd[..],
        ),
    ];
    // One app throughout: the feedback for `r1` finds the prediction its placement kept.
    let app = routing_app();
    for (uri, schema, bodies) in routes {
        let v = validator(schema);
        for req in bodies {
            let (status, body) = post(&app, uri, req).await;
            assert_eq!(
                status == StatusCode::BAD_REQUEST,
                !v.is_valid(req),
                "{uri} {req}: {status} {body}"
            );
        }
    }
}

/// A `max_blocks` above the server's cap for the mode is what the schema cannot see (the
/// caps are configured): the server refuses it naming the field and the setting.
#[tokio::test]
async fn max_blocks_past_the_modes_cap_is_refused_naming_it() {
    let app = routing_app();
    for (mode, cap, setting) in [
        ("prefix", 8192, "api.max_blocks"),
        ("kthena", 128, "api.kthena_max_blocks"),
    ] {
        let at_cap =
            json!({"model": "m", "tokens": [1], "pods": [], "match": mode, "max_blocks": cap});
        assert_eq!(post(&app, "/v1/score", &at_cap).await.0, StatusCode::OK);
        let past =
            json!({"model": "m", "tokens": [1], "pods": [], "match": mode, "max_blocks": cap + 1});
        let (status, body) = post(&app, "/v1/score", &past).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(body["field"], "max_blocks");
        assert!(body["error"].as_str().unwrap().contains(setting), "{body}");
    }
}

/// The config schema's `api.max_blocks`, `api.kthena_max_blocks` and `speculative:` take what
/// the loader takes, and their documented defaults are the loader's.
#[test]
fn the_config_schema_bounds_and_defaults_are_the_loaders() {
    let v = validator("config.schema.json");
    for text in [
        "api:\n  max_blocks: 1\n  kthena_max_blocks: 1048576\n",
        "api:\n  max_blocks: 0\n",
        "api:\n  max_blocks: 1048577\n",
        "api:\n  kthena_max_blocks: 0\n",
        "api:\n  kthena_max_blocks: 1048577\n",
        "speculative: {}\n",
        "speculative:\n  ttl_ms: 0\n  max_entries: 1\n",
        "speculative:\n  ttl_ms: 600000\n",
        "speculative:\n  ttl_ms: 600001\n",
        "speculative:\n  max_entries: 0\n",
        "speculative:\n  ttl_ms: -1\n",
        "speculative:\n  weight: 1.0\n",
    ] {
        let instance: Value = serde_saphyr::from_str(text).unwrap();
        let loaded = Config::from_str(text);
        assert_eq!(
            loaded.is_ok(),
            v.is_valid(&instance),
            "{text}: {:?}",
            loaded.err()
        );
    }
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("schemas/config.schema.json")).unwrap(),
    )
    .unwrap();
    let default = |section: &str, field: &str| {
        schema["properties"][section]["properties"][field]["default"]
            .as_u64()
            .unwrap_or_else(|| panic!("{section}.{field} has no default"))
    };
    let config = Config::from_str("api: {}\n").unwrap();
    let api = config.api.unwrap();
    assert_eq!(api.max_blocks as u64, default("api", "max_blocks"));
    assert_eq!(
        api.kthena_max_blocks as u64,
        default("api", "kthena_max_blocks")
    );
    let speculative = config.speculative;
    assert_eq!(
        speculative.ttl.as_millis() as u64,
        default("speculative", "ttl_ms")
    );
    assert_eq!(
        speculative.max_entries as u64,
        default("speculative", "max_entries")
    );
}

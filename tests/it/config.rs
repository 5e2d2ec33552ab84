//! The config file: the shipped example is valid (by the loader and by the JSON Schema), and
//! regressions — `flush_interval_ms: 0` refused rather than rounded up, a target's
//! replay ports may not overlap its PUB ports.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kvindex::config::{Config, ConfigError, ConfigIssue, NoEnv};
use serde_json::Value;

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// The issues of an invalid config; panics (failing the test) when the config is valid.
fn issues(text: &str) -> Vec<ConfigIssue> {
    match Config::from_str(text) {
        Err(ConfigError::Invalid(issues)) => issues,
        other => panic!("expected validation issues, got {other:?}"),
    }
}

fn target(endpoint: &str, replay: &str, dp_ranks: u32) -> String {
    format!(
        "targets:\n  - pod: p\n    model: m\n    engine: vllm\n    endpoint: {endpoint}\n    replay_endpoint: {replay}\n    dp_ranks: {dp_ranks}\n"
    )
}

#[test]
fn shipped_example_is_valid_for_the_loader_and_the_schema() {
    let path = repo_file("examples/kvindex.yaml");
    let config = Config::from_path(&path, &NoEnv).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.targets.len(), 2);
    let vllm = &config.targets[0];
    assert_eq!(vllm.dp_ranks, 2);
    // Every rank's PUB and replay port is distinct.
    let mut ports: Vec<String> = (0..vllm.dp_ranks)
        .flat_map(|r| {
            [
                vllm.endpoint.for_rank(r),
                vllm.replay_endpoint.as_ref().and_then(|e| e.for_rank(r)),
            ]
        })
        .map(Option::unwrap)
        .collect();
    ports.sort();
    ports.dedup();
    assert_eq!(ports.len(), 4, "{ports:?}");

    let text = std::fs::read_to_string(&path).unwrap();
    let instance: Value = serde_saphyr::from_str(&text).unwrap();
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(repo_file("schemas/config.schema.json")).unwrap(),
    )
    .unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(&instance)
        .map(|e| e.to_string())
        .collect();
    assert!(errors.is_empty(), "{errors:?}");
}

#[test]
fn flush_interval_zero_is_refused_with_its_line() {
    let found = issues("redis:\n  url: redis://h:1/0\n  flush_interval_ms: 0\n");
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].field, "redis.flush_interval_ms");
    assert_eq!(found[0].line, Some(3));
    assert!(found[0].what.contains("at least 1"), "{}", found[0]);
}

#[test]
fn flush_interval_is_taken_as_written() {
    for ms in [1u64, 7, 250] {
        let text = format!("redis:\n  url: redis://h:1/0\n  flush_interval_ms: {ms}\n");
        let redis = Config::from_str(&text).unwrap().redis.unwrap();
        assert_eq!(redis.flush_interval, Duration::from_millis(ms));
    }
}

#[test]
fn other_zero_counts_are_refused_with_their_lines() {
    let found = issues("redis:\n  flush_max_commands: 0\n  queue_capacity: 0\n");
    let got: Vec<_> = found.iter().map(|i| (i.field.as_str(), i.line)).collect();
    assert_eq!(
        got,
        [
            ("redis.flush_max_commands", Some(2)),
            ("redis.queue_capacity", Some(3))
        ]
    );
}

#[test]
fn writer_connections_are_taken_within_their_bounds() {
    for n in [1usize, 4, 16] {
        let text = format!("redis:\n  url: redis://h:1/0\n  connections: {n}\n");
        assert_eq!(
            Config::from_str(&text).unwrap().redis.unwrap().connections,
            n
        );
    }
    for (n, what) in [(0, "at least 1"), (17, "at most 16")] {
        let found = issues(&format!(
            "redis:\n  url: redis://h:1/0\n  connections: {n}\n"
        ));
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(
            (found[0].field.as_str(), found[0].line),
            ("redis.connections", Some(3))
        );
        assert!(found[0].what.contains(what), "{found:?}");
    }
}

#[test]
fn a_prefix_only_index_is_refused_with_a_mirror_and_taken_without_one() {
    let found = issues("redis:\n  url: redis://127.0.0.1:6379\ningest:\n  std_hashes: false\n");
    let got: Vec<_> = found.iter().map(|i| (i.field.as_str(), i.line)).collect();
    assert_eq!(got, [("ingest.std_hashes", Some(4))]);
    let config = Config::from_str("ingest:\n  std_hashes: false\n").expect("valid without redis");
    assert!(!config.ingest.std_hashes);
    assert!(!config.index_options().std_layer);
    assert!(
        Config::from_str("")
            .expect("empty config")
            .ingest
            .std_hashes
    );
}

#[test]
fn replay_ports_overlapping_a_later_rank_are_refused() {
    // The example as it shipped before: rank 1 would publish on the replay port 5558.
    let found = issues(&target("tcp://h:5557", "tcp://h:5558", 2));
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].field, "targets[0].replay_endpoint");
    assert_eq!(found[0].line, Some(2));
    assert!(found[0].what.contains("5558..=5559"), "{}", found[0]);
    assert!(found[0].what.contains("5557..=5558"), "{}", found[0]);
}

#[test]
fn replay_port_equal_to_the_endpoint_is_refused() {
    let found = issues(&target("tcp://h:5557", "tcp://H:5557", 1));
    assert_eq!(found[0].field, "targets[0].replay_endpoint", "{found:?}");
    // Below the endpoint, overlapping from the other side.
    let found = issues(&target("tcp://h:5557", "tcp://h:5555", 3));
    assert_eq!(found[0].field, "targets[0].replay_endpoint", "{found:?}");
}

#[test]
fn disjoint_port_ranges_and_other_hosts_are_accepted() {
    for (endpoint, replay, ranks) in [
        ("tcp://h:5557", "tcp://h:5559", 2),
        ("tcp://h:5557", "tcp://h:5554", 3),
        ("tcp://h:5557", "tcp://h:5558", 1),
        ("tcp://h:5557", "tcp://other:5557", 4),
    ] {
        let config = Config::from_str(&target(endpoint, replay, ranks));
        assert!(config.is_ok(), "{endpoint} {replay} x{ranks}: {config:?}");
    }
}

#[test]
fn every_section_reports_at_once() {
    let text = format!(
        "redis:\n  flush_interval_ms: 0\napi:\n  listen: nope\ntier_weights:\n  gpu: 2.0\n{}",
        target("tcp://h:5557", "tcp://h:5558", 2)
    );
    let found = issues(&text);
    let got: Vec<_> = found.iter().map(|i| (i.field.as_str(), i.line)).collect();
    assert_eq!(
        got,
        [
            ("redis.flush_interval_ms", Some(2)),
            ("api.listen", Some(4)),
            ("tier_weights.gpu", Some(6)),
            ("targets[0].replay_endpoint", Some(8)),
        ]
    );
}

#[test]
fn background_pass_settings_refuse_zero_and_a_refresh_past_kthenas_gc() {
    let found = issues(
        "redis:\n  anti_entropy_interval_s: 0\n  anti_entropy_max_commands_per_s: 0\n  refresh_after_s: 86400\n",
    );
    let got: Vec<_> = found.iter().map(|i| (i.field.as_str(), i.line)).collect();
    assert_eq!(
        got,
        [
            ("redis.anti_entropy_interval_s", Some(2)),
            ("redis.anti_entropy_max_commands_per_s", Some(3)),
            ("redis.refresh_after_s", Some(4)),
        ]
    );
    assert!(found[2].what.contains("86400"), "{}", found[2]);
    assert_eq!(
        issues("redis:\n  refresh_after_s: 0\n")[0].field,
        "redis.refresh_after_s"
    );
}

#[test]
fn background_pass_settings_are_taken_as_written_with_defaults() {
    let text = "redis:\n  anti_entropy_interval_s: 5\n  anti_entropy_max_commands_per_s: 300\n  refresh_after_s: 1\n";
    let redis = Config::from_str(text).unwrap().redis.unwrap();
    assert_eq!(redis.anti_entropy_interval, Duration::from_secs(5));
    assert_eq!(redis.anti_entropy_max_commands_per_s, 300);
    assert_eq!(redis.refresh_after_s, 1);
    let redis = Config::from_str("redis:\n  url: redis://h:1/0\n")
        .unwrap()
        .redis
        .unwrap();
    assert_eq!(redis.anti_entropy_interval, Duration::from_secs(60));
    assert_eq!(redis.anti_entropy_max_commands_per_s, 1000);
    assert_eq!(redis.refresh_after_s, 43_200);
}

#[test]
fn cluster_nodes_make_a_cluster_target_and_exclude_a_url() {
    let text = "redis:\n  cluster_nodes: [redis://h:1, 'redis://:pw@h:2']\n";
    let redis = Config::from_str(text).unwrap().redis.unwrap();
    assert_eq!(
        redis.target,
        kvindex::store::redis::RedisTarget::Cluster(vec![
            "redis://h:1".into(),
            "redis://:pw@h:2".into()
        ])
    );
    assert!(!redis.target.shown().contains("pw"), "{}", redis.target);

    let found = issues("redis:\n  url: redis://h:1/0\n  cluster_nodes: [redis://h:2]\n");
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        (found[0].field.as_str(), found[0].line),
        ("redis.cluster_nodes", Some(3))
    );
    assert!(found[0].what.contains("redis.url"), "{}", found[0]);

    let found = issues("redis:\n  cluster_nodes: []\n");
    assert_eq!(found[0].field, "redis.cluster_nodes");
    let found = issues("redis:\n  cluster_nodes: [redis://h:1, http://h:2]\n");
    assert_eq!(found[0].field, "redis.cluster_nodes[1]");
}

/// Freed model names are kept for the mirror, which resolves a delta's model after
/// the fact, and not at all without one.
#[test]
fn freed_model_names_are_kept_only_with_a_mirror() {
    let with_mirror = Config::from_str("redis:\n  url: redis://127.0.0.1:6379\n").unwrap();
    assert_eq!(
        with_mirror.index_options().freed_model_names,
        kvindex::index::DEFAULT_FREED_MODEL_NAMES
    );
    let in_memory = Config::from_str("").unwrap();
    assert_eq!(in_memory.index_options().freed_model_names, 0);
}

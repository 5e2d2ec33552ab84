//! The config file's parsing and validation, through the public API.

use std::time::Duration;

use super::*;
use crate::redis_layout::ValueFormat;
use crate::shard::Shard;

const ISSUE_SHAPE: &str = r#"
redis:
  url: redis://127.0.0.1:6379/0
  value_format: tiered          # or: timestamp
api:
  listen: 127.0.0.1:8080
metrics:
  listen: 127.0.0.1:9090
targets:
  - pod: vllm-0
    namespace: default
    model: meta-llama/Llama-3.1-8B-Instruct
    engine: vllm
    endpoint: tcp://vllm-0.vllm.default.svc:5557
    replay_endpoint: tcp://vllm-0.vllm.default.svc:5559   # optional; rank r: port + r
    topic: ""                                             # optional; "" = all
    dp_ranks: 2                                           # optional; default 1
"#;

#[test]
fn the_issue_shape_parses_as_written() {
    let c = Config::from_str(ISSUE_SHAPE).unwrap();
    let t = &c.targets[0];
    assert_eq!(t.pod_id(), "vllm-0.default");
    assert_eq!(t.dp_ranks, 2);
    assert_eq!(
        t.endpoint.for_rank(1).as_deref(),
        Some("tcp://vllm-0.vllm.default.svc:5558")
    );
    assert_eq!(c.redis.unwrap().value_format, ValueFormat::Tiered);
    assert_eq!(c.api.unwrap().listen.port(), 8080);
}

#[test]
fn no_sections_means_embedded_defaults() {
    let c = Config::from_str("targets: []\n").unwrap();
    assert!(c.redis.is_none() && c.api.is_none());
    assert_eq!(c.metrics_listen.to_string(), "127.0.0.1:9090");
}

#[test]
fn unknown_keys_are_rejected_with_their_line() {
    let err = Config::from_str("metrics:\n  listn: 1.2.3.4:5\n").unwrap_err();
    let text = err.to_string();
    assert!(text.contains("listn"), "{text}");
    assert!(text.contains('2'), "{text}");
}

#[test]
fn every_issue_is_reported_at_once_with_lines() {
    let text = "tier_weights:\n  gpu: 1.5\ntargets:\n  - pod: a\n    model: m\n    engine: nope\n    endpoint: http://x\n  - pod: b\n    model: m\n    engine: vllm\n    endpoint: tcp://h:1\n    dp_ranks: 0\n";
    let ConfigError::Invalid(issues) = Config::from_str(text).unwrap_err() else {
        panic!("expected validation issues");
    };
    let fields: Vec<_> = issues.iter().map(|i| i.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "tier_weights.gpu",
            "targets[0].engine",
            "targets[0].endpoint",
            "targets[1].dp_ranks"
        ]
    );
    assert_eq!(issues[1].line, Some(4));
    assert_eq!(issues[3].line, Some(8));
}

#[test]
fn a_targets_frame_cap_overrides_the_ingest_one_and_must_be_at_least_1() {
    let target = |cap: &str| {
        format!("ingest:\n  max_frame_bytes: 2048\ntargets:\n  - pod: a\n    model: m\n    engine: vllm\n    endpoint: tcp://h:1\n{cap}")
    };
    let config = Config::from_str(&target("    max_frame_bytes: 512\n")).unwrap();
    assert_eq!(config.targets[0].max_frame_bytes, Some(512));
    let shown = config.to_json();
    assert_eq!(shown["targets"][0]["max_frame_bytes"], 512, "{shown}");
    let inherited = Config::from_str(&target("")).unwrap();
    assert_eq!(inherited.targets[0].max_frame_bytes, None);
    assert_eq!(inherited.to_json()["targets"][0]["max_frame_bytes"], 2048);
    let ConfigError::Invalid(issues) =
        Config::from_str(&target("    max_frame_bytes: 0\n")).unwrap_err()
    else {
        panic!("expected validation issues");
    };
    assert_eq!(issues[0].field, "targets[0].max_frame_bytes");
    assert_eq!(issues[0].line, Some(4));
}

#[test]
fn environment_overrides_the_file() {
    let env: std::collections::HashMap<String, String> = [
        (
            "KVINDEX_REDIS_URL".to_owned(),
            "redis://127.0.0.1:6380/2".to_owned(),
        ),
        (
            "KVINDEX_METRICS_LISTEN".to_owned(),
            "127.0.0.1:0".to_owned(),
        ),
    ]
    .into();
    let c = Config::from_str_with_env(ISSUE_SHAPE, &env).unwrap();
    assert_eq!(
        c.redis.unwrap().target,
        RedisTarget::Single("redis://127.0.0.1:6380/2".into())
    );
    assert_eq!(c.metrics_listen.port(), 0);
}

fn env(pairs: &[(&str, &str)]) -> std::collections::HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[test]
fn an_empty_token_is_an_error_never_auth_off() {
    let file = "api:\n  token: secret\n";
    for empty in ["", "  "] {
        let vars = env(&[("KVINDEX_API_TOKEN", empty)]);
        let err = Config::from_str_with_env(file, &vars).unwrap_err();
        assert!(err.to_string().contains("KVINDEX_API_TOKEN"), "{err}");
        // Without an `api:` section too.
        let err = Config::from_str_with_env("", &vars).unwrap_err();
        assert!(err.to_string().contains("KVINDEX_API_TOKEN"), "{err}");
    }
    let err = Config::from_str("api:\n  token: ''\n").unwrap_err();
    assert!(err.to_string().contains("api.token (line 2)"), "{err}");
}

#[test]
fn check_config_shows_whether_a_token_is_set_never_its_value() {
    let shown = |text: &str, vars: &[(&str, &str)]| {
        let c = Config::from_str_with_env(text, &env(vars)).unwrap();
        let json = c.to_json();
        assert!(!json.to_string().contains("secret"), "{json}");
        json["api"]["token"].as_str().unwrap().to_owned()
    };
    assert_eq!(shown("api: {}\n", &[]), "not set");
    assert_eq!(shown("api:\n  token: secret\n", &[]), "set");
    assert_eq!(
        shown("api: {}\n", &[("KVINDEX_API_TOKEN", "secret2")]),
        "set"
    );
}

#[test]
fn shard_defaults_to_one_replica_and_shows_in_check_config() {
    let c = Config::from_str("targets: []\n").unwrap();
    assert_eq!(c.shard, Shard::SINGLE);
    let text = "redis: {}\nshard: {index: 2, count: 3}\ntargets:\n  - {pod: vllm-0, model: m, engine: vllm, endpoint: 'tcp://h:1'}\n";
    let c = Config::from_str(text).unwrap();
    assert_eq!(c.shard, Shard { index: 2, count: 3 });
    let json = c.to_json();
    assert_eq!(json["shard"]["index"], 2);
    assert_eq!(json["shard"]["count"], 3);
    // vllm-0.default belongs to shard 0 of 3 (golden value in shard.rs).
    assert_eq!(json["targets"][0]["shard"], 0);
    assert_eq!(json["shard"]["owned_targets"], 0);
}

#[test]
fn bad_shard_settings_name_their_field() {
    let issue = |text: &str, vars: &[(&str, &str)]| {
        Config::from_str_with_env(text, &env(vars))
            .unwrap_err()
            .to_string()
    };
    let got = issue("redis: {}\nshard: {index: 3, count: 3}\n", &[]);
    assert!(
        got.contains("shard.index (line 2): 3 must be below shard.count (3)"),
        "{got}"
    );
    let got = issue("redis: {}\nshard:\n  count: 0\n", &[]);
    assert!(
        got.contains("shard.count (line 3): must lie in 1..=1024"),
        "{got}"
    );
    let got = issue("redis: {}\nshard: {count: 2}\n", &[]);
    assert!(
        got.contains("shard.index: is required when shard.count is 2"),
        "{got}"
    );
    let got = issue("shard: {index: 0, count: 2}\n", &[]);
    assert!(
        got.contains("shard.count (line 1): more than one replica needs `redis:`"),
        "{got}"
    );
    let got = issue("redis: {}\n", &[("KVINDEX_SHARD_COUNT", "three")]);
    assert!(
        got.contains("KVINDEX_SHARD_COUNT: `three` is not a number"),
        "{got}"
    );
    let got = issue(
        "redis: {}\nshard: {count: 4}\n",
        &[("KVINDEX_SHARD_INDEX", "4")],
    );
    assert!(
        got.contains("KVINDEX_SHARD_INDEX: 4 must be below shard.count (4)"),
        "{got}"
    );
    let got = issue(
        "redis: {}\nshard: {count: 4}\n",
        &[("KVINDEX_SHARD_INDEX", "kvindex-x")],
    );
    assert!(
        got.contains("KVINDEX_SHARD_INDEX: `kvindex-x` is neither a number"),
        "{got}"
    );
    let got = issue("redis: {}\nshard: {index: 0, count: 1, size: 2}\n", &[]);
    assert!(got.contains("size"), "{got}");
}

#[test]
fn the_environment_sets_the_shard_and_takes_a_statefulset_pod_name() {
    let file = "redis: {}\nshard: {index: 0, count: 2}\n";
    let vars = env(&[
        ("KVINDEX_SHARD_INDEX", "kvindex-2"),
        ("KVINDEX_SHARD_COUNT", "3"),
    ]);
    let c = Config::from_str_with_env(file, &vars).unwrap();
    assert_eq!(c.shard, Shard { index: 2, count: 3 });
    let vars = env(&[("KVINDEX_SHARD_INDEX", "1"), ("KVINDEX_SHARD_COUNT", "2")]);
    let c = Config::from_str_with_env("redis: {}\n", &vars).unwrap();
    assert_eq!(c.shard, Shard { index: 1, count: 2 });
}

#[test]
fn duplicate_pods_are_an_error() {
    let t = "  - {pod: a, model: m, engine: vllm, endpoint: 'tcp://h:1'}\n";
    let err = Config::from_str(&format!("targets:\n{t}{t}")).unwrap_err();
    assert!(err.to_string().contains("already targets[0]"), "{err}");
}

#[test]
fn ha_takes_a_bounded_lease_ttl_and_shows_in_check_config() {
    let c = Config::from_str("redis:\n  url: redis://127.0.0.1:6379/0\nha: {}\n").unwrap();
    let ha = c.ha.unwrap();
    assert_eq!(ha.lease_ttl, crate::settings::redis::DEFAULT_LEASE_TTL);
    assert_eq!(c.to_json()["ha"]["effective"], true);
    let c = Config::from_str("ha:\n  lease_ttl_ms: 800\n").unwrap();
    assert_eq!(c.ha.unwrap().lease_ttl, Duration::from_millis(800));
    // Without Redis it is accepted and says it has no effect.
    assert_eq!(c.to_json()["ha"]["effective"], false);
    assert!(Config::from_str("").unwrap().ha.is_none());
    for bad in [0, 199, 60_001] {
        let err = Config::from_str(&format!("ha:\n  lease_ttl_ms: {bad}\n")).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("ha.lease_ttl_ms (line 2)") && text.contains("200 … 60000"),
            "{text}"
        );
    }
    let err = Config::from_str("ha:\n  ttl: 5\n").unwrap_err();
    assert!(err.to_string().contains("ttl"), "{err}");
}

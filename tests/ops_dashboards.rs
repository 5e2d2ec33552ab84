//! The Grafana dashboard, the Prometheus alerts and the user docs name only metrics a running
//! daemon exports: a daemon is driven through every path those panels and alerts watch (ingest, a
//! filled gap, a failed replay and reset, a bad message, an invalid event, API calls, a
//! routed request judged by feedback, the Redis mirror) and its `/metrics` is scraped.

// The simulated engines of `kvindex demo`, included by path: private to the binary.
#[allow(dead_code)]
#[path = "../src/sim/mod.rs"]
mod sim;

mod util;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use kvindex::config::Config;
use rmpv::Value as V;
use serde_json::Value;
use sim::{bundled, SimEngine};
use util::{http_get, http_request, test_limits, unbound_port, wait_until};

/// Redis db of this test (emptied at the end).
const DB: u32 = 11;

/// The user docs whose metric names must all be exported.
const USER_DOCS: [&str; 6] = [
    "README.md",
    "docs/operating.md",
    "docs/configuration.md",
    "docs/commands.md",
    "docs/http-api.md",
    "docs/deploying.md",
];

/// Every `expr` string anywhere in a JSON or YAML document.
fn exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("expr", Value::String(e)) => out.push(e.clone()),
                    _ => exprs(v, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|v| exprs(v, out)),
        _ => {}
    }
}

/// The metric names a PromQL expression uses (`kvindex_…`), histogram suffixes folded.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = expr;
    while let Some(i) = rest.find("kvindex_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(name);
        names.insert(base.to_owned());
        rest = &tail[end..];
    }
    names
}

fn used_names() -> (BTreeSet<String>, usize) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("deploy/grafana/kvindex.json")).unwrap(),
    )
    .unwrap();
    let alerts: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(root.join("deploy/prometheus/alerts.yaml")).unwrap(),
    )
    .unwrap();
    let rules = alerts["groups"][0]["rules"].as_array().unwrap();
    let wanted = [
        "KvindexTargetDown",
        "KvindexTargetSilent",
        "KvindexMirrorDirty",
        "KvindexSourceResets",
        "KvindexDecodeErrors",
        "KvindexRouteOverPredictions",
    ];
    for alert in wanted {
        assert!(rules.iter().any(|r| r["alert"] == alert), "{alert} missing");
    }
    let mut all = Vec::new();
    exprs(&dashboard, &mut all);
    let panels = all.len();
    exprs(&alerts, &mut all);
    // The metrics the user docs name too (discovery's metrics are checked by
    // tests/k8s_discovery.rs, which runs discovery against a fake API server; HA's by
    // tests/it/ha_lease.rs, whose replicas run with `ha:`).
    let docs: String = USER_DOCS
        .iter()
        .map(|f| std::fs::read_to_string(root.join(f)).unwrap())
        .collect();
    let documented: BTreeSet<String> = metric_names(&docs)
        .into_iter()
        .filter(|n| !n.starts_with("kvindex_discovery_") && !n.starts_with("kvindex_ha_"))
        .collect();
    assert!(documented.len() >= 25, "{documented:?}");
    let mut used: BTreeSet<String> = all.iter().flat_map(|e| metric_names(e)).collect();
    used.extend(documented);
    (used, panels)
}

/// A vLLM batch whose one `BlockStored` has no block hashes: an invalid event.
fn invalid_event_payload() -> Vec<u8> {
    let ev = V::Array(vec![
        V::from("BlockStored"),
        V::Array(vec![]),
        V::Nil,
        V::Array((0..16).map(V::from).collect()),
        V::from(16),
        V::Nil,
    ]);
    let mut buf = Vec::new();
    rmpv::encode::write_value(&mut buf, &V::Array(vec![V::F64(1.0), V::Array(vec![ev])])).unwrap();
    buf
}

fn frames(seq: u64, payload: Vec<u8>) -> Vec<Vec<u8>> {
    vec![Vec::new(), seq.to_be_bytes().to_vec(), payload]
}

fn messages_of(d: &kvindex::Daemon, pod: &str) -> u64 {
    d.supervisor
        .status()
        .iter()
        .find(|t| t.target.pod_id() == pod)
        .map_or(0, |t| t.ranks[0].stats.messages)
}

/// Publishes seq 0 until the daemon has it (the subscription may not have reached the PUB).
async fn first(d: &kvindex::Daemon, pod: &str, engine: &mut SimEngine, f: &[Vec<u8>]) {
    for _ in 0..50 {
        engine.publish(0, f).await.unwrap();
        if wait_until(Duration::from_millis(300), || messages_of(d, pod) > 0).await {
            return;
        }
    }
    panic!("{pod} never received its first message");
}

#[test]
fn names_are_extracted_from_expressions() {
    let n = metric_names("histogram_quantile(0.9, sum by (le) (rate(kvindex_api_request_duration_seconds_bucket[5m]))) / kvindex_x");
    assert_eq!(
        n.into_iter().collect::<Vec<_>>(),
        ["kvindex_api_request_duration_seconds", "kvindex_x"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_in_the_dashboard_and_alerts_is_exported() {
    let (used, panel_exprs) = used_names();
    assert!(panel_exprs >= 15 && used.len() >= 20, "{used:?}");

    let recording = bundled::VLLM_0_33.rank(0);
    let mut good = SimEngine::bind(1, 0, 0).await.unwrap();
    let mut broken = SimEngine::bind(1, 0, 0).await.unwrap();
    let nowhere = unbound_port();
    let yaml = format!(
        "redis:\n  url: redis://127.0.0.1:6379/{DB}\napi:\n  listen: 127.0.0.1:0\nmetrics:\n  listen: 127.0.0.1:0\ntargets:\n\
         - {{pod: good, namespace: t, model: m, engine: vllm, endpoint: 'tcp://127.0.0.1:{}', replay_endpoint: 'tcp://127.0.0.1:{}'}}\n\
         - {{pod: broken, namespace: t, model: m, engine: vllm, endpoint: 'tcp://127.0.0.1:{}', replay_endpoint: 'tcp://127.0.0.1:{nowhere}'}}\n",
        good.pub_port(),
        good.replay_port(),
        broken.pub_port()
    );
    let d = kvindex::Daemon::start(Config::from_str(&yaml).unwrap(), None, test_limits())
        .await
        .unwrap();

    // good: seq 1 lost on the wire and replayed, seq 3 truncated, seq 4 an invalid event.
    first(&d, "good.t", &mut good, &recording[0].frames).await;
    good.drop_on_wire(0, &recording[1].frames).unwrap();
    good.publish(0, &recording[2].frames).await.unwrap();
    let mut cut = recording[3].frames[2].clone();
    cut.truncate(cut.len() / 2);
    good.publish(0, &frames(3, cut)).await.unwrap();
    good.publish(0, &frames(4, invalid_event_payload()))
        .await
        .unwrap();
    // broken: a gap its replay endpoint cannot fill, so the source is reset.
    first(&d, "broken.t", &mut broken, &recording[0].frames).await;
    broken.publish(0, &recording[2].frames).await.unwrap();

    let api = d.api_addr.unwrap();
    let score = r#"{"model": "m", "tokens": [1, 2, 3], "pods": ["good.t"]}"#;
    assert_eq!(http_request(api, "POST", "/v1/score", score).await.0, 200);
    assert_eq!(http_get(api, "/v1/nothing-here").await.0, 404);
    // A routed request judged by its feedback, and feedback for an id never routed.
    let routed = r#"{"model": "m", "tokens": [1, 2, 3], "pod": "good.t", "request_id": "r1"}"#;
    assert_eq!(http_request(api, "POST", "/v1/routed", routed).await.0, 204);
    let feedback = r#"{"request_id": "r1", "cached_tokens": 0}"#;
    assert_eq!(
        http_request(api, "POST", "/v1/feedback", feedback).await.0,
        204
    );
    let unknown = r#"{"request_id": "never", "cached_tokens": 0}"#;
    assert_eq!(
        http_request(api, "POST", "/v1/feedback", unknown).await.0,
        404
    );

    // Gauges are refreshed every 5 s: poll until every name shows up.
    let mut missing = used.clone();
    let end = std::time::Instant::now() + Duration::from_secs(30);
    while !missing.is_empty() && std::time::Instant::now() < end {
        let (_, text) = http_get(d.metrics_addr, "/metrics").await;
        let exported: BTreeSet<String> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split(['{', ' ']).next())
            .flat_map(metric_names)
            .collect();
        missing = used.difference(&exported).cloned().collect();
        if !missing.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let (_, text) = http_get(d.metrics_addr, "/metrics").await;
    d.shutdown(Duration::from_secs(5)).await;
    good.close().await;
    broken.close().await;
    let client = redis::Client::open(format!("redis://127.0.0.1:6379/{DB}")).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("FLUSHDB").query_async(&mut con).await.unwrap();
    assert!(missing.is_empty(), "not exported: {missing:?}\n{text}");
    // The API series carry the route and status.
    assert!(
        text.contains(r#"kvindex_api_requests_total{route="/v1/score",status="200"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"kvindex_api_requests_total{route="other",status="404"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"kvindex_route_predictions_total{outcome="exact"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"kvindex_api_request_duration_seconds_bucket{route="/v1/score",le="#),
        "{text}"
    );
}

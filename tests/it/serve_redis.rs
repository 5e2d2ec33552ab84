//! The daemon with a `redis:` section: what it ingests reaches Redis in kthena's layout.
//! Needs a Redis on 127.0.0.1:6379 (CI starts one).

use crate::util;

use std::time::Duration;

use kvindex::config::Config;
use kvindex::store::redis::MirrorStop;
use kvindex::store::redis::{block_key, parse_field_value};
use util::*;

/// Regression: the metrics routes and the gauge task hold the mirror too,
/// so shutdown used to fall back to a bounded flush and never stopped the writer in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_right_after_ingest_with_metrics_stops_the_mirror_in_order() {
    let (mut publisher, port) = FakePub::bind_any().await;
    // db 13 and a unique model keep this test apart from others sharing the Redis.
    let model = format!("serve-redis-{}", std::process::id());
    let text = format!(
        "redis:\n  url: redis://127.0.0.1:6379/13\nmetrics:\n  listen: 127.0.0.1:0\ntargets:\n{}",
        target_yaml("rd", &model, "vllm", port, None, 1)
    );
    let config = Config::from_str(&text).unwrap();
    let daemon = kvindex::Daemon::start(config, None, test_limits())
        .await
        .unwrap();
    wait_connected(&daemon, "rd.test", 0, 1, &mut publisher).await;
    let msgs = messages("vllm-e01-0.9.0.jsonl", None);
    for m in &msgs {
        publisher.send(&m.frames).await;
    }
    wait_messages(&daemon, "rd.test", 0, msgs.len() as u64).await;
    let dump = daemon.index.dump();
    assert!(!dump.is_empty());
    let stop = daemon.shutdown(Duration::from_secs(5)).await;
    assert_eq!(stop, Some(MirrorStop::Orderly));
    let client = redis::Client::open("redis://127.0.0.1:6379/13").unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    for e in &dump {
        let key = block_key(&e.model, e.std_hash.parse().unwrap());
        let v: Option<String> = redis::cmd("HGET")
            .arg(&key)
            .arg(&e.pod)
            .query_async(&mut conn)
            .await
            .unwrap();
        let v = v.unwrap_or_else(|| panic!("{key} {}: no field", e.pod));
        let owner = parse_field_value(&v);
        assert_eq!(owner.written_at, Some(u64::from(e.stored_at)), "{key}: {v}");
        let medium_ok = if e.media.is_empty() {
            owner.medium.is_empty()
        } else {
            e.media.iter().any(|m| m == owner.medium)
        };
        assert!(medium_ok, "{key}: {v} for media {:?}", e.media);
    }
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("matrix:kv:block:{model}@*"))
        .query_async(&mut conn)
        .await
        .unwrap();
    if !keys.is_empty() {
        let _: () = redis::cmd("DEL")
            .arg(&keys)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
}

//! The daemon with a `redis:` section: what it ingests reaches Redis in kthena's layout.
//! Needs a Redis on 127.0.0.1:6379 (CI starts one).

mod util;

use std::time::Duration;

use kvindex::config::Config;
use util::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingested_blocks_reach_redis_and_shutdown_flushes() {
    let (mut publisher, port) = FakePub::bind_any().await;
    // db 13 and a unique model keep this test apart from others sharing the Redis.
    let model = format!("serve-redis-{}", std::process::id());
    let text = format!(
        "redis:\n  url: redis://127.0.0.1:6379/13\nmetrics:\n  listen: 127.0.0.1:0\ntargets:\n{}",
        target_yaml("rd", &model, "vllm", port, None, 1)
    );
    let config = Config::from_str(&text).unwrap();
    let daemon = kvindex::commands::serve::Daemon::start(config, None, test_limits())
        .await
        .unwrap();
    wait_connected(&daemon, "rd.test", 0, 1, &mut publisher).await;
    let msgs = messages("vllm-e01-0.9.0.jsonl", None);
    for m in &msgs {
        publisher.send(&m.frames).await;
    }
    wait_messages(&daemon, "rd.test", 0, msgs.len() as u64).await;
    let dump = daemon.index.dump();
    daemon.shutdown(Duration::from_secs(5)).await;
    let client = redis::Client::open("redis://127.0.0.1:6379/13").unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    for e in &dump {
        let key = format!("matrix:kv:block:{}@{}", e.model, e.std_hash);
        let v: Option<String> = redis::cmd("HGET")
            .arg(&key)
            .arg(&e.pod)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(v.is_some(), "{key} {}", e.pod);
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

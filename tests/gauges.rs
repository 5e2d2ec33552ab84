//! Gauges that are true. After a removal burst, `kvindex_resident_blocks` and
//! `kvindex_targets_connected` on the metrics listener equal the index and the target list
//! within a refresh or two (a medium that empties reads 0, not its last value). Its own
//! test binary: the metrics recorder is process-wide, so another daemon would move the same
//! gauges.

mod util;

use std::time::Duration;

use kvindex::config::Config;
use kvindex::Daemon;
use rmpv::Value as V;
use util::vllm_frames::{self, message};
use util::*;

/// A store of one 16-token block with engine hash `hash` on `medium`.
fn store(hash: u64, medium: &str) -> V {
    vllm_frames::store_one(hash, medium, None)
}

/// A remove of `hashes` from every medium.
fn remove(hashes: std::ops::Range<u64>) -> V {
    V::Array(vec![
        V::from("BlockRemoved"),
        V::Array(hashes.map(V::from).collect()),
        V::Nil,
    ])
}

/// The value of an unlabelled or labelled sample line of `/metrics`, 0 when absent.
fn sample(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

async fn metrics(d: &Daemon) -> String {
    http_get(d.metrics_addr, "/metrics").await.1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gauges_equal_the_index_after_a_removal_burst() {
    let (mut pubs, port) = FakePub::bind_ranks(1).await;
    let text = format!(
        "metrics:\n  listen: 127.0.0.1:0\ntargets:\n{}",
        target_yaml("a", "m", "vllm", port, None, 1)
    );
    let config = Config::from_str(&text).unwrap();
    let d = Daemon::start(config, None, test_limits()).await.unwrap();
    wait_connected(&d, "a.test", 0, 1, &mut pubs[0]).await;
    // 1,000 blocks on GPU, 500 of them also on CPU.
    let gpu = (0..1000).map(|h| store(h, "GPU")).collect();
    let cpu = (0..500).map(|h| store(h, "CPU")).collect();
    pubs[0].send(&message(0, gpu)).await;
    pubs[0].send(&message(1, cpu)).await;
    wait_messages(&d, "a.test", 0, 2).await;
    let gauges_match = |text: &str, gpu: f64, cpu: f64| {
        sample(text, r#"kvindex_resident_blocks{medium="GPU"}"#) == gpu
            && sample(text, r#"kvindex_resident_blocks{medium="CPU"}"#) == cpu
            && sample(text, "kvindex_targets_connected") == 1.0
    };
    let mut text = String::new();
    for _ in 0..250 {
        text = metrics(&d).await;
        if gauges_match(&text, 1000.0, 500.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(gauges_match(&text, 1000.0, 500.0), "{text}");
    // The burst: every block goes.
    pubs[0].send(&message(2, vec![remove(0..1000)])).await;
    wait_messages(&d, "a.test", 0, 3).await;
    assert!(d.index.dump().is_empty());
    assert_eq!(d.index.entry_counts().0, 0);
    let mut ok = false;
    for _ in 0..250 {
        text = metrics(&d).await;
        ok = gauges_match(&text, 0.0, 0.0)
            && text.contains(r#"kvindex_resident_blocks{medium="GPU"} 0"#);
        if ok {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(ok, "{text}");
    d.shutdown(Duration::from_secs(5)).await;
}

//! First-run behaviour a new operator meets: endpoints that do not resolve or refuse are
//! said once at WARN (target and reason) and shown in `/v1/pods` and `/readyz`; `serve` says
//! where its listeners are and what it flushed.

// The simulated engines of `kvindex demo`, included by path: private to the binary.
#[allow(dead_code)]
#[path = "../src/sim/mod.rs"]
mod sim;

mod util;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvindex::config::Config;
use kvindex::ingest::PodsView;
use util::{http_get, test_limits, unbound_port, wait_until};

/// Log lines captured from the global subscriber (this binary has one test, so one owner).
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_targets_are_said_once_and_shown_with_their_error() {
    let logs = Captured::default();
    let writer = logs.clone();
    tracing_subscriber::fmt()
        .with_env_filter("info")
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .init();
    let refused = unbound_port();
    let mut live = sim::SimEngine::bind(1, 0, 0).await.unwrap();
    let yaml = format!(
        "api:\n  listen: 127.0.0.1:0\nmetrics:\n  listen: 127.0.0.1:0\ntargets:\n\
         - {{pod: nowhere, namespace: t, model: m, engine: vllm, endpoint: 'tcp://kvindex-no-such-host.invalid:5557'}}\n\
         - {{pod: refused, namespace: t, model: m, engine: vllm, endpoint: 'tcp://127.0.0.1:{refused}'}}\n\
         - {{pod: live, namespace: t, model: m, engine: vllm, endpoint: 'tcp://127.0.0.1:{}'}}\n",
        live.pub_port()
    );
    let config = Config::from_str(&yaml).unwrap();
    let d = kvindex::Daemon::start(config, None, test_limits())
        .await
        .unwrap();
    let api = d.api_addr.unwrap();

    // Several attempts fail (backoff 50 ms doubling to 1 s), each target has its last error.
    let dead = |pod: &str| pod != "live.t";
    let failing = wait_until(Duration::from_secs(20), || {
        let pods = d.supervisor.pods();
        pods.len() == 3
            && pods.iter().all(|p| p.last_error.is_some() == dead(&p.pod))
            && d.supervisor
                .status()
                .iter()
                .filter(|t| dead(&t.target.pod_id()))
                .all(|t| t.ranks[0].failed_connects >= 4)
    })
    .await;
    assert!(failing, "{:?}", d.supervisor.pods());

    // README: a dead target never delays the others: the live one ingests meanwhile.
    let recording = sim::bundled::VLLM_0_33.rank(0);
    let ingested = || {
        d.supervisor
            .pods()
            .iter()
            .any(|p| p.pod == "live.t" && p.counters.messages > 0)
    };
    for _ in 0..100 {
        // Sent until it arrives: the subscription may not have reached the PUB socket yet.
        live.publish(0, &recording[0].frames).await.unwrap();
        if wait_until(Duration::from_millis(200), ingested).await {
            break;
        }
    }
    assert!(ingested(), "{:?}", d.supervisor.pods());

    let (code, pods) = http_get(api, "/v1/pods").await;
    assert_eq!(code, 200, "{pods}");
    let body: serde_json::Value =
        serde_json::from_str(pods.split_once("\r\n\r\n").unwrap().1).unwrap();
    for p in body["pods"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["pod"] != "live.t")
    {
        assert_eq!(p["state"], "connecting", "{p}");
        assert_eq!(p["ranks_connected"], 0, "{p}");
        assert!(
            p["last_error"].as_str().unwrap().starts_with("rank 0: "),
            "{p}"
        );
    }

    // Not connected targets do not make the daemon unready; the body names them and why.
    let (code, ready) = http_get(d.metrics_addr, "/readyz").await;
    assert_eq!(code, 200, "{ready}");
    assert!(ready.contains("\r\n\r\nready\n"), "{ready}");
    for pod in ["nowhere.t", "refused.t"] {
        let line = ready.lines().find(|l| {
            l.starts_with(&format!(
                "target {pod} not connected: connecting (0/1 ranks), last error: rank 0: "
            ))
        });
        assert!(line.is_some(), "{ready}");
    }

    // One WARN per target for the whole streak, naming the target and the reason.
    let text = logs.text();
    for endpoint in [
        "tcp://kvindex-no-such-host.invalid:5557".to_owned(),
        format!("tcp://127.0.0.1:{refused}"),
    ] {
        let warns: Vec<&str> = text
            .lines()
            .filter(|l| {
                l.contains("WARN")
                    && l.contains("Cannot connect to the target")
                    && l.contains(&endpoint)
            })
            .collect();
        assert_eq!(warns.len(), 1, "{endpoint}:\n{text}");
        assert!(warns[0].contains("reason="), "{}", warns[0]);
    }

    // Start: where the listeners are; stop: what was flushed.
    assert!(
        text.contains(&format!("kvindex serve started: API at http://{api}, metrics at http://{}/metrics, 3 static targets.", d.metrics_addr)),
        "{text}"
    );
    d.shutdown(Duration::from_secs(5)).await;
    assert!(
        logs.text()
            .contains("kvindex serve stopped: no Redis mirror to flush"),
        "{}",
        logs.text()
    );
}

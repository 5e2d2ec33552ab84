//! Claims of the user docs (the README and docs/) that no other test pinned down, each
//! checked the way the docs state it: the CLI surface, exit codes, environment overrides,
//! `replay --dump`, `decode` error lines, and `/readyz` with Redis gone.

use crate::util;

use std::collections::HashMap;
use std::process::{Command, Output};
use std::time::Duration;

use kvindex::config::{Config, Env};

fn kvindex(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvindex"))
        .args(args)
        .env_remove("KVINDEX_LOG")
        .output()
        .unwrap()
}

fn fixture(name: &str) -> String {
    util::fixtures().join(name).display().to_string()
}

/// README: "Every command has `--help`."
#[test]
fn every_command_has_help() {
    for cmd in [
        "demo",
        "top",
        "decode",
        "replay",
        "serve",
        "record",
        "check-config",
        "score",
        "redis-dump",
    ] {
        let out = kvindex(&[cmd, "--help"]);
        assert!(out.status.success(), "{cmd}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("Usage:"),
            "{cmd}"
        );
    }
    let top = String::from_utf8(kvindex(&["--help"]).stdout).unwrap();
    assert!(
        top.contains("--log-format") && top.contains("KVINDEX_LOG"),
        "{top}"
    );
}

/// README (serve): "An invalid config is reported in full (every field, with its line …)
/// and exits with code 64 before anything is bound."
#[test]
fn an_invalid_config_exits_64_before_binding() {
    // The config's metrics port is held here: a bind attempt would fail with exit code 1.
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(
        &path,
        format!("metrics:\n  listen: 127.0.0.1:{port}\ntier_weights:\n  gpu: 3.0\ntargets:\n  - {{pod: a, model: m, engine: nope, endpoint: 'tcp://h:1'}}\n"),
    )
    .unwrap();
    let path = path.display().to_string();
    for args in [
        vec!["serve", "--config", &path],
        vec!["check-config", &path],
    ] {
        let out = kvindex(&args);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("gpu") && err.contains("engine"),
            "every field: {err}"
        );
        assert!(err.contains("line"), "with its line: {err}");
    }
}

/// README (check-config): "prints the resolved config (passwords and tokens redacted)".
#[test]
fn check_config_prints_the_resolved_config_redacted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ok.yaml");
    std::fs::write(
        &path,
        "redis:\n  url: redis://:hunter2@127.0.0.1:6379/3\napi:\n  listen: 127.0.0.1:8080\n  token: s3cret\ntargets: []\n",
    )
    .unwrap();
    let out = kvindex(&["check-config", &path.display().to_string()]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        !text.contains("hunter2") && !text.contains("s3cret"),
        "{text}"
    );
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    // The token shows only whether one is set, never its value.
    assert_eq!(v["api"]["token"], "set");
    assert!(
        v["redis"]["url"].as_str().unwrap().contains("***"),
        "{text}"
    );
    assert_eq!(
        v["metrics"]["listen"], "127.0.0.1:9090",
        "the default metrics listener"
    );
}

struct Vars(HashMap<&'static str, &'static str>);

impl Env for Vars {
    fn get(&self, name: &str) -> Option<String> {
        self.0.get(name).map(|v| (*v).to_owned())
    }
}

/// README (serve): "Environment overrides: `KVINDEX_REDIS_URL`, `KVINDEX_REDIS_VALUE_FORMAT`,
/// `KVINDEX_API_LISTEN`, `KVINDEX_API_TOKEN`, `KVINDEX_METRICS_LISTEN`."
#[test]
fn the_five_environment_overrides_win_over_the_file() {
    let file = "redis:\n  url: redis://127.0.0.1:6379/0\n  value_format: tiered\napi:\n  listen: 127.0.0.1:8080\n  token: from-file\nmetrics:\n  listen: 127.0.0.1:9090\n";
    let env = Vars(HashMap::from([
        ("KVINDEX_REDIS_URL", "redis://127.0.0.1:6380/2"),
        ("KVINDEX_REDIS_VALUE_FORMAT", "timestamp"),
        ("KVINDEX_API_LISTEN", "127.0.0.1:18080"),
        ("KVINDEX_API_TOKEN", "from-env"),
        ("KVINDEX_METRICS_LISTEN", "127.0.0.1:19090"),
    ]));
    let c = Config::from_str_with_env(file, &env).unwrap();
    let redis = c.redis.unwrap();
    assert_eq!(redis.target.urls(), ["redis://127.0.0.1:6380/2"]);
    assert_eq!(
        redis.value_format,
        kvindex::store::redis::ValueFormat::Timestamp
    );
    let api = c.api.unwrap();
    assert_eq!(api.listen.port(), 18080);
    assert_eq!(api.token.as_deref(), Some("from-env"));
    assert_eq!(c.metrics_listen.port(), 19090);
}

/// README (replay): "`--dump` writes the index in canonical sorted JSON: `[{"model",
/// "std_hash", "pod", "media": [...], "stored_at"}]`"; `--json` prints the summary as JSON.
#[test]
fn replay_dump_is_canonical_sorted_json() {
    let dir = tempfile::tempdir().unwrap();
    let out_path = dir.path().join("dump.json");
    let file = fixture("vllm-e13-0.33.0-bytes.jsonl");
    let out = kvindex(&[
        "replay",
        &file,
        "--pod",
        "p.ns",
        "--model",
        "m",
        "--dump",
        &out_path.display().to_string(),
        "--json",
    ]);
    assert!(out.status.success(), "{out:?}");
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let text = summary.to_string();
    for key in [
        "messages",
        "batches",
        "seq_gaps",
        "restarts",
        "decode_errors",
    ] {
        assert!(
            text.contains(&format!("\"{key}\"")),
            "summary lacks {key}: {text}"
        );
    }
    let dump: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&out_path).unwrap()).unwrap();
    assert!(!dump.is_empty());
    for e in &dump {
        let keys: Vec<&str> = e.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys.len(), 5, "{e}");
        for k in ["model", "std_hash", "pod", "media", "stored_at"] {
            assert!(keys.contains(&k), "{e}");
        }
        assert_eq!(e["pod"], "p.ns");
    }
    let parsed: Vec<kvindex::index::DumpEntry> =
        serde_json::from_value(serde_json::Value::from(dump)).unwrap();
    let mut sorted = parsed.clone();
    sorted.sort();
    assert_eq!(parsed, sorted, "sorted");
    // docs/architecture.md (choices): the store time is the unix second kvindex applied the
    // store at, not the engine's batch timestamp (the recording's batches carry an older one).
    let now = kvindex::ingest::unix_now();
    for e in &parsed {
        assert!(
            e.stored_at + 120 >= now && e.stored_at <= now + 1,
            "{e:?} vs {now}"
        );
    }
}

/// README (decode): "A message that cannot be decoded prints `{"seq": n|null, "error": "…"}`
/// and decoding goes on."
#[test]
fn decode_prints_an_error_line_and_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mixed.jsonl");
    let bad = std::fs::read_to_string(util::fixtures().join("malformed/truncated.jsonl")).unwrap();
    let good = std::fs::read_to_string(util::fixtures().join("vllm-e01-0.9.0.jsonl")).unwrap();
    std::fs::write(&path, format!("{}\n{good}", bad.trim())).unwrap();
    let out = kvindex(&["decode", &path.display().to_string()]);
    assert!(out.status.success(), "{out:?}");
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(lines[0]["error"].is_string(), "{}", lines[0]);
    assert!(lines[0].get("seq").is_some(), "{}", lines[0]);
    assert_eq!(
        lines.len(),
        1 + good.lines().filter(|l| !l.trim().is_empty()).count()
    );
    assert!(lines[1..].iter().all(|l| l.get("events").is_some()));
}

/// README (serve): `/readyz` answers 503 once a write to the configured Redis has failed,
/// until Redis answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_is_503_while_redis_writes_fail() {
    let Some(mut redis) = RedisServer::start() else {
        eprintln!("SKIPPED: no redis-server binary (`.ci/run` installs it)");
        return;
    };
    let mut engine = crate::sim::SimEngine::bind(1, 0, 0).await.unwrap();
    let yaml = format!(
        "redis:\n  url: redis://127.0.0.1:{}/0\nmetrics:\n  listen: 127.0.0.1:0\ntargets:\n  - {{pod: p, model: m, engine: vllm, endpoint: 'tcp://127.0.0.1:{}'}}\n",
        redis.port,
        engine.pub_port()
    );
    let d = kvindex::Daemon::start(Config::from_str(&yaml).unwrap(), None, util::test_limits())
        .await
        .unwrap();
    assert_eq!(util::http_get(d.metrics_addr, "/readyz").await.0, 200);
    redis.kill();
    // Each message stores blocks, so the mirror writes (and fails) after Redis is gone.
    let recording = crate::sim::bundled::VLLM_0_33.rank(0);
    let mut last = String::new();
    let end = std::time::Instant::now() + Duration::from_secs(30);
    for seq in 0u64.. {
        assert!(
            std::time::Instant::now() < end,
            "/readyz stayed ready with Redis gone: {last}"
        );
        let mut frames = recording[(seq % 2) as usize].frames.clone();
        frames[1] = seq.to_be_bytes().to_vec();
        engine.publish(0, &frames).await.unwrap();
        let (code, body) = util::http_get(d.metrics_addr, "/readyz").await;
        if code == 503 {
            assert!(body.contains("redis unreachable"), "{body}");
            break;
        }
        last = body;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Redis back on its port: the mirror reconciles and /readyz is 200 again.
    let _back = RedisServer::start_on(redis.port).unwrap();
    let end = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (code, body) = util::http_get(d.metrics_addr, "/readyz").await;
        if code == 200 {
            break;
        }
        assert!(
            std::time::Instant::now() < end,
            "/readyz stayed unready with Redis back: {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    d.shutdown(Duration::from_secs(2)).await;
    engine.close().await;
}

/// A `redis-server` child on a free port, without persistence; killed on drop.
struct RedisServer {
    port: u16,
    child: Option<std::process::Child>,
}

impl RedisServer {
    fn start() -> Option<RedisServer> {
        RedisServer::start_on(util::unbound_port())
    }

    fn start_on(port: u16) -> Option<RedisServer> {
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(std::process::Stdio::null())
            .spawn()
            .ok()?;
        let server = RedisServer {
            port,
            child: Some(child),
        };
        let end = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < end,
                "redis-server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(server)
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// docs/architecture.md (choices): "At most 22 distinct spellings are tracked; further unknown
/// spellings share one overflow slot, written as `OTHER`."
#[test]
fn media_spellings_past_the_slots_share_other() {
    use kvindex::medium::Medium;
    let media: Vec<Medium> = (0..40)
        .map(|i| Medium::intern(&format!("readme-tier-{i}")))
        .collect();
    let own: std::collections::BTreeSet<u8> = media
        .iter()
        .filter(|m| **m != Medium::OVERFLOW)
        .map(|m| m.slot())
        .collect();
    assert!(
        own.len() <= 22 - 12,
        "12 known names take their slots first: {own:?}"
    );
    assert!(media.iter().all(|m| m.slot() <= 23), "{media:?}");
    assert_eq!(media[39], Medium::OVERFLOW);
    assert_eq!(media[39].spelling(), "OTHER");
}

/// README (replay --redis): "URLs with a password and `rediss://` (TLS) are accepted".
#[test]
fn rediss_and_password_urls_are_accepted() {
    for url in [
        "rediss://:secret@127.0.0.1:6380/1",
        "redis://user:secret@127.0.0.1:6379/3",
    ] {
        let c = Config::from_str(&format!("redis:\n  url: {url}\n")).unwrap();
        assert_eq!(c.redis.unwrap().target.urls(), [url.to_owned()]);
    }
}

/// README (serve): SIGHUP reloads (logged, the process lives on), an invalid new file is
/// logged and the running targets are kept, SIGTERM exits 0.
#[test]
fn serve_keeps_its_targets_on_a_bad_reload_survives_sighup_and_exits_0_on_sigterm() {
    use std::io::BufRead;
    use std::sync::{Arc, Mutex};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("serve.yaml");
    let port = util::unbound_port();
    let good = format!(
        "api:\n  listen: 127.0.0.1:0\nmetrics:\n  listen: 127.0.0.1:0\ntargets:\n  - {{pod: a, namespace: t, model: m, engine: vllm, endpoint: 'tcp://127.0.0.1:{port}'}}\n"
    );
    std::fs::write(&path, &good).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvindex"))
        .args([
            "--log",
            "info",
            "serve",
            "--config",
            &path.display().to_string(),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let logs = Arc::new(Mutex::new(String::new()));
    let stderr = child.stderr.take().unwrap();
    let sink = logs.clone();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let mut l = sink.lock().unwrap();
            l.push_str(&line);
            l.push('\n');
        }
    });
    let wait_log = |what: &str| {
        let end = std::time::Instant::now() + Duration::from_secs(20);
        while !logs.lock().unwrap().contains(what) {
            assert!(
                std::time::Instant::now() < end,
                "no `{what}` in:\n{}",
                logs.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait_log("kvindex serve started: API at http://");
    let api = {
        let l = logs.lock().unwrap();
        let at = l.find("API at http://").unwrap() + "API at http://".len();
        l[at..].split(',').next().unwrap().to_owned()
    };
    let pods = || {
        let out = Command::new("curl")
            .args(["-s", &format!("http://{api}/v1/pods")])
            .output();
        out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    };

    std::fs::write(&path, "targets:\n  - {pod: b, engine: nope}\n").unwrap();
    wait_log("Config reload refused; keeping the running targets");
    if Command::new("curl").arg("--version").output().is_ok() {
        assert!(pods().contains("\"pod\":\"a.t\""), "{}", pods());
    }

    unsafe { libc::kill(child.id() as i32, libc::SIGHUP) };
    wait_log("SIGHUP: reloading the config.");
    assert!(
        child.try_wait().unwrap().is_none(),
        "SIGHUP must not end the daemon"
    );

    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let end = std::time::Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            std::time::Instant::now() < end,
            "serve did not exit on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
    wait_log("kvindex serve stopped");
}

/// An API over an index where `n` pods each hold the prompt's one block.
fn api_over(n: usize, limits: kvindex::api::ApiLimits) -> axum::Router {
    use kvindex::index::{Discard, SourceSpec};
    use kvindex::wire::{BlockHash, BlockStored, EngineBatch, Event};
    let index = kvindex::index::Index::new();
    for i in 0..n {
        let spec = SourceSpec {
            pod: format!("d{i}.ns"),
            model: "m".into(),
            engine: kvindex::wire::Engine::Vllm,
            dp_rank: 0,
        };
        let source = index.register_source(&spec).unwrap();
        let stored = BlockStored::new(
            vec![BlockHash::from_i64(1)],
            (0..16).collect(),
            16,
            kvindex::medium::Medium::GPU,
        );
        index
            .apply(
                source,
                &EngineBatch::of(vec![Event::BlockStored(stored)]),
                100,
                &mut Discard,
            )
            .unwrap();
    }
    struct NoPods;
    impl kvindex::ingest::PodsView for NoPods {
        fn pods(&self) -> Vec<kvindex::ingest::PodStatus> {
            Vec::new()
        }
    }
    let state = kvindex::api::ApiState::new(
        kvindex::score::ScoreBackend::Index(index),
        kvindex::medium::TierWeights::default(),
        None,
        std::sync::Arc::new(NoPods),
    )
    .with_limits(limits);
    kvindex::api::router(state)
}

async fn post(app: axum::Router, uri: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    use tower::ServiceExt;
    let req = axum::http::Request::post(uri)
        .header("content-type", "application/json")
        .body(axum::body::Body::from(body.to_string()))
        .unwrap();
    let resp = app.oneshot(req).await.unwrap();
    let status = resp.status().as_u16();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    (status, serde_json::from_slice(&bytes).unwrap_or_default())
}

/// README (HTTP API): "the top N decodes (default 5 …)".
#[tokio::test]
async fn pd_schedule_takes_five_decodes_by_default() {
    let app = api_over(7, kvindex::api::ApiLimits::default());
    let decode: Vec<_> = (0..7)
        .map(|i| serde_json::json!({"pod": format!("d{i}.ns"), "group": "g"}))
        .collect();
    let body = serde_json::json!({"model": "m", "tokens": (0..16).collect::<Vec<u32>>(), "decode": decode, "prefill": {"g": ["d0.ns"]}});
    let (status, v) = post(app, "/v1/pd/schedule", body).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["pairs"].as_array().unwrap().len(), 5, "{v}");
}

/// README (HTTP API, "Prompt length and tenants"): a prompt is looked at up to its mode's cap,
/// 8,192 blocks (131,072 tokens) in `prefix` mode and 128 in `kthena` mode; "bodies may be up
/// to 4 MiB" (and the errors: "413 for a body over 4 MiB").
#[tokio::test]
async fn prompts_are_cut_at_their_modes_cap_and_bodies_at_4_mib() {
    let app = api_over(1, kvindex::api::ApiLimits::default());
    let long: Vec<u32> = (0..131_072 + 16).map(|t| 100_000 + t).collect();
    for (mode, blocks) in [("prefix", 8192), ("kthena", 128)] {
        let body =
            serde_json::json!({"model": "m", "tokens": long, "pods": ["d0.ns"], "match": mode});
        let (status, v) = post(app.clone(), "/v1/score", body).await;
        assert_eq!(
            (status, &v["total_blocks"]),
            (200, &serde_json::json!(blocks)),
            "{mode}"
        );
    }
    let huge = serde_json::json!({"model": "m", "tokens": vec![1_000_000u32; 600_000], "pods": []});
    assert!(huge.to_string().len() > 4 << 20);
    assert_eq!(post(app, "/v1/score", huge).await.0, 413);
}

/// README (HTTP API): "503 under overload": a request still running at its deadline (here
/// its body never finishes arriving) is answered 503 with a JSON body, and while it holds the
/// only slot another request is shed with 503.
#[tokio::test]
async fn stuck_requests_time_out_and_extra_ones_are_shed_with_503() {
    use tower::ServiceExt;
    let limits = kvindex::api::ApiLimits {
        timeout: Duration::from_millis(300),
        concurrency: 1,
        ..kvindex::api::ApiLimits::default()
    };
    let app = api_over(1, limits);
    let stuck = || {
        let never = futures::stream::pending::<Result<bytes::Bytes, std::io::Error>>();
        axum::http::Request::post("/v1/score")
            .header("content-type", "application/json")
            .body(axum::body::Body::from_stream(never))
            .unwrap()
    };
    let first = tokio::spawn(app.clone().oneshot(stuck()));
    // While the first holds the slot, a second is shed (polled until the first is admitted).
    let body = serde_json::json!({"model": "m", "tokens": [1], "pods": ["d0.ns"]});
    let mut shed = None;
    for _ in 0..100 {
        let (status, v) = post(app.clone(), "/v1/score", body.clone()).await;
        if status == 503 {
            shed = Some(v);
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let shed = shed.expect("a second request is shed while the first holds the only slot");
    assert!(
        shed["error"].as_str().unwrap().contains("overloaded"),
        "{shed}"
    );
    let timed_out = first.await.unwrap().unwrap();
    assert_eq!(timed_out.status().as_u16(), 503);
    let bytes = axum::body::to_bytes(timed_out.into_body(), 1 << 20)
        .await
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert!(v["error"].as_str().unwrap().contains("timed out"), "{v}");
}

/// README (replay --redis, redis-dump): the replay writes the mirror and its summary gains the
/// Redis figures; `redis-dump` prints kvindex's keys and only those, sorted, mapping keys
/// with their TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_writes_redis_and_redis_dump_shows_only_kvindex_keys() {
    const DB: u32 = 10;
    let url = format!("redis://127.0.0.1:6379/{DB}");
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("FLUSHDB").query_async(&mut con).await.unwrap();
    let _: () = redis::cmd("SET")
        .arg("someone-else:key")
        .arg("1")
        .query_async(&mut con)
        .await
        .unwrap();

    let file = fixture("vllm-e01-0.9.0.jsonl");
    let out = kvindex(&[
        "replay", &file, "--pod", "p.ns", "--model", "m", "--redis", &url, "--json",
    ]);
    assert!(out.status.success(), "{out:?}");
    let summary = String::from_utf8_lossy(&out.stdout).into_owned();
    for key in ["commands", "pipelines", "reconciles"] {
        assert!(
            summary.contains(&format!("\"{key}\"")),
            "summary lacks {key}: {summary}"
        );
    }
    let out = kvindex(&["redis-dump", "--redis", &url]);
    let _: () = redis::cmd("FLUSHDB").query_async(&mut con).await.unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(!text.contains("someone-else"), "{text}");
    assert!(text.contains("p.ns"), "{text}");
    assert!(text.contains("ttl"), "mapping keys carry their TTL: {text}");
    let again = serde_json::from_str::<serde_json::Value>(&text).unwrap();
    assert_eq!(
        serde_json::to_string_pretty(&again).unwrap(),
        text.trim_end(),
        "canonical form"
    );
}

/// README (Deploy): "a Deployment with one replica (`Recreate`, so two writers never
/// overlap) … Requests (250m CPU, 128 MiB) … raise the 1 GiB limit", UID 65532, a read-only
/// root filesystem.
#[test]
fn the_deployment_is_what_the_readme_says() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes/deployment.yaml");
    let d: serde_json::Value =
        serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(d["spec"]["replicas"], 1);
    assert_eq!(d["spec"]["strategy"]["type"], "Recreate");
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
    let c = &pod["containers"][0];
    assert_eq!(c["resources"]["requests"]["cpu"], "250m");
    assert_eq!(c["resources"]["requests"]["memory"], "128Mi");
    assert_eq!(c["resources"]["limits"]["memory"], "1Gi");
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
}

/// README (replay): "Several files are applied in order as one pod's history (each new file
/// is treated like a reconnect, so a seq that goes back to 0 is an engine restart)."
#[test]
fn a_second_file_starting_at_seq_0_is_a_restart() {
    let file = fixture("vllm-e01-0.9.0.jsonl");
    let restarts = |files: &[&str]| {
        let mut args = vec!["replay"];
        args.extend_from_slice(files);
        args.push("--json");
        let out = kvindex(&args);
        assert!(out.status.success(), "{out:?}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["ingest"]["restarts"].as_u64().unwrap()
    };
    assert_eq!(restarts(&[&file]), 0);
    assert_eq!(restarts(&[&file, &file]), 1);
}

/// README: the retry bounds it names are the ones the code uses (subscribers: "backoff capped
/// at 1 s", a short connect timeout; discovery: "retried with backoff from 250 ms to 30 s").
/// Timing itself is not asserted (a shared CI machine); these pin the documented numbers.
#[test]
fn documented_backoffs_are_the_code_constants() {
    use kvindex::ingest::discovery as k8s;
    use kvindex::ingest::subscriber;
    assert_eq!(subscriber::MAX_BACKOFF, Duration::from_secs(1));
    assert!(subscriber::CONNECT_TIMEOUT <= Duration::from_secs(1));
    assert_eq!(k8s::MIN_BACKOFF, Duration::from_millis(250));
    assert_eq!(k8s::MAX_BACKOFF, Duration::from_secs(30));
}

/// README (fuzzing, benchmarks): the three fuzz targets with their seed folders, and the five
/// benches by the names the README gives (`cargo clippy --all-targets` builds the benches).
#[test]
fn the_documented_fuzz_targets_and_benches_exist() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let fuzz = std::fs::read_to_string(root.join("fuzz/Cargo.toml")).unwrap();
    for target in ["decode_batch", "decode_message", "decode_apply"] {
        assert!(fuzz.contains(&format!("name = \"{target}\"")), "{target}");
        assert!(
            root.join("fuzz/fuzz_targets")
                .join(format!("{target}.rs"))
                .is_file(),
            "{target}"
        );
        assert!(root.join("fuzz/seeds").join(target).is_dir(), "{target}");
    }
    let cargo = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    for bench in [
        "decode_index",
        "index_memory",
        "redis_ingest",
        "score",
        "pd",
    ] {
        assert!(cargo.contains(&format!("name = \"{bench}\"")), "{bench}");
        assert!(
            root.join("benches").join(format!("{bench}.rs")).is_file(),
            "{bench}"
        );
    }
}

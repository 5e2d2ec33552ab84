//! The Redis mirror against a real Redis: kthena's layout byte for byte, multi-tier values,
//! fixture streams leaving exactly the index's residency, outages, and start-up errors.
//! Tests share 127.0.0.1:6379 and isolate themselves by unique pod and model names; the
//! outage and auth tests run their own `redis-server` on a free port.

mod util;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use kvindex::index::{Checkpoint, Delta, Index, SourceId, SourceSpec};
use kvindex::ingest::{unix_now, OfflineReplay, Recording};
use kvindex::medium::{Medium, TierWeights};
use kvindex::store::redis::checkpoint;
use kvindex::store::redis::{block_key, field_value, mapping_key, ValueFormat};
use kvindex::store::redis::{dump, MirrorError, MirrorHandle, RedisConfig, RedisDump, RedisTarget};
use kvindex::wire::{BlockHash, BlockRemoved, BlockStored, Engine, EngineBatch, Event};

use util::own_redis::OwnRedis;

const REDIS: &str = "redis://127.0.0.1:6379/0";
/// Upper bound for anything that waits on Redis in these tests.
const WAIT: Duration = Duration::from_secs(30);

fn unique(name: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{name}-{}-{}-{}",
        std::process::id(),
        unix_now(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

fn config(url: &str, format: ValueFormat) -> RedisConfig {
    RedisConfig {
        target: RedisTarget::Single(url.to_owned()),
        value_format: format,
        ..RedisConfig::default()
    }
}

/// What Redis should hold for `pod` given the index: fields and mapping values.
fn expected_of(index: &Index, pod: &str, format: ValueFormat) -> RedisDump {
    let weights = TierWeights::default();
    let mut want = RedisDump::default();
    index.for_each_field(|model, std, p, value| {
        if &*index.pod_name(p) == pod {
            want.blocks
                .entry(block_key(&index.model_name(model), std))
                .or_default()
                .insert(pod.to_owned(), field_value(value, format, &weights));
        }
    });
    index.for_each_mapping(|p, engine, hash, std| {
        if &*index.pod_name(p) == pod {
            want.mappings.insert(
                mapping_key(engine, pod, &hash),
                kvindex::store::redis::MappingEntry {
                    value: std.to_string(),
                    ttl: 86_400,
                },
            );
        }
    });
    want
}

/// Checks TTLs are ≈ 24 h and then normalises them, so dumps compare by value.
fn normalise_ttls(dump: &mut RedisDump) {
    for (key, m) in dump.mappings.iter_mut() {
        assert!(
            (86_000..=86_400).contains(&m.ttl),
            "{key}: TTL {} is not about 24 h",
            m.ttl
        );
        m.ttl = 86_400;
    }
}

fn assert_plausible_values(dump: &RedisDump) {
    let now = unix_now();
    for (key, fields) in &dump.blocks {
        for (field, value) in fields {
            let ts: u32 = value
                .split('|')
                .next()
                .and_then(|t| t.parse().ok())
                .unwrap_or_else(|| panic!("{key} {field}: value {value:?} has no timestamp"));
            assert!(
                ts <= now && now - ts < 3600,
                "{key} {field}: implausible ts {ts}"
            );
        }
    }
}

async fn redis_state(url: &str, pod: &str) -> RedisDump {
    let mut d = dump(url, None, Some(pod)).await.unwrap();
    normalise_ttls(&mut d);
    d
}

async fn replay_stream(stream: &str, pod: &str, model: &str) -> Index {
    let engine = if stream.starts_with("sglang") {
        Engine::Sglang
    } else {
        Engine::Vllm
    };
    let index = Index::new();
    let mirror = MirrorHandle::start(
        config(REDIS, ValueFormat::Tiered),
        index.clone(),
        TierWeights::default(),
    )
    .await
    .unwrap();
    let sender = mirror.sender();
    let mut replay = OfflineReplay::new(index.clone(), pod, model, engine);
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("fixtures/{stream}.jsonl"));
    let recording = Recording::open(&[path]).unwrap();
    replay
        .replay_mirrored(recording, &sender, |_| {})
        .await
        .unwrap();
    tokio::time::timeout(WAIT, mirror.flush())
        .await
        .unwrap()
        .unwrap();
    mirror.shutdown(WAIT).await;
    index
}

#[tokio::test]
async fn every_fixture_stream_leaves_exactly_the_index_residency_in_redis() {
    for stream in [
        "sglang-s02-0.5.8.post1",
        "sglang-s06-0.5.21",
        "vllm-e01-0.9.0",
        "vllm-e03-0.13.0-bytes",
        "vllm-e03-0.13.0-int",
        "vllm-e08-0.25.1-int",
        "vllm-e13-0.33.0-bytes",
    ] {
        let pod = format!("{}.ns", unique("fx"));
        let model = unique("fx-model");
        let index = replay_stream(stream, &pod, &model).await;
        let got = redis_state(REDIS, &pod).await;
        assert_plausible_values(&got);
        assert_eq!(
            got,
            expected_of(&index, &pod, ValueFormat::Tiered),
            "{stream}"
        );
        assert!(!got.blocks.is_empty(), "{stream}: nothing resident");
    }
}

#[tokio::test]
async fn sglang_0_5_21_stream_ends_with_the_four_gpu_blocks_of_its_scenario() {
    // The scenario ends with A B C (rank 0, stored again after the clear) and X (rank 1), all
    // on GPU; SGLang sends one block per event, so each has one mapping key per engine hash.
    let pod = format!("{}.ns", unique("sg"));
    let model = unique("sg-model");
    let index = replay_stream("sglang-s06-0.5.21", &pod, &model).await;
    let got = redis_state(REDIS, &pod).await;
    assert_eq!(got.blocks.len(), 4, "{got:#?}");
    for (key, fields) in &got.blocks {
        assert!(
            key.starts_with(&format!("matrix:kv:block:{model}@")),
            "{key}"
        );
        let value = &fields[&pod];
        assert!(value.ends_with("|GPU"), "{key}: {value}");
    }
    assert_eq!(got.mappings.len(), 4, "{:#?}", got.mappings);
    for (key, m) in &got.mappings {
        assert!(key.starts_with(&format!("sglang:kv:block:{pod}@")), "{key}");
        assert!(
            got.blocks
                .contains_key(&format!("matrix:kv:block:{model}@{}", m.value)),
            "{key} maps to {} which is not a block key",
            m.value
        );
    }
    assert_eq!(index.stats().entries, 4);
}

fn stored(hash: u64, tokens: Vec<u32>, medium: Medium) -> Event {
    Event::BlockStored(BlockStored::new(
        vec![BlockHash::Int(hash)],
        tokens,
        4,
        medium,
    ))
}

fn removed(hash: u64, medium: Medium) -> Event {
    Event::BlockRemoved(BlockRemoved::new(vec![BlockHash::Int(hash)], medium))
}

fn batch(events: Vec<Event>) -> EngineBatch {
    EngineBatch::of(events)
}

struct Rig {
    index: Index,
    source: SourceId,
    mirror: MirrorHandle,
    pod: String,
    model: String,
}

impl Rig {
    async fn new(url: &str, format: ValueFormat) -> Rig {
        let pod = format!("{}.ns", unique("pod"));
        Rig::named(url, format, pod, unique("model")).await
    }

    /// A rig whose pod and model are named as given (two rigs on two Redis servers can then
    /// be compared key for key), keeping the checkpoint.
    async fn checkpointed(url: &str, pod: String, model: String) -> Rig {
        let config = RedisConfig {
            checkpoint: true,
            ..config(url, ValueFormat::Tiered)
        };
        Rig::with_config(config, pod, model).await
    }

    async fn named(url: &str, format: ValueFormat, pod: String, model: String) -> Rig {
        Rig::with_config(config(url, format), pod, model).await
    }

    async fn with_config(config: RedisConfig, pod: String, model: String) -> Rig {
        let index = Index::new();
        let source = index
            .register_source(&SourceSpec {
                pod: pod.clone(),
                model: model.clone(),
                engine: Engine::Vllm,
                dp_rank: 0,
            })
            .unwrap();
        let mirror = MirrorHandle::start(config, index.clone(), TierWeights::default())
            .await
            .unwrap();
        Rig {
            index,
            source,
            mirror,
            pod,
            model,
        }
    }

    async fn apply(&self, events: Vec<Event>) {
        let mut deltas: Vec<Delta> = Vec::new();
        self.index
            .apply(self.source, &batch(events), unix_now(), &mut deltas)
            .unwrap();
        self.mirror.sender().send(deltas, None).await;
    }

    /// Applies `events` as message `seq`, stored at unix second `now`, with its watermark.
    async fn apply_at(&self, events: Vec<Event>, seq: u64, now: u32) {
        let mut deltas: Vec<Delta> = Vec::new();
        self.index
            .apply(self.source, &batch(events), now, &mut deltas)
            .unwrap();
        let source = self.source;
        let covered = Checkpoint { source, seq };
        self.mirror.sender().send(deltas, Some(covered)).await;
    }

    async fn flush(&self) {
        tokio::time::timeout(WAIT, self.mirror.flush())
            .await
            .unwrap()
            .unwrap();
    }

    fn key(&self, tokens: &[u32]) -> String {
        block_key(&self.model, kvindex::hash::std_hash(tokens))
    }
}

fn hget(url: &str, key: &str, field: &str) -> Option<String> {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_connection().unwrap();
    redis::cmd("HGET")
        .arg(key)
        .arg(field)
        .query(&mut conn)
        .unwrap()
}

fn get_with_ttl(url: &str, key: &str) -> (Option<String>, i64) {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_connection().unwrap();
    let v: Option<String> = redis::cmd("GET").arg(key).query(&mut conn).unwrap();
    let ttl: i64 = redis::cmd("TTL").arg(key).query(&mut conn).unwrap();
    (v, ttl)
}

#[tokio::test]
async fn kthena_reads_bare_timestamps_or_tiered_values_and_mapping_keys() {
    for format in [ValueFormat::Timestamp, ValueFormat::Tiered] {
        let rig = Rig::new(REDIS, format).await;
        let before = unix_now();
        let mut keys = Vec::new();
        for i in 0..5u32 {
            let tokens = vec![i, i + 1, i + 2, i + 3];
            rig.apply(vec![stored(
                1000 + u64::from(i),
                tokens.clone(),
                Medium::GPU,
            )])
            .await;
            keys.push((1000 + u64::from(i), tokens));
        }
        rig.flush().await;
        let after = unix_now();
        for (hash, tokens) in &keys {
            let value = hget(REDIS, &rig.key(tokens), &rig.pod).unwrap();
            let (ts, rest) = match value.split_once('|') {
                Some((ts, m)) => (ts, Some(m)),
                None => (value.as_str(), None),
            };
            let ts: u32 = ts.parse().unwrap();
            assert!((before..=after).contains(&ts), "{value}");
            match format {
                ValueFormat::Timestamp => assert_eq!(rest, None, "{value}"),
                ValueFormat::Tiered => assert_eq!(rest, Some("GPU"), "{value}"),
            }
            let (v, ttl) = get_with_ttl(REDIS, &format!("vllm:kv:block:{}@{hash}", rig.pod));
            assert_eq!(v, Some(kvindex::hash::std_hash(tokens).to_string()));
            assert!((86_000..=86_400).contains(&ttl), "TTL {ttl}");
        }
        rig.mirror.shutdown(WAIT).await;
    }
}

#[tokio::test]
async fn a_block_moving_between_tiers_keeps_its_field_until_no_tier_holds_it() {
    let rig = Rig::new(REDIS, ValueFormat::Tiered).await;
    let cpu = Medium::intern("CPU");
    let tokens = vec![9, 8, 7, 6];
    let key = rig.key(&tokens);
    rig.apply(vec![stored(77, tokens.clone(), Medium::GPU)])
        .await;
    // The CPU copy of the same engine block (tokenless, as vLLM's offload sends it).
    rig.apply(vec![stored(77, Vec::new(), cpu)]).await;
    rig.flush().await;
    assert!(hget(REDIS, &key, &rig.pod).unwrap().ends_with("|GPU"));
    rig.apply(vec![removed(77, Medium::GPU)]).await;
    rig.flush().await;
    assert!(hget(REDIS, &key, &rig.pod).unwrap().ends_with("|CPU"));
    rig.apply(vec![removed(77, cpu)]).await;
    rig.flush().await;
    assert_eq!(hget(REDIS, &key, &rig.pod), None);
    let mapping = format!("vllm:kv:block:{}@77", rig.pod);
    assert_eq!(get_with_ttl(REDIS, &mapping).0, None);
    rig.mirror.shutdown(WAIT).await;
}

#[tokio::test]
async fn a_store_then_remove_inside_one_flush_leaves_nothing_and_stores_survive() {
    let rig = Rig::new(REDIS, ValueFormat::Tiered).await;
    let (a, b) = (vec![1, 1, 1, 1], vec![2, 2, 2, 2]);
    rig.apply(vec![stored(1, a.clone(), Medium::GPU)]).await;
    rig.apply(vec![stored(2, b.clone(), Medium::GPU)]).await;
    rig.apply(vec![removed(1, Medium::NONE)]).await;
    rig.flush().await;
    assert_eq!(hget(REDIS, &rig.key(&a), &rig.pod), None);
    assert!(hget(REDIS, &rig.key(&b), &rig.pod).is_some());
    assert_eq!(
        redis_state(REDIS, &rig.pod).await,
        expected_of(&rig.index, &rig.pod, ValueFormat::Tiered)
    );
    rig.mirror.shutdown(WAIT).await;
}

#[tokio::test]
async fn an_outage_loses_nothing_and_leaves_no_stale_field() {
    let mut server = OwnRedis::start(None, &[]);
    let url = server.url();
    let rig = Rig::new(&url, ValueFormat::Tiered).await;
    let tokens = |i: u32| vec![i, i * 3, i * 5, 7];
    for i in 0..200u32 {
        rig.apply(vec![stored(u64::from(i), tokens(i), Medium::GPU)])
            .await;
    }
    rig.flush().await;
    assert_eq!(
        redis_state(&url, &rig.pod).await,
        expected_of(&rig.index, &rig.pod, ValueFormat::Tiered)
    );

    server.kill();
    // Ingest goes on: new blocks, and removes of blocks Redis had (must not come back).
    for i in 200..400u32 {
        rig.apply(vec![stored(u64::from(i), tokens(i), Medium::GPU)])
            .await;
    }
    for i in (0..200u32).step_by(2) {
        rig.apply(vec![removed(u64::from(i), Medium::NONE)]).await;
    }
    assert_eq!(rig.index.stats().entries, 300);

    let port = server.port;
    let _restarted = OwnRedis::start(Some(port), &[]);
    rig.flush().await;
    let got = redis_state(&url, &rig.pod).await;
    assert_eq!(got, expected_of(&rig.index, &rig.pod, ValueFormat::Tiered));
    assert_eq!(got.blocks.len(), 300);
    assert!(rig.mirror.stats().reconciles >= 2);
    assert!(rig.mirror.is_healthy());
    rig.mirror.shutdown(WAIT).await;
}

#[tokio::test]
async fn a_failed_outage_write_is_repaired_when_redis_kept_its_data() {
    // Redis answers again with its old data: fields removed during the outage must go.
    let server = OwnRedis::start(None, &[]);
    let url = server.url();
    let rig = Rig::new(&url, ValueFormat::Tiered).await;
    let tokens = |i: u32| vec![i, 2, 3, 4];
    for i in 0..50u32 {
        rig.apply(vec![stored(u64::from(i), tokens(i), Medium::GPU)])
            .await;
    }
    rig.flush().await;
    // Pause Redis (SIGSTOP) so writes time out, ingest removes, then resume it.
    let pid = server.pid().to_string();
    assert!(Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap()
        .success());
    for i in 0..25u32 {
        rig.apply(vec![removed(u64::from(i), Medium::NONE)]).await;
    }
    let stats_wait = std::time::Instant::now();
    while !rig.mirror.stats().dirty {
        assert!(
            stats_wait.elapsed() < WAIT,
            "the mirror never noticed the outage"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(Command::new("kill")
        .args(["-CONT", &pid])
        .status()
        .unwrap()
        .success());
    rig.flush().await;
    let got = redis_state(&url, &rig.pod).await;
    assert_eq!(got.blocks.len(), 25);
    assert_eq!(got, expected_of(&rig.index, &rig.pod, ValueFormat::Tiered));
    rig.mirror.shutdown(WAIT).await;
}

#[tokio::test]
async fn the_db_index_comes_from_the_url() {
    let server = OwnRedis::start(None, &[]);
    let url = format!("redis://127.0.0.1:{}/5", server.port);
    let rig = Rig::new(&url, ValueFormat::Tiered).await;
    rig.apply(vec![stored(5, vec![5, 5, 5, 5], Medium::GPU)])
        .await;
    rig.flush().await;
    assert!(hget(&url, &rig.key(&[5, 5, 5, 5]), &rig.pod).is_some());
    let db0 = format!("redis://127.0.0.1:{}/0", server.port);
    assert_eq!(hget(&db0, &rig.key(&[5, 5, 5, 5]), &rig.pod), None);
    rig.mirror.shutdown(WAIT).await;
}

/// Every log line of this test binary, at every level. One global subscriber: a per-thread
/// one (`set_default`) misses lines when tests run in parallel, since tracing caches a
/// callsite's interest across threads. Tests find their own lines by their server's port.
struct CapturedLogs {
    lines: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
}

impl CapturedLogs {
    fn install() -> CapturedLogs {
        static LINES: std::sync::OnceLock<std::sync::Arc<std::sync::Mutex<Vec<u8>>>> =
            std::sync::OnceLock::new();
        let lines = LINES.get_or_init(|| {
            let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
            let sink = std::sync::Arc::clone(&lines);
            let subscriber = tracing_subscriber::fmt()
                .with_max_level(tracing::Level::TRACE)
                .with_ansi(false)
                .with_writer(move || LogSink(std::sync::Arc::clone(&sink)))
                .finish();
            tracing::subscriber::set_global_default(subscriber)
                .expect("no other subscriber in this test binary");
            lines
        });
        CapturedLogs {
            lines: std::sync::Arc::clone(lines),
        }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.lines.lock().unwrap()).into_owned()
    }

    /// Waits for a line that contains every one of `parts`.
    async fn wait_for(&self, parts: &[&str]) {
        let started = std::time::Instant::now();
        while !self
            .text()
            .lines()
            .any(|line| parts.iter().all(|p| line.contains(p)))
        {
            assert!(started.elapsed() < WAIT, "no log line with {parts:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

struct LogSink(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

#[tokio::test]
async fn start_up_errors_are_typed_and_never_show_the_password() {
    let logs = CapturedLogs::install();
    let secret = "s3cret-Horse%21";
    let decoded = "s3cret-Horse!";
    let server = OwnRedis::start(None, &["--requirepass", "right-horse"]);
    let cases = [
        ("bad scheme", format!("nope://u:{secret}@127.0.0.1/0")),
        (
            "bad port",
            format!("redis://u:{secret}@127.0.0.1:notaport/0"),
        ),
        (
            "refused",
            format!("redis://:{secret}@127.0.0.1:{}/0", closed_port()),
        ),
        (
            "wrong password",
            format!("redis://:{secret}@127.0.0.1:{}/0", server.port),
        ),
        (
            "wrong user",
            format!("redis://nobody:{secret}@127.0.0.1:{}/0", server.port),
        ),
    ];
    for (case, url) in &cases {
        let err = MirrorHandle::start(
            config(url, ValueFormat::Tiered),
            Index::new(),
            TierWeights::default(),
        )
        .await
        .unwrap_err();
        let shown = format!("{err} / {err:?}");
        assert!(
            !shown.contains(secret) && !shown.contains(decoded),
            "{case}: {shown}"
        );
        assert!(shown.contains(":***@127.0.0.1"), "{case}: {shown}");
        let kind_ok = match *case {
            "bad scheme" | "bad port" => matches!(err, MirrorError::BadUrl { .. }),
            "refused" => matches!(err, MirrorError::Connect { .. }),
            _ => matches!(err, MirrorError::Auth { .. }),
        };
        assert!(kind_ok, "{case}: {shown}");
        let dump_err = dump(url, None, None).await.unwrap_err().to_string();
        assert!(!dump_err.contains(secret), "{case} (dump): {dump_err}");
    }
    let text = logs.text();
    assert!(!text.contains(secret) && !text.contains(decoded), "{text}");

    let none = MirrorHandle::start(
        config(&server.url(), ValueFormat::Tiered),
        Index::new(),
        TierWeights::default(),
    )
    .await
    .unwrap_err();
    assert!(matches!(none, MirrorError::Auth { .. }), "{none}");
    let right = format!("redis://:right-horse@127.0.0.1:{}/3", server.port);
    let mirror = MirrorHandle::start(
        config(&right, ValueFormat::Tiered),
        Index::new(),
        TierWeights::default(),
    )
    .await
    .unwrap();
    assert!(mirror.is_healthy());
    mirror.shutdown(WAIT).await;
}

#[tokio::test]
async fn a_failing_reconcile_logs_without_the_password() {
    // The mirror's credentials stop working mid-run (the password is rotated and its
    // connection killed), so writes fail and every reconcile attempt is refused; once the
    // password is restored the mirror reconciles. No line on the way may show the password.
    let logs = CapturedLogs::install();
    let secret = "rotating-Battery-7";
    let server = OwnRedis::start(None, &["--requirepass", secret]);
    let url = format!("redis://:{secret}@127.0.0.1:{}/0", server.port);
    let rig = Rig::new(&url, ValueFormat::Tiered).await;
    rig.apply(vec![stored(1, vec![1, 2, 3, 4], Medium::GPU)])
        .await;
    rig.flush().await;

    let admin = redis::Client::open(url.as_str()).unwrap();
    let mut admin = admin.get_connection().unwrap();
    let set_password = |conn: &mut redis::Connection, pw: &str| {
        let () = redis::cmd("CONFIG")
            .arg(&["SET", "requirepass", pw][..])
            .query(conn)
            .unwrap();
    };
    set_password(&mut admin, "the-next-one");
    let _: i64 = redis::cmd("CLIENT")
        .arg(&["KILL", "TYPE", "normal", "SKIPME", "yes"][..])
        .query(&mut admin)
        .unwrap();
    rig.apply(vec![stored(2, vec![5, 6, 7, 8], Medium::GPU)])
        .await;
    let shown = format!("redis://:***@127.0.0.1:{}/0", server.port);
    logs.wait_for(&["Redis writes failed", &shown]).await;
    logs.wait_for(&["retries its reconcile", "AuthenticationFailed", &shown])
        .await;
    let reconciles = rig.mirror.stats().reconciles;
    set_password(&mut admin, secret);
    rig.flush().await;
    assert_eq!(rig.mirror.stats().reconciles, reconciles + 1);
    logs.wait_for(&["Reconciled the Redis mirror", &shown])
        .await;
    assert_eq!(
        redis_state(&url, &rig.pod).await,
        expected_of(&rig.index, &rig.pod, ValueFormat::Tiered)
    );
    rig.mirror.shutdown(WAIT).await;

    let text = logs.text();
    assert!(!text.contains(secret), "{text}");
    let shown = format!("redis://:***@127.0.0.1:{}/0", server.port);
    assert!(
        text.contains(&shown),
        "the lines name the redacted URL: {text}"
    );
}

#[tokio::test]
async fn any_holder_of_a_shared_handle_stops_the_writer_in_order_once() {
    use kvindex::store::redis::MirrorStop;
    let server = OwnRedis::start(None, &[]);
    let url = server.url();
    let rig = Rig::new(&url, ValueFormat::Tiered).await;
    for i in 0..100u32 {
        rig.apply(vec![stored(u64::from(i), vec![i, 1, 2, 3], Medium::GPU)])
            .await;
    }
    let mirror = std::sync::Arc::new(rig.mirror);
    let other_holder = std::sync::Arc::clone(&mirror);
    // No flush: the shutdown alone must write what is queued.
    assert_eq!(mirror.shutdown(WAIT).await, MirrorStop::Orderly);
    assert_eq!(
        redis_state(&url, &rig.pod).await,
        expected_of(&rig.index, &rig.pod, ValueFormat::Tiered)
    );
    assert_eq!(
        other_holder.shutdown(WAIT).await,
        MirrorStop::AlreadyStopped
    );
    assert!(matches!(
        other_holder.flush().await,
        Err(MirrorError::Stopped { .. })
    ));
}

#[tokio::test]
async fn mapping_keys_and_fields_stay_while_any_dp_rank_of_the_pod_holds_the_block() {
    let rig = Rig::new(REDIS, ValueFormat::Tiered).await;
    let rank1 = rig
        .index
        .register_source(&SourceSpec {
            pod: rig.pod.clone(),
            model: rig.model.clone(),
            engine: Engine::Vllm,
            dp_rank: 1,
        })
        .unwrap();
    let tokens = |i: u32| vec![i, i + 1, i + 2, 9];
    let stores: Vec<Event> = (0..40u32)
        .map(|i| stored(u64::from(i), tokens(i), Medium::GPU))
        .collect();
    let removes: Vec<Event> = (0..40u64).map(|i| removed(i, Medium::NONE)).collect();
    let on = |source: SourceId, events: Vec<Event>| {
        let mut deltas: Vec<Delta> = Vec::new();
        rig.index
            .apply(source, &batch(events), unix_now(), &mut deltas)
            .unwrap();
        deltas
    };
    for source in [rig.source, rank1] {
        let deltas = on(source, stores.clone());
        rig.mirror.sender().send(deltas, None).await;
    }
    rig.flush().await;
    let both = redis_state(REDIS, &rig.pod).await;
    assert_eq!((both.blocks.len(), both.mappings.len()), (40, 40));

    // Rank 0 evicts everything; rank 1 still holds every block under the same engine hashes.
    let deltas = on(rig.source, removes.clone());
    rig.mirror.sender().send(deltas, None).await;
    rig.flush().await;
    let after_rank0 = redis_state(REDIS, &rig.pod).await;
    assert_eq!(
        after_rank0.mappings, both.mappings,
        "rank 1 still needs them"
    );
    assert_eq!(after_rank0.blocks.len(), 40);
    assert_eq!(
        after_rank0,
        expected_of(&rig.index, &rig.pod, ValueFormat::Tiered)
    );

    let deltas = on(rank1, removes);
    rig.mirror.sender().send(deltas, None).await;
    rig.flush().await;
    assert_eq!(redis_state(REDIS, &rig.pod).await, RedisDump::default());
    rig.mirror.shutdown(WAIT).await;
}

/// Every key of the Redis at `url` with its value (a hash's fields, a string's value), but
/// the writer's sentinel, which names its process and run.
async fn every_key(url: &str) -> BTreeMap<String, String> {
    let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
    let mut out = BTreeMap::new();
    for key in keys
        .into_iter()
        .filter(|k| !k.starts_with("kvindex:sentinel:") && k != checkpoint::GENERATION_KEY)
    {
        let kind: String = redis::cmd("TYPE").arg(&key).query(&mut conn).unwrap();
        let value = match kind.as_str() {
            "hash" if key.starts_with(checkpoint::STATE_PREFIX) => {
                checkpoint_entries(url, &key).await
            }
            "hash" => {
                let mut fields: BTreeMap<String, String> =
                    redis::cmd("HGETALL").arg(&key).query(&mut conn).unwrap();
                for value in fields.values_mut() {
                    *value = without_store_time(&key, value);
                }
                format!("{fields:?}")
            }
            "string" => redis::cmd("GET").arg(&key).query(&mut conn).unwrap(),
            other => format!("a {other}"),
        };
        out.insert(key, value);
    }
    out
}

/// The engine blocks of checkpoint state key `key` (its log folded), each as its field and
/// value would be written one per block, store times blanked.
async fn checkpoint_entries(url: &str, key: &str) -> String {
    let blocks = util::checkpoint_blocks(url, key).await;
    let entries: BTreeMap<String, String> = (blocks.iter())
        .map(|(hash, state)| {
            let value = checkpoint::engine_value(state);
            (
                checkpoint::engine_field(hash),
                without_store_time(key, &value),
            )
        })
        .collect();
    format!("{entries:?}")
}

/// `value` of hash `key` with its store time blanked (two runs store in different seconds):
/// a block field's leading `{ts}`, a checkpoint entry's second `|`-separated part.
fn without_store_time(key: &str, value: &str) -> String {
    let mut parts: Vec<&str> = value.split('|').collect();
    let at = if key.starts_with("matrix:kv:block:") {
        0
    } else {
        1
    };
    if key.starts_with("kvindex:src:") || at == 0 {
        if let Some(part) = parts.get_mut(at) {
            *part = "T";
        }
    }
    parts.join("|")
}

/// Routers' placements live beside the index: with them, Redis (kthena's keys and the
/// checkpoint) ends exactly as without them, through stores that confirm placements,
/// removes and a clear that drop them, and placements never confirmed.
#[tokio::test]
async fn placements_leave_redis_and_the_checkpoint_as_without_them() {
    use kvindex::hash::prompt_chain_hashes;
    let tokens: Vec<u32> = (0..16 * 6).collect();
    let other: Vec<u32> = (1000..1000 + 16 * 3).collect();
    let mut snapshots = Vec::new();
    for speculate in [false, true] {
        let redis = OwnRedis::start(None, &[]);
        let pod = "spec-pod.ns".to_owned();
        let rig = Rig::checkpointed(&redis.url(), pod.clone(), "spec-model".into()).await;
        let place = |prompt: &[u32]| {
            if speculate {
                let chains = prompt_chain_hashes("spec-model", prompt, 16, 8192);
                let id = rig.index.pod_id(&pod).unwrap();
                rig.index
                    .speculative()
                    .place(id.0, &chains, std::time::Instant::now());
            }
        };
        place(&tokens);
        place(&other);
        let chain = |first: u64, tokens: &[u32]| {
            let hashes = (first..first + tokens.len() as u64 / 16)
                .map(|h| BlockHash::from_i64(h as i64))
                .collect();
            Event::BlockStored(BlockStored::new(hashes, tokens.to_vec(), 16, Medium::GPU))
        };
        rig.apply_at(vec![chain(1, &tokens[..64])], 1, 1_700_000_000)
            .await;
        rig.apply_at(vec![removed(2, Medium::GPU)], 2, 1_700_000_001)
            .await;
        place(&tokens);
        rig.apply_at(vec![chain(10, &tokens)], 3, 1_700_000_002)
            .await;
        rig.apply_at(vec![Event::AllBlocksCleared], 4, 1_700_000_003)
            .await;
        place(&tokens);
        rig.apply_at(vec![chain(20, &tokens[..32])], 5, 1_700_000_004)
            .await;
        rig.flush().await;
        let stats = rig.index.speculative().stats();
        assert_eq!(stats.placed > 0, speculate);
        snapshots.push(every_key(&redis.url()).await);
        rig.mirror.shutdown(WAIT).await;
    }
    assert!(
        snapshots[0].keys().any(|k| k.starts_with("kvindex:src:")),
        "the checkpoint is compared: {:?}",
        snapshots[0].keys()
    );
    assert!(snapshots[0]
        .keys()
        .any(|k| k.starts_with("matrix:kv:block:")));
    assert_eq!(snapshots[0], snapshots[1]);
}

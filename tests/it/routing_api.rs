//! Routing quality through the HTTP API: speculative placements (`/v1/routed`, PD
//! `speculate`), the accuracy signal (`/v1/feedback`), tenant salts decoded from vLLM and
//! SGLang events, and long prompts.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use kvindex::api::{router, ApiState};
use kvindex::index::{Discard, Index, IndexOptions, SourceId, SourceSpec, SpeculativeOptions};
use kvindex::ingest::{PodStatus, PodsView};
use kvindex::medium::{Medium, TierWeights};
use kvindex::score::ScoreBackend;
use kvindex::wire::{
    decode_batch, BlockHash, BlockRemoved, BlockStored, DecodeOptions, Engine, EngineBatch, Event,
};
use rmpv::Value as V;
use serde_json::{json, Value};

const PODS: [&str; 2] = ["a.ns", "b.ns"];

struct NoPods;

impl PodsView for NoPods {
    fn pods(&self) -> Vec<PodStatus> {
        Vec::new()
    }
}

/// An index with pods `a.ns` and `b.ns` registered (DP rank 0, model `m`), holding nothing,
/// whose placements live `ttl`.
fn index_with_ttl(ttl: Duration) -> (Index, Vec<SourceId>) {
    let index = Index::with_options(IndexOptions {
        speculative: SpeculativeOptions {
            ttl,
            ..SpeculativeOptions::default()
        },
        ..IndexOptions::default()
    });
    let sources = PODS
        .iter()
        .map(|pod| {
            let spec = SourceSpec {
                pod: (*pod).into(),
                model: "m".into(),
                engine: Engine::Vllm,
                dp_rank: 0,
            };
            index.register_source(&spec).unwrap()
        })
        .collect();
    (index, sources)
}

/// The API over `index`: one per test, so its predictions live across requests.
fn app(index: &Index) -> axum::Router {
    router(ApiState::new(
        ScoreBackend::Index(index.clone()),
        TierWeights::default(),
        None,
        Arc::new(NoPods),
    ))
}

async fn post(api: &axum::Router, uri: &str, body: Value) -> (StatusCode, Value) {
    crate::util::post_json(api, uri, &body).await
}

/// Matched blocks per pod for `body` (a `/v1/score` request without `pods`).
async fn matched(api: &axum::Router, mut body: Value) -> Vec<(String, u64)> {
    body["pods"] = json!(PODS);
    let (status, out) = post(api, "/v1/score", body).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    let mut got: Vec<(String, u64)> = (out["scores"].as_array().unwrap().iter())
        .map(|s| {
            let pod = s["pod"].as_str().unwrap().to_owned();
            (pod, s["matched_blocks"].as_u64().unwrap())
        })
        .collect();
    got.sort();
    got
}

fn tokens(blocks: u32, seed: u32) -> Vec<u32> {
    (0..16 * blocks).map(|t| seed * 1_000_000 + t).collect()
}

/// `blocks` blocks of `tokens` stored on `source` as one chain, engine hashes from `first`.
fn store(index: &Index, source: SourceId, tokens: &[u32], first: i64) {
    let blocks = tokens.len().div_ceil(16) as i64;
    let event = Event::BlockStored(BlockStored::new(
        (first..first + blocks).map(BlockHash::from_i64).collect(),
        tokens.to_vec(),
        16,
        Medium::GPU,
    ));
    index
        .apply(source, &EngineBatch::of(vec![event]), 100, &mut Discard)
        .unwrap();
}

fn apply(index: &Index, source: SourceId, event: Event) {
    index
        .apply(source, &EngineBatch::of(vec![event]), 100, &mut Discard)
        .unwrap();
}

async fn route(api: &axum::Router, pod: &str, tokens: &[u32], request_id: Option<&str>) {
    let mut body = json!({"model": "m", "tokens": tokens, "pod": pod});
    if let Some(id) = request_id {
        body["request_id"] = json!(id);
    }
    let (status, out) = post(api, "/v1/routed", body).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{out}");
}

#[tokio::test]
async fn a_placement_counts_at_once_and_the_engines_store_confirms_it() {
    let (index, sources) = index_with_ttl(Duration::from_secs(60));
    let api = app(&index);
    let prompt = tokens(4, 1);
    let ask = json!({"model": "m", "tokens": prompt});
    assert!(matched(&api, ask.clone()).await.is_empty());
    route(&api, "a.ns", &prompt, None).await;
    assert_eq!(matched(&api, ask.clone()).await, [("a.ns".into(), 4)]);
    // `kthena` mode is kthena's content-only view: placements are not in it.
    let kthena = json!({"model": "m", "tokens": prompt, "match": "kthena"});
    assert!(matched(&api, kthena).await.is_empty());
    // The engine stores the first 3 blocks: confirmed, the last still placed.
    store(&index, sources[0], &prompt[..48], 1);
    let stats = index.speculative().stats();
    assert_eq!((stats.live, stats.confirmed), (1, 3));
    assert_eq!(matched(&api, ask.clone()).await, [("a.ns".into(), 4)]);
    // Placed again, only what the pod does not hold yet is placed.
    route(&api, "a.ns", &prompt, None).await;
    assert_eq!(index.speculative().stats().placed, 4 + 1);
    // Once confirmed, an entry is the engine's: its eviction is not hidden by the placement.
    apply(
        &index,
        sources[0],
        Event::BlockRemoved(BlockRemoved::new(vec![BlockHash::from_i64(2)], Medium::GPU)),
    );
    assert_eq!(matched(&api, ask).await, [("a.ns".into(), 1)]);
    assert!(index.stats().entries <= 2, "placements are never residents");
}

#[tokio::test]
async fn a_placement_expires_at_its_ttl() {
    let (index, _) = index_with_ttl(Duration::from_millis(150));
    let api = app(&index);
    let prompt = tokens(3, 2);
    route(&api, "b.ns", &prompt, None).await;
    let ask = json!({"model": "m", "tokens": prompt});
    assert_eq!(matched(&api, ask.clone()).await, [("b.ns".into(), 3)]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !matched(&api, ask.clone()).await.is_empty() {
        assert!(Instant::now() < deadline, "the placement outlived its TTL");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    index.speculative().purge(Instant::now());
    let stats = index.speculative().stats();
    assert_eq!((stats.live, stats.expired), (0, 3));
}

#[tokio::test]
async fn a_clear_a_restart_or_a_removal_drops_the_pods_placements() {
    let (index, sources) = index_with_ttl(Duration::from_secs(60));
    let api = app(&index);
    let prompt = tokens(2, 3);
    let ask = json!({"model": "m", "tokens": prompt});
    let dropped: [&dyn Fn(); 3] = [
        &|| apply(&index, sources[0], Event::AllBlocksCleared),
        &|| index.clear_source(sources[0], &mut Discard).unwrap(),
        &|| index.forget_pod("a.ns", &mut Discard),
    ];
    for forget in dropped {
        route(&api, "a.ns", &prompt, None).await;
        route(&api, "b.ns", &prompt, None).await;
        forget();
        assert_eq!(matched(&api, ask.clone()).await, [("b.ns".into(), 2)]);
    }
}

#[tokio::test]
async fn placements_are_refused_clearly() {
    let (index, _) = index_with_ttl(Duration::from_secs(60));
    let api = app(&index);
    let unknown = json!({"model": "m", "tokens": [1, 2], "pod": "nobody.ns"});
    let (status, out) = post(&api, "/v1/routed", unknown).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(out["field"], "pod");
    let no_prompt = json!({"model": "m", "pod": "a.ns"});
    assert_eq!(
        post(&api, "/v1/routed", no_prompt).await.0,
        StatusCode::BAD_REQUEST
    );
    let long_id =
        json!({"model": "m", "tokens": [1], "pod": "a.ns", "request_id": "x".repeat(300)});
    let (status, out) = post(&api, "/v1/routed", long_id).await;
    assert_eq!(
        (status, out["field"].as_str()),
        (StatusCode::BAD_REQUEST, Some("request_id"))
    );
}

#[tokio::test]
async fn pd_schedule_places_its_first_pairs_prefill_when_asked() {
    let (index, _) = index_with_ttl(Duration::from_secs(60));
    let api = app(&index);
    let prompt = tokens(3, 4);
    let pd = json!({
        "model": "m", "tokens": prompt, "speculate": true,
        "decode": [{"pod": "b.ns", "group": "g"}],
        "prefill": {"g": ["a.ns"]},
    });
    let (status, out) = post(&api, "/v1/pd/schedule", pd).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert_eq!(out["pairs"][0]["prefill"], "a.ns");
    let ask = json!({"model": "m", "tokens": prompt});
    assert_eq!(matched(&api, ask).await, [("a.ns".into(), 3)]);
}

/// The value of counter `name{outcome}` in the rendered metrics (0 when absent).
fn counter(handle: &metrics_exporter_prometheus::PrometheusHandle, series: &str) -> f64 {
    let text = kvindex::render_metrics(handle);
    (text.lines())
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn feedback_judges_the_prediction_made_at_route_time() {
    let handle = kvindex::install_metrics().expect("the test binary's recorder");
    let (index, sources) = index_with_ttl(Duration::from_secs(60));
    let api = app(&index);
    // a.ns holds 4 blocks of a 6-block prompt (96 tokens): kvindex predicts 4.
    let prompt = tokens(6, 5);
    store(&index, sources[0], &prompt[..64], 1);
    let series = |outcome| format!("kvindex_route_predictions_total{{outcome=\"{outcome}\"}}");
    let before: Vec<f64> = ["exact", "over", "under"]
        .iter()
        .map(|o| counter(&handle, &series(o)))
        .collect();
    let unknown = "kvindex_route_feedback_unknown_total";
    let unknown_before = counter(&handle, unknown);
    // A placement is no prediction of reuse: b.ns, placed before, is predicted 0 blocks.
    route(&api, "b.ns", &prompt, None).await;
    route(&api, "b.ns", &prompt, Some("r-placed")).await;
    let body = json!({"request_id": "r-placed", "cached_tokens": 0});
    assert_eq!(
        post(&api, "/v1/feedback", body).await.0,
        StatusCode::NO_CONTENT
    );
    for (id, cached) in [("r-exact", 64), ("r-over", 32), ("r-under", 80)] {
        route(&api, "a.ns", &prompt, Some(id)).await;
        let body = json!({"request_id": id, "cached_tokens": cached});
        assert_eq!(
            post(&api, "/v1/feedback", body).await.0,
            StatusCode::NO_CONTENT
        );
    }
    // Judged once: a second report of the same request is unknown.
    let again = json!({"request_id": "r-exact", "cached_tokens": 64});
    let (status, out) = post(&api, "/v1/feedback", again).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{out}");
    let never = json!({"request_id": "never-routed", "cached_tokens": 0});
    assert_eq!(
        post(&api, "/v1/feedback", never).await.0,
        StatusCode::NOT_FOUND
    );
    let exact = [2.0, 1.0, 1.0];
    for (i, outcome) in ["exact", "over", "under"].iter().enumerate() {
        assert_eq!(
            counter(&handle, &series(outcome)),
            before[i] + exact[i],
            "{outcome}"
        );
    }
    assert_eq!(counter(&handle, unknown), unknown_before + 2.0);
}

/// A vLLM (0.17+, array form) batch storing `tokens` from hash `first`, the first block's
/// `extra_keys` naming LoRA-less `salt`.
fn vllm_salted(tokens: &[u32], first: u64, salt: Option<&str>) -> Vec<u8> {
    let blocks = tokens.len().div_ceil(16) as u64;
    let mut extra: Vec<V> = vec![V::Nil; blocks as usize];
    if let Some(salt) = salt {
        // A multimodal pair before the salt, as vLLM orders them.
        extra[0] = V::Array(vec![
            V::Array(vec![V::from("mm-1"), V::from(0)]),
            V::from(salt),
        ]);
    }
    let event = V::Array(vec![
        V::from("BlockStored"),
        V::Array((first..first + blocks).map(V::from).collect()),
        V::Nil,
        V::Array(tokens.iter().map(|t| V::from(*t)).collect()),
        V::from(16),
        V::Nil,
        V::from("GPU"),
        V::Nil,
        V::Array(extra),
    ]);
    encode(V::Array(vec![
        V::F64(1.0),
        V::Array(vec![event]),
        V::from(0),
    ]))
}

/// An SGLang (0.5.20+, map form) batch storing `tokens` page by page from hash `first`,
/// each page naming `salt`.
fn sglang_salted(tokens: &[u32], first: i64, salt: Option<&str>) -> Vec<u8> {
    let events = (tokens.chunks(16).enumerate())
        .map(|(i, page)| {
            let hash = first + i as i64;
            let mut fields = vec![
                (V::from("type"), V::from("BlockStored")),
                (V::from("block_hashes"), V::Array(vec![V::from(hash)])),
                (
                    V::from("parent_block_hash"),
                    if i == 0 { V::Nil } else { V::from(hash - 1) },
                ),
                (
                    V::from("token_ids"),
                    V::Array(page.iter().map(|t| V::from(*t)).collect()),
                ),
                (V::from("block_size"), V::from(16)),
                (V::from("medium"), V::from("GPU")),
            ];
            if let Some(salt) = salt {
                fields.push((V::from("cache_salt"), V::from(salt)));
            }
            V::Map(fields)
        })
        .collect();
    encode(V::Array(vec![V::F64(1.0), V::Array(events), V::Nil]))
}

fn encode(value: V) -> Vec<u8> {
    let mut payload = Vec::new();
    rmpv::encode::write_value(&mut payload, &value).unwrap();
    payload
}

/// Decodes `payload` as the daemon does and applies it to `source`.
fn ingest(index: &Index, source: SourceId, payload: &[u8]) {
    let batch = decode_batch(payload, DecodeOptions::default()).unwrap();
    index.apply(source, &batch, 100, &mut Discard).unwrap();
}

/// An engine's batch storing a prompt's tokens under an optional salt.
type SaltedStream = fn(&[u32], Option<&str>) -> Vec<u8>;

#[tokio::test]
async fn salted_blocks_match_only_requests_with_the_same_salt() {
    let streams: [(&str, SaltedStream); 2] = [
        ("vllm", |t, salt| vllm_salted(t, 1, salt)),
        ("sglang", |t, salt| sglang_salted(t, 1, salt)),
    ];
    for (engine, salted) in streams {
        let (index, sources) = index_with_ttl(Duration::from_secs(60));
        let api = app(&index);
        let prompt = tokens(3, 7);
        // a.ns stored the prompt under tenant-a, b.ns without a salt.
        ingest(&index, sources[0], &salted(&prompt, Some("tenant-a")));
        ingest(&index, sources[1], &salted(&prompt, None));
        let ask = |salt: Option<&str>| {
            let mut body = json!({"model": "m", "tokens": prompt});
            if let Some(salt) = salt {
                body["cache_salt"] = json!(salt);
            }
            body
        };
        assert_eq!(
            matched(&api, ask(Some("tenant-a"))).await,
            [("a.ns".into(), 3)],
            "{engine}"
        );
        assert!(
            matched(&api, ask(Some("tenant-b"))).await.is_empty(),
            "{engine}"
        );
        assert_eq!(
            matched(&api, ask(None)).await,
            [("b.ns".into(), 3)],
            "{engine}"
        );
        // `kthena` mode is content-only, as kthena's router is: both pods match.
        let mut kthena = ask(Some("tenant-b"));
        kthena["match"] = json!("kthena");
        let both: Vec<(String, u64)> = PODS.iter().map(|p| ((*p).into(), 3)).collect();
        assert_eq!(matched(&api, kthena).await, both, "{engine}");
    }
}

#[tokio::test]
async fn a_salted_placement_matches_only_its_salt() {
    let (index, _) = index_with_ttl(Duration::from_secs(60));
    let api = app(&index);
    let prompt = tokens(2, 8);
    let placed = json!({"model": "m", "tokens": prompt, "pod": "a.ns", "cache_salt": "t1"});
    assert_eq!(
        post(&api, "/v1/routed", placed).await.0,
        StatusCode::NO_CONTENT
    );
    let with = json!({"model": "m", "tokens": prompt, "cache_salt": "t1"});
    assert_eq!(matched(&api, with).await, [("a.ns".into(), 2)]);
    assert!(matched(&api, json!({"model": "m", "tokens": prompt}))
        .await
        .is_empty());
}

#[tokio::test]
async fn a_long_prompt_is_scored_whole_and_pods_diverging_late_score_apart() {
    let (index, sources) = index_with_ttl(Duration::from_secs(60));
    let api = app(&index);
    // 40,000 tokens = 2,500 blocks; b.ns holds the first 1,000 then another continuation.
    let prompt = tokens(2500, 9);
    store(&index, sources[0], &prompt, 1);
    let mut other = prompt[..16_000].to_vec();
    other.extend(tokens(1500, 10));
    store(&index, sources[1], &other, 1);
    let ask = json!({"model": "m", "tokens": prompt});
    let (status, out) = post(&api, "/v1/score", {
        let mut body = ask.clone();
        body["pods"] = json!(PODS);
        body
    })
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(out["total_blocks"], 2500);
    assert_eq!(
        matched(&api, ask).await,
        [("a.ns".into(), 2500), ("b.ns".into(), 1000)]
    );
    // A request may look at fewer blocks, never at more than the server's cap.
    let fewer = json!({"model": "m", "tokens": prompt, "max_blocks": 600});
    assert_eq!(
        matched(&api, fewer).await,
        [("a.ns".into(), 600), ("b.ns".into(), 600)]
    );
    let too_many = json!({"model": "m", "tokens": prompt, "pods": PODS, "max_blocks": 9000});
    let (status, out) = post(&api, "/v1/score", too_many).await;
    assert_eq!(
        (status, out["field"].as_str()),
        (StatusCode::BAD_REQUEST, Some("max_blocks"))
    );
    // `kthena` mode keeps kthena's cut of 128 blocks.
    let kthena = json!({"model": "m", "tokens": prompt, "pods": PODS, "match": "kthena"});
    let (status, out) = post(&api, "/v1/score", kthena).await;
    assert_eq!(
        (status, out["total_blocks"].as_u64()),
        (StatusCode::OK, Some(128))
    );
}

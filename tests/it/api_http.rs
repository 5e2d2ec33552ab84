//! The HTTP API: the router tested with `oneshot`, plus one test on a real 127.0.0.1 port.

use std::sync::Arc;

use axum::body::{to_bytes, Body};
use axum::http::{header, Request, StatusCode};
use kvindex::api::{router, serve, ApiLimits, ApiState};
use kvindex::hash::prompt_block_hashes;
use kvindex::index::{Discard, Index, IndexOptions, SourceSpec};
use kvindex::ingest::replay_client::ReplayLimits;
use kvindex::ingest::supervisor::Supervisor;
use kvindex::ingest::{PodStatus, PodsView};
use kvindex::ingest::{Target, TcpEndpoint};
use kvindex::medium::{Medium, TierWeights};
use kvindex::score::ScoreBackend;
use kvindex::wire::{BlockHash, BlockRemoved, BlockStored, Engine, EngineBatch, Event};
use serde_json::{json, Value};
use tower::ServiceExt;

struct Targets;

impl PodsView for Targets {
    fn pods(&self) -> Vec<PodStatus> {
        vec![PodStatus {
            pod: "a.ns".into(),
            model: "m".into(),
            engine: "vllm".into(),
            endpoint: "tcp://127.0.0.1:5557".into(),
            dp_ranks: 1,
            source: "static".into(),
            state: "connected".into(),
            last_message_age_seconds: Some(0.5),
            resident_blocks: [("GPU".to_owned(), 3)].into_iter().collect(),
            ..PodStatus::default()
        }]
    }
}

fn tokens(blocks: u32) -> Vec<u32> {
    (0..16 * blocks).collect()
}

/// Pod `a.ns` holds 2 of the 4 blocks on GPU, `b.ns` holds all 4 on CPU, `p.ns` 1 block.
fn index() -> Index {
    let index = Index::new();
    let all = tokens(4);
    for (pod, blocks, medium) in [
        ("a.ns", 2usize, "GPU"),
        ("b.ns", 4, "CPU"),
        ("p.ns", 1, "GPU"),
    ] {
        let source = index
            .register_source(&SourceSpec {
                pod: pod.into(),
                model: "m".into(),
                engine: Engine::Vllm,
                dp_rank: 0,
            })
            .unwrap();
        let event = Event::BlockStored(BlockStored::new(
            (1..=blocks as i64).map(BlockHash::from_i64).collect(),
            all[..16 * blocks].to_vec(),
            16,
            Medium::intern(medium),
        ));
        let batch = EngineBatch::of(vec![event]);
        index.apply(source, &batch, 100, &mut Discard).unwrap();
    }
    index
}

fn app(token: Option<&str>) -> axum::Router {
    let state = ApiState::new(
        ScoreBackend::Index(index()),
        TierWeights::default(),
        token.map(str::to_owned),
        Arc::new(Targets),
    )
    .with_limits(ApiLimits {
        max_body_bytes: 4096,
        ..ApiLimits::default()
    });
    router(state)
}

async fn call(
    app: axum::Router,
    method: &str,
    uri: &str,
    body: Option<String>,
    token: Option<&str>,
) -> (StatusCode, Value) {
    let mut req = Request::builder().method(method).uri(uri);
    if body.is_some() {
        req = req.header(header::CONTENT_TYPE, "application/json");
    }
    if let Some(t) = token {
        req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let req = req.body(body.map_or_else(Body::empty, Body::from)).unwrap();
    let resp = app.oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = to_bytes(resp.into_body(), 1 << 20).await.unwrap();
    let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, value)
}

async fn post(app: axum::Router, uri: &str, body: Value) -> (StatusCode, Value) {
    call(app, "POST", uri, Some(body.to_string()), None).await
}

#[tokio::test]
async fn score_happy_path_orders_by_score() {
    let (status, body) = post(
        app(None),
        "/v1/score",
        json!({"model": "m", "tokens": tokens(4), "pods": ["a.ns", "b.ns", "z.ns"]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body,
        json!({"total_blocks": 4, "scores": [
            {"pod": "b.ns", "score": 80, "matched_blocks": 4},
            {"pod": "a.ns", "score": 50, "matched_blocks": 2}
        ]})
    );
}

#[tokio::test]
async fn score_accepts_block_hashes_as_numbers_or_strings_and_weight_overrides() {
    let hashes = prompt_block_hashes(&tokens(4), 16, 128);
    let mixed = json!([hashes[0], hashes[1].to_string(), hashes[2], hashes[3]]);
    let (status, body) = post(
        app(None),
        "/v1/score",
        json!({"model": "m", "block_hashes": mixed, "pods": ["b.ns"], "weights": {"cpu": 0.5}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body["scores"][0],
        json!({"pod": "b.ns", "score": 50, "matched_blocks": 4})
    );
}

/// Pod `s.ns` holds the chains A·x and B·y; the spliced prompt A·y shares both blocks'
/// tokens with it but only A as a prefix.
fn spliced_app() -> axum::Router {
    spliced_app_with(IndexOptions::default())
}

fn spliced_app_with(options: IndexOptions) -> axum::Router {
    let index = Index::with_options(options);
    let spec = SourceSpec {
        pod: "s.ns".into(),
        model: "m".into(),
        engine: Engine::Vllm,
        dp_rank: 0,
    };
    let source = index.register_source(&spec).unwrap();
    let block = |t: u32| vec![t; 16];
    let store = |hashes: [i64; 2], tokens: Vec<u32>| {
        let hashes = hashes.into_iter().map(BlockHash::from_i64).collect();
        Event::BlockStored(BlockStored::new(hashes, tokens, 16, Medium::GPU))
    };
    let events = vec![
        store([1, 2], [block(10), block(20)].concat()),
        store([3, 4], [block(30), block(40)].concat()),
    ];
    let batch = EngineBatch::of(events);
    index.apply(source, &batch, 100, &mut Discard).unwrap();
    let state = ApiState::new(
        ScoreBackend::Index(index),
        TierWeights::default(),
        None,
        Arc::new(Targets),
    );
    router(state)
}

#[tokio::test]
async fn score_matches_chains_by_default_and_content_only_in_kthena_mode() {
    let spliced: Vec<u32> = [vec![10u32; 16], vec![40u32; 16]].concat();
    let req = |mode: Option<&str>| {
        let mut req = json!({"model": "m", "tokens": spliced, "pods": ["s.ns"]});
        if let Some(mode) = mode {
            req["match"] = json!(mode);
        }
        req
    };
    let one =
        json!({"total_blocks": 2, "scores": [{"pod": "s.ns", "score": 50, "matched_blocks": 1}]});
    let both =
        json!({"total_blocks": 2, "scores": [{"pod": "s.ns", "score": 100, "matched_blocks": 2}]});
    for (mode, want) in [
        (None, &one),
        (Some("prefix"), &one),
        (Some("kthena"), &both),
    ] {
        let (status, body) = post(spliced_app(), "/v1/score", req(mode)).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(&body, want, "match {mode:?}");
    }
    // The PD endpoint takes the same modes.
    let pd = |mode: &str| {
        json!({"model": "m", "tokens": spliced, "decode": [{"pod": "s.ns", "group": "g"}],
               "prefill": {"g": ["s.ns"]}, "match": mode})
    };
    let (_, prefix) = post(spliced_app(), "/v1/pd/schedule", pd("prefix")).await;
    let (_, kthena) = post(spliced_app(), "/v1/pd/schedule", pd("kthena")).await;
    assert_eq!(prefix["pairs"][0]["prefill_score"], json!(50.0));
    assert_eq!(kthena["pairs"][0]["prefill_score"], json!(100.0));
}

/// A `kthena` request with tokens reads the std hashes of the blocks the index holds from
/// its runs and hashes the rest: the scores of the same prompt sent as kthena's block hashes.
#[tokio::test]
async fn kthena_tokens_score_as_their_block_hashes_do() {
    let prompts = [
        [vec![10u32; 16], vec![20; 16], vec![30; 16], vec![7; 5]].concat(),
        [vec![10u32; 16], vec![40; 16]].concat(),
        [vec![30u32; 16], vec![40; 16], vec![50; 16]].concat(),
    ];
    for tokens in prompts {
        let hashes = prompt_block_hashes(&tokens, 16, 128);
        let by_tokens =
            json!({"model": "m", "tokens": tokens, "pods": ["s.ns"], "match": "kthena"});
        let by_hashes = json!({"model": "m", "block_hashes": hashes, "pods": ["s.ns"]});
        let (status, from_tokens) = post(spliced_app(), "/v1/score", by_tokens).await;
        assert_eq!(status, StatusCode::OK);
        let (_, from_hashes) = post(spliced_app(), "/v1/score", by_hashes).await;
        assert_eq!(from_tokens, from_hashes, "{tokens:?}");
        assert_ne!(
            from_tokens["scores"][0]["matched_blocks"],
            json!(0),
            "{tokens:?}"
        );
    }
}

#[tokio::test]
async fn a_prefix_only_index_scores_chains_and_refuses_kthena_naming_the_field() {
    let lean = || {
        spliced_app_with(IndexOptions {
            std_layer: false,
            ..IndexOptions::default()
        })
    };
    let spliced: Vec<u32> = [vec![10u32; 16], vec![40u32; 16]].concat();
    let natural: Vec<u32> = [vec![10u32; 16], vec![20u32; 16]].concat();
    let req = |tokens: &[u32]| json!({"model": "m", "tokens": tokens, "pods": ["s.ns"]});
    for (tokens, matched) in [(&natural, 2), (&spliced, 1)] {
        let (status, body) = post(lean(), "/v1/score", req(tokens)).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            body["scores"][0]["matched_blocks"],
            json!(matched),
            "{body}"
        );
    }
    let mut kthena = req(&natural);
    kthena["match"] = json!("kthena");
    let (status, body) = post(lean(), "/v1/score", kthena).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["field"], json!("match"), "{body}");
    let hashes = json!({"model": "m", "block_hashes": [1, 2], "pods": ["s.ns"]});
    let (status, body) = post(lean(), "/v1/score", hashes).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["field"], json!("block_hashes"), "{body}");
}

#[tokio::test]
async fn unknown_model_gives_empty_scores() {
    let (status, body) = post(
        app(None),
        "/v1/score",
        json!({"model": "nope", "tokens": tokens(2), "pods": ["a.ns"]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, json!({"total_blocks": 2, "scores": []}));
}

#[tokio::test]
async fn malformed_json_is_a_400_with_a_json_body() {
    let (status, body) = call(
        app(None),
        "POST",
        "/v1/score",
        Some("{\"model\": ".into()),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["error"].is_string());
}

#[tokio::test]
async fn missing_and_bad_fields_are_named() {
    let cases = [
        (json!({"tokens": [1], "pods": []}), "model"),
        (json!({"model": "m", "tokens": [1]}), "pods"),
        (json!({"model": "m", "pods": ["a.ns"]}), "tokens"),
        (
            json!({"model": "m", "tokens": [1, "x"], "pods": []}),
            "tokens[1]",
        ),
        (
            json!({"model": "m", "tokens": [1], "pods": ["a.ns", ""]}),
            "pods[1]",
        ),
        (
            json!({"model": "m", "tokens": [1], "pods": [], "weights": {"gpu": 1.5}}),
            "weights.gpu",
        ),
        (
            json!({"model": "m", "tokens": [1], "pods": [], "tokenz": 1}),
            "tokenz",
        ),
        (json!({"model": "", "tokens": [1], "pods": []}), "model"),
        (
            json!({"model": "m", "tokens": [1], "pods": [], "match": "radix"}),
            "match",
        ),
        (
            json!({"model": "m", "block_hashes": ["1"], "pods": [], "match": "prefix"}),
            "match",
        ),
    ];
    for (req, field) in cases {
        let (status, body) = post(app(None), "/v1/score", req.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{req}");
        assert_eq!(body["field"], json!(field), "{req}: {body}");
    }
    let (status, body) = post(
        app(None),
        "/v1/pd/schedule",
        json!({"model": "m", "tokens": [1], "decode": [{"pod": "d"}], "prefill": {}}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["field"], json!("decode[0].group"));
    let (status, body) = post(app(None), "/v1/pd/schedule", json!({"model": "m", "tokens": [1], "decode": [{"pod": "d", "group": "g"}], "prefill": {}, "top_n": 0})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["field"], json!("top_n"));
}

#[tokio::test]
async fn oversized_body_is_a_413_with_a_json_body() {
    let big = json!({"model": "m", "tokens": vec![7u32; 4000], "pods": []});
    let (status, body) = post(app(None), "/v1/score", big).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(body["error"].is_string());
}

#[tokio::test]
async fn wrong_or_missing_token_is_a_401() {
    let req = json!({"model": "m", "tokens": [1], "pods": []}).to_string();
    let (status, _) = call(
        app(Some("s3cret")),
        "POST",
        "/v1/score",
        Some(req.clone()),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = call(
        app(Some("s3cret")),
        "POST",
        "/v1/score",
        Some(req.clone()),
        Some("wrong"),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = call(app(Some("s3cret")), "GET", "/v1/pods", None, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = call(
        app(Some("s3cret")),
        "POST",
        "/v1/score",
        Some(req),
        Some("s3cret"),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn pd_schedule_pairs_decodes_with_their_groups_best_prefill() {
    let req = json!({
        "model": "m",
        "tokens": tokens(4),
        "decode": [
            {"pod": "a.ns", "group": "g1"},
            {"pod": "b.ns", "group": "g1"},
            {"pod": "x.ns", "group": "g2", "score": 10.0},
            {"pod": "y.ns", "group": "missing", "score": 99.0}
        ],
        "prefill": {"g1": ["z.ns", "p.ns"], "g2": ["b.ns"]},
        "top_n": 3
    });
    let (status, body) = post(app(None), "/v1/pd/schedule", req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({"pairs": [
            {"decode": "b.ns", "prefill": "p.ns", "prefill_score": 25.0},
            {"decode": "a.ns", "prefill": "p.ns", "prefill_score": 25.0}
        ]})
    );
}

#[tokio::test]
async fn pd_schedule_without_any_pair_is_a_422_naming_prefill() {
    let req =
        json!({"model": "m", "tokens": [1], "decode": [{"pod": "d", "group": "g"}], "prefill": {}});
    let (status, body) = post(app(None), "/v1/pd/schedule", req).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["field"], json!("prefill"));
}

#[tokio::test]
async fn pods_lists_the_targets() {
    let (status, body) = call(app(None), "GET", "/v1/pods", None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["pods"][0]["pod"], json!("a.ns"));
    assert_eq!(body["pods"][0]["resident_blocks"]["GPU"], json!(3));
}

#[tokio::test]
async fn serves_on_a_real_loopback_port_and_shuts_down() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(listener, app(None), async {
        let _ = stopped.await;
    }));
    let body = json!({"model": "m", "tokens": tokens(4), "pods": ["a.ns"]}).to_string();
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "POST /v1/score HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    conn.read_to_string(&mut response).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(
        response.ends_with(
            r#"{"total_blocks":4,"scores":[{"pod":"a.ns","score":50,"matched_blocks":2}]}"#
        ),
        "{response}"
    );
    stop.send(()).unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(5), server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

fn validator(name: &str) -> jsonschema::Validator {
    let path = format!("{}/schemas/{name}", env!("CARGO_MANIFEST_DIR"));
    let schema: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    jsonschema::validator_for(&schema).unwrap_or_else(|err| panic!("{name}: {err}"))
}

fn assert_conforms(name: &str, value: &Value) {
    let errors: Vec<String> = validator(name)
        .iter_errors(value)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{name}: {value}\n{}", errors.join("\n"));
}

#[tokio::test]
async fn response_bodies_match_their_schemas() {
    let (_, body) = post(
        app(None),
        "/v1/score",
        json!({"model": "m", "tokens": tokens(4), "pods": ["a.ns", "b.ns"]}),
    )
    .await;
    assert_conforms("api-score-response.schema.json", &body);
    let req = json!({"model": "m", "tokens": tokens(4), "decode": [{"pod": "a.ns", "group": "g"}], "prefill": {"g": ["p.ns"]}});
    let (_, body) = post(app(None), "/v1/pd/schedule", req).await;
    assert_conforms("api-pd-schedule-response.schema.json", &body);
    let (_, body) = call(app(None), "GET", "/v1/pods", None, None).await;
    assert_conforms("api-pods-response.schema.json", &body);
    // Error bodies of every kind: bad field, 404, 401, 413, 422.
    let (_, body) = post(app(None), "/v1/score", json!({"tokens": [1], "pods": []})).await;
    assert_conforms("api-error.schema.json", &body);
    let (_, body) = call(app(None), "GET", "/v1/nope", None, None).await;
    assert_conforms("api-error.schema.json", &body);
    let (_, body) = call(app(Some("t")), "GET", "/v1/pods", None, None).await;
    assert_conforms("api-error.schema.json", &body);
    let big = json!({"model": "m", "tokens": vec![7u32; 4000], "pods": []});
    let (_, body) = post(app(None), "/v1/score", big).await;
    assert_conforms("api-error.schema.json", &body);
    let req =
        json!({"model": "m", "tokens": [1], "decode": [{"pod": "d", "group": "g"}], "prefill": {}});
    let (_, body) = post(app(None), "/v1/pd/schedule", req).await;
    assert_conforms("api-error.schema.json", &body);
}

/// The request schemas describe what the server accepts: a body the schema refuses is a 400,
/// and a body it accepts never is.
#[tokio::test]
async fn request_schemas_agree_with_the_server() {
    let score = [
        json!({"model": "m", "tokens": [1], "pods": ["a.ns"], "weights": {"gpu": 1.0}}),
        json!({"model": "m", "block_hashes": ["1", 2], "pods": []}),
        json!({"model": "m", "tokens": [1], "block_hashes": ["1"], "pods": ["a"]}),
        json!({"model": "m", "pods": ["a"]}),
        json!({"model": "", "tokens": [1], "pods": []}),
        json!({"model": "m", "tokens": [1], "pods": [""]}),
        json!({"model": "m", "tokens": [-1], "pods": []}),
        json!({"model": "m", "tokens": [1], "pods": [], "weights": {"gpu": 1.5}}),
        json!({"model": "m", "tokens": [1], "pods": [], "extra": true}),
    ];
    let decode = json!([{"pod": "a.ns", "group": "g"}]);
    let pd = [
        json!({"model": "m", "tokens": [1], "decode": decode, "prefill": {"g": ["p.ns"]}, "top_n": 2}),
        json!({"model": "m", "tokens": [1], "decode": decode, "prefill": {}}),
        json!({"model": "m", "tokens": [1], "decode": [], "prefill": {}}),
        json!({"model": "m", "tokens": [1], "decode": [{"pod": "a.ns"}], "prefill": {}}),
        json!({"model": "m", "tokens": [1], "decode": decode, "prefill": {"g": [""]}}),
        json!({"model": "m", "tokens": [1], "decode": decode, "prefill": {}, "top_n": 0}),
    ];
    let routes = [
        ("/v1/score", "api-score-request.schema.json", &score[..]),
        (
            "/v1/pd/schedule",
            "api-pd-schedule-request.schema.json",
            &pd[..],
        ),
    ];
    for (uri, schema, bodies) in routes {
        let validator = validator(schema);
        for req in bodies {
            let (status, body) = post(app(None), uri, req.clone()).await;
            assert_eq!(
                status == StatusCode::BAD_REQUEST,
                !validator.is_valid(req),
                "{uri} {req}: {status} {body}"
            );
        }
    }
}

fn closed_target(pod: &str) -> Target {
    Target {
        pod: pod.to_owned(),
        namespace: "ns".to_owned(),
        model: "m".to_owned(),
        engine: Engine::Vllm,
        // Nothing listens on the discard port: the target stays `connecting`.
        endpoint: TcpEndpoint::parse("tcp://127.0.0.1:9").unwrap(),
        replay_endpoint: None,
        topic: String::new(),
        dp_ranks: 1,
        max_frame_bytes: None,
    }
}

/// Bug 6(e): `GET /v1/pods` reports the daemon's real targets with resident counts from the
/// index's per-pod counters, and follows removes and clears without a walk.
#[tokio::test]
async fn pods_reports_resident_counts_of_the_real_supervisor() {
    let index = index();
    let cancel = tokio_util::sync::CancellationToken::new();
    let supervisor = Supervisor::new(index.clone(), None, cancel.clone(), ReplayLimits::default());
    supervisor
        .apply(vec![
            closed_target("a"),
            closed_target("b"),
            closed_target("q"),
        ])
        .await;
    let state = ApiState::new(
        ScoreBackend::Index(index.clone()),
        TierWeights::default(),
        None,
        supervisor.clone(),
    );
    let resident = |body: &Value| -> Vec<Value> {
        let pods = body["pods"].as_array().unwrap();
        pods.iter().map(|p| p["resident_blocks"].clone()).collect()
    };
    let (status, body) = call(router(state.clone()), "GET", "/v1/pods", None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_conforms("api-pods-response.schema.json", &body);
    assert_eq!(body["pods"][0]["pod"], json!("a.ns"));
    assert_eq!(
        resident(&body),
        vec![json!({"GPU": 2}), json!({"CPU": 4}), json!({})]
    );
    let a = index.sources_of_pod("a.ns")[0];
    let remove = Event::BlockRemoved(BlockRemoved::new(
        vec![BlockHash::from_i64(2)],
        Medium::intern("GPU"),
    ));
    index
        .apply(a, &EngineBatch::of(vec![remove]), 101, &mut Discard)
        .unwrap();
    index
        .clear_source(index.sources_of_pod("b.ns")[0], &mut Discard)
        .unwrap();
    let (_, body) = call(router(state), "GET", "/v1/pods", None, None).await;
    assert_eq!(
        resident(&body),
        vec![json!({"GPU": 1}), json!({}), json!({})]
    );
    cancel.cancel();
    supervisor.shutdown(std::time::Duration::from_secs(5)).await;
}

//! `kvindex score`: the binary reads kthena's keys from Redis and prints the /v1/score body.

use std::process::Command;

use kvindex::hash::prompt_block_hashes;
use kvindex::store::redis::block_key;

#[tokio::test]
async fn score_json_from_redis_prints_the_api_body() {
    let model = format!("cli-score-{}", std::process::id());
    let tokens: Vec<u32> = (500..548).collect();
    let hashes = prompt_block_hashes(&tokens, 16, 128);
    let client = redis::Client::open("redis://127.0.0.1:6379/").unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut pipe = redis::pipe();
    pipe.hset(block_key(&model, hashes[0]), "a.ns", "100|GPU")
        .ignore();
    pipe.hset(block_key(&model, hashes[1]), "a.ns", "100|cpu")
        .ignore();
    pipe.hset(block_key(&model, hashes[0]), "b.ns", "100")
        .ignore();
    let () = pipe.query_async(&mut conn).await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens.json");
    std::fs::write(&file, serde_json::to_string(&tokens).unwrap()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kvindex"))
        .args(["score", "--model", &model, "--tokens"])
        .arg(&file)
        .args([
            "--pods",
            "a.ns,b.ns,c.ns",
            "--redis",
            "redis://127.0.0.1:6379/",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let body: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        body,
        serde_json::json!({"total_blocks": 3, "scores": [
            {"pod": "a.ns", "score": 60, "matched_blocks": 2},
            {"pod": "b.ns", "score": 33, "matched_blocks": 1}
        ]})
    );
    let keys: Vec<String> = hashes.iter().map(|h| block_key(&model, *h)).collect();
    let _: () = redis::cmd("DEL")
        .arg(&keys)
        .query_async(&mut conn)
        .await
        .unwrap();
}

#[test]
fn score_without_a_backend_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens.json");
    std::fs::write(&file, "[1, 2, 3]").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kvindex"))
        .args(["score", "--model", "m", "--tokens"])
        .arg(&file)
        .args(["--pods", "a.ns"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--redis"));
}

#[test]
fn score_from_recorded_streams_prints_a_table() {
    // The first 32 tokens stored by the vLLM 0.9.0 capture: both blocks stay resident.
    let tokens =
        "[29116, 7333, 6938, 12571, 9640, 3521, 24262, 10087, 21796, 28717, 16450, 16227, \
                  16880, 15465, 17646, 17327, 18700, 21205, 2906, 1227, 11112, 8081, 30054, 1767, \
                  18660, 15453, 15906, 18467, 20720, 4489, 27726, 14319]";
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens.json");
    std::fs::write(&file, tokens).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kvindex"))
        .args(["score", "--model", "m", "--tokens"])
        .arg(&file)
        .args([
            "--pods",
            "replay-0.default,other.ns",
            "--replay",
            "fixtures/vllm-e01-0.9.0.jsonl",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "total blocks  2");
    assert_eq!(lines.len(), 3, "{text}");
    let row: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(row, ["replay-0.default", "100", "2", "2.000"]);
}

/// `score --redis` with a password URL that fails, as the binary prints it.
fn score_with_redis(url: &str) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens.json");
    std::fs::write(&file, "[1, 2, 3]").unwrap();
    Command::new(env!("CARGO_BIN_EXE_kvindex"))
        .args(["score", "--model", "m", "--tokens"])
        .arg(&file)
        .args(["--pods", "a.ns", "--redis", url])
        .output()
        .unwrap()
}

#[test]
fn score_redis_errors_never_show_the_password() {
    let secret = "s3cret-Horse%21";
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cases = [
        ("bad scheme", format!("nope://u:{secret}@127.0.0.1/0"), 64),
        ("bad port", format!("redis://u:{secret}@127.0.0.1:x/0"), 64),
        (
            "refused",
            format!("redis://:{secret}@127.0.0.1:{closed}/0"),
            1,
        ),
        // The shared Redis has no password for `nobody`: AUTH is refused.
        (
            "wrong user",
            format!("redis://nobody:{secret}@127.0.0.1:6379/0"),
            1,
        ),
    ];
    for (case, url, code) in &cases {
        let out = score_with_redis(url);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(*code), "{case}: {stderr}");
        for text in [&stderr, &stdout] {
            assert!(!text.contains(secret), "{case}: {text}");
            assert!(!text.contains("s3cret-Horse!"), "{case}: {text}");
        }
        assert!(stderr.contains(":***@127.0.0.1"), "{case}: {stderr}");
    }
}

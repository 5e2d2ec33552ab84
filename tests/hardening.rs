//! Issue 14 (hardening): auth that cannot be switched off by accident, bounded model/LoRA
//! names, HTTP connection limits and timeouts, frame size caps and true gauges — each on
//! the built binary or the daemon, over real sockets on 127.0.0.1.

use std::process::Command;

/// A config file in a temporary directory (kept alive by the returned guard).
fn config_file(text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kvindex.yaml");
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

#[test]
fn an_empty_api_token_from_the_environment_exits_64_naming_the_variable() {
    let (_dir, path) = config_file("api:\n  listen: 127.0.0.1:0\n  token: secret\n");
    for command in ["serve", "check-config"] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kvindex"));
        cmd.arg(command);
        if command == "serve" {
            cmd.arg("--config");
        }
        let out = cmd
            .arg(&path)
            .env("KVINDEX_API_TOKEN", "")
            .env("KVINDEX_METRICS_LISTEN", "127.0.0.1:0")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{command}: {stderr}");
        assert!(stderr.contains("KVINDEX_API_TOKEN"), "{command}: {stderr}");
    }
}

#[test]
fn check_config_shows_the_environment_token_as_set_never_its_value() {
    let (_dir, path) = config_file("api:\n  listen: 127.0.0.1:0\n");
    let run = |token: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kvindex"));
        cmd.arg("check-config")
            .arg(&path)
            .env_remove("KVINDEX_API_TOKEN");
        if let Some(t) = token {
            cmd.env("KVINDEX_API_TOKEN", t);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(!json.to_string().contains("s3cret"), "{json}");
        json["api"]["token"].as_str().unwrap().to_owned()
    };
    assert_eq!(run(None), "not set");
    assert_eq!(run(Some("s3cret")), "set");
}

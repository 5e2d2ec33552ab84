//! The integration tests that can share one process, as one test binary (as ripgrep's
//! `tests/tests.rs` does): one link instead of one per file, and every test in one harness,
//! so `cargo test` runs them in parallel rather than file after file.
//!
//! Tests that own something process-wide stay binaries of their own in `tests/`: a global
//! tracing subscriber that captures log lines (`first_run`, `redis_mirror`) or assertions on
//! the process's one Prometheus recorder (`gauges`, `ops_dashboards`, `serve_ops`,
//! `k8s_discovery`, `redis_cluster`), which other tests' daemons would also write to.

// The simulated engines of `kvindex demo`, included by path: private to the binary.
#[allow(dead_code)]
#[path = "../../src/sim/mod.rs"]
mod sim;

#[path = "../util/mod.rs"]
mod util;

/// The HTTP API: the router with `oneshot`, plus a real port.
mod api_http;
/// The config file, its example and its JSON Schema.
mod config;
/// The daemon as a library: listeners and shutdown.
mod daemon;
/// `kvindex demo` as a new user runs it.
mod demo;
/// The Kubernetes manifests in `deploy/`.
mod deploy_manifests;
/// Golden tests over the recorded engine streams.
mod fixtures;
/// High availability: replicas sharing a writer lease, built binaries.
mod ha_lease;
/// Hostile or runaway input.
mod hardening;
/// Model-based tests of the index.
mod proptest_index;
/// Both match modes against a naive chain model.
mod proptest_prefix;
/// Property tests of the wire decoder.
mod proptest_wire;
/// README claims checked the way the README states them.
mod readme_claims;
/// The Redis mirror keeping Redis equal to the index over time.
mod redis_upkeep;
/// The writer's ordering with several pipelines in flight.
mod redis_writer_order;
/// Speculative placements, the accuracy signal, tenant salts and long prompts over HTTP.
mod routing_api;
/// The JSON Schemas in `schemas/`.
mod schemas;
/// `kvindex score` against Redis.
mod score_cli;
/// kthena parity of the prefix scorer.
mod score_parity;
/// The grouped PD scheduler.
mod score_pd;
/// The daemon over real ZMQ sockets.
mod serve_ingest;
/// The daemon with a `redis:` section.
mod serve_redis;
/// Sharded replicas as binaries.
mod shard_replicas;
/// `kvindex top` in tmux against the demo.
mod top_tmux;
/// Warm restart of the built binary.
mod warm_restart;
/// A warm start keeps the chain layer's runs.
mod warm_runs;

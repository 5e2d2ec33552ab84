#![warn(missing_docs)]
//! kvindex: a KV-cache event ingester and prefix index for LLM serving clusters.
//!
//! Engines (vLLM, SGLang, TensorRT-LLM) publish `BlockStored` / `BlockRemoved` /
//! `AllBlocksCleared` events over ZeroMQ. kvindex decodes them, keeps an index of which pod
//! holds which block on which storage tier, mirrors it into Redis in the layout the kthena
//! router reads, and scores pods by longest cached prefix.
//!
//! # Layout
//!
//! Data flows one way: `wire` → `index` → `store` | `score` → `api`, with `ingest` feeding
//! the index. [`Daemon`] composes them into the running service; the CLI (`src/main.rs`
//! and its `commands`), the simulated engines of `kvindex demo` and the global allocator
//! belong to the binary, not to the library.
//!
//! | module | job |
//! | --- | --- |
//! | [`wire`] | bytes → normalized events; every engine quirk lives here |
//! | [`hash`] | kthena's standardized block hash, the chained XXH3 hash of `prefix` matching, prompt chunking |
//! | [`medium`] | storage media, media bitsets, tier weights |
//! | [`index`] | in-memory residency index, emits deltas |
//! | [`store`] | Redis mirror of the index (kthena layout) |
//! | [`ingest`] | ZMQ subscribers, sequence tracking, replay, fixtures, targets, Kubernetes discovery |
//! | [`score`] | longest-prefix scoring, PD pairing |
//! | [`api`] | HTTP query service |
//! | [`config`] | the YAML config file |
//!
//! Each public type has one path: `kvindex::index::Index`, `kvindex::wire::Engine`,
//! `kvindex::medium::TierWeights`, `kvindex::config::Config`, and the daemon as
//! `kvindex::Daemon`.

pub mod api;
pub mod config;
pub mod hash;
pub mod index;
pub mod ingest;
pub mod medium;
pub mod score;
pub mod store;
pub mod wire;

mod daemon;
mod metrics;
mod redis_conn;
mod redis_layout;
mod settings;
mod shard;

pub use daemon::{Daemon, DaemonError};
/// The Prometheus recorder an embedder installs to export the library's metrics, and its text.
pub use metrics::{install as install_metrics, render as render_metrics};

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
//! the index. `daemon` composes them into the running service; `commands` is the CLI edge
//! over the rest.
//!
//! | module | job |
//! | --- | --- |
//! | [`wire`] | bytes → normalized events; every engine quirk lives here |
//! | [`hash`] | kthena's standardized block hash, the chained XXH3 hash of `prefix` matching, prompt chunking |
//! | [`medium`] | storage media, media bitsets, tier weights |
//! | [`index`] | in-memory residency index, emits deltas |
//! | [`redis_layout`] | kthena's Redis keys and values, written by `store`, read by `score`; URL redaction |
//! | [`redis_conn`] | one connection type for a single Redis or a Redis Cluster, shared by `store` and `score` |
//! | [`store`] | Redis mirror of the index (kthena layout) |
//! | [`ingest`] | ZMQ subscribers, sequence tracking, replay, fixtures, targets, Kubernetes discovery |
//! | [`score`] | longest-prefix scoring, PD pairing |
//! | [`api`] | HTTP query service |
//! | [`config`] | the YAML config file |
//! | [`metrics`] | Prometheus metrics |
//! | [`daemon`] | the running service: composition root, health server, shutdown |
//! | [`shard`] | which replica owns a pod: rendezvous hashing of `{pod}.{namespace}` |
//! | [`sim`] | simulated engines (PUB + replay ROUTER) for `kvindex demo` and tests |
//! | [`commands`] | the CLI commands, callable as library functions |
//! | [`allocator`] | the global allocator the binary installs (build-time choice) |
//!
//! The types a library user needs are re-exported here by name, so
//! `use kvindex::{Index, Engine, TierWeights, Config, Daemon};` is enough to embed the
//! index, score from it, or run the daemon in-process.

pub mod allocator;
pub mod api;
pub mod commands;
pub mod config;
pub mod daemon;
pub mod hash;
pub mod index;
pub mod ingest;
pub mod medium;
pub mod metrics;
pub mod redis_conn;
pub mod redis_layout;
pub mod score;
mod settings;
pub mod shard;
pub mod sim;
pub mod store;
pub mod wire;

pub use config::{Config, ConfigError};
pub use daemon::{Daemon, DaemonError};
pub use hash::{
    chain_hash, prompt_block_hashes, prompt_chain_hashes, std_hash, ChainHash, StdHash,
};
pub use index::{Delta, DeltaSink, DumpEntry, Index, IndexOptions, IndexStats};
pub use ingest::Target;
pub use medium::{MediaSet, Medium, TierWeights, WeightError};
pub use redis_conn::{RedisConn, RedisTarget};
pub use score::{
    schedule, score_index, score_index_with, score_prefix, DecodeCandidate, IndexLookup, Lookup,
    MatchMode, Pair, PodScore, PrefixScores, PromptSettings,
};
pub use shard::Shard;
pub use store::redis::{MirrorError, MirrorHandle, MirrorStop, RedisConfig, ValueFormat};
pub use wire::{
    decode_batch, decode_message, BlockHash, DecodeError, DecodeOptions, Engine, EngineBatch, Event,
};

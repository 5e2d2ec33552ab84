//! kvindex: a KV-cache event ingester and prefix index for LLM serving clusters.
//!
//! Engines (vLLM, SGLang, TensorRT-LLM) publish `BlockStored` / `BlockRemoved` /
//! `AllBlocksCleared` events over ZeroMQ. kvindex decodes them, keeps an index of which pod
//! holds which block on which storage tier, mirrors it into Redis in the layout the kthena
//! router reads, and scores pods by longest cached prefix.
//!
//! # Layout
//!
//! Data flows one way: `wire` → `index` → `store` | `score` → `api`.
//!
//! | module | job |
//! | --- | --- |
//! | [`wire`] | bytes → normalized events; every engine quirk lives here |
//! | [`hash`] | kthena's standardized block hash and prompt chunking |
//! | [`medium`] | storage media, media bitsets, tier weights |
//! | [`index`] | in-memory residency index, emits deltas |
//! | [`redis_layout`] | kthena's Redis keys and values, written by `store`, read by `score`; URL redaction |
//! | [`store`] | Redis mirror of the index (kthena layout) |
//! | [`ingest`] | ZMQ subscribers, sequence tracking, replay, fixtures, targets |
//! | [`score`] | longest-prefix scoring, PD pairing |
//! | [`api`] | HTTP query service |
//! | [`config`] | the YAML config file |
//! | [`metrics`] | Prometheus metrics |
//! | [`commands`] | the CLI commands, callable as library functions |

pub mod api;
pub mod commands;
pub mod config;
pub mod hash;
pub mod index;
pub mod ingest;
pub mod medium;
pub mod metrics;
pub mod redis_layout;
pub mod score;
pub mod store;
pub mod wire;

//! Settings vocabulary: the types `config` validates the file into and the layers run with,
//! kept below both so that `config` imports no layer's code.
//!
//! | file | job |
//! | --- | --- |
//! | `target.rs` | `Target`, `TcpEndpoint`: one engine pod to subscribe to (public as `ingest::…`) |
//! | `kubernetes.rs` | `KubernetesConfig`: the discovery section (public as `ingest::discovery::…`) |
//! | `redis.rs` | `RedisConfig` and the HA lease's ttl bounds (public as `store::redis::…`) |
//!
//! The module is private: each type has one public path, through the layer that uses it.

pub(crate) mod kubernetes;
pub(crate) mod redis;
pub(crate) mod target;

//! Targets found at run time instead of written in the config (docs/architecture.md §8).
//!
//! | file | job |
//! | --- | --- |
//! | `model.rs` | pure: pod object → target (annotations over defaults), identity, [`Roster`] |
//! | `kubernetes.rs` | kube-rs watcher + reflector per namespace → [`Roster`] → supervisor |
//!
//! [`KubernetesConfig`] (API access, namespaces, selector, per-pod defaults) is settings
//! vocabulary, defined below `config`, which fills it in.
//!
//! Discovery only produces targets: the supervisor runs them next to the static ones, and
//! its forget path (index and Redis) handles deletion, expiry and restarts.

mod kubernetes;
mod model;

pub use crate::settings::kubernetes::{ClusterAccess, KubernetesConfig, PodDefaults};
pub use kubernetes::{
    client_for, spawn, DiscoveryError, DiscoveryHealth, DiscoveryStatus, KubernetesDiscovery,
    MAX_BACKOFF, MIN_BACKOFF,
};
pub use model::{
    observe, AnnotationError, PodObservation, Roster, RosterUpdate, ANNOTATION_DP_RANKS,
    ANNOTATION_ENGINE, ANNOTATION_MODEL, ANNOTATION_PORT, ANNOTATION_REPLAY_PORT, ANNOTATION_TOPIC,
};

//! Targets found at run time instead of written in the config (docs/architecture.md §8).
//!
//! | file | job |
//! | --- | --- |
//! | `settings.rs` | [`KubernetesConfig`]: API access, namespaces, selector, per-pod defaults |
//! | `model.rs` | pure: pod object → target (annotations over defaults), identity, [`Roster`] |
//! | `kubernetes.rs` | kube-rs watcher + reflector per namespace → [`Roster`] → supervisor |
//!
//! Discovery only produces targets: the supervisor runs them next to the static ones, and
//! its forget path (index and Redis) handles deletion, expiry and restarts.

pub mod kubernetes;
pub mod model;
pub mod settings;

pub use kubernetes::{
    client_for, spawn, DiscoveryError, DiscoveryHealth, DiscoveryStatus, KubernetesDiscovery,
};
pub use model::{observe, AnnotationError, PodObservation, Roster, RosterUpdate};
pub use settings::{ClusterAccess, KubernetesConfig, PodDefaults};

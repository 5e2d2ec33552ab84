//! The target set of the daemon: one subscriber task per (target, DP rank).
//!
//! | file | job |
//! | --- | --- |
//! | `targets.rs` | [`Supervisor`]: start, stop, restart and forget targets; `PodsView` |
//! | `sourced.rs` | [`TargetSource`], [`EngineIdentity`], [`DiscoveredTarget`]: static vs discovered |

mod sourced;
mod targets;

pub use sourced::{DiscoveredTarget, EngineIdentity, TargetSource};
pub use targets::{ReloadSummary, Supervisor, TargetStatus};

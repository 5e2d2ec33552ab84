//! The target set of the daemon: one subscriber task per (target, DP rank), hot reload.
//!
//! | file | job |
//! | --- | --- |
//! | `targets.rs` | [`Supervisor`]: start, stop, restart and forget targets; `PodsView` |
//! | `reload.rs` | [`reload_loop`]: config file changes (notify) and SIGHUP → new target set |
//! | `sourced.rs` | [`TargetSource`], [`EngineIdentity`], [`DiscoveredTarget`]: static vs discovered |

mod reload;
mod sourced;
mod targets;

pub use reload::reload_loop;
pub use sourced::{DiscoveredTarget, EngineIdentity, TargetSource};
pub use targets::{ReloadSummary, Supervisor, TargetStatus};

//! The target set of the daemon: one subscriber task per (target, DP rank).
//!
//! | file | job |
//! | --- | --- |
//! | `targets.rs` | [`Supervisor`]: start, stop, restart and forget targets; `PodsView` |

mod targets;

pub use targets::{ReloadSummary, Supervisor, TargetStatus};

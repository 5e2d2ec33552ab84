//! What both soak examples measure and compare: process RSS, dumps without store times,
//! messages a daemon has seen.

use kvindex::index::DumpEntry;
use kvindex::Daemon;

#[path = "../../benches/common/proc_status.rs"]
mod proc_status;

/// The process's resident set, MiB (`VmRSS` in /proc/self/status).
pub fn rss_mib() -> f64 {
    proc_status::status_mib("self", "VmRSS")
}

/// The process's swapped-out memory, MiB (`VmSwap` in /proc/self/status).
pub fn swap_mib() -> f64 {
    proc_status::status_mib("self", "VmSwap")
}

/// A dump without store times, sorted, for comparing runs made at different seconds.
pub fn strip(dump: Vec<DumpEntry>) -> Vec<DumpEntry> {
    let mut d: Vec<DumpEntry> = dump
        .into_iter()
        .map(|mut e| {
            e.stored_at = 0;
            e
        })
        .collect();
    d.sort();
    d
}

/// Messages the daemon's subscribers have received.
pub fn messages_seen(d: &Daemon) -> u64 {
    d.supervisor
        .status()
        .iter()
        .flat_map(|t| &t.ranks)
        .map(|r| r.stats.messages)
        .sum()
}

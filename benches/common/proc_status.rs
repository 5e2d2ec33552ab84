//! One field of `/proc/PID/status` (`VmRSS`, `VmHWM`, `VmSwap`, …): the memory figures the
//! benches and examples print next to their timings.

/// Field `field` (without its colon) of process `process`'s status (`"self"` or a pid), in
/// MiB; 0 when it cannot be read.
pub fn status_mib(process: &str, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{process}/status")).unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|value| value.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

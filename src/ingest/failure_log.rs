//! Which connect failures of one DP rank reach the log at WARN: the first of a streak (with
//! the target and the reason), then at most one per [`WARN_EVERY`] with the count since, so
//! an endpoint that never answers is said clearly once and never floods the log. Pure, so
//! tests drive it with their own clock.

use std::time::{Duration, Instant};

/// Shortest time between two WARN lines about one rank's failing connects.
pub const WARN_EVERY: Duration = Duration::from_secs(60);

/// The failing-connect streak of one rank.
#[derive(Debug, Default, Clone)]
pub struct FailureLog {
    streak: u64,
    unlogged: u64,
    last_warn: Option<Instant>,
}

impl FailureLog {
    /// A connect failed at `now`: `Some(n)` when it is to be logged at WARN, `n` being the
    /// failures since the previous WARN line (this one included).
    pub fn failed(&mut self, now: Instant) -> Option<u64> {
        self.streak += 1;
        self.unlogged += 1;
        let due = self
            .last_warn
            .is_none_or(|at| now.saturating_duration_since(at) >= WARN_EVERY);
        if !due {
            return None;
        }
        self.last_warn = Some(now);
        Some(std::mem::take(&mut self.unlogged))
    }

    /// The connection succeeded: returns how many attempts had failed before it, and the
    /// next failure is logged at once again.
    pub fn connected(&mut self) -> u64 {
        let streak = self.streak;
        *self = FailureLog::default();
        streak
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_failure_is_logged_then_one_a_minute_with_the_count() {
        let t0 = Instant::now();
        let mut log = FailureLog::default();
        assert_eq!(log.failed(t0), Some(1));
        for s in 1..60 {
            assert_eq!(log.failed(t0 + Duration::from_secs(s)), None, "{s}");
        }
        assert_eq!(log.failed(t0 + WARN_EVERY), Some(60));
        assert_eq!(log.failed(t0 + WARN_EVERY + Duration::from_secs(1)), None);
    }

    #[test]
    fn a_success_ends_the_streak() {
        let t0 = Instant::now();
        let mut log = FailureLog::default();
        log.failed(t0);
        log.failed(t0);
        assert_eq!(log.connected(), 2);
        assert_eq!(log.failed(t0 + Duration::from_secs(1)), Some(1));
    }
}

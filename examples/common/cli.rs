//! Command-line values the examples share.

use std::time::Duration;

/// A whole number of seconds (`--duration 600`).
pub fn secs(text: &str) -> Result<Duration, std::num::ParseIntError> {
    text.parse().map(Duration::from_secs)
}

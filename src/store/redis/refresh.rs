//! [`Refresh`]: rewriting resident fields with the current time before kthena's GC would drop
//! them, and renewing their mapping keys' TTL. The refresh rides on the index walk of every
//! pass (see [`super::anti_entropy`]): a field is due when it would pass `refresh_after`
//! before the next pass reaches it, so no resident field gets older than `refresh_after`
//! plus one pass.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::link::Link;
use crate::index::{FieldValue, Index, WalkEntry};

/// The refresh's settings and the pace of the passes it rides on.
pub(super) struct Refresh {
    /// A field is rewritten before it is this old, seconds.
    after_s: u32,
    /// A periodic pass starts at most this often.
    interval: Duration,
    /// How long the last verify pass took.
    last_pass: Duration,
}

/// What the refresh made of one resident of the walk.
pub(super) struct Refreshed {
    /// The field's value now (`None`: no longer resident).
    pub(super) value: Option<FieldValue>,
    /// When the resident was stored or last refreshed, unix seconds.
    pub(super) resident_at: Option<u32>,
    /// Whether this call moved its time.
    pub(super) moved: bool,
}

impl Refresh {
    /// A refresh of fields older than `after_s`, riding on passes every `interval`.
    pub(super) fn new(after_s: u32, interval: Duration) -> Refresh {
        Refresh {
            after_s,
            interval,
            last_pass: Duration::ZERO,
        }
    }

    /// A verify pass ended after `took`: the look-ahead covers at least that long.
    pub(super) fn pass_took(&mut self, took: Duration) {
        self.last_pass = took;
    }

    /// The look-ahead of the refresh: a field is rewritten once it would pass
    /// `refresh_after` before the next pass reaches it. Residents stored before the returned
    /// unix second are due.
    pub(super) fn due(&self, now_unix: u32) -> u32 {
        let after = self.after_s;
        let period = self.interval.max(self.last_pass).as_secs();
        let ahead = u32::try_from(period).unwrap_or(u32::MAX).min(after / 2);
        now_unix.saturating_sub(after - ahead)
    }

    /// Gives resident `e` the time `now` in the index when it was stored before `due`.
    pub(super) fn resident(index: &Index, e: &WalkEntry, due: u32, now: u32) -> Refreshed {
        let (value, resident_at, moved) =
            index.refresh_resident(e.model, e.std_hash, e.pod, e.rank, due, now);
        Refreshed {
            value,
            resident_at,
            moved,
        }
    }

    /// Counts `n` fields refreshed.
    pub(super) fn count(link: &Link, n: u64) {
        if n == 0 {
            return;
        }
        (link.shared.upkeep.refreshed).fetch_add(n, Ordering::Relaxed);
        crate::metrics::mirror_refreshes(n);
    }
}

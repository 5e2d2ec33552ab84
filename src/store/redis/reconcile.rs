//! [`Reconcile`]: bringing Redis back in line with the index after an outage, a takeover or
//! at start-up. It owns the outage record: the keys whose last write may not have landed.
//! Once Redis answers a PING, writes resume at once and the reconcile runs as a rewrite pass
//! of [`super::anti_entropy`]: recorded keys that the index no longer holds are deleted, then
//! every field and mapping key the index holds is written, in chunks between flushes, so
//! ingest never waits for it and no copy of the index is made. Only kvindex's own keys are
//! touched.

use std::collections::HashSet;
use std::time::Duration;

use tokio::time::Instant;

use super::connect::connect_lanes;
use super::key::Key;
use super::link::Link;

/// Keys recorded during an outage at most; past it the record is dropped and the reconcile
/// is followed by a full, unthrottled anti-entropy pass instead.
const TOUCHED_CAP: usize = 100_000;

/// How far back a standby remembers the keys its deltas touched, at least: what a leader
/// that just died may not have written yet (its last ttl, and whatever its queue held).
const STANDBY_WINDOW: Duration = Duration::from_secs(10);

/// The outage record.
pub(super) struct Reconcile {
    /// Keys whose last write may not have reached Redis (failed pipeline or dropped while
    /// dirty): the record the reconcile checks for fields that must be deleted.
    touched: HashSet<Key>,
    /// The record passed [`TOUCHED_CAP`] and was dropped.
    overflowed: bool,
    /// A standby's keys touched in the window before the current one (see
    /// [`Reconcile::standby_touch`]); `touched` holds the current window's.
    touched_before: HashSet<Key>,
    /// When the standby's current window of touched keys ends.
    window_ends: Instant,
}

impl Reconcile {
    /// An empty record.
    pub(super) fn new() -> Reconcile {
        Reconcile {
            touched: HashSet::new(),
            overflowed: false,
            touched_before: HashSet::new(),
            window_ends: Instant::now(),
        }
    }

    /// Records a key whose write may not land.
    pub(super) fn record(&mut self, key: Key) {
        self.touched.insert(key);
    }

    /// Records keys whose writes may not have landed.
    pub(super) fn record_all(&mut self, keys: impl IntoIterator<Item = Key>) {
        self.touched.extend(keys);
    }

    /// Bounds the record: past [`TOUCHED_CAP`] it is dropped for a full pass.
    pub(super) fn cap(&mut self) {
        if self.touched.len() > TOUCHED_CAP {
            tracing::warn!(
                keys = self.touched.len(),
                cap = TOUCHED_CAP,
                "The outage key record is full; after the reconcile a full anti-entropy pass deletes what the index no longer holds."
            );
            self.touched = HashSet::new();
            self.overflowed = true;
        }
    }

    /// Takes the record for a rewrite pass to check.
    pub(super) fn take(&mut self) -> HashSet<Key> {
        std::mem::take(&mut self.touched)
    }

    /// Whether the record overflowed (it no longer names every key that may be wrong).
    pub(super) fn overflowed(&self) -> bool {
        self.overflowed
    }

    /// Whether the record overflowed since the last call (the verify after the rewrite
    /// then runs unthrottled).
    pub(super) fn take_overflowed(&mut self) -> bool {
        std::mem::take(&mut self.overflowed)
    }

    /// A standby writes nothing but remembers which keys its recent deltas touched: on a
    /// takeover those the index no longer holds are deleted, as after an outage, since the
    /// previous leader may have died before writing their deletion (checkpoint entries
    /// included, which the verify pass does not scan). Two windows of [`STANDBY_WINDOW`]
    /// (or the lease's `ttl`) are kept, each capped: keys past the cap are left to the
    /// takeover's verify pass (fields and mapping keys).
    pub(super) fn standby_touch(&mut self, key: Key, ttl: Duration) {
        let now = Instant::now();
        if now >= self.window_ends {
            self.window_ends = now + STANDBY_WINDOW.max(ttl);
            self.touched_before = std::mem::take(&mut self.touched);
        }
        if self.touched.len() < TOUCHED_CAP {
            self.touched.insert(key);
        }
    }

    /// A takeover: the reconcile's stale phase checks what the standby's recent deltas
    /// touched, and Redis is taken as the previous leader left it.
    pub(super) fn take_over(&mut self) {
        let before = std::mem::take(&mut self.touched_before);
        self.touched.extend(before);
        self.overflowed = false;
    }

    /// Standing by: nothing is owed to Redis any more.
    pub(super) fn step_down(&mut self) {
        self.touched.clear();
        self.touched_before.clear();
        self.window_ends = Instant::now();
        self.overflowed = false;
    }

    /// Asks Redis on every lane whether it answers, before the rewrite starts.
    pub(super) async fn probe(link: &mut Link) -> Result<(), redis::RedisError> {
        link.ping_lanes().await
    }

    /// Fresh connections after an authentication failure: the connection manager reconnects
    /// by itself only after I/O errors, so once its credentials were refused (a password
    /// rotated and back) it would keep answering with that refusal forever.
    pub(super) async fn renew_connection(link: &mut Link) {
        match connect_lanes(&link.config.target, link.lanes()).await {
            Ok((conn, more)) => link.renew_lanes(conn, more),
            Err(err) => {
                tracing::debug!(error = %err, "Could not open a fresh Redis connection; retrying after the backoff.")
            }
        }
    }
}

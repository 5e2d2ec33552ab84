//! Resident (block, pod) entry counters, kept as fields change so that metrics and
//! `GET /v1/pods` read them without walking the index.
//!
//! Every pod-level field change is counted in the apply call's [`CountDelta`], which is added
//! at the call's end to its source's running counts (plain integers under the source's lock:
//! no shared atomic is written per call). A reader sums the sources' counts (a walk of the
//! sources, not the blocks) and what departed sources left ([`EntryCounter`], the index's
//! and each pod's: a change a source counted may be undone by another of the pod's DP ranks,
//! so a source's counts are folded in when it is unregistered, never dropped). So the counts
//! are exact whenever no apply or source removal is in flight. The readers are methods of
//! [`Index`](super::Index), in `query.rs` (this file sits below `mod.rs` and names no `Index`).

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;

use super::vocab::FieldValue;
use crate::medium::{MediaSet, Medium, MEDIA_SLOTS};

/// Entries in total and per medium slot left by unregistered sources.
#[derive(Default)]
pub(crate) struct EntryCounter {
    total: AtomicI64,
    by_slot: [AtomicI64; MEDIA_SLOTS],
}

/// Field changes counted by one apply call, or the running sum of a source's calls.
#[derive(Debug, Default)]
pub(crate) struct CountDelta {
    total: i64,
    by_slot: [i64; MEDIA_SLOTS],
    /// The slots `by_slot` changed in (a call mostly touches one or two), so adding the
    /// delta visits only those.
    touched: u32,
}

impl CountDelta {
    /// Counts one pod-level field going from `before` to `after`.
    pub(crate) fn record(&mut self, before: Option<FieldValue>, after: Option<FieldValue>) {
        self.record_times(before, after, 1);
    }

    /// Counts `times` pod-level fields each going from `before` to `after` (a source clear
    /// drops a span of blocks with one value at once).
    pub(crate) fn record_times(
        &mut self,
        before: Option<FieldValue>,
        after: Option<FieldValue>,
        times: i64,
    ) {
        let media = |v: Option<FieldValue>| v.map_or(MediaSet::EMPTY, |v| v.media);
        let (old, new) = (media(before), media(after));
        for m in old.difference(new).iter() {
            self.by_slot[m.slot() as usize] -= times;
        }
        for m in new.difference(old).iter() {
            self.by_slot[m.slot() as usize] += times;
        }
        self.touched |= old.bits() ^ new.bits();
        self.total += times * (i64::from(after.is_some()) - i64::from(before.is_some()));
    }

    /// Adds `other`'s counts.
    pub(crate) fn merge(&mut self, other: &CountDelta) {
        self.total += other.total;
        for (slot, n) in other.touched_slots() {
            self.by_slot[slot] += n;
        }
        self.touched |= other.touched;
    }

    /// The (slot, count) of every slot the counts touched.
    fn touched_slots(&self) -> impl Iterator<Item = (usize, i64)> + '_ {
        let mut touched = self.touched;
        std::iter::from_fn(move || {
            let slot = (touched != 0).then(|| touched.trailing_zeros() as usize)?;
            touched &= touched - 1;
            Some((slot, self.by_slot[slot]))
        })
    }
}

impl EntryCounter {
    /// Adds a departed source's counts.
    pub(crate) fn add(&self, delta: &CountDelta) {
        if delta.total != 0 {
            self.total.fetch_add(delta.total, Ordering::Relaxed);
        }
        for (slot, n) in delta.touched_slots().filter(|(_, n)| *n != 0) {
            self.by_slot[slot].fetch_add(n, Ordering::Relaxed);
        }
    }

    /// The total and the non-zero counts per medium spelling (`""` = no medium reported),
    /// with the live sources' counts `live`.
    pub(crate) fn snapshot_with(&self, live: &CountDelta) -> (u64, Vec<(&'static str, u64)>) {
        let total = (self.total.load(Ordering::Relaxed) + live.total).max(0) as u64;
        let per_medium = (self.by_slot.iter().zip(&live.by_slot))
            .enumerate()
            .map(|(slot, (n, live))| {
                let n = n.load(Ordering::Relaxed) + live;
                (slot_medium(slot).spelling(), n.max(0) as u64)
            })
            .filter(|(_, n)| *n > 0)
            .collect();
        (total, per_medium)
    }
}

/// One [`EntryCounter`] of departed sources per pod id (ids are dense: the pod interner
/// hands them out in order).
#[derive(Default)]
pub(crate) struct PodCounters {
    by_pod: RwLock<Vec<Arc<EntryCounter>>>,
}

impl PodCounters {
    /// The counter of `pod`, created on first use.
    pub(crate) fn of(&self, pod: u32) -> Arc<EntryCounter> {
        if let Some(counter) = self.get(pod) {
            return counter;
        }
        let mut by_pod = self.by_pod.write();
        while by_pod.len() <= pod as usize {
            by_pod.push(Arc::default());
        }
        by_pod[pod as usize].clone()
    }

    /// The counter of `pod`, if it was ever created.
    pub(crate) fn get(&self, pod: u32) -> Option<Arc<EntryCounter>> {
        self.by_pod.read().get(pod as usize).cloned()
    }
}

/// The medium of a slot number.
pub(crate) fn slot_medium(slot: usize) -> Medium {
    MediaSet::from_bits(1 << slot)
        .iter()
        .next()
        .unwrap_or(Medium::NONE)
}

//! One residency layer's edits: a block map keyed by a 64-bit block identity, whose
//! residents gain and lose media as engine blocks are stored and removed.
//!
//! The index keeps two layers with the same rules: kthena's std blocks (per model, keyed by
//! the content-only std hash, mirrored to Redis field by field) and the chain blocks of
//! `prefix` matching (one map for every model, keyed by the chain hash, in memory only).
//! Several engine blocks of one source can map to one layer block (the same tokens after
//! different prefixes for std hashes; physical copies of one prefix for chain hashes), so a
//! resident counts its engine copies and, past one, per-medium counts sit in the source's
//! `dups` map under `dup_key`.

use std::hash::Hash;

use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use hashbrown::HashMap;

use super::counters::slot_medium;
use super::residents::{merge, own_value, Resident, ResidentSet, Residents};
use super::vocab::FieldValue;
use crate::medium::{MediaSet, MEDIA_SLOTS};

/// Per-medium engine-copy counts of blocks a source holds more than once.
pub(crate) type DupCounts = HashMap<(u32, u64), [u16; MEDIA_SLOTS]>;

/// A block map of one layer: a base model's (keyed by std hash), the LoRA adapters' (by
/// model and std hash) or the chain blocks' (by chain hash).
pub(crate) type LayerMap<K> = DashMap<K, Residents, hashbrown::DefaultHashBuilder>;

/// The dup-count model id of chain blocks (never a model id: ids stop below `u32::MAX`).
pub(crate) const CHAIN_DUPS: u32 = u32::MAX;

/// Who edits: one source, at one store time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Editor {
    pub(crate) pod: u32,
    pub(crate) rank: u8,
    pub(crate) now: u32,
    /// Whether the caller reads the pod's value before and after each edit: the std layer
    /// does (fields are counted and mirrored); the chain layer does not, and skips the scans
    /// of a block's residents that computing them takes.
    pub(crate) pod_values: bool,
    /// Whether the pod has no other DP rank registered, so no other rank holds anything:
    /// what the pod's other ranks hold is then known to be nothing, without a look. Set
    /// only while the editing call holds the chain runs locked (see `Mutation::editor`).
    pub(crate) sole: bool,
}

impl Editor {
    /// The same editor, for a layer whose pod values nobody reads.
    pub(crate) fn without_values(self) -> Editor {
        Editor {
            pod_values: false,
            ..self
        }
    }

    /// Whether an edit must look up what the pod's other DP ranks hold: its value is read
    /// and it may have other ranks.
    pub(crate) fn others_matter(&self) -> bool {
        self.pod_values && !self.sole
    }

    /// The pod's value before and after an edit of its resident from `old` to `new`, given
    /// what its other DP ranks hold (`others`); nothing for a layer whose values nobody reads.
    /// Inlined: every span and block edit asks, from other modules (codegen units).
    #[inline]
    pub(crate) fn values(
        &self,
        others: Option<FieldValue>,
        old: Option<FieldValue>,
        new: Option<FieldValue>,
    ) -> Change {
        if self.pod_values {
            (merge(others, old), merge(others, new))
        } else {
            (None, None)
        }
    }
}

/// The pod's value of a block before and after an edit.
pub(crate) type Change = (Option<FieldValue>, Option<FieldValue>);

/// Adds `added` media (and one engine copy when `new_copy`) to the editor's resident of
/// block `key`. Returns the pod's value before and after, and whether the source now holds
/// the block through more than one engine block.
pub(crate) fn add_media<K: Eq + Hash>(
    blocks: &LayerMap<K>,
    dups: &mut DupCounts,
    dup_key: (u32, u64),
    key: K,
    who: Editor,
    added: MediaSet,
    new_copy: bool,
) -> (Change, bool) {
    match blocks.entry(key) {
        Entry::Vacant(vacant) => {
            vacant.insert(Residents::One(Resident::new(
                who.pod, who.rank, who.now, added,
            )));
            first_resident(who, added)
        }
        Entry::Occupied(mut occupied) => {
            add_to(occupied.get_mut(), dups, dup_key, who, added, new_copy)
        }
    }
}

/// What [`add_media`] returns for a block that had no residents: the editor's resident is
/// its first.
pub(crate) fn first_resident(who: Editor, added: MediaSet) -> (Change, bool) {
    let value = FieldValue {
        stored_at: who.now,
        media: added,
    };
    ((None, Some(value)), false)
}

/// [`add_media`] on a block that has residents.
pub(crate) fn add_to(
    residents: &mut impl ResidentSet,
    dups: &mut DupCounts,
    dup_key: (u32, u64),
    who: Editor,
    added: MediaSet,
    new_copy: bool,
) -> (Change, bool) {
    let mut duplicate = false;
    let (edited, others) =
        residents.edit_with_others(who.pod, who.rank, who.others_matter(), |resident| {
            let copies = resident.copies();
            if new_copy {
                duplicate = true;
                if copies == 1 {
                    let mut counts = [0u16; MEDIA_SLOTS];
                    for m in resident.media().iter() {
                        counts[m.slot() as usize] = 1;
                    }
                    dups.insert(dup_key, counts);
                }
                resident.set_copies(copies.saturating_add(1));
            }
            if resident.copies() > 1 {
                if let Some(counts) = dups.get_mut(&dup_key) {
                    for m in added.iter() {
                        let c = &mut counts[m.slot() as usize];
                        *c = c.saturating_add(1);
                    }
                }
            }
            resident.set_media(resident.media().union(added));
            resident.stored_at = who.now;
        });
    let (old, new) = match edited {
        Some(((), old, new)) => (own_value(&old), own_value(&new)),
        None => {
            let resident = Resident::new(who.pod, who.rank, who.now, added);
            residents.push(resident);
            (None, own_value(&resident))
        }
    };
    let (before, after) = who.values(others, old, new);
    ((before, after), duplicate)
}

/// Takes `removed` media off the editor's resident of block `key`; `slot_gone` when the
/// engine block itself is no longer held. Returns the pod's value before and after and the
/// resident's last store time, or `None` when the source holds no such block.
pub(crate) fn drop_media<K: Eq + Hash>(
    blocks: &LayerMap<K>,
    dups: &mut DupCounts,
    dup_key: (u32, u64),
    key: K,
    who: Editor,
    removed: MediaSet,
    slot_gone: bool,
) -> Option<(Change, u32)> {
    let Entry::Occupied(mut entry) = blocks.entry(key) else {
        return None;
    };
    let (dropped, empty) = drop_from(entry.get_mut(), dups, dup_key, who, removed, slot_gone)?;
    if empty {
        entry.remove();
    }
    Some(dropped)
}

/// [`drop_media`] on a block's residents; also says whether the block has none left.
pub(crate) fn drop_from(
    residents: &mut impl ResidentSet,
    dups: &mut DupCounts,
    dup_key: (u32, u64),
    who: Editor,
    removed: MediaSet,
    slot_gone: bool,
) -> Option<((Change, u32), bool)> {
    // The edit is made on a copy and kept only if the resident stays: one that goes is
    // removed as it was (a run would split its span for the edit, then join it back).
    let edit = |kept: &mut Resident| {
        let mut resident = *kept;
        let stored_at = resident.stored_at;
        let copies = resident.copies();
        if copies > 1 {
            let counts = dups.entry(dup_key).or_insert([0; MEDIA_SLOTS]);
            for m in removed.iter() {
                let c = &mut counts[m.slot() as usize];
                *c = c.saturating_sub(1);
            }
            let mut media = MediaSet::EMPTY;
            for (slot, c) in counts.iter().enumerate() {
                if *c > 0 {
                    media.insert(slot_medium(slot));
                }
            }
            resident.set_media(media);
        } else {
            resident.set_media(resident.media().difference(removed));
        }
        let mut drop_resident = resident.media().is_empty();
        if slot_gone {
            let left = copies.saturating_sub(1);
            resident.set_copies(left);
            if left <= 1 {
                dups.remove(&dup_key);
            }
            drop_resident |= left == 0;
        }
        if !drop_resident {
            *kept = resident;
        }
        (stored_at, drop_resident)
    };
    let (edited, others) = residents.edit_with_others(who.pod, who.rank, who.others_matter(), edit);
    let ((stored_at, drop_resident), old, new) = edited?;
    let mut empty = false;
    let new = if drop_resident {
        empty = residents.remove(who.pod, who.rank);
        None
    } else {
        own_value(&new)
    };
    let (before, after) = who.values(others, own_value(&old), new);
    Some((((before, after), stored_at), empty))
}

/// Removes the editor's resident of block `key` whatever its media (a source clear).
/// Returns the pod's value before and after, or `None` when the source holds no such block.
pub(crate) fn drop_resident<K: Eq + Hash>(
    blocks: &LayerMap<K>,
    key: K,
    who: Editor,
) -> Option<Change> {
    let Entry::Occupied(mut entry) = blocks.entry(key) else {
        return None;
    };
    let (change, empty) = resident_out(entry.get_mut(), who)?;
    if empty {
        entry.remove();
    }
    Some(change)
}

/// [`drop_resident`] on a block's residents; also says whether the block has none left.
fn resident_out(residents: &mut impl ResidentSet, who: Editor) -> Option<(Change, bool)> {
    let (taken, others) = residents.take_with_others(who.pod, who.rank, who.others_matter());
    let (old, empty) = taken?;
    Some((who.values(others, own_value(&old), None), empty))
}

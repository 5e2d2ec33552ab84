//! Who holds one block: a compact list of (pod, DP rank) residents.
//!
//! Most blocks are held by one source, so the list is inline for one entry and boxed for
//! more; a resident is 12 bytes.

use super::vocab::FieldValue;
use crate::medium::MediaSet;

const POD_BITS: u32 = 24;
/// Largest pod id a resident can hold.
pub(crate) const MAX_POD_ID: u32 = (1 << POD_BITS) - 1;
const MEDIA_MASK: u32 = (1 << crate::medium::MEDIA_SLOTS) - 1;

/// One source's residency of a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Resident {
    /// pod id (low 24 bits) and DP rank (high 8 bits).
    pod_rank: u32,
    /// Unix second of the last store by this source.
    pub(crate) stored_at: u32,
    /// media bits (low 24) and the number of this source's engine blocks mapped here (high 8).
    media_copies: u32,
}

impl Resident {
    pub(crate) fn new(pod: u32, rank: u8, stored_at: u32, media: MediaSet) -> Resident {
        Resident {
            pod_rank: (pod & MAX_POD_ID) | (u32::from(rank) << POD_BITS),
            stored_at,
            media_copies: media.bits() | (1 << 24),
        }
    }

    pub(crate) fn pod(&self) -> u32 {
        self.pod_rank & MAX_POD_ID
    }

    pub(crate) fn rank(&self) -> u8 {
        (self.pod_rank >> POD_BITS) as u8
    }

    pub(crate) fn media(&self) -> MediaSet {
        MediaSet::from_bits(self.media_copies & MEDIA_MASK)
    }

    pub(crate) fn set_media(&mut self, media: MediaSet) {
        self.media_copies = (self.media_copies & !MEDIA_MASK) | media.bits();
    }

    /// Engine blocks of this source that map to the block (saturates at 255).
    pub(crate) fn copies(&self) -> u8 {
        (self.media_copies >> 24) as u8
    }

    pub(crate) fn set_copies(&mut self, copies: u8) {
        self.media_copies = (self.media_copies & MEDIA_MASK) | (u32::from(copies) << 24);
    }
}

/// What an edit of one resident returns: its result with the resident before and after
/// (`None` when there was no such resident), and the value of the pod's other DP ranks.
pub(crate) type Edited<R> = (Option<(R, Resident, Resident)>, Option<FieldValue>);

/// The residents of one block.
#[derive(Debug, Clone)]
pub(crate) enum Residents {
    One(Resident),
    // Boxed on purpose: a thin pointer keeps `Residents` (and every map bucket) at 16 bytes.
    Many(Box<Many>),
}

/// Two or more residents, with the fingerprint of who they are.
#[derive(Debug, Clone)]
pub(crate) struct Many {
    /// XOR of [`owner_key`] over `list`, kept as residents come, go and change media.
    fingerprint: u64,
    list: Vec<Resident>,
}

/// What a resident contributes to its block's fingerprint: who (pod, DP rank) and on which
/// media, not when (a store time changes no score outside the freshness rule).
pub(crate) fn owner_key(r: &Resident) -> u64 {
    crate::hash::mix64(u64::from(r.pod_rank) << 32 | u64::from(r.media_copies & MEDIA_MASK))
}

impl Residents {
    pub(crate) fn as_slice(&self) -> &[Resident] {
        match self {
            Residents::One(r) => std::slice::from_ref(r),
            Residents::Many(m) => m.list.as_slice(),
        }
    }

    /// A 64-bit fingerprint of the set of (pod, DP rank, media) residents, whatever their
    /// order or store times: two blocks with the same fingerprint have the same owners on
    /// the same media (up to a 2^-64 collision, the same odds as the 64-bit block hashes
    /// themselves), so a scorer may count the second exactly as the first.
    pub(crate) fn fingerprint(&self) -> u64 {
        match self {
            Residents::One(r) => owner_key(r),
            Residents::Many(m) => m.fingerprint,
        }
    }

    /// Runs `edit` on the resident of `(pod, rank)`, if any, keeping the fingerprint true.
    pub(crate) fn edit<R>(
        &mut self,
        pod: u32,
        rank: u8,
        edit: impl FnOnce(&mut Resident) -> R,
    ) -> Option<R> {
        let (edited, _) = self.edit_with_others(pod, rank, false, edit);
        edited.map(|(out, _, _)| out)
    }

    /// Heap bytes behind the list (0 for one resident).
    pub(crate) fn heap_bytes(&self) -> usize {
        match self {
            Residents::One(_) => 0,
            Residents::Many(m) => {
                std::mem::size_of::<Many>() + m.list.capacity() * std::mem::size_of::<Resident>()
            }
        }
    }

    /// The pod-level value of `pod`: union of its ranks' media, latest store time.
    pub(crate) fn pod_value(&self, pod: u32) -> Option<FieldValue> {
        pod_value(self.as_slice(), pod)
    }
}

/// What one resident contributes to its pod's value: nothing once it is on no medium.
pub(crate) fn own_value(r: &Resident) -> Option<FieldValue> {
    (!r.media().is_empty()).then(|| FieldValue {
        stored_at: r.stored_at,
        media: r.media(),
    })
}

/// Two contributions to one pod's value combined: media united, the latest store time.
#[inline]
pub(crate) fn merge(a: Option<FieldValue>, b: Option<FieldValue>) -> Option<FieldValue> {
    match (a, b) {
        (Some(a), Some(b)) => Some(FieldValue {
            stored_at: a.stored_at.max(b.stored_at),
            media: a.media.union(b.media),
        }),
        (a, None) => a,
        (None, b) => b,
    }
}

/// Pod-level value of `pod` among `residents`.
pub(crate) fn pod_value(residents: &[Resident], pod: u32) -> Option<FieldValue> {
    (residents.iter())
        .filter(|r| r.pod() == pod)
        .fold(None, |value, r| merge(value, own_value(r)))
}

/// A block's residents as an edit sees them: a block map's [`Residents`] or one position of
/// a chain run ([`super::runs`]); the layer rules ([`super::layer`]) are written once for
/// both.
pub(crate) trait ResidentSet {
    /// One pass over the residents for an edit of `(pod, rank)`: runs `edit` on its resident,
    /// if any, keeping the fingerprint true, and returns the resident as it was and as it is
    /// with `edit`'s result; plus, when `others` is asked, the value the pod has through its
    /// other DP ranks (gathered in the same pass, so an edit that reports the pod's value
    /// before and after scans a block's residents once, not three times).
    fn edit_with_others<R>(
        &mut self,
        pod: u32,
        rank: u8,
        others: bool,
        edit: impl FnOnce(&mut Resident) -> R,
    ) -> Edited<R>;

    /// Adds a resident the set does not hold.
    fn push(&mut self, resident: Resident);

    /// Removes the resident of `(pod, rank)`; returns whether none is left.
    fn remove(&mut self, pod: u32, rank: u8) -> bool;

    /// Takes the resident of `(pod, rank)` out, whatever its media: the resident as it was
    /// and whether none is left, plus (when `others` is asked) the value the pod has through
    /// its other DP ranks. A set that can do it in one pass over its residents overrides this.
    fn take_with_others(&mut self, pod: u32, rank: u8, others: bool) -> Taken {
        let (edited, others) = self.edit_with_others(pod, rank, others, |_| ());
        let taken = edited.map(|((), old, _)| (old, self.remove(pod, rank)));
        (taken, others)
    }
}

/// What taking one resident out returns: the resident and whether the set is empty after
/// (`None` when there was no such resident), and the value of the pod's other DP ranks.
pub(crate) type Taken = (Option<(Resident, bool)>, Option<FieldValue>);

impl ResidentSet for Residents {
    fn edit_with_others<R>(
        &mut self,
        pod: u32,
        rank: u8,
        others: bool,
        edit: impl FnOnce(&mut Resident) -> R,
    ) -> Edited<R> {
        let (at, other) = find(self.as_slice(), pod, rank, others);
        let edited = at.map(|i| {
            let (r, fingerprint) = match self {
                Residents::One(r) => (r, None),
                Residents::Many(m) => (&mut m.list[i], Some(&mut m.fingerprint)),
            };
            let (old, out) = (*r, edit(r));
            if let Some(fingerprint) = fingerprint {
                *fingerprint ^= owner_key(&old) ^ owner_key(r);
            }
            (out, old, *r)
        });
        (edited, other)
    }

    fn push(&mut self, resident: Resident) {
        match self {
            Residents::One(first) => {
                *self = Residents::Many(Box::new(Many {
                    fingerprint: owner_key(first) ^ owner_key(&resident),
                    list: vec![*first, resident],
                }));
            }
            Residents::Many(m) => {
                m.fingerprint ^= owner_key(&resident);
                m.list.push(resident);
            }
        }
    }

    fn remove(&mut self, pod: u32, rank: u8) -> bool {
        let (taken, _) = self.take_with_others(pod, rank, false);
        taken.is_some_and(|(_, empty)| empty)
    }

    /// One pass: the resident's place and the pod's other ranks are found together (a
    /// source clear of a std-layer index takes every block's resident this way).
    fn take_with_others(&mut self, pod: u32, rank: u8, others: bool) -> Taken {
        let (at, other) = find(self.as_slice(), pod, rank, others);
        let Some(at) = at else {
            return (None, other);
        };
        let taken = match self {
            Residents::One(r) => (*r, true),
            Residents::Many(m) => {
                let gone = m.remove_at(at);
                (gone, self.collapse())
            }
        };
        (Some(taken), other)
    }
}

/// One pass over a block's residents: the place of `(pod, rank)`'s, and (when `others` is
/// asked) the value the pod has through its other DP ranks.
fn find(
    residents: &[Resident],
    pod: u32,
    rank: u8,
    others: bool,
) -> (Option<usize>, Option<FieldValue>) {
    let mut at = None;
    let mut other = None;
    for (i, r) in residents.iter().enumerate() {
        if r.pod() != pod {
            continue;
        }
        if r.rank() == rank {
            at = Some(i);
            if !others {
                break;
            }
        } else if others {
            other = merge(other, own_value(r));
        }
    }
    (at, other)
}

impl Many {
    /// Removes the resident at `at`, keeping the fingerprint true.
    fn remove_at(&mut self, at: usize) -> Resident {
        let gone = self.list.swap_remove(at);
        self.fingerprint ^= owner_key(&gone);
        gone
    }
}

impl Residents {
    /// After a resident left: a list of one becomes [`Residents::One`]; returns whether
    /// none is left.
    fn collapse(&mut self) -> bool {
        let Residents::Many(m) = self else {
            return false;
        };
        match m.list.as_slice() {
            [] => true,
            [last] => {
                *self = Residents::One(*last);
                false
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::medium::Medium;

    #[test]
    fn resident_packs_pod_rank_media_and_copies() {
        let mut r = Resident::new(77, 3, 1000, MediaSet::single(Medium::GPU));
        assert_eq!((r.pod(), r.rank(), r.copies()), (77, 3, 1));
        r.set_copies(5);
        r.set_media(MediaSet::EMPTY);
        assert_eq!((r.copies(), r.media()), (5, MediaSet::EMPTY));
        assert_eq!(std::mem::size_of::<Resident>(), 12);
        assert_eq!(std::mem::size_of::<Residents>(), 16);
    }

    #[test]
    fn pod_value_unions_ranks() {
        let gpu = MediaSet::single(Medium::GPU);
        let cpu = MediaSet::single(Medium::intern("CPU"));
        let mut rs = Residents::One(Resident::new(1, 0, 10, gpu));
        rs.push(Resident::new(1, 1, 20, cpu));
        rs.push(Resident::new(2, 0, 30, gpu));
        let v = rs.pod_value(1).unwrap();
        assert_eq!(v.stored_at, 20);
        assert_eq!(v.media, gpu.union(cpu));
        assert!(!rs.remove(1, 0));
        assert!(!rs.remove(1, 1));
        assert!(matches!(rs, Residents::One(_)));
        assert!(rs.remove(2, 0));
    }
}

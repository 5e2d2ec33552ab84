//! Who holds one block: a compact list of (pod, DP rank) residents.
//!
//! Most blocks are held by one source, so the list is inline for one entry and boxed for
//! more; a resident is 12 bytes.

use super::delta::FieldValue;
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

/// The residents of one block.
#[derive(Debug, Clone)]
pub(crate) enum Residents {
    One(Resident),
    // Boxed on purpose: a thin pointer keeps `Residents` (and every map bucket) at 16 bytes.
    #[allow(clippy::box_collection)]
    Many(Box<Vec<Resident>>),
}

impl Residents {
    pub(crate) fn as_slice(&self) -> &[Resident] {
        match self {
            Residents::One(r) => std::slice::from_ref(r),
            Residents::Many(v) => v.as_slice(),
        }
    }

    pub(crate) fn find_mut(&mut self, pod: u32, rank: u8) -> Option<&mut Resident> {
        let slice: &mut [Resident] = match self {
            Residents::One(r) => std::slice::from_mut(r),
            Residents::Many(v) => v.as_mut_slice(),
        };
        slice
            .iter_mut()
            .find(|r| r.pod() == pod && r.rank() == rank)
    }

    pub(crate) fn push(&mut self, resident: Resident) {
        match self {
            Residents::One(first) => *self = Residents::Many(Box::new(vec![*first, resident])),
            Residents::Many(v) => v.push(resident),
        }
    }

    /// Removes the resident of `(pod, rank)`; returns whether none is left.
    pub(crate) fn remove(&mut self, pod: u32, rank: u8) -> bool {
        match self {
            Residents::One(r) => r.pod() == pod && r.rank() == rank,
            Residents::Many(v) => {
                v.retain(|r| !(r.pod() == pod && r.rank() == rank));
                if v.len() == 1 {
                    *self = Residents::One(v[0]);
                }
                v_is_empty(self)
            }
        }
    }

    /// The pod-level value of `pod`: union of its ranks' media, latest store time.
    pub(crate) fn pod_value(&self, pod: u32) -> Option<FieldValue> {
        pod_value(self.as_slice(), pod)
    }
}

fn v_is_empty(r: &Residents) -> bool {
    matches!(r, Residents::Many(v) if v.is_empty())
}

/// Pod-level value of `pod` among `residents`.
pub(crate) fn pod_value(residents: &[Resident], pod: u32) -> Option<FieldValue> {
    let mut value: Option<FieldValue> = None;
    for r in residents
        .iter()
        .filter(|r| r.pod() == pod && !r.media().is_empty())
    {
        let v = value.get_or_insert(FieldValue {
            stored_at: r.stored_at,
            media: MediaSet::EMPTY,
        });
        v.media = v.media.union(r.media());
        v.stored_at = v.stored_at.max(r.stored_at);
    }
    value
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

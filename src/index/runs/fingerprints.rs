//! A run's fingerprints (the XOR of its residents' owner keys, position by position), kept as
//! stretches of positions with one fingerprint.
//!
//! Why stretches: a run's residents mostly change at a few positions (where a pod's copy of
//! the run ends), so a run of 128 blocks held alike is one stretch, where a word per
//! position was 1 KB for a full-hit query to read and 8 bytes a block to keep. An edit XORs
//! a key into the stretches its positions cover, splitting the stretches at its ends and
//! merging them where the values meet again (an edit inside one stretch, the common one,
//! moves a neighbour's start instead where it can), so neighbouring stretches always differ
//! and one stretch is exactly the positions a query may count without a visit.

/// Each position's fingerprint, as stretches of equal ones.
#[derive(Debug, Default)]
pub(super) struct Fingerprints {
    /// Where each stretch starts, ascending, the first at 0 (none while the run is empty).
    starts: Vec<u16>,
    /// Each stretch's fingerprint; neighbours differ.
    values: Vec<u64>,
    /// Positions.
    len: u16,
}

impl Fingerprints {
    /// Positions.
    pub(super) fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// Adds a position nobody holds at the end.
    pub(super) fn push_unheld(&mut self) {
        if self.values.last() != Some(&0) {
            self.starts.push(self.len);
            self.values.push(0);
        }
        self.len += 1;
    }

    /// Drops the last position.
    pub(super) fn pop(&mut self) {
        let Some(last) = self.len.checked_sub(1) else {
            return;
        };
        self.len = last;
        if self.starts.last() == Some(&last) {
            self.starts.pop();
            self.values.pop();
        }
    }

    /// The stretch holding `pos` (a position of the run): the last one without a search
    /// when it does, as for a block an engine just appended.
    #[inline]
    fn stretch_of(&self, pos: u16) -> usize {
        let last = self.starts.len() - 1;
        if self.starts[last] <= pos {
            return last;
        }
        self.starts[..last].partition_point(|&s| s <= pos) - 1
    }

    /// The first position after stretch `i`.
    fn end_of(&self, i: usize) -> u16 {
        self.starts.get(i + 1).copied().unwrap_or(self.len)
    }

    /// The fingerprint at `pos`; `None` past the run.
    pub(super) fn get(&self, pos: u16) -> Option<u64> {
        (pos < self.len).then(|| self.values[self.stretch_of(pos)])
    }

    /// How many positions from `from` on, up to `max`, have fingerprint `fp`.
    pub(super) fn same_from(&self, from: u16, fp: u64, max: usize) -> usize {
        if from >= self.len {
            return 0;
        }
        let i = self.stretch_of(from);
        if self.values[i] != fp {
            return 0;
        }
        usize::from(self.end_of(i) - from).min(max)
    }

    /// XORs `key` into the fingerprints of positions `from..=to`; `false`, with nothing
    /// changed, when they reach past the run. Inlined into the span edits (each calls it
    /// once), as the per-position XOR it replaced was.
    #[inline]
    pub(super) fn xor(&mut self, from: u16, to: u16, key: u64) -> bool {
        if from > to || to >= self.len {
            return false;
        }
        if key == 0 {
            return true;
        }
        let i = self.stretch_of(from);
        if to < self.end_of(i) {
            self.xor_within(i, from, to, key);
            return true;
        }
        let first = self.split(i, from);
        let end = match to + 1 < self.len {
            true => self.split(self.stretch_of(to + 1), to + 1),
            false => self.starts.len(),
        };
        for value in &mut self.values[first..end] {
            *value ^= key;
        }
        // Inside the edit, neighbours differed and still do (both took the same key): only
        // its two ends may now meet a neighbour with the same value. The later end first,
        // so `first` still names its stretch.
        self.merge_with_previous(end);
        self.merge_with_previous(first);
        true
    }

    /// [`Self::xor`] of positions `from..=to` inside stretch `i`, the common edit (a source
    /// storing or removing a run, or part of one, that others hold alike): the stretch is
    /// split, or its neighbour moved over, without the general path's splits and merges.
    #[inline]
    fn xor_within(&mut self, i: usize, from: u16, to: u16, key: u64) {
        let value = self.values[i] ^ key;
        let (start, end) = (self.starts[i], self.end_of(i));
        match (start == from, end == to + 1) {
            (true, true) => {
                self.values[i] = value;
                self.merge_with_previous(i + 1);
                self.merge_with_previous(i);
            }
            (true, false) if i > 0 && self.values[i - 1] == value => self.starts[i] = to + 1,
            (true, false) => {
                self.starts[i] = to + 1;
                self.starts.insert(i, from);
                self.values.insert(i, value);
            }
            (false, true) if self.values.get(i + 1) == Some(&value) => self.starts[i + 1] = from,
            (false, true) => {
                self.starts.insert(i + 1, from);
                self.values.insert(i + 1, value);
            }
            (false, false) => {
                let old = self.values[i];
                self.starts.splice(i + 1..i + 1, [from, to + 1]);
                self.values.splice(i + 1..i + 1, [value, old]);
            }
        }
    }

    /// Drops stretch `i`, its positions taken by the one before it.
    fn remove(&mut self, i: usize) {
        if i + 1 == self.starts.len() {
            self.starts.pop();
            self.values.pop();
        } else {
            self.starts.remove(i);
            self.values.remove(i);
        }
    }

    /// The index of the stretch starting at `pos`, split off stretch `i` (the one holding
    /// it) if none does.
    fn split(&mut self, i: usize, pos: u16) -> usize {
        if self.starts[i] == pos {
            return i;
        }
        self.starts.insert(i + 1, pos);
        self.values.insert(i + 1, self.values[i]);
        i + 1
    }

    /// Merges stretch `i` into the one before it when they have the same fingerprint.
    fn merge_with_previous(&mut self, i: usize) {
        if i == 0 || i >= self.values.len() || self.values[i] != self.values[i - 1] {
            return;
        }
        self.remove(i);
    }

    /// Every position's fingerprint, one word each.
    pub(super) fn expanded(&self) -> Vec<u64> {
        let mut out = Vec::with_capacity(self.len());
        for (i, &value) in self.values.iter().enumerate() {
            let stretch = usize::from(self.end_of(i) - self.starts[i]);
            out.extend(std::iter::repeat_n(value, stretch));
        }
        out
    }

    /// Whether stretches are as the rules keep them: the first at 0, ascending, within the
    /// run, neighbours different.
    pub(super) fn well_formed(&self) -> bool {
        let starts_ok = match self.starts.first() {
            None => self.len == 0,
            Some(&first) => first == 0 && self.starts.windows(2).all(|w| w[0] < w[1]),
        };
        starts_ok
            && self.starts.last().is_none_or(|&s| s < self.len)
            && self.starts.len() == self.values.len()
            && self.values.windows(2).all(|w| w[0] != w[1])
    }

    /// Heap bytes of the stretches.
    pub(super) fn heap_bytes(&self) -> usize {
        self.starts.capacity() * 2 + self.values.capacity() * 8
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Stretches built by pushes and XORs, against a word per position.
    #[derive(Debug, Clone)]
    enum Op {
        Push,
        Pop,
        Xor(u16, u16, u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => Just(Op::Push),
            1 => Just(Op::Pop),
            // Few keys, so XORs cancel and stretches merge back often.
            6 => (0u16..40, 0u16..8, prop_oneof![Just(0u64), 1u64..4]).prop_map(|(f, n, k)| Op::Xor(f, f + n, k)),
        ]
    }

    proptest! {
        #[test]
        fn stretches_keep_every_position_as_a_word_per_position_would(ops in proptest::collection::vec(op(), 0..200)) {
            let mut fps = Fingerprints::default();
            let mut words: Vec<u64> = Vec::new();
            for op in ops {
                match op {
                    Op::Push => {
                        fps.push_unheld();
                        words.push(0);
                    }
                    Op::Pop => {
                        // A run's tail goes only when nobody holds it.
                        if words.last() == Some(&0) {
                            fps.pop();
                            words.pop();
                        }
                    }
                    Op::Xor(from, to, key) => {
                        let fits = usize::from(to) < words.len();
                        prop_assert_eq!(fps.xor(from, to, key), fits);
                        if fits {
                            for w in &mut words[usize::from(from)..=usize::from(to)] {
                                *w ^= key;
                            }
                        }
                    }
                }
                prop_assert!(fps.well_formed(), "{:?}", fps);
                prop_assert_eq!(fps.expanded(), words.clone());
                for pos in 0..=words.len() as u16 {
                    prop_assert_eq!(fps.get(pos), words.get(usize::from(pos)).copied());
                    let fp = fps.get(pos).unwrap_or(7);
                    let same = words[usize::from(pos).min(words.len())..].iter().take_while(|w| **w == fp).count();
                    prop_assert_eq!(fps.same_from(pos, fp, usize::MAX), same);
                    prop_assert_eq!(fps.same_from(pos, fp, 3), same.min(3));
                }
            }
        }
    }

    #[test]
    fn a_run_held_alike_is_one_stretch() {
        let mut fps = Fingerprints::default();
        for pos in 0..128 {
            fps.push_unheld();
            assert!(fps.xor(pos, pos, 0xA));
        }
        assert_eq!((fps.starts.len(), fps.len()), (1, 128));
        // A second pod's copy of the first half, then of the rest: one stretch again.
        assert!(fps.xor(0, 63, 0xB));
        assert_eq!(fps.starts, [0, 64]);
        assert!(fps.xor(64, 127, 0xB));
        assert_eq!(
            (fps.starts.as_slice(), fps.values.as_slice()),
            (&[0][..], &[0xA ^ 0xB][..])
        );
        assert_eq!(fps.same_from(10, 0xA ^ 0xB, 500), 118);
    }
}

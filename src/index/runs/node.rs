//! A run of chain blocks (a node) and its residents' spans over positions.

use super::fingerprints::Fingerprints;
use crate::index::layer::{Change, Editor};
use crate::index::residents::{merge, own_value, owner_key, Resident};
use crate::index::vocab::FieldValue;

/// One resident over positions `from..=to` of a node.
#[derive(Debug, Clone, Copy)]
pub(super) struct Span {
    pub(super) resident: Resident,
    pub(super) from: u16,
    pub(super) to: u16,
}

impl Span {
    /// Whether the span covers `pos`.
    pub(super) fn covers(&self, pos: u16) -> bool {
        self.from <= pos && pos <= self.to
    }

    /// Whether the span is source `(pod, rank)`'s.
    pub(super) fn is(&self, pod: u32, rank: u8) -> bool {
        self.resident.pod() == pod && self.resident.rank() == rank
    }

    /// The pieces of the span before and after `pos` (a position it covers), if any.
    pub(super) fn around(&self, pos: u16) -> (Option<Span>, Option<Span>) {
        let left = (self.from < pos).then(|| Span {
            to: pos - 1,
            ..*self
        });
        let right = (pos < self.to).then(|| Span {
            from: pos + 1,
            ..*self
        });
        (left, right)
    }
}

/// A run of chain blocks and who holds which part of it.
#[derive(Debug, Default)]
pub(super) struct Node {
    /// Each position's chain hash: what a query reads, position after position.
    pub(super) chains: Vec<u64>,
    /// Each position's std (or content) hash, a function of the block's tokens as the chain
    /// hash is of its tokens and prefix: every source holding the block shares it (sources
    /// keep a spot rather than both hashes, [`source`](crate::index::source)). Apart from
    /// the chain hashes, so a query's walk of a run reads half the memory.
    pub(super) stds: Vec<u64>,
    /// Each position's fingerprint: the XOR of [`owner_key`] over its residents (0 when
    /// nobody holds it), kept as the spans are edited, so a query tells a block whose
    /// residents are the previous block's without a scan of the spans or any mixing; kept
    /// as stretches of equal ones, which a query counts past at once.
    pub(super) fps: Fingerprints,
    /// Sorted by (pod, rank, first position); one source's never overlap (invariant 2).
    pub(super) spans: Vec<Span>,
    /// The chain hash of the parent of the run's first block when the run is a fork (its
    /// parent ends or sits inside another run), else 0: every later block's parent is the
    /// block before it, or it is a chain start
    /// ([`ChainRuns::parent_at`](super::ChainRuns::parent_at)).
    pub(super) parent: u64,
}

impl Node {
    /// XORs `resident`'s owner key into the fingerprints of positions `from..=to`: once as it
    /// comes, once as it goes.
    #[inline]
    pub(super) fn flip(&mut self, resident: &Resident, from: u16, to: u16) {
        self.flip_key(owner_key(resident), from, to);
    }

    /// Changes the fingerprint at `pos` for a resident there edited from `old` to `new`:
    /// nothing when the edit left its owner key alone (a store time, an engine copy).
    #[inline]
    pub(super) fn flip_edited(&mut self, old: &Resident, new: &Resident, pos: u16) {
        self.flip_key(owner_key(old) ^ owner_key(new), pos, pos);
    }

    /// XORs `key` into the fingerprints of positions `from..=to`, which a span covers.
    #[inline]
    fn flip_key(&mut self, key: u64, from: u16, to: u16) {
        let flipped = self.fps.xor(from, to, key);
        debug_assert!(flipped, "a span past its run");
    }

    /// Every position's fingerprint as the spans give it (the XOR of its residents' keys),
    /// in one pass over the spans: what [`Self::fps`] must equal. `None` when a span reaches
    /// past the run.
    pub(super) fn fingerprints_from_spans(&self) -> Option<Vec<u64>> {
        let mut fps = vec![0u64; self.fps.len()];
        (self.spans.iter())
            .all(|s| xor_key(&mut fps, &s.resident, s.from, s.to))
            .then_some(fps)
    }

    /// Whether [`Self::fps`] is what the spans give, kept as the stretches' rules say.
    pub(super) fn fingerprints_in_step(&self) -> bool {
        self.fps.well_formed()
            && self.fps.len() == self.chains.len()
            && self.fingerprints_from_spans() == Some(self.fps.expanded())
    }

    /// Whether anybody holds `pos`.
    pub(super) fn held(&self, pos: u16) -> bool {
        self.spans.iter().any(|s| s.covers(pos))
    }

    /// The residents at `pos`.
    pub(super) fn residents_at(&self, pos: u16) -> impl Iterator<Item = &Resident> + '_ {
        (self.spans.iter())
            .filter(move |s| s.covers(pos))
            .map(|s| &s.resident)
    }
}

impl Node {
    /// Where spans of `(pod, rank)` starting at `from` or later begin, in span order.
    pub(super) fn seek(&self, pod: u32, rank: u8, from: u16) -> usize {
        (self.spans)
            .partition_point(|s| (s.resident.pod(), s.resident.rank(), s.from) < (pod, rank, from))
    }

    /// [`Self::seek`], answered without a search when `before` is the place of the last span
    /// in span order before `(pod, rank, from)` (checked: the span there sorts before it and
    /// the next one does not, which is what the search would find, whatever `before` came
    /// from).
    fn seek_after(&self, before: Option<usize>, pod: u32, rank: u8, from: u16) -> usize {
        let key = |s: &Span| (s.resident.pod(), s.resident.rank(), s.from);
        let wanted = (pod, rank, from);
        let found = before.filter(|&i| {
            (self.spans.get(i)).is_some_and(|s| key(s) < wanted)
                && (self.spans.get(i + 1)).is_none_or(|s| key(s) >= wanted)
        });
        match found {
            Some(i) => i + 1,
            None => self.seek(pod, rank, from),
        }
    }

    /// The spans of `pod`, all its DP ranks: they sit together in span order, by rank.
    fn pod_spans(&self, pod: u32) -> &[Span] {
        let first = self.seek(pod, 0, 0);
        let len = self.spans[first..].partition_point(|s| s.resident.pod() == pod);
        &self.spans[first..first + len]
    }

    /// Whether `pod` holds nothing here with a DP rank other than `rank` (the common case:
    /// one rank per pod), by two binary searches without a scan.
    pub(super) fn lone(&self, pod: u32, rank: u8) -> bool {
        let group = self.pod_spans(pod);
        let only_ours = |s: Option<&Span>| s.is_none_or(|s| s.resident.rank() == rank);
        only_ours(group.first()) && only_ours(group.last())
    }

    /// The value at `pos` of `pod`'s DP ranks other than `rank` (`None` when none holds it).
    pub(super) fn other_ranks(&self, pod: u32, rank: u8, pos: u16) -> Option<FieldValue> {
        (self.pod_spans(pod).iter())
            .filter(|s| s.resident.rank() != rank && s.covers(pos))
            .fold(None, |v, s| merge(v, own_value(&s.resident)))
    }

    /// Puts `span` of a source that holds none of its positions, merged with the source's
    /// spans right before and after it that hold the same resident (as a block edit's
    /// [`ResidentSet::push`](crate::index::residents::ResidentSet::push) merges them); gives
    /// where the span it joined (or is) sits, or `None`, with nothing changed, when the
    /// source holds any of them. `before` may say where the source's span right before it
    /// sits ([`Self::seek_after`]).
    pub(super) fn add_span(&mut self, span: Span, before: Option<usize>) -> Option<usize> {
        let (pod, rank) = (span.resident.pod(), span.resident.rank());
        let at = self.seek_after(before, pod, rank, span.from);
        let spans = &mut self.spans;
        // Invariant 2: only the one before
        // `at` and the one at it can reach into the new span.
        let prev = (at.checked_sub(1)).filter(|&i| spans[i].is(pod, rank));
        let next = (spans.get(at)).filter(|s| s.is(pod, rank)).map(|_| at);
        if prev.is_some_and(|i| spans[i].to >= span.from)
            || next.is_some_and(|i| spans[i].from <= span.to)
        {
            return None;
        }
        let meets = |before: &Span, after: &Span| {
            before.resident == after.resident && u32::from(before.to) + 1 == u32::from(after.from)
        };
        let prev = prev.filter(|&i| meets(&spans[i], &span));
        let next = next.filter(|&i| meets(&span, &spans[i]));
        Some(match (prev, next) {
            (Some(p), Some(n)) => {
                spans[p].to = spans[n].to;
                spans.remove(n);
                p
            }
            (Some(p), None) => {
                spans[p].to = span.to;
                p
            }
            (None, Some(n)) => {
                spans[n].from = span.from;
                n
            }
            (None, None) => {
                spans.insert(at, span);
                at
            }
        })
    }

    /// Calls `changed` with the editor's pod value before and after, and the number of
    /// blocks it changed for, at every position of `from..=to` that the editor's `spans`
    /// (added or taken off) cover: `change` gives it from what the pod's other DP ranks
    /// hold there and the span's own value. Once per span when the pod has no other rank
    /// in the run (the common case), else per position; nothing when nobody reads pod
    /// values ([`Editor::pod_values`]). Inlined: every stretch edit calls it, from another
    /// module of the runs (and so, in a release build, mostly another codegen unit).
    #[inline]
    pub(super) fn count_values(
        &self,
        spans: &[Span],
        (from, to): (u16, u16),
        who: Editor,
        change: impl Fn(Option<FieldValue>, Option<FieldValue>) -> Change,
        changed: &mut impl FnMut(Change, u32),
    ) {
        if !who.pod_values {
            return;
        }
        let lone = who.sole || self.lone(who.pod, who.rank);
        for span in spans {
            let own = own_value(&span.resident);
            let (first, last) = (span.from.max(from), span.to.min(to));
            if lone {
                changed(change(None, own), u32::from(last - first) + 1);
                continue;
            }
            for pos in first..=last {
                changed(change(self.other_ranks(who.pod, who.rank, pos), own), 1);
            }
        }
    }

    /// The spans of `(pod, rank)` that cover any of positions `from..=to`: together in span
    /// order.
    pub(super) fn covering(
        &self,
        pod: u32,
        rank: u8,
        from: u16,
        to: u16,
    ) -> std::ops::Range<usize> {
        let at = self.seek(pod, rank, from);
        let first = match at.checked_sub(1) {
            Some(i) if self.spans[i].is(pod, rank) && self.spans[i].to >= from => i,
            _ => at,
        };
        let len = (self.spans[first..]).partition_point(|s| s.is(pod, rank) && s.from <= to);
        first..first + len
    }

    /// Whether `(pod, rank)` holds any position of the run.
    pub(super) fn has(&self, pod: u32, rank: u8) -> bool {
        (self.spans.get(self.seek(pod, rank, 0))).is_some_and(|s| s.is(pod, rank))
    }
}

/// XORs `resident`'s owner key into `fps[from..=to]` (a word per position, as the checks
/// compute them); `false`, with nothing changed, when the positions are past `fps`.
#[inline]
fn xor_key(fps: &mut [u64], resident: &Resident, from: u16, to: u16) -> bool {
    let key = owner_key(resident);
    let Some(fps) = fps.get_mut(usize::from(from)..=usize::from(to)) else {
        return false;
    };
    for fp in fps {
        *fp ^= key;
    }
    true
}

/// The fingerprint of the residents at `pos` from the spans (0 when nobody holds it): what
/// [`Node::fps`] keeps, as the debug check after a visit recomputes it.
pub(super) fn fingerprint_at(node: &Node, pos: u16) -> u64 {
    node.residents_at(pos).fold(0, |fp, r| fp ^ owner_key(r))
}

/// Where a source's span for the position edited last sits in its node's span list: an
/// engine stores a run block after block, and the block after finds the span to grow (and
/// where it would go) here instead of by binary searches over every pod's spans.
///
/// The place is checked before use (the source's span there must cover the position or end
/// right before it), so a hint left behind by other edits is harmless. `lone` — the pod has no
/// other DP rank's span in the node — is only known while the runs stay locked: only one
/// source edits under the lock, so no other rank's span can come or go meanwhile.
#[derive(Debug, Clone, Copy)]
pub(super) struct SpanHint {
    pub(super) node: u32,
    pub(super) pod: u32,
    pub(super) rank: u8,
    pub(super) at: usize,
    pub(super) lone: Option<bool>,
}

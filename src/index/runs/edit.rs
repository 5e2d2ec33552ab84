//! Residency edits: a chain block opened for an edit, and the stretch edits of one source.

use super::node::{Node, Span, SpanHint};
use super::spot::Spot;
use super::{ChainRuns, HeldRuns, Stretch};
use crate::index::layer::{self, Change, DupCounts, Editor};
use crate::index::residents::{own_value, Edited, Resident, ResidentSet};
use crate::medium::MediaSet;

/// One chain block opened for an edit: a position of a node, seen as a [`ResidentSet`].
struct BlockMut<'a> {
    node: &'a mut Node,
    id: u32,
    hint: &'a mut Option<SpanHint>,
    /// [`SpanHint::lone`] of the editing source, when asked before the hint was left.
    lone: Option<bool>,
    pos: u16,
    /// The last lookup of a source's span here ([`Self::locate`] for `(pod, rank)`), so the
    /// `push` or `remove` after it needs no search; cleared by every change of the spans.
    looked: Option<(u32, u8, (usize, Option<usize>))>,
}

impl ChainRuns {
    /// Chain block `spot` opened for an edit.
    fn open(&mut self, spot: Spot) -> BlockMut<'_> {
        BlockMut {
            node: &mut self.nodes[spot.node as usize],
            id: spot.node,
            hint: &mut self.hint,
            lone: None,
            pos: spot.pos as u16,
            looked: None,
        }
    }

    /// Adds `added` media (and an engine copy when `new_copy`) to the editor's resident of
    /// chain block `key` (std hash `std`), a new block placed after `parent` (stored `alone`
    /// or not, [`Self::place`]; [`layer::add_media`]). Also gives the block's spot when the
    /// run keeps `std` for it (it may not, on a chain-hash collision): the source then
    /// finds both hashes there.
    pub(crate) fn add_media(
        &mut self,
        parent: (u64, bool),
        (dups, held): (&mut DupCounts, &mut HeldRuns),
        (key, std): (u64, u64),
        who: Editor,
        added: MediaSet,
        new_copy: bool,
    ) -> (Change, bool, Option<Spot>) {
        let (spot, created) = self.place(key, std, parent);
        held.note(spot.node);
        let mut block = self.open(spot);
        let same_std = block.node.stds.get(block.pos as usize) == Some(&std);
        let spot = same_std.then_some(spot);
        // A block nobody holds gets the editor as its first resident, as a new map entry
        // would; with media added that is what the rules below do too, without the scan.
        if created || (added.is_empty() && !block.node.held(block.pos)) {
            block.push(Resident::new(who.pod, who.rank, who.now, added));
            let (change, duplicate) = layer::first_resident(who, added);
            return (change, duplicate, spot);
        }
        // A source's first engine copy of the block (the common store: a run stored block
        // after block) has no copies to count: its resident goes in as it is.
        let resident = Resident::new(who.pod, who.rank, who.now, added);
        if let Some(change) = new_copy
            .then(|| block.push_first_copy(resident, who))
            .flatten()
        {
            return (change, false, spot);
        }
        let dup_key = (layer::CHAIN_DUPS, key);
        let (change, duplicate) = layer::add_to(&mut block, dups, dup_key, who, added, new_copy);
        (change, duplicate, spot)
    }

    /// Gives the editor's source its first engine copy, on `media`, of every block of
    /// `stretch` in one edit of the run's spans (an engine stores a run block after block:
    /// one edit for an event's stretch of it instead of one per block). Calls `changed` as
    /// [`Self::drop_source`] does. Returns `false`, with nothing changed, when the source
    /// holds any of the blocks already: the caller then adds them one by one.
    pub(crate) fn add_first_copies(
        &mut self,
        held: &mut HeldRuns,
        stretch: Stretch,
        who: Editor,
        media: MediaSet,
        mut changed: impl FnMut(Change, u32),
    ) -> bool {
        let node = &mut self.nodes[stretch.node as usize];
        let resident = Resident::new(who.pod, who.rank, who.now, media);
        let span = Span {
            resident,
            from: stretch.from,
            to: stretch.to,
        };
        let Some(joined) = node.add_span(span, held.span_in(stretch.node)) else {
            return false;
        };
        node.flip(&resident, stretch.from, stretch.to);
        // The source's spans in the run moved: a hint may name another one now.
        self.hint = None;
        held.note(stretch.node);
        held.span = Some((stretch.node, joined));
        let added = |others, own| who.values(others, None, own);
        node.count_values(
            &[span],
            (stretch.from, stretch.to),
            who,
            added,
            &mut changed,
        );
        true
    }

    /// Takes the editor's source off every block of `stretch` in one edit of the run's spans
    /// (an engine removes a run's blocks in a row: one edit for an event's stretch of it
    /// instead of one per block). The caller's blocks are ones the source holds through one
    /// engine block each, all of them gone: for those this is what [`Self::drop_media`] with
    /// `slot_gone` does block by block. Positions the source does not hold are left as they
    /// are. Calls `changed` as [`Self::drop_source`] does.
    pub(crate) fn drop_copies(
        &mut self,
        held: &mut HeldRuns,
        stretch: Stretch,
        who: Editor,
        mut changed: impl FnMut(Change, u32),
    ) {
        let node = &mut self.nodes[stretch.node as usize];
        let (from, to) = (stretch.from, stretch.to);
        let covering = node.covering(who.pod, who.rank, from, to);
        if covering.is_empty() {
            return;
        }
        let dropped = |others, own| who.values(others, own, None);
        node.count_values(
            &node.spans[covering.clone()],
            (from, to),
            who,
            dropped,
            &mut changed,
        );
        for i in covering.clone() {
            let s = node.spans[i];
            node.flip(&s.resident, s.from.max(from), s.to.min(to));
        }
        // What is left of the first and the last span outside the stretch stays.
        let head = node.spans[covering.start];
        let tail = node.spans[covering.end - 1];
        let left = (head.from < from).then(|| Span {
            to: from - 1,
            ..head
        });
        let right = (tail.to > to).then(|| Span {
            from: to + 1,
            ..tail
        });
        // A piece left outside the stretch means the source still holds part of the run.
        let keeps_some = left.is_some() || right.is_some();
        node.spans.splice(covering, left.into_iter().chain(right));
        self.hint = None;
        if !keeps_some && !node.has(who.pod, who.rank) {
            held.forget(stretch.node);
        }
        self.release(stretch.node, to);
    }

    /// Takes `removed` media off the editor's resident of chain block `key`, at `spot` when
    /// the caller knows it ([`layer::drop_media`]).
    pub(crate) fn drop_media(
        &mut self,
        (dups, held): (&mut DupCounts, &mut HeldRuns),
        (key, spot): (u64, Option<Spot>),
        who: Editor,
        removed: MediaSet,
        slot_gone: bool,
    ) -> Option<(Change, u32)> {
        // A source that holds no resident there is answered `None` by the rules below.
        let known = spot.filter(|s| self.at(*s) == Some(key));
        let spot = known.or_else(|| self.find(key))?;
        self.last = Some((key, spot));
        let dup_key = (layer::CHAIN_DUPS, key);
        let mut block = self.open(spot);
        let (dropped, empty) =
            layer::drop_from(&mut block, dups, dup_key, who, removed, slot_gone)?;
        if !block.node.has(who.pod, who.rank) {
            held.forget(spot.node);
        }
        if empty {
            self.release(spot.node, spot.pos as u16);
        }
        Some(dropped)
    }

    /// Removes every resident of the editor's source from the runs it holds spans in
    /// (`held`, a source clear): each run is edited once, whatever the number of its blocks
    /// the source held, and none of its blocks is looked up. Calls `changed` with the pod's
    /// value before and after, and the number of chain blocks it changed for, for every
    /// chain block whose value the editor reads ([`Editor::values`]): once per span when the
    /// pod has no other DP rank in the run (the common case), else per block.
    pub(crate) fn drop_source(
        &mut self,
        held: HeldRuns,
        who: Editor,
        mut changed: impl FnMut(Change, u32),
    ) {
        let mut gone = Vec::new();
        for id in held.ids {
            let Some(node) = self.nodes.get_mut(id as usize) else {
                continue;
            };
            // A source's spans sit together in span order.
            let from = node.seek(who.pod, who.rank, 0);
            let to = from + node.spans[from..].partition_point(|s| s.is(who.pod, who.rank));
            if from == to {
                continue;
            }
            gone.clear();
            gone.extend(node.spans.drain(from..to));
            for s in &gone {
                node.flip(&s.resident, s.from, s.to);
            }
            let dropped = |others, own| who.values(others, own, None);
            node.count_values(&gone, (0, u16::MAX), who, dropped, &mut changed);
            self.release(id, u16::MAX);
        }
    }
}

impl BlockMut<'_> {
    /// Gives the position's piece of span `at` the resident `new`: the span splits around
    /// the position, and the piece merges with a neighbour that agrees. Returns where the
    /// span holding the position is then.
    fn set(&mut self, at: usize, new: Resident) -> usize {
        let pos = self.pos;
        let span = self.node.spans[at];
        // A run stored again block after block: the edited position is the span's first and
        // the span before already holds the new resident up to it, so it moves over by one
        // with no split.
        if pos == span.from && self.grow_before(at, new) {
            if span.to == pos {
                self.node.spans.remove(at);
                // The grown span may now meet the next one of the source.
                return self.coalesce(at - 1);
            }
            self.node.spans[at].from = pos + 1;
            return at - 1;
        }
        let mid = Span {
            resident: new,
            from: pos,
            to: pos,
        };
        let (left, right) = span.around(pos);
        // The pieces keep the span's place in the order: same source, rising positions.
        let pieces = left.into_iter().chain([mid]).chain(right);
        self.node.spans.splice(at..=at, pieces);
        self.coalesce(at + usize::from(left.is_some()))
    }

    /// Grows the span before `at` over this position when it holds `resident` (so the same
    /// source) and ends right before it, merging it with the span at `at` when that one
    /// then follows on with the same resident; says whether it did. The position must be
    /// free of the source's spans from `at` on (or be the first of span `at`, which the
    /// caller gives up).
    fn grow_before(&mut self, at: usize, resident: Resident) -> bool {
        let pos = self.pos;
        let Some(prev) = at.checked_sub(1) else {
            return false;
        };
        let spans = &mut self.node.spans;
        if spans[prev].resident != resident || u32::from(spans[prev].to) + 1 != u32::from(pos) {
            return false;
        }
        spans[prev].to = pos;
        // The span after it may now follow on (a hole filled); the caller's own span at
        // `at`, if it starts here, is handled by the caller.
        let next = (spans.get(at)).filter(|n| n.from == pos + 1 && n.resident == resident);
        if let Some(next) = next.copied() {
            spans[prev].to = next.to;
            spans.remove(at);
        }
        true
    }

    /// Merges span `at` with the spans right before and after it that hold the same
    /// resident (the same source, media, store time and copies): in span order, a source's
    /// neighbouring spans sit next to each other. Returns where the merged span is.
    fn coalesce(&mut self, at: usize) -> usize {
        let spans = &mut self.node.spans;
        let span = spans[at];
        if let Some(next) = spans.get(at + 1) {
            if next.resident == span.resident && u32::from(span.to) + 1 == u32::from(next.from) {
                spans[at].to = next.to;
                spans.remove(at + 1);
            }
        }
        if let Some(prev) = at.checked_sub(1).map(|i| spans[i]) {
            if prev.resident == span.resident && u32::from(prev.to) + 1 == u32::from(span.from) {
                spans[at - 1].to = spans[at].to;
                spans.remove(at);
                return at - 1;
            }
        }
        at
    }

    /// Where the spans of `(pod, rank)` starting after this position begin, and the one of
    /// them covering it, if any ([`Node::seek`]); from the hint when the source's span there
    /// covers this position or ends right before it.
    fn locate(&self, pod: u32, rank: u8) -> (usize, Option<usize>) {
        let pos = self.pos;
        let spans = &self.node.spans;
        let hinted = (*self.hint).filter(|h| (h.node, h.pod, h.rank) == (self.id, pod, rank));
        if let Some(h) = hinted {
            let span = spans.get(h.at).filter(|s| s.is(pod, rank));
            if span.is_some_and(|s| s.covers(pos)) {
                return (h.at + 1, Some(h.at));
            }
            if span.is_some_and(|s| u32::from(s.to) + 1 == u32::from(pos)) {
                // Invariant 2: the source's next span, if any, is
                // the only one that may cover this position.
                let next = spans.get(h.at + 1);
                return match next.filter(|n| n.is(pod, rank) && n.from == pos) {
                    Some(_) => (h.at + 2, Some(h.at + 1)),
                    None => (h.at + 1, None),
                };
            }
        }
        let after = self.node.seek(pod, rank, pos + 1);
        let at = (after.checked_sub(1)).filter(|&i| {
            let span = &spans[i];
            span.is(pod, rank) && span.covers(pos)
        });
        (after, at)
    }

    /// Pushes `resident`, the editor's, when its source holds nothing at this position, and
    /// gives the pod's value before and after (what [`layer::add_to`] gives for it, without
    /// its edit of a held resident); `None`, with nothing changed, when the source holds it.
    fn push_first_copy(&mut self, resident: Resident, who: Editor) -> Option<Change> {
        let (after, covered) = self.locate(who.pod, who.rank);
        if covered.is_some() {
            return None;
        }
        let other = if who.others_matter() && !self.lone(who.pod, who.rank) {
            self.node.other_ranks(who.pod, who.rank, self.pos)
        } else {
            None
        };
        self.looked = Some((who.pod, who.rank, (after, None)));
        self.push(resident);
        Some(who.values(other, None, own_value(&resident)))
    }

    /// [`Self::locate`], answered by the lookup just made when it was for `(pod, rank)`;
    /// takes that lookup, as the caller is about to change the spans.
    fn looked_up(&mut self, pod: u32, rank: u8) -> (usize, Option<usize>) {
        match self.looked.take() {
            Some((p, r, found)) if (p, r) == (pod, rank) => found,
            _ => self.locate(pod, rank),
        }
    }

    /// Notes span `at` as where the next edit of `(pod, rank)` in this run looks first: its
    /// span at this position, or the piece of it a remove left.
    fn held_at(&mut self, pod: u32, rank: u8, at: usize) {
        let same = (*self.hint).filter(|h| (h.node, h.pod, h.rank) == (self.id, pod, rank));
        *self.hint = Some(SpanHint {
            node: self.id,
            pod,
            rank,
            at,
            lone: same.and_then(|h| h.lone).or(self.lone),
        });
    }

    /// Whether `pod` holds no span here with a DP rank other than `rank`, known for the rest
    /// of the lock once asked.
    fn lone(&mut self, pod: u32, rank: u8) -> bool {
        let hint = self.hint.as_mut();
        let hint = hint.filter(|h| (h.node, h.pod, h.rank) == (self.id, pod, rank));
        if let Some(known) = hint.as_ref().and_then(|h| h.lone) {
            return known;
        }
        let lone = self.node.lone(pod, rank);
        match hint {
            Some(h) => h.lone = Some(lone),
            // Kept for the hint the edit leaves.
            None => self.lone = Some(lone),
        }
        lone
    }
}

impl ResidentSet for BlockMut<'_> {
    fn edit_with_others<R>(
        &mut self,
        pod: u32,
        rank: u8,
        others: bool,
        edit: impl FnOnce(&mut Resident) -> R,
    ) -> Edited<R> {
        // With no span of the source covering the position, `after` is also where a span
        // of it for the position goes.
        let (after, at) = self.locate(pod, rank);
        self.looked = Some((pod, rank, (after, at)));
        let other = if others && !self.lone(pod, rank) {
            self.node.other_ranks(pod, rank, self.pos)
        } else {
            None
        };
        let edited = at.map(|i| {
            let old = self.node.spans[i].resident;
            let mut new = old;
            let out = edit(&mut new);
            if new != old {
                self.looked = None;
                let pos = self.pos;
                self.node.flip_edited(&old, &new, pos);
                let held = self.set(i, new);
                self.held_at(pod, rank, held);
            }
            (out, old, new)
        });
        (edited, other)
    }

    fn push(&mut self, resident: Resident) {
        let pos = self.pos;
        let (pod, rank) = (resident.pod(), resident.rank());
        self.node.flip(&resident, pos, pos);
        // The source holds nothing here: `after` is where its span for the position goes.
        let (at, _) = self.looked_up(pod, rank);
        // A source storing a run block after block: its span before grows by one, with no
        // insert (and no shift of the spans after it).
        if self.grow_before(at, resident) {
            self.held_at(pod, rank, at - 1);
            return;
        }
        let span = Span {
            resident,
            from: pos,
            to: pos,
        };
        self.node.spans.insert(at, span);
        let held = self.coalesce(at);
        self.held_at(pod, rank, held);
    }

    fn remove(&mut self, pod: u32, rank: u8) -> bool {
        let pos = self.pos;
        if let (_, Some(at)) = self.looked_up(pod, rank) {
            let gone = self.node.spans[at].resident;
            self.node.flip(&gone, pos, pos);
            let spans = &mut self.node.spans;
            // The span shrinks from its end or its start (a run removed block after block,
            // either way), splits around the position, or goes.
            match spans[at].around(pos) {
                (Some(left), Some(right)) => {
                    spans[at] = left;
                    spans.insert(at + 1, right);
                }
                (Some(piece), None) | (None, Some(piece)) => spans[at] = piece,
                (None, None) => {
                    spans.remove(at);
                }
            }
            // The next block of such a run finds its span here.
            self.held_at(pod, rank, at);
        }
        !self.node.held(pos)
    }
}

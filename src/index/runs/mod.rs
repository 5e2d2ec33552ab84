//! The chain layer as runs: chain blocks kept in runs (one node per run of blocks stored as
//! one chain), each resident held as spans of positions rather than once per block.
//!
//! Why: a map of chain blocks pays a probe, a lock and a resident scan for every
//! (block, pod), and a query one probe per block. Prompts share long prefixes and engines
//! store them a run at a time, so the blocks of a run mostly have the same residents.
//!
//! - A **node** is a run of chain hashes, append-only: a new block whose parent is a run's
//!   last block extends that run (up to [`MAX_RUN`]); a fork starts a run, and a chain start
//!   stored alone joins the shared open run ([`ChainRuns::place`]).
//! - A **span** is one resident — (pod, DP rank, media, store time, engine copies) — over a
//!   range of a node's positions. An edit of one block splits the span there, and the piece
//!   merges back with a neighbouring span of the same source once they agree again, so
//!   residency stays exact per block (a mid-chain remove leaves the blocks after it held,
//!   and removing those later finds them) while the common case is one span per run. The
//!   stretch of a run one event stores or removes block after block, as engines do, is one
//!   edit of the source's spans ([`ChainRuns::add_first_copies`], [`ChainRuns::drop_copies`]).
//! - The **locator** maps a chain hash to its node and position (keeping the spot alone:
//!   the hash is the run's at the spot). A query follows a run
//!   without probing it, and counts the positions up to where the residents change by
//!   comparing chain hashes and fingerprints (below), with no span scan ([`Cursor`],
//!   [`ChainRuns::repeats`]).
//!   It also knows the chain starts, a prompt's possible first blocks, so a new prompt's
//!   miss is answered from a small table ([`Locator`]).
//! - Each position keeps a **fingerprint** of its residents (pods, ranks, media; XORed as
//!   spans are edited): a query tells a block whose residents are the previous block's,
//!   in this run or another, by one comparison, and where they change within a run.
//!
//! Each source keeps the runs it holds spans in ([`HeldRuns`]), so its clear visits only
//! those.
//!
//! # Invariants
//!
//! Every part of `runs/` keeps these; the comments elsewhere in it refer to them by number
//! (the index-wide ones are in `docs/architecture.md`, section 5).
//!
//! 1. **Exact per block.** A source's spans in a node cover exactly the positions it holds
//!    there, with its media, store time and engine copies. An edit of part of a span splits
//!    it; a piece merges back with a neighbouring span of the same source once they agree.
//! 2. **Spans in order.** A node's spans are sorted by (pod, rank, first position), and the
//!    spans of one source never overlap.
//! 3. **Fingerprints in step.** A position's fingerprint is the XOR of its residents' owner
//!    keys (0: nobody holds it), kept as stretches in which neighbours always differ, so one
//!    stretch is exactly the positions a query may count past without a visit.
//! 4. **Stable positions.** A position nobody holds stays in its run while a later one is
//!    held; every edit that takes residents off a run releases it, so a run's last position
//!    is held while anybody holds any of it: its unheld tail is trimmed, and a run nobody
//!    holds is freed and its id reused.
//! 5. **Locator exact.** The locator keeps a block's spot exactly while its run keeps the
//!    position, flagged as a start when the block was placed with no parent here.
//! 6. **Parents.** A block's parent is the position before it in its run, except for a
//!    run's first block (a fork's node keeps its parent) and a flagged start (none).
//! 7. **Held runs exact.** A run is in a source's [`HeldRuns`] exactly while the source has
//!    a span in it: it leaves with the last one, before the run can be freed.
//! 8. **Hints are checked.** What an edit or a query remembers of where it was (the block
//!    placed last, a [`SpanHint`], a source's span in [`HeldRuns`], a
//!    [`Cursor`]) is checked against the run before use, so a stale one is harmless; what
//!    it knows of other sources' spans holds only while the runs stay locked.
//!
//! Parts, bottom up: where a block sits and its packing ([`spot`]), a run's fingerprints
//! ([`fingerprints`]), a run and its spans ([`node`]), the locator ([`locator`]); placing
//! blocks in runs is here; residency edits ([`edit`]) and what a query reads ([`read`])
//! extend [`ChainRuns`] from above.

mod edit;
mod fingerprints;
mod locator;
mod node;
mod read;
mod spot;
#[cfg(test)]
mod tests;

use super::vocab::table_bytes;

use locator::Locator;
use node::{Node, Span, SpanHint};
pub(crate) use read::Cursor;
#[cfg(test)]
pub(crate) use spot::TEST_NODE_BITS;
pub(crate) use spot::{Spot, POS_BITS};

/// Longest run: positions fit a `u16`, and a run's span list stays short to scan.
pub(crate) const MAX_RUN: usize = 256;

const _: () = assert!(MAX_RUN <= 1 << POS_BITS);

/// The chain blocks of every model, in runs.
#[derive(Debug, Default)]
pub(crate) struct ChainRuns {
    locator: Locator,
    nodes: Vec<Node>,
    /// Ids of freed nodes, reused before the node list grows.
    free: Vec<u32>,
    /// The run new chain starts stored alone are appended to: a block whose parent is no
    /// chain block here and whose event stores nothing else shares a run with other such
    /// starts rather than having a node of its own, which would cost a node and two
    /// allocations per block where chains are one block long. A start stored with its
    /// continuation gets a run of its own: a shared one would gather every popular start,
    /// and each with all its pods' spans.
    open: Option<u32>,
    /// The block placed last and its spot: an engine stores a chain block after block, so
    /// the next block's parent is usually this one and sits right before it in the run.
    last: Option<(u64, Spot)>,
    /// The span the last block edit left its source holding, so the next block of a run
    /// finds its source's span without a search ([`SpanHint`]).
    hint: Option<SpanHint>,
    /// Pods with more than one source (DP rank) registered, set with the runs locked as
    /// sources come and go ([`Self::note_ranks`]): an edit under the lock then knows, with
    /// no other lock or map, whether another rank of its pod can hold anything (mostly the
    /// set is empty, and the answer is one length check).
    ranked: hashbrown::HashSet<u32>,
}

/// The runs one source holds spans in, so a source clear edits exactly those runs without
/// looking up any of its blocks (kept exact, invariant 7).
#[derive(Debug, Default)]
pub(crate) struct HeldRuns {
    ids: hashbrown::HashSet<u32>,
    /// The run noted last: consecutive blocks of a store are mostly in one run.
    last: Option<u32>,
    /// Where the source's span that its last stretch joined sat in that run's span list:
    /// the source's next event mostly extends it, though other sources edited the run in
    /// between (so the run-wide [`SpanHint`] names theirs). Checked before use.
    span: Option<(u32, usize)>,
}

impl HeldRuns {
    /// The place of the source's span that its last stretch in run `id` joined, if any.
    fn span_in(&self, id: u32) -> Option<usize> {
        self.span.filter(|(node, _)| *node == id).map(|(_, at)| at)
    }
    fn note(&mut self, id: u32) {
        if self.last != Some(id) {
            self.ids.insert(id);
            self.last = Some(id);
        }
    }

    fn forget(&mut self, id: u32) {
        self.ids.remove(&id);
        if self.last == Some(id) {
            self.last = None;
        }
        if self.span_in(id).is_some() {
            self.span = None;
        }
    }

    /// Estimated heap bytes.
    pub(crate) fn heap_bytes(&self) -> usize {
        table_bytes::<u32, ()>(self.ids.capacity())
    }
}

/// Positions `from..=to` of one run: the stretch of it an event stores or removes block
/// after block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stretch {
    node: u32,
    from: u16,
    to: u16,
}

impl Stretch {
    /// The stretch of the one block at `spot`.
    pub(crate) fn at(spot: Spot) -> Stretch {
        let pos = spot.pos as u16;
        Stretch {
            node: spot.node,
            from: pos,
            to: pos,
        }
    }

    /// Grows the stretch over `spot` when that is the position right after it or right
    /// before it (an engine removes a chain's blocks deepest first); says whether it did.
    pub(crate) fn grow_either(&mut self, spot: Spot) -> bool {
        if spot.node != self.node {
            return false;
        }
        if spot.pos + 1 == u32::from(self.from) {
            self.from -= 1;
            return true;
        }
        self.grow(spot)
    }

    /// Grows the stretch over `spot` when that is the position right after it; says whether
    /// it did.
    pub(crate) fn grow(&mut self, spot: Spot) -> bool {
        let next = spot.node == self.node && spot.pos == u32::from(self.to) + 1;
        if next {
            self.to += 1;
        }
        next
    }

    /// The spots of the stretch, in order.
    pub(crate) fn spots(self) -> impl Iterator<Item = Spot> {
        (self.from..=self.to).map(move |pos| Spot {
            node: self.node,
            pos: u32::from(pos),
        })
    }
}

impl ChainRuns {
    /// Where chain block `hash` sits, whether or not anybody holds it now.
    fn spot(&self, hash: u64) -> Option<Spot> {
        self.locator.spot(hash, &self.nodes)
    }

    /// The spot of a held chain block.
    fn held_spot(&self, hash: u64) -> Option<Spot> {
        let spot = self.spot(hash)?;
        self.nodes[spot.node as usize]
            .held(spot.pos as u16)
            .then_some(spot)
    }

    /// The spot of chain block `hash`, placed after `parent` when it is new: at the end of
    /// the parent's run when the parent ends one with room left, else as a run of its own
    /// (or, a chain start stored `alone`, in the open run).
    /// Also says whether the block is new.
    fn place(&mut self, hash: u64, std: u64, parent: (u64, bool)) -> (Spot, bool) {
        if let Some(spot) = self.find(hash) {
            self.last = Some((hash, spot));
            return (spot, false);
        }
        (self.place_new(hash, std, parent), true)
    }

    /// The spot of chain block `hash` and the std hash its run keeps, in one lookup; a new
    /// block is placed as [`Self::place`] does, its std hash `content()`. Inlined into the
    /// store's loop (its one caller there): out of line, its prologue, epilogue and spills
    /// were paid on every block.
    #[inline(always)]
    pub(crate) fn find_or_place(
        &mut self,
        hash: u64,
        parent: (u64, bool),
        content: impl FnOnce() -> u64,
    ) -> (Spot, u64) {
        if let Some(spot) = self.find(hash) {
            self.last = Some((hash, spot));
            let std = self.nodes[spot.node as usize].stds[spot.pos as usize];
            return (spot, std);
        }
        let std = content();
        (self.place_new(hash, std, parent), std)
    }

    /// Places new chain block `hash` after `parent` ([`Self::place`]).
    fn place_new(&mut self, hash: u64, std: u64, (parent, alone): (u64, bool)) -> Spot {
        let after = match self.last {
            // The parent is the block edited last (its spot checked against the run, which
            // may have changed since): no probe.
            Some((last, spot)) if last == parent && self.at(spot) == Some(parent) => Some(spot),
            _ => (parent != 0).then(|| self.spot(parent)).flatten(),
        };
        let node = match after {
            Some(p) if self.extends(p) => p.node,
            None if alone => {
                let open = self.open.filter(|id| {
                    let len = self.nodes[*id as usize].chains.len();
                    len > 0 && len < MAX_RUN
                });
                let node = open.unwrap_or_else(|| self.new_node());
                self.open = Some(node);
                node
            }
            // A fork or a full run: a run of its own, which knows its parent.
            Some(_) => {
                let node = self.new_node();
                self.nodes[node as usize].parent = parent;
                node
            }
            // A start stored with its continuation: the continuation will most likely
            // follow, in a run of its own.
            None => self.new_node(),
        };
        let spot = self.append(node, hash, std);
        self.locator
            .insert(hash, spot, after.is_none(), &self.nodes);
        self.last = Some((hash, spot));
        spot
    }

    /// Notes that the next block edited most likely follows chain block `hash` at `spot`
    /// (an event's parent, whose spot its source keeps): it is then found or placed without
    /// a locator probe. Checked against the run when used, like every `last`.
    pub(crate) fn expect_after(&mut self, hash: u64, spot: Spot) {
        self.last = Some((hash, spot));
    }

    /// The chain hash of the parent of the chain block at `spot`, 0 for a chain start or
    /// where the parent is not known: a block sits right after its parent unless it starts
    /// a fork's run (whose node keeps the parent) or is a start (flagged in the locator).
    /// What a checkpoint keeps, so a warm start places the block after its parent again.
    pub(crate) fn parent_at(&self, spot: Spot) -> u64 {
        let Some(node) = self.nodes.get(spot.node as usize) else {
            return 0;
        };
        let pos = spot.pos as usize;
        let Some(&chain) = node.chains.get(pos) else {
            return 0;
        };
        if pos == 0 {
            return node.parent;
        }
        let start = (self.locator.slot(chain, &self.nodes)).is_some_and(|slot| slot.is_flagged());
        if start {
            0
        } else {
            node.chains[pos - 1]
        }
    }

    /// [`Self::parent_at`] the spot of chain block `chain`, 0 when it is not here (a block
    /// without a chain, 0, never is: no probe for it).
    pub(crate) fn parent_of(&self, chain: u64) -> u64 {
        if chain == 0 {
            return 0;
        }
        self.spot(chain).map_or(0, |spot| self.parent_at(spot))
    }

    /// Runs in use.
    pub(crate) fn runs(&self) -> usize {
        self.nodes.len() - self.free.len()
    }

    /// The chain hash at `spot`, if the run still reaches it.
    fn at(&self, spot: Spot) -> Option<u64> {
        let node = self.nodes.get(spot.node as usize)?;
        node.chains.get(spot.pos as usize).copied()
    }

    /// The std (or content) hash the run keeps for chain block `hash`, if it is here.
    pub(crate) fn std_of(&self, hash: u64) -> Option<u64> {
        let spot = self.find(hash)?;
        Some(self.hashes_at(spot)?.1)
    }

    /// The chain hash and the std hash at `spot`, if the run still reaches it.
    pub(crate) fn hashes_at(&self, spot: Spot) -> Option<(u64, u64)> {
        let node = self.nodes.get(spot.node as usize)?;
        let pos = spot.pos as usize;
        Some((*node.chains.get(pos)?, *node.stds.get(pos)?))
    }

    /// The spot of `hash`: right after or before the block edited last without a probe (an
    /// engine stores and removes a chain's blocks in a row), else from the locator.
    fn find(&self, hash: u64) -> Option<Spot> {
        self.near_last(hash).or_else(|| self.spot(hash))
    }

    /// The spot of `hash` when it sits right after or right before the block edited last.
    /// The run is looked up once for both neighbours (every stored block asks, mostly for
    /// the position after the last).
    fn near_last(&self, hash: u64) -> Option<Spot> {
        let (_, last) = self.last?;
        let chains = &self.nodes.get(last.node as usize)?.chains;
        let pos = last.pos as usize;
        let at = |pos: usize| Spot {
            node: last.node,
            pos: pos as u32,
        };
        if chains.get(pos + 1) == Some(&hash) {
            return Some(at(pos + 1));
        }
        let before = pos.checked_sub(1)?;
        (chains.get(before) == Some(&hash)).then(|| at(before))
    }

    /// Puts `hash` at the end of node `id`'s run.
    fn append(&mut self, id: u32, hash: u64, std: u64) -> Spot {
        let node = &mut self.nodes[id as usize];
        node.chains.push(hash);
        node.stds.push(std);
        node.fps.push_unheld();
        Spot {
            node: id,
            pos: node.chains.len() as u32 - 1,
        }
    }

    /// Whether a block after `parent` may extend the parent's run.
    fn extends(&self, parent: Spot) -> bool {
        let len = self.nodes[parent.node as usize].chains.len();
        parent.pos as usize + 1 == len && len < MAX_RUN
    }

    fn new_node(&mut self) -> u32 {
        if let Some(id) = self.free.pop() {
            return id;
        }
        self.nodes.push(Node::default());
        self.nodes.len() as u32 - 1
    }

    /// Gives back what blocks of run `id` nobody holds any more kept, after an edit that
    /// took residents off positions up to `edited_to`: the run's tail nobody holds, or the
    /// whole run when nobody holds any of it (invariant 4): an edit that ends before the
    /// run's last position cannot have made it unheld, and the scan of every span that
    /// finding the tail takes is skipped.
    fn release(&mut self, id: u32, edited_to: u16) {
        let node = &mut self.nodes[id as usize];
        if usize::from(edited_to) + 1 < node.chains.len() && !node.spans.is_empty() {
            debug_assert!(
                node.held(node.chains.len() as u16 - 1),
                "a tail nobody holds"
            );
            return;
        }
        if node.spans.is_empty() {
            for (pos, hash) in node.chains.drain(..).enumerate() {
                self.locator.remove(hash, Spot::from_parts(id, pos as u32));
            }
            *node = Node::default();
            self.free.push(id);
            if self.open == Some(id) {
                self.open = None;
            }
            return;
        }
        while let Some(&last) = node.chains.last() {
            if node.held(node.chains.len() as u16 - 1) {
                break;
            }
            node.chains.pop();
            node.stds.pop();
            node.fps.pop();
            let pos = node.chains.len() as u32;
            self.locator.remove(last, Spot::from_parts(id, pos));
        }
    }

    /// Chain blocks with a position in a run (held, or kept before a held one).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.locator.len()
    }

    /// Slots of the locator, for tests of memory given back.
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.locator.capacity()
    }

    /// Estimated heap bytes. With debug assertions it also checks every position's
    /// fingerprint against its spans: `stats()` walks every node anyway, and the fuzz target
    /// and the tests call it after their edits.
    pub(crate) fn heap_bytes(&self) -> usize {
        debug_assert!(
            self.nodes.iter().all(Node::fingerprints_in_step),
            "fingerprints out of step with the spans"
        );
        let nodes = self.nodes.capacity() * std::mem::size_of::<Node>();
        let runs: usize = (self.nodes.iter())
            .map(|n| {
                (n.chains.capacity() + n.stds.capacity()) * 8
                    + n.fps.heap_bytes()
                    + n.spans.capacity() * std::mem::size_of::<Span>()
            })
            .sum();
        self.locator.heap_bytes() + nodes + runs + self.free.capacity() * 4
    }

    /// Starts an edit under a fresh write lock: what was known of other sources' spans
    /// ([`SpanHint::lone`]) may have changed since the last one.
    pub(crate) fn relocked(&mut self) {
        self.hint = None;
    }

    /// Records that `pod` has `sources` sources registered (called whenever the number
    /// changes, in the order it changes).
    pub(crate) fn note_ranks(&mut self, pod: u32, sources: usize) {
        if sources > 1 {
            self.ranked.insert(pod);
        } else {
            self.ranked.remove(&pod);
        }
    }

    /// Whether `pod` has at most one source registered: while the runs stay locked, no
    /// other DP rank of it holds anything, spans here or std residents (a rank registering
    /// waits for the lock; a rank's blocks go before it is unregistered).
    pub(crate) fn sole_rank(&self, pod: u32) -> bool {
        self.ranked.is_empty() || !self.ranked.contains(&pod)
    }

    /// Gives back memory once the locator is a quarter full or less.
    pub(crate) fn shrink(&mut self) {
        self.locator.shrink(&self.nodes);
        if self.free.len() > 1024 && self.free.len() * 2 > self.nodes.len() {
            // Trailing free nodes go; ids of the rest stay as they are.
            let mut top = self.nodes.len();
            while top > 0 && self.nodes[top - 1].chains.is_empty() {
                top -= 1;
            }
            self.nodes.truncate(top);
            self.nodes.shrink_to_fit();
            self.free.retain(|id| (*id as usize) < top);
            self.free.shrink_to_fit();
        }
    }
}

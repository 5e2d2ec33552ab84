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
//! Positions nobody holds stay in their run while a later position is held (positions are
//! stable); a run's tail that nobody holds is trimmed and a run nobody holds is freed. Each
//! source keeps the runs it holds spans in ([`HeldRuns`]), so its clear visits only those.

use std::cell::Cell;
use std::hash::BuildHasher;

use hashbrown::{DefaultHashBuilder, HashTable};

use super::delta::FieldValue;
use super::layer::{self, Change, DupCounts, Editor};
use super::query::Visit;
use super::residents::{merge, own_value, owner_key, Edited, Resident, ResidentSet};
use super::source::table_bytes;
use super::PodId;
use crate::medium::MediaSet;

/// Longest run: positions fit a `u16`, and a run's span list stays short to scan.
pub(crate) const MAX_RUN: usize = 256;

/// Where a chain block sits: its node and its position in the node's run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Spot {
    node: u32,
    pos: u32,
}

/// The locator's flag, in a spot's position, for a chain start ([`Locator::starts`]).
const START: u32 = 1 << 31;

/// Starts there may always be a table of, whatever the number of blocks.
const FEW_STARTS: usize = 4096;

impl Spot {
    /// The spot as the locator keeps a chain start.
    fn flagged(self) -> Spot {
        Spot {
            pos: self.pos | START,
            ..self
        }
    }

    fn is_flagged(self) -> bool {
        self.pos & START != 0
    }

    /// The spot without the locator's flag.
    fn unflagged(self) -> Spot {
        Spot {
            pos: self.pos & !START,
            ..self
        }
    }

    /// The spot at position `pos` of node `node` (as [`Self::parts`] gave them).
    pub(crate) fn from_parts(node: u32, pos: u32) -> Spot {
        Spot { node, pos }
    }

    /// The node and the position: what a source keeps to find its block again.
    pub(crate) fn parts(self) -> (u32, u32) {
        (self.node, self.pos)
    }
}

/// One resident over positions `from..=to` of a node.
#[derive(Debug, Clone, Copy)]
struct Span {
    resident: Resident,
    from: u16,
    to: u16,
}

impl Span {
    fn covers(&self, pos: u16) -> bool {
        self.from <= pos && pos <= self.to
    }

    fn is(&self, pod: u32, rank: u8) -> bool {
        self.resident.pod() == pod && self.resident.rank() == rank
    }

    /// The pieces of the span before and after `pos` (a position it covers), if any.
    fn around(&self, pos: u16) -> (Option<Span>, Option<Span>) {
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
struct Node {
    /// Each position's chain hash: what a query reads, position after position.
    chains: Vec<u64>,
    /// Each position's std (or content) hash, a function of the block's tokens as the chain
    /// hash is of its tokens and prefix: every source holding the block shares it (sources
    /// keep a spot rather than both hashes, [`super::source`]). Apart from the chain hashes,
    /// so a query's walk of a run reads half the memory.
    stds: Vec<u64>,
    /// Each position's fingerprint: the XOR of [`owner_key`] over its residents (0 when
    /// nobody holds it), kept as the spans are edited, so a query tells a block whose
    /// residents are the previous block's without a scan of the spans or any mixing.
    fps: Vec<u64>,
    /// Spans of one source never overlap.
    spans: Vec<Span>,
    /// The chain hash of the parent of the run's first block when the run is a fork (its
    /// parent ends or sits inside another run), else 0: every later block's parent is the
    /// block before it, or it is a chain start ([`ChainRuns::parent_at`]).
    parent: u64,
}

impl Node {
    /// XORs `resident`'s owner key into the fingerprints of positions `from..=to`: once as it
    /// comes, once as it goes.
    #[inline]
    fn flip(&mut self, resident: &Resident, from: u16, to: u16) {
        let flipped = xor_key(&mut self.fps, resident, from, to);
        debug_assert!(flipped, "a span past its run");
    }

    /// Every position's fingerprint as the spans give it (the XOR of its residents' keys),
    /// in one pass over the spans: what [`Self::fps`] must equal. `None` when a span reaches
    /// past the run.
    fn fingerprints_from_spans(&self) -> Option<Vec<u64>> {
        let mut fps = vec![0u64; self.fps.len()];
        (self.spans.iter())
            .all(|s| xor_key(&mut fps, &s.resident, s.from, s.to))
            .then_some(fps)
    }

    /// Whether [`Self::fps`] is what the spans give.
    fn fingerprints_in_step(&self) -> bool {
        self.fingerprints_from_spans().as_ref() == Some(&self.fps)
    }

    fn held(&self, pos: u16) -> bool {
        self.spans.iter().any(|s| s.covers(pos))
    }

    /// The residents at `pos`.
    fn residents_at(&self, pos: u16) -> impl Iterator<Item = &Resident> + '_ {
        (self.spans.iter())
            .filter(move |s| s.covers(pos))
            .map(|s| &s.resident)
    }
}

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

/// Chain hash → spot of every chain block, and the table of chain starts among them.
///
/// The table keeps spots alone, 8 bytes a slot where a map would keep the 8-byte chain hash
/// beside each: the hash of a slot is the one its run keeps at the spot. A probe reads it
/// for a candidate slot (mostly the block looked for, whose run the caller reads next
/// anyway; another block's only on a 7-bit tag match), and growing the table reads it for
/// every slot. Every method that reads hashes takes the nodes; a spot stays in the table
/// exactly while its run keeps a position there ([`ChainRuns::release`]).
#[derive(Debug, Default)]
struct Locator {
    spots: HashTable<Spot>,
    hasher: DefaultHashBuilder,
    /// The chain blocks placed with no parent here (chain starts, and blocks restored with
    /// their parent unknown), flagged in the locator ([`START`]): a prompt's first block is
    /// a chain start, so a query that misses (a new prompt) is answered from this table,
    /// which is small and stays in cache, instead of a probe of the locator, which mostly
    /// does not ([`Locator::start_spot`]); Dynamo's tree answers it from its root's children
    /// alike. Kept only while starts are few next to the blocks ([`Locator::settle`]):
    /// where most blocks are starts (chains one block long, a warm start from a checkpoint
    /// without parents) it would be a second locator.
    starts: Option<hashbrown::HashSet<u64>>,
    /// Locator entries flagged as starts.
    flagged: usize,
}

/// The chain hash the runs keep at `spot` (flagged or not), 0 past their end: what a
/// locator slot is keyed by.
fn chain_at(nodes: &[Node], spot: Spot) -> u64 {
    let Spot { node, pos } = spot.unflagged();
    let chain = (nodes.get(node as usize)).and_then(|n| n.chains.get(pos as usize));
    debug_assert!(chain.is_some(), "a locator slot past its run");
    chain.copied().unwrap_or(0)
}

impl Locator {
    /// The slot of chain block `hash`, flagged if it is a start. Not inlined: the probe
    /// inlined into [`ChainRuns::find`] made every call of it save more registers, though
    /// most calls find the block beside the last one without a probe.
    #[inline(never)]
    fn slot(&self, hash: u64, nodes: &[Node]) -> Option<Spot> {
        let found = (self.spots).find(self.hasher.hash_one(hash), |s| chain_at(nodes, *s) == hash);
        found.copied()
    }

    /// The spot of chain block `hash`.
    fn spot(&self, hash: u64, nodes: &[Node]) -> Option<Spot> {
        self.slot(hash, nodes).map(Spot::unflagged)
    }

    /// Puts new chain block `hash`, which `nodes` keep at `spot` already; a `start` is
    /// flagged and goes in the table.
    fn insert(&mut self, hash: u64, spot: Spot, start: bool, nodes: &[Node]) {
        let Locator { spots, hasher, .. } = self;
        let slot = if start { spot.flagged() } else { spot };
        let rehash = |s: &Spot| hasher.hash_one(chain_at(nodes, *s));
        spots.insert_unique(hasher.hash_one(hash), slot, rehash);
        if !start {
            return;
        }
        self.flagged += 1;
        if let Some(starts) = &mut self.starts {
            starts.insert(hash);
        }
        self.settle(nodes);
    }

    /// Takes chain block `hash` at `spot` out, and out of the starts if it is one. Matched
    /// by the spot, not by the hash its run keeps there: the caller is taking the position.
    fn remove(&mut self, hash: u64, spot: Spot) {
        let found = (self.spots).find_entry(self.hasher.hash_one(hash), |s| s.unflagged() == spot);
        let Ok(entry) = found else {
            return;
        };
        let (slot, _) = entry.remove();
        if slot.is_flagged() {
            self.flagged -= 1;
            if let Some(starts) = &mut self.starts {
                starts.remove(&hash);
            }
        }
    }

    /// The spot of chain block `hash` when it is a start: one probe of the spots, none
    /// when the table of starts (while there is one) does not have it.
    fn start_spot(&self, hash: u64, nodes: &[Node]) -> Option<Spot> {
        if (self.starts.as_ref()).is_some_and(|starts| !starts.contains(&hash)) {
            return None;
        }
        let slot = self.slot(hash, nodes).filter(|slot| slot.is_flagged())?;
        Some(slot.unflagged())
    }

    /// Keeps the table of starts while they are few next to the blocks (a quarter at
    /// most, or [`FEW_STARTS`]), and builds it again from the flags once they are an
    /// eighth: apart, so an index near the line does not build it again and again.
    fn settle(&mut self, nodes: &[Node]) {
        let (flagged, blocks) = (self.flagged, self.len());
        match self.starts {
            Some(_) if flagged > FEW_STARTS && flagged * 4 > blocks => self.starts = None,
            None if flagged <= FEW_STARTS || flagged * 8 <= blocks => {
                let starts = (self.spots.iter())
                    .filter(|slot| slot.is_flagged())
                    .map(|slot| chain_at(nodes, *slot));
                self.starts = Some(starts.collect());
            }
            _ => {}
        }
    }

    /// Gives back memory once the tables are a quarter full or less.
    fn shrink(&mut self, nodes: &[Node]) {
        let capacity = self.spots.capacity();
        if capacity > 1024 && self.spots.len() * 4 < capacity {
            let hasher = &self.hasher;
            (self.spots).shrink_to_fit(|s| hasher.hash_one(chain_at(nodes, *s)));
        }
        if let Some(starts) = &mut self.starts {
            if starts.capacity() > 1024 && starts.len() * 4 < starts.capacity() {
                starts.shrink_to_fit();
            }
        }
        self.settle(nodes);
    }

    /// Chain blocks in the table.
    fn len(&self) -> usize {
        self.spots.len()
    }

    /// Estimated heap bytes.
    fn heap_bytes(&self) -> usize {
        let starts = self.starts.as_ref().map_or(0, |s| s.capacity());
        table_bytes::<Spot, ()>(self.spots.capacity()) + table_bytes::<u64, ()>(starts)
    }
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
struct SpanHint {
    node: u32,
    pod: u32,
    rank: u8,
    at: usize,
    lone: Option<bool>,
}

/// The runs one source holds spans in, so a source clear edits exactly those runs without
/// looking up any of its blocks (kept exact: a run leaves the set with the source's last
/// span in it, before it can be freed and its id reused).
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

/// A query's place in a run: the spot it read last and, when somebody holds it, the
/// fingerprint of its residents (nonzero).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cursor {
    spot: Spot,
    same: Option<u64>,
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

/// One chain block opened for an edit: a position of a node, seen as a [`ResidentSet`].
pub(crate) struct BlockMut<'a> {
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
    /// Where chain block `hash` sits, whether or not anybody holds it now.
    fn spot(&self, hash: u64) -> Option<Spot> {
        self.locator.spot(hash, &self.nodes)
    }

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
    /// store's loop (its one caller there): out of line, its prologue and epilogue were ~24
    /// instructions a block and its spills a tenth of the store's data accesses (callgrind,
    /// `profile-store8`: 2,077.6 M instructions → 1,942.2 M, data refs 816 M → 730 M,
    /// simulated cache misses equal).
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
        node.fps.push(0);
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
    /// whole run when nobody holds any of it. Every such edit releases, so a run's last
    /// position is held while anybody holds any: an edit that ends before it cannot have
    /// made it unheld, and the scan of every span that finding the tail takes is skipped.
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

    /// Whether anybody holds chain block `key`.
    pub(crate) fn contains(&self, key: u64) -> bool {
        self.held_spot(key).is_some()
    }

    /// Whether anybody holds chain block `key` when it is a chain start: a prompt's first
    /// block always is one, and a block that is no chain block here is answered by the
    /// small table of starts alone.
    pub(crate) fn starts_held(&self, key: u64) -> bool {
        (self.locator.start_spot(key, &self.nodes))
            .is_some_and(|spot| self.nodes[spot.node as usize].held(spot.pos as u16))
    }

    /// [`super::LayerReader::visit`] on chain block `key`, following the run `cursor` is in
    /// without a probe. The blocks after it whose residents stay the same are for
    /// [`Self::repeats`] to count, all at once.
    pub(crate) fn visit(
        &self,
        key: u64,
        unless: Option<u64>,
        cursor: &Cell<Option<Cursor>>,
        mut visit: impl FnMut(PodId, MediaSet, u32),
    ) -> Visit {
        let next = cursor.get().and_then(|c| {
            let spot = Spot {
                node: c.spot.node,
                pos: c.spot.pos + 1,
            };
            (self.at(spot) == Some(key)).then_some(spot)
        });
        let Some(spot) = next.or_else(|| self.spot(key)) else {
            cursor.set(None);
            return Visit::Absent;
        };
        let node = &self.nodes[spot.node as usize];
        let pos = spot.pos as u16;
        let fingerprint = node.fps.get(usize::from(pos)).copied().unwrap_or(0);
        // A fingerprint of 0 is mostly nobody (and by a 2^-64 chance somebody): it is never
        // taken for the same residents, and the spans tell.
        let same = (fingerprint != 0).then_some(fingerprint);
        cursor.set(Some(Cursor { spot, same }));
        if same.is_some() && unless == same {
            return Visit::Unchanged;
        }
        let mut held = false;
        for r in node.residents_at(pos) {
            held = true;
            visit(PodId(r.pod()), r.media(), r.stored_at);
        }
        debug_assert_eq!(
            fingerprint,
            fingerprint_at(node, pos),
            "a fingerprint out of step"
        );
        match held {
            true => Visit::Visited(fingerprint),
            false => Visit::Absent,
        }
    }

    /// How many of `next` continue the run from `cursor` at positions whose residents are
    /// the cursor's (their fingerprint is): the blocks a visit of each would answer
    /// unchanged. Comparisons of slices rather than a visit per block; the cursor moves to
    /// the last of them.
    pub(crate) fn repeats(&self, next: &[u64], cursor: &Cell<Option<Cursor>>) -> usize {
        let Some(Cursor {
            spot,
            same: same @ Some(fingerprint),
        }) = cursor.get()
        else {
            return 0;
        };
        let Some(node) = self.nodes.get(spot.node as usize) else {
            return 0;
        };
        // The positions after the cursor's with its residents (its fingerprint), then those
        // of them that are `next`'s blocks.
        let after = spot.pos as usize + 1;
        let fps = node.fps.get(after..).unwrap_or_default();
        let fps = &fps[..fps.len().min(next.len())];
        let stable = fps.iter().take_while(|fp| **fp == fingerprint).count();
        let Some(run) = (node.chains).get(after..after + stable) else {
            return 0;
        };
        let repeats = common_prefix(run, next);
        let spot = Spot {
            pos: spot.pos + repeats as u32,
            ..spot
        };
        cursor.set(Some(Cursor { spot, same }));
        repeats
    }

    /// Calls `visit` with the residents of every held chain block, in no order.
    pub(crate) fn for_each_block(&self, mut visit: impl FnMut(&[Resident])) {
        let mut residents = Vec::new();
        for node in &self.nodes {
            for pos in 0..node.chains.len() as u16 {
                residents.clear();
                residents.extend(node.residents_at(pos).copied());
                if !residents.is_empty() {
                    visit(&residents);
                }
            }
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
        self.locator.spots.capacity()
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
                (n.chains.capacity() + n.stds.capacity() + n.fps.capacity()) * 8
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

/// How many leading hashes `a` and `b` have in common: four at a time (compared without a
/// branch each) while they agree, then one by one.
fn common_prefix(a: &[u64], b: &[u64]) -> usize {
    let wide = (a.chunks_exact(4).zip(b.chunks_exact(4)))
        .take_while(|(a, b)| a == b)
        .count()
        * 4;
    let narrow = (a[wide..].iter().zip(&b[wide..]))
        .take_while(|(a, b)| a == b)
        .count();
    wide + narrow
}

/// XORs `resident`'s owner key into `fps[from..=to]`; `false`, with nothing changed, when
/// the positions are past `fps`.
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
fn fingerprint_at(node: &Node, pos: u16) -> u64 {
    node.residents_at(pos).fold(0, |fp, r| fp ^ owner_key(r))
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
                // Spans of one source do not overlap: the source's next one, if any, is
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

impl Node {
    /// Where spans of `(pod, rank)` starting at `from` or later begin, in span order.
    fn seek(&self, pod: u32, rank: u8, from: u16) -> usize {
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
    fn lone(&self, pod: u32, rank: u8) -> bool {
        let group = self.pod_spans(pod);
        let only_ours = |s: Option<&Span>| s.is_none_or(|s| s.resident.rank() == rank);
        only_ours(group.first()) && only_ours(group.last())
    }

    /// The value at `pos` of `pod`'s DP ranks other than `rank` (`None` when none holds it).
    fn other_ranks(&self, pod: u32, rank: u8, pos: u16) -> Option<FieldValue> {
        (self.pod_spans(pod).iter())
            .filter(|s| s.resident.rank() != rank && s.covers(pos))
            .fold(None, |v, s| merge(v, own_value(&s.resident)))
    }

    /// Puts `span` of a source that holds none of its positions, merged with the source's
    /// spans right before and after it that hold the same resident (as [`BlockMut::push`]
    /// merges them); gives where the span it joined (or is) sits, or `None`, with nothing
    /// changed, when the source holds any of them. `before` may say where the source's span
    /// right before it sits ([`Self::seek_after`]).
    fn add_span(&mut self, span: Span, before: Option<usize>) -> Option<usize> {
        let (pod, rank) = (span.resident.pod(), span.resident.rank());
        let at = self.seek_after(before, pod, rank, span.from);
        let spans = &mut self.spans;
        // The source's spans do not overlap and sit in position order: only the one before
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
    /// values ([`Editor::pod_values`]).
    fn count_values(
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
    fn covering(&self, pod: u32, rank: u8, from: u16, to: u16) -> std::ops::Range<usize> {
        let at = self.seek(pod, rank, from);
        let first = match at.checked_sub(1) {
            Some(i) if self.spans[i].is(pod, rank) && self.spans[i].to >= from => i,
            _ => at,
        };
        let len = (self.spans[first..]).partition_point(|s| s.is(pod, rank) && s.from <= to);
        first..first + len
    }

    /// Whether `(pod, rank)` holds any position of the run.
    fn has(&self, pod: u32, rank: u8) -> bool {
        (self.spans.get(self.seek(pod, rank, 0))).is_some_and(|s| s.is(pod, rank))
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
                self.node.flip(&old, pos, pos);
                self.node.flip(&new, pos, pos);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::medium::Medium;
    use hashbrown::HashMap;

    fn who(pod: u32, now: u32) -> Editor {
        Editor {
            pod,
            rank: 0,
            now,
            pod_values: true,
            sole: false,
        }
    }

    fn gpu() -> MediaSet {
        MediaSet::single(Medium::GPU)
    }

    /// Stores chain blocks `keys` for `pod`, each after the one before, on GPU at second 10.
    fn store_chain(
        runs: &mut ChainRuns,
        edited: (&mut DupCounts, &mut HeldRuns),
        pod: u32,
        keys: std::ops::RangeInclusive<u64>,
    ) {
        let (dups, held) = edited;
        let mut parent = 0;
        for key in keys {
            runs.add_media(
                (parent, false),
                (dups, held),
                (key, !key),
                who(pod, 10),
                gpu(),
                true,
            );
            parent = key;
        }
    }

    fn pods_at(runs: &ChainRuns, key: u64) -> Vec<u32> {
        let mut pods = Vec::new();
        let cursor = Cell::new(None);
        runs.visit(key, None, &cursor, |pod, _, _| pods.push(pod.0));
        pods.sort();
        pods
    }

    /// One edit of the equivalence test below.
    #[derive(Debug, Clone)]
    enum Op {
        Run {
            source: (u32, u8),
            first: u64,
            last: u64,
            media: u8,
            new_copy: bool,
            now: u32,
        },
        Add {
            source: (u32, u8),
            key: u64,
            after_previous: bool,
            alone: bool,
            media: u8,
            new_copy: bool,
            now: u32,
        },
        Drop {
            source: (u32, u8),
            key: u64,
            media: u8,
            slot_gone: bool,
        },
        Clear {
            source: (u32, u8),
        },
        /// A source's one copy of each of a run's blocks removed by one event, in one span
        /// edit per stretch ([`ChainRuns::drop_copies`]); the blocks it holds otherwise (or
        /// not at all) as single drops.
        DropRun {
            source: (u32, u8),
            first: u64,
            last: u64,
        },
        /// A run stored as one event's new first copies: placed block by block, its spans
        /// edited once per stretch ([`ChainRuns::add_first_copies`]).
        Stretch {
            source: (u32, u8),
            first: u64,
            last: u64,
            media: u8,
            now: u32,
        },
    }

    fn media_of(bits: u8) -> MediaSet {
        let mut media = MediaSet::EMPTY;
        for (i, name) in ["GPU", "CPU", "DISK"].iter().enumerate() {
            if bits & (1 << i) != 0 {
                media.insert(Medium::intern(name));
            }
        }
        media
    }

    /// The editor of `source` at `now` for the block map, which always looks for the pod's
    /// other DP ranks, and for the runs, which skip that for a pod with one rank
    /// ([`Editor::sole`]: pod 2 has one in [`gen_op`]'s sources).
    fn editors(source: (u32, u8), now: u32) -> (Editor, Editor) {
        let who = Editor {
            rank: source.1,
            ..who(source.0, now)
        };
        (
            who,
            Editor {
                sole: source.0 == 2,
                ..who
            },
        )
    }

    fn gen_op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        // Pod 2 has one DP rank only ([`sole`]); pods 0 and 1 have two.
        let source =
            (0u32..3, 0u8..2).prop_map(|(pod, rank)| (pod, if pod == 2 { 0 } else { rank }));
        prop_oneof![
            6 => (source.clone(), 1u64..16, any::<bool>(), any::<bool>(), 1u8..8, any::<bool>(), 0u32..3)
                .prop_map(|(source, key, after_previous, alone, media, new_copy, now)| Op::Add {
                    source, key, after_previous, alone, media, new_copy, now,
                }),
            3 => (source.clone(), 1u64..16, 1u8..8, any::<bool>())
                .prop_map(|(source, key, media, slot_gone)| Op::Drop {
                    source, key, media, slot_gone,
                }),
            1 => source.clone().prop_map(|source| Op::Clear { source }),
            // A source storing a run of blocks in order, as engines do (again, mostly).
            2 => (source.clone(), 1u64..16, 1u64..8, 1u8..8, any::<bool>(), 0u32..3).prop_map(
                |(source, first, len, media, new_copy, now)| {
                    Op::Run { source, first, last: (first + len).min(15), media, new_copy, now }
                },
            ),
            2 => (source.clone(), 1u64..16, 1u64..8, 1u8..8, 0u32..3).prop_map(
                |(source, first, len, media, now)| {
                    Op::Stretch { source, first, last: (first + len).min(15), media, now }
                },
            ),
            2 => (source, 1u64..16, 0u64..8, any::<bool>()).prop_map(|(source, first, len, down)| {
                let last = (first + len).min(15);
                // Deepest first, as engines remove, or in order.
                let (first, last) = if down { (last, first) } else { (first, last) };
                Op::DropRun { source, first, last }
            }),
        ]
    }

    /// The adds of a run, block after block; other ops as they are.
    fn expand(op: Op) -> Vec<Op> {
        match op {
            Op::Run {
                source,
                first,
                last,
                media,
                new_copy,
                now,
            } => (first..=last)
                .map(|key| Op::Add {
                    source,
                    key,
                    after_previous: key > first,
                    alone: false,
                    media,
                    new_copy,
                    now,
                })
                .collect(),
            op => vec![op],
        }
    }

    /// The residents of every block, sorted, as the block map holds them.
    fn map_residents(map: &layer::LayerMap<u64>) -> Vec<(u64, Vec<Resident>)> {
        let mut all: Vec<_> = (map.iter())
            .map(|e| (*e.key(), sorted(e.value().as_slice().to_vec())))
            .collect();
        all.sort_by_key(|(k, _)| *k);
        all
    }

    /// The same as the runs hold them; checks the span order on the way (by source, then
    /// position, a source's spans apart and not touching with the same resident).
    fn run_residents(runs: &ChainRuns) -> Vec<(u64, Vec<Resident>)> {
        for node in &runs.nodes {
            // Every position is in the locator, at that position.
            assert_eq!(
                node.chains.len(),
                node.stds.len(),
                "a position without its std"
            );
            // Every position's fingerprint is its residents' now.
            assert_eq!(
                node.fingerprints_from_spans().as_ref(),
                Some(&node.fps),
                "fingerprints out of step with the spans"
            );
            for (pos, hash) in node.chains.iter().enumerate() {
                let spot = runs
                    .locator
                    .spot(*hash, &runs.nodes)
                    .map(|s| (s.node, s.pos));
                let here = runs.nodes.iter().position(|n| std::ptr::eq(n, node));
                assert_eq!(
                    spot,
                    here.map(|n| (n as u32, pos as u32)),
                    "{hash} misplaced"
                );
            }
            // No run keeps a tail nobody holds (`ChainRuns::release` relies on it).
            if let Some(last) = node.chains.len().checked_sub(1) {
                assert!(node.held(last as u16), "a tail nobody holds kept");
            }
            for pair in node.spans.windows(2) {
                let [a, b] = pair else { continue };
                let key = |s: &Span| (s.resident.pod(), s.resident.rank(), s.from);
                assert!(key(a) < key(b), "spans out of order: {a:?} {b:?}");
                if a.is(b.resident.pod(), b.resident.rank()) {
                    assert!(a.to < b.from, "spans overlap: {a:?} {b:?}");
                    let touching = a.to + 1 == b.from;
                    assert!(
                        !touching || a.resident != b.resident,
                        "unmerged: {a:?} {b:?}"
                    );
                }
            }
        }
        let locator = &runs.locator;
        let flagged: Vec<u64> = (locator.spots.iter())
            .filter(|slot| slot.is_flagged())
            .map(|slot| chain_at(&runs.nodes, *slot))
            .collect();
        assert_eq!(locator.flagged, flagged.len(), "starts miscounted");
        if let Some(starts) = &locator.starts {
            assert_eq!(starts.len(), flagged.len(), "a start not in the table");
            assert!(
                flagged.iter().all(|h| starts.contains(h)),
                "a start not in the table"
            );
        }
        let mut all = Vec::new();
        for spot in &runs.locator.spots {
            let key = &chain_at(&runs.nodes, *spot);
            let node = &runs.nodes[spot.node as usize];
            let residents: Vec<Resident> = node
                .residents_at(spot.unflagged().pos as u16)
                .copied()
                .collect();
            if !residents.is_empty() {
                all.push((*key, sorted(residents)));
            }
        }
        all.sort_by_key(|(k, _)| *k);
        all
    }

    fn sorted(mut residents: Vec<Resident>) -> Vec<Resident> {
        residents.sort_by_key(|r| (r.pod(), r.rank()));
        residents
    }

    #[test]
    fn common_prefixes_are_counted_across_and_within_groups_of_four() {
        let a: Vec<u64> = (1..=11).collect();
        for len in 0..=11 {
            for differ in 0..=len {
                let mut b = a[..len].to_vec();
                if differ < len {
                    b[differ] = 0;
                }
                assert_eq!(common_prefix(&a, &b), differ, "{len} {differ}");
                assert_eq!(common_prefix(&b, &a), differ, "{len} {differ}");
            }
        }
    }

    #[test]
    fn the_table_of_starts_is_kept_only_while_starts_are_few() {
        let starts = FEW_STARTS as u64 + 1;
        // Block `i` (chain hash `i + 1`) at position `i % 256` of node `i / 256`.
        let nodes: Vec<Node> = (0..starts * 8)
            .collect::<Vec<u64>>()
            .chunks(256)
            .map(|ids| Node {
                chains: ids.iter().map(|i| i + 1).collect(),
                ..Node::default()
            })
            .collect();
        let spot = |i: u64| Spot {
            node: (i / 256) as u32,
            pos: (i % 256) as u32,
        };
        let mut locator = Locator::default();
        for i in 0..starts {
            locator.insert(i + 1, spot(i), true, &nodes);
        }
        // Every block a start: a table would be a second locator.
        assert!(locator.starts.is_none());
        let known = |l: &Locator, i: u64| l.start_spot(i + 1, &nodes) == Some(spot(i));
        assert!((0..starts).all(|i| known(&locator, i)));
        // Blocks inside chains until starts are an eighth: the table is built again.
        for i in starts..starts * 8 {
            locator.insert(i + 1, spot(i), false, &nodes);
        }
        locator.shrink(&nodes);
        assert_eq!(
            locator.starts.as_ref().map(|s| s.len()),
            Some(starts as usize)
        );
        assert!((0..starts).all(|i| known(&locator, i)));
        let inside = starts + 1;
        assert!(locator.start_spot(inside, &nodes).is_none());
        assert_eq!(locator.spot(inside, &nodes), Some(spot(starts)));
        for i in 0..starts {
            locator.remove(i + 1, spot(i));
        }
        assert_eq!(locator.flagged, 0);
        assert_eq!(locator.starts.as_ref().map(|s| s.len()), Some(0));
        assert!(locator.start_spot(1, &nodes).is_none() && locator.spot(1, &nodes).is_none());
        assert_eq!(locator.len(), (starts * 7) as usize);
    }

    #[test]
    fn the_locator_finds_blocks_by_the_hash_their_run_keeps_as_the_table_grows_and_shrinks() {
        // Enough blocks to grow the table many times, then most taken out and the table
        // shrunk: every block left is found at its spot, every one taken out is not.
        let blocks = 20_000u64;
        let nodes: Vec<Node> = (0..blocks)
            .collect::<Vec<u64>>()
            .chunks(MAX_RUN)
            .map(|ids| Node {
                chains: ids.iter().map(|i| crate::hash::mix64(i + 1)).collect(),
                ..Node::default()
            })
            .collect();
        let spot =
            |i: u64| Spot::from_parts((i / MAX_RUN as u64) as u32, (i % MAX_RUN as u64) as u32);
        let chain = |i: u64| crate::hash::mix64(i + 1);
        let mut locator = Locator::default();
        for i in 0..blocks {
            locator.insert(chain(i), spot(i), i % 100 == 0, &nodes);
        }
        assert!((0..blocks).all(|i| locator.spot(chain(i), &nodes) == Some(spot(i))));
        let before = locator.heap_bytes();
        for i in (0..blocks).filter(|i| i % 10 != 0) {
            locator.remove(chain(i), spot(i));
        }
        locator.shrink(&nodes);
        assert!(locator.heap_bytes() < before / 4, "memory given back");
        for i in 0..blocks {
            let expected = (i % 10 == 0).then(|| spot(i));
            assert_eq!(locator.spot(chain(i), &nodes), expected, "block {i}");
        }
        assert_eq!(locator.flagged, 200);
        // A hash no run keeps is not found, whatever slot its probe meets.
        assert!((blocks..blocks * 2).all(|i| locator.spot(chain(i), &nodes).is_none()));
    }

    proptest::proptest! {
        /// Runs hold exactly what a block map of the same edits holds, block by block, and
        /// answer every edit the same (the layer rules are shared; only the storage differs).
        #[test]
        fn runs_hold_what_a_block_map_holds(ops in proptest::collection::vec(gen_op(), 1..120)) {
            let map = layer::LayerMap::<u64>::default();
            let mut runs = ChainRuns::default();
            let mut map_dups: HashMap<(u32, u8), DupCounts> = HashMap::new();
            let mut run_dups: HashMap<(u32, u8), DupCounts> = HashMap::new();
            let mut run_held: HashMap<(u32, u8), HeldRuns> = HashMap::new();
            for op in ops.into_iter().flat_map(expand) {
                match op {
                    Op::Run { .. } => unreachable!("runs are expanded into adds"),
                    Op::DropRun { source, first, last } => {
                        let (who, fast) = editors(source, 0);
                        let keys: Vec<u64> = if first <= last {
                            (first..=last).collect()
                        } else {
                            (last..=first).rev().collect()
                        };
                        let all = media_of(7);
                        let mut want = Vec::new();
                        let mut got = Vec::new();
                        let (dups, held) = (run_dups.entry(source).or_default(), run_held.entry(source).or_default());
                        let mut stretch: Option<Stretch> = None;
                        for key in keys {
                            // The source's one copy of the block, as `removed` tells it.
                            let one_copy = (map.get(&key)).is_some_and(|r| {
                                r.as_slice().iter().any(|r| (r.pod(), r.rank()) == source && r.copies() == 1)
                            }) && !dups.contains_key(&(layer::CHAIN_DUPS, key));
                            let map_dups = map_dups.entry(source).or_default();
                            let dropped = layer::drop_media(&map, map_dups, (layer::CHAIN_DUPS, key), key, who, all, true);
                            want.extend(dropped.map(|(change, _)| change));
                            match runs.spot(key).filter(|_| one_copy) {
                                Some(spot) => {
                                    if !stretch.as_mut().is_some_and(|s| s.grow_either(spot)) {
                                        if let Some(done) = stretch.replace(Stretch::at(spot)) {
                                            runs.drop_copies(held, done, fast, |c, times| got.extend(std::iter::repeat_n(c, times as usize)));
                                        }
                                    }
                                }
                                None => {
                                    if let Some(done) = stretch.take() {
                                        runs.drop_copies(held, done, fast, |c, times| got.extend(std::iter::repeat_n(c, times as usize)));
                                    }
                                    let dropped = runs.drop_media((dups, held), (key, None), fast, all, true);
                                    got.extend(dropped.map(|(change, _)| change));
                                }
                            }
                        }
                        if let Some(done) = stretch {
                            runs.drop_copies(held, done, fast, |c, times| got.extend(std::iter::repeat_n(c, times as usize)));
                        }
                        let order = |c: &Change| format!("{c:?}");
                        want.sort_by_key(order);
                        got.sort_by_key(order);
                        proptest::prop_assert_eq!(want, got);
                    }
                    Op::Stretch { source, first, last, media, now } => {
                        let (who, fast) = editors(source, now);
                        let media = media_of(media);
                        let dups = map_dups.entry(source).or_default();
                        let want: Vec<_> = (first..=last)
                            .map(|key| layer::add_media(&map, dups, (layer::CHAIN_DUPS, key), key, who, media, true))
                            .collect();
                        let (dups, held) = (run_dups.entry(source).or_default(), run_held.entry(source).or_default());
                        // Placed as an event places them: a stretch ends where the run does.
                        let mut stretches: Vec<Stretch> = Vec::new();
                        for key in first..=last {
                            let parent = if key > first { key - 1 } else { 0 };
                            let (spot, std) = runs.find_or_place(key, (parent, false), || !key);
                            proptest::prop_assert_eq!(std, !key);
                            if !stretches.last_mut().is_some_and(|s| s.grow(spot)) {
                                stretches.push(Stretch::at(spot));
                            }
                        }
                        let mut got = Vec::new();
                        for stretch in stretches {
                            let mut changes = Vec::new();
                            let added = runs.add_first_copies(held, stretch, fast, media, |change, times| {
                                changes.extend(std::iter::repeat_n((change, false), times as usize));
                            });
                            if !added {
                                proptest::prop_assert!(changes.is_empty());
                                for spot in stretch.spots() {
                                    let key = runs.at(spot).unwrap_or(0);
                                    let (change, duplicate, _) =
                                        runs.add_media((0, false), (dups, held), (key, !key), fast, media, true);
                                    changes.push((change, duplicate));
                                }
                            }
                            got.extend(changes);
                        }
                        proptest::prop_assert_eq!(want, got);
                    }
                    Op::Add { source, key, after_previous, alone, media, new_copy, now } => {
                        let (who, fast) = editors(source, now);
                        let dup_key = (layer::CHAIN_DUPS, key);
                        let parent = if after_previous { key - 1 } else { 0 };
                        let media = media_of(media);
                        let dups = map_dups.entry(source).or_default();
                        let want = layer::add_media(&map, dups, dup_key, key, who, media, new_copy);
                        let dups = run_dups.entry(source).or_default();
                        let held = run_held.entry(source).or_default();
                        let (change, duplicate, spot) =
                            runs.add_media((parent, alone), (dups, held), (key, !key), fast, media, new_copy);
                        proptest::prop_assert_eq!(want, (change, duplicate));
                        // The spot a source keeps gives both hashes back.
                        let spot = spot.map(|s| runs.hashes_at(s));
                        proptest::prop_assert_eq!(spot, Some(Some((key, !key))));
                    }
                    Op::Drop { source, key, media, slot_gone } => {
                        let (who, fast) = editors(source, 0);
                        let dup_key = (layer::CHAIN_DUPS, key);
                        let media = media_of(media);
                        let dups = map_dups.entry(source).or_default();
                        let want = layer::drop_media(&map, dups, dup_key, key, who, media, slot_gone);
                        let dups = run_dups.entry(source).or_default();
                        let held = run_held.entry(source).or_default();
                        // The caller's spot: right, stale (another block's) or none.
                        let spot = match key % 3 {
                            0 => runs.spot(key),
                            1 => Some(Spot { node: 0, pos: 0 }),
                            _ => None,
                        };
                        let got = runs.drop_media((dups, held), (key, spot), fast, media, slot_gone);
                        proptest::prop_assert_eq!(want, got);
                    }
                    Op::Clear { source } => {
                        let (who, fast) = editors(source, 0);
                        let held: Vec<u64> = (map.iter())
                            .filter(|e| e.value().as_slice().iter().any(|r| r.pod() == who.pod && r.rank() == who.rank))
                            .map(|e| *e.key())
                            .collect();
                        let mut want = Vec::new();
                        for key in &held {
                            want.extend(layer::drop_resident(&map, *key, who));
                        }
                        let mut got = Vec::new();
                        let runs_held = run_held.remove(&source).unwrap_or_default();
                        runs.drop_source(runs_held, fast, |change, times| {
                            got.extend(std::iter::repeat_n(change, times as usize));
                        });
                        let order = |c: &Change| format!("{c:?}");
                        want.sort_by_key(order);
                        got.sort_by_key(order);
                        proptest::prop_assert_eq!(want, got);
                        map_dups.remove(&source);
                        run_dups.remove(&source);
                    }
                }
                proptest::prop_assert_eq!(map_residents(&map), run_residents(&runs));
                for ((pod, rank), held) in &run_held {
                    let holds: hashbrown::HashSet<u32> = (0..runs.nodes.len() as u32)
                        .filter(|id| runs.nodes[*id as usize].has(*pod, *rank))
                        .collect();
                    proptest::prop_assert_eq!(&held.ids, &holds, "runs of {}/{}", pod, rank);
                }
                proptest::prop_assert_eq!(&map_dups, &run_dups);
            }
        }
    }

    #[test]
    fn a_block_whose_run_keeps_another_std_hash_gets_no_spot() {
        let mut runs = ChainRuns::default();
        let (mut dups, mut held) = (DupCounts::new(), HeldRuns::default());
        let edited = (&mut dups, &mut held);
        let (_, _, spot) = runs.add_media((0, true), edited, (7, 70), who(1, 10), gpu(), true);
        let spot = spot.expect("the first std hash is the run's");
        // The same chain hash with other content (a 64-bit collision): the source keeps its
        // slot whole rather than read the first block's std hash.
        let edited = (&mut dups, &mut held);
        let (_, _, other) = runs.add_media((0, true), edited, (7, 71), who(2, 10), gpu(), true);
        assert_eq!(other, None);
        assert_eq!(runs.hashes_at(spot), Some((7, 70)));
    }

    #[test]
    fn a_chain_stored_in_order_is_one_run_with_one_span_per_source() {
        let mut runs = ChainRuns::default();
        let mut dups = DupCounts::new();
        let mut held = HeldRuns::default();
        for pod in [1, 2] {
            store_chain(&mut runs, (&mut dups, &mut held), pod, 1..=100);
        }
        assert_eq!(runs.nodes.len(), 1);
        assert_eq!(runs.nodes[0].chains.len(), 100);
        assert_eq!(runs.nodes[0].spans.len(), 2);
    }

    #[test]
    fn a_mid_run_remove_keeps_the_blocks_after_it_and_merges_back_on_restore() {
        let mut runs = ChainRuns::default();
        let mut dups = DupCounts::new();
        let mut held = HeldRuns::default();
        store_chain(&mut runs, (&mut dups, &mut held), 1, 1..=10);
        assert!(runs
            .drop_media((&mut dups, &mut held), (5, None), who(1, 10), gpu(), true)
            .is_some());
        assert_eq!(pods_at(&runs, 5), Vec::<u32>::new());
        assert_eq!(pods_at(&runs, 6), vec![1]);
        assert_eq!(runs.nodes[0].spans.len(), 2);
        // The later blocks can still be removed: nothing was truncated.
        assert!(runs
            .drop_media((&mut dups, &mut held), (10, None), who(1, 10), gpu(), true)
            .is_some());
        assert_eq!(runs.len(), 9, "the tail nobody holds is trimmed");
        runs.add_media(
            (4, true),
            (&mut dups, &mut held),
            (5, !5),
            who(1, 10),
            gpu(),
            true,
        );
        assert_eq!(runs.nodes[0].spans.len(), 1, "the run is whole again");
        let mut changes = 0;
        runs.drop_source(held, who(1, 10), |(before, after), times| {
            assert!(before.is_some() && after.is_none());
            changes += times;
        });
        assert_eq!(changes, 9);
        assert_eq!((runs.len(), runs.free.len()), (0, 1));
    }

    #[test]
    fn a_query_counts_the_blocks_inside_a_span_at_once_and_sees_every_change() {
        let mut runs = ChainRuns::default();
        let mut dups = DupCounts::new();
        let mut held = HeldRuns::default();
        store_chain(&mut runs, (&mut dups, &mut held), 1, 1..=8);
        let mut held2 = HeldRuns::default();
        for key in 1..=4u64 {
            runs.add_media(
                (0, true),
                (&mut dups, &mut held2),
                (key, !key),
                who(2, 10),
                gpu(),
                true,
            );
        }
        let keys: Vec<u64> = (1..=8).collect();
        let cursor = Cell::new(None);
        let mut last = None;
        let mut seen = Vec::new();
        for key in 1..=8u64 {
            let mut pods = 0;
            let visit = runs.visit(key, last, &cursor, |_, _, _| pods += 1);
            match visit {
                Visit::Visited(f) => {
                    last = Some(f);
                    seen.push(pods);
                }
                Visit::Unchanged => seen.push(0),
                Visit::Absent => unreachable!("every block is held"),
            }
        }
        assert_eq!(seen, vec![2, 0, 0, 0, 1, 0, 0, 0]);
        // Counted at once: after block 1, blocks 2-4 keep its two pods; after 5, 6-8 its one.
        let cursor = Cell::new(None);
        let mut counted = Vec::new();
        let mut at = 0;
        while at < keys.len() {
            let mut pods = 0;
            runs.visit(keys[at], None, &cursor, |_, _, _| pods += 1);
            let repeats = runs.repeats(&keys[at + 1..], &cursor);
            counted.push((pods, repeats));
            at += repeats + 1;
        }
        assert_eq!(counted, vec![(2, 3), (1, 3)]);
    }
}

//! kthena's longest-prefix score, tier-weighted.
//!
//! A pod scores only if it holds block 0, and keeps matching while it holds every block so
//! far. Its score is `int((Σ weight / total_blocks) * 100)` with kthena's float order
//! (divide first, then multiply, then truncate toward zero), where the weight of a block is
//! that of the pod's best medium for it and `total_blocks` is the prompt's block count.
//!
//! kthena's float order matters: 29 of 100 blocks scores `int(0.29 * 100)` = 28 there, not
//! 29, and a router reading the same Redis must see the same number as this scorer.

use serde::Serialize;

use super::lookup::{Candidates, IndexLookup, Lookup, Owners};
use super::prompt::MatchMode;
use super::speculative::{Placed, WithPlaced};
use crate::hash::StdHash;
use crate::index::Index;
use crate::medium::TierWeights;

/// kthena's integer score for a weighted match of `weighted_sum` over `total_blocks`.
pub fn kthena_score(weighted_sum: f64, total_blocks: usize) -> u32 {
    if total_blocks == 0 {
        return 0;
    }
    // `as` truncates toward zero and saturates, like Go's int() on these values.
    ((weighted_sum / total_blocks as f64) * 100.0) as u32
}

/// One candidate's result, by its position in the candidate list.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlotScore {
    /// Position of the pod in the candidate list.
    pub candidate: usize,
    /// Integer score 0..=100.
    pub score: u32,
    /// Length of the matched prefix, in blocks.
    pub matched_blocks: u32,
    /// Σ of the tier weights of the matched blocks.
    pub weighted_sum: f64,
}

impl SlotScore {
    /// The score of `candidate` for `matched` blocks of weight `sum` out of `total`.
    fn new(candidate: usize, matched: u32, sum: f64, total: usize) -> SlotScore {
        SlotScore {
            candidate,
            score: kthena_score(sum, total),
            matched_blocks: matched,
            weighted_sum: sum,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Track {
    /// Blocks matched so far; the pod is still matching at block i iff `matched == i`.
    matched: u32,
    /// Block index + 1 of the last block the pod was reported for.
    stamp: u32,
    sum: f64,
    /// Best weight and latest write of the current block over the pod's reports.
    best: f64,
    latest: Option<u64>,
    unknown_time: bool,
}

const FRESH_TRACK: Track = Track {
    matched: 0,
    stamp: 0,
    sum: 0.0,
    best: 0.0,
    latest: None,
    unknown_time: false,
};

/// Scores `candidates` candidates over the blocks `lookup` answers for.
///
/// `started_at` is empty (no freshness rule) or holds one entry per candidate: the unix
/// second the pod's engine started, when known. An owner whose write time is ≤ that start
/// was written by an earlier life of the engine and is dropped, as kthena's router does.
///
/// Returns only the candidates that hold block 0, in candidate order.
pub fn score_prefix<L: Lookup>(
    lookup: &mut L,
    candidates: usize,
    started_at: &[Option<u64>],
) -> Vec<SlotScore> {
    let total = lookup.blocks();
    if started_at.iter().all(Option::is_none) {
        return score_without_freshness(lookup, candidates, total);
    }
    let mut tracks = vec![FRESH_TRACK; candidates];
    let mut touched: Vec<u32> = Vec::with_capacity(candidates.min(64));
    let mut alive = candidates;
    for block in 0..total {
        if alive == 0 {
            break;
        }
        let at = block as u32;
        let stamp = at + 1;
        touched.clear();
        lookup.for_each_owner(block, |owner| {
            let Some(t) = tracks.get_mut(owner.candidate) else {
                return;
            };
            if t.stamp == stamp {
                t.best = t.best.max(owner.weight);
                merge_time(t, owner.written_at);
            } else if t.matched == at {
                t.stamp = stamp;
                t.best = owner.weight;
                t.latest = None;
                t.unknown_time = false;
                merge_time(t, owner.written_at);
                touched.push(owner.candidate as u32);
            }
        });
        alive = 0;
        for &c in &touched {
            let t = &mut tracks[c as usize];
            let start = started_at.get(c as usize).copied().flatten();
            let stale = match (start, t.latest) {
                (Some(start), Some(latest)) => !t.unknown_time && latest <= start,
                _ => false,
            };
            if !stale {
                t.matched += 1;
                t.sum += t.best;
                alive += 1;
            }
        }
    }
    slot_scores(tracks.iter().map(|t| (t.matched, t.sum)), total)
}

/// The common path: no freshness rule, so a report can be counted the moment it is seen
/// (a later report of the same pod for the same block can only raise the block's weight).
///
/// The candidates are counted as bits of words (candidate c is bit c % 64 of word c / 64):
/// a visited block sets the bit of each candidate reported for it; the candidates that
/// matched the block before and are not set stop there, found with one mask per word, and a
/// run of blocks with the same owners on the same media (the backend answers
/// [`Owners::Repeat`], or counts them ahead with [`Lookup::repeats_after`]) changes nobody.
/// A candidate whose weights were all 1.0 so far has matched as many blocks as its sum
/// says, so only a candidate with another weight keeps a sum of its own ([`Tally`]).
fn score_without_freshness<L: Lookup>(
    lookup: &mut L,
    candidates: usize,
    total: usize,
) -> Vec<SlotScore> {
    // The common candidate list (a model's pods) fits one word: its bits and tallies are
    // then on the stack, and no word index is checked against a length.
    if candidates <= WORD {
        let tallies = [Tally::default(); WORD];
        return count_words(lookup, total, [Word::default()], candidates, tallies);
    }
    let words = vec![Word::default(); candidates.div_ceil(WORD)];
    let tallies = vec![Tally::default(); candidates];
    count_words(lookup, total, words, candidates, tallies)
}

/// Candidates per [`Word`].
const WORD: usize = 64;

/// The sets of [`count_words`] for 64 candidates: candidate c is bit c % 64 of word c / 64.
#[derive(Debug, Clone, Copy, Default)]
struct Word {
    /// Held block 0: these are scored.
    first: u64,
    /// Matched every block so far.
    matching: u64,
    /// Keep a sum of their own in their [`Tally`] (a weight other than 1.0 so far).
    heavy: u64,
    /// Reported for the block being visited.
    seen: u64,
}

/// [`score_without_freshness`] over `candidates` candidates, with `words` (all empty) for
/// them and a tally for each.
///
/// The sets and tallies stay behind their own types up to where they are used: the visits'
/// closure is a function of its own, and a `[Word; 1]` there is one word whose index needs
/// no check, where a slice would carry a length to check against.
fn count_words<L: Lookup, W: AsMut<[Word]>, T: AsMut<[Tally]>>(
    lookup: &mut L,
    total: usize,
    mut words: W,
    candidates: usize,
    mut tallies: T,
) -> Vec<SlotScore> {
    // Before block 0, every candidate is still matching.
    for (w, word) in words.as_mut().iter_mut().enumerate() {
        word.matching = match candidates - w * WORD {
            n if n >= WORD => u64::MAX,
            n => (1u64 << n) - 1,
        };
    }
    let mut block = 0;
    while block < total {
        let at = block as u32;
        let answer = lookup.for_each_owner_or_repeat(block, |owner| {
            let c = owner.candidate;
            let Some(word) = words.as_mut().get_mut(c / WORD) else {
                return;
            };
            let bit = 1u64 << (c % WORD);
            if word.matching & bit == 0 {
                return;
            }
            let kept = word.heavy & bit != 0;
            if owner.weight != 1.0 || kept {
                let tally = &mut tallies.as_mut()[c];
                if tally.weigh(kept, word.seen & bit != 0, at, owner.weight) {
                    word.heavy |= bit;
                }
            }
            word.seen |= bit;
        });
        if answer == Owners::Visited {
            let (mut any, tallies) = (0, tallies.as_mut());
            for (w, word) in words.as_mut().iter_mut().enumerate() {
                if at == 0 {
                    word.first = word.seen;
                }
                stop(w, word.matching & !word.seen, at, word.heavy, tallies);
                word.matching = std::mem::take(&mut word.seen);
                any |= word.matching;
            }
            if any == 0 {
                break;
            }
        }
        // Still matching: the blocks the backend knows repeat this one change nobody.
        block += lookup.repeats_after(block) + 1;
    }
    let (words, tallies) = (words.as_mut(), tallies.as_mut());
    for (w, word) in words.iter().enumerate() {
        stop(w, word.matching, block as u32, word.heavy, tallies);
    }
    let scored = words.iter().map(|w| w.first.count_ones() as usize).sum();
    let mut scores = Vec::with_capacity(scored);
    for (w, word) in words.iter().enumerate() {
        for b in bits(word.first) {
            let tally = &tallies[w * WORD + b];
            let sum = match word.heavy & (1 << b) {
                0 => f64::from(tally.matched),
                _ => tally.sum,
            };
            scores.push(SlotScore::new(w * WORD + b, tally.matched, sum, total));
        }
    }
    scores
}

/// The candidates of bits `who` of word `w` in [`count_words`] matched the blocks before
/// `at` and no more; those of them in `heavy` have their sums brought up to `at`.
fn stop(w: usize, who: u64, at: u32, heavy: u64, tallies: &mut [Tally]) {
    for b in bits(who) {
        let tally = &mut tallies[w * WORD + b];
        tally.matched = at;
        if heavy & (1 << b) != 0 {
            tally.settle(at);
        }
    }
}

/// The set bits of `mask`, lowest first.
fn bits(mut mask: u64) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        let bit = (mask != 0).then(|| mask.trailing_zeros() as usize)?;
        mask &= mask - 1;
        Some(bit)
    })
}

/// A candidate of [`count_words`]: the blocks it matched, once it stopped, and its sum
/// while it has a weight other than 1.0.
#[derive(Debug, Clone, Copy, Default)]
struct Tally {
    /// Σ weight of the blocks before `since`, added one block at a time in kthena's order.
    sum: f64,
    /// The candidate's best weight for block `since` and the repeats after it.
    best: f64,
    /// The visited block the candidate was last reported for.
    since: u32,
    /// Blocks matched, set when the candidate stops (drops out or the prompt ends).
    matched: u32,
}

impl Tally {
    /// A report of weight `weight` for block `at`, `again` when the candidate was reported
    /// for it already; `kept` when this tally holds the candidate's sum. Whether it holds
    /// it now.
    fn weigh(&mut self, kept: bool, again: bool, at: u32, weight: f64) -> bool {
        match (kept, again) {
            // Another report of a block reported at 1.0: the best stays 1.0 (weights are
            // at most 1.0).
            (false, true) if weight.max(1.0) == 1.0 => return false,
            // Every weight so far was 1.0: the sum before this block is its count.
            (false, _) => {
                self.sum = f64::from(at);
                self.best = weight;
                self.since = at;
            }
            (true, true) => {
                if weight > self.best {
                    self.best = weight;
                }
            }
            (true, false) => {
                self.settle(at);
                self.best = weight;
            }
        }
        true
    }

    /// Counts the blocks from `since` up to `to` (excluded) at weight `best`.
    fn settle(&mut self, to: u32) {
        for _ in self.since..to {
            self.sum += self.best;
        }
        self.since = to;
    }
}

/// One score per candidate that matched at least block 0, from its (matched, sum) track.
fn slot_scores(tracks: impl Iterator<Item = (u32, f64)> + Clone, total: usize) -> Vec<SlotScore> {
    // Counted first: collecting a filter grows the vector several times.
    let matched = tracks.clone().filter(|(matched, _)| *matched > 0).count();
    let mut scores = Vec::with_capacity(matched);
    let scored = (tracks.enumerate())
        .filter(|(_, (matched, _))| *matched > 0)
        .map(|(candidate, (matched, sum))| SlotScore::new(candidate, matched, sum, total));
    scores.extend(scored);
    scores
}

fn merge_time(t: &mut Track, written_at: Option<u64>) {
    match written_at {
        Some(ts) => t.latest = Some(t.latest.map_or(ts, |l| l.max(ts))),
        None => t.unknown_time = true,
    }
}

/// One pod's result, by name.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PodScore {
    /// Pod identifier `{pod}.{namespace}`.
    pub pod: String,
    /// Integer score 0..=100.
    pub score: u32,
    /// Length of the matched prefix, in blocks.
    pub matched_blocks: u32,
    /// Σ of the tier weights of the matched blocks.
    pub weighted_sum: f64,
}

/// Scores of one prompt: only pods that hold block 0 appear.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PrefixScores {
    /// The prompt's block count (after the cap).
    pub total_blocks: usize,
    /// Best first: score, then matched blocks (descending), then pod identifier.
    pub scores: Vec<PodScore>,
}

impl PrefixScores {
    /// Names and orders slot scores of `candidates`.
    pub fn from_slots<S: AsRef<str>>(
        total_blocks: usize,
        candidates: &[S],
        slots: &[SlotScore],
    ) -> PrefixScores {
        let mut scores: Vec<PodScore> = slots
            .iter()
            .filter_map(|s| {
                candidates.get(s.candidate).map(|pod| PodScore {
                    pod: pod.as_ref().to_owned(),
                    score: s.score,
                    matched_blocks: s.matched_blocks,
                    weighted_sum: s.weighted_sum,
                })
            })
            .collect();
        scores.sort_by(|a, b| {
            b.score
                .cmp(&a.score)
                .then(b.matched_blocks.cmp(&a.matched_blocks))
                .then_with(|| a.pod.cmp(&b.pod))
        });
        PrefixScores {
            total_blocks,
            scores,
        }
    }

    /// The score of `pod`, if it holds block 0.
    pub fn get(&self, pod: &str) -> Option<&PodScore> {
        self.scores.iter().find(|s| s.pod == pod)
    }
}

/// Scores `candidates` for std-hash `blocks` of `model` from the in-memory index, in
/// `kthena` mode (each block by its own tokens, as kthena's router does).
pub fn score_index<S: AsRef<str>>(
    index: &Index,
    model: &str,
    blocks: &[StdHash],
    candidates: &[S],
    weights: &TierWeights,
    started_at: &[Option<u64>],
) -> PrefixScores {
    let mode = MatchMode::Kthena;
    score_index_with(index, model, blocks, candidates, weights, started_at, mode)
}

/// Scores `candidates` for `blocks` of `model` from the in-memory index in `mode`: `blocks`
/// are std hashes for `kthena`, chain hashes of `model` for `prefix` (both from
/// [`super::PromptSettings::blocks`]).
pub fn score_index_with<S: AsRef<str>>(
    index: &Index,
    model: &str,
    blocks: &[u64],
    candidates: &[S],
    weights: &TierWeights,
    started_at: &[Option<u64>],
    mode: MatchMode,
) -> PrefixScores {
    if let Some(placed) = placements(index, blocks, candidates, weights, mode) {
        let inner = IndexLookup::resolved(index, model, blocks, candidates, weights, mode);
        let slots = score_prefix(
            &mut WithPlaced::new(inner, placed),
            candidates.len(),
            started_at,
        );
        return PrefixScores::from_slots(blocks.len(), candidates, &slots);
    }
    let mut lookup = IndexLookup::with_mode(index, model, blocks, candidates, weights, mode);
    let slots = score_prefix(&mut lookup, candidates.len(), started_at);
    PrefixScores::from_slots(blocks.len(), candidates, &slots)
}

/// Blocks of the prompt's `blocks` that `pod` holds in the index itself, placements aside:
/// what kvindex predicts an engine will report reused.
pub fn confirmed_match(
    index: &Index,
    model: &str,
    blocks: &[u64],
    pod: &str,
    mode: MatchMode,
) -> u32 {
    let weights = TierWeights::default();
    let mut lookup = IndexLookup::with_mode(index, model, blocks, &[pod], &weights, mode);
    let slots = score_prefix(&mut lookup, 1, &[]);
    slots.first().map_or(0, |s| s.matched_blocks)
}

/// Routers' live placements on `candidates` of the prompt's chain `blocks`, which `prefix`
/// scoring counts ([`crate::index::Speculative`]); `None` in `kthena` mode, which is
/// kthena's content-only view, and while nothing is placed.
fn placements<S: AsRef<str>>(
    index: &Index,
    blocks: &[u64],
    candidates: &[S],
    weights: &TierWeights,
    mode: MatchMode,
) -> Option<Placed> {
    if mode != MatchMode::Prefix || index.speculative().is_empty() {
        return None;
    }
    let pods: Vec<Option<u32>> = (index.pod_ids(candidates).into_iter())
        .map(|id| id.map(|p| p.0))
        .collect();
    Placed::of(index, &pods, blocks, weights)
}

/// Scores `candidates` (resolved beforehand, so a router that keeps its pod list pays no
/// name lookups per query) for `blocks` of `model` from the in-memory index in `mode`.
/// Returns only the candidates that hold block 0, in candidate order, unnamed. In `prefix`
/// mode `blocks` start at the prompt's first block: hashes starting inside a chain score
/// nobody.
pub fn score_candidates(
    index: &Index,
    model: &str,
    blocks: &[u64],
    candidates: &Candidates,
    weights: &TierWeights,
    started_at: &[Option<u64>],
    mode: MatchMode,
) -> Vec<SlotScore> {
    if let Some(placed) = placements(index, blocks, candidates.names(), weights, mode) {
        let names = candidates.names();
        let inner = IndexLookup::resolved(index, model, blocks, names, weights, mode);
        return score_prefix(&mut WithPlaced::new(inner, placed), names.len(), started_at);
    }
    match IndexLookup::with_candidates(index, model, blocks, candidates, weights, mode) {
        Some(mut lookup) => score_prefix(&mut lookup, candidates.len(), started_at),
        None => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::score::Owner;

    /// A table lookup: per block, (candidate, weight, written_at).
    struct Table(Vec<Vec<(usize, f64, Option<u64>)>>);

    impl Lookup for Table {
        fn blocks(&self) -> usize {
            self.0.len()
        }
        fn for_each_owner<F: FnMut(Owner)>(&mut self, block: usize, mut visit: F) {
            for &(candidate, weight, written_at) in &self.0[block] {
                visit(Owner {
                    candidate,
                    weight,
                    written_at,
                });
            }
        }
    }

    /// The same table, answering [`Owners::Repeat`] for a block whose owners equal the
    /// previous block's (as the index does from fingerprints) and, when `ahead`, telling up
    /// to `ahead` of the blocks after an answered one that repeat it (as the chain runs do).
    struct RepeatingTable {
        table: Table,
        ahead: usize,
    }

    /// Whether two rows have the same owners with the same weights, in any order.
    fn same_owners(a: &[(usize, f64, Option<u64>)], b: &[(usize, f64, Option<u64>)]) -> bool {
        let key = |r: &[(usize, f64, Option<u64>)]| {
            let mut k: Vec<(usize, u64)> = r.iter().map(|o| (o.0, o.1.to_bits())).collect();
            k.sort_unstable();
            k
        };
        key(a) == key(b)
    }

    impl Lookup for RepeatingTable {
        fn blocks(&self) -> usize {
            self.table.blocks()
        }
        fn for_each_owner<F: FnMut(Owner)>(&mut self, block: usize, visit: F) {
            self.table.for_each_owner(block, visit);
        }
        fn for_each_owner_or_repeat<F: FnMut(Owner)>(&mut self, block: usize, visit: F) -> Owners {
            let rows = &self.table.0;
            if block > 0 && !rows[block].is_empty() && same_owners(&rows[block], &rows[block - 1]) {
                return Owners::Repeat;
            }
            self.table.for_each_owner(block, visit);
            Owners::Visited
        }
        fn repeats_after(&mut self, block: usize) -> usize {
            let rows = &self.table.0;
            (rows[block + 1..].iter())
                .take(self.ahead)
                .take_while(|row| !row.is_empty() && same_owners(row, &rows[block]))
                .count()
        }
    }

    /// Asserts two scorings agree candidate by candidate, sums bit for bit.
    fn assert_same_scores(a: &[SlotScore], b: &[SlotScore], context: &str) {
        assert_eq!(a.len(), b.len(), "{context}");
        for (x, y) in a.iter().zip(b) {
            assert_eq!(x.candidate, y.candidate, "{context}");
            assert_eq!(x.matched_blocks, y.matched_blocks, "{context}");
            assert_eq!(
                x.weighted_sum.to_bits(),
                y.weighted_sum.to_bits(),
                "{context}"
            );
            assert_eq!(x.score, y.score, "{context}");
        }
    }

    /// `below(n)`, a seeded number in `0..n`, for the random tables.
    fn seeded(mut seed: u64) -> impl FnMut(usize) -> usize {
        move |n| {
            seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
            (crate::hash::mix64(seed) % n as u64) as usize
        }
    }

    /// Asserts `rows` score as `want` (bit for bit) when the table answers repeated blocks
    /// and tells, from each answered block, up to each of `aheads` blocks that repeat it.
    fn assert_repeats_score_as(
        rows: &[Vec<(usize, f64, Option<u64>)>],
        candidates: usize,
        want: &[SlotScore],
        aheads: &[usize],
    ) {
        for &ahead in aheads {
            let mut table = RepeatingTable {
                table: Table(rows.to_vec()),
                ahead,
            };
            let runs = score_prefix(&mut table, candidates, &[]);
            assert_same_scores(&runs, want, &format!("{ahead} {rows:?}"));
        }
    }

    #[test]
    fn repeated_runs_score_bit_for_bit_as_visiting_every_block() {
        let weights = [1.0, 0.8, 0.5, 0.25, 0.1, 0.0];
        let mut below = seeded(7);
        for _ in 0..2_000 {
            let candidates = 1 + below(5);
            let blocks = 1 + below(39);
            let mut rows: Vec<Vec<(usize, f64, Option<u64>)>> = Vec::new();
            for b in 0..blocks {
                if b > 0 && below(4) != 0 {
                    // Mostly runs: the previous block's owners again, reordered.
                    let mut row: Vec<(usize, f64, Option<u64>)> = rows[b - 1].clone();
                    row.reverse();
                    rows.push(row);
                    continue;
                }
                let mut row = Vec::new();
                for c in 0..candidates {
                    for _ in 0..below(3) {
                        row.push((c, weights[below(weights.len())], Some(1)));
                    }
                }
                rows.push(row);
            }
            let plain = score_prefix(&mut Table(rows.clone()), candidates, &[]);
            assert_repeats_score_as(&rows, candidates, &plain, &[0, 1, 3, usize::MAX]);
        }
    }

    #[test]
    fn word_counting_scores_bit_for_bit_as_visiting_every_block() {
        // Words of bits against the freshness path with nobody stale, which visits every
        // block and keeps a track per candidate: one word, a word and a bit, several words.
        let weights = [1.0, 1.0, 1.0, 0.8, 0.5, 0.25, 0.0];
        let mut below = seeded(11);
        for round in 0..3_000 {
            let candidates = match round % 10 {
                0 => 64,
                1 => 65,
                2 => 129 + below(100),
                _ => 1 + below(12),
            };
            let blocks = 1 + below(40);
            let mut rows: Vec<Vec<(usize, f64, Option<u64>)>> = Vec::new();
            for b in 0..blocks {
                if b > 0 && below(3) != 0 {
                    let mut row = rows[b - 1].clone();
                    // Mostly the same owners; now and then one drops out.
                    if !row.is_empty() && below(4) == 0 {
                        row.remove(below(row.len()));
                    }
                    rows.push(row);
                    continue;
                }
                let mut row = Vec::new();
                for c in 0..candidates {
                    // Most candidates hold a block once, some twice (two DP ranks).
                    for _ in 0..[0, 1, 1, 1, 2][below(5)] {
                        row.push((c, weights[below(weights.len())], Some(1)));
                    }
                }
                rows.push(row);
            }
            let fresh = vec![Some(0); candidates];
            let by_block = score_prefix(&mut Table(rows.clone()), candidates, &fresh);
            assert_repeats_score_as(&rows, candidates, &by_block, &[0, 2, usize::MAX]);
        }
    }

    #[test]
    fn more_candidates_than_one_word_holds_are_scored_too() {
        // 130 candidates: three words; 63, 64 and 129 sit on the words' edges; a report of
        // a candidate past the list is nobody's.
        let rows = vec![
            vec![
                (0, 1.0, None),
                (63, 1.0, None),
                (64, 0.5, None),
                (129, 0.8, None),
            ],
            vec![(64, 0.5, None), (129, 0.8, None), (130, 1.0, None)],
            vec![(129, 1.0, None), (63, 1.0, None)],
        ];
        let s = score_prefix(&mut Table(rows), 130, &[]);
        let got: Vec<(usize, u32, f64)> = (s.iter())
            .map(|s| (s.candidate, s.matched_blocks, s.weighted_sum))
            .collect();
        assert_eq!(
            got,
            [
                (0, 1, 1.0),
                (63, 1, 1.0),
                (64, 2, 1.0),
                (129, 3, 0.8 + 0.8 + 1.0)
            ]
        );
    }

    #[test]
    fn a_run_of_whole_weights_after_fractional_ones_adds_block_by_block() {
        // Blocks visited one by one (no two alike) leave a sum that is not whole; adding the
        // run of 1.0 after it at once would round once where kthena rounds per block (this
        // prefix and run differ in the last bit: 16.950000000000003 against 16.95).
        let fractional = [0.8, 0.25, 0.3, 0.8, 0.7, 0.1];
        let rows: Vec<Vec<(usize, f64, Option<u64>)>> = (fractional.iter())
            .chain([1.0; 14].iter())
            .map(|w| vec![(0, *w, Some(1))])
            .collect();
        let by_block = rows.iter().fold(0.0, |sum, row| sum + row[0].1);
        let mut table = RepeatingTable {
            table: Table(rows),
            ahead: usize::MAX,
        };
        let runs = score_prefix(&mut table, 1, &[]);
        assert_eq!(runs[0].matched_blocks, 20);
        assert_eq!(runs[0].weighted_sum.to_bits(), by_block.to_bits());
    }

    #[test]
    fn truncation_follows_kthenas_float_order() {
        assert_eq!(kthena_score(29.0, 100), 28);
        assert_eq!(kthena_score(1.0, 3), 33);
        assert_eq!(kthena_score(2.0, 3), 66);
        assert_eq!(kthena_score(3.0, 3), 100);
        assert_eq!(kthena_score(0.0, 3), 0);
        assert_eq!(kthena_score(1.0, 0), 0);
    }

    #[test]
    fn several_reports_of_one_pod_combine_to_best_weight_once() {
        let mut t = Table(vec![
            vec![(0, 0.8, Some(5)), (0, 1.0, Some(3))],
            vec![(0, 0.8, Some(5)), (0, 0.8, Some(6))],
        ]);
        let s = score_prefix(&mut t, 1, &[]);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].matched_blocks, 2);
        assert_eq!(s[0].weighted_sum, 1.0 + 0.8);
        assert_eq!(s[0].score, 90);
    }

    #[test]
    fn freshness_uses_the_latest_write_of_the_pod() {
        let mut t = Table(vec![
            vec![(0, 1.0, Some(5)), (0, 1.0, Some(11)), (1, 1.0, Some(10))],
            vec![(0, 1.0, Some(12)), (1, 1.0, None)],
        ]);
        let s = score_prefix(&mut t, 2, &[Some(10), Some(10)]);
        assert_eq!(s.len(), 1);
        assert_eq!((s[0].candidate, s[0].matched_blocks), (0, 2));
    }

    #[test]
    fn a_gap_stops_a_pod_even_if_later_blocks_match() {
        let mut t = Table(vec![
            vec![(0, 1.0, None), (1, 1.0, None)],
            vec![(1, 1.0, None)],
            vec![(0, 1.0, None), (1, 1.0, None)],
        ]);
        let s = score_prefix(&mut t, 2, &[]);
        assert_eq!(s[0].matched_blocks, 1);
        assert_eq!(s[1].matched_blocks, 3);
    }

    #[test]
    fn fast_path_equals_the_freshness_path_when_nothing_is_stale() {
        let table = vec![
            vec![
                (0, 0.8, Some(5)),
                (1, 1.0, Some(5)),
                (0, 1.0, Some(5)),
                (2, 0.0, Some(5)),
            ],
            vec![(1, 1.0, Some(5)), (0, 0.8, Some(5)), (2, 0.0, Some(5))],
            vec![(0, 0.8, Some(5)), (2, 1.0, Some(5))],
        ];
        let fast = score_prefix(&mut Table(table.clone()), 3, &[]);
        let slow = score_prefix(&mut Table(table), 3, &[Some(0), None, None]);
        assert_eq!(fast, slow);
        assert_eq!(fast.len(), 3);
    }
}

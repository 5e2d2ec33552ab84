//! The grouped prefill/decode (PD) scheduler.
//!
//! Decode candidates are ranked (by the caller's scores, or by a [`Scorer`] for those
//! without one) and the top N are taken. Each decode belongs to a PD group, and the group's
//! prefill candidates are scored to pick the best prefill for it. Many decodes share a
//! group, so the best prefill of a group is computed once per call and reused: one decode
//! pass plus one prefill pass per distinct group, instead of one prefill pass per decode.
//! The memo lives on the stack of one call — no locks, no state across calls.
//!
//! Ties are broken by input order: among equal decode scores the earlier decode ranks
//! first, among equal prefill scores the earlier prefill of the group's list wins.

use hashbrown::HashMap;
use smallvec::SmallVec;

use super::lookup::IndexLookup;
use super::prefix::{score_prefix, PrefixScores, SlotScore};
use super::prompt::MatchMode;
use crate::index::Index;
use crate::medium::TierWeights;

/// Decodes taken when the caller does not say.
pub const DEFAULT_TOP_N: usize = 5;

/// Scores pods for the prompt of one call. The KV score ([`KvScorer`]) is one
/// implementation; routers plug in their own plugins (load, latency, …) the same way.
pub trait Scorer {
    /// Writes one score per pod of `pods` into `out` (same length, same order); higher is
    /// better. A NaN marks a pod that cannot be used.
    fn score(&mut self, pods: &[&str], out: &mut [f64]);
}

impl<S: Scorer + ?Sized> Scorer for &mut S {
    fn score(&mut self, pods: &[&str], out: &mut [f64]) {
        (**self).score(pods, out);
    }
}

/// One decode candidate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeCandidate<'a> {
    /// Pod identifier.
    pub pod: &'a str,
    /// PD group key: its prefill candidates come from [`PrefillGroups`].
    pub group: &'a str,
    /// The caller's score for this decode; `None` = ask the scorer.
    pub score: Option<f64>,
}

/// The prefill candidates of each PD group.
pub trait PrefillGroups<'a> {
    /// Prefill candidates of `group` (empty when the group is unknown).
    fn prefills(&self, group: &str) -> &[&'a str];
}

impl<'a> PrefillGroups<'a> for [(&'a str, Vec<&'a str>)] {
    fn prefills(&self, group: &str) -> &[&'a str] {
        self.iter()
            .find(|(g, _)| *g == group)
            .map_or(&[], |(_, p)| p.as_slice())
    }
}

impl<'a> PrefillGroups<'a> for [(&'a str, &'a [&'a str])] {
    fn prefills(&self, group: &str) -> &[&'a str] {
        self.iter()
            .find(|(g, _)| *g == group)
            .map_or(&[], |(_, p)| p)
    }
}

impl<'a> PrefillGroups<'a> for std::collections::BTreeMap<&'a str, Vec<&'a str>> {
    fn prefills(&self, group: &str) -> &[&'a str] {
        self.get(group).map_or(&[], Vec::as_slice)
    }
}

impl<'a, H: std::hash::BuildHasher> PrefillGroups<'a>
    for std::collections::HashMap<&'a str, Vec<&'a str>, H>
{
    fn prefills(&self, group: &str) -> &[&'a str] {
        self.get(group).map_or(&[], Vec::as_slice)
    }
}

/// One scheduled pair.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pair<'a> {
    /// Decode pod.
    pub decode: &'a str,
    /// The decode's score (the caller's, or the scorer's).
    pub decode_score: f64,
    /// Best prefill pod of the decode's group.
    pub prefill: &'a str,
    /// Its score.
    pub prefill_score: f64,
}

/// Why no pair could be scheduled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PdError {
    /// No decode candidate at all, or `top_n` of 0.
    #[error("no decode candidate to schedule")]
    NoDecode,
    /// None of the top decodes has a usable prefill in its group.
    #[error("none of the top {considered} decode candidates has a usable prefill in its group")]
    NoPair {
        /// Decodes considered.
        considered: usize,
    },
}

type Scratch<T> = SmallVec<[T; 16]>;
/// Group key → its best prefill (pod, score), for one call.
type Memo<'g, 'a> = SmallVec<[(&'g str, Option<(&'a str, f64)>); 8]>;

/// Scores decodes without a caller score in one scorer call.
fn decode_scores<S: Scorer + ?Sized>(
    decodes: &[DecodeCandidate<'_>],
    scorer: &mut S,
) -> Scratch<f64> {
    let mut scores: Scratch<f64> = decodes
        .iter()
        .map(|d| d.score.unwrap_or(f64::NAN))
        .collect();
    let missing: Scratch<&str> = decodes
        .iter()
        .filter(|d| d.score.is_none())
        .map(|d| d.pod)
        .collect();
    if !missing.is_empty() {
        let mut out: Scratch<f64> = SmallVec::from_elem(f64::NAN, missing.len());
        scorer.score(&missing, &mut out);
        let mut next = out.iter();
        for (score, d) in scores.iter_mut().zip(decodes) {
            if d.score.is_none() {
                *score = next.next().copied().unwrap_or(f64::NAN);
            }
        }
    }
    scores
}

/// Indices of the top `n` usable (non-NaN) decodes: score descending, ties by input order.
fn top_decodes(scores: &[f64], n: usize) -> Scratch<u32> {
    let mut order: Scratch<u32> = (0..scores.len() as u32)
        .filter(|i| !scores[*i as usize].is_nan())
        .collect();
    order.sort_unstable_by(|a, b| {
        scores[*b as usize]
            .total_cmp(&scores[*a as usize])
            .then(a.cmp(b))
    });
    order.truncate(n);
    order
}

/// The best prefill of a group: scored in one call, highest non-NaN score, earliest on ties.
fn best_prefill<'a, S: Scorer + ?Sized>(
    prefills: &[&'a str],
    scorer: &mut S,
    buf: &mut Scratch<f64>,
) -> Option<(&'a str, f64)> {
    if prefills.is_empty() {
        return None;
    }
    buf.clear();
    buf.resize(prefills.len(), f64::NAN);
    scorer.score(prefills, buf);
    let mut best: Option<(&'a str, f64)> = None;
    for (pod, score) in prefills.iter().zip(buf.iter()) {
        if score.is_nan() {
            continue;
        }
        if best.is_none_or(|(_, b)| *score > b) {
            best = Some((pod, *score));
        }
    }
    best
}

/// Schedules up to `top_n` (decode, prefill) pairs, scoring each group's prefills once.
///
/// # Errors
/// [`PdError::NoDecode`] without decodes (or with `top_n` 0); [`PdError::NoPair`] when no
/// top decode has a usable prefill.
pub fn schedule<'a, G, S>(
    decodes: &[DecodeCandidate<'a>],
    prefill: &G,
    top_n: usize,
    scorer: &mut S,
) -> Result<Vec<Pair<'a>>, PdError>
where
    G: PrefillGroups<'a> + ?Sized,
    S: Scorer + ?Sized,
{
    if decodes.is_empty() || top_n == 0 {
        return Err(PdError::NoDecode);
    }
    let scores = decode_scores(decodes, scorer);
    let order = top_decodes(&scores, top_n);
    // The memo: group key → its best prefill, for this call only.
    let mut memo: Memo<'_, 'a> = SmallVec::new();
    let mut buf: Scratch<f64> = SmallVec::new();
    let mut pairs = Vec::with_capacity(order.len());
    for &i in &order {
        let decode = &decodes[i as usize];
        let best = match memo.iter().find(|(g, _)| *g == decode.group) {
            Some((_, best)) => *best,
            None => {
                let best = best_prefill(prefill.prefills(decode.group), scorer, &mut buf);
                memo.push((decode.group, best));
                best
            }
        };
        if let Some((pod, score)) = best {
            pairs.push(Pair {
                decode: decode.pod,
                decode_score: scores[i as usize],
                prefill: pod,
                prefill_score: score,
            });
        }
    }
    if pairs.is_empty() {
        return Err(PdError::NoPair {
            considered: order.len(),
        });
    }
    Ok(pairs)
}

/// The same pairing without the memo: every decode re-scores its group's prefills. Kept as
/// the reference the memoized scheduler is tested and benchmarked against.
///
/// # Errors
/// As [`schedule`].
pub fn schedule_unmemoized<'a, G, S>(
    decodes: &[DecodeCandidate<'a>],
    prefill: &G,
    top_n: usize,
    scorer: &mut S,
) -> Result<Vec<Pair<'a>>, PdError>
where
    G: PrefillGroups<'a> + ?Sized,
    S: Scorer + ?Sized,
{
    if decodes.is_empty() || top_n == 0 {
        return Err(PdError::NoDecode);
    }
    let scores = decode_scores(decodes, scorer);
    let order = top_decodes(&scores, top_n);
    let mut buf: Scratch<f64> = SmallVec::new();
    let mut pairs = Vec::new();
    for &i in &order {
        let decode = &decodes[i as usize];
        if let Some((pod, score)) = best_prefill(prefill.prefills(decode.group), scorer, &mut buf) {
            pairs.push(Pair {
                decode: decode.pod,
                decode_score: scores[i as usize],
                prefill: pod,
                prefill_score: score,
            });
        }
    }
    if pairs.is_empty() {
        return Err(PdError::NoPair {
            considered: order.len(),
        });
    }
    Ok(pairs)
}

/// The KV score as a [`Scorer`]: the prompt is hashed and looked up once, for every pod the
/// call may ask about; each scorer call then only reads the table. A pod that holds no
/// prefix scores 0 (it is still usable).
#[derive(Debug, Clone, Default)]
pub struct KvScorer {
    scores: HashMap<String, f64>,
}

impl KvScorer {
    /// A scorer over precomputed prefix scores.
    pub fn from_scores(scores: &PrefixScores) -> KvScorer {
        KvScorer {
            scores: scores
                .scores
                .iter()
                .map(|s| (s.pod.clone(), f64::from(s.score)))
                .collect(),
        }
    }

    /// Scores `pods` (every decode and prefill the call may ask about) for `blocks` of
    /// `model` from the in-memory index in `mode`, in one pass (`blocks` as
    /// [`super::PromptSettings::blocks`] makes them).
    pub fn from_index_with<S: AsRef<str>>(
        index: &Index,
        model: &str,
        blocks: &[u64],
        pods: &[S],
        weights: &TierWeights,
        mode: MatchMode,
    ) -> KvScorer {
        let mut lookup = IndexLookup::with_mode(index, model, blocks, pods, weights, mode);
        let slots: Vec<SlotScore> = score_prefix(&mut lookup, pods.len(), &[]);
        KvScorer::from_scores(&PrefixScores::from_slots(blocks.len(), pods, &slots))
    }
}

impl Scorer for KvScorer {
    fn score(&mut self, pods: &[&str], out: &mut [f64]) {
        for (pod, out) in pods.iter().zip(out.iter_mut()) {
            *out = self.scores.get(*pod).copied().unwrap_or(0.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Scores a pod by the number in its name; counts calls.
    struct Numbered {
        calls: usize,
    }

    impl Scorer for Numbered {
        fn score(&mut self, pods: &[&str], out: &mut [f64]) {
            self.calls += 1;
            for (p, o) in pods.iter().zip(out.iter_mut()) {
                *o = p
                    .trim_start_matches(|c: char| !c.is_ascii_digit())
                    .parse()
                    .unwrap_or(f64::NAN);
            }
        }
    }

    #[test]
    fn top_n_ties_break_by_input_order() {
        let order = top_decodes(&[1.0, 3.0, 3.0, f64::NAN, 2.0], 3);
        assert_eq!(order.as_slice(), &[1, 2, 4]);
    }

    #[test]
    fn unknown_group_is_skipped_and_no_pair_is_an_error() {
        let decodes = [
            DecodeCandidate {
                pod: "d9",
                group: "nowhere",
                score: None,
            },
            DecodeCandidate {
                pod: "d1",
                group: "g",
                score: None,
            },
        ];
        let groups: Vec<(&str, Vec<&str>)> = vec![("g", vec!["p1", "p7", "p7b"])];
        let mut s = Numbered { calls: 0 };
        let pairs = schedule(&decodes, groups.as_slice(), 5, &mut s).unwrap();
        assert_eq!(pairs.len(), 1);
        assert_eq!((pairs[0].decode, pairs[0].prefill), ("d1", "p7"));
        let empty: Vec<(&str, Vec<&str>)> = vec![];
        assert_eq!(
            schedule(&decodes, empty.as_slice(), 5, &mut s),
            Err(PdError::NoPair { considered: 2 })
        );
        assert_eq!(
            schedule(&decodes, groups.as_slice(), 0, &mut s),
            Err(PdError::NoDecode)
        );
    }

    #[test]
    fn caller_scores_skip_the_decode_pass() {
        let decodes = [
            DecodeCandidate {
                pod: "d1",
                group: "g",
                score: Some(0.5),
            },
            DecodeCandidate {
                pod: "d2",
                group: "g",
                score: Some(0.9),
            },
        ];
        let groups: Vec<(&str, Vec<&str>)> = vec![("g", vec!["p1"])];
        let mut s = Numbered { calls: 0 };
        let pairs = schedule(&decodes, groups.as_slice(), 5, &mut s).unwrap();
        assert_eq!(s.calls, 1);
        assert_eq!(pairs[0].decode, "d2");
        assert_eq!(pairs[1].decode, "d1");
    }
}

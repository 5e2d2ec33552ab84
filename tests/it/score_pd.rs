//! The grouped PD scheduler: scorer invocation counts and memoized == naive pairing.

use std::cell::Cell;

use kvindex::score::{
    schedule, schedule_unmemoized, DecodeCandidate, PdError, Scorer, DEFAULT_TOP_N,
};
use proptest::prelude::*;

/// Scores each pod from a fixed table (by name), counting calls and pods scored.
struct Counting<'t> {
    table: &'t [(String, f64)],
    calls: Cell<usize>,
    pods: Cell<usize>,
}

impl<'t> Counting<'t> {
    fn new(table: &'t [(String, f64)]) -> Counting<'t> {
        Counting {
            table,
            calls: Cell::new(0),
            pods: Cell::new(0),
        }
    }
}

impl Scorer for Counting<'_> {
    fn score(&mut self, pods: &[&str], out: &mut [f64]) {
        self.calls.set(self.calls.get() + 1);
        self.pods.set(self.pods.get() + pods.len());
        for (p, o) in pods.iter().zip(out.iter_mut()) {
            *o = self
                .table
                .iter()
                .find(|(n, _)| n == p)
                .map_or(0.0, |(_, s)| *s);
        }
    }
}

#[test]
fn one_group_1p5d_top5_runs_the_scorer_twice() {
    let table: Vec<(String, f64)> = (0..5)
        .map(|i| (format!("d{i}"), f64::from(i)))
        .chain([("p0".to_owned(), 7.0)])
        .collect();
    let decodes: Vec<DecodeCandidate<'_>> = ["d0", "d1", "d2", "d3", "d4"]
        .iter()
        .map(|pod| DecodeCandidate {
            pod,
            group: "g",
            score: None,
        })
        .collect();
    let groups: Vec<(&str, Vec<&str>)> = vec![("g", vec!["p0"])];
    let mut memo = Counting::new(&table);
    let pairs = schedule(&decodes, groups.as_slice(), DEFAULT_TOP_N, &mut memo).unwrap();
    assert_eq!(memo.calls.get(), 2, "one decode pass + one prefill pass");
    let order: Vec<&str> = pairs.iter().map(|p| p.decode).collect();
    assert_eq!(order, ["d4", "d3", "d2", "d1", "d0"]);
    assert!(pairs
        .iter()
        .all(|p| p.prefill == "p0" && p.prefill_score == 7.0));

    let mut naive = Counting::new(&table);
    let naive_pairs =
        schedule_unmemoized(&decodes, groups.as_slice(), DEFAULT_TOP_N, &mut naive).unwrap();
    assert_eq!(
        naive.calls.get(),
        6,
        "the naive pairing re-scores per decode"
    );
    assert_eq!(naive_pairs, pairs);
}

#[test]
fn several_groups_are_each_scored_once() {
    let table: Vec<(String, f64)> = vec![
        ("pa1".into(), 1.0),
        ("pa2".into(), 5.0),
        ("pb1".into(), 3.0),
        ("pc1".into(), 2.0),
    ];
    let decodes = [
        DecodeCandidate {
            pod: "d1",
            group: "a",
            score: Some(9.0),
        },
        DecodeCandidate {
            pod: "d2",
            group: "b",
            score: Some(8.0),
        },
        DecodeCandidate {
            pod: "d3",
            group: "a",
            score: Some(7.0),
        },
        DecodeCandidate {
            pod: "d4",
            group: "c",
            score: Some(6.0),
        },
        DecodeCandidate {
            pod: "d5",
            group: "b",
            score: Some(5.0),
        },
        DecodeCandidate {
            pod: "d6",
            group: "a",
            score: Some(4.0),
        },
    ];
    let groups: Vec<(&str, Vec<&str>)> = vec![
        ("a", vec!["pa1", "pa2"]),
        ("b", vec!["pb1"]),
        ("c", vec!["pc1"]),
    ];
    let mut s = Counting::new(&table);
    let pairs = schedule(&decodes, groups.as_slice(), 6, &mut s).unwrap();
    // Caller scores everywhere: no decode pass; groups a, b, c once each.
    assert_eq!(s.calls.get(), 3);
    assert_eq!(s.pods.get(), 4);
    let got: Vec<(&str, &str)> = pairs.iter().map(|p| (p.decode, p.prefill)).collect();
    assert_eq!(
        got,
        [
            ("d1", "pa2"),
            ("d2", "pb1"),
            ("d3", "pa2"),
            ("d4", "pc1"),
            ("d5", "pb1"),
            ("d6", "pa2")
        ]
    );
}

#[test]
fn decode_without_usable_prefill_is_skipped_and_none_is_an_error() {
    let table: Vec<(String, f64)> = vec![("p".into(), 1.0)];
    let decodes = [
        DecodeCandidate {
            pod: "d1",
            group: "empty",
            score: Some(2.0),
        },
        DecodeCandidate {
            pod: "d2",
            group: "g",
            score: Some(1.0),
        },
    ];
    let groups: Vec<(&str, Vec<&str>)> = vec![("empty", vec![]), ("g", vec!["p"])];
    let mut s = Counting::new(&table);
    let pairs = schedule(&decodes, groups.as_slice(), 5, &mut s).unwrap();
    assert_eq!(pairs.len(), 1);
    assert_eq!(pairs[0].decode, "d2");
    let none: Vec<(&str, Vec<&str>)> = vec![("empty", vec![])];
    assert_eq!(
        schedule(&decodes, none.as_slice(), 5, &mut s),
        Err(PdError::NoPair { considered: 2 })
    );
}

/// Decodes (pod id, group id, caller score), prefill ids per group, score per pod id, top N.
type Topology = (Vec<(u8, u8, Option<u8>)>, Vec<Vec<u8>>, Vec<u8>, usize);

fn topology() -> impl Strategy<Value = Topology> {
    (
        // decodes: (pod id, group id, caller score)
        prop::collection::vec((0u8..40, 0u8..6, prop::option::of(0u8..5)), 0..20),
        // prefill pods per group (ids), groups 0..6
        prop::collection::vec(prop::collection::vec(0u8..30, 0..5), 6),
        // score per pod id (small range: many ties)
        prop::collection::vec(0u8..4, 70),
        0usize..8,
    )
}

proptest! {
    #[test]
    fn memoized_pairing_equals_naive_rescoring((decodes, prefills, scores, top_n) in topology()) {
        let decode_names: Vec<String> = decodes.iter().map(|(p, _, _)| format!("d{p}")).collect();
        let group_names: Vec<String> = (0..6).map(|g| format!("g{g}")).collect();
        let prefill_names: Vec<Vec<String>> = prefills
            .iter()
            .map(|ps| ps.iter().map(|p| format!("p{p}")).collect())
            .collect();
        let table: Vec<(String, f64)> = (0..40u8)
            .map(|i| (format!("d{i}"), f64::from(scores[i as usize])))
            .chain((0..30u8).map(|i| (format!("p{i}"), f64::from(scores[40 + i as usize]))))
            .collect();
        let candidates: Vec<DecodeCandidate<'_>> = decodes
            .iter()
            .zip(&decode_names)
            .map(|((_, g, s), name)| DecodeCandidate {
                pod: name,
                group: &group_names[*g as usize],
                score: s.map(f64::from),
            })
            .collect();
        // Group 5 is never listed: an unknown group.
        let groups: Vec<(&str, Vec<&str>)> = (0..5)
            .map(|g| (group_names[g].as_str(), prefill_names[g].iter().map(String::as_str).collect()))
            .collect();
        let mut memo = Counting::new(&table);
        let mut naive = Counting::new(&table);
        let a = schedule(&candidates, groups.as_slice(), top_n, &mut memo);
        let b = schedule_unmemoized(&candidates, groups.as_slice(), top_n, &mut naive);
        prop_assert_eq!(&a, &b);
        prop_assert!(memo.calls.get() <= naive.calls.get());
        // One decode pass (when some decode lacks a caller score), then at most one pass per
        // distinct group that has prefills.
        let decode_pass = usize::from(top_n > 0 && candidates.iter().any(|d| d.score.is_none()));
        let groups_with_prefills: std::collections::BTreeSet<&str> = candidates
            .iter()
            .filter(|d| !groups.iter().any(|(g, p)| *g == d.group && p.is_empty()))
            .filter(|d| groups.iter().any(|(g, _)| *g == d.group))
            .map(|d| d.group)
            .collect();
        prop_assert!(memo.calls.get() <= decode_pass + groups_with_prefills.len());
    }
}

/// README: "ties by request order" — for decodes and for a group's best prefill. Names are
/// given in reverse alphabetical order so that a name-order tie break would fail.
#[test]
fn ties_keep_request_order_for_decodes_and_prefills() {
    let table: Vec<(String, f64)> = ["zd", "md", "ad", "zp", "ap"]
        .iter()
        .map(|n| ((*n).to_owned(), 3.0))
        .collect();
    let decodes: Vec<DecodeCandidate<'_>> = ["zd", "md", "ad"]
        .iter()
        .map(|pod| DecodeCandidate {
            pod,
            group: "g",
            score: None,
        })
        .collect();
    let groups: Vec<(&str, Vec<&str>)> = vec![("g", vec!["zp", "ap"])];
    let pairs = schedule(&decodes, groups.as_slice(), 2, &mut Counting::new(&table)).unwrap();
    let order: Vec<(&str, &str)> = pairs.iter().map(|p| (p.decode, p.prefill)).collect();
    assert_eq!(order, [("zd", "zp"), ("md", "zp")]);
}

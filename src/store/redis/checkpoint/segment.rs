//! The checkpoint's log: a state key's entries are written as segments, one hash field per
//! flush holding every entry that flush changed, instead of one field per engine block
//! (Redis then does one field insert per flush and state key, not one per block).
//!
//! A segment's field is `+{generation}.{n}` (its [`Stamp`]): the generation is taken from
//! Redis by every writer when it starts writing (start-up, takeover, reconcile), so it is
//! larger than any generation an earlier writer used, and `n` counts the writer's segments.
//! A restore applies segments in stamp order, never in arrival order, so a deposed leader's
//! late bytes or a segment of an abandoned pipeline can never override a newer one.
//!
//! A segment's value is one kind byte then its entries, each the engine field and the
//! entry's value ([`super::engine_value`]) with a 4-byte big-endian length before each; an
//! empty value removes the entry. Kind [`LOG`] applies over what comes before it; kind
//! [`SNAPSHOT`] holds the whole state key and voids everything before it, so a compaction
//! writes one and only then deletes the older fields (a crash in between leaves them inert).
//! Per-block fields (what kvindex wrote before segments) still restore, as the base the
//! segments apply over.

use std::collections::HashMap;

use super::{parse_engine_field, parse_engine_value, push_engine_field, push_engine_value};
use crate::index::EngineState;
use crate::wire::BlockHash;

/// Marks a segment's field; engine fields start with a digit, `-` or `x`.
const SEGMENT_MARK: u8 = b'+';
/// A segment that applies over what comes before it.
pub const LOG: u8 = b'L';
/// A segment holding the whole state key: what comes before it is void.
pub const SNAPSHOT: u8 = b'S';

/// Where a segment sits in its state key's log: writer generation, then segment number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Stamp {
    /// Taken from Redis when the writer started writing.
    pub generation: u64,
    /// The writer's segment count within the generation.
    pub n: u64,
}

impl Stamp {
    /// The hash field of the segment with this stamp.
    pub fn field(self) -> String {
        format!("+{}.{}", self.generation, self.n)
    }

    /// The stamp a segment field names; `None` for anything else (an engine field).
    pub fn of_field(field: &[u8]) -> Option<Stamp> {
        let rest = field.strip_prefix(&[SEGMENT_MARK])?;
        let (generation, n) = std::str::from_utf8(rest).ok()?.split_once('.')?;
        let number = |t: &str| {
            t.bytes()
                .all(|b| b.is_ascii_digit())
                .then(|| t.parse().ok())?
        };
        Some(Stamp {
            generation: number(generation)?,
            n: number(n)?,
        })
    }
}

/// Whether `field` names a segment (well-formed or not) rather than an engine block.
fn is_segment_field(field: &[u8]) -> bool {
    field.first() == Some(&SEGMENT_MARK)
}

/// A segment's value, built entry by entry.
pub struct SegmentBody {
    bytes: Vec<u8>,
    entries: usize,
    field: String,
    value: String,
}

impl SegmentBody {
    /// An empty segment of `kind` ([`LOG`] or [`SNAPSHOT`]).
    pub fn new(kind: u8) -> SegmentBody {
        SegmentBody {
            bytes: vec![kind],
            entries: 0,
            field: String::new(),
            value: String::new(),
        }
    }

    /// Adds engine block `hash` with `state`, or its removal (`None`).
    pub fn push(&mut self, hash: &BlockHash, state: Option<&EngineState>) {
        push_engine_field(&mut self.field, hash);
        self.value.clear();
        if let Some(state) = state {
            push_engine_value(&mut self.value, state);
        }
        put(&mut self.bytes, self.field.as_bytes());
        put(&mut self.bytes, self.value.as_bytes());
        self.entries += 1;
    }

    /// Entries added.
    pub fn entries(&self) -> usize {
        self.entries
    }

    /// The encoded value.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// Appends `part` with its length before it.
fn put(out: &mut Vec<u8>, part: &[u8]) {
    let len = u32::try_from(part.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&part[..len as usize]);
}

/// Reads one length-prefixed part off the front of `rest`.
fn take<'a>(rest: &mut &'a [u8]) -> Option<&'a [u8]> {
    let (len, tail) = rest.split_first_chunk::<4>()?;
    let len = u32::from_be_bytes(*len) as usize;
    if tail.len() < len {
        return None;
    }
    let (part, tail) = tail.split_at(len);
    *rest = tail;
    Some(part)
}

/// One state key's fields folded into its engine blocks: the per-block fields as the base,
/// then every segment in stamp order (from the last snapshot on, which voids the base).
#[derive(Debug, Default)]
pub struct StateFold {
    base: Vec<(Vec<u8>, Vec<u8>)>,
    segments: Vec<(Stamp, Vec<u8>)>,
    /// Fields or entries that did not parse (skipped).
    pub bad: u64,
}

impl StateFold {
    /// Takes one field of the state key.
    pub fn add(&mut self, field: Vec<u8>, value: Vec<u8>) {
        if !is_segment_field(&field) {
            self.base.push((field, value));
        } else if let Some(stamp) = Stamp::of_field(&field) {
            self.segments.push((stamp, value));
        } else {
            self.bad += 1;
        }
    }

    /// The engine blocks the fields describe, in no order.
    pub fn blocks(mut self) -> (Vec<(BlockHash, EngineState)>, u64) {
        self.segments.sort_unstable_by_key(|(stamp, _)| *stamp);
        let from = (self.segments.iter()).rposition(|(_, body)| body.first() == Some(&SNAPSHOT));
        let mut blocks: HashMap<BlockHash, EngineState> = HashMap::new();
        let mut bad = self.bad;
        if from.is_none() {
            for (field, value) in &self.base {
                match parse_entry(field, value) {
                    Some((hash, Some(state))) => {
                        blocks.insert(hash, state);
                    }
                    _ => bad += 1,
                }
            }
        }
        for (_, body) in &self.segments[from.unwrap_or(0)..] {
            bad += apply_segment(body, &mut blocks);
        }
        (blocks.into_iter().collect(), bad)
    }
}

/// Applies one segment's entries to `blocks`; returns how many did not parse (a body cut
/// short counts once and ends the segment).
fn apply_segment(body: &[u8], blocks: &mut HashMap<BlockHash, EngineState>) -> u64 {
    let Some((&kind, mut rest)) = body.split_first() else {
        return 1;
    };
    if kind != LOG && kind != SNAPSHOT {
        return 1;
    }
    let mut bad = 0;
    while !rest.is_empty() {
        let Some((field, value)) = take(&mut rest).zip(take(&mut rest)) else {
            return bad + 1;
        };
        match parse_entry(field, value) {
            Some((hash, Some(state))) => {
                blocks.insert(hash, state);
            }
            Some((hash, None)) => {
                blocks.remove(&hash);
            }
            None => bad += 1,
        }
    }
    bad
}

/// An engine field and its value (`None` for an empty value: removed).
fn parse_entry(field: &[u8], value: &[u8]) -> Option<(BlockHash, Option<EngineState>)> {
    let hash = parse_engine_field(std::str::from_utf8(field).ok()?)?;
    if value.is_empty() {
        return Some((hash, None));
    }
    let state = parse_engine_value(std::str::from_utf8(value).ok()?)?;
    Some((hash, Some(state)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::medium::{MediaSet, Medium};

    fn state(std_hash: u64) -> EngineState {
        EngineState {
            std_hash,
            media: MediaSet::single(Medium::GPU),
            stored_at: 9,
            chain: std_hash + 1,
            parent: 0,
        }
    }

    fn segment(kind: u8, entries: &[(u64, Option<u64>)]) -> Vec<u8> {
        let mut body = SegmentBody::new(kind);
        for (hash, std) in entries {
            body.push(&BlockHash::Int(*hash), std.map(state).as_ref());
        }
        body.bytes().to_vec()
    }

    fn stamp(generation: u64, n: u64) -> Vec<u8> {
        Stamp { generation, n }.field().into_bytes()
    }

    fn sorted(fold: StateFold) -> (Vec<(BlockHash, u64)>, u64) {
        let (blocks, bad) = fold.blocks();
        let mut out: Vec<_> = blocks.into_iter().map(|(h, s)| (h, s.std_hash)).collect();
        out.sort_by_key(|(h, _)| h.to_string());
        (out, bad)
    }

    #[test]
    fn stamps_round_trip_and_order_by_generation_then_number() {
        let s = Stamp {
            generation: 1_700_000_000_123,
            n: 42,
        };
        assert_eq!(s.field(), "+1700000000123.42");
        assert_eq!(Stamp::of_field(s.field().as_bytes()), Some(s));
        assert!(
            Stamp {
                generation: 2,
                n: 0
            } > Stamp {
                generation: 1,
                n: 9
            }
        );
        for bad in ["+1", "+1.", "+.1", "+1.2.3", "+-1.2", "+1.+2", "12", "+x.1"] {
            assert_eq!(Stamp::of_field(bad.as_bytes()), None, "{bad}");
        }
    }

    #[test]
    fn segments_apply_in_stamp_order_over_per_block_fields_whatever_their_arrival() {
        let mut fold = StateFold::default();
        // Per-block fields: what a kvindex before segments wrote.
        for hash in [1u64, 2, 3] {
            let value = super::super::engine_value(&state(hash * 10));
            fold.add(hash.to_string().into_bytes(), value.into_bytes());
        }
        // The newer segment arrives first: 2 stored again after the older one removed it.
        fold.add(stamp(5, 2), segment(LOG, &[(2, Some(21)), (4, Some(40))]));
        fold.add(stamp(5, 1), segment(LOG, &[(2, None), (3, None)]));
        let i = BlockHash::Int;
        assert_eq!(sorted(fold), (vec![(i(1), 10), (i(2), 21), (i(4), 40)], 0));
    }

    #[test]
    fn a_snapshot_voids_everything_stamped_before_it() {
        let mut fold = StateFold::default();
        fold.add(
            b"1".to_vec(),
            super::super::engine_value(&state(10)).into_bytes(),
        );
        fold.add(stamp(3, 7), segment(LOG, &[(5, Some(50))]));
        fold.add(stamp(4, 1), segment(SNAPSHOT, &[(6, Some(60))]));
        fold.add(stamp(4, 2), segment(LOG, &[(7, Some(70)), (6, None)]));
        // An older generation's late segment, after the snapshot in arrival only.
        fold.add(stamp(3, 9), segment(LOG, &[(8, Some(80))]));
        assert_eq!(sorted(fold), (vec![(BlockHash::Int(7), 70)], 0));
    }

    #[test]
    fn bad_fields_and_entries_are_counted_and_the_rest_applies() {
        let mut fold = StateFold::default();
        fold.add(b"+1.x".to_vec(), segment(LOG, &[(1, Some(1))]));
        fold.add(b"9".to_vec(), b"not a value".to_vec());
        let mut cut = segment(LOG, &[(2, Some(20)), (3, Some(30))]);
        cut.truncate(cut.len() - 3);
        fold.add(stamp(1, 1), cut);
        fold.add(stamp(1, 2), b"Q".to_vec());
        fold.add(stamp(1, 3), Vec::new());
        assert_eq!(sorted(fold), (vec![(BlockHash::Int(2), 20)], 5));
    }

    #[test]
    fn byte_string_hashes_and_any_media_spelling_survive_a_segment() {
        let mut media = MediaSet::single(Medium::intern("odd\n spelling"));
        media.insert(Medium::NONE);
        let odd = EngineState { media, ..state(3) };
        let hash = BlockHash::Bytes(vec![0, 1, 0xff].into());
        let mut body = SegmentBody::new(LOG);
        body.push(&hash, Some(&odd));
        assert_eq!(body.entries(), 1);
        let mut fold = StateFold::default();
        fold.add(stamp(1, 1), body.bytes().to_vec());
        assert_eq!(fold.blocks(), (vec![(hash, odd)], 0));
    }

    proptest::proptest! {
        /// Segments come from Redis: any bytes read without a panic.
        #[test]
        fn any_segment_bytes_are_read_without_a_panic(
            field in proptest::collection::vec(proptest::num::u8::ANY, 0..24),
            body in proptest::collection::vec(proptest::num::u8::ANY, 0..200),
        ) {
            let mut fold = StateFold::default();
            fold.add(field, body.clone());
            fold.add(stamp(1, 1), body);
            let _ = fold.blocks();
        }
    }
}

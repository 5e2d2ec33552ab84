//! Decoder edge cases across eras, built with rmpv the way msgspec lays them out.

use rmpv::Value as V;

use super::*;
use crate::medium::Medium;

fn encode(v: &V) -> Vec<u8> {
    let mut buf = Vec::new();
    rmpv::encode::write_value(&mut buf, v).unwrap();
    buf
}

fn s(x: &str) -> V {
    V::from(x)
}

fn toks(n: u32) -> V {
    V::Array((0..n).map(V::from).collect())
}

fn map(pairs: Vec<(&str, V)>) -> V {
    V::Map(pairs.into_iter().map(|(k, v)| (s(k), v)).collect())
}

fn decode(batch: V) -> EngineBatch {
    decode_batch(&encode(&batch), DecodeOptions::FULL).unwrap()
}

fn only_stored(batch: &EngineBatch) -> &BlockStored {
    match &batch.events[..] {
        [Event::BlockStored(s)] => s,
        other => panic!("expected one BlockStored, got {other:?}"),
    }
}

#[test]
fn two_element_batch_of_vllm_0_9_has_no_dp_rank() {
    let ev = V::Array(vec![
        s("BlockStored"),
        V::Array(vec![V::from(-3)]),
        V::Nil,
        toks(16),
        V::from(16),
        V::Nil,
    ]);
    let b = decode(V::Array(vec![V::F64(1.5), V::Array(vec![ev])]));
    assert_eq!(b.dp_rank, None);
    assert_eq!(only_stored(&b).block_hashes, vec![BlockHash::Neg(-3)]);
    assert!(only_stored(&b).medium.is_none());
}

#[test]
fn unsigned_hashes_above_two_to_the_63_keep_every_bit() {
    let ev = V::Array(vec![
        s("BlockRemoved"),
        V::Array(vec![V::from(u64::MAX)]),
        s("GPU"),
    ]);
    let b = decode(V::Array(vec![V::F64(0.0), V::Array(vec![ev]), V::from(0)]));
    let Event::BlockRemoved(r) = &b.events[0] else {
        panic!()
    };
    assert_eq!(r.block_hashes[0].to_string(), "18446744073709551615");
    assert_eq!(r.medium, Medium::GPU);
}

#[test]
fn vllm_0_14_array_carries_lora_name_and_trailing_fields() {
    let ev = V::Array(vec![
        s("BlockStored"),
        V::Array(vec![V::Binary(vec![0xab; 32])]),
        V::Nil,
        toks(16),
        V::from(16),
        V::from(1),
        s("GPU"),
        s("sql-adapter"),
        V::Array(vec![V::Array(vec![s("sql-adapter")])]),
        V::from(0),
        s("full_attention"),
        V::Nil,
        s("an extra trailing element from the future"),
    ]);
    let b = decode(V::Array(vec![V::F64(0.0), V::Array(vec![ev]), V::from(2)]));
    let st = only_stored(&b);
    assert_eq!(b.dp_rank, Some(2));
    assert_eq!(st.lora_name.as_deref(), Some("sql-adapter"));
    assert_eq!(st.group_idx, Some(0));
    assert_eq!(st.kv_cache_spec_kind.as_deref(), Some("full_attention"));
    assert_eq!(st.block_hashes[0].to_string(), "ab".repeat(32));
    assert!(st.extras.as_ref().unwrap().extra_keys.is_some());
}

#[test]
fn sglang_0_5_18_metadata_map_at_position_seven_is_cache_salt() {
    let ev = V::Array(vec![
        s("BlockStored"),
        V::Array(vec![V::from(-7)]),
        V::Nil,
        toks(16),
        V::from(16),
        V::Nil,
        s("GPU"),
        map(vec![("cache_salt", s("tenant-a"))]),
    ]);
    let b = decode(V::Array(vec![V::F64(0.0), V::Array(vec![ev]), V::Nil]));
    let st = only_stored(&b);
    assert_eq!(st.lora_name, None);
    assert_eq!(st.extras.as_ref().unwrap().cache_salt, Some(s("tenant-a")));
}

#[test]
fn map_events_in_any_key_order_with_unknown_keys() {
    let ev = map(vec![
        ("medium", s("cpu")),
        (
            "future_field",
            V::Array(vec![V::from(1), map(vec![("x", V::Nil)])]),
        ),
        ("block_hashes", V::Array(vec![V::from(9)])),
        ("type", s("BlockStored")),
        ("token_ids", toks(32)),
        (
            "mm_keys",
            V::Array(vec![V::Array(vec![map(vec![
                ("type", s("mm_key")),
                ("hash", s("00ff")),
            ])])]),
        ),
    ]);
    // No block_size: one hash over 32 tokens infers a block size of 32.
    let b = decode(V::Array(vec![V::F64(0.0), V::Array(vec![ev]), V::from(0)]));
    let st = only_stored(&b);
    assert_eq!(st.effective_block_size(), Some(32));
    assert_eq!(st.medium.spelling(), "cpu");
    assert!(st.extras.as_ref().unwrap().mm_keys.is_some());
}

#[test]
fn map_batch_with_data_parallel_rank() {
    let ev = map(vec![("type", s("AllBlocksCleared"))]);
    let b = decode(map(vec![
        ("events", V::Array(vec![ev])),
        ("ts", V::F64(2.0)),
        ("data_parallel_rank", V::from(3)),
    ]));
    assert_eq!(b.events, vec![Event::AllBlocksCleared]);
    assert_eq!((b.ts, b.dp_rank), (2.0, Some(3)));
}

#[test]
fn string_token_ids_are_accepted() {
    let ev = map(vec![
        ("type", s("BlockStored")),
        ("block_hashes", V::Array(vec![V::from(1)])),
        ("token_ids", V::Array(vec![s("5"), V::from(6)])),
        ("block_size", V::from(2)),
    ]);
    let b = decode(V::Array(vec![V::F64(0.0), V::Array(vec![ev])]));
    assert_eq!(only_stored(&b).token_ids, vec![5, 6]);
}

fn rejected(ev: V) -> EventError {
    let b = decode(V::Array(vec![
        V::F64(0.0),
        V::Array(vec![ev, V::Array(vec![s("AllBlocksCleared")])]),
    ]));
    assert_eq!(
        b.events,
        vec![Event::AllBlocksCleared],
        "the rest of the batch is kept"
    );
    match &b.skipped[..] {
        [SkippedEvent {
            index: 0,
            reason: SkipReason::Invalid(e),
        }] => *e,
        other => panic!("expected one invalid event, got {other:?}"),
    }
}

#[test]
fn invalid_events_are_rejected_alone() {
    let base = |hashes: V, parent: V, tokens: V, bs: V| {
        V::Array(vec![s("BlockStored"), hashes, parent, tokens, bs])
    };
    let one = || V::Array(vec![V::from(1)]);
    assert_eq!(
        rejected(base(one(), V::from(1), toks(16), V::from(16))),
        EventError::SelfParent
    );
    assert_eq!(
        rejected(base(V::Array(vec![]), V::Nil, toks(16), V::from(16))),
        EventError::EmptyBlockHashes
    );
    assert_eq!(
        rejected(base(one(), V::Nil, toks(16), V::from(0))),
        EventError::ZeroBlockSize
    );
    assert!(matches!(
        rejected(base(one(), V::Nil, toks(40), V::from(16))),
        EventError::TokenCountMismatch {
            tokens: 40,
            blocks: 1,
            block_size: 16
        }
    ));
    assert!(matches!(
        rejected(base(
            V::Array(vec![V::from(1), V::from(2)]),
            V::Nil,
            toks(33),
            V::Nil
        )),
        EventError::TokenCountMismatch { block_size: 0, .. }
    ));
    assert_eq!(
        rejected(base(V::Array(vec![s("x")]), V::Nil, toks(16), V::from(16))),
        EventError::BadHash
    );
    assert_eq!(
        rejected(base(one(), V::Nil, toks(16), s("16"))),
        EventError::FieldType {
            field: "block_size"
        }
    );
    assert!(matches!(
        rejected(base(one(), V::Nil, V::Array(vec![V::from(-1)]), V::from(1))),
        EventError::BadToken { position: 0 }
    ));
    assert_eq!(rejected(V::Array(vec![V::from(3)])), EventError::MissingTag);
}

#[test]
fn partial_last_block_is_accepted() {
    let ev = V::Array(vec![
        s("BlockStored"),
        V::Array(vec![V::from(1), V::from(2)]),
        V::Nil,
        toks(20),
        V::from(16),
    ]);
    let b = decode(V::Array(vec![V::F64(0.0), V::Array(vec![ev])]));
    assert_eq!(only_stored(&b).block_tokens(1).len(), 4);
}

#[test]
fn whole_batch_errors_are_typed() {
    let bad = |v: V| decode_batch(&encode(&v), DecodeOptions::FULL).unwrap_err();
    assert_eq!(bad(V::from(1)), DecodeError::NotABatch);
    assert_eq!(
        bad(V::Array(vec![s("x"), V::Array(vec![])])),
        DecodeError::BadTs
    );
    assert_eq!(
        bad(V::Array(vec![V::F64(0.0), V::from(1)])),
        DecodeError::BadEvents
    );
    assert_eq!(
        bad(V::Array(vec![V::F64(0.0), V::Array(vec![]), s("r")])),
        DecodeError::BadDpRank
    );
    assert_eq!(
        bad(V::Array(vec![V::F64(0.0), V::Array(vec![V::from(1)])])),
        DecodeError::NotAnEvent { index: 0 }
    );
    let mut trailing = encode(&V::Array(vec![V::F64(0.0), V::Array(vec![])]));
    trailing.push(0);
    assert_eq!(
        decode_batch(&trailing, DecodeOptions::FULL),
        Err(DecodeError::TrailingBytes { extra: 1 })
    );
    assert_eq!(
        decode_batch(&[0xc1], DecodeOptions::FULL),
        Err(DecodeError::InvalidMarker { offset: 0 })
    );
    assert_eq!(
        decode_batch(&[0x93, 0xcb, 0x00], DecodeOptions::FULL),
        Err(DecodeError::Truncated { offset: 2 })
    );
}

#[test]
fn index_options_drop_display_only_fields() {
    let ev = map(vec![
        ("type", s("BlockStored")),
        ("block_hashes", V::Array(vec![V::from(1)])),
        ("token_ids", toks(16)),
        ("session_id", s("conv")),
    ]);
    let payload = encode(&V::Array(vec![V::F64(0.0), V::Array(vec![ev])]));
    let b = decode_batch(&payload, DecodeOptions::INDEX).unwrap();
    assert!(only_stored(&b).extras.is_none());
}

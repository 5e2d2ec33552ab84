//! Unit tests of the key/value spellings and of coalescing.

use super::layout::{block_key, field_value, glob_escape, mapping_key, redact_url};
use super::mirror::{key_op, Key, Op};
use super::ValueFormat;
use crate::index::{Delta, FieldValue, ModelId, PodId};
use crate::medium::{MediaSet, Medium, TierWeights};
use crate::wire::{BlockHash, Engine};

fn value(media: &[Medium]) -> FieldValue {
    let mut set = MediaSet::EMPTY;
    for m in media {
        set.insert(*m);
    }
    FieldValue {
        stored_at: 1_700_000_000,
        media: set,
    }
}

#[test]
fn block_and_mapping_keys_use_kthenas_spelling() {
    assert_eq!(
        block_key("llama-3", 18_446_744_073_709_551_615),
        "matrix:kv:block:llama-3@18446744073709551615"
    );
    assert_eq!(
        mapping_key(Engine::Vllm, "pod-a.ns", &BlockHash::from_i64(-5)),
        "vllm:kv:block:pod-a.ns@-5"
    );
    assert_eq!(
        mapping_key(Engine::Sglang, "p.n", &BlockHash::Int(42)),
        "sglang:kv:block:p.n@42"
    );
    assert_eq!(
        mapping_key(Engine::Trtllm, "p.n", &BlockHash::Int(1)),
        "vllm:kv:block:p.n@1"
    );
}

#[test]
fn field_values_follow_the_value_format() {
    let w = TierWeights::default();
    let cpu = Medium::intern("CPU");
    assert_eq!(
        field_value(value(&[Medium::GPU]), ValueFormat::Tiered, &w),
        "1700000000|GPU"
    );
    assert_eq!(
        field_value(value(&[Medium::GPU]), ValueFormat::Timestamp, &w),
        "1700000000"
    );
    assert_eq!(
        field_value(value(&[cpu, Medium::GPU]), ValueFormat::Tiered, &w),
        "1700000000|GPU"
    );
    assert_eq!(
        field_value(value(&[cpu]), ValueFormat::Tiered, &w),
        "1700000000|CPU"
    );
    assert_eq!(
        field_value(value(&[Medium::NONE]), ValueFormat::Tiered, &w),
        "1700000000"
    );
}

#[test]
fn redaction_hides_passwords_only() {
    assert_eq!(
        redact_url("redis://user:s3cret@127.0.0.1:6379/2"),
        "redis://user:***@127.0.0.1:6379/2"
    );
    assert_eq!(
        redact_url("rediss://:s3cret@127.0.0.1/0"),
        "rediss://:***@127.0.0.1/0"
    );
    assert_eq!(
        redact_url("redis://127.0.0.1:6379/0"),
        "redis://127.0.0.1:6379/0"
    );
    assert_eq!(
        redact_url("redis://127.0.0.1/0?pass=s3cret"),
        "redis://127.0.0.1/0?pass=***"
    );
}

#[test]
fn glob_characters_are_escaped() {
    assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
}

#[test]
fn a_store_then_a_remove_of_one_field_coalesces_to_the_delete() {
    let field = |v| Delta::Field {
        model: ModelId(0),
        std_hash: 7,
        pod: PodId(1),
        value: v,
    };
    let mut pending = std::collections::HashMap::new();
    for d in [field(Some(value(&[Medium::GPU]))), field(None)] {
        let (k, op) = key_op(d);
        pending.insert(k, op);
    }
    assert_eq!(pending.len(), 1);
    let key = Key::Field {
        model: ModelId(0),
        std: 7,
        pod: PodId(1),
    };
    assert_eq!(pending.get(&key), Some(&Op::Field(None)));
}

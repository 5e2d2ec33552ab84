//! Unit tests of coalescing. The key and value spellings are tested in `crate::redis_layout`.

use super::key::Key;
use crate::index::{Delta, FieldValue, ModelId, PodId};
use crate::medium::{MediaSet, Medium};
use crate::wire::{BlockHash, Engine};

fn gpu() -> FieldValue {
    let mut media = MediaSet::EMPTY;
    media.insert(Medium::GPU);
    FieldValue {
        stored_at: 1_700_000_000,
        media,
    }
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
    for d in [field(Some(gpu())), field(None)] {
        pending.insert(Key::of(&d), d);
    }
    assert_eq!(pending.len(), 1);
    let key = Key::Field {
        model: ModelId(0),
        std: 7,
        pod: PodId(1),
    };
    assert_eq!(pending.get(&key), Some(&field(None)));
}

#[test]
fn a_key_deletes_itself_as_the_delta_of_its_own_kind() {
    let mapping = Delta::Mapping {
        pod: PodId(2),
        engine: Engine::Sglang,
        engine_hash: BlockHash::from_i64(-9),
        std_hash: Some(5),
    };
    let field = Delta::Field {
        model: ModelId(3),
        std_hash: 4,
        pod: PodId(2),
        value: Some(gpu()),
    };
    for delta in [mapping, field] {
        let key = Key::of(&delta);
        let deletion = key.clone().deletion();
        assert_eq!(Key::of(&deletion), key);
        assert!(matches!(
            deletion,
            Delta::Field { value: None, .. } | Delta::Mapping { std_hash: None, .. }
        ));
        assert_eq!(
            std::mem::discriminant(&deletion),
            std::mem::discriminant(&delta)
        );
    }
}

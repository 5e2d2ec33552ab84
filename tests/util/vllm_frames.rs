//! vLLM-shaped messages built in tests (array era, int hashes), for streams no recording has.

use rmpv::Value as V;

/// The three frames of one message: topic `kv`, `seq`, a batch of `events`.
pub fn message(seq: u64, events: Vec<V>) -> Vec<Vec<u8>> {
    let batch = V::Array(vec![V::F64(1.0), V::Array(events)]);
    let mut payload = Vec::new();
    rmpv::encode::write_value(&mut payload, &batch).unwrap();
    vec![b"kv".to_vec(), seq.to_be_bytes().to_vec(), payload]
}

/// A store of one 16-token block with engine hash `hash` on `medium`, under LoRA `lora`.
pub fn store_one(hash: u64, medium: &str, lora: Option<String>) -> V {
    let tokens: Vec<V> = (0..16).map(|t| V::from(hash * 100 + t)).collect();
    V::Array(vec![
        V::from("BlockStored"),
        V::Array(vec![V::from(hash)]),
        V::Nil,
        V::Array(tokens),
        V::from(16),
        V::Nil,
        V::from(medium),
        lora.map_or(V::Nil, V::from),
    ])
}

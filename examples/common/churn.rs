//! The churning vLLM stream both soak examples publish: stores on GPU and CPU, ~40 %
//! removes, an `AllBlocksCleared` every few thousand messages, from a fixed seed.

use bytes::Bytes;
use rmpv::Value as V;

/// Distinct blocks the stream draws from.
pub const POOL: u64 = 400_000;
/// Events per message.
pub const PER_MESSAGE: usize = 100;
/// A clear every this many messages.
pub const CLEAR_EVERY: u64 = 4000;

#[path = "../../benches/common/rng.rs"]
mod rng;
pub use rng::Rng;

fn store(block: u64, medium: &str) -> V {
    let tokens: Vec<V> = (0..16).map(|t| V::from(block * 16 + t)).collect();
    V::Array(vec![
        V::from("BlockStored"),
        V::Array(vec![V::from(block.wrapping_mul(0x9E37_79B9_7F4A_7C15))]),
        V::Nil,
        V::Array(tokens),
        V::from(16),
        V::Nil,
        V::from(medium),
        V::Nil,
    ])
}

fn remove(block: u64) -> V {
    V::Array(vec![
        V::from("BlockRemoved"),
        V::Array(vec![V::from(block.wrapping_mul(0x9E37_79B9_7F4A_7C15))]),
        V::Nil,
    ])
}

/// Message `seq` of the stream, as three frames.
pub fn message(seq: u64, rng: &mut Rng) -> Vec<Bytes> {
    let events: Vec<V> = if seq > 0 && seq.is_multiple_of(CLEAR_EVERY) {
        vec![V::Array(vec![V::from("AllBlocksCleared")])]
    } else {
        (0..PER_MESSAGE)
            .map(|_| {
                let r = rng.next();
                let block = (r >> 8) % POOL;
                match r % 10 {
                    0..=3 => remove(block),
                    4..=5 => store(block, "CPU"),
                    _ => store(block, "GPU"),
                }
            })
            .collect()
    };
    let batch = V::Array(vec![V::F64(1.0), V::Array(events)]);
    let mut payload = Vec::new();
    rmpv::encode::write_value(&mut payload, &batch).expect("encode into a Vec");
    vec![
        Bytes::from_static(b"kv"),
        Bytes::copy_from_slice(&seq.to_be_bytes()),
        Bytes::from(payload),
    ]
}

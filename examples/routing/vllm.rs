//! What a simulated pod puts on the wire: vLLM's event batches (the array era of 0.14–0.23:
//! `[ts, events, dp_rank]`, tagged array events, unsigned int hashes), with engine-private
//! hashes (each pod salts its block identities, as each vLLM process has its own hashes).

use rmpv::Value as V;

use crate::engine::{BlockId, Change, BLOCK_SIZE};

/// A pod's private hash of a block.
pub fn wire_hash(salt: u64, block: BlockId) -> u64 {
    splitmix(block ^ salt)
}

/// A pod's hash salt, from its index and the run's seed.
pub fn pod_salt(seed: u64, pod: usize) -> u64 {
    splitmix(seed ^ splitmix(pod as u64 + 1))
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn event(salt: u64, change: &Change) -> V {
    match change {
        Change::Stored {
            blocks,
            parent,
            tokens,
            tier,
        } => V::Array(vec![
            V::from("BlockStored"),
            V::Array(
                blocks
                    .iter()
                    .map(|b| V::from(wire_hash(salt, *b)))
                    .collect(),
            ),
            parent.map_or(V::Nil, |p| V::from(wire_hash(salt, p))),
            V::Array(tokens.iter().map(|t| V::from(*t)).collect()),
            V::from(BLOCK_SIZE as u64),
            V::Nil,
            V::from(tier.medium()),
            V::Nil,
        ]),
        Change::Removed { block, tier } => V::Array(vec![
            V::from("BlockRemoved"),
            V::Array(vec![V::from(wire_hash(salt, *block))]),
            V::from(tier.medium()),
        ]),
    }
}

/// One batch's msgpack payload: `[ts, events, 0]`.
pub fn payload(ts: f64, salt: u64, changes: &[Change]) -> Vec<u8> {
    let events = changes.iter().map(|c| event(salt, c)).collect();
    let batch = V::Array(vec![V::F64(ts), V::Array(events), V::from(0)]);
    let mut out = Vec::new();
    // Writing into a Vec cannot fail.
    let _ = rmpv::encode::write_value(&mut out, &batch);
    out
}

/// The three frames of message `seq`: empty topic, 8-byte big-endian seq, payload.
pub fn frames(seq: u64, payload: Vec<u8>) -> Vec<Vec<u8>> {
    vec![Vec::new(), seq.to_be_bytes().to_vec(), payload]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{block_ids, Tier};
    use kvindex::{medium::Medium, wire::BlockHash, wire::Event};

    #[test]
    fn kvindex_decodes_what_a_pod_publishes() {
        let tokens: Vec<u32> = (0..48).collect();
        let ids = block_ids(&tokens);
        let salt = pod_salt(1, 3);
        let changes = vec![
            Change::Removed {
                block: 77,
                tier: Tier::Gpu,
            },
            Change::Stored {
                blocks: ids[1..].to_vec(),
                parent: Some(ids[0]),
                tokens: tokens[16..].to_vec(),
                tier: Tier::Gpu,
            },
            Change::Stored {
                blocks: vec![ids[0]],
                parent: None,
                tokens: Vec::new(),
                tier: Tier::Cpu,
            },
        ];
        let batch = kvindex::wire::decode_batch(
            &payload(2.5, salt, &changes),
            kvindex::wire::DecodeOptions::INDEX,
        )
        .expect("decodes");
        assert_eq!(batch.dp_rank, Some(0));
        assert_eq!(batch.events.len(), 3);
        let Event::BlockRemoved(removed) = &batch.events[0] else {
            panic!("a remove first")
        };
        assert_eq!(
            removed.block_hashes,
            vec![BlockHash::Int(wire_hash(salt, 77))]
        );
        let Event::BlockStored(stored) = &batch.events[1] else {
            panic!("then a store")
        };
        assert_eq!(stored.block_hashes.len(), 2);
        assert_eq!(
            stored.parent_block_hash,
            Some(BlockHash::Int(wire_hash(salt, ids[0])))
        );
        assert_eq!(stored.token_ids, tokens[16..]);
        assert_eq!(stored.medium, Medium::GPU);
        let Event::BlockStored(offloaded) = &batch.events[2] else {
            panic!("an offload")
        };
        assert!(offloaded.token_ids.is_empty());
        assert_ne!(wire_hash(salt, 77), wire_hash(pod_salt(1, 4), 77));
    }
}

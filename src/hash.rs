//! The standardized block hash kthena routers compute (DESIGN.md §3).
//!
//! Engine hashes are chained and salted per process, so a router cannot recompute them.
//! kthena hashes each block's own tokens instead: the first 8 bytes (big-endian) of
//! SHA-256 over every token id as a 4-byte big-endian integer, with the top bit cleared.

use sha2::{Digest, Sha256};

/// Default tokens per block when a router hashes a prompt.
pub const DEFAULT_BLOCK_SIZE: usize = 16;
/// Default cap on the number of prompt blocks a router hashes.
pub const DEFAULT_MAX_BLOCKS: usize = 128;

/// A standardized block hash: 63 bits, so it always fits an `i64` as well.
pub type StdHash = u64;

/// Hashes one block of tokens the way kthena does.
///
/// ```
/// let tokens: Vec<u32> = (1..=16).collect();
/// assert_eq!(kvindex::hash::std_hash(&tokens), 6615856733697512468);
/// ```
pub fn std_hash(tokens: &[u32]) -> StdHash {
    // One update per 64-token chunk keeps the copy on the stack and hands SHA-256 whole
    // compression blocks, which is what makes the SHA-NI path fast.
    let mut hasher = Sha256::new();
    let mut buf = [0u8; 256];
    for chunk in tokens.chunks(64) {
        for (slot, token) in buf.chunks_exact_mut(4).zip(chunk) {
            slot.copy_from_slice(&token.to_be_bytes());
        }
        hasher.update(&buf[..chunk.len() * 4]);
    }
    let digest = hasher.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first) & 0x7FFF_FFFF_FFFF_FFFF
}

/// Splits a prompt into blocks of `block_size` tokens (the last, partial chunk counts),
/// keeps at most `max_blocks` of them and hashes each.
///
/// ```
/// let prompt: Vec<u32> = (1..=35).collect();
/// let blocks = kvindex::hash::prompt_block_hashes(&prompt, 16, 128);
/// assert_eq!(blocks.len(), 3); // 16 + 16 + a partial block of 3
/// ```
pub fn prompt_block_hashes(tokens: &[u32], block_size: usize, max_blocks: usize) -> Vec<StdHash> {
    let block_size = block_size.max(1);
    tokens
        .chunks(block_size)
        .take(max_blocks)
        .map(std_hash)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_values_match_kthena() {
        let first: Vec<u32> = (1..=16).collect();
        let second: Vec<u32> = (17..=32).collect();
        assert_eq!(std_hash(&first), 6615856733697512468);
        assert_eq!(std_hash(&second), 1408734799202240436);
        assert_eq!(std_hash(&[0; 16]), 8477460337017888816);
        assert_eq!(std_hash(&[151643, 872, 198]), 7071565293864110551);
    }

    #[test]
    fn long_blocks_hash_the_same_as_one_update() {
        let tokens: Vec<u32> = (0..200).collect();
        let mut bytes = Vec::new();
        for t in &tokens {
            bytes.extend_from_slice(&t.to_be_bytes());
        }
        let digest = Sha256::digest(&bytes);
        let expected = u64::from_be_bytes(digest[..8].try_into().unwrap()) & 0x7FFF_FFFF_FFFF_FFFF;
        assert_eq!(std_hash(&tokens), expected);
    }

    #[test]
    fn prompt_chunks_keep_partial_last_block_and_cap() {
        let tokens: Vec<u32> = (1..=35).collect();
        let hashes = prompt_block_hashes(&tokens, 16, 128);
        assert_eq!(hashes.len(), 3);
        assert_eq!(hashes[0], 6615856733697512468);
        assert_eq!(hashes[1], 1408734799202240436);
        assert_eq!(hashes[2], std_hash(&[33, 34, 35]));
        assert_eq!(prompt_block_hashes(&tokens, 16, 2).len(), 2);
        assert!(prompt_block_hashes(&[], 16, 128).is_empty());
    }
}

//! Block hashes a router can compute from a prompt (docs/architecture.md §2).
//!
//! Engine hashes are chained and salted per process, so a router cannot recompute them.
//! Two router-side identities are kept instead:
//! - the **std hash** kthena uses: each block's own tokens, the first 8 bytes (big-endian)
//!   of SHA-256 over every token id as a 4-byte big-endian integer, top bit cleared. It
//!   names a block by content only, so the same 16 tokens after another prefix look alike;
//! - the **chain hash** of `prefix` matching: XXH3 of the block's tokens seeded with the
//!   parent block's chain hash, the first block seeded by its model name. It names the
//!   whole prefix up to and including the block, so a spliced prompt never matches a pod
//!   that holds the same blocks after another prefix.

use sha2::{Digest, Sha256};
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

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

/// A chain hash: identity of a block together with every block before it. Never 0 (0 marks
/// a block whose chain is unknown in the index).
pub type ChainHash = u64;

/// The chain hash a model's first blocks are seeded with: models (and LoRA adapters) never
/// share chains, so one map serves them all.
pub fn model_seed(model: &str) -> ChainHash {
    xxh3_64(model.as_bytes())
}

/// The seed of a chain whose first block was stored under tenant `salt` (vLLM's and
/// SGLang's `cache_salt`): chains of different salts, and salted and unsalted chains, never
/// share a hash, so a salted block matches only prompts carrying the same salt.
pub fn salted_seed(seed: ChainHash, salt: &str) -> ChainHash {
    const SALT_DOMAIN: u64 = 0x6b76_7361_6c74_0001;
    xxh3_64_with_seed(salt.as_bytes(), seed ^ SALT_DOMAIN).max(1)
}

/// The seed a prompt of `model` starts its chain at: the model's own, or salted by a
/// non-empty tenant `salt` ([`salted_seed`]).
pub fn prompt_seed(model: &str, salt: Option<&str>) -> ChainHash {
    let seed = model_seed(model);
    match salt.filter(|salt| !salt.is_empty()) {
        Some(salt) => salted_seed(seed, salt),
        None => seed,
    }
}

/// The chain hash of a block of `tokens` whose parent block has chain hash `parent` (the
/// model's [`model_seed`] for a first block).
///
/// ```
/// use kvindex::hash::{chain_hash, model_seed};
/// let seed = model_seed("m");
/// let a = chain_hash(chain_hash(seed, &[1; 16]), &[2; 16]);
/// let b = chain_hash(chain_hash(seed, &[3; 16]), &[2; 16]);
/// assert_ne!(a, b); // the same block after another prefix is another chain
/// ```
#[inline]
pub fn chain_hash(parent: ChainHash, tokens: &[u32]) -> ChainHash {
    // A block of up to 64 tokens (every engine's usual size) is one XXH3 call, without the
    // chunk iterator: a chain hash is on every stored block's and every prompt block's path.
    // A branch of its own, measured: a loop that splits 64 tokens off by hand costs what
    // the iterator does (92 instructions a block against 78).
    if (1..=64).contains(&tokens.len()) {
        return hash_le_tokens(tokens, parent).max(1);
    }
    let mut h = parent;
    for chunk in tokens.chunks(64) {
        h = hash_le_tokens(chunk, h);
    }
    h.max(1)
}

/// XXH3 of up to 64 tokens as little-endian bytes, seeded: on a little-endian machine the
/// tokens' own memory, with no copy (a block is hashed on every store's path). Inlined,
/// with [`chain_hash`] into a store's loop, so that no call's register saves queue behind
/// the source map's cache miss.
#[cfg(target_endian = "little")]
#[inline(always)]
fn hash_le_tokens(tokens: &[u32], seed: u64) -> u64 {
    xxh3_64_with_seed(bytemuck::cast_slice(tokens), seed)
}

/// XXH3 of up to 64 tokens as little-endian bytes, seeded (copied to little-endian first).
#[cfg(target_endian = "big")]
fn hash_le_tokens(tokens: &[u32], seed: u64) -> u64 {
    let mut buf = [0u8; 256];
    for (slot, token) in buf.chunks_exact_mut(4).zip(tokens) {
        slot.copy_from_slice(&token.to_le_bytes());
    }
    xxh3_64_with_seed(&buf[..tokens.len() * 4], seed)
}

/// A cheap content identity of one block's `tokens` (XXH3, below 2^63): what a `prefix`-only
/// index keeps in place of the SHA-256 std hash, to tell an engine hash reused for other
/// content. Never written anywhere: kthena's std hash is [`std_hash`].
pub(crate) fn content_hash(tokens: &[u32]) -> u64 {
    const CONTENT_SEED: u64 = 0x6b76_696e_6465_7801;
    chain_hash(CONTENT_SEED, tokens) & !(1 << 63)
}

/// A bijective 64-bit mixer (the splitmix64 finalizer): spreads small ids over all bits, so
/// an XOR of mixed values fingerprints a set.
pub(crate) fn mix64(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The chain hashes of a prompt of `model`, cut like [`prompt_block_hashes`].
///
/// ```
/// let prompt: Vec<u32> = (1..=35).collect();
/// assert_eq!(kvindex::hash::prompt_chain_hashes("m", &prompt, 16, 128).len(), 3);
/// ```
pub fn prompt_chain_hashes(
    model: &str,
    tokens: &[u32],
    block_size: usize,
    max_blocks: usize,
) -> Vec<ChainHash> {
    prompt_chain_hashes_from(model_seed(model), tokens, block_size, max_blocks)
}

/// The chain hashes of a prompt whose chain starts at `seed` ([`prompt_seed`]), cut like
/// [`prompt_block_hashes`].
pub fn prompt_chain_hashes_from(
    seed: ChainHash,
    tokens: &[u32],
    block_size: usize,
    max_blocks: usize,
) -> Vec<ChainHash> {
    let mut parent = seed;
    prompt_chunks(tokens, block_size, max_blocks)
        .map(|block| {
            parent = chain_hash(parent, block);
            parent
        })
        .collect()
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
    prompt_chunks(tokens, block_size, max_blocks)
        .map(std_hash)
        .collect()
}

/// A prompt's blocks as kthena cuts them: `block_size` tokens each (the last, partial
/// chunk counts), at most `max_blocks`. Every prompt hash is of these blocks.
pub(crate) fn prompt_chunks(
    tokens: &[u32],
    block_size: usize,
    max_blocks: usize,
) -> impl Iterator<Item = &[u32]> {
    tokens.chunks(block_size.max(1)).take(max_blocks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_hash_is_xxh3_of_little_endian_tokens_64_at_a_time() {
        // Chain hashes are kept in checkpoints: the value must never change with how the
        // bytes are read. The reference spells the bytes out one token at a time.
        let reference = |parent: u64, tokens: &[u32]| {
            let mut h = parent;
            for chunk in tokens.chunks(64) {
                let bytes: Vec<u8> = chunk.iter().flat_map(|t| t.to_le_bytes()).collect();
                h = xxh3_64_with_seed(&bytes, h);
            }
            h.max(1)
        };
        let tokens: Vec<u32> = (0..200u32).map(|t| t.wrapping_mul(0x9E37_79B9)).collect();
        for len in [0, 1, 15, 16, 63, 64, 65, 128, 200] {
            assert_eq!(chain_hash(7, &tokens[..len]), reference(7, &tokens[..len]));
        }
        assert_eq!(
            chain_hash(model_seed("m"), &[1, 2, 3]),
            1_097_058_472_873_306_365
        );
    }

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
    fn chain_hashes_depend_on_every_earlier_block_and_the_model() {
        let tokens: Vec<u32> = (0..48).collect();
        let chain = prompt_chain_hashes("m", &tokens, 16, 128);
        assert_eq!(chain.len(), 3);
        let seed = model_seed("m");
        assert_eq!(chain[0], chain_hash(seed, &tokens[..16]));
        assert_eq!(chain[2], chain_hash(chain[1], &tokens[32..]));
        let mut spliced = tokens.clone();
        spliced[0] = 999;
        let other = prompt_chain_hashes("m", &spliced, 16, 128);
        assert!(other.iter().zip(&chain).all(|(a, b)| a != b));
        assert_ne!(prompt_chain_hashes("lora", &tokens, 16, 128)[0], chain[0]);
        assert_ne!(chain_hash(seed, &[]), 0);
    }

    #[test]
    fn salts_seed_chains_apart_and_an_empty_salt_is_none() {
        let tokens: Vec<u32> = (0..32).collect();
        let plain = prompt_chain_hashes("m", &tokens, 16, 8);
        let seeded = |salt| prompt_chain_hashes_from(prompt_seed("m", salt), &tokens, 16, 8);
        assert_eq!(seeded(None), plain);
        assert_eq!(seeded(Some("")), plain);
        let a = seeded(Some("tenant-a"));
        assert_ne!(a, plain);
        assert_ne!(a, seeded(Some("tenant-b")));
        assert_eq!(a[1], chain_hash(a[0], &tokens[16..]));
        assert_ne!(prompt_seed("m", Some("x")), prompt_seed("n", Some("x")));
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

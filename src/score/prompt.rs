//! Prompt tokens → block hashes, the way a kthena router chunks them: std hashes for
//! `kthena` matching, chain hashes for `prefix` matching.

use serde::{Deserialize, Serialize};

use crate::hash::{
    prompt_block_hashes, prompt_chain_hashes, prompt_chain_hashes_from, prompt_chunks, prompt_seed,
    std_hash, ChainHash, StdHash, DEFAULT_BLOCK_SIZE, DEFAULT_MAX_BLOCKS,
};

/// How a prompt's blocks are matched against what pods hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MatchMode {
    /// Chain-verified: a pod matches block i only if it holds blocks 0..=i as one chain
    /// (the same prefix), so a spliced prompt is never a false hit. In-memory index only.
    #[default]
    Prefix,
    /// kthena's router semantics: each block by its own tokens (std hash), whatever came
    /// before it. What the Redis layout supports.
    Kthena,
}

impl MatchMode {
    /// The spelling used in requests and flags.
    pub fn as_str(self) -> &'static str {
        match self {
            MatchMode::Prefix => "prefix",
            MatchMode::Kthena => "kthena",
        }
    }
}

impl std::str::FromStr for MatchMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "prefix" => Ok(MatchMode::Prefix),
            "kthena" => Ok(MatchMode::Kthena),
            other => Err(format!("unknown match mode `{other}` (prefix or kthena)")),
        }
    }
}

/// Why prompt settings were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PromptError {
    /// A block size of 0.
    #[error("block size must be at least 1 token")]
    ZeroBlockSize,
    /// A block cap of 0.
    #[error("max blocks must be at least 1")]
    ZeroMaxBlocks,
}

/// How a prompt is cut into blocks: tokens per block and the cap on the block count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptSettings {
    block_size: usize,
    max_blocks: usize,
}

impl Default for PromptSettings {
    fn default() -> Self {
        PromptSettings {
            block_size: DEFAULT_BLOCK_SIZE,
            max_blocks: DEFAULT_MAX_BLOCKS,
        }
    }
}

impl PromptSettings {
    /// Settings with `block_size` tokens per block and at most `max_blocks` blocks.
    ///
    /// # Errors
    /// [`PromptError`] when either is 0.
    pub fn new(block_size: usize, max_blocks: usize) -> Result<PromptSettings, PromptError> {
        if block_size == 0 {
            return Err(PromptError::ZeroBlockSize);
        }
        if max_blocks == 0 {
            return Err(PromptError::ZeroMaxBlocks);
        }
        Ok(PromptSettings {
            block_size,
            max_blocks,
        })
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Cap on the number of blocks scored.
    pub fn max_blocks(&self) -> usize {
        self.max_blocks
    }

    /// The prompt's block hashes (the last, partial chunk is a block), at most `max_blocks`.
    pub fn hash(&self, tokens: &[u32]) -> Vec<StdHash> {
        prompt_block_hashes(tokens, self.block_size, self.max_blocks)
    }

    /// [`Self::hash`], taking a block's std hash from `known` (given the prompt's chain
    /// hashes of `model`, one answer per block) where it has one and computing SHA-256 only
    /// for the rest: the same hashes, as a chain hash names its block's tokens.
    pub fn hash_with_known(
        &self,
        model: &str,
        tokens: &[u32],
        known: impl FnOnce(&[ChainHash]) -> Vec<Option<StdHash>>,
    ) -> Vec<StdHash> {
        let chains = prompt_chain_hashes(model, tokens, self.block_size, self.max_blocks);
        let known = known(&chains);
        prompt_chunks(tokens, self.block_size, self.max_blocks)
            .enumerate()
            .map(|(i, block)| (known.get(i).copied().flatten()).unwrap_or_else(|| std_hash(block)))
            .collect()
    }

    /// The prompt's block hashes for `mode`: std hashes ([`Self::hash`]) for `kthena`, chain
    /// hashes of `model` for `prefix`; cut the same way.
    pub fn blocks(&self, model: &str, tokens: &[u32], mode: MatchMode) -> Vec<u64> {
        self.salted_blocks(model, None, tokens, mode)
    }

    /// [`Self::blocks`] of a prompt sent under tenant `salt`: in `prefix` mode its chain
    /// starts at the salted seed ([`prompt_seed`]), so it matches only blocks stored under
    /// the same salt; `kthena` mode is content-only and ignores it.
    pub fn salted_blocks(
        &self,
        model: &str,
        salt: Option<&str>,
        tokens: &[u32],
        mode: MatchMode,
    ) -> Vec<u64> {
        match mode {
            MatchMode::Kthena => self.hash(tokens),
            MatchMode::Prefix => {
                let seed = prompt_seed(model, salt);
                prompt_chain_hashes_from(seed, tokens, self.block_size, self.max_blocks)
            }
        }
    }

    /// The same settings with at most `max_blocks` blocks (a request's own, smaller cap).
    pub fn capped(self, max_blocks: usize) -> PromptSettings {
        PromptSettings {
            max_blocks: max_blocks.clamp(1, self.max_blocks),
            ..self
        }
    }

    /// Caller-supplied block hashes cut to `max_blocks`, as if the router had hashed them.
    pub fn cap<'a>(&self, hashes: &'a [StdHash]) -> &'a [StdHash] {
        &hashes[..hashes.len().min(self.max_blocks)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_kthenas_and_zero_is_refused() {
        let s = PromptSettings::default();
        assert_eq!((s.block_size(), s.max_blocks()), (16, 128));
        assert_eq!(PromptSettings::new(0, 1), Err(PromptError::ZeroBlockSize));
        assert_eq!(PromptSettings::new(1, 0), Err(PromptError::ZeroMaxBlocks));
    }

    #[test]
    fn hashing_keeps_partial_block_and_caps() {
        let s = PromptSettings::new(4, 2).unwrap();
        let hashes = s.hash(&[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(
            hashes,
            vec![std_hash(&[1, 2, 3, 4]), std_hash(&[5, 6, 7, 8])]
        );
        let s = PromptSettings::new(4, 8).unwrap();
        assert_eq!(s.hash(&[1, 2, 3, 4, 5]).len(), 2);
        assert_eq!(s.cap(&[1, 2, 3]).len(), 3);
        assert_eq!(PromptSettings::new(4, 2).unwrap().cap(&[1, 2, 3]), &[1, 2]);
    }

    #[test]
    fn known_std_hashes_stand_in_for_sha256_and_the_rest_are_computed() {
        let s = PromptSettings::new(4, 3).unwrap();
        let tokens: Vec<u32> = (1..=14).collect();
        let chains = prompt_chain_hashes("m", &tokens, 4, 3);
        // What an index holding the first and third block would answer.
        let known = |asked: &[ChainHash]| {
            assert_eq!(asked, chains, "asked for the prompt's chain hashes");
            vec![
                Some(std_hash(&[1, 2, 3, 4])),
                None,
                Some(std_hash(&[9, 10, 11, 12])),
            ]
        };
        assert_eq!(s.hash_with_known("m", &tokens, known), s.hash(&tokens));
        // A known answer is taken as it is, and a missing one is computed.
        let sentinel = |asked: &[ChainHash]| vec![Some(7); asked.len() - 1];
        let hashes = s.hash_with_known("m", &tokens, sentinel);
        assert_eq!(hashes, [7, 7, std_hash(&[9, 10, 11, 12])]);
        // A partial last block is a block, as in `hash`.
        let tokens: Vec<u32> = (1..=6).collect();
        let none = |asked: &[ChainHash]| vec![None; asked.len()];
        assert_eq!(s.hash_with_known("m", &tokens, none), s.hash(&tokens));
    }

    #[test]
    fn blocks_follow_the_mode_and_modes_parse() {
        let s = PromptSettings::new(4, 2).unwrap();
        let tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9];
        assert_eq!(s.blocks("m", &tokens, MatchMode::Kthena), s.hash(&tokens));
        let chain = crate::hash::prompt_chain_hashes("m", &tokens, 4, 2);
        assert_eq!(s.blocks("m", &tokens, MatchMode::Prefix), chain);
        assert_eq!("kthena".parse(), Ok(MatchMode::Kthena));
        assert_eq!("prefix".parse(), Ok(MatchMode::Prefix));
        assert!("radix".parse::<MatchMode>().is_err());
        assert_eq!(MatchMode::default().as_str(), "prefix");
    }
}

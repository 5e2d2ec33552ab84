//! Warm starts: a source's engine blocks rebuilt from a checkpoint, parents before children,
//! so restored chains are runs again.

use hashbrown::HashMap;

use super::{Mutation, StoreHashes};
use crate::index::{EngineState, Index, IndexError, SourceId};
use crate::wire::BlockHash;

impl Index {
    /// Rebuilds one engine block of `source` from a checkpoint (a warm start): the block of
    /// `model` is held on `state.media` since `state.stored_at`. No delta is emitted, since
    /// the mirror the checkpoint came from already holds it; counters are kept as usual.
    ///
    /// # Errors
    /// [`IndexError::UnknownSource`] when `source` is not registered.
    pub fn restore_block(
        &self,
        source: SourceId,
        model: &str,
        engine_hash: &BlockHash,
        state: EngineState,
    ) -> Result<(), IndexError> {
        let block = [(engine_hash.clone(), state)];
        self.restore_blocks(source, model, &block).map(|_| ())
    }

    /// Rebuilds engine blocks of `source` and `model` from a checkpoint, as
    /// [`Self::restore_block`] does each, parents before children (a checkpoint is read in
    /// no order): a chain block restored after its parent goes right after it, so restored
    /// chains are runs again, followed by a query without a probe per block. Returns the
    /// number of blocks restored: not those without a medium, nor any past the source's
    /// cap of distinct models.
    ///
    /// # Errors
    /// [`IndexError::UnknownSource`] when `source` is not registered.
    pub fn restore_blocks(
        &self,
        source: SourceId,
        model: &str,
        blocks: &[(BlockHash, EngineState)],
    ) -> Result<usize, IndexError> {
        let source = self.source(source)?;
        let mut source = source.lock();
        let model = if *self.inner.models.name(source.base_model) == *model {
            Some(source.base_model)
        } else {
            // Past the source's cap of distinct models the blocks are not restored (nor
            // counted as restored); the engine stores them again if it holds them.
            source.lora_model(model).map(|(id, _)| id)
        };
        let mut restored = 0;
        if let Some(model) = model {
            let (order, continued) = parents_first(blocks);
            let mut sink = crate::index::Discard;
            // One mutation for the key (its counts merged once, the model's block map looked
            // up once), each block with its own store time; the runs are locked per block,
            // as per event when applying, so queries wait for one block at most.
            let mut mutation = Mutation::new(self, &mut source, &mut sink, 0);
            for i in order {
                let (hash, state) = &blocks[i];
                if state.media.is_empty() {
                    continue;
                }
                mutation.now = state.stored_at;
                // A block another one names as its parent goes with its continuation, in a
                // run of its own; any other one without a parent here joins the open run,
                // as a chain start stored alone does.
                mutation.alone = !continued[i];
                // The checkpoint keeps the chain hash, so a warm start matches in `prefix`
                // mode too (an entry written before it did has none: `kthena` only until
                // re-stored), and its parent's, after which the block goes.
                let block = StoreHashes {
                    std: state.std_hash,
                    chain: state.chain,
                    parent: state.parent,
                };
                mutation.store_block(model, hash, Some(block), state.media);
                mutation.chains = None;
                restored += 1;
            }
        }
        source.settle(false);
        Ok(restored)
    }
}

/// The positions of `blocks` ordered so that a block whose parent (by chain hash) is among
/// them comes after it, and per position whether another block names it as its parent.
/// Each block is taken once, so a parent loop (only a forged checkpoint has one) cannot
/// hold the walk up.
fn parents_first(blocks: &[(BlockHash, EngineState)]) -> (Vec<usize>, Vec<bool>) {
    let by_chain: HashMap<u64, usize> = (blocks.iter().enumerate())
        .filter(|(_, (_, state))| state.chain != 0)
        .map(|(i, (_, state))| (state.chain, i))
        .collect();
    let parent_of = |i: usize| by_chain.get(&blocks[i].1.parent).copied();
    let mut continued = vec![false; blocks.len()];
    for i in 0..blocks.len() {
        if let Some(parent) = parent_of(i) {
            continued[parent] = true;
        }
    }
    let mut taken = vec![false; blocks.len()];
    let mut order = Vec::with_capacity(blocks.len());
    let mut line = Vec::new();
    for first in 0..blocks.len() {
        // Up the parents not taken yet, then down again.
        let mut at = Some(first);
        while let Some(i) = at.filter(|&i| !taken[i]) {
            taken[i] = true;
            line.push(i);
            at = parent_of(i);
        }
        order.extend(line.drain(..).rev());
    }
    (order, continued)
}

//! [`Adoption`]: adopting what another writer left (kthena's sidecars, an earlier kvindex): a remove of an
//! engine hash the index does not know falls back to the mapping key in Redis, as kthena's
//! runtime does, so a cluster can switch to kvindex without flushing Redis.
//!
//! Per flush, one pipeline of `GET`s resolves every such remove to a std hash; a second one
//! deletes the pod's field of that block (unless the index holds the block for the pod) and
//! the mapping key (unless a source of the pod holds the engine hash by now). Both checks
//! read the index when the commands are built, so the order relative to the flush does not
//! matter.

use std::sync::atomic::Ordering;

use redis::Value;

use super::link::Link;
use crate::index::{Delta, ModelId, PodId};
use crate::metrics;
use crate::redis_layout::{block_key, mapping_key};
use crate::wire::{BlockHash, Engine};

/// Unknown removes kept while Redis is down; past it they are dropped (the anti-entropy
/// pass after the reconcile deletes what they would have).
const ADOPT_CAP: usize = 100_000;
/// Removes resolved per pipeline.
const ADOPT_CHUNK: usize = 1000;

/// One remove of an engine hash the index did not know: adopted from Redis's mapping key.
#[derive(Debug, Clone)]
struct Adopt {
    pod: PodId,
    engine: Engine,
    model: ModelId,
    hash: BlockHash,
}

/// The unknown removes waiting for the next flush.
#[derive(Default)]
pub(super) struct Adoption {
    queue: Vec<Adopt>,
}

impl Adoption {
    /// Queues a remove the index could not resolve; false when it was dropped (not an
    /// unknown remove, or the queue is full).
    pub(super) fn queue(&mut self, delta: Delta) -> bool {
        let Delta::UnknownRemove {
            pod,
            engine,
            model,
            engine_hash,
        } = delta
        else {
            return false;
        };
        if self.queue.len() >= ADOPT_CAP {
            return false;
        }
        self.queue.push(Adopt {
            pod,
            engine,
            model,
            hash: engine_hash,
        });
        true
    }

    /// Whether no remove waits.
    pub(super) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Drops every waiting remove (a standby resolves nothing).
    pub(super) fn clear(&mut self) {
        self.queue.clear();
    }

    /// Resolves the queued unknown removes through Redis's mapping keys. On a failure the
    /// chunk in hand is kept for after the reconcile (the anti-entropy pass backs this up).
    pub(super) async fn resolve(&mut self, link: &mut Link) -> Result<(), redis::RedisError> {
        while !self.queue.is_empty() {
            let take = self.queue.len().min(ADOPT_CHUNK);
            let from = self.queue.len() - take;
            let chunk: Vec<Adopt> = self.queue.drain(from..).collect();
            if let Err(err) = adopt_chunk(link, &chunk).await {
                self.queue.extend(chunk);
                return Err(err);
            }
        }
        Ok(())
    }
}

async fn adopt_chunk(link: &mut Link, chunk: &[Adopt]) -> Result<(), redis::RedisError> {
    let mut reads = redis::pipe();
    for a in chunk {
        let pod = link.pod_name(a.pod);
        reads.get(mapping_key(a.engine, &pod, &a.hash));
    }
    let values: Vec<Value> = link.read(&reads).await?;
    let owned = link.index.owned_pods();
    let mut writes = redis::pipe();
    let mut adopted = 0u64;
    for (a, value) in chunk.iter().zip(values) {
        let std = redis::from_redis_value::<Option<String>>(value)
            .ok()
            .flatten()
            .and_then(|v| v.trim().parse::<u64>().ok());
        let Some(std) = std else { continue };
        if owned.engine_hash_std(a.pod, &a.hash).is_some() {
            // Stored again since: the key is ours now.
            continue;
        }
        let pod = link.pod_name(a.pod);
        if link.index.field_value(a.model, std, a.pod).is_none() {
            let bk = block_key(&link.model_name(a.model), std);
            writes.hdel(bk, &*pod).ignore();
        }
        writes.del(mapping_key(a.engine, &pod, &a.hash)).ignore();
        adopted += 1;
    }
    if adopted > 0 {
        link.send(&writes).await?;
        (link.shared.upkeep.adopted_removes).fetch_add(adopted, Ordering::Relaxed);
        metrics::mirror_adopted_removes(adopted);
        tracing::debug!(
            adopted,
            asked = chunk.len(),
            "Removed state another writer left, found through its mapping keys."
        );
    }
    Ok(())
}

//! Adopting what another writer left (kthena's sidecars, an earlier kvindex): a remove of an
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
use tokio::time::Instant;

use super::anti_entropy::Adopt;
use super::mirror::Writer;
use crate::index::Delta;
use crate::metrics;
use crate::redis_layout::{block_key, mapping_key};

/// Unknown removes kept while Redis is down; past it they are dropped (the anti-entropy
/// pass after the reconcile deletes what they would have).
const ADOPT_CAP: usize = 100_000;
/// Removes resolved per pipeline.
const ADOPT_CHUNK: usize = 1000;

impl Writer {
    /// Hook of `absorb`: queues a remove the index could not resolve.
    pub(super) fn queue_adopt(&mut self, delta: Delta) {
        let Delta::UnknownRemove {
            pod,
            engine,
            model,
            engine_hash,
        } = delta
        else {
            return;
        };
        if self.entropy.adopt.len() >= ADOPT_CAP {
            return;
        }
        if !self.has_pending() {
            self.flush_at = Instant::now() + self.config().flush_interval;
        }
        self.entropy.adopt.push(Adopt {
            pod,
            engine,
            model,
            hash: engine_hash,
        });
    }

    /// Whether deltas or unknown removes wait for the next flush.
    pub(super) fn has_pending(&self) -> bool {
        !self.pending.is_empty() || !self.entropy.adopt.is_empty() || self.watermarks_due()
    }

    /// The flush of the writer's loop: the pending deltas, then the queued unknown removes.
    pub(super) async fn flush_all(&mut self) {
        self.flush_now().await;
        if !self.entropy.adopt.is_empty() {
            // Adoption reads mapping keys that pipelines in flight may still write.
            self.drain_inflight().await;
        }
        if !self.dirty {
            self.adopt_now().await;
        }
    }

    /// Resolves the queued unknown removes through Redis's mapping keys.
    async fn adopt_now(&mut self) {
        while !self.entropy.adopt.is_empty() && !self.dirty {
            let take = self.entropy.adopt.len().min(ADOPT_CHUNK);
            let from = self.entropy.adopt.len() - take;
            let chunk: Vec<Adopt> = self.entropy.adopt.drain(from..).collect();
            if let Err(err) = self.adopt_chunk(&chunk).await {
                // Kept for after the reconcile; the anti-entropy pass backs this up.
                self.entropy.adopt.extend(chunk);
                self.go_dirty(&err);
            }
        }
    }

    async fn adopt_chunk(&mut self, chunk: &[Adopt]) -> Result<(), redis::RedisError> {
        let mut reads = redis::pipe();
        for a in chunk {
            let pod = self.names.pod(&self.index, a.pod);
            reads.get(mapping_key(a.engine, &pod, &a.hash));
        }
        let values: Vec<Value> = reads.query_async(&mut self.conn).await?;
        let owned = self.index.owned_pods();
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
            let pod = self.names.pod(&self.index, a.pod);
            if self.index.field_value(a.model, std, a.pod).is_none() {
                let bk = block_key(&self.names.model(&self.index, a.model), std);
                writes.hdel(bk, &*pod).ignore();
            }
            writes.del(mapping_key(a.engine, &pod, &a.hash)).ignore();
            adopted += 1;
        }
        if adopted > 0 {
            self.send_background(&writes).await?;
            self.shared
                .entropy
                .adopted_removes
                .fetch_add(adopted, Ordering::Relaxed);
            metrics::mirror_adopted_removes(adopted);
            tracing::debug!(
                adopted,
                asked = chunk.len(),
                "Removed state another writer left, found through its mapping keys."
            );
        }
        Ok(())
    }
}

//! Bringing Redis back in line with the index after an outage (or at start-up): every field
//! and mapping key the index holds is written, and every recorded key whose last write may
//! not have landed and that the index no longer holds is deleted. Only kvindex's own keys
//! are touched; nothing is SCANned.

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use super::mirror::{connect, is_auth_error, Key, Writer};
use crate::index::{Delta, FieldValue, ModelId, PodId};
use crate::redis_layout::redact_url;
use crate::wire::{BlockHash, Engine};

/// Commands per pipeline during a reconcile (bounded memory and response size).
const RECONCILE_CHUNK: usize = 10_000;

impl Writer {
    /// One reconcile attempt; on failure the writer stays dirty and retries after backoff.
    pub(super) async fn try_reconcile(&mut self) {
        // Redis must answer before the index is walked (the walk is the expensive part).
        if let Err(err) = redis::cmd("PING").query_async::<()>(&mut self.conn).await {
            self.go_dirty(&err);
            if is_auth_error(&err) {
                self.renew_connection().await;
            }
            return;
        }
        self.shared.reconciling.store(true, Ordering::Relaxed);
        let mut stale = std::mem::take(&mut self.touched);
        let (fields, mappings) = self.snapshot(&mut stale);
        let engines = self.engine_snapshot(&mut stale);
        let result = self
            .write_snapshot(&fields, &mappings, engines, &stale)
            .await;
        self.shared.reconciling.store(false, Ordering::Relaxed);
        match result {
            Ok(()) => {
                tracing::info!(
                    url = %redact_url(&self.config().url),
                    fields = fields.len(),
                    mappings = mappings.len(),
                    deleted = stale.len(),
                    "Reconciled the Redis mirror with the index."
                );
                self.go_clean();
            }
            Err(err) => {
                // Whatever was not confirmed is recorded again.
                self.touched.extend(stale);
                self.go_dirty(&err);
            }
        }
    }

    /// A fresh connection after an authentication failure: the connection manager reconnects
    /// by itself only after I/O errors, so once its credentials were refused (a password
    /// rotated and back) it would keep answering with that refusal forever.
    async fn renew_connection(&mut self) {
        match connect(&self.config().url).await {
            Ok(conn) => self.conn = conn,
            Err(err) => {
                tracing::debug!(error = %err, "Could not open a fresh Redis connection; retrying after the backoff.")
            }
        }
    }

    /// The index's fields and mappings; removes from `stale` every key the index holds.
    #[allow(clippy::type_complexity)]
    fn snapshot(
        &self,
        stale: &mut HashSet<Key>,
    ) -> (
        Vec<(ModelId, u64, PodId, FieldValue)>,
        Vec<(PodId, Engine, BlockHash, u64)>,
    ) {
        let mut fields = Vec::new();
        self.index().for_each_field(|model, std, pod, value| {
            fields.push((model, std, pod, value));
        });
        let mut mappings = Vec::new();
        if self.config().mapping_keys {
            self.index().for_each_mapping(|pod, engine, hash, std| {
                mappings.push((pod, engine, hash, std));
            });
        }
        if !stale.is_empty() {
            for &(model, std, pod, _) in &fields {
                stale.remove(&Key::Field { model, std, pod });
            }
            for (pod, engine, hash, _) in &mappings {
                stale.remove(&Key::Mapping {
                    pod: *pod,
                    engine: *engine,
                    hash: hash.clone(),
                });
            }
        }
        (fields, mappings)
    }

    /// The checkpoint entries of every source (when the mirror keeps a checkpoint); removes
    /// from `stale` every key the index holds.
    fn engine_snapshot(&self, stale: &mut HashSet<Key>) -> Vec<Delta> {
        let mut engines = Vec::new();
        if !self.config().checkpoint {
            return engines;
        }
        self.index()
            .for_each_engine_state(|pod, rank, model, engine_hash, state| {
                engines.push(Delta::Engine {
                    pod,
                    rank,
                    model,
                    engine_hash,
                    state: Some(state),
                });
            });
        if !stale.is_empty() {
            for delta in &engines {
                stale.remove(&Key::of(delta));
            }
        }
        engines
    }

    async fn write_snapshot(
        &mut self,
        fields: &[(ModelId, u64, PodId, FieldValue)],
        mappings: &[(PodId, Engine, BlockHash, u64)],
        engines: Vec<Delta>,
        stale: &HashSet<Key>,
    ) -> Result<(), redis::RedisError> {
        let mut ops: Vec<Delta> = Vec::with_capacity(RECONCILE_CHUNK);
        let mut pipe = redis::pipe();
        let stale_ops = stale.iter().map(|k| k.clone().deletion());
        let field_ops = fields
            .iter()
            .map(|&(model, std_hash, pod, value)| Delta::Field {
                model,
                std_hash,
                pod,
                value: Some(value),
            });
        let mapping_ops = mappings
            .iter()
            .map(|(pod, engine, hash, std)| Delta::Mapping {
                pod: *pod,
                engine: *engine,
                engine_hash: hash.clone(),
                std_hash: Some(*std),
            });
        // Deletes first: a key both stale and wanted cannot happen (stale excludes wanted).
        // Checkpoint entries follow the data, and the watermarks come last of all.
        let all = stale_ops.chain(field_ops).chain(mapping_ops).chain(engines);
        for delta in all {
            ops.push(delta);
            if ops.len() == RECONCILE_CHUNK {
                self.send_chunk(&mut pipe, &mut ops).await?;
            }
        }
        if !ops.is_empty() {
            self.send_chunk(&mut pipe, &mut ops).await?;
        }
        pipe.clear();
        let n = self.push_all_watermarks(&mut pipe);
        if n > 0 {
            self.send(&pipe, n).await?;
        }
        Ok(())
    }

    async fn send_chunk(
        &mut self,
        pipe: &mut redis::Pipeline,
        ops: &mut Vec<Delta>,
    ) -> Result<(), redis::RedisError> {
        pipe.clear();
        let n = self.push_commands(pipe, ops.iter());
        ops.clear();
        self.send(pipe, n).await
    }
}

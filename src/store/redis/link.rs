//! [`Link`]: what the writer's roles work through. It owns the connections (the lanes), read
//! access to the index, the [`Encoder`] that fills pipelines and the checkpoint's [`Marks`],
//! and it checks every background write against the lease just before it is sent. A role
//! holds no connection or index of its own: the writer lends it the link for one step. Roles
//! work on lane 0 alone, and only while no flush is in flight; flushes use every lane.

use std::sync::Arc;

use redis::FromRedisValue;

use super::checkpoint::next_generation;
use super::encode::Encoder;
use super::inflight::MarkAt;
use super::key::Key;
use super::lease::{not_held, LeaseGate};
use super::log::StateAt;
use super::marks::Marks;
use super::shared::Shared;
use crate::index::{Delta, FieldValue, Index, ModelId, PodId};
use crate::medium::TierWeights;
use crate::redis_conn::RedisConn;
use crate::settings::redis::RedisConfig;
use crate::wire::{BlockHash, Engine};

/// The writer's side of Redis, lent to its roles.
pub(super) struct Link {
    /// The mirror's settings.
    pub(super) config: RedisConfig,
    /// The truth every write is read from.
    pub(super) index: Index,
    /// Lane 0: the connection of the roles, the watermarks and the first share of each
    /// flush (one Redis or a cluster).
    pub(super) conn: RedisConn,
    /// Lanes 1 and up: more connections to the same Redis, for flushes only.
    more: Vec<RedisConn>,
    /// Spreads keys over the lanes; fixed for the writer's life, so a key keeps its lane.
    lane_hasher: hashbrown::DefaultHashBuilder,
    /// Deltas as commands.
    pub(super) enc: Encoder,
    /// The checkpoint's watermarks.
    pub(super) marks: Marks,
    /// Figures shared with the handle.
    pub(super) shared: Arc<Shared>,
    /// With `ha:`: the lease this replica must hold to write.
    gate: Option<Arc<LeaseGate>>,
    /// After a takeover, when the previous lease ended, until the first write is sent.
    first_write_due: Option<std::time::Instant>,
}

impl Link {
    /// The link of a writer on lanes `conn` and `more`.
    pub(super) fn new(
        config: RedisConfig,
        index: Index,
        weights: TierWeights,
        (conn, more): (RedisConn, Vec<RedisConn>),
        shared: Arc<Shared>,
    ) -> Link {
        let enc = Encoder::new(config.value_format, weights);
        Link {
            config,
            index,
            conn,
            more,
            lane_hasher: hashbrown::DefaultHashBuilder::default(),
            enc,
            marks: Marks::default(),
            shared,
            gate: None,
            first_write_due: None,
        }
    }

    /// The number of lanes.
    pub(super) fn lanes(&self) -> usize {
        1 + self.more.len()
    }

    /// The connection of lane `lane`.
    pub(super) fn lane(&self, lane: usize) -> &RedisConn {
        match lane.checked_sub(1) {
            Some(i) if i < self.more.len() => &self.more[i],
            _ => &self.conn,
        }
    }

    /// The lane every write of `key` goes through.
    pub(super) fn lane_of(&self, key: &Key) -> usize {
        if self.more.is_empty() {
            return 0;
        }
        key.lane(self.lanes(), &self.lane_hasher)
    }

    /// Asks every lane whether Redis answers.
    pub(super) async fn ping_lanes(&mut self) -> Result<(), redis::RedisError> {
        for conn in std::iter::once(&mut self.conn).chain(&mut self.more) {
            redis::cmd("PING").query_async::<()>(conn).await?;
        }
        Ok(())
    }

    /// Replaces every lane's connection (the same number of lanes).
    pub(super) fn renew_lanes(&mut self, conn: RedisConn, more: Vec<RedisConn>) {
        self.conn = conn;
        self.more = more;
    }

    /// Puts every write behind `gate`.
    pub(super) fn behind(&mut self, gate: Arc<LeaseGate>) {
        self.gate = Some(gate);
    }

    /// The lease every write is checked against, with `ha:`.
    pub(super) fn gate(&self) -> Option<&Arc<LeaseGate>> {
        self.gate.as_ref()
    }

    /// Whether this writer runs behind a lease it does not hold now (or held too long ago
    /// without renewal): every write is checked against it just before it is sent.
    pub(super) fn lease_lost(&self) -> bool {
        self.gate.as_ref().is_some_and(|gate| !gate.is_open())
    }

    /// Starts counting the time from the previous lease's end (`None`: now) to the first
    /// write after a takeover.
    pub(super) fn first_write_due(&mut self, from: Option<std::time::Instant>) {
        self.first_write_due = from;
    }

    /// Counts the time from the previous lease's end to the first write after a takeover.
    pub(super) fn note_first_write(&mut self) {
        if let Some(from) = self.first_write_due.take() {
            let took = from.elapsed();
            crate::metrics::ha_first_write(took.as_secs_f64());
            tracing::info!(
                since_lease_end_ms = took.as_millis() as u64,
                "HA: the new leader's first write is on its way."
            );
        }
    }

    /// Sends a background pipeline (a role's writes); its commands do not count as the
    /// writer's flushes.
    pub(super) async fn send(&mut self, pipe: &redis::Pipeline) -> Result<(), redis::RedisError> {
        if self.lease_lost() {
            return Err(not_held());
        }
        self.note_first_write();
        pipe.query_async::<()>(&mut self.conn).await
    }

    /// Sends a pipeline of reads and returns its answers.
    pub(super) async fn read<T: FromRedisValue>(
        &mut self,
        pipe: &redis::Pipeline,
    ) -> Result<T, redis::RedisError> {
        pipe.query_async(&mut self.conn).await
    }

    /// Appends the commands of `deltas` (see [`Encoder::push_commands`]).
    pub(super) fn push_commands<'d>(
        &mut self,
        pipe: &mut redis::Pipeline,
        deltas: impl IntoIterator<Item = &'d Delta>,
    ) -> usize {
        let models = &mut self.marks.models;
        self.enc.push_commands(&self.index, models, pipe, deltas)
    }

    /// The checkpoint state key of `at`.
    pub(super) fn state_key(&mut self, at: StateAt) -> String {
        self.enc.state_key(&self.index, at)
    }

    /// Starts a new checkpoint generation, taken from Redis, for the segments written from
    /// now on (see `checkpoint/segment.rs`).
    pub(super) async fn new_generation(&mut self) -> Result<(), redis::RedisError> {
        if !self.config.checkpoint {
            return Ok(());
        }
        let after = self.enc.log.generation();
        let generation = next_generation(&mut self.conn, after).await?;
        self.enc.log.start_generation(generation);
        Ok(())
    }

    /// The write that brings `key` to the index's state now: its value, or its deletion.
    /// `None` for a live source's watermark, left to the end of the repair, which writes
    /// every watermark.
    pub(super) fn repair_delta(&self, key: &Key) -> Option<Delta> {
        if let Key::Source { pod, rank } = key {
            if self.index.source_of(*pod, *rank).is_some() {
                return None;
            }
        }
        // A field's and a mapping key's value is read from the index as it is encoded; a
        // checkpoint entry's is looked up here.
        let mut delta = key.clone().deletion();
        if let Delta::Engine {
            pod,
            rank,
            model,
            engine_hash,
            state,
        } = &mut delta
        {
            *state = self.index.engine_state((*pod, *rank), *model, engine_hash);
        }
        Some(delta)
    }

    /// Appends the `HSET` of one field with the index's `value`.
    pub(super) fn push_field(
        &mut self,
        pipe: &mut redis::Pipeline,
        field: (ModelId, u64, PodId),
        value: FieldValue,
    ) {
        self.enc.push_field(&self.index, pipe, field, value);
    }

    /// Appends the `SET EX` of one mapping key.
    pub(super) fn push_mapping(
        &mut self,
        pipe: &mut redis::Pipeline,
        key: (PodId, Engine, &BlockHash),
        std: u64,
    ) {
        self.enc.push_mapping(&self.index, pipe, key, std);
    }

    /// Appends one `HSET` of the watermarks `marks`; returns the number of commands.
    pub(super) fn push_watermarks(
        &mut self,
        pipe: &mut redis::Pipeline,
        marks: &[MarkAt],
    ) -> usize {
        (self.marks).push(&self.index, &mut self.enc.names, pipe, marks)
    }

    /// Appends every live source's latest watermark; returns the number of commands.
    pub(super) fn push_all_watermarks(&mut self, pipe: &mut redis::Pipeline) -> usize {
        (self.marks).push_all(&self.index, &mut self.enc.names, pipe)
    }

    /// The identifier of pod `id`.
    pub(super) fn pod_name(&mut self, id: PodId) -> Arc<str> {
        self.enc.names.pod(&self.index, id)
    }

    /// The name of model `id`.
    pub(super) fn model_name(&mut self, id: ModelId) -> Arc<str> {
        self.enc.names.model(&self.index, id)
    }
}

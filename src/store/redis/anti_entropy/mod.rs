//! Background passes that keep Redis equal to the index over time: the reconcile after an
//! outage, anti-entropy, the refresh before kthena's GC, and the watchdog that notices a
//! Redis restart or FLUSHALL while kvindex is idle.
//!
//! Everything runs inside the writer task, one bounded step per tick, between flushes: a
//! repair is computed from the index at the moment it is sent, and any later change of the
//! same key reaches Redis through a later delta, so background writes can never overwrite a
//! newer state (the same argument as the reconcile's). Nothing holds a copy of the index:
//! the index side is walked with a [`WalkCursor`] one partition of one source at a time.
//!
//! A pass has up to three phases:
//! 1. `Stale` (reconcile only): the keys whose last write may not have landed during an
//!    outage and that the index no longer holds are deleted.
//! 2. `Index`: every engine hash of every source. A field due for a refresh gets the pass's start
//!    time in the index and is rewritten with its mapping key (`SET EX` renews the TTL). A
//!    reconcile rewrites every field and mapping key; anti-entropy reads them (pipelined
//!    `HGET` + `GET`) and writes only the missing or different ones.
//! 3. `Scan` (anti-entropy only): `SCAN MATCH *:kv:block:*` on every master in turn (one
//!    for a single Redis, each master of a Redis Cluster) with a cursor kept across ticks; for block keys, one pipelined `HMGET` of the owned pods' fields, and fields the
//!    index does not hold are deleted; mapping keys of owned pods whose engine hash no source
//!    of the pod holds are deleted. Only owned pods (pods of registered sources) are touched.
//!
//! Why a SCAN and not per-pod bookkeeping: fields another writer (or an earlier process, or
//! a Redis restored from an old snapshot) left behind are known to no index; only Redis can
//! name them. The SCAN is rate-bounded like the rest of the pass; it lives in `scan.rs`.
//!
//! Rates: a reconcile, and the repair after Redis lost keys, run unthrottled in chunks of
//! [`FAST_CHUNK`] commands with a pause between chunks so ingest keeps flowing. Periodic
//! anti-entropy (every `anti_entropy_interval`, and after every reconcile) is held to
//! `anti_entropy_max_commands_per_s` by a token bucket. A refresh is due when the field
//! would pass `refresh_after` before the next pass, so no resident field gets older than
//! `refresh_after` plus one pass.

mod scan;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::Value;
use tokio::time::Instant;

use super::mirror::{Key, Writer};
use crate::index::{Delta, EngineState, FieldValue, Index, ModelId, PodId, WalkCursor, WalkEntry};
use crate::metrics::{self, RepairDirection};
use crate::redis_layout::{block_key, field_value, mapping_key, mapping_value, MAPPING_TTL_SECS};
use crate::wire::{BlockHash, Engine};
use scan::{ScanCursor, Suspect};

/// Pause between steps of a rate-bounded pass. Each step costs the writer a round trip or
/// two it cannot flush in, so steps are few and large (a second's budget each) rather than
/// many and small: the fixed cost per round trip is what ingest would feel.
const TICK: Duration = Duration::from_secs(1);
/// Pause between chunks of an unthrottled pass: queued deltas are absorbed in between.
const FAST_TICK: Duration = Duration::from_millis(1);
/// Commands per chunk of an unthrottled pass.
const FAST_CHUNK: usize = 10_000;
/// How often Redis is asked for its `run_id` and the sentinel key.
pub(super) const WATCHDOG_PERIOD: Duration = Duration::from_secs(1);
/// Keys recorded during an outage at most; past it the record is dropped and the reconcile
/// is followed by a full, unthrottled anti-entropy pass instead.
pub(super) const TOUCHED_CAP: usize = 100_000;
/// Burst of the token bucket, in seconds of the configured rate.
const BURST_SECS: f64 = 1.0;

/// Counters of the background work, shared with the handle for [`super::MirrorStats`].
#[derive(Debug, Default)]
pub(super) struct EntropyStats {
    pub(super) adopted_removes: AtomicU64,
    pub(super) repairs_deleted: AtomicU64,
    pub(super) repairs_written: AtomicU64,
    /// Suspects of the current pass ([`Suspect`]).
    pub(super) suspects: AtomicU64,
    pub(super) refreshed: AtomicU64,
    pub(super) redis_resets: AtomicU64,
    pub(super) passes: AtomicU64,
    pub(super) background_commands: AtomicU64,
}

/// What a pass does on the index side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Write everything the index holds (after an outage or lost keys).
    Rewrite,
    /// Compare and repair; `fast` = unthrottled.
    Verify { fast: bool },
}

enum Phase {
    Stale(Vec<Key>),
    Index,
    Scan(ScanCursor),
}

struct Pass {
    mode: Mode,
    phase: Phase,
    cursor: WalkCursor,
    buffer: Vec<WalkEntry>,
    started: Instant,
    started_unix: u32,
    /// Keys the SCAN found that the index does not hold, waiting out [`scan::SUSPECT_GRACE`]
    /// before they are checked again and deleted (oldest first).
    suspects: Vec<Suspect>,
    /// Counts of this pass, for its closing log line.
    deleted: u64,
    written: u64,
    refreshed: u64,
}

impl Pass {
    fn new(mode: Mode, stale: Vec<Key>) -> Pass {
        let phase = if stale.is_empty() {
            Phase::Index
        } else {
            Phase::Stale(stale)
        };
        Pass {
            mode,
            phase,
            cursor: WalkCursor::new(),
            buffer: Vec::new(),
            started: Instant::now(),
            started_unix: unix_now(),
            suspects: Vec::new(),
            deleted: 0,
            written: 0,
            refreshed: 0,
        }
    }
}

/// What one chunk of the index walk sends: writes, and reads to compare.
#[derive(Default)]
struct Plan {
    writes: redis::Pipeline,
    writes_n: usize,
    reads: redis::Pipeline,
    /// Entries read back, with their field value and whether their mapping key was read.
    compared: Vec<(WalkEntry, FieldValue, bool)>,
    refreshed: u64,
}

/// Up to `want` entries of the walk, refilling the pass's buffer one partition at a time.
fn next_batch(index: &Index, pass: &mut Pass, want: usize) -> Vec<WalkEntry> {
    while pass.buffer.len() < want && !pass.cursor.is_done() {
        index.walk_engine_hashes(&mut pass.cursor, &mut pass.buffer);
    }
    let take = want.min(pass.buffer.len());
    pass.buffer.drain(pass.buffer.len() - take..).collect()
}

/// Settings of the background work, from [`super::RedisConfig`].
#[derive(Debug, Clone, Copy)]
pub(super) struct EntropySettings {
    pub(super) interval: Duration,
    pub(super) max_commands_per_s: u32,
    pub(super) refresh_after_s: u32,
}

/// One remove of an engine hash the index did not know: adopted from Redis's mapping key.
#[derive(Debug, Clone)]
pub(super) struct Adopt {
    pub(super) pod: PodId,
    pub(super) engine: Engine,
    pub(super) model: ModelId,
    pub(super) hash: BlockHash,
}

/// The writer's background state.
pub(super) struct Entropy {
    settings: EntropySettings,
    pass: Option<Pass>,
    /// A verify pass is wanted once the current pass (a reconcile) ends; `true` = fast.
    pub(super) verify_after: Option<bool>,
    next_verify_at: Instant,
    /// After a takeover: the verify pass that ends next schedules another this soon, for a
    /// deposed leader's bytes that reached Redis after the takeover's pass had read it.
    pub(super) verify_again_after: Option<Duration>,
    watchdog_at: Instant,
    /// Each master's `run_id` as last read.
    pub(super) run_id: Option<super::watchdog::RunIds>,
    /// `INFO` refused (ACL): only the sentinel is checked.
    pub(super) info_allowed: bool,
    pub(super) sentinel: String,
    /// Whether the sentinel was written once (before that, a missing one means nothing).
    pub(super) armed: bool,
    /// The outage key set passed [`TOUCHED_CAP`] and was dropped.
    pub(super) overflowed: bool,
    tokens: f64,
    refilled_at: Instant,
    last_pass: Duration,
    /// When the current pass takes its next step.
    next_step: Instant,
    /// Unknown removes waiting for the next flush.
    pub(super) adopt: Vec<Adopt>,
}

impl Entropy {
    /// Background state that starts with a reconcile (the writer starts dirty).
    pub(super) fn new(settings: EntropySettings) -> Entropy {
        let now = Instant::now();
        Entropy {
            settings,
            pass: None,
            verify_after: None,
            next_verify_at: now + settings.interval,
            verify_again_after: None,
            // At once: the sentinel must exist before a FLUSHALL can be told from nothing.
            watchdog_at: now,
            run_id: None,
            info_allowed: true,
            sentinel: super::watchdog::sentinel_key(),
            armed: false,
            overflowed: false,
            tokens: 0.0,
            refilled_at: now,
            last_pass: Duration::ZERO,
            next_step: now,
            adopt: Vec::new(),
        }
    }

    /// When the writer should call [`Writer::entropy_tick`] next.
    pub(super) fn wake(&self) -> Instant {
        if self.pass.is_some() || self.verify_after.is_some() {
            self.next_step
        } else {
            self.watchdog_at.min(self.next_verify_at)
        }
    }

    /// Whether the current pass runs unthrottled.
    fn fast(&self) -> bool {
        matches!(&self.pass, Some(p) if p.mode != Mode::Verify { fast: false })
    }

    /// Whether a reconcile is still writing the index into Redis (flush waiters wait).
    pub(super) fn rewriting(&self) -> bool {
        matches!(&self.pass, Some(p) if p.mode == Mode::Rewrite)
    }

    /// Commands the current step may send.
    fn budget(&mut self) -> usize {
        if self.fast() {
            return FAST_CHUNK;
        }
        let now = Instant::now();
        let rate = f64::from(self.settings.max_commands_per_s);
        let dt = now
            .saturating_duration_since(self.refilled_at)
            .as_secs_f64();
        self.tokens = (self.tokens + rate * dt).min(rate * BURST_SECS);
        self.refilled_at = now;
        if self.tokens < 1.0 {
            0
        } else {
            self.tokens as usize
        }
    }

    fn spend(&mut self, commands: usize) {
        self.tokens -= commands as f64;
    }

    /// The look-ahead of the refresh: a field is rewritten once it would pass
    /// `refresh_after` before the next pass reaches it.
    fn refresh_due(&self, now_unix: u32) -> u32 {
        let after = self.settings.refresh_after_s;
        let period = self.settings.interval.max(self.last_pass).as_secs();
        let ahead = u32::try_from(period).unwrap_or(u32::MAX).min(after / 2);
        now_unix.saturating_sub(after - ahead)
    }
}

impl Writer {
    /// Hook of [`Writer::try_reconcile`] once Redis answers: writes resume at once, and the
    /// index is written back in chunks while ingest goes on.
    pub(super) fn start_rewrite(&mut self, stale: HashSet<Key>) {
        let fast = std::mem::take(&mut self.entropy.overflowed);
        let mut stale: Vec<Key> = stale.into_iter().collect();
        // A reconcile cut short hands its unchecked keys on.
        if let Some(Pass {
            mode: Mode::Rewrite,
            phase: Phase::Stale(keys),
            ..
        }) = self.entropy.pass.take()
        {
            stale.extend(keys);
        }
        self.entropy.pass = Some(Pass::new(Mode::Rewrite, stale));
        // A verify it replaced drops its suspects: the rewrite compares everything anyway.
        self.shared.entropy.suspects.store(0, Ordering::Relaxed);
        // A verify follows every reconcile; a fast one when the outage record was dropped.
        if self.config.verify {
            let wanted = self.entropy.verify_after.unwrap_or(false) || fast;
            self.entropy.verify_after = Some(wanted);
        }
        self.entropy.next_step = Instant::now();
        self.shared.reconciling.store(true, Ordering::Relaxed);
    }

    /// Hook of `go_dirty`: a reconcile in progress gives its unchecked keys back to the
    /// outage record and starts over once Redis answers again.
    pub(super) fn on_dirty(&mut self) {
        if let Some(pass) = self.entropy.pass.take() {
            match (pass.mode, pass.phase) {
                (Mode::Rewrite, Phase::Stale(keys)) => self.touched.extend(keys),
                (Mode::Rewrite, _) => {}
                (Mode::Verify { fast }, _) => {
                    let wanted = self.entropy.verify_after.unwrap_or(false) || fast;
                    self.entropy.verify_after = Some(wanted);
                }
            }
        }
        self.shared.reconciling.store(false, Ordering::Relaxed);
        self.cap_touched();
    }

    /// Bounds the outage record: past [`TOUCHED_CAP`] it is dropped for a full pass.
    pub(super) fn cap_touched(&mut self) {
        if self.touched.len() > TOUCHED_CAP {
            tracing::warn!(
                keys = self.touched.len(),
                cap = TOUCHED_CAP,
                "The outage key record is full; after the reconcile a full anti-entropy pass deletes what the index no longer holds."
            );
            self.touched = HashSet::new();
            self.entropy.overflowed = true;
        }
    }

    /// Runs a reconcile in progress to its end, unthrottled (shutdown drain).
    pub(super) async fn finish_rewrite(&mut self) {
        while self.entropy.rewriting() && !self.dirty {
            self.pass_step().await;
        }
    }

    /// One tick of background work: the watchdog when due, then one step of the current
    /// pass (starting a periodic one when due).
    pub(super) async fn entropy_tick(&mut self) {
        if self.dirty {
            // The reconcile's own retries probe Redis meanwhile.
            self.entropy.watchdog_at = Instant::now() + WATCHDOG_PERIOD;
            return;
        }
        // The watchdog and a step read Redis: they see every pipeline in flight answered.
        self.drain_inflight().await;
        if self.dirty {
            return;
        }
        let now = Instant::now();
        if now >= self.entropy.watchdog_at {
            self.entropy.watchdog_at = now + WATCHDOG_PERIOD;
            self.watchdog().await;
            if self.dirty {
                return;
            }
        }
        if self.entropy.pass.is_none() {
            let verify_after = self.entropy.verify_after.take();
            if let Some(fast) = verify_after.filter(|_| self.config.verify) {
                self.start_verify(fast);
            } else if self.config.verify && now >= self.entropy.next_verify_at {
                self.start_verify(false);
            }
        }
        if self.entropy.pass.is_some() {
            self.pass_step().await;
        }
        let pause = if self.entropy.fast() { FAST_TICK } else { TICK };
        self.entropy.next_step = Instant::now() + pause;
    }

    fn start_verify(&mut self, fast: bool) {
        self.entropy.tokens = self.entropy.tokens.max(0.0);
        self.entropy.pass = Some(Pass::new(Mode::Verify { fast }, Vec::new()));
        self.entropy.next_verify_at = Instant::now() + self.entropy.settings.interval;
    }

    /// One bounded step of the current pass.
    async fn pass_step(&mut self) {
        // Only a throttled pass spends tokens: an unthrottled one must leave no debt.
        let throttled = !self.entropy.fast();
        let budget = self.entropy.budget();
        if budget == 0 {
            return;
        }
        let Some(mut pass) = self.entropy.pass.take() else {
            return;
        };
        if pass.mode != Mode::Rewrite && !self.pending.is_empty() {
            // Compare against Redis only after what ingest already produced is written.
            self.flush_now().await;
        }
        // A step reads or writes Redis on its own: nothing of ingest's may be in flight.
        self.drain_inflight().await;
        if self.dirty {
            self.entropy.pass = Some(pass);
            self.on_dirty();
            return;
        }
        let result = match pass.phase {
            Phase::Stale(ref mut keys) => self
                .stale_step(keys, budget)
                .await
                .map(|n| (n, keys.is_empty())),
            Phase::Index => self.index_step(&mut pass, budget).await,
            Phase::Scan(_) => self.scan_step(&mut pass, budget).await,
        };
        match result {
            Ok((spent, phase_done)) => {
                if throttled {
                    self.entropy.spend(spent);
                }
                self.shared
                    .entropy
                    .background_commands
                    .fetch_add(spent as u64, Ordering::Relaxed);
                if phase_done {
                    let next = match (pass.mode, &pass.phase) {
                        (_, Phase::Stale(_)) => Some(Phase::Index),
                        // Nothing to compare when no pod is owned.
                        (Mode::Verify { .. }, Phase::Index)
                            if !self.index.owned_pods().is_empty() =>
                        {
                            Some(Phase::Scan(ScanCursor::default()))
                        }
                        _ => None,
                    };
                    match next {
                        Some(phase) => pass.phase = phase,
                        None => {
                            if pass.mode == Mode::Rewrite {
                                if let Err(err) = self.write_all_watermarks().await {
                                    self.entropy.pass = Some(pass);
                                    return self.go_dirty(&err);
                                }
                            }
                            return self.end_pass(pass);
                        }
                    }
                }
                self.entropy.pass = Some(pass);
            }
            Err(err) => {
                self.entropy.pass = Some(pass);
                self.go_dirty(&err);
            }
        }
    }

    /// Every live source's watermark, after a rewrite brought back all the data they cover.
    async fn write_all_watermarks(&mut self) -> Result<(), redis::RedisError> {
        let mut pipe = redis::pipe();
        if self.push_all_watermarks(&mut pipe) > 0 {
            self.send_background(&pipe).await?;
        }
        Ok(())
    }

    fn end_pass(&mut self, pass: Pass) {
        let took = pass.started.elapsed();
        let url = self.config.target.shown();
        match pass.mode {
            Mode::Rewrite => {
                self.shared.reconciling.store(false, Ordering::Relaxed);
                self.shared.reconciles.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    url = %url,
                    refreshed = pass.refreshed,
                    took_ms = took.as_millis() as u64,
                    "Reconciled the Redis mirror with the index."
                );
                self.answer_waiters();
            }
            Mode::Verify { .. } => {
                if let Some(after) = self.entropy.verify_again_after.take() {
                    self.entropy.next_verify_at = Instant::now() + after;
                }
                self.entropy.last_pass = took;
                self.shared.entropy.passes.fetch_add(1, Ordering::Relaxed);
                metrics::anti_entropy_pass(took.as_secs_f64());
                if pass.deleted + pass.written > 0 {
                    tracing::info!(
                        url = %url,
                        deleted = pass.deleted,
                        written = pass.written,
                        refreshed = pass.refreshed,
                        took_ms = took.as_millis() as u64,
                        "Anti-entropy repaired the Redis mirror."
                    );
                } else {
                    tracing::debug!(
                        url = %url,
                        refreshed = pass.refreshed,
                        took_ms = took.as_millis() as u64,
                        "Anti-entropy found the Redis mirror equal to the index."
                    );
                }
            }
        }
    }

    /// Deletes recorded outage keys the index no longer holds.
    async fn stale_step(
        &mut self,
        keys: &mut Vec<Key>,
        budget: usize,
    ) -> Result<usize, redis::RedisError> {
        let take = budget.min(keys.len());
        let chunk: Vec<Key> = keys.drain(keys.len() - take..).collect();
        let owned = self.index().owned_pods();
        let mut pipe = redis::pipe();
        let mut n = 0;
        for key in &chunk {
            let held = match key {
                Key::Field { model, std, pod } => {
                    self.index.field_value(*model, *std, *pod).is_some()
                }
                Key::Mapping { pod, hash, .. } => owned.engine_hash_std(*pod, hash).is_some(),
                Key::Engine {
                    pod, rank, hash, ..
                } => self.index.source_holds(*pod, *rank, hash),
                Key::Source { pod, rank } => self.index.source_of(*pod, *rank).is_some(),
            };
            if !held {
                self.push_deletion(&mut pipe, key);
                n += 1;
            }
        }
        if n > 0 {
            if let Err(err) = self.send_background(&pipe).await {
                keys.extend(chunk);
                return Err(err);
            }
        }
        Ok(n.max(1))
    }

    /// One chunk of the walk over the index: refreshes, and rewrites or compares.
    async fn index_step(
        &mut self,
        pass: &mut Pass,
        budget: usize,
    ) -> Result<(usize, bool), redis::RedisError> {
        let per_entry = if self.config.mapping_keys { 2 } else { 1 };
        let batch = next_batch(&self.index, pass, (budget / per_entry).max(1));
        let done = pass.buffer.is_empty() && pass.cursor.is_done();
        if batch.is_empty() {
            return Ok((1, done));
        }
        let mut plan = self.plan_batch(pass, batch);
        let mut reads_n = 0;
        if !plan.compared.is_empty() {
            let reads = std::mem::take(&mut plan.reads);
            let values: Vec<Value> = reads.query_async(&mut self.conn).await?;
            reads_n = values.len();
            self.repair_compared(pass, &mut plan, values);
        }
        if plan.writes_n > 0 {
            self.send_background(&plan.writes).await?;
        }
        if plan.refreshed > 0 {
            pass.refreshed += plan.refreshed;
            self.shared
                .entropy
                .refreshed
                .fetch_add(plan.refreshed, Ordering::Relaxed);
            metrics::mirror_refreshes(plan.refreshed);
        }
        Ok(((reads_n + plan.writes_n).max(1), done))
    }

    /// Refreshes the due residents of `batch` and sorts it into writes (refreshed, or every
    /// entry of a reconcile) and reads (the rest of an anti-entropy pass).
    fn plan_batch(&mut self, pass: &Pass, batch: Vec<WalkEntry>) -> Plan {
        // Every resident a pass refreshes gets the time the pass began, not its chunk's:
        // a chain's blocks it refreshes then keep one store time, in the index and in the
        // checkpoint a rewrite writes, so a warm start does not split the pod's chain spans
        // at every few blocks. A field is still refreshed within `refresh_after` plus one
        // pass.
        let now = pass.started_unix;
        let due = self.entropy.refresh_due(now);
        let owned = self.index.owned_pods();
        let mut plan = Plan::default();
        for e in batch {
            let (value, resident_at, moved) = self
                .index
                .refresh_resident(e.model, e.std_hash, e.pod, e.rank, due, now);
            let Some(value) = value else { continue };
            let mapping_held = self.config.mapping_keys
                && owned.engine_hash_std(e.pod, &e.engine_hash) == Some(e.std_hash);
            plan.refreshed += u64::from(moved);
            if pass.mode == Mode::Rewrite && self.config.checkpoint {
                // The checkpoint entry comes back with the data a rewrite writes.
                let entry = Delta::Engine {
                    pod: e.pod,
                    rank: e.rank,
                    model: e.model,
                    engine_hash: e.engine_hash.clone(),
                    state: Some(EngineState {
                        std_hash: e.std_hash,
                        media: e.media,
                        stored_at: resident_at.unwrap_or(value.stored_at),
                        chain: e.chain,
                        parent: self.index.chain_parent(e.chain),
                    }),
                };
                plan.writes_n += self.push_commands(&mut plan.writes, std::iter::once(&entry));
            }
            if moved || pass.mode == Mode::Rewrite {
                self.push_field(&mut plan.writes, e.model, e.std_hash, e.pod, value);
                plan.writes_n += 1;
                if mapping_held {
                    let (pod, engine) = (e.pod, e.engine);
                    self.push_mapping(&mut plan.writes, pod, engine, &e.engine_hash, e.std_hash);
                    plan.writes_n += 1;
                }
                continue;
            }
            // A block refreshed (or stored) since the pass began may be held through more
            // engine hashes than the one that moved its time: renew their mapping keys too.
            let renew = mapping_held && resident_at.is_some_and(|at| at >= pass.started_unix);
            if renew {
                let (pod, engine) = (e.pod, e.engine);
                self.push_mapping(&mut plan.writes, pod, engine, &e.engine_hash, e.std_hash);
                plan.writes_n += 1;
            }
            let bk = block_key(&self.names.model(&self.index, e.model), e.std_hash);
            plan.reads.hget(bk, &*self.names.pod(&self.index, e.pod));
            let check_mapping = mapping_held && !renew;
            if check_mapping {
                let pod = self.names.pod(&self.index, e.pod);
                plan.reads.get(mapping_key(e.engine, &pod, &e.engine_hash));
            }
            plan.compared.push((e, value, check_mapping));
        }
        plan
    }

    /// Adds a write for every compared field or mapping key Redis lacks or holds otherwise.
    fn repair_compared(&mut self, pass: &mut Pass, plan: &mut Plan, values: Vec<Value>) {
        let mut values = values.into_iter();
        for (e, value, check_mapping) in std::mem::take(&mut plan.compared) {
            let want = field_value(value, self.config.value_format, &self.weights);
            if as_string(values.next()).as_deref() != Some(want.as_str()) {
                self.push_field(&mut plan.writes, e.model, e.std_hash, e.pod, value);
                plan.writes_n += 1;
                pass.written += 1;
                self.repaired(RepairDirection::Written);
            }
            let std = mapping_value(e.std_hash);
            if check_mapping && as_string(values.next()).as_deref() != Some(std.as_str()) {
                let (pod, engine) = (e.pod, e.engine);
                self.push_mapping(&mut plan.writes, pod, engine, &e.engine_hash, e.std_hash);
                plan.writes_n += 1;
                pass.written += 1;
                self.repaired(RepairDirection::Written);
            }
        }
    }

    fn repaired(&self, direction: RepairDirection) {
        let counter = match direction {
            RepairDirection::Deleted => &self.shared.entropy.repairs_deleted,
            RepairDirection::Written => &self.shared.entropy.repairs_written,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        metrics::anti_entropy_repair(direction);
    }

    /// Sends a background pipeline; its commands do not count as the writer's flushes.
    pub(super) async fn send_background(
        &mut self,
        pipe: &redis::Pipeline,
    ) -> Result<(), redis::RedisError> {
        if self.lease_lost() {
            return Err(super::lease::not_held());
        }
        self.note_first_write();
        pipe.query_async::<()>(&mut self.conn).await
    }

    fn push_field(
        &mut self,
        pipe: &mut redis::Pipeline,
        model: ModelId,
        std: u64,
        pod: PodId,
        value: FieldValue,
    ) {
        let bk = block_key(&self.names.model(&self.index, model), std);
        let v = field_value(value, self.config.value_format, &self.weights);
        pipe.hset(bk, &*self.names.pod(&self.index, pod), v)
            .ignore();
    }

    fn push_mapping(
        &mut self,
        pipe: &mut redis::Pipeline,
        pod: PodId,
        engine: Engine,
        hash: &BlockHash,
        std: u64,
    ) {
        let mk = mapping_key(engine, &self.names.pod(&self.index, pod), hash);
        pipe.set_ex(mk, mapping_value(std), MAPPING_TTL_SECS)
            .ignore();
    }

    fn push_deletion(&mut self, pipe: &mut redis::Pipeline, key: &Key) {
        self.push_command(pipe, &key.clone().deletion());
    }
}

fn as_string(value: Option<Value>) -> Option<String> {
    redis::from_redis_value::<Option<String>>(value?)
        .ok()
        .flatten()
}

/// The current unix second.
pub(super) fn unix_now() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u32::try_from(d.as_secs()).unwrap_or(u32::MAX))
}

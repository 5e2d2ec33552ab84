//! [`AntiEntropy`]: the passes that keep Redis equal to the index over time, the rewrite of
//! a reconcile (see `reconcile.rs`) and the periodic verify. The refresh (`refresh.rs`) rides
//! on both passes' walk of the index.
//!
//! Everything runs inside the writer task, one bounded step per tick, between flushes: a
//! repair is computed from the index at the moment it is sent, and any later change of the
//! same key reaches Redis through a later delta, so background writes can never overwrite a
//! newer state (the same argument as the reconcile's). Nothing holds a copy of the index:
//! the index side is walked with a [`WalkCursor`] one partition of one source at a time.
//!
//! A pass has up to three phases:
//! 1. `Stale` (reconcile only): the keys whose last write may not have landed during an
//!    outage and that the index no longer holds are deleted. A repair (the reconcile of a
//!    Redis the watchdog vouches for: same `run_id`, sentinel kept) writes each of them back
//!    to the index's state instead, and ends there: every other key is known to have landed.
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
use std::sync::atomic::Ordering;
use std::time::Duration;

use redis::Value;
use tokio::time::Instant;

use super::key::Key;
use super::labels::RepairDirection;
use super::link::Link;
use super::refresh::Refresh;
use crate::index::{Delta, EngineState, FieldValue, Index, WalkCursor, WalkEntry};
use crate::metrics;
use crate::redis_layout::{block_key, mapping_key, mapping_value};
use scan::{Findings, ScanCursor};

/// Pause between steps of a rate-bounded pass. Each step costs the writer a round trip or
/// two it cannot flush in, so steps are few and large (a second's budget each) rather than
/// many and small: the fixed cost per round trip is what ingest would feel.
const TICK: Duration = Duration::from_secs(1);
/// Pause between chunks of an unthrottled pass: queued deltas are absorbed in between.
const FAST_TICK: Duration = Duration::from_millis(1);
/// Commands per chunk of an unthrottled pass.
const FAST_CHUNK: usize = 10_000;
/// Burst of the token bucket, in seconds of the configured rate.
const BURST_SECS: f64 = 1.0;

/// What a pass does on the index side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Write everything the index holds (after an outage or lost keys).
    Rewrite,
    /// Write back only the outage record (Redis kept everything else).
    Repair,
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
    /// What the SCAN found and repaired, and the index walk's repairs.
    found: Findings,
    /// Fields this pass refreshed, for its closing log line.
    refreshed: u64,
}

impl Pass {
    fn new(mode: Mode, stale: Vec<Key>) -> Pass {
        let phase = if stale.is_empty() && mode != Mode::Repair {
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
            found: Findings::default(),
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

/// Settings of the passes, from `RedisConfig`.
#[derive(Debug, Clone, Copy)]
pub(super) struct PassSettings {
    /// A periodic verify pass starts at most this often.
    pub(super) interval: Duration,
    /// Commands per second a throttled pass may send.
    pub(super) max_commands_per_s: u32,
}

/// How one step of a pass ended.
pub(super) enum Step {
    /// The pass goes on (or had no budget yet).
    Went,
    /// A rewrite ended: Redis holds the index again, flush waiters may be answered.
    Reconciled,
    /// Redis failed: the writer goes dirty.
    Failed(redis::RedisError),
}

/// The passes' state: the current pass, the next ones wanted, and the token bucket.
pub(super) struct AntiEntropy {
    settings: PassSettings,
    pass: Option<Pass>,
    /// A verify pass is wanted once the current pass (a reconcile) ends; `true` = fast.
    verify_after: Option<bool>,
    next_verify_at: Instant,
    /// After a takeover: the verify pass that ends next schedules another this soon, for a
    /// deposed leader's bytes that reached Redis after the takeover's pass had read it.
    verify_again_after: Option<Duration>,
    tokens: f64,
    refilled_at: Instant,
    /// When the current pass takes its next step.
    next_step: Instant,
    /// A rewrite was cut short: Redis may still lack part of the index, so the next
    /// reconcile must be a rewrite too, never a repair.
    rewrite_owed: bool,
}

impl AntiEntropy {
    /// Passes whose first verify is one interval away.
    pub(super) fn new(settings: PassSettings) -> AntiEntropy {
        let now = Instant::now();
        AntiEntropy {
            settings,
            pass: None,
            verify_after: None,
            next_verify_at: now + settings.interval,
            verify_again_after: None,
            tokens: 0.0,
            refilled_at: now,
            next_step: now,
            rewrite_owed: false,
        }
    }

    /// When the writer should tick next: the current pass's next step, or else the first of
    /// the next verify and `idle_at` (the watchdog's next check).
    pub(super) fn wake(&self, idle_at: Instant) -> Instant {
        if self.pass.is_some() || self.verify_after.is_some() {
            self.next_step
        } else {
            idle_at.min(self.next_verify_at)
        }
    }

    /// Whether the current pass runs unthrottled.
    fn fast(&self) -> bool {
        matches!(&self.pass, Some(p) if p.mode != Mode::Verify { fast: false })
    }

    /// Whether a reconcile is still writing the index into Redis (flush waiters wait).
    pub(super) fn rewriting(&self) -> bool {
        matches!(&self.pass, Some(p) if matches!(p.mode, Mode::Rewrite | Mode::Repair))
    }

    /// Whether the next reconcile must rewrite the whole index (a rewrite was cut short).
    pub(super) fn rewrite_owed(&self) -> bool {
        self.rewrite_owed
    }

    /// Whether a pass runs.
    pub(super) fn running(&self) -> bool {
        self.pass.is_some()
    }

    /// Whether the current pass compares Redis with the index (what ingest already
    /// produced must be written before).
    pub(super) fn compares(&self) -> bool {
        matches!(&self.pass, Some(p) if matches!(p.mode, Mode::Verify { .. }))
    }

    /// Commands the current step may send.
    pub(super) fn budget(&mut self) -> usize {
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

    /// Wants a verify pass once the current one ends (`fast`: unthrottled).
    pub(super) fn verify_after(&mut self, fast: bool) {
        self.verify_after = Some(fast);
    }

    /// A takeover: a fast verify after the rewrite, and another throttled one `again_after`
    /// it, for what a deposed leader's late bytes left.
    pub(super) fn take_over(&mut self, again_after: Duration) {
        self.verify_after = Some(true);
        self.verify_again_after = Some(again_after);
    }

    /// Standing by: no pass is wanted.
    pub(super) fn step_down(&mut self) {
        self.verify_after = None;
        self.verify_again_after = None;
    }

    /// Starts the rewrite of a reconcile once Redis answers: writes resume at once, and the
    /// index is written back in chunks while ingest goes on. `stale` is the outage record;
    /// `overflowed` says it was dropped (the verify after the rewrite runs unthrottled).
    pub(super) fn start_rewrite(&mut self, link: &Link, stale: HashSet<Key>, overflowed: bool) {
        self.start_reconcile(link, Mode::Rewrite, stale, overflowed);
    }

    /// Starts the repair of a reconcile: only the outage record `stale` is written back from
    /// the index, for a Redis that kept every other key (the caller checked it with the
    /// watchdog, and no rewrite is owed).
    pub(super) fn start_repair(&mut self, link: &Link, stale: HashSet<Key>) {
        self.start_reconcile(link, Mode::Repair, stale, false);
    }

    fn start_reconcile(&mut self, link: &Link, mode: Mode, stale: HashSet<Key>, overflowed: bool) {
        let mut stale: Vec<Key> = stale.into_iter().collect();
        // A reconcile cut short hands its unchecked keys on.
        if let Some(Pass {
            mode: Mode::Rewrite | Mode::Repair,
            phase: Phase::Stale(keys),
            ..
        }) = self.pass.take()
        {
            stale.extend(keys);
        }
        self.pass = Some(Pass::new(mode, stale));
        // A verify it replaced drops its suspects: the rewrite compares everything anyway.
        link.shared.upkeep.suspects.store(0, Ordering::Relaxed);
        // A verify follows every reconcile; a fast one when the outage record was dropped.
        if link.config.verify {
            let wanted = self.verify_after.unwrap_or(false) || overflowed;
            self.verify_after = Some(wanted);
        }
        self.next_step = Instant::now();
        link.shared.reconciling.store(true, Ordering::Relaxed);
    }

    /// Redis failed: a rewrite in progress gives its unchecked keys back (returned, for the
    /// outage record) and starts over once Redis answers again; a verify is wanted again.
    pub(super) fn interrupt(&mut self, link: &Link) -> Vec<Key> {
        let mut unchecked = Vec::new();
        if let Some(pass) = self.pass.take() {
            if pass.mode == Mode::Rewrite {
                self.rewrite_owed = true;
            }
            match (pass.mode, pass.phase) {
                (Mode::Rewrite | Mode::Repair, Phase::Stale(keys)) => unchecked = keys,
                (Mode::Rewrite | Mode::Repair, _) => {}
                (Mode::Verify { fast }, _) => {
                    let wanted = self.verify_after.unwrap_or(false) || fast;
                    self.verify_after = Some(wanted);
                }
            }
        }
        link.shared.reconciling.store(false, Ordering::Relaxed);
        unchecked
    }

    /// Starts a verify pass when one is wanted or due.
    pub(super) fn start_due(&mut self, now: Instant, verify: bool) {
        if self.pass.is_some() {
            return;
        }
        let verify_after = self.verify_after.take();
        if let Some(fast) = verify_after.filter(|_| verify) {
            self.start_verify(fast);
        } else if verify && now >= self.next_verify_at {
            self.start_verify(false);
        }
    }

    /// Schedules the next step after one was taken.
    pub(super) fn stepped(&mut self) {
        let pause = if self.fast() { FAST_TICK } else { TICK };
        self.next_step = Instant::now() + pause;
    }

    fn start_verify(&mut self, fast: bool) {
        self.tokens = self.tokens.max(0.0);
        self.pass = Some(Pass::new(Mode::Verify { fast }, Vec::new()));
        self.next_verify_at = Instant::now() + self.settings.interval;
    }

    /// One bounded step of the current pass, sending at most `budget` commands (from
    /// [`AntiEntropy::budget`]). Nothing of ingest's may be in flight.
    pub(super) async fn step(
        &mut self,
        link: &mut Link,
        refresh: &mut Refresh,
        budget: usize,
    ) -> Step {
        // Only a throttled pass spends tokens: an unthrottled one must leave no debt.
        let throttled = !self.fast();
        let Some(mut pass) = self.pass.take() else {
            return Step::Went;
        };
        let result = match pass.phase {
            Phase::Stale(ref mut keys) if pass.mode == Mode::Repair => {
                repair_step(link, keys, budget)
                    .await
                    .map(|n| (n, keys.is_empty()))
            }
            Phase::Stale(ref mut keys) => stale_step(link, keys, budget)
                .await
                .map(|n| (n, keys.is_empty())),
            Phase::Index => index_step(link, refresh, &mut pass, budget).await,
            Phase::Scan(ref mut cursor) => {
                // On a failure the cursor stays where it was: the step is taken again.
                let mut next = cursor.clone();
                let step = scan::scan_step(link, &mut next, &mut pass.found, budget).await;
                if step.is_ok() {
                    *cursor = next;
                }
                step
            }
        };
        let (spent, phase_done) = match result {
            Ok(done) => done,
            Err(err) => {
                self.pass = Some(pass);
                return Step::Failed(err);
            }
        };
        if throttled {
            self.tokens -= spent as f64;
        }
        (link.shared.upkeep.background_commands).fetch_add(spent as u64, Ordering::Relaxed);
        if !phase_done {
            self.pass = Some(pass);
            return Step::Went;
        }
        let next = match (pass.mode, &pass.phase) {
            (Mode::Repair, _) => None,
            (_, Phase::Stale(_)) => Some(Phase::Index),
            // Nothing to compare when no pod is owned.
            (Mode::Verify { .. }, Phase::Index) if !link.index.owned_pods().is_empty() => {
                Some(Phase::Scan(ScanCursor::default()))
            }
            _ => None,
        };
        if let Some(phase) = next {
            pass.phase = phase;
            self.pass = Some(pass);
            return Step::Went;
        }
        if matches!(pass.mode, Mode::Rewrite | Mode::Repair) {
            if let Err(err) = write_all_watermarks(link).await {
                self.pass = Some(pass);
                return Step::Failed(err);
            }
        }
        self.end_pass(link, refresh, pass)
    }

    fn end_pass(&mut self, link: &Link, refresh: &mut Refresh, pass: Pass) -> Step {
        let took = pass.started.elapsed();
        let url = link.config.target.shown();
        let shared = &link.shared;
        match pass.mode {
            Mode::Rewrite | Mode::Repair => {
                if pass.mode == Mode::Rewrite {
                    self.rewrite_owed = false;
                }
                shared.reconciling.store(false, Ordering::Relaxed);
                shared.reconciles.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    url = %url,
                    whole_index = pass.mode == Mode::Rewrite,
                    refreshed = pass.refreshed,
                    took_ms = took.as_millis() as u64,
                    "Reconciled the Redis mirror with the index."
                );
                Step::Reconciled
            }
            Mode::Verify { .. } => {
                if let Some(after) = self.verify_again_after.take() {
                    self.next_verify_at = Instant::now() + after;
                }
                refresh.pass_took(took);
                shared.upkeep.passes.fetch_add(1, Ordering::Relaxed);
                metrics::anti_entropy_pass(took.as_secs_f64());
                let found = &pass.found;
                if found.deleted + found.written > 0 {
                    tracing::info!(
                        url = %url,
                        deleted = found.deleted,
                        written = found.written,
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
                Step::Went
            }
        }
    }
}

/// Every live source's watermark, after a rewrite brought back all the data they cover.
async fn write_all_watermarks(link: &mut Link) -> Result<(), redis::RedisError> {
    let mut pipe = redis::pipe();
    if link.push_all_watermarks(&mut pipe) > 0 {
        link.send(&pipe).await?;
    }
    Ok(())
}

/// Deletes recorded outage keys the index no longer holds.
async fn stale_step(
    link: &mut Link,
    keys: &mut Vec<Key>,
    budget: usize,
) -> Result<usize, redis::RedisError> {
    let owned = link.index.owned_pods();
    keys_step(link, keys, budget, |link, pipe, chunk| {
        let index = &link.index;
        let gone: Vec<Delta> = (chunk.iter())
            .filter(|key| match key {
                Key::Field { model, std, pod } => index.field_value(*model, *std, *pod).is_none(),
                Key::Mapping { pod, hash, .. } => owned.engine_hash_std(*pod, hash).is_none(),
                Key::Engine {
                    pod, rank, hash, ..
                } => !index.source_holds(*pod, *rank, hash),
                Key::Source { pod, rank } => index.source_of(*pod, *rank).is_none(),
            })
            .map(|key| key.clone().deletion())
            .collect();
        // One call: a state key's deleted entries go in one segment.
        link.push_commands(pipe, &gone)
    })
    .await
}

/// Writes recorded outage keys back to the index's state (a repair's one phase), the
/// checkpoint entries of one state key in one command per chunk.
async fn repair_step(
    link: &mut Link,
    keys: &mut Vec<Key>,
    budget: usize,
) -> Result<usize, redis::RedisError> {
    keys_step(link, keys, budget, |link, pipe, chunk| {
        let deltas: Vec<Delta> = chunk.iter().filter_map(|k| link.repair_delta(k)).collect();
        link.push_commands(pipe, &deltas)
    })
    .await
}

/// Sends what `push` writes for up to `budget` recorded keys (it returns its number of
/// commands); on a failure they stay recorded for the next attempt.
async fn keys_step(
    link: &mut Link,
    keys: &mut Vec<Key>,
    budget: usize,
    push: impl FnOnce(&mut Link, &mut redis::Pipeline, &[Key]) -> usize,
) -> Result<usize, redis::RedisError> {
    let take = budget.min(keys.len());
    let chunk: Vec<Key> = keys.drain(keys.len() - take..).collect();
    let mut pipe = redis::pipe();
    let n = push(link, &mut pipe, &chunk);
    if n > 0 {
        if let Err(err) = link.send(&pipe).await {
            keys.extend(chunk);
            return Err(err);
        }
    }
    Ok(n.max(1))
}

/// One chunk of the walk over the index: refreshes, and rewrites or compares.
async fn index_step(
    link: &mut Link,
    refresh: &Refresh,
    pass: &mut Pass,
    budget: usize,
) -> Result<(usize, bool), redis::RedisError> {
    let per_entry = if link.config.mapping_keys { 2 } else { 1 };
    let batch = next_batch(&link.index, pass, (budget / per_entry).max(1));
    let done = pass.buffer.is_empty() && pass.cursor.is_done();
    if batch.is_empty() {
        return Ok((1, done));
    }
    let mut plan = plan_batch(link, refresh, pass, batch);
    let mut reads_n = 0;
    if !plan.compared.is_empty() {
        let reads = std::mem::take(&mut plan.reads);
        let values: Vec<Value> = link.read(&reads).await?;
        reads_n = values.len();
        repair_compared(link, pass, &mut plan, values);
    }
    if plan.writes_n > 0 {
        link.send(&plan.writes).await?;
    }
    pass.refreshed += plan.refreshed;
    Refresh::count(link, plan.refreshed);
    Ok(((reads_n + plan.writes_n).max(1), done))
}

/// Refreshes the due residents of `batch` and sorts it into writes (refreshed, or every
/// entry of a reconcile) and reads (the rest of an anti-entropy pass).
fn plan_batch(link: &mut Link, refresh: &Refresh, pass: &Pass, batch: Vec<WalkEntry>) -> Plan {
    // Every resident a pass refreshes gets the time the pass began, not its chunk's:
    // a chain's blocks it refreshes then keep one store time, in the index and in the
    // checkpoint a rewrite writes, so a warm start does not split the pod's chain spans
    // at every few blocks. A field is still refreshed within `refresh_after` plus one
    // pass.
    let now = pass.started_unix;
    let due = refresh.due(now);
    let owned = link.index.owned_pods();
    let mut plan = Plan::default();
    // Checkpoint entries go last, one command per state key: after the data they describe.
    let mut entries = Vec::new();
    for e in batch {
        let r = Refresh::resident(&link.index, &e, due, now);
        let Some(value) = r.value else { continue };
        let mapping_held = link.config.mapping_keys
            && owned.engine_hash_std(e.pod, &e.engine_hash) == Some(e.std_hash);
        plan.refreshed += u64::from(r.moved);
        if pass.mode == Mode::Rewrite && link.config.checkpoint {
            // The checkpoint entry comes back with the data a rewrite writes.
            entries.push(Delta::Engine {
                pod: e.pod,
                rank: e.rank,
                model: e.model,
                engine_hash: e.engine_hash.clone(),
                state: Some(EngineState {
                    std_hash: e.std_hash,
                    media: e.media,
                    stored_at: r.resident_at.unwrap_or(value.stored_at),
                    chain: e.chain,
                    parent: link.index.chain_parent(e.chain),
                }),
            });
        }
        let field = (e.model, e.std_hash, e.pod);
        let mapping = (e.pod, e.engine, &e.engine_hash);
        if r.moved || pass.mode == Mode::Rewrite {
            link.push_field(&mut plan.writes, field, value);
            plan.writes_n += 1;
            if mapping_held {
                link.push_mapping(&mut plan.writes, mapping, e.std_hash);
                plan.writes_n += 1;
            }
            continue;
        }
        // A block refreshed (or stored) since the pass began may be held through more
        // engine hashes than the one that moved its time: renew their mapping keys too.
        let renew = mapping_held && r.resident_at.is_some_and(|at| at >= pass.started_unix);
        if renew {
            link.push_mapping(&mut plan.writes, mapping, e.std_hash);
            plan.writes_n += 1;
        }
        let bk = block_key(&link.model_name(e.model), e.std_hash);
        plan.reads.hget(bk, &*link.pod_name(e.pod));
        let check_mapping = mapping_held && !renew;
        if check_mapping {
            let pod = link.pod_name(e.pod);
            plan.reads.get(mapping_key(e.engine, &pod, &e.engine_hash));
        }
        plan.compared.push((e, value, check_mapping));
    }
    plan.writes_n += link.push_commands(&mut plan.writes, &entries);
    plan
}

/// Adds a write for every compared field or mapping key Redis lacks or holds otherwise.
fn repair_compared(link: &mut Link, pass: &mut Pass, plan: &mut Plan, values: Vec<Value>) {
    let mut values = values.into_iter();
    for (e, value, check_mapping) in std::mem::take(&mut plan.compared) {
        let want = link.enc.field_text(value);
        if as_string(values.next()).as_deref() != Some(want.as_str()) {
            link.push_field(&mut plan.writes, (e.model, e.std_hash, e.pod), value);
            plan.writes_n += 1;
            pass.found.written += 1;
            link.shared.upkeep.repaired(RepairDirection::Written);
        }
        let std = mapping_value(e.std_hash);
        if check_mapping && as_string(values.next()).as_deref() != Some(std.as_str()) {
            let mapping = (e.pod, e.engine, &e.engine_hash);
            link.push_mapping(&mut plan.writes, mapping, e.std_hash);
            plan.writes_n += 1;
            pass.found.written += 1;
            link.shared.upkeep.repaired(RepairDirection::Written);
        }
    }
}

fn as_string(value: Option<Value>) -> Option<String> {
    redis::from_redis_value::<Option<String>>(value?)
        .ok()
        .flatten()
}

/// The current unix second.
fn unix_now() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u32::try_from(d.as_secs()).unwrap_or(u32::MAX))
}

//! High availability: one writer per shard, the holder of a lease key in the same Redis
//! (docs/architecture.md §8).
//!
//! Replicas with the same config (and shard) all keep a live index; only the holder of
//! [`lease_key`] writes Redis. A standby takes the lease with `SET key token NX PX ttl` once
//! it has caught up with its sources (the daemon tells it through `eligible`); the holder
//! renews it every ttl/3 with a compare-and-renew script, and releases it on shutdown with a
//! compare-and-delete, so a standby polling every [`poll_interval`] takes over at once.
//!
//! The invariant that keeps two writers apart: a holder writes only while its [`LeaseGate`]
//! is open, and the gate closes ttl/2 after the *sending* of the last renewal Redis
//! confirmed, while that renewal keeps the key alive for a full ttl from when Redis ran it
//! (no earlier than the sending). So a holder stops writing at least ttl/2 before anyone
//! else can take the lease, whatever the network delays, as long as the clocks of the two
//! hosts run at about the same rate (not the same time: only durations are compared). A
//! frozen process (SIGSTOP, a long GC-like pause) checks the gate before every write when it
//! wakes; what it sent just before freezing may still land late, and is repaired by the new
//! leader's reconcile, which compares Redis with its own index in both directions (and by a
//! second verify pass two ttls later, for bytes that landed after the first).

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;

use super::error::MirrorError;
use crate::redis_conn::{RedisConn, RedisTarget};
pub use crate::settings::redis::{DEFAULT_LEASE_TTL, MAX_LEASE_TTL, MIN_LEASE_TTL};
use crate::shard::Shard;

/// Longest pause between a standby's attempts to take the lease: a released lease is taken
/// within about this long, whatever the ttl.
const MAX_POLL: Duration = Duration::from_millis(100);

/// `SET key token NX PX ttl`; when the key is held, who holds it and for how long.
const ACQUIRE: &str = r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, ARGV[1], tonumber(ARGV[2])}
end
return {0, redis.call('GET', KEYS[1]) or '', redis.call('PTTL', KEYS[1])}
";
/// Compare-and-renew: the expiry moves only while the key still holds this replica's token.
const RENEW: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
";
/// Compare-and-delete: a replica releases only its own lease.
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// The error a write gets when the lease is not held: the writer stands by rather than
/// treating it as an outage.
pub(super) fn not_held() -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::Client,
        "this replica does not hold the HA lease",
    ))
}

/// `EVAL script 1 key`, the arguments to follow (the script text is small, and a Redis
/// Cluster routes `EVAL` by its one key).
fn eval(script: &str, key: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(script).arg(1).arg(key);
    cmd
}

/// The lease key of `shard`. All shards' leases share one hash tag, so on a Redis Cluster
/// they live on one slot (one master), apart from kthena's keys.
pub fn lease_key(shard: Shard) -> String {
    format!("kvindex:{{ha}}:lease:{}/{}", shard.index, shard.count)
}

/// How often a standby tries to take the lease: ttl/10, at most 100 ms.
pub fn poll_interval(ttl: Duration) -> Duration {
    (ttl / 10).min(MAX_POLL)
}

/// This replica's role as the writer sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Role {
    /// Writes nothing; keeps its index.
    Standby,
    /// Holds the lease since `term` started; `lost_at` is when the previous holder's lease
    /// ended, as far as this replica saw it (for the takeover time).
    Leader {
        /// Increases with every acquisition.
        term: u64,
        /// When the previous lease ended (expired or was released), when known.
        lost_at: Option<Instant>,
    },
}

/// What `/v1/pods` and `kvindex top` show about the writer of this replica's shard.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct HaView {
    /// `leader` (this replica writes Redis) or `standby`.
    pub role: &'static str,
    /// This replica's identity (its pod name, or host name and pid).
    pub replica: String,
    /// The identity of the lease holder as last seen (`None`: nobody holds it).
    pub holder: Option<String>,
    /// Whether this replica has caught up with its sources and may take the lease.
    pub ready_to_lead: bool,
    /// The lease's time to live, milliseconds.
    pub lease_ttl_ms: u64,
    /// The lease key.
    pub lease_key: String,
}

/// Shared between the lease task, the writer and the views: whether this replica may write
/// now, and what it last saw.
#[derive(Debug)]
pub struct LeaseGate {
    ttl: Duration,
    base: Instant,
    /// Microseconds after `base` until which writes are allowed; 0 = not leading.
    open_until_us: AtomicU64,
    /// Set at shutdown: a standby no longer tries to take the lease.
    closing: AtomicBool,
    /// The writer found the gate closed and stood by on its own: the lease task steps down
    /// too (even if a late renewal succeeded), so the next acquisition is a new term and
    /// the writer reconciles before writing again.
    abandoned: AtomicBool,
    role: watch::Sender<Role>,
    view: Mutex<HaView>,
}

impl LeaseGate {
    fn new(view: HaView) -> LeaseGate {
        LeaseGate {
            ttl: Duration::from_millis(view.lease_ttl_ms),
            base: Instant::now(),
            open_until_us: AtomicU64::new(0),
            closing: AtomicBool::new(false),
            abandoned: AtomicBool::new(false),
            role: watch::Sender::new(Role::Standby),
            view: Mutex::new(view),
        }
    }

    /// The lease's time to live.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Whether this replica holds the lease and renewed it recently enough to write now.
    pub fn is_open(&self) -> bool {
        let until = self.open_until_us.load(Ordering::Acquire);
        until != 0 && self.micros(Instant::now()) < until
    }

    fn micros(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_micros()).unwrap_or(u64::MAX)
    }

    fn open_until(&self, at: Instant) {
        self.open_until_us
            .store(self.micros(at).max(1), Ordering::Release);
    }

    fn close(&self) {
        self.open_until_us.store(0, Ordering::Release);
    }

    /// Shutdown has begun: a standby stops trying to take the lease (a leader keeps
    /// renewing until its last flush, then releases it).
    pub fn stop_acquiring(&self) {
        self.closing.store(true, Ordering::Release);
    }

    /// The writer stood by: the current term is over for it, whatever the lease task saw.
    pub fn abandon(&self) {
        self.close();
        self.abandoned.store(true, Ordering::Release);
    }

    /// The writer's subscription to role changes.
    pub fn subscribe(&self) -> watch::Receiver<Role> {
        self.role.subscribe()
    }

    /// The current role.
    pub fn role(&self) -> Role {
        *self.role.borrow()
    }

    /// What this replica knows about its shard's writer.
    pub fn view(&self) -> HaView {
        self.view.lock().clone()
    }
}

/// Settings of the lease.
#[derive(Debug, Clone)]
pub struct LeaseSettings {
    /// The lease's time to live.
    pub ttl: Duration,
    /// The shard whose lease this is.
    pub shard: Shard,
    /// This replica's identity, shown as the holder.
    pub replica: String,
}

/// This replica's identity: `POD_NAME` (the Kubernetes downward API), else `HOSTNAME`, else
/// `pid-N`; the process id is added so two processes on one host stay apart.
pub fn replica_identity() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_default();
    let pid = std::process::id();
    if host.is_empty() {
        format!("pid-{pid}")
    } else {
        format!("{host}/{pid}")
    }
}

/// A token no other replica (or earlier run of this one) uses: the identity and 128
/// random bits from the standard library's per-process random hash keys.
fn new_token(replica: &str) -> String {
    let seed = (std::time::SystemTime::now(), std::process::id());
    let bits = [0u8, 1].map(|i| RandomState::new().hash_one((i, seed)));
    format!("{replica}#{:016x}{:016x}", bits[0], bits[1])
}

/// The identity part of a token (what views show as the holder).
fn holder_of(token: &str) -> &str {
    token.rsplit_once('#').map_or(token, |(who, _)| who)
}

/// Whether this replica has caught up with its sources and may lead.
pub type Eligibility = Arc<dyn Fn() -> bool + Send + Sync>;

/// A lease on a thread of its own (with its own single-threaded runtime and connection), so
/// its renewals keep their time whatever load the daemon's runtime carries: a renewal late
/// by more than ttl/6 makes the leader stand by.
pub struct LeaseThread {
    gate: Arc<LeaseGate>,
    begin: Option<oneshot::Sender<(Eligibility, Shard, CancellationToken)>>,
    done: oneshot::Receiver<()>,
}

impl LeaseThread {
    /// Starts the thread and connects (failing like the mirror on a bad URL or refused
    /// credentials); the lease is neither taken nor renewed before [`LeaseThread::begin`].
    ///
    /// # Errors
    /// [`MirrorError`] when Redis cannot be reached or the thread cannot start.
    pub async fn start(
        target: &RedisTarget,
        settings: LeaseSettings,
    ) -> Result<LeaseThread, MirrorError> {
        let (ready_tx, ready_rx) = oneshot::channel();
        let (begin_tx, begin_rx) = oneshot::channel::<(Eligibility, Shard, CancellationToken)>();
        let (done_tx, done_rx) = oneshot::channel();
        let failed = |reason: String| MirrorError::Connect {
            url: target.shown(),
            reason,
        };
        let thread_target = target.clone();
        let body = move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            let runtime = match runtime {
                Ok(rt) => rt,
                Err(err) => {
                    let _ = ready_tx.send(Err(err.to_string()));
                    return;
                }
            };
            runtime.block_on(async move {
                let lease = match Lease::connect(&thread_target, settings).await {
                    Ok(lease) => lease,
                    Err(err) => {
                        let _ = ready_tx.send(Ok(Err(err)));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(Ok(lease.gate())));
                if let Ok((eligible, shard, stop)) = begin_rx.await {
                    lease.run(eligible, shard, stop).await;
                }
            });
            let _ = done_tx.send(());
        };
        std::thread::Builder::new()
            .name("kvindex-lease".to_owned())
            .spawn(body)
            .map_err(|e| failed(format!("cannot start the lease thread: {e}")))?;
        let gate = match ready_rx.await {
            Ok(Ok(Ok(gate))) => gate,
            Ok(Ok(Err(err))) => return Err(err),
            Ok(Err(reason)) => return Err(failed(reason)),
            Err(_) => return Err(failed("the lease thread ended".to_owned())),
        };
        Ok(LeaseThread {
            gate,
            begin: Some(begin_tx),
            done: done_rx,
        })
    }

    /// The gate the writer checks before every write.
    pub fn gate(&self) -> Arc<LeaseGate> {
        Arc::clone(&self.gate)
    }

    /// Starts taking and renewing the lease ([`Lease::run`]) until `stop`.
    pub fn begin(&mut self, eligible: Eligibility, shard: Shard, stop: CancellationToken) {
        if let Some(begin) = self.begin.take() {
            let _ = begin.send((eligible, shard, stop));
        }
    }

    /// Resolves once the thread has ended (after `stop`, the lease released if held).
    pub async fn finished(self) {
        drop(self.begin);
        let _ = self.done.await;
    }
}

/// The running lease task: renews or tries to take the lease until cancelled.
pub struct Lease {
    conn: RedisConn,
    key: String,
    token: String,
    ttl: Duration,
    gate: Arc<LeaseGate>,
    term: u64,
    /// When the lease this replica holds was last confirmed (the renewal's sending).
    renewed_at: Option<Instant>,
    /// When the holder's lease was last seen to end, as predicted from its PTTL.
    holder_ends_at: Option<Instant>,
    /// The last poll that saw another holder.
    seen_held_at: Option<Instant>,
    target: RedisTarget,
}

impl Lease {
    /// Connects (its own connection, so renewals never queue behind the writer's
    /// pipelines) and returns the gate the writer checks; call [`Lease::run`] next.
    ///
    /// # Errors
    /// [`MirrorError`] when Redis cannot be reached.
    pub async fn connect(
        target: &RedisTarget,
        settings: LeaseSettings,
    ) -> Result<Lease, MirrorError> {
        let conn = super::connect::connect(target).await?;
        let key = lease_key(settings.shard);
        let gate = Arc::new(LeaseGate::new(HaView {
            role: "standby",
            replica: settings.replica.clone(),
            holder: None,
            ready_to_lead: false,
            lease_ttl_ms: settings.ttl.as_millis() as u64,
            lease_key: key.clone(),
        }));
        crate::metrics::ha_leader(settings.shard.index, false);
        Ok(Lease {
            conn,
            key,
            token: new_token(&settings.replica),
            ttl: settings.ttl,
            gate,
            term: 0,
            renewed_at: None,
            holder_ends_at: None,
            seen_held_at: None,
            target: target.clone(),
        })
    }

    /// The gate the writer checks before every write.
    pub fn gate(&self) -> Arc<LeaseGate> {
        Arc::clone(&self.gate)
    }

    /// Renews or takes the lease until `cancel` (cancelled after the writer's last flush);
    /// then, if it still holds the lease, deletes it, so a standby takes over at once.
    pub async fn run(mut self, eligible: Eligibility, shard: Shard, cancel: CancellationToken) {
        loop {
            let wake = self.next_wake();
            tokio::select! {
                () = cancel.cancelled() => break,
                () = tokio::time::sleep_until(wake.into()) => {}
            }
            if self.renewed_at.is_some() {
                if self.gate.abandoned.swap(false, Ordering::AcqRel) {
                    self.step_down(shard, "the writer found its lease expired");
                    continue;
                }
                self.renew(shard).await;
            } else {
                let ready = eligible();
                self.gate.view.lock().ready_to_lead = ready;
                if ready && !self.gate.closing.load(Ordering::Acquire) {
                    self.try_acquire(shard).await;
                } else {
                    self.peek().await;
                }
            }
        }
        if self.renewed_at.is_some() {
            self.release(shard).await;
        }
    }

    /// When to act next: a renewal every ttl/3 (sooner after a failed one), a poll every
    /// [`poll_interval`] while standing by.
    fn next_wake(&self) -> Instant {
        let now = Instant::now();
        match self.renewed_at {
            Some(at) => {
                let due = at + self.ttl / 3;
                if due <= now {
                    // A failed renewal is retried soon, but not in a tight loop.
                    now + poll_interval(self.ttl)
                } else {
                    due
                }
            }
            None => now + poll_interval(self.ttl),
        }
    }

    /// What a lease command may take: past ttl/2 the answer would come too late anyway.
    fn command_deadline(&self) -> Duration {
        self.ttl / 2
    }

    async fn try_acquire(&mut self, shard: Shard) {
        let sent = Instant::now();
        let mut call = eval(ACQUIRE, &self.key);
        call.arg(&self.token).arg(self.ttl.as_millis() as u64);
        let answer = tokio::time::timeout(
            self.command_deadline(),
            call.query_async::<(i64, String, i64)>(&mut self.conn),
        )
        .await;
        match answer {
            Ok(Ok((1, _, _))) => self.lead(sent, shard),
            Ok(Ok((_, holder, pttl))) => self.saw_holder(sent, holder.as_str(), pttl),
            Ok(Err(err)) => self.failed("take", &err.to_string()),
            Err(_) => self.failed("take", "timed out"),
        }
    }

    /// Reads who holds the lease (while not ready to lead), for the views.
    async fn peek(&mut self) {
        let sent = Instant::now();
        let mut pipe = redis::pipe();
        pipe.get(&self.key).cmd("PTTL").arg(&self.key);
        let answer = tokio::time::timeout(
            self.command_deadline(),
            pipe.query_async::<(Option<String>, i64)>(&mut self.conn),
        )
        .await;
        if let Ok(Ok((holder, pttl))) = answer {
            self.saw_holder(sent, holder.as_deref().unwrap_or(""), pttl);
        }
    }

    fn saw_holder(&mut self, at: Instant, holder: &str, pttl_ms: i64) {
        let held = !holder.is_empty();
        if held {
            self.seen_held_at = Some(at);
            let left = Duration::from_millis(u64::try_from(pttl_ms).unwrap_or(0));
            self.holder_ends_at = Some(at + left);
        }
        self.gate.view.lock().holder = held.then(|| holder_of(holder).to_owned());
    }

    /// Took the lease: writes may start. The previous lease ended when its predicted
    /// expiry passed, or, when it was released early, after the last poll that saw it.
    fn lead(&mut self, sent: Instant, shard: Shard) {
        let lost_at = match (self.holder_ends_at, self.seen_held_at) {
            (Some(ends), _) if ends <= sent => Some(ends),
            (_, Some(seen)) => Some(seen),
            _ => None,
        };
        self.renewed_at = Some(sent);
        self.gate.abandoned.store(false, Ordering::Release);
        self.gate.open_until(sent + self.ttl / 2);
        self.term += 1;
        {
            let mut view = self.gate.view.lock();
            view.role = "leader";
            view.holder = Some(holder_of(&self.token).to_owned());
        }
        crate::metrics::ha_leader(shard.index, true);
        crate::metrics::ha_takeover();
        tracing::info!(
            key = %self.key,
            term = self.term,
            "HA: took the lease; this replica writes Redis after a full reconcile."
        );
        self.gate.role.send_replace(Role::Leader {
            term: self.term,
            lost_at,
        });
    }

    async fn renew(&mut self, shard: Shard) {
        let Some(renewed_at) = self.renewed_at else {
            return;
        };
        let sent = Instant::now();
        let left = (renewed_at + self.ttl / 2).saturating_duration_since(sent);
        if left.is_zero() {
            return self.step_down(shard, "the lease was not renewed within ttl/2");
        }
        let mut call = eval(RENEW, &self.key);
        call.arg(&self.token).arg(self.ttl.as_millis() as u64);
        let answer = tokio::time::timeout(left, call.query_async::<i64>(&mut self.conn)).await;
        match answer {
            Ok(Ok(1)) => {
                crate::metrics::ha_renew_latency(sent.elapsed().as_secs_f64());
                self.renewed_at = Some(sent);
                if !self.gate.abandoned.load(Ordering::Acquire) {
                    self.gate.open_until(sent + self.ttl / 2);
                }
            }
            Ok(Ok(_)) => {
                crate::metrics::ha_renew_failed();
                self.step_down(shard, "the lease key holds another token or is gone");
            }
            Ok(Err(err)) => {
                crate::metrics::ha_renew_failed();
                self.failed("renew", &err.to_string());
                if Instant::now() >= renewed_at + self.ttl / 2 {
                    self.step_down(shard, "the lease was not renewed within ttl/2");
                }
            }
            Err(_) => {
                crate::metrics::ha_renew_failed();
                self.step_down(shard, "the lease was not renewed within ttl/2");
            }
        }
    }

    fn step_down(&mut self, shard: Shard, why: &str) {
        self.gate.close();
        self.renewed_at = None;
        self.holder_ends_at = None;
        self.seen_held_at = None;
        {
            let mut view = self.gate.view.lock();
            view.role = "standby";
            view.holder = None;
        }
        crate::metrics::ha_leader(shard.index, false);
        tracing::warn!(key = %self.key, reason = why, "HA: lost the lease; this replica writes nothing and stands by.");
        self.gate.role.send_replace(Role::Standby);
    }

    fn failed(&self, what: &str, reason: &str) {
        tracing::debug!(
            key = %self.key,
            reason = %self.target.scrub(reason),
            "HA: a lease command failed ({what}); retrying."
        );
    }

    /// Deletes the lease if this replica still holds it (after the last flush).
    async fn release(&mut self, shard: Shard) {
        self.gate.close();
        let mut call = eval(RELEASE, &self.key);
        call.arg(&self.token);
        let answer = tokio::time::timeout(self.ttl, call.query_async::<i64>(&mut self.conn)).await;
        crate::metrics::ha_leader(shard.index, false);
        match answer {
            Ok(Ok(1)) => {
                tracing::info!(key = %self.key, "HA: released the lease after the last flush.");
            }
            _ => {
                tracing::warn!(key = %self.key, "HA: could not release the lease; a standby takes it when it expires.");
            }
        }
        self.renewed_at = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_differ_and_name_their_holder() {
        let a = new_token("kvindex-0/7");
        let b = new_token("kvindex-0/7");
        assert_ne!(a, b);
        assert_eq!(holder_of(&a), "kvindex-0/7");
    }

    #[test]
    fn leases_of_shards_differ_and_share_one_slot() {
        let a = lease_key(Shard { index: 0, count: 2 });
        let b = lease_key(Shard { index: 1, count: 2 });
        assert_ne!(a, b);
        assert_eq!(
            crate::redis_conn::slot_of(a.as_bytes()),
            crate::redis_conn::slot_of(b.as_bytes())
        );
    }

    #[test]
    fn standbys_poll_at_least_every_100_ms() {
        assert_eq!(poll_interval(Duration::from_secs(3)), MAX_POLL);
        assert_eq!(
            poll_interval(Duration::from_millis(600)),
            Duration::from_millis(60)
        );
    }

    #[test]
    fn a_gate_is_open_only_until_its_deadline() {
        let gate = LeaseGate::new(HaView::default());
        assert!(!gate.is_open());
        gate.open_until(Instant::now() + Duration::from_secs(60));
        assert!(gate.is_open());
        gate.open_until(Instant::now() - Duration::from_millis(1));
        assert!(!gate.is_open());
        gate.close();
        assert!(!gate.is_open());
    }
}

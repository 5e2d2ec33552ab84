//! [`Watchdog`]: every second it renews a sentinel key of its own and reads Redis's `run_id`
//! (on a Redis Cluster: one sentinel and one `run_id` per master), so a FLUSHALL (sentinel
//! gone) or a restart (new `run_id`, or the check failing) while kvindex is idle is repaired
//! within seconds rather than at the next failed write.

use redis::{ErrorKind, ServerErrorKind};
use tokio::time::Instant;

use super::labels::RedisReset;
use super::link::Link;
use crate::redis_conn::Master;

/// How often Redis is asked for its `run_id` and the sentinel key.
const WATCHDOG_PERIOD: std::time::Duration = std::time::Duration::from_secs(1);
/// Lifetime of the sentinel key, renewed by every watchdog check; only a pause of kvindex
/// longer than this could let it expire on its own (a harmless extra repair).
const SENTINEL_TTL_SECS: i64 = 300;

/// The watchdog's view of Redis.
pub(super) struct Watchdog {
    /// When the next check is due.
    due_at: Instant,
    /// Each master's `run_id` as last read.
    run_id: Option<RunIds>,
    /// `INFO` refused (ACL): only the sentinel is checked.
    info_allowed: bool,
    sentinel: String,
    /// Whether the sentinel was written once (before that, a missing one means nothing).
    armed: bool,
}

impl Watchdog {
    /// A watchdog whose first check is due at once: the sentinel must exist before a
    /// FLUSHALL can be told from nothing.
    pub(super) fn new() -> Watchdog {
        Watchdog {
            due_at: Instant::now(),
            run_id: None,
            info_allowed: true,
            sentinel: sentinel_key(),
            armed: false,
        }
    }

    /// When the next check is due.
    pub(super) fn due_at(&self) -> Instant {
        self.due_at
    }

    /// Whether a check is due at `now`; if so the one after is scheduled.
    pub(super) fn due(&mut self, now: Instant) -> bool {
        if now < self.due_at {
            return false;
        }
        self.due_at = now + WATCHDOG_PERIOD;
        true
    }

    /// Puts the next check off by one period (the reconcile's retries probe Redis meanwhile).
    pub(super) fn postpone(&mut self) {
        self.due_at = Instant::now() + WATCHDOG_PERIOD;
    }

    /// Forgets Redis as it was: after a takeover the watchdog starts over from Redis as the
    /// previous leader left it.
    pub(super) fn forget(&mut self) {
        self.armed = false;
        self.run_id = None;
    }

    /// Whether the watchdog knows Redis well enough to vouch for it: armed, with a `run_id`
    /// (without `INFO` a restart from a snapshot that kept the sentinel would go unseen).
    pub(super) fn knows_redis(&self) -> bool {
        self.armed && self.run_id.is_some()
    }

    /// Checks Redis for a restart (`run_id`) or lost keys (the sentinel), and renews the
    /// sentinel; returns what Redis lost, if anything. An error means Redis could not be
    /// reached, so a Redis restarted while kvindex is idle is reconciled at once rather than
    /// at the next failed write. On a Redis Cluster every master has its own sentinel and
    /// `run_id`, and a changed set of masters (a failover) counts as a restart: a promoted
    /// replica may lack the last writes its master acknowledged.
    pub(super) async fn check(
        &mut self,
        link: &mut Link,
    ) -> Result<Option<RedisReset>, redis::RedisError> {
        let masters = link.conn.masters().await?;
        let sentinels = link.conn.key_per_master(&self.sentinel);
        let mut expire = redis::pipe();
        for key in &sentinels {
            expire.cmd("EXPIRE").arg(key).arg(SENTINEL_TTL_SECS);
        }
        let sentinel_lost = link.read::<Vec<i64>>(&expire).await?.contains(&0);
        let run_id = self.read_run_ids(link, &masters).await?;
        let restarted = match (&self.run_id, &run_id) {
            (Some(old), Some(new)) => old != new,
            _ => false,
        };
        if run_id.is_some() {
            self.run_id = run_id;
        }
        if sentinel_lost || restarted {
            write_sentinels(link, &sentinels).await?;
        }
        let first = !std::mem::replace(&mut self.armed, true);
        if first || !(sentinel_lost || restarted) {
            return Ok(None);
        }
        Ok(Some(if restarted {
            RedisReset::Restart
        } else {
            RedisReset::Flush
        }))
    }

    /// Every master's `run_id`, or `None` once Redis refuses `INFO`.
    async fn read_run_ids(
        &mut self,
        link: &mut Link,
        masters: &[Master],
    ) -> Result<Option<RunIds>, redis::RedisError> {
        if !self.info_allowed {
            return Ok(None);
        }
        match run_ids(link, masters).await {
            Ok(ids) => Ok(Some(ids)),
            Err(err) if is_refusal(&err) => {
                tracing::warn!(url = %link.config.target, "Redis refuses INFO; restarts are detected by the sentinel key only.");
                self.info_allowed = false;
                Ok(None)
            }
            Err(err) => Err(err),
        }
    }
}

/// Every master's `run_id`, in a fixed order (a master without one reads as empty).
async fn run_ids(link: &mut Link, masters: &[Master]) -> Result<RunIds, redis::RedisError> {
    let mut info = redis::cmd("INFO");
    info.arg("server");
    let mut ids = Vec::with_capacity(masters.len());
    for master in masters {
        let text: String = link.conn.query_on(master, &info).await?;
        ids.push((master.clone(), parse_run_id(&text).unwrap_or_default()));
    }
    ids.sort();
    Ok(ids)
}

async fn write_sentinels(link: &mut Link, keys: &[String]) -> Result<(), redis::RedisError> {
    let mut pipe = redis::pipe();
    for key in keys {
        pipe.cmd("SET")
            .arg(key)
            .arg(1)
            .arg("EX")
            .arg(SENTINEL_TTL_SECS)
            .ignore();
    }
    link.read::<()>(&pipe).await
}

/// Each master's `run_id`, sorted by master.
type RunIds = Vec<(Master, String)>;

/// A sentinel key of this process: a FLUSHALL (or FLUSHDB, or a restart without
/// persistence) removes it. Per process, so several kvindex replicas sharing one Redis each
/// notice the loss.
fn sentinel_key() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("kvindex:sentinel:{}-{nanos}", std::process::id())
}

/// Whether an error is Redis refusing the command itself (ACL, renamed command) rather
/// than Redis being unreachable or still loading.
fn is_refusal(err: &redis::RedisError) -> bool {
    matches!(
        err.kind(),
        ErrorKind::Server(ServerErrorKind::NoPerm | ServerErrorKind::ResponseError)
    )
}

/// The `run_id` line of `INFO server`.
fn parse_run_id(info: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.strip_prefix("run_id:"))
        .map(|id| id.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_id_comes_from_its_info_line() {
        let info = "# Server\r\nredis_version:7.2.4\r\nrun_id:abc123\r\ntcp_port:6379\r\n";
        assert_eq!(parse_run_id(info).as_deref(), Some("abc123"));
        assert_eq!(parse_run_id("# Server\r\n"), None);
    }
}

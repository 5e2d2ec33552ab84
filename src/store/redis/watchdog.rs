//! The watchdog: every second the writer renews a sentinel key of its own and reads Redis's
//! `run_id` (on a Redis Cluster: one sentinel and one `run_id` per master), so a FLUSHALL (sentinel gone) or a restart (new `run_id`, or the check failing)
//! while kvindex is idle is repaired within seconds rather than at the next failed write.

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use redis::{ErrorKind, ServerErrorKind};

use super::mirror::Writer;
use crate::metrics::{self, RedisReset};
use crate::redis_conn::Master;

/// Lifetime of the sentinel key, renewed by every watchdog check; only a pause of kvindex
/// longer than this could let it expire on its own (a harmless extra repair).
const SENTINEL_TTL_SECS: i64 = 300;

impl Writer {
    /// Checks Redis for a restart (`run_id`) or lost keys (the sentinel), and renews the
    /// sentinel. A failure to reach Redis makes the mirror dirty, so a Redis restarted while
    /// kvindex is idle is reconciled at once rather than at the next failed write. On a
    /// Redis Cluster every master has its own sentinel and `run_id`, and a changed set of
    /// masters (a failover) counts as a restart: a promoted replica may lack the last writes
    /// its master acknowledged.
    pub(super) async fn watchdog(&mut self) {
        let masters = match self.conn.masters().await {
            Ok(masters) => masters,
            Err(err) => return self.go_dirty(&err),
        };
        let sentinels = self.conn.key_per_master(&self.entropy.sentinel);
        let mut expire = redis::pipe();
        for key in &sentinels {
            expire.cmd("EXPIRE").arg(key).arg(SENTINEL_TTL_SECS);
        }
        let sentinel_lost = match expire.query_async::<Vec<i64>>(&mut self.conn).await {
            Ok(answers) => answers.contains(&0),
            Err(err) => return self.go_dirty(&err),
        };
        let run_id = if self.entropy.info_allowed {
            match self.run_ids(&masters).await {
                Ok(ids) => Some(ids),
                Err(err) if is_refusal(&err) => {
                    tracing::warn!(url = %self.config.target, "Redis refuses INFO; restarts are detected by the sentinel key only.");
                    self.entropy.info_allowed = false;
                    None
                }
                Err(err) => return self.go_dirty(&err),
            }
        } else {
            None
        };
        let restarted = match (&self.entropy.run_id, &run_id) {
            (Some(old), Some(new)) => old != new,
            _ => false,
        };
        if run_id.is_some() {
            self.entropy.run_id = run_id;
        }
        if sentinel_lost || restarted {
            if let Err(err) = self.write_sentinels(&sentinels).await {
                return self.go_dirty(&err);
            }
        }
        let first = !std::mem::replace(&mut self.entropy.armed, true);
        if first || !(sentinel_lost || restarted) {
            return;
        }
        let kind = if restarted {
            RedisReset::Restart
        } else {
            RedisReset::Flush
        };
        self.shared
            .entropy
            .redis_resets
            .fetch_add(1, Ordering::Relaxed);
        metrics::redis_reset_detected(kind);
        tracing::warn!(
            url = %self.config.target,
            kind = kind.as_str(),
            "Redis lost kvindex's keys (restart, flush or failover); rewriting the mirror from the index."
        );
        // After a restart Redis may hold an old snapshot: the verify that follows deletes
        // what the index no longer holds, unthrottled.
        self.entropy.verify_after = Some(restarted);
        self.start_rewrite(HashSet::new());
    }

    /// Every master's `run_id`, in a fixed order (a master without one reads as empty).
    async fn run_ids(&mut self, masters: &[Master]) -> Result<RunIds, redis::RedisError> {
        let mut info = redis::cmd("INFO");
        info.arg("server");
        let mut ids = Vec::with_capacity(masters.len());
        for master in masters {
            let text: String = self.conn.query_on(master, &info).await?;
            ids.push((master.clone(), parse_run_id(&text).unwrap_or_default()));
        }
        ids.sort();
        Ok(ids)
    }

    async fn write_sentinels(&mut self, keys: &[String]) -> Result<(), redis::RedisError> {
        let mut pipe = redis::pipe();
        for key in keys {
            pipe.cmd("SET")
                .arg(key)
                .arg(1)
                .arg("EX")
                .arg(SENTINEL_TTL_SECS)
                .ignore();
        }
        pipe.query_async::<()>(&mut self.conn).await
    }
}

/// Each master's `run_id`, sorted by master.
pub(super) type RunIds = Vec<(Master, String)>;

/// A sentinel key of this process: a FLUSHALL (or FLUSHDB, or a restart without
/// persistence) removes it. Per process, so several kvindex replicas sharing one Redis each
/// notice the loss.
pub(super) fn sentinel_key() -> String {
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

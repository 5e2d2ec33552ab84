//! Opening the mirror's connection: a managed single-Redis connection or a Redis Cluster
//! connection, checked with a PING so a bad URL or refused credentials fail at start-up.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::MAX_BACKOFF;
use crate::redis_conn::{ClusterConn, ClusterSettings, RedisConn, RedisTarget};
use crate::store::redis::checkpoint::WATERMARKS_KEY;
use crate::store::redis::error::MirrorError;

/// A command that takes longer than this counts as a failed write.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(3);
/// A connection attempt that takes longer than this counts as Redis being down.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Retries of one cluster request by the client: enough to follow a `MOVED` and an `ASK`,
/// few enough that a dead master makes the mirror dirty at once (ingest goes on, and the
/// reconcile after the failover rewrites what failed) rather than stalling the writer while
/// a replica is promoted.
const CLUSTER_RETRIES: u32 = 3;

/// Opens a managed connection (or a cluster connection) and checks it with a PING, so a bad
/// URL, refused connection or failed auth is a start-up error.
///
/// # Errors
/// [`MirrorError`] naming the URL without its password.
pub(in crate::store::redis) async fn connect(
    target: &RedisTarget,
) -> Result<RedisConn, MirrorError> {
    let shown = target.shown();
    let scrub = |e: &redis::RedisError| target.scrub(&e.to_string());
    let classify = |e: redis::RedisError| {
        let reason = scrub(&e);
        if is_auth_error(&e) {
            MirrorError::Auth {
                url: shown.clone(),
                reason,
            }
        } else if e.kind() == redis::ErrorKind::InvalidClientConfig {
            MirrorError::BadUrl {
                url: shown.clone(),
                reason,
            }
        } else {
            MirrorError::Connect {
                url: shown.clone(),
                reason,
            }
        }
    };
    let mut conn = match target {
        RedisTarget::Single(url) => {
            let client = redis::Client::open(url.as_str()).map_err(|e| MirrorError::BadUrl {
                url: shown.clone(),
                reason: scrub(&e),
            })?;
            // No push sender: it needs RESP3, and kthena's Redis may speak only RESP2. A
            // dropped connection shows up as a failed command instead, which makes the
            // mirror dirty.
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(CONNECT_TIMEOUT))
                .set_response_timeout(Some(RESPONSE_TIMEOUT))
                .set_number_of_retries(1)
                .set_max_delay(MAX_BACKOFF);
            let manager = ConnectionManager::new_with_config(client, config)
                .await
                .map_err(classify)?;
            RedisConn::Single(manager)
        }
        RedisTarget::Cluster(urls) => {
            let settings = ClusterSettings {
                connect_timeout: CONNECT_TIMEOUT,
                response_timeout: RESPONSE_TIMEOUT,
                retries: CLUSTER_RETRIES,
                commit_key: Some(WATERMARKS_KEY.to_owned()),
            };
            RedisConn::Cluster(
                ClusterConn::connect(urls, settings)
                    .await
                    .map_err(classify)?,
            )
        }
    };
    redis::cmd("PING")
        .query_async::<()>(&mut conn)
        .await
        .map_err(classify)?;
    Ok(conn)
}

/// Whether Redis refused the credentials (or wants some and got none).
pub(in crate::store::redis) fn is_auth_error(e: &redis::RedisError) -> bool {
    let text = e.to_string().to_ascii_uppercase();
    e.kind() == redis::ErrorKind::AuthenticationFailed
        || text.contains("WRONGPASS")
        || text.contains("NOAUTH")
        || text.contains("INVALID PASSWORD")
        || text.contains("INVALID USERNAME")
}

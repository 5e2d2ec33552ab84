//! Opening the mirror's connection: a managed single-Redis connection or a Redis Cluster
//! connection, checked with a PING so a bad URL or refused credentials fail at start-up.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::checkpoint::WATERMARKS_KEY;
use super::error::MirrorError;
use crate::redis_conn::{
    connect_single, ClusterConn, ClusterSettings, ConnectFailure, RedisConn, RedisTarget,
};

/// Retry interval cap while Redis stays down: the connection manager's and the writer's.
pub(super) const MAX_BACKOFF: Duration = Duration::from_secs(2);
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
pub(super) async fn connect(target: &RedisTarget) -> Result<RedisConn, MirrorError> {
    let mut conn = match target {
        RedisTarget::Single(url) => {
            // No push sender: it needs RESP3, and kthena's Redis may speak only RESP2. A
            // dropped connection shows up as a failed command instead, which makes the
            // mirror dirty.
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(CONNECT_TIMEOUT))
                .set_response_timeout(Some(RESPONSE_TIMEOUT))
                .set_number_of_retries(1)
                .set_max_delay(MAX_BACKOFF);
            let open = |client| ConnectionManager::new_with_config(client, config);
            RedisConn::Single(connect_single(url, open).await?)
        }
        RedisTarget::Cluster(urls) => {
            let settings = ClusterSettings {
                connect_timeout: CONNECT_TIMEOUT,
                response_timeout: RESPONSE_TIMEOUT,
                retries: CLUSTER_RETRIES,
                commit_key: Some(WATERMARKS_KEY.to_owned()),
            };
            let conn = ClusterConn::connect(urls, settings).await;
            RedisConn::Cluster(conn.map_err(|e| ConnectFailure::of(target, &e))?)
        }
    };
    redis::cmd("PING")
        .query_async::<()>(&mut conn)
        .await
        .map_err(|e| ConnectFailure::of(target, &e))?;
    Ok(conn)
}

/// The writer's lanes: the first connection and `lanes - 1` more to a single Redis, each
/// opened and checked as [`connect`] does. A cluster gets one lane: its connection keeps
/// one connection per master and routes every command by its slot.
///
/// # Errors
/// [`MirrorError`] naming the URL without its password.
pub(super) async fn connect_lanes(
    target: &RedisTarget,
    lanes: usize,
) -> Result<(RedisConn, Vec<RedisConn>), MirrorError> {
    let first = connect(target).await?;
    let more_lanes = if target.is_cluster() {
        0
    } else {
        lanes.saturating_sub(1)
    };
    let mut more = Vec::with_capacity(more_lanes);
    for _ in 0..more_lanes {
        more.push(connect(target).await?);
    }
    Ok((first, more))
}

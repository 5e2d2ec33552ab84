//! The Redis backend: kthena's block keys, read with one pipeline per prompt (on a Redis
//! Cluster, one sub-pipeline per master holding some of the prompt's keys, concurrently).
//!
//! Key `matrix:kv:block:{model}@{std_hash}` is a hash whose fields are pod identifiers and
//! whose values are `"{unix_seconds}"` or `"{unix_seconds}|{MEDIUM}"` (docs/architecture.md §6). Every
//! block of the prompt is fetched in one pipeline of `HGETALL`, as kthena's router does, so
//! a lookup costs one round trip whatever the prompt length. Keys are built and values parsed
//! by `src/redis_layout.rs`, the module the mirror writes with.

use hashbrown::HashMap;
use redis::aio::MultiplexedConnection;
use redis::Value;

use super::lookup::{Lookup, Owner};
use crate::hash::StdHash;
use crate::medium::TierWeights;
use crate::redis_conn::{
    connect_single, ClusterConn, ClusterSettings, ConnectFailure, ConnectFailureKind, RedisTarget,
};
use crate::redis_layout::{block_key, parse_field_value, push_block_key};

/// Why a Redis lookup failed. URLs are always shown without their password.
#[derive(Debug, thiserror::Error)]
pub enum RedisLookupError {
    /// The URL does not parse as a Redis URL.
    #[error("invalid Redis URL {url}: {reason}")]
    BadUrl {
        /// URL without its password.
        url: String,
        /// Why it does not parse, without the password.
        reason: String,
    },
    /// Redis did not answer or refused the connection (or its credentials).
    #[error("cannot connect to Redis at {url}: {reason}")]
    Connect {
        /// URL without its password.
        url: String,
        /// What the connection attempt reported, without the password.
        reason: String,
    },
    /// The pipeline failed (connection, timeout, server error).
    #[error("redis lookup of {blocks} block keys failed: {source}")]
    Redis {
        /// Keys in the pipeline.
        blocks: usize,
        /// The client's error.
        #[source]
        source: redis::RedisError,
    },
    /// A reply that is not a hash (someone else wrote the key).
    #[error("redis key `{key}` is not a hash")]
    NotAHash {
        /// The key.
        key: String,
    },
}

impl From<ConnectFailure> for RedisLookupError {
    fn from(f: ConnectFailure) -> Self {
        let ConnectFailure { kind, url, reason } = f;
        match kind {
            ConnectFailureKind::BadUrl => RedisLookupError::BadUrl { url, reason },
            ConnectFailureKind::Auth | ConnectFailureKind::Unreachable => {
                RedisLookupError::Connect { url, reason }
            }
        }
    }
}

/// A cluster connection attempt or request gives up after this long.
const CLUSTER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);
/// Retries of a cluster request through redirects (few: a caller decides how to retry).
const CLUSTER_RETRIES: u32 = 3;

/// Entry point of the Redis backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct RedisLookup;

impl RedisLookup {
    /// Opens the connection lookups run on (one multiplexed connection, no retries: a
    /// router-side caller decides how to retry).
    ///
    /// # Errors
    /// [`RedisLookupError::BadUrl`] or [`RedisLookupError::Connect`], naming the URL without
    /// its password.
    pub async fn connect(url: &str) -> Result<MultiplexedConnection, RedisLookupError> {
        let open =
            |client: redis::Client| async move { client.get_multiplexed_async_connection().await };
        Ok(connect_single(url, open).await?)
    }

    /// Opens a Redis Cluster connection through its seed URLs (pipelines split per master,
    /// redirects and a failover followed by the client: see `src/redis_conn.rs`).
    ///
    /// # Errors
    /// [`RedisLookupError::BadUrl`] or [`RedisLookupError::Connect`], naming the URLs without
    /// their passwords.
    pub async fn connect_cluster(urls: &[String]) -> Result<ClusterConn, RedisLookupError> {
        let target = RedisTarget::Cluster(urls.to_vec());
        let settings = ClusterSettings {
            connect_timeout: CLUSTER_TIMEOUT,
            response_timeout: CLUSTER_TIMEOUT,
            retries: CLUSTER_RETRIES,
            commit_key: None,
        };
        ClusterConn::connect(urls, settings)
            .await
            .map_err(|e| ConnectFailure::of(&target, &e).into())
    }

    /// Fetches every block of the prompt in one pipeline and keeps the owners among
    /// `candidates`. A missing key (unknown model, block held by nobody) holds nothing.
    ///
    /// # Errors
    /// [`RedisLookupError`] when the pipeline fails or a key is not a hash.
    pub async fn fetch<C, S>(
        conn: &mut C,
        model: &str,
        blocks: &[StdHash],
        candidates: &[S],
        weights: &TierWeights,
    ) -> Result<RedisOwners, RedisLookupError>
    where
        C: redis::aio::ConnectionLike + Send,
        S: AsRef<str>,
    {
        let mut pipe = redis::pipe();
        let mut key = String::new();
        for hash in blocks {
            push_block_key(&mut key, model, *hash);
            pipe.hgetall(key.as_str());
        }
        if blocks.is_empty() {
            return Ok(RedisOwners::default());
        }
        let replies: Vec<Value> =
            pipe.query_async(conn)
                .await
                .map_err(|source| RedisLookupError::Redis {
                    blocks: blocks.len(),
                    source,
                })?;
        let mut slots: HashMap<&str, usize> = HashMap::with_capacity(candidates.len());
        for (i, c) in candidates.iter().enumerate() {
            slots.entry(c.as_ref()).or_insert(i);
        }
        let mut media = MediumWeights::new(weights);
        let mut owners = RedisOwners {
            offsets: Vec::with_capacity(blocks.len() + 1),
            owners: Vec::new(),
        };
        owners.offsets.push(0);
        for (i, reply) in replies.iter().enumerate() {
            let mut add = |field: &Value, value: &Value| {
                let (Some(field), Some(value)) = (as_str(field), as_str(value)) else {
                    return;
                };
                let Some(&candidate) = slots.get(field) else {
                    return;
                };
                let parsed = parse_field_value(value);
                owners.owners.push(Owner {
                    candidate,
                    weight: media.weight(parsed.medium),
                    written_at: parsed.written_at,
                });
            };
            match reply {
                Value::Array(items) => {
                    for pair in items.chunks_exact(2) {
                        add(&pair[0], &pair[1]);
                    }
                }
                Value::Map(pairs) => {
                    for (field, value) in pairs {
                        add(field, value);
                    }
                }
                Value::Nil => {}
                _ => {
                    return Err(RedisLookupError::NotAHash {
                        key: block_key(model, blocks.get(i).copied().unwrap_or_default()),
                    })
                }
            }
            owners.offsets.push(owners.owners.len() as u32);
        }
        Ok(owners)
    }
}

fn as_str(value: &Value) -> Option<&str> {
    match value {
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok(),
        Value::SimpleString(s) => Some(s),
        _ => None,
    }
}

/// Weight per medium spelling, memoized for one fetch (values repeat the same few media).
struct MediumWeights<'w> {
    weights: &'w TierWeights,
    seen: Vec<(String, f64)>,
}

impl<'w> MediumWeights<'w> {
    fn new(weights: &'w TierWeights) -> MediumWeights<'w> {
        MediumWeights {
            weights,
            seen: Vec::new(),
        }
    }

    fn weight(&mut self, medium: &str) -> f64 {
        if medium.is_empty() {
            return 1.0;
        }
        if let Some((_, w)) = self.seen.iter().find(|(m, _)| m == medium) {
            return *w;
        }
        let w = self.weights.weight_of_name(medium);
        if self.seen.len() < 32 {
            self.seen.push((medium.to_owned(), w));
        }
        w
    }
}

/// The owners of every prompt block among the candidates, as fetched from Redis.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RedisOwners {
    /// `owners[offsets[i]..offsets[i + 1]]` hold block i.
    offsets: Vec<u32>,
    owners: Vec<Owner>,
}

impl Lookup for RedisOwners {
    fn blocks(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    fn for_each_owner<F: FnMut(Owner)>(&mut self, block: usize, mut visit: F) {
        let (Some(&from), Some(&to)) = (self.offsets.get(block), self.offsets.get(block + 1))
        else {
            return;
        };
        for owner in &self.owners[from as usize..to as usize] {
            visit(*owner);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medium_weights_are_case_insensitive_and_memoized() {
        let w = TierWeights::default();
        let mut m = MediumWeights::new(&w);
        assert_eq!(m.weight("cpu"), 0.8);
        assert_eq!(m.weight("cpu"), 0.8);
        assert_eq!(m.weight(""), 1.0);
        assert_eq!(m.weight("GPU"), 1.0);
        assert_eq!(m.seen.len(), 2);
    }
}

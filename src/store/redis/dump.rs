//! kvindex's keys in a canonical sorted form, to compare two states (`kvindex redis-dump`).
//! An offline tool: SCAN with MATCH on kvindex's own prefixes is fine here.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::connect::connect;
use super::error::MirrorError;
use crate::redis_conn::{RedisConn, RedisTarget};
use crate::redis_layout::{block_key_pattern, mapping_key_pattern, split_block_key};
use crate::wire::Engine;

/// Keys fetched per pipeline.
const FETCH_CHUNK: usize = 500;

/// One mapping key's value and remaining lifetime.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MappingEntry {
    /// The std hash it maps to.
    pub value: String,
    /// Seconds left (`-1` = no TTL).
    pub ttl: i64,
}

/// Block keys with their fields, and mapping keys, all sorted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedisDump {
    /// `matrix:kv:block:{model}@{std}` → field (`{pod}.{ns}`) → value.
    pub blocks: BTreeMap<String, BTreeMap<String, String>>,
    /// `{engine}:kv:block:{pod}@{engine_hash}` → value and TTL.
    pub mappings: BTreeMap<String, MappingEntry>,
}

/// [`dump_target`] of a single Redis at `url`.
///
/// # Errors
/// [`MirrorError`] when Redis cannot be reached or a command fails.
pub async fn dump(
    url: &str,
    model: Option<&str>,
    pod: Option<&str>,
) -> Result<RedisDump, MirrorError> {
    dump_target(&RedisTarget::Single(url.to_owned()), model, pod).await
}

/// Reads kvindex's keys (on a Redis Cluster, from every master). `model` keeps block keys of that model (and mapping keys pointing at
/// their hashes); `pod` keeps that pod's fields and mapping keys.
///
/// # Errors
/// [`MirrorError`] when Redis cannot be reached or a command fails.
pub async fn dump_target(
    target: &RedisTarget,
    model: Option<&str>,
    pod: Option<&str>,
) -> Result<RedisDump, MirrorError> {
    let mut conn = connect(target).await?;
    let failed = |e: redis::RedisError| MirrorError::Command {
        url: target.shown(),
        reason: target.scrub(&e.to_string()),
    };
    let block_keys = scan(&mut conn, &block_key_pattern(model))
        .await
        .map_err(failed)?;
    let mut out = RedisDump::default();
    for chunk in block_keys.chunks(FETCH_CHUNK) {
        let mut pipe = redis::pipe();
        for key in chunk {
            pipe.hgetall(key);
        }
        let values: Vec<BTreeMap<String, String>> =
            pipe.query_async(&mut conn).await.map_err(failed)?;
        for (key, mut fields) in chunk.iter().zip(values) {
            if let Some(pod) = pod {
                fields.retain(|f, _| f == pod);
            }
            if !fields.is_empty() {
                out.blocks.insert(key.clone(), fields);
            }
        }
    }
    let mut mapping_keys = Vec::new();
    for engine in [Engine::Vllm, Engine::Sglang] {
        let pattern = mapping_key_pattern(engine, pod);
        mapping_keys.extend(scan(&mut conn, &pattern).await.map_err(failed)?);
    }
    let kept_hashes: Option<BTreeSet<&str>> = model.map(|_| {
        out.blocks
            .keys()
            .filter_map(|k| split_block_key(k).map(|(_, h)| h))
            .collect()
    });
    let mut mappings = BTreeMap::new();
    for chunk in mapping_keys.chunks(FETCH_CHUNK) {
        let mut pipe = redis::pipe();
        for key in chunk {
            pipe.get(key).ttl(key);
        }
        let values: Vec<(Option<String>, i64)> = {
            let flat: Vec<redis::Value> = pipe.query_async(&mut conn).await.map_err(failed)?;
            flat.chunks(2)
                .map(|p| {
                    let value = p
                        .first()
                        .and_then(|v| redis::from_redis_value::<Option<String>>(v.clone()).ok())
                        .flatten();
                    let ttl = p
                        .get(1)
                        .and_then(|v| redis::from_redis_value::<i64>(v.clone()).ok())
                        .unwrap_or(-2);
                    (value, ttl)
                })
                .collect()
        };
        for (key, (value, ttl)) in chunk.iter().zip(values) {
            // A key that expired between SCAN and GET is simply not there.
            let Some(value) = value else { continue };
            if let Some(kept) = &kept_hashes {
                if !kept.contains(value.as_str()) {
                    continue;
                }
            }
            mappings.insert(key.clone(), MappingEntry { value, ttl });
        }
    }
    out.mappings = mappings;
    Ok(out)
}

/// Every key matching `pattern` on every master, sorted.
async fn scan(conn: &mut RedisConn, pattern: &str) -> Result<Vec<String>, redis::RedisError> {
    let mut keys = BTreeSet::new();
    for master in conn.masters().await? {
        let mut cursor: u64 = 0;
        loop {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000);
            let (next, batch): (u64, Vec<String>) = conn.query_on(&master, &cmd).await?;
            keys.extend(batch);
            if next == 0 {
                break;
            }
            cursor = next;
        }
    }
    Ok(keys.into_iter().collect())
}

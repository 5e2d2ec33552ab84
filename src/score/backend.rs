//! [`ScoreBackend`]: where a service scores from — this process's in-memory index, or
//! kthena's keys in Redis, which sharded replicas all write, so any replica answers for
//! every pod.

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::redis_conn::{connect_single, RedisConn, RedisTarget};

use super::prefix::{score_index_with, score_prefix, PrefixScores};
use super::prompt::{MatchMode, PromptSettings};
use super::redis_lookup::{RedisLookup, RedisLookupError};
use crate::hash::StdHash;
use crate::index::Index;
use crate::medium::TierWeights;

/// A Redis read that takes longer than this fails (the API answers 503 rather than hang).
const REDIS_RESPONSE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Where scores come from.
#[derive(Clone)]
pub enum ScoreBackend {
    /// The in-memory index of this process (one replica: it holds every pod).
    Index(Index),
    /// kthena's block keys in Redis, one pipelined round trip per prompt (sharded replicas:
    /// this process's index holds only its own pods), on one node or a Redis Cluster (one
    /// pipelined round trip per master involved). The connection reconnects by itself.
    Redis(RedisConn),
}

impl std::fmt::Debug for ScoreBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ScoreBackend::Index(_) => f.write_str("ScoreBackend::Index"),
            ScoreBackend::Redis(_) => f.write_str("ScoreBackend::Redis"),
        }
    }
}

impl ScoreBackend {
    /// A Redis backend on `target` (one node or a cluster); the first connection is made
    /// here, so a bad URL or refused credentials fail the start.
    ///
    /// # Errors
    /// [`RedisLookupError::BadUrl`] or [`RedisLookupError::Connect`], without the password.
    pub async fn redis(target: &RedisTarget) -> Result<ScoreBackend, RedisLookupError> {
        match target {
            RedisTarget::Single(url) => Self::single(url).await,
            RedisTarget::Cluster(urls) => Ok(ScoreBackend::Redis(RedisConn::Cluster(
                RedisLookup::connect_cluster(urls).await?,
            ))),
        }
    }

    async fn single(url: &str) -> Result<ScoreBackend, RedisLookupError> {
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(REDIS_RESPONSE_TIMEOUT))
            .set_connection_timeout(Some(REDIS_RESPONSE_TIMEOUT));
        let open = |client| ConnectionManager::new_with_config(client, config);
        let conn = connect_single(url, open).await?;
        Ok(ScoreBackend::Redis(RedisConn::Single(conn)))
    }

    /// Whether scores come from Redis.
    pub fn is_redis(&self) -> bool {
        matches!(self, ScoreBackend::Redis(_))
    }

    /// Whether this backend can match chain-verified (`prefix`): only the in-memory index
    /// keeps chains; Redis holds kthena's content-only keys.
    pub fn matches_prefix(&self) -> bool {
        !self.is_redis()
    }

    /// Whether this backend can match kthena's content-only std hashes: Redis always, the
    /// in-memory index when it keeps their layer (`ingest.std_hashes`).
    pub fn matches_kthena(&self) -> bool {
        match self {
            ScoreBackend::Index(index) => index.has_std_layer(),
            ScoreBackend::Redis(_) => true,
        }
    }

    /// The match mode of a request that names none: `prefix` where it is possible.
    pub fn default_mode(&self) -> MatchMode {
        if self.matches_prefix() {
            MatchMode::Prefix
        } else {
            MatchMode::Kthena
        }
    }

    /// The block hashes of prompt `tokens` of `model` for `mode`
    /// ([`PromptSettings::blocks`]). For `kthena` on the in-memory index, the std hashes of
    /// blocks it holds are the ones its runs keep (a chain hash names its block's tokens):
    /// SHA-256 only for the rest (for every block of an index without the std layer, which
    /// answers none).
    /// A tenant `salt` seeds `prefix` chains ([`PromptSettings::salted_blocks`]); `kthena`
    /// hashes are content-only.
    pub fn prompt_blocks(
        &self,
        prompt: &PromptSettings,
        model: &str,
        salt: Option<&str>,
        tokens: &[u32],
        mode: MatchMode,
    ) -> Vec<u64> {
        match (self, mode) {
            (ScoreBackend::Index(index), MatchMode::Kthena) => {
                prompt.hash_with_known(model, tokens, |chains| index.stored_std_hashes(chains))
            }
            _ => prompt.salted_blocks(model, salt, tokens, mode),
        }
    }

    /// The in-memory index this backend scores from; `None` for Redis.
    pub fn index(&self) -> Option<&Index> {
        match self {
            ScoreBackend::Index(index) => Some(index),
            ScoreBackend::Redis(_) => None,
        }
    }

    /// Scores `candidates` for `blocks` of `model` in `mode` (kthena's scoring rule; every
    /// candidate counts as fresh, as the API has no container start times).
    ///
    /// # Errors
    /// [`RedisLookupError`] when the Redis backend fails; the index never fails.
    pub async fn prefix_scores<S: AsRef<str>>(
        &self,
        model: &str,
        blocks: &[StdHash],
        candidates: &[S],
        weights: &TierWeights,
        mode: MatchMode,
    ) -> Result<PrefixScores, RedisLookupError> {
        match self {
            ScoreBackend::Index(index) => Ok(score_index_with(
                index,
                model,
                blocks,
                candidates,
                weights,
                &[],
                mode,
            )),
            // `blocks` are std hashes here: callers ask a Redis backend for `kthena` only
            // (see `matches_prefix`).
            ScoreBackend::Redis(conn) => {
                let mut conn = conn.clone();
                let mut owners =
                    RedisLookup::fetch(&mut conn, model, blocks, candidates, weights).await?;
                let slots = score_prefix(&mut owners, candidates.len(), &[]);
                Ok(PrefixScores::from_slots(blocks.len(), candidates, &slots))
            }
        }
    }
}

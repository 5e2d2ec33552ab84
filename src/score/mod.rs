//! Longest-prefix, tier-weighted scoring of pods for a prompt (kthena semantics), and the
//! memoized prefill/decode (PD) group scheduler (docs/architecture.md §4).
//!
//! | file | job |
//! | --- | --- |
//! | `prompt.rs` | [`PromptSettings`]: tokens → std or chain block hashes (block size, cap); [`MatchMode`] |
//! | `lookup.rs` | the [`Lookup`] trait and [`IndexLookup`], the in-memory backend |
//! | `redis_lookup.rs` | [`RedisLookup`]: one pipelined `HGETALL` per prompt over kthena's keys (spelled by `redis_layout`) |
//! | `prefix.rs` | [`score_prefix`]: first block required, consecutive match, integer score |
//! | `pd.rs` | [`schedule`]: top-N decodes paired with the best prefill of their group |
//! | `backend.rs` | [`ScoreBackend`]: a service scores from its index, or from Redis (sharded replicas) |
//! | `speculative.rs` | `prefix` scoring with routers' placements beside the index's owners |
//! | `feedback.rs` | [`Predictions`]: a routed request's predicted match against the engine's reported reuse |
//!
//! Data flows one way: a backend answers "who holds block *i* of this prompt, on which
//! tier" for a fixed candidate list, and the scorer folds those answers into scores. The
//! backend never sees the scoring rule and the scorer never sees Redis or the index.
//!
//! Two match modes ([`MatchMode`]): `prefix` (chain-verified, the in-memory default) and
//! `kthena` (content-only std hashes, what Redis holds). The scoring rule is the same.
//!
//! Tier weights are [`crate::medium::TierWeights`].

mod backend;
mod feedback;
mod lookup;
mod pd;
mod prefix;
mod prompt;
mod redis_lookup;
mod speculative;

pub use backend::ScoreBackend;
pub use feedback::{Judgement, Outcome, Prediction, Predictions, MAX_PREDICTIONS, PREDICTION_TTL};
pub use lookup::{Candidates, IndexLookup, Lookup, Owner, Owners};
pub use pd::{
    schedule, schedule_unmemoized, DecodeCandidate, KvScorer, Pair, PdError, PrefillGroups, Scorer,
    DEFAULT_TOP_N,
};
pub use prefix::{
    confirmed_match, kthena_score, score_candidates, score_index, score_index_with, score_prefix,
    PodScore, PrefixScores, SlotScore,
};
pub use prompt::{MatchMode, PromptError, PromptSettings};
pub use redis_lookup::{RedisLookup, RedisLookupError, RedisOwners};

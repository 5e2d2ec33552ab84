//! `kvindex score`: scores candidate pods for a prompt, from Redis or from recorded streams.
//!
//! With `--redis URL` (or `--redis-cluster URL,…`) the command reads kthena's block keys,
//! exactly as a router would (the same library path as a router-side user). With `--replay FILE…` it builds an in-memory
//! index from recorded engine streams first, which is how operators check what a capture
//! would have scored without any Redis.

use std::io::Read;
use std::path::PathBuf;

use anyhow::Context;

use super::EngineArg;
use super::UsageError;
use kvindex::api::ScoreBody;
use kvindex::index::Index;
use kvindex::ingest::replay_files;
use kvindex::medium::TierWeights;
use kvindex::score::{
    score_index_with, score_prefix, MatchMode, PrefixScores, PromptSettings, RedisLookup,
    RedisLookupError,
};

/// Arguments of `kvindex score`.
#[derive(Debug, clap::Args)]
pub struct ScoreArgs {
    /// Served model name the blocks are keyed by.
    #[arg(long)]
    pub model: String,
    /// JSON array of the prompt's token ids, in a file or `-` for stdin.
    #[arg(long)]
    pub tokens: String,
    /// Candidate pod identifiers (`{pod}.{namespace}`), comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub pods: Vec<String>,
    /// Read kthena's block keys from this Redis (`redis://host:port/db`).
    #[arg(long, conflicts_with_all = ["replay", "redis_cluster"])]
    pub redis: Option<String>,
    /// Read kthena's block keys from a Redis Cluster, through these seed node URLs
    /// (comma-separated): one pipelined round trip per master involved.
    #[arg(long, value_delimiter = ',', num_args = 1.., conflicts_with = "replay")]
    pub redis_cluster: Vec<String>,
    /// Build the index from these recorded streams instead of reading Redis.
    #[arg(long, num_args = 1..)]
    pub replay: Vec<PathBuf>,
    /// Pod identifier the recorded streams belong to.
    #[arg(long, default_value = "replay-0.default")]
    pub replay_pod: String,
    /// Engine of the recorded streams (`auto` guesses from the file name).
    #[arg(long, value_enum, default_value_t = EngineArg::Auto)]
    pub engine: EngineArg,
    /// Tokens per block.
    #[arg(long, default_value_t = kvindex::hash::DEFAULT_BLOCK_SIZE)]
    pub block_size: usize,
    /// Cap on the number of prompt blocks scored.
    #[arg(long, default_value_t = kvindex::hash::DEFAULT_MAX_BLOCKS)]
    pub max_blocks: usize,
    /// Tier weight `MEDIUM=W` (repeatable; W in [0, 1]); on top of the defaults.
    #[arg(long = "weight", value_name = "MEDIUM=W")]
    pub weights: Vec<String>,
    /// Weight of media no `--weight` names.
    #[arg(long, default_value_t = 1.0)]
    pub unknown_medium_weight: f64,
    /// Engine start time `POD=UNIX_SECONDS` (repeatable): owners written at or before it
    /// are dropped as stale, as kthena's router does.
    #[arg(long = "started-at", value_name = "POD=UNIX_SECONDS")]
    pub started_at: Vec<String>,
    /// Print the `/v1/score` response body instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Match mode: `prefix` (chain-verified, default with `--replay`) or `kthena`
    /// (content-only std hashes; the only mode `--redis` supports, since Redis holds
    /// kthena's keys).
    #[arg(long = "match", value_name = "MODE")]
    pub match_mode: Option<MatchMode>,
}

fn read_tokens(source: &str) -> anyhow::Result<Vec<u32>> {
    let mut text = String::new();
    if source == "-" {
        std::io::stdin()
            .read_to_string(&mut text)
            .context("cannot read the tokens from stdin")?;
    } else {
        text = std::fs::read_to_string(source)
            .with_context(|| format!("cannot read the tokens file {source}"))?;
    }
    serde_json::from_str(&text)
        .map_err(|e| UsageError(format!("--tokens must be a JSON array of token ids: {e}")).into())
}

fn parse_weights(args: &ScoreArgs) -> anyhow::Result<TierWeights> {
    let mut pairs = Vec::new();
    for w in &args.weights {
        let (tier, value) = w
            .split_once('=')
            .ok_or_else(|| UsageError(format!("--weight `{w}` is not MEDIUM=W")))?;
        let value: f64 = value
            .trim()
            .parse()
            .map_err(|_| UsageError(format!("--weight `{w}`: `{value}` is not a number")))?;
        pairs.push((tier.trim().to_owned(), value));
    }
    TierWeights::new(
        pairs.iter().map(|(t, v)| (t.as_str(), *v)),
        args.unknown_medium_weight,
    )
    .map_err(|errors| {
        let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
        UsageError(text.join("; ")).into()
    })
}

fn parse_started_at(args: &ScoreArgs) -> anyhow::Result<Vec<Option<u64>>> {
    let mut started = vec![None; args.pods.len()];
    for s in &args.started_at {
        let (pod, ts) = s
            .split_once('=')
            .ok_or_else(|| UsageError(format!("--started-at `{s}` is not POD=UNIX_SECONDS")))?;
        let ts: u64 = ts
            .trim()
            .parse()
            .map_err(|_| UsageError(format!("--started-at `{s}`: `{ts}` is not unix seconds")))?;
        let slot = args
            .pods
            .iter()
            .position(|p| p == pod.trim())
            .ok_or_else(|| UsageError(format!("--started-at names `{pod}`, not a --pods entry")))?;
        started[slot] = Some(ts);
    }
    Ok(started)
}

/// Computes the scores the command prints.
///
/// # Errors
/// Usage errors (bad tokens, weights, missing backend), unreadable files, Redis failures.
pub async fn compute(args: &ScoreArgs) -> anyhow::Result<PrefixScores> {
    let prompt = PromptSettings::new(args.block_size, args.max_blocks)
        .map_err(|e| UsageError(e.to_string()))?;
    let weights = parse_weights(args)?;
    let started_at = parse_started_at(args)?;
    let tokens = read_tokens(&args.tokens)?;
    let from_redis = args.redis.is_some() || !args.redis_cluster.is_empty();
    if from_redis && args.match_mode == Some(MatchMode::Prefix) {
        let e = "--match prefix needs the in-memory index (--replay): Redis holds kthena's keys";
        return Err(UsageError(e.into()).into());
    }
    let blocks = prompt.hash(&tokens);
    let usage = |flag: &str, e: RedisLookupError| match e {
        RedisLookupError::BadUrl { .. } => UsageError(format!("{flag}: {e}")).into(),
        e => anyhow::Error::new(e),
    };
    let owners = if let Some(url) = &args.redis {
        let mut conn = RedisLookup::connect(url)
            .await
            .map_err(|e| usage("--redis", e))?;
        Some(RedisLookup::fetch(&mut conn, &args.model, &blocks, &args.pods, &weights).await?)
    } else if !args.redis_cluster.is_empty() {
        let mut conn = RedisLookup::connect_cluster(&args.redis_cluster)
            .await
            .map_err(|e| usage("--redis-cluster", e))?;
        Some(RedisLookup::fetch(&mut conn, &args.model, &blocks, &args.pods, &weights).await?)
    } else {
        None
    };
    if let Some(mut owners) = owners {
        let slots = score_prefix(&mut owners, args.pods.len(), &started_at);
        return Ok(PrefixScores::from_slots(blocks.len(), &args.pods, &slots));
    }
    if args.replay.is_empty() {
        let what = "give --redis URL, --redis-cluster URL,… or --replay FILE… to score from";
        return Err(UsageError(what.into()).into());
    }
    let engine = args.engine.resolve(&args.replay[0]);
    let replay = replay_files(
        Index::new(),
        &args.replay_pod,
        &args.model,
        engine,
        &args.replay,
    )?;
    let mode = args.match_mode.unwrap_or_default();
    let blocks = prompt.blocks(&args.model, &tokens, mode);
    Ok(score_index_with(
        replay.index(),
        &args.model,
        &blocks,
        &args.pods,
        &weights,
        &started_at,
        mode,
    ))
}

/// The scores as an aligned table.
pub fn render_table(scores: &PrefixScores) -> String {
    let mut out = format!("total blocks  {}\n", scores.total_blocks);
    let width = scores
        .scores
        .iter()
        .map(|s| s.pod.len())
        .max()
        .unwrap_or(3)
        .max(3);
    out.push_str(&format!(
        "{:<width$}  {:>5}  {:>7}  {:>12}\n",
        "pod", "score", "matched", "weighted sum"
    ));
    for s in &scores.scores {
        out.push_str(&format!(
            "{:<width$}  {:>5}  {:>7}  {:>12.3}\n",
            s.pod, s.score, s.matched_blocks, s.weighted_sum
        ));
    }
    out
}

/// Runs the command.
///
/// # Errors
/// As [`compute`].
pub async fn run(args: ScoreArgs) -> anyhow::Result<()> {
    let scores = compute(&args).await?;
    if args.json {
        println!("{}", serde_json::to_string(&ScoreBody::new(&scores))?);
    } else {
        print!("{}", render_table(&scores));
    }
    Ok(())
}

//! The accuracy signal: what kvindex predicted for a routed request, against what the engine
//! reports it reused.
//!
//! A router that tells kvindex where it placed a request (`POST /v1/routed` with a
//! `request_id`) has the index's confirmed match on that pod kept here; when the engine's
//! answer comes back (`usage.prompt_tokens_details.cached_tokens`, `POST /v1/feedback`), the
//! two are compared in blocks. Predictions are kept for a bounded time and count, oldest
//! dropped first, so a router that never sends feedback costs a fixed amount of memory.
//!
//! Engines never report a whole prompt as cached: the last prompt token is always computed
//! (vLLM and SGLang both keep at least one token to prefill), so a prompt of `n` tokens
//! reuses at most `(n - 1) / block_size` whole blocks, and the prediction is capped there.
//! A pod's match is over all its DP ranks, while the engine reports the rank that served the
//! request: with several ranks holding different prefixes, a prediction can read `over`.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use hashbrown::HashMap;
use parking_lot::Mutex;

/// How long a prediction waits for its feedback.
pub const PREDICTION_TTL: Duration = Duration::from_secs(600);
/// Predictions kept at most.
pub const MAX_PREDICTIONS: usize = 100_000;

/// One routed request's prediction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prediction {
    /// Blocks the index held of the prompt on the chosen pod (confirmed entries only),
    /// capped at what an engine can report reused.
    pub blocks: u32,
    /// Tokens per block.
    pub block_size: u32,
}

impl Prediction {
    /// The prediction for a match of `matched` blocks of a prompt of `prompt_tokens` tokens
    /// (when known) cut into blocks of `block_size`.
    pub fn new(matched: u32, prompt_tokens: Option<usize>, block_size: usize) -> Prediction {
        let reusable = prompt_tokens.map_or(u32::MAX, |n| {
            u32::try_from(n.saturating_sub(1) / block_size.max(1)).unwrap_or(u32::MAX)
        });
        Prediction {
            blocks: matched.min(reusable),
            block_size: u32::try_from(block_size).unwrap_or(u32::MAX).max(1),
        }
    }

    /// How the prediction compares with `cached_tokens` the engine reported reused.
    pub fn judge(&self, cached_tokens: u64) -> Judgement {
        let actual = cached_tokens / u64::from(self.block_size);
        let predicted = u64::from(self.blocks);
        let outcome = match predicted.cmp(&actual) {
            std::cmp::Ordering::Equal => Outcome::Exact,
            std::cmp::Ordering::Greater => Outcome::Over,
            std::cmp::Ordering::Less => Outcome::Under,
        };
        Judgement {
            outcome,
            predicted,
            actual,
        }
    }
}

/// Whether a prediction was right.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Predicted exactly the blocks the engine reused.
    Exact,
    /// Predicted more than the engine had: a false hit.
    Over,
    /// Predicted fewer: blocks the index did not know yet.
    Under,
}

impl Outcome {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Exact => "exact",
            Outcome::Over => "over",
            Outcome::Under => "under",
        }
    }
}

/// A prediction against the engine's answer, in blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Judgement {
    /// Exact, over or under.
    pub outcome: Outcome,
    /// Blocks predicted.
    pub predicted: u64,
    /// Whole blocks the engine reported reused.
    pub actual: u64,
}

impl Judgement {
    /// |predicted − actual| in blocks.
    pub fn error_blocks(&self) -> u64 {
        self.predicted.abs_diff(self.actual)
    }
}

/// Predictions waiting for their feedback, by request id.
#[derive(Debug)]
pub struct Predictions {
    ttl: Duration,
    max: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    by_id: HashMap<String, (Prediction, Instant)>,
    /// (recorded at, request id) in recording order.
    order: VecDeque<(Instant, String)>,
}

impl Default for Predictions {
    fn default() -> Self {
        Predictions::new(PREDICTION_TTL, MAX_PREDICTIONS)
    }
}

impl Predictions {
    /// Keeps each prediction for `ttl`, at most `max` of them.
    pub fn new(ttl: Duration, max: usize) -> Predictions {
        Predictions {
            ttl,
            max: max.max(1),
            state: Mutex::default(),
        }
    }

    /// Records `prediction` for `request_id` at `now` (a second record replaces the first).
    pub fn record(&self, request_id: &str, prediction: Prediction, now: Instant) {
        let mut state = self.state.lock();
        self.expire(&mut state, now);
        state.by_id.insert(request_id.to_owned(), (prediction, now));
        state.order.push_back((now, request_id.to_owned()));
        while state.by_id.len() > self.max {
            let Some((at, id)) = state.order.pop_front() else {
                break;
            };
            remove_if_recorded_at(&mut state, &id, at);
        }
    }

    /// Takes the prediction of `request_id`, judged against `cached_tokens`; `None` for a
    /// request never recorded, already judged, or recorded longer than the TTL ago.
    pub fn judge(&self, request_id: &str, cached_tokens: u64, now: Instant) -> Option<Judgement> {
        let mut state = self.state.lock();
        self.expire(&mut state, now);
        let (prediction, _) = state.by_id.remove(request_id)?;
        Some(prediction.judge(cached_tokens))
    }

    /// Predictions waiting now.
    pub fn len(&self) -> usize {
        self.state.lock().by_id.len()
    }

    /// Whether none is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn expire(&self, state: &mut State, now: Instant) {
        while let Some((at, _)) = state.order.front() {
            if now.saturating_duration_since(*at) < self.ttl {
                break;
            }
            if let Some((at, id)) = state.order.pop_front() {
                remove_if_recorded_at(state, &id, at);
            }
        }
    }
}

/// Removes `id` if its prediction is the one recorded at `at` (not replaced since).
fn remove_if_recorded_at(state: &mut State, id: &str, at: Instant) {
    if state
        .by_id
        .get(id)
        .is_some_and(|(_, recorded)| *recorded == at)
    {
        state.by_id.remove(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prediction_is_capped_at_what_an_engine_can_reuse() {
        // 64 tokens in 4 whole blocks: the last token is always computed, so 3 at most.
        assert_eq!(Prediction::new(4, Some(64), 16).blocks, 3);
        assert_eq!(Prediction::new(4, Some(65), 16).blocks, 4);
        assert_eq!(Prediction::new(2, Some(64), 16).blocks, 2);
        assert_eq!(Prediction::new(9, None, 16).blocks, 9);
    }

    #[test]
    fn outcomes_compare_whole_blocks() {
        let p = Prediction::new(3, None, 16);
        assert_eq!(p.judge(48).outcome, Outcome::Exact);
        assert_eq!(p.judge(63).outcome, Outcome::Exact);
        let over = p.judge(16);
        assert_eq!((over.outcome, over.error_blocks()), (Outcome::Over, 2));
        assert_eq!(p.judge(64).outcome, Outcome::Under);
    }

    #[test]
    fn predictions_are_judged_once_and_forgotten_after_their_ttl_or_beyond_the_cap() {
        let store = Predictions::new(Duration::from_secs(10), 2);
        let t0 = Instant::now();
        let p = Prediction::new(1, None, 16);
        store.record("a", p, t0);
        assert!(store.judge("a", 16, t0).is_some());
        assert!(store.judge("a", 16, t0).is_none(), "judged once");
        store.record("b", p, t0);
        assert!(store.judge("b", 16, t0 + Duration::from_secs(10)).is_none());
        store.record("c", p, t0);
        store.record("d", p, t0);
        store.record("e", p, t0);
        assert_eq!(store.len(), 2);
        assert!(store.judge("c", 0, t0).is_none(), "the oldest made room");
        assert!(store.judge("e", 0, t0).is_some());
    }
}

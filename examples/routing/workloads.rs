//! Seeded workloads: every token of every prompt, every output and every arrival offset
//! comes from the seed, so two runs with one seed send the same requests.
//!
//! A workload is a list of [`Session`]s: a session starts at an offset (Poisson arrivals)
//! and runs [`Step`]s one after another; a step's requests all arrive at the same instant,
//! a think time after every request of the step before has finished. A chat session is one
//! request per step (a turn); an agent fan-out is several (a round). Only the times between
//! steps depend on the run (how long the engines took); the requests do not.

use std::sync::Arc;
use std::time::Duration;

/// Token ids are drawn below this: at most 5 digits, so a 131,072-token prompt stays under
/// the API's 1 MiB body limit as JSON.
const VOCABULARY: u64 = 99_999;

/// A small seeded generator (SplitMix64).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`, with `stream` separating independent uses of one seed.
    pub fn new(seed: u64, stream: u64) -> Rng {
        let mut rng = Rng(seed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03));
        rng.next_u64();
        rng
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below((hi - lo + 1) as u64) as usize
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Exponential with mean `mean_s` seconds.
    pub fn exp(&mut self, mean_s: f64) -> Duration {
        Duration::from_secs_f64(-mean_s * (1.0 - self.unit()).ln())
    }

    /// `n` token ids.
    pub fn tokens(&mut self, n: usize) -> Vec<u32> {
        (0..n).map(|_| 1 + self.below(VOCABULARY) as u32).collect()
    }
}

/// Zipf popularity over `n` items with exponent `s`: item 0 the most popular.
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    /// The distribution.
    pub fn new(n: usize, s: f64) -> Zipf {
        let mut total = 0.0;
        let mut cdf: Vec<f64> = (1..=n.max(1))
            .map(|k| {
                total += 1.0 / (k as f64).powf(s);
                total
            })
            .collect();
        for c in &mut cdf {
            *c /= total;
        }
        Zipf { cdf }
    }

    /// One draw.
    pub fn sample(&self, rng: &mut Rng) -> usize {
        let u = rng.unit();
        self.cdf
            .partition_point(|c| *c <= u)
            .min(self.cdf.len() - 1)
    }
}

/// One request: its prompt and the tokens the engine will generate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestSpec {
    /// Prompt tokens.
    pub prompt: Arc<Vec<u32>>,
    /// Output tokens (decoded, then cached as the engine fills blocks).
    pub output: Arc<Vec<u32>>,
}

/// Requests that arrive together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// Wait after the previous step finished (after the session's start for the first).
    pub after: Duration,
    /// The requests.
    pub requests: Vec<RequestSpec>,
}

/// A sequence of steps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// Offset of the session's start from the run's.
    pub start: Duration,
    /// Its steps, in order.
    pub steps: Vec<Step>,
}

/// A named list of sessions.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Its name in the report.
    pub name: String,
    /// Sessions, by start.
    pub sessions: Vec<Session>,
}

impl Workload {
    /// Requests in all sessions (some may start after a run's end).
    pub fn requests(&self) -> usize {
        self.sessions
            .iter()
            .flat_map(|s| &s.steps)
            .map(|s| s.requests.len())
            .sum()
    }
}

/// What every generator needs: the seed, how long arrivals go on, a rate multiplier.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    /// The seed.
    pub seed: u64,
    /// Sessions start within this window.
    pub window: Duration,
    /// Multiplies every arrival rate.
    pub rate_scale: f64,
}

/// Poisson session starts at `rate` per second within the window.
fn starts(rng: &mut Rng, rate: f64, window: Duration) -> Vec<Duration> {
    let mut t = Duration::ZERO;
    let mut out = Vec::new();
    loop {
        t += rng.exp(1.0 / rate);
        if t >= window {
            return out;
        }
        out.push(t);
    }
}

fn request(prompt: Vec<u32>, output: Vec<u32>) -> RequestSpec {
    RequestSpec {
        prompt: Arc::new(prompt),
        output: Arc::new(output),
    }
}

/// Multi-turn chat over shared system prompts: 16 system prompts (256–2,048 tokens) chosen
/// by Zipf popularity (s = 1), sessions arriving at 8/s, 2–6 turns of a 32–384-token
/// message and a 64–256-token answer, 0.5 s mean think time. A turn's prompt is the system
/// prompt and the whole conversation so far.
pub fn chat(p: Params) -> Workload {
    let mut rng = Rng::new(p.seed, 1);
    let systems: Vec<Vec<u32>> = (0..16)
        .map(|_| {
            let n = rng.range(256, 2048);
            rng.tokens(n)
        })
        .collect();
    let zipf = Zipf::new(systems.len(), 1.0);
    let sessions = starts(&mut rng, 8.0 * p.rate_scale, p.window)
        .into_iter()
        .map(|start| {
            let mut history = systems[zipf.sample(&mut rng)].clone();
            let turns = rng.range(2, 6);
            let steps = (0..turns)
                .map(|turn| {
                    let n = rng.range(32, 384);
                    history.extend(rng.tokens(n));
                    let n = rng.range(64, 256);
                    let output = rng.tokens(n);
                    let prompt = history.clone();
                    history.extend(&output);
                    let after = if turn == 0 {
                        Duration::ZERO
                    } else {
                        rng.exp(0.5)
                    };
                    Step {
                        after,
                        requests: vec![request(prompt, output)],
                    }
                })
                .collect();
            Session { start, steps }
        })
        .collect();
    Workload {
        name: "chat".into(),
        sessions,
    }
}

/// Agent fan-out: tasks arriving at 3/s, each a new 2,048–8,192-token context, then 2–4
/// rounds of 4–8 requests at the same instant, each the context so far and its own
/// 64–256-token suffix (32–160 output tokens); between rounds the context grows by a
/// 128–512-token result, after a 0.2 s mean pause.
pub fn fanout(p: Params) -> Workload {
    let mut rng = Rng::new(p.seed, 2);
    let sessions = starts(&mut rng, 3.0 * p.rate_scale, p.window)
        .into_iter()
        .map(|start| {
            let n = rng.range(2048, 8192);
            let mut context = rng.tokens(n);
            let rounds = rng.range(2, 4);
            let steps = (0..rounds)
                .map(|round| {
                    let after = if round == 0 {
                        Duration::ZERO
                    } else {
                        let n = rng.range(128, 512);
                        context.extend(rng.tokens(n));
                        rng.exp(0.2)
                    };
                    let width = rng.range(4, 8);
                    let requests = (0..width)
                        .map(|_| {
                            let mut prompt = context.clone();
                            let n = rng.range(64, 256);
                            prompt.extend(rng.tokens(n));
                            let n = rng.range(32, 160);
                            request(prompt, rng.tokens(n))
                        })
                        .collect();
                    Step { after, requests }
                })
                .collect();
            Session { start, steps }
        })
        .collect();
    Workload {
        name: "fanout".into(),
        sessions,
    }
}

/// Chat and agent fan-out at once.
pub fn mixed(p: Params) -> Workload {
    let mut sessions = chat(p).sessions;
    sessions.extend(fanout(p).sessions);
    sessions.sort_by_key(|s| s.start);
    Workload {
        name: "mixed".into(),
        sessions,
    }
}

/// One-off prompts sharing nothing: 20/s, 256–4,096 tokens, 16–256 output tokens.
pub fn oneoff(p: Params) -> Workload {
    let mut rng = Rng::new(p.seed, 3);
    let sessions = starts(&mut rng, 20.0 * p.rate_scale, p.window)
        .into_iter()
        .map(|start| {
            let n = rng.range(256, 4096);
            let prompt = rng.tokens(n);
            let n = rng.range(16, 256);
            let steps = vec![Step {
                after: Duration::ZERO,
                requests: vec![request(prompt, rng.tokens(n))],
            }];
            Session { start, steps }
        })
        .collect();
    Workload {
        name: "oneoff".into(),
        sessions,
    }
}

/// The longest prompt the `long` workload sends.
pub const LONG_MAX_TOKENS: usize = 131_072;

/// Questions over long documents: 8 documents of 8,192 to 131,008 tokens (Zipf, s = 0.8),
/// queries at 6/s, each a document and a 16–64-token question (the longest document's
/// queries are exactly 131,072 tokens), 16–128 output tokens.
pub fn long(p: Params) -> Workload {
    let mut rng = Rng::new(p.seed, 4);
    let lengths = [
        LONG_MAX_TOKENS - 64,
        98_304,
        65_536,
        49_152,
        32_768,
        24_576,
        16_384,
        8_192,
    ];
    let docs: Vec<Vec<u32>> = lengths.iter().map(|n| rng.tokens(*n)).collect();
    let zipf = Zipf::new(docs.len(), 0.8);
    let sessions = starts(&mut rng, 6.0 * p.rate_scale, p.window)
        .into_iter()
        .map(|start| {
            let doc = &docs[zipf.sample(&mut rng)];
            let question = if doc.len() == LONG_MAX_TOKENS - 64 {
                64
            } else {
                rng.range(16, 64)
            };
            let mut prompt = doc.clone();
            prompt.extend(rng.tokens(question));
            let n = rng.range(16, 128);
            let steps = vec![Step {
                after: Duration::ZERO,
                requests: vec![request(prompt, rng.tokens(n))],
            }];
            Session { start, steps }
        })
        .collect();
    Workload {
        name: "long".into(),
        sessions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(seed: u64) -> Params {
        Params {
            seed,
            window: Duration::from_secs(3),
            rate_scale: 1.0,
        }
    }

    #[test]
    fn one_seed_one_workload() {
        for generate in [chat, fanout, mixed, oneoff, long] {
            let (a, b) = (generate(params(7)), generate(params(7)));
            assert_eq!(a.sessions, b.sessions, "{}", a.name);
            assert!(a.requests() > 0, "{}", a.name);
            assert_ne!(a.sessions, generate(params(8)).sessions, "{}", a.name);
        }
    }

    #[test]
    fn a_chat_turn_extends_the_last_turn_and_its_answer() {
        let w = chat(params(1));
        let s = w
            .sessions
            .iter()
            .find(|s| s.steps.len() > 2)
            .expect("a long session");
        for pair in s.steps.windows(2) {
            let (before, after) = (&pair[0].requests[0], &pair[1].requests[0]);
            let seen = [before.prompt.as_slice(), before.output.as_slice()].concat();
            assert!(after.prompt.starts_with(&seen));
            assert!(after.prompt.len() > seen.len());
        }
    }

    #[test]
    fn a_round_shares_its_context_and_arrives_at_once() {
        let w = fanout(params(1));
        let round = &w.sessions[0].steps[0];
        assert!(round.requests.len() >= 4);
        let shortest = round
            .requests
            .iter()
            .map(|r| r.prompt.len())
            .min()
            .unwrap_or(0);
        let context = &round.requests[0].prompt[..shortest - 256];
        assert!(context.len() >= 2048 - 256);
        assert!(round.requests.iter().all(|r| r.prompt.starts_with(context)));
    }

    #[test]
    fn long_prompts_reach_but_never_pass_the_limit() {
        let w = long(Params {
            window: Duration::from_secs(20),
            ..params(3)
        });
        let longest = w
            .sessions
            .iter()
            .flat_map(|s| &s.steps)
            .flat_map(|s| &s.requests)
            .map(|r| r.prompt.len())
            .max();
        assert_eq!(longest, Some(LONG_MAX_TOKENS));
    }

    #[test]
    fn zipf_favours_the_first_items() {
        let zipf = Zipf::new(4, 1.0);
        let mut rng = Rng::new(5, 0);
        let mut counts = [0u32; 4];
        for _ in 0..10_000 {
            counts[zipf.sample(&mut rng)] += 1;
        }
        assert!(counts[0] > counts[1] && counts[1] > counts[3], "{counts:?}");
    }
}

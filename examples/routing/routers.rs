//! The routers compared. `kvindex`, `kvindex+speculative` and `oracle` share one rule —
//! the most matched blocks less a load penalty per request in flight, ties broken at random
//! (seeded) — and differ only in where the matched blocks come from: `/v1/score`, or the
//! engines' true caches at the moment of routing.

use crate::workloads::Rng;

/// Which router places the requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum RouterKind {
    /// A pod at random.
    Random,
    /// Pods in turn.
    RoundRobin,
    /// The pod with the fewest requests in flight.
    LeastLoaded,
    /// The rule on `/v1/score` (`prefix` mode, all pods as candidates).
    Kvindex,
    /// The same, then `/v1/routed` with the chosen pod (and `/v1/feedback` after prefill).
    KvindexSpeculative,
    /// The rule on the engines' true caches.
    Oracle,
}

impl RouterKind {
    /// Every router, in report order.
    pub const ALL: [RouterKind; 6] = [
        RouterKind::Random,
        RouterKind::RoundRobin,
        RouterKind::LeastLoaded,
        RouterKind::Kvindex,
        RouterKind::KvindexSpeculative,
        RouterKind::Oracle,
    ];

    /// Its name in flags and the report.
    pub fn name(self) -> &'static str {
        match self {
            RouterKind::Random => "random",
            RouterKind::RoundRobin => "round-robin",
            RouterKind::LeastLoaded => "least-loaded",
            RouterKind::Kvindex => "kvindex",
            RouterKind::KvindexSpeculative => "kvindex+speculative",
            RouterKind::Oracle => "oracle",
        }
    }

    /// Whether it asks kvindex's `/v1/score`.
    pub fn asks_kvindex(self) -> bool {
        matches!(self, RouterKind::Kvindex | RouterKind::KvindexSpeculative)
    }

    /// Parses a name (`kvindex-speculative` is accepted for `kvindex+speculative`).
    pub fn parse(text: &str) -> Result<RouterKind, String> {
        RouterKind::ALL
            .into_iter()
            .find(|k| k.name() == text || k.name().replace('+', "-") == text)
            .ok_or_else(|| {
                let names: Vec<&str> = RouterKind::ALL.iter().map(|k| k.name()).collect();
                format!("unknown router `{text}` ({}, or all)", names.join(", "))
            })
    }
}

/// One router's state over a run.
pub struct Router {
    kind: RouterKind,
    penalty: f64,
    rng: Rng,
    turn: usize,
}

impl Router {
    /// A router of `kind`, `penalty` matched blocks per request in flight.
    pub fn new(kind: RouterKind, penalty: f64, seed: u64) -> Router {
        Router {
            kind,
            penalty,
            rng: Rng::new(seed, 0x726f_7574),
            turn: 0,
        }
    }

    /// Chooses a pod from the requests each has in flight and, for the prefix routers, the
    /// blocks each is said to hold (`matched`).
    pub fn choose(&mut self, loads: &[u32], matched: &[u32]) -> usize {
        match self.kind {
            RouterKind::Random => self.rng.below(loads.len() as u64) as usize,
            RouterKind::RoundRobin => {
                self.turn += 1;
                (self.turn - 1) % loads.len()
            }
            RouterKind::LeastLoaded => {
                let values: Vec<f64> = loads.iter().map(|l| -f64::from(*l)).collect();
                self.best(&values)
            }
            RouterKind::Kvindex | RouterKind::KvindexSpeculative | RouterKind::Oracle => {
                let values: Vec<f64> = matched
                    .iter()
                    .zip(loads)
                    .map(|(m, l)| f64::from(*m) - self.penalty * f64::from(*l))
                    .collect();
                self.best(&values)
            }
        }
    }

    /// The index of the highest value, a random one among equals.
    fn best(&mut self, values: &[f64]) -> usize {
        let top = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let ties: Vec<usize> = (0..values.len()).filter(|i| values[*i] == top).collect();
        ties[self.rng.below(ties.len() as u64) as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefix_rule_weighs_matches_against_load() {
        let mut r = Router::new(RouterKind::Oracle, 4.0, 1);
        assert_eq!(r.choose(&[0, 0, 0], &[0, 10, 3]), 1);
        // 10 - 4×3 = -2 < 3 - 0.
        assert_eq!(r.choose(&[0, 3, 0], &[0, 10, 3]), 2);
        let mut ll = Router::new(RouterKind::LeastLoaded, 4.0, 1);
        assert_eq!(ll.choose(&[2, 1, 3], &[]), 1);
        let mut rr = Router::new(RouterKind::RoundRobin, 4.0, 1);
        let turns: Vec<usize> = (0..4).map(|_| rr.choose(&[0, 0, 0], &[])).collect();
        assert_eq!(turns, vec![0, 1, 2, 0]);
    }

    #[test]
    fn names_round_trip() {
        for k in RouterKind::ALL {
            assert_eq!(RouterKind::parse(k.name()), Ok(k));
        }
        assert_eq!(
            RouterKind::parse("kvindex-speculative"),
            Ok(RouterKind::KvindexSpeculative)
        );
        assert!(RouterKind::parse("best").is_err());
    }
}

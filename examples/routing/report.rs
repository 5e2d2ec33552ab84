//! What one run measured, and the tables (and JSON) made of it.

use serde::Serialize;

/// Predictions on the chosen pod against what its engine then took from its cache.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Predictions {
    /// Predicted blocks = the engine's hit.
    pub exact: u64,
    /// Predicted more than the engine had.
    pub over: u64,
    /// Predicted less.
    pub under: u64,
}

impl Predictions {
    /// Counts one route.
    pub fn count(&mut self, predicted: usize, actual: usize) {
        match predicted.cmp(&actual) {
            std::cmp::Ordering::Equal => self.exact += 1,
            std::cmp::Ordering::Greater => self.over += 1,
            std::cmp::Ordering::Less => self.under += 1,
        }
    }

    fn total(&self) -> u64 {
        self.exact + self.over + self.under
    }
}

/// The daemon's own prediction counters over a run (`kvindex_route_predictions_total`),
/// and feedback for requests it did not know.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct DaemonPredictions {
    /// `outcome="exact"`.
    pub exact: u64,
    /// `outcome="over"`.
    pub over: u64,
    /// `outcome="under"`.
    pub under: u64,
    /// Feedback the daemon answered 404 to.
    pub unknown_feedback: u64,
}

/// The daemon's placements over a run (`kvindex+speculative`), by what became of them.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Placements {
    /// Entries placed.
    pub placed: u64,
    /// Confirmed by the engine's own store.
    pub confirmed: u64,
    /// Reached their TTL unconfirmed.
    pub expired: u64,
    /// Dropped by the pod's remove, clear, restart or reset.
    pub dropped: u64,
    /// Evicted to stay within `speculative.max_entries`.
    pub evicted: u64,
}

/// `/v1/score` round trips as the router saw them.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Latency {
    /// Median, ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
}

impl Latency {
    /// Percentiles of `samples` (ms); `None` for no samples.
    pub fn of(mut samples: Vec<f64>) -> Option<Latency> {
        if samples.is_empty() {
            return None;
        }
        samples.sort_by(f64::total_cmp);
        let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
        Some(Latency {
            p50_ms: at(0.50),
            p99_ms: at(0.99),
        })
    }
}

/// Whether the daemon saw every event batch the engines published.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct IngestCheck {
    /// Messages the engines published (probes included).
    pub published: u64,
    /// Messages the daemon received (replayed ones included).
    pub received: u64,
    /// Sequence gaps the daemon saw.
    pub gaps: u64,
    /// Sources the daemon reset.
    pub resets: u64,
    /// Events the daemon refused, and stores it could not resolve.
    pub invalid: u64,
}

/// Engine-side counters summed over the pods.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct EngineTotals {
    /// GPU blocks evicted.
    pub gpu_evictions: u64,
    /// CPU blocks evicted.
    pub cpu_evictions: u64,
    /// Blocks stored over a pool whose every block was in flight.
    pub overflows: u64,
    /// Cached tokens that came from the CPU tier.
    pub cpu_cached_tokens: u64,
}

/// One (workload, router) run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunStats {
    /// The workload.
    pub workload: String,
    /// The router.
    pub router: String,
    /// Requests routed.
    pub requests: u64,
    /// Requests not sent because the run's time was up.
    pub cut_requests: u64,
    /// Their prompt tokens.
    pub prompt_tokens: u64,
    /// Tokens the engines took from their caches.
    pub cached_tokens: u64,
    /// Requests each pod received.
    pub per_pod: Vec<u64>,
    /// `/v1/score`'s matched blocks on the chosen pod against the engine's hit (routers
    /// that ask kvindex).
    pub predictions: Option<Predictions>,
    /// Routes where the longest prefix some pod truly held was longer than the score's
    /// `total_blocks` (routers that ask kvindex).
    pub hidden_prefix_routes: Option<u64>,
    /// Routes whose prompt had more blocks than the score looked at.
    pub truncated_prompts: Option<u64>,
    /// `/v1/score` latency.
    pub score_latency: Option<Latency>,
    /// The daemon's counters (`kvindex+speculative`).
    pub daemon_predictions: Option<DaemonPredictions>,
    /// The daemon's placements (`kvindex+speculative`).
    pub placements: Option<Placements>,
    /// Ingest sanity.
    pub ingest: IngestCheck,
    /// Engine counters.
    pub engines: EngineTotals,
    /// Wall-clock seconds of the run.
    pub seconds: f64,
    /// Why the run failed, when it did.
    pub error: Option<String>,
}

impl RunStats {
    /// Cached ÷ prompt tokens.
    pub fn hit_rate(&self) -> f64 {
        if self.prompt_tokens == 0 {
            return 0.0;
        }
        self.cached_tokens as f64 / self.prompt_tokens as f64
    }

    /// The busiest pod's requests over the mean.
    pub fn imbalance(&self) -> f64 {
        let max = self.per_pod.iter().copied().max().unwrap_or(0) as f64;
        let mean = self.per_pod.iter().sum::<u64>() as f64 / self.per_pod.len().max(1) as f64;
        if mean == 0.0 {
            return 0.0;
        }
        max / mean
    }
}

fn pct(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "-".into();
    }
    format!("{:.1}", 100.0 * part as f64 / whole as f64)
}

fn row(run: &RunStats, oracle: Option<f64>) -> String {
    if let Some(error) = &run.error {
        return format!("| {} | failed: {error} |", run.router);
    }
    let of_oracle = match oracle {
        Some(o) if o > 0.0 => format!("{:.1} %", 100.0 * run.hit_rate() / o),
        _ => "-".into(),
    };
    let predictions = run.predictions.map_or("-".into(), |p| {
        format!(
            "{} / {} / {} %",
            pct(p.exact, p.total()),
            pct(p.over, p.total()),
            pct(p.under, p.total())
        )
    });
    let hidden = match (run.hidden_prefix_routes, run.truncated_prompts) {
        (Some(h), Some(t)) => format!("{h} ({t} cut)"),
        _ => "-".into(),
    };
    let latency = run
        .score_latency
        .map_or("-".into(), |l| format!("{:.2} / {:.2}", l.p50_ms, l.p99_ms));
    let daemon = run.daemon_predictions.map_or("-".into(), |d| {
        format!(
            "{} / {} / {} ({} unknown)",
            d.exact, d.over, d.under, d.unknown_feedback
        )
    });
    format!(
        "| {} | {} | {} | {} | {:.1} % | {} | {:.2} | {} | {} | {} | {} |",
        run.router,
        run.requests,
        run.prompt_tokens,
        run.cached_tokens,
        100.0 * run.hit_rate(),
        of_oracle,
        run.imbalance(),
        predictions,
        hidden,
        latency,
        daemon
    )
}

/// The table of one workload's runs (markdown), with a line per run whose ingest was not
/// clean.
pub fn table(runs: &[&RunStats]) -> String {
    let oracle = runs
        .iter()
        .find(|r| r.router == "oracle" && r.error.is_none())
        .map(|r| r.hit_rate());
    let mut out = String::from(
        "| router | requests | prompt tokens | cached tokens | hit rate | of oracle | per pod max÷mean | predicted exact / over / under | hidden prefix routes | /v1/score p50 / p99 ms | daemon exact / over / under |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for run in runs {
        out.push_str(&row(run, oracle));
        out.push('\n');
    }
    for run in runs {
        let i = run.ingest;
        if i.received < i.published || i.gaps > 0 || i.resets > 0 || i.invalid > 0 {
            out.push_str(&format!(
                "note: {}: the daemon received {} of {} messages, {} gaps, {} resets, {} refused or unresolved events\n",
                run.router, i.received, i.published, i.gaps, i.resets, i.invalid
            ));
        }
        if let Some(p) = run.placements {
            out.push_str(&format!(
                "note: {}: the daemon's placements: {} placed, {} confirmed, {} expired, {} dropped, {} evicted\n",
                run.router, p.placed, p.confirmed, p.expired, p.dropped, p.evicted
            ));
        }
        if run.cut_requests > 0 {
            out.push_str(&format!(
                "note: {}: {} requests were not sent: the run's time (--drain) was up\n",
                run.router, run.cut_requests
            ));
        }
        if run.engines.overflows > 0 {
            out.push_str(&format!(
                "note: {}: {} blocks stored while every GPU block was in flight (the pool ran over)\n",
                run.router, run.engines.overflows
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn predictions_and_percentiles() {
        let mut p = Predictions::default();
        p.count(3, 3);
        p.count(4, 3);
        p.count(1, 3);
        assert_eq!((p.exact, p.over, p.under), (1, 1, 1));
        let l = Latency::of((1..=100).map(f64::from).collect()).expect("samples");
        assert_eq!((l.p50_ms, l.p99_ms), (51.0, 99.0));
        let run = RunStats {
            per_pod: vec![3, 1, 2, 2],
            prompt_tokens: 100,
            cached_tokens: 40,
            ..RunStats::default()
        };
        assert_eq!(run.imbalance(), 1.5);
        assert_eq!(run.hit_rate(), 0.4);
    }
}

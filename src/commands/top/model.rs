//! What `kvindex top` shows, computed from the daemon's answers without any I/O: the
//! Prometheus text parser, the `/v1/pods` body ([`PodsBody`], the API's own type), and rates
//! between two polls.

use std::collections::BTreeMap;

use kvindex::api::PodsBody;
use kvindex::ingest::PodCounters;

/// One sample of the Prometheus text format.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Metric name.
    pub name: String,
    /// Labels, in the order given.
    pub labels: Vec<(String, String)>,
    /// Value.
    pub value: f64,
}

impl Sample {
    /// The value of label `key`.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Parses the Prometheus text exposition format; comments and lines that do not parse are
/// skipped (a scrape is read as far as it makes sense, never refused).
pub fn parse_metrics(text: &str) -> Vec<Sample> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(parse_line)
        .collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let name = line[..name_end].to_owned();
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(inner) = rest.strip_prefix('{') {
        let (parsed, after) = parse_labels(inner)?;
        labels = parsed;
        rest = after;
    }
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// `key="value",…}` → the labels and what follows the `}`.
fn parse_labels(mut s: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels = Vec::new();
    loop {
        s = s.trim_start_matches([',', ' ']);
        if let Some(after) = s.strip_prefix('}') {
            return Some((labels, after));
        }
        let eq = s.find('=')?;
        let key = s[..eq].trim().to_owned();
        let mut chars = s[eq + 1..].char_indices();
        if chars.next()?.1 != '"' {
            return None;
        }
        let mut value = String::new();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                '"' => {
                    end = Some(eq + 1 + i + 1);
                    break;
                }
                c => value.push(c),
            }
        }
        labels.push((key, value));
        s = &s[end?..];
    }
}

/// The daemon-wide figures `top` reads from `/metrics`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Totals {
    /// Messages received.
    pub messages: f64,
    /// Events decoded.
    pub events: f64,
    /// Messages rejected.
    pub decode_errors: f64,
    /// Seq gaps.
    pub seq_gaps: f64,
    /// Replays that filled their gap.
    pub replays_succeeded: f64,
    /// Replays that failed.
    pub replays_failed: f64,
    /// Sources reset.
    pub source_resets: f64,
    /// Engine restarts.
    pub restarts: f64,
    /// API requests answered.
    pub api_requests: f64,
    /// Resident entries per medium.
    pub resident: BTreeMap<String, f64>,
    /// The mirror, when the daemon runs one.
    pub mirror: Option<Mirror>,
    /// Routed requests' predictions and routers' placements.
    pub routing: Routing,
}

/// Routed requests' predictions judged by feedback, and routers' speculative placements.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Routing {
    /// Predictions the engine's reported reuse matched exactly.
    pub exact: f64,
    /// Predictions above it: false hits.
    pub over: f64,
    /// Predictions below it: blocks the index did not know yet.
    pub under: f64,
    /// Feedback for request ids with no prediction.
    pub unknown_feedback: f64,
    /// Speculative entries live now.
    pub speculative_live: f64,
    /// Speculative entries the engine's own store confirmed.
    pub confirmed: f64,
    /// Speculative entries that reached their TTL unconfirmed.
    pub expired: f64,
    /// Speculative entries dropped by a remove, clear, restart, reset or removal.
    pub dropped: f64,
}

impl Routing {
    /// Predictions judged so far.
    pub fn judged(&self) -> f64 {
        self.exact + self.over + self.under
    }

    /// The share of judged predictions that were exact, in percent; `None` before any.
    pub fn exact_percent(&self) -> Option<f64> {
        let judged = self.judged();
        (judged > 0.0).then(|| 100.0 * self.exact / judged)
    }
}

/// The Redis mirror's figures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Mirror {
    /// Delta batches waiting.
    pub queue_depth: f64,
    /// Redis commands written.
    pub commands: f64,
    /// Flush latency p99, seconds.
    pub flush_p99_seconds: f64,
    /// Writes failed and wait for a reconcile.
    pub dirty: bool,
    /// A reconcile runs.
    pub reconciling: bool,
}

impl Totals {
    /// Sums the samples `top` needs.
    pub fn from_samples(samples: &[Sample]) -> Totals {
        let sum = |name: &str| {
            samples
                .iter()
                .filter(|s| s.name == name)
                .map(|s| s.value)
                .sum::<f64>()
        };
        let has = |name: &str| samples.iter().any(|s| s.name == name);
        let resident = samples
            .iter()
            .filter(|s| s.name == "kvindex_resident_blocks")
            .filter_map(|s| Some((s.label("medium")?.to_owned(), s.value)))
            .collect();
        let mirror = has("kvindex_mirror_queue_depth").then(|| Mirror {
            queue_depth: sum("kvindex_mirror_queue_depth"),
            commands: sum("kvindex_mirror_commands_total"),
            flush_p99_seconds: sum("kvindex_mirror_flush_p99_seconds"),
            dirty: sum("kvindex_mirror_dirty") > 0.0,
            reconciling: sum("kvindex_mirror_reconciling") > 0.0,
        });
        let labelled = |name: &str, key: &str, value: &str| {
            (samples.iter())
                .filter(|s| s.name == name && s.label(key) == Some(value))
                .map(|s| s.value)
                .sum::<f64>()
        };
        let outcome = |o| labelled("kvindex_route_predictions_total", "outcome", o);
        let event = |e| labelled("kvindex_speculative_total", "event", e);
        let routing = Routing {
            exact: outcome("exact"),
            over: outcome("over"),
            under: outcome("under"),
            unknown_feedback: sum("kvindex_route_feedback_unknown_total"),
            speculative_live: sum("kvindex_speculative_entries"),
            confirmed: event("confirmed"),
            expired: event("expired"),
            dropped: event("dropped"),
        };
        Totals {
            messages: sum("kvindex_messages_total"),
            events: sum("kvindex_events_total"),
            decode_errors: sum("kvindex_decode_errors_total"),
            seq_gaps: sum("kvindex_seq_gaps_total"),
            replays_succeeded: sum("kvindex_replays_succeeded_total"),
            replays_failed: sum("kvindex_replays_failed_total"),
            source_resets: sum("kvindex_source_resets_total"),
            restarts: sum("kvindex_restarts_detected_total"),
            api_requests: sum("kvindex_api_requests_total"),
            resident,
            mirror,
            routing,
        }
    }
}

/// Parses a `GET /v1/pods` body.
///
/// # Errors
/// When the body is not the documented JSON.
pub fn parse_pods(body: &str) -> Result<PodsBody, serde_json::Error> {
    serde_json::from_str(body)
}

/// Per-second rates of one target between two polls.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PodRates {
    /// Events decoded per second.
    pub events: f64,
    /// Blocks stored per second.
    pub blocks_stored: f64,
    /// Blocks removed per second.
    pub blocks_removed: f64,
}

/// Rate of a counter between two readings `seconds` apart (0 when it went back: the
/// target restarted, or the daemon did).
pub fn rate(before: f64, now: f64, seconds: f64) -> f64 {
    if seconds <= 0.0 || now < before {
        0.0
    } else {
        (now - before) / seconds
    }
}

impl PodRates {
    /// Rates between two counter readings.
    pub fn between(before: &PodCounters, now: &PodCounters, seconds: f64) -> PodRates {
        let r = |b: u64, n: u64| rate(b as f64, n as f64, seconds);
        PodRates {
            events: r(before.events, now.events),
            blocks_stored: r(before.blocks_stored, now.blocks_stored),
            blocks_removed: r(before.blocks_removed, now.blocks_removed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP kvindex_messages_total ZMQ messages received.
# TYPE kvindex_messages_total counter
kvindex_messages_total{engine="vllm"} 40
kvindex_messages_total{engine="sglang"} 2
kvindex_events_total{engine="vllm",type="BlockStored"} 30
kvindex_resident_blocks{medium="GPU"} 17
kvindex_resident_blocks{medium="CPU_PINNED"} 2
kvindex_last_message_age_seconds{pod="a \"quoted\" pod,x",source="static"} 0.25
kvindex_api_request_duration_seconds_bucket{route="/v1/score",le="+Inf"} 3
kvindex_targets_connected 7
garbage line without value
"#;

    #[test]
    fn samples_keep_names_labels_and_values() {
        let samples = parse_metrics(TEXT);
        assert_eq!(samples.len(), 8, "the garbage line is skipped");
        let age = &samples[5];
        assert_eq!(age.name, "kvindex_last_message_age_seconds");
        assert_eq!(age.label("pod"), Some("a \"quoted\" pod,x"));
        assert_eq!(age.label("source"), Some("static"));
        assert_eq!(age.value, 0.25);
        assert_eq!(samples[6].label("le"), Some("+Inf"));
        assert_eq!(samples[7].labels, vec![]);
        assert_eq!(samples[7].value, 7.0);
    }

    #[test]
    fn totals_sum_over_labels_and_see_no_mirror_without_one() {
        let t = Totals::from_samples(&parse_metrics(TEXT));
        assert_eq!(t.messages, 42.0);
        assert_eq!(t.events, 30.0);
        assert_eq!(t.resident.get("GPU"), Some(&17.0));
        assert_eq!(t.mirror, None);
        let with = format!("{TEXT}kvindex_mirror_queue_depth 3\nkvindex_mirror_dirty 1\n");
        let m = Totals::from_samples(&parse_metrics(&with)).mirror.unwrap();
        assert_eq!((m.queue_depth, m.dirty, m.reconciling), (3.0, true, false));
    }

    #[test]
    fn routing_counts_predictions_by_outcome_and_placements_by_event() {
        let none = Totals::from_samples(&parse_metrics(TEXT)).routing;
        assert_eq!((none.judged(), none.exact_percent()), (0.0, None));
        let text = format!(
            "{TEXT}kvindex_route_predictions_total{{outcome=\"exact\"}} 6\n\
             kvindex_route_predictions_total{{outcome=\"over\"}} 1\n\
             kvindex_route_predictions_total{{outcome=\"under\"}} 1\n\
             kvindex_route_feedback_unknown_total 2\n\
             kvindex_route_prediction_error_blocks_count 8\n\
             kvindex_speculative_entries 40\n\
             kvindex_speculative_total{{event=\"placed\"}} 90\n\
             kvindex_speculative_total{{event=\"confirmed\"}} 30\n\
             kvindex_speculative_total{{event=\"expired\"}} 15\n\
             kvindex_speculative_total{{event=\"dropped\"}} 5\n"
        );
        let r = Totals::from_samples(&parse_metrics(&text)).routing;
        assert_eq!(
            (r.exact, r.over, r.under, r.unknown_feedback),
            (6.0, 1.0, 1.0, 2.0)
        );
        assert_eq!(r.exact_percent(), Some(75.0));
        assert_eq!(
            (r.speculative_live, r.confirmed, r.expired, r.dropped),
            (40.0, 30.0, 15.0, 5.0)
        );
    }

    #[test]
    fn rates_never_go_negative() {
        assert_eq!(rate(10.0, 30.0, 2.0), 10.0);
        assert_eq!(rate(30.0, 10.0, 2.0), 0.0);
        assert_eq!(rate(1.0, 2.0, 0.0), 0.0);
    }

    #[test]
    fn pods_parse_with_and_without_the_newer_fields() {
        let body = r#"{"pods":[{"pod":"a.ns","model":"m","engine":"vllm","endpoint":"tcp://x:1","dp_ranks":2,"source":"static","state":"connecting","last_message_age_seconds":null,"resident_blocks":{"GPU":3}}]}"#;
        let pods = parse_pods(body).unwrap().pods;
        assert_eq!(pods[0].pod, "a.ns");
        assert_eq!(pods[0].resident_blocks.get("GPU"), Some(&3));
        assert_eq!(pods[0].counters, PodCounters::default());
    }
}

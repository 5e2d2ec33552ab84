//! The queries the demo prints: ready-to-paste `curl` lines and the answers they must give,
//! computed from the expected index with the scorer the API uses.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde_json::{json, Value};

use super::scenario::{prompt, MODEL, PODS};
use kvindex::api::ScoreBody;
use kvindex::index::Index;
use kvindex::medium::TierWeights;
use kvindex::score::{
    schedule, score_index_with, DecodeCandidate, KvScorer, MatchMode, PromptSettings, DEFAULT_TOP_N,
};

/// The mode the printed queries use: the API's default, so the request bodies need no
/// `match` field.
const MODE: MatchMode = MatchMode::Prefix;

/// One printed query: the request and the answer it must get.
#[derive(Debug, Clone)]
pub struct Query {
    /// API path.
    pub path: &'static str,
    /// Request body.
    pub body: Value,
    /// The answer the daemon must give.
    pub expected: Value,
}

impl Query {
    /// A `curl` line that can be pasted into a shell.
    pub fn curl(&self, api: SocketAddr) -> String {
        format!(
            "curl -s http://{api}{} -H 'Content-Type: application/json' -d '{}'",
            self.path, self.body
        )
    }
}

/// The scripted pods of the demo's model, as the API names them.
fn scripted_pods() -> Vec<String> {
    PODS.iter()
        .filter(|p| p.model == MODEL)
        .map(|p| p.id())
        .collect()
}

/// `POST /v1/score` for the prompt over every pod of the model.
pub fn score(expected: &Index, weights: &TierWeights) -> Query {
    let tokens = prompt();
    let pods = scripted_pods();
    let blocks = PromptSettings::default().blocks(MODEL, &tokens, MODE);
    let scores = score_index_with(expected, MODEL, &blocks, &pods, weights, &[], MODE);
    let answer = serde_json::to_value(ScoreBody::new(&scores)).unwrap_or(Value::Null);
    Query {
        path: "/v1/score",
        body: json!({"model": MODEL, "tokens": tokens, "pods": pods}),
        expected: answer,
    }
}

/// `POST /v1/pd/schedule`: both vLLM pods decode, each in its own PD group whose prefill
/// candidates are the SGLang pod and the other vLLM pod.
pub fn pd(expected: &Index, weights: &TierWeights) -> Query {
    let tokens = prompt();
    let pods = scripted_pods();
    let [a, b, sglang] = [&pods[0], &pods[1], &pods[2]];
    let decodes = [
        DecodeCandidate {
            pod: a,
            group: "pd-a",
            score: None,
        },
        DecodeCandidate {
            pod: b,
            group: "pd-b",
            score: None,
        },
    ];
    let groups: BTreeMap<&str, Vec<&str>> = BTreeMap::from([
        ("pd-a", vec![sglang.as_str(), b.as_str()]),
        ("pd-b", vec![sglang.as_str(), a.as_str()]),
    ]);
    let blocks = PromptSettings::default().blocks(MODEL, &tokens, MODE);
    let all: Vec<&str> = pods.iter().map(String::as_str).collect();
    let mut scorer = KvScorer::from_index_with(expected, MODEL, &blocks, &all, weights, MODE);
    let answer = match schedule(&decodes, &groups, DEFAULT_TOP_N, &mut scorer) {
        Ok(pairs) => json!({"pairs": pairs.iter().map(|p| json!({
            "decode": p.decode, "prefill": p.prefill, "prefill_score": p.prefill_score,
        })).collect::<Vec<_>>()}),
        Err(err) => json!({"error": err.to_string()}),
    };
    Query {
        path: "/v1/pd/schedule",
        body: json!({
            "model": MODEL,
            "tokens": tokens,
            "decode": decodes.iter().map(|d| json!({"pod": d.pod, "group": d.group})).collect::<Vec<_>>(),
            "prefill": groups,
        }),
        expected: answer,
    }
}

//! kthena parity of the prefix scorer, as table tests run against both backends: the
//! in-memory index (filled with real `BlockStored` events through `Index::apply`) and Redis
//! (filled with kthena's exact key layout, read back with one pipelined HGETALL).

use kvindex::hash::{prompt_block_hashes, StdHash};
use kvindex::index::{Discard, Index, SourceSpec};
use kvindex::medium::{Medium, TierWeights};
use kvindex::score::{score_index, score_prefix, PrefixScores, RedisLookup};
use kvindex::store::redis::block_key;
use kvindex::wire::{BlockHash, BlockStored, Engine, EngineBatch, Event};

/// One pod's holdings: (block index, medium spelling or "" for none, unix second stored).
struct Holds {
    pod: &'static str,
    blocks: Vec<(usize, &'static str, u32)>,
}

struct Case {
    name: &'static str,
    prompt_blocks: usize,
    holds: Vec<Holds>,
    candidates: Vec<&'static str>,
    weights: TierWeights,
    /// Engine start time per candidate (freshness rule); empty = no rule.
    started_at: Vec<Option<u64>>,
    /// (pod, score, matched blocks), best first.
    expect: Vec<(&'static str, u32, u32)>,
}

fn prompt(case: usize, blocks: usize) -> Vec<u32> {
    let base = 1_000_000 * (case as u32 + 1);
    (base..base + 16 * blocks as u32).collect()
}

fn all(n: usize, medium: &'static str) -> Vec<(usize, &'static str, u32)> {
    (0..n).map(|i| (i, medium, 1000)).collect()
}

fn cases() -> Vec<Case> {
    let dflt = TierWeights::default;
    vec![
        Case {
            name: "first block required",
            prompt_blocks: 4,
            holds: vec![
                Holds {
                    pod: "a.ns",
                    blocks: vec![(1, "GPU", 1000), (2, "GPU", 1000), (3, "GPU", 1000)],
                },
                Holds {
                    pod: "b.ns",
                    blocks: all(1, "GPU"),
                },
            ],
            candidates: vec!["a.ns", "b.ns"],
            weights: dflt(),
            started_at: vec![],
            expect: vec![("b.ns", 25, 1)],
        },
        Case {
            name: "consecutive matching and early stop",
            prompt_blocks: 5,
            holds: vec![
                Holds {
                    pod: "a.ns",
                    blocks: vec![
                        (0, "GPU", 1000),
                        (1, "GPU", 1000),
                        (3, "GPU", 1000),
                        (4, "GPU", 1000),
                    ],
                },
                Holds {
                    pod: "b.ns",
                    blocks: all(3, "GPU"),
                },
                Holds {
                    pod: "c.ns",
                    blocks: all(5, "GPU"),
                },
            ],
            candidates: vec!["a.ns", "b.ns", "c.ns"],
            weights: dflt(),
            started_at: vec![],
            expect: vec![("c.ns", 100, 5), ("b.ns", 60, 3), ("a.ns", 40, 2)],
        },
        Case {
            name: "candidate filtering",
            prompt_blocks: 2,
            holds: vec![
                Holds {
                    pod: "a.ns",
                    blocks: all(2, "GPU"),
                },
                Holds {
                    pod: "outsider.ns",
                    blocks: all(2, "GPU"),
                },
            ],
            candidates: vec!["a.ns", "never-seen.ns"],
            weights: dflt(),
            started_at: vec![],
            expect: vec![("a.ns", 100, 2)],
        },
        Case {
            name: "default tier weights",
            prompt_blocks: 4,
            holds: vec![
                Holds {
                    pod: "gpu.ns",
                    blocks: all(4, "GPU"),
                },
                Holds {
                    pod: "cpu.ns",
                    blocks: all(4, "CPU"),
                },
                Holds {
                    pod: "lower-cpu.ns",
                    blocks: all(4, "cpu"),
                },
                Holds {
                    pod: "pinned.ns",
                    blocks: vec![(0, "CPU_PINNED", 1000), (1, "GPU", 1000)],
                },
            ],
            candidates: vec!["gpu.ns", "cpu.ns", "lower-cpu.ns", "pinned.ns"],
            weights: dflt(),
            started_at: vec![],
            expect: vec![
                ("gpu.ns", 100, 4),
                ("cpu.ns", 80, 4),
                ("lower-cpu.ns", 80, 4),
                ("pinned.ns", 45, 2),
            ],
        },
        Case {
            name: "zero weight and unknown media",
            prompt_blocks: 2,
            holds: vec![
                Holds {
                    pod: "disk.ns",
                    blocks: all(2, "DISK"),
                },
                Holds {
                    pod: "ext.ns",
                    blocks: all(2, "EXTERNAL"),
                },
                Holds {
                    pod: "gpu.ns",
                    blocks: all(2, "GPU"),
                },
            ],
            candidates: vec!["disk.ns", "ext.ns", "gpu.ns"],
            weights: TierWeights::new([("disk", 0.0)], 0.5).unwrap(),
            started_at: vec![],
            expect: vec![("gpu.ns", 100, 2), ("ext.ns", 50, 2), ("disk.ns", 0, 2)],
        },
        Case {
            name: "unconfigured media weigh 1.0 by default",
            prompt_blocks: 2,
            holds: vec![Holds {
                pod: "fs.ns",
                blocks: all(2, "FS"),
            }],
            candidates: vec!["fs.ns"],
            weights: dflt(),
            started_at: vec![],
            expect: vec![("fs.ns", 100, 2)],
        },
        Case {
            name: "timestamp-only values weigh 1.0",
            prompt_blocks: 3,
            holds: vec![Holds {
                pod: "old.ns",
                blocks: all(3, ""),
            }],
            candidates: vec!["old.ns"],
            weights: TierWeights::new([], 0.0).unwrap(),
            started_at: vec![],
            expect: vec![("old.ns", 100, 3)],
        },
        Case {
            name: "freshness drops owners written before the engine started",
            prompt_blocks: 3,
            holds: vec![
                Holds {
                    pod: "restarted.ns",
                    blocks: vec![(0, "GPU", 2000), (1, "GPU", 1500), (2, "GPU", 2000)],
                },
                Holds {
                    pod: "stale.ns",
                    blocks: vec![(0, "GPU", 1500), (1, "GPU", 2000)],
                },
                Holds {
                    pod: "norule.ns",
                    blocks: vec![(0, "GPU", 10)],
                },
            ],
            candidates: vec!["restarted.ns", "stale.ns", "norule.ns"],
            weights: dflt(),
            started_at: vec![Some(1500), Some(1500), None],
            expect: vec![("norule.ns", 33, 1), ("restarted.ns", 33, 1)],
        },
        Case {
            name: "integer truncation in kthena's float order",
            prompt_blocks: 100,
            holds: vec![
                Holds {
                    pod: "a.ns",
                    blocks: all(29, "GPU"),
                },
                Holds {
                    pod: "b.ns",
                    blocks: all(3, "CPU"),
                },
            ],
            candidates: vec!["a.ns", "b.ns"],
            weights: dflt(),
            started_at: vec![],
            // int(29/100*100) = 28; int(2.4000000000000004/100*100) = 2.
            expect: vec![("a.ns", 28, 29), ("b.ns", 2, 3)],
        },
        Case {
            name: "partial last block counts",
            prompt_blocks: 3,
            holds: vec![Holds {
                pod: "a.ns",
                blocks: all(2, "GPU"),
            }],
            candidates: vec!["a.ns"],
            weights: dflt(),
            started_at: vec![],
            expect: vec![("a.ns", 66, 2)],
        },
    ]
}

fn stored(hash: i64, tokens: &[u32], medium: &str) -> Event {
    Event::BlockStored(BlockStored::new(
        vec![BlockHash::from_i64(hash)],
        tokens.to_vec(),
        tokens.len() as u32,
        Medium::intern(medium),
    ))
}

fn fill_index(model: &str, tokens: &[u32], holds: &[Holds]) -> Index {
    let index = Index::new();
    for (p, h) in holds.iter().enumerate() {
        let source = index
            .register_source(&SourceSpec {
                pod: h.pod.to_owned(),
                model: model.to_owned(),
                engine: Engine::Vllm,
                dp_rank: 0,
            })
            .unwrap();
        for &(block, medium, ts) in &h.blocks {
            let chunk: Vec<u32> = tokens.chunks(16).nth(block).unwrap().to_vec();
            let batch = EngineBatch {
                ts: f64::from(ts),
                dp_rank: None,
                events: vec![stored((p * 1000 + block) as i64 + 1, &chunk, medium)],
                skipped: Vec::new(),
            };
            index.apply(source, &batch, ts, &mut Discard).unwrap();
        }
    }
    index
}

async fn redis() -> redis::aio::MultiplexedConnection {
    redis::Client::open("redis://127.0.0.1:6379/")
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

async fn fill_redis(
    conn: &mut redis::aio::MultiplexedConnection,
    model: &str,
    hashes: &[StdHash],
    holds: &[Holds],
) {
    let mut pipe = redis::pipe();
    for h in holds {
        for &(block, medium, ts) in &h.blocks {
            let value = if medium.is_empty() {
                ts.to_string()
            } else {
                format!("{ts}|{medium}")
            };
            pipe.hset(block_key(model, hashes[block]), h.pod, value)
                .ignore();
        }
    }
    let () = pipe.query_async(conn).await.unwrap();
}

fn unique_model(case: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "parity/{}-{}-{nanos}",
        case.replace(' ', "-"),
        std::process::id()
    )
}

fn as_rows(scores: &PrefixScores) -> Vec<(String, u32, u32)> {
    scores
        .scores
        .iter()
        .map(|s| (s.pod.clone(), s.score, s.matched_blocks))
        .collect()
}

#[tokio::test]
async fn kthena_parity_tables_hold_for_both_backends() {
    let mut conn = redis().await;
    for (i, case) in cases().into_iter().enumerate() {
        let model = unique_model(case.name);
        let tokens = prompt(i, case.prompt_blocks);
        let hashes = prompt_block_hashes(&tokens, 16, 128);
        assert_eq!(hashes.len(), case.prompt_blocks, "{}", case.name);
        let expect: Vec<(String, u32, u32)> = case
            .expect
            .iter()
            .map(|(p, s, m)| ((*p).to_owned(), *s, *m))
            .collect();

        let index = fill_index(&model, &tokens, &case.holds);
        let memory = score_index(
            &index,
            &model,
            &hashes,
            &case.candidates,
            &case.weights,
            &case.started_at,
        );
        assert_eq!(memory.total_blocks, case.prompt_blocks);
        assert_eq!(as_rows(&memory), expect, "in-memory backend: {}", case.name);

        fill_redis(&mut conn, &model, &hashes, &case.holds).await;
        let mut owners =
            RedisLookup::fetch(&mut conn, &model, &hashes, &case.candidates, &case.weights)
                .await
                .unwrap();
        let slots = score_prefix(&mut owners, case.candidates.len(), &case.started_at);
        let from_redis = PrefixScores::from_slots(hashes.len(), &case.candidates, &slots);
        assert_eq!(as_rows(&from_redis), expect, "redis backend: {}", case.name);
        assert_eq!(from_redis, memory, "weighted sums agree: {}", case.name);

        let keys: Vec<String> = hashes.iter().map(|h| block_key(&model, *h)).collect();
        let _: () = redis::cmd("DEL")
            .arg(&keys)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn unknown_model_scores_nobody_on_both_backends() {
    let tokens = prompt(99, 2);
    let hashes = prompt_block_hashes(&tokens, 16, 128);
    let index = fill_index(
        "known",
        &tokens,
        &[Holds {
            pod: "a.ns",
            blocks: all(2, "GPU"),
        }],
    );
    let weights = TierWeights::default();
    let model = unique_model("unknown model");
    let memory = score_index(&index, &model, &hashes, &["a.ns"], &weights, &[]);
    assert!(memory.scores.is_empty());
    let mut conn = redis().await;
    let mut owners = RedisLookup::fetch(&mut conn, &model, &hashes, &["a.ns"], &weights)
        .await
        .unwrap();
    assert!(score_prefix(&mut owners, 1, &[]).is_empty());
}

#[test]
fn several_dp_ranks_of_a_pod_count_once_with_their_best_medium() {
    let model = "dp-ranks";
    let tokens = prompt(7, 2);
    let hashes = prompt_block_hashes(&tokens, 16, 128);
    let index = Index::new();
    for (rank, medium) in [(0u8, "CPU"), (1u8, "GPU")] {
        let source = index
            .register_source(&SourceSpec {
                pod: "dp.ns".to_owned(),
                model: model.to_owned(),
                engine: Engine::Vllm,
                dp_rank: rank,
            })
            .unwrap();
        let batch = EngineBatch {
            ts: 0.0,
            dp_rank: Some(i64::from(rank)),
            events: vec![
                stored(1, &tokens[..16], medium),
                stored(2, &tokens[16..], "CPU"),
            ],
            skipped: Vec::new(),
        };
        index.apply(source, &batch, 100, &mut Discard).unwrap();
    }
    let scores = score_index(
        &index,
        model,
        &hashes,
        &["dp.ns"],
        &TierWeights::default(),
        &[],
    );
    assert_eq!(scores.scores.len(), 1);
    assert_eq!(scores.scores[0].matched_blocks, 2);
    assert_eq!(scores.scores[0].weighted_sum, 1.0 + 0.8);
    assert_eq!(scores.scores[0].score, 90);
}

//! The Redis mirror keeping Redis equal to the index over time: a FLUSHALL or an
//! empty restart while kvindex is idle healed without a new event, removes of another
//! writer's engine hashes adopted through its mapping keys, anti-entropy repairs in both
//! directions for owned pods only, and the refresh before kthena's GC. Every test runs its
//! own `redis-server` on a free port.

use crate::util;

use std::time::Duration;

use kvindex::index::{Delta, Index, SourceId, SourceSpec};
use kvindex::ingest::unix_now;
use kvindex::medium::{Medium, TierWeights};
use kvindex::store::redis::{block_key, field_value, mapping_key, ValueFormat};
use kvindex::store::redis::{
    dump, MappingEntry, MirrorHandle, RedisConfig, RedisDump, RedisTarget,
};
use kvindex::wire::{BlockHash, BlockRemoved, BlockStored, Engine, EngineBatch, Event};
use util::own_redis::OwnRedis;

/// Upper bound for anything that waits on Redis in these tests.
const WAIT: Duration = Duration::from_secs(30);
/// The bound for healing a Redis that lost its keys while kvindex is idle.
const HEAL: Duration = Duration::from_secs(10);

const POD: &str = "upkeep.ns";
const MODEL: &str = "upkeep-model";

fn tokens(i: u32) -> Vec<u32> {
    vec![i, i * 3 + 1, i * 5 + 2, 7]
}

fn stored(hash: u64, tokens: Vec<u32>, medium: Medium) -> Event {
    Event::BlockStored(BlockStored::new(
        vec![BlockHash::Int(hash)],
        tokens,
        4,
        medium,
    ))
}

fn removed(hash: u64) -> Event {
    Event::BlockRemoved(BlockRemoved::new(vec![BlockHash::Int(hash)], Medium::NONE))
}

struct Rig {
    index: Index,
    source: SourceId,
    mirror: MirrorHandle,
    url: String,
}

impl Rig {
    async fn new(url: &str, tune: impl FnOnce(&mut RedisConfig)) -> Rig {
        let index = Index::new();
        let source = index
            .register_source(&SourceSpec {
                pod: POD.to_owned(),
                model: MODEL.to_owned(),
                engine: Engine::Vllm,
                dp_rank: 0,
            })
            .unwrap();
        let mut config = RedisConfig {
            target: RedisTarget::Single(url.to_owned()),
            ..RedisConfig::default()
        };
        tune(&mut config);
        let mirror = MirrorHandle::start(config, index.clone(), TierWeights::default())
            .await
            .unwrap();
        Rig {
            index,
            source,
            mirror,
            url: url.to_owned(),
        }
    }

    /// A rig whose periodic anti-entropy pass runs every `interval`.
    async fn with_pass_every(url: &str, interval: Duration) -> Rig {
        Rig::new(url, |c| c.anti_entropy_interval = interval).await
    }

    async fn apply(&self, events: Vec<Event>) {
        self.apply_at(events, unix_now()).await;
    }

    /// [`Self::apply`] as if stored at unix second `at`.
    async fn apply_at(&self, events: Vec<Event>, at: u32) {
        let mut deltas: Vec<Delta> = Vec::new();
        self.index
            .apply(self.source, &EngineBatch::of(events), at, &mut deltas)
            .unwrap();
        self.mirror.sender().send(deltas, None).await;
    }

    async fn flush(&self) {
        tokio::time::timeout(WAIT, self.mirror.flush())
            .await
            .unwrap()
            .unwrap();
    }

    /// Stores blocks `0..n` (engine hash = i) and waits until they are in Redis.
    async fn store(&self, n: u32) {
        for i in 0..n {
            self.apply(vec![stored(u64::from(i), tokens(i), Medium::GPU)])
                .await;
        }
        self.flush().await;
    }

    /// What Redis should hold for the pod: the index's fields and mapping keys.
    fn expected(&self) -> RedisDump {
        let weights = TierWeights::default();
        let mut want = RedisDump::default();
        self.index.for_each_field(|model, std, _, value| {
            want.blocks
                .entry(block_key(&self.index.model_name(model), std))
                .or_default()
                .insert(
                    POD.to_owned(),
                    field_value(value, ValueFormat::Tiered, &weights),
                );
        });
        self.index.for_each_mapping(|_, engine, hash, std| {
            want.mappings.insert(
                mapping_key(engine, POD, &hash),
                MappingEntry {
                    value: std.to_string(),
                    ttl: 86_400,
                },
            );
        });
        want
    }

    /// Redis's keys of the pod, mapping TTLs normalised once they are about 24 h.
    async fn actual(&self) -> RedisDump {
        let mut d = dump(&self.url, None, Some(POD)).await.unwrap();
        for m in d.mappings.values_mut() {
            if (86_000..=86_400).contains(&m.ttl) {
                m.ttl = 86_400;
            }
        }
        d
    }

    /// Waits until Redis equals the index, within `limit`; panics with the last diff.
    async fn wait_equal(&self, limit: Duration) {
        let started = std::time::Instant::now();
        loop {
            let (got, want) = (self.actual().await, self.expected());
            if got == want {
                return;
            }
            assert!(
                started.elapsed() < limit,
                "Redis did not come back in {limit:?}: {} of {} block keys, {} of {} mapping keys",
                got.blocks.len(),
                want.blocks.len(),
                got.mappings.len(),
                want.mappings.len()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn key(&self, i: u32) -> String {
        block_key(MODEL, kvindex::hash::std_hash(&tokens(i)))
    }
}

fn conn(url: &str) -> redis::Connection {
    redis::Client::open(url).unwrap().get_connection().unwrap()
}

/// Waits (with a deadline) until `cond` holds for the mirror's figures.
async fn wait_stats(
    mirror: &MirrorHandle,
    what: &str,
    cond: impl Fn(&kvindex::store::redis::MirrorStats) -> bool,
) {
    let started = std::time::Instant::now();
    while !cond(&mirror.stats()) {
        assert!(started.elapsed() < WAIT, "{what}: {:?}", mirror.stats());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_flushall_while_idle_is_healed_within_seconds_without_a_new_event() {
    let server = OwnRedis::start(None, &[]);
    // No periodic pass during the test: the watchdog alone must notice.
    let rig = Rig::with_pass_every(&server.url(), Duration::from_secs(3600)).await;
    rig.store(300).await;
    rig.wait_equal(WAIT).await;
    // The start-up pass is over: only the watchdog can bring the keys back.
    wait_stats(&rig.mirror, "start-up pass", |s| s.anti_entropy_passes >= 1).await;
    let () = redis::cmd("FLUSHALL").query(&mut conn(&rig.url)).unwrap();
    assert!(rig.actual().await.blocks.is_empty());
    rig.wait_equal(HEAL).await;
    assert!(
        rig.mirror.stats().redis_resets >= 1,
        "{:?}",
        rig.mirror.stats()
    );
    assert_eq!(rig.actual().await.blocks.len(), 300);
    rig.mirror.shutdown(WAIT).await;
}

#[tokio::test]
async fn a_redis_restarted_empty_while_idle_is_healed_within_seconds_without_a_new_event() {
    let mut server = OwnRedis::start(None, &[]);
    let rig = Rig::with_pass_every(&server.url(), Duration::from_secs(3600)).await;
    rig.store(300).await;
    rig.wait_equal(WAIT).await;
    let port = server.port;
    server.kill();
    let _restarted = OwnRedis::start(Some(port), &[]);
    rig.wait_equal(HEAL).await;
    assert!(rig.mirror.is_healthy());
    rig.mirror.shutdown(WAIT).await;
}

#[tokio::test]
async fn removes_of_another_writers_engine_hashes_delete_its_fields_and_mapping_keys() {
    let server = OwnRedis::start(None, &[]);
    let rig = Rig::with_pass_every(&server.url(), Duration::from_secs(3600)).await;
    rig.store(5).await;
    // After the start-up pass, so only adoption can remove what follows.
    wait_stats(&rig.mirror, "start-up pass", |s| s.anti_entropy_passes >= 1).await;
    let mut c = conn(&rig.url);
    let foreign: Vec<u32> = (100..120).collect();
    for &i in &foreign {
        let std = kvindex::hash::std_hash(&tokens(i));
        let () = redis::cmd("HSET")
            .arg(rig.key(i))
            .arg(POD)
            .arg("1700000000|GPU")
            .arg("other.ns")
            .arg("1700000000|GPU")
            .query(&mut c)
            .unwrap();
        let () = redis::cmd("SET")
            .arg(format!("vllm:kv:block:{POD}@{}", 9000 + i))
            .arg(std.to_string())
            .arg("EX")
            .arg(86_400)
            .query(&mut c)
            .unwrap();
    }
    // Another writer's engine hash for a block the index holds (through hash 0).
    let held = kvindex::hash::std_hash(&tokens(0));
    let () = redis::cmd("SET")
        .arg(format!("vllm:kv:block:{POD}@8888"))
        .arg(held.to_string())
        .query(&mut c)
        .unwrap();

    let mut events: Vec<Event> = foreign
        .iter()
        .map(|i| removed(u64::from(9000 + i)))
        .collect();
    events.push(removed(8888));
    rig.apply(events).await;
    rig.flush().await;

    let got = rig.actual().await;
    assert_eq!(got, rig.expected(), "the other writer's state is gone");
    assert_eq!(rig.mirror.stats().adopted_removes, 21);
    for &i in &foreign {
        let other: Option<String> = redis::cmd("HGET")
            .arg(rig.key(i))
            .arg("other.ns")
            .query(&mut c)
            .unwrap();
        assert!(other.is_some(), "another pod's field must stay");
    }
    rig.mirror.shutdown(WAIT).await;
}

#[tokio::test]
async fn anti_entropy_repairs_both_directions_for_owned_pods_only() {
    let server = OwnRedis::start(None, &[]);
    let rig = Rig::with_pass_every(&server.url(), Duration::from_secs(1)).await;
    rig.store(50).await;
    rig.wait_equal(WAIT).await;
    let mut c = conn(&rig.url);
    let stale_key = block_key(MODEL, 4242);
    let () = redis::cmd("HSET")
        .arg(&stale_key)
        .arg(POD)
        .arg("1700000000|GPU")
        .arg("other.ns")
        .arg("1700000000|GPU")
        .query(&mut c)
        .unwrap();
    let () = redis::cmd("HSET")
        .arg(rig.key(1))
        .arg(POD)
        .arg("1|CPU")
        .query(&mut c)
        .unwrap();
    let () = redis::cmd("HDEL")
        .arg(rig.key(2))
        .arg(POD)
        .query(&mut c)
        .unwrap();
    let () = redis::cmd("DEL")
        .arg(format!("vllm:kv:block:{POD}@3"))
        .query(&mut c)
        .unwrap();
    let () = redis::cmd("SET")
        .arg(format!("vllm:kv:block:{POD}@777777"))
        .arg("1")
        .query(&mut c)
        .unwrap();
    let () = redis::cmd("SET")
        .arg("vllm:kv:block:other.ns@777777")
        .arg("1")
        .query(&mut c)
        .unwrap();

    rig.wait_equal(WAIT).await;
    let other: Option<String> = redis::cmd("HGET")
        .arg(&stale_key)
        .arg("other.ns")
        .query(&mut c)
        .unwrap();
    assert_eq!(other.as_deref(), Some("1700000000|GPU"));
    let other_mapping: Option<String> = redis::cmd("GET")
        .arg("vllm:kv:block:other.ns@777777")
        .query(&mut c)
        .unwrap();
    assert_eq!(other_mapping.as_deref(), Some("1"));
    let st = rig.mirror.stats();
    assert!(st.repairs_deleted >= 2, "{st:?}");
    // The missing mapping key may be renewed without a compare (its block was stored
    // during the pass that repairs it), so at least the two fields count as written.
    assert!(st.repairs_written >= 2, "{st:?}");
    rig.mirror.shutdown(WAIT).await;
}

/// Ingest takes a block out of the index before it hands the delete to the mirror. A pass
/// that scans in between must not count that key as drift: it waits out a grace period and
/// checks again, by when the delete has landed. A delete that never comes is drift, and is
/// repaired once the grace period is over.
#[tokio::test]
async fn a_delete_still_on_its_way_from_ingest_is_not_repaired_as_drift() {
    let server = OwnRedis::start(None, &[]);
    let rig = Rig::with_pass_every(&server.url(), Duration::from_secs(1)).await;
    rig.store(4).await;
    rig.wait_equal(WAIT).await;
    let remove = |hash: u64| {
        let mut held: Vec<Delta> = Vec::new();
        let batch = EngineBatch::of(vec![removed(hash)]);
        (rig.index)
            .apply(rig.source, &batch, unix_now(), &mut held)
            .unwrap();
        held
    };

    // Block 1's delete is held back, as by an ingest task mid-apply, until a pass saw it.
    let held = remove(1);
    wait_stats(&rig.mirror, "a suspect", |s| s.repair_suspects >= 1).await;
    rig.mirror.sender().send(held, None).await;
    rig.flush().await;
    wait_stats(&rig.mirror, "suspects settled", |s| s.repair_suspects == 0).await;
    let passes = rig.mirror.stats().anti_entropy_passes;
    wait_stats(&rig.mirror, "a full pass after", |s| {
        s.anti_entropy_passes > passes
    })
    .await;
    assert_eq!(
        rig.mirror.stats().repairs_deleted,
        0,
        "{:?}",
        rig.mirror.stats()
    );
    rig.wait_equal(WAIT).await;

    // Block 2's delete never reaches the mirror: real drift, repaired after the grace.
    let lost = remove(2);
    drop(lost);
    wait_stats(&rig.mirror, "the drift repaired", |s| {
        s.repairs_deleted >= 1
    })
    .await;
    rig.wait_equal(WAIT).await;
    rig.mirror.shutdown(WAIT).await;
}

#[tokio::test]
async fn refresh_rewrites_every_field_before_it_is_refresh_after_old() {
    let server = OwnRedis::start(None, &[]);
    let rig = Rig::new(&server.url(), |c| {
        c.anti_entropy_interval = Duration::from_secs(1);
        c.refresh_after_s = 3;
    })
    .await;
    rig.store(40).await;
    // One block on two tiers: the refresh keeps its best medium.
    rig.apply(vec![stored(0, Vec::new(), Medium::intern("CPU"))])
        .await;
    rig.flush().await;
    let quiet = unix_now();
    let before = rig.actual().await;
    assert_eq!(before.blocks.len(), 40);
    let mut c = conn(&rig.url);
    for key in before.mappings.keys() {
        let () = redis::cmd("EXPIRE")
            .arg(key)
            .arg(1000)
            .query(&mut c)
            .unwrap();
    }

    let started = std::time::Instant::now();
    let after = loop {
        let now = rig.actual().await;
        let fresh = now.blocks.values().flat_map(|f| f.values()).all(|v| {
            let ts: u32 = v.split('|').next().unwrap().parse().unwrap();
            ts > quiet
        });
        let renewed = now.mappings.values().all(|m| m.ttl == 86_400);
        if fresh && renewed && now.blocks.len() == 40 {
            break now;
        }
        assert!(started.elapsed() < WAIT, "not refreshed: {now:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Same contents otherwise: the keys, the media and the mapping values.
    let strip = |d: &RedisDump| -> Vec<(String, String, String)> {
        d.blocks
            .iter()
            .flat_map(|(k, f)| {
                f.iter().map(move |(p, v)| {
                    let medium = v.split_once('|').map_or("", |(_, m)| m);
                    (k.clone(), p.clone(), medium.to_owned())
                })
            })
            .collect()
    };
    assert_eq!(strip(&after), strip(&before));
    let values = |d: &RedisDump| -> Vec<(String, String)> {
        d.mappings
            .iter()
            .map(|(k, m)| (k.clone(), m.value.clone()))
            .collect()
    };
    assert_eq!(values(&after), values(&before));
    assert!(after.blocks[&rig.key(0)][POD].ends_with("|GPU"));
    // The index moved its store times with Redis: a later rewrite writes the same value.
    assert!(rig.index.dump().iter().all(|e| e.stored_at > quiet));
    assert!(rig.mirror.stats().refreshed >= 40);
    rig.mirror.shutdown(WAIT).await;
}

#[tokio::test]
async fn a_pass_gives_every_resident_it_refreshes_the_same_time() {
    let server = OwnRedis::start(None, &[]);
    // A slow pass: 60 refreshes (a field and a mapping key each) at 30 commands a second
    // take a few seconds, so its chunks run in different seconds.
    let rig = Rig::new(&server.url(), |c| {
        c.anti_entropy_interval = Duration::from_secs(1);
        c.anti_entropy_max_commands_per_s = 30;
        c.refresh_after_s = 3_600;
    })
    .await;
    // The start-up pass runs unthrottled: the blocks come after it.
    wait_stats(&rig.mirror, "start-up pass", |s| s.anti_entropy_passes >= 1).await;
    let old = unix_now() - 7_200;
    for i in 0..60 {
        rig.apply_at(vec![stored(u64::from(i), tokens(i), Medium::GPU)], old)
            .await;
    }
    rig.flush().await;
    wait_stats(&rig.mirror, "refreshed", |s| s.refreshed >= 60).await;
    // One store time for all of them, the pass's: a chain's blocks refreshed together keep
    // one time, in the index and in the checkpoint a rewrite writes, so a warm start does
    // not split the pod's chain spans between them.
    let mut times: Vec<u32> = rig.index.dump().iter().map(|e| e.stored_at).collect();
    times.sort_unstable();
    times.dedup();
    assert_eq!(times.len(), 1, "{times:?}");
    assert!(times[0] > old);
    rig.mirror.shutdown(WAIT).await;
}

/// `n` blocks stored in one event, engine hashes `first..first + n`.
fn stored_many(first: u64, n: u32) -> Event {
    let hashes = (0..u64::from(n))
        .map(|i| BlockHash::Int(first + i))
        .collect();
    let tokens = (0..n * 4)
        .map(|t| (first as u32).wrapping_mul(4).wrapping_add(t))
        .collect();
    Event::BlockStored(BlockStored::new(hashes, tokens, 4, Medium::GPU))
}

fn removed_many(first: u64, n: u32) -> Event {
    let hashes = (0..u64::from(n))
        .map(|i| BlockHash::Int(first + i))
        .collect();
    Event::BlockRemoved(BlockRemoved::new(hashes, Medium::NONE))
}

fn signal(server: &OwnRedis, sig: &str) {
    let pid = server.pid().to_string();
    let ok = std::process::Command::new("kill")
        .args([sig, &pid])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid}");
}

#[tokio::test]
async fn an_outage_record_past_its_cap_falls_back_to_a_full_pass() {
    let server = OwnRedis::start(None, &[]);
    let rig = Rig::with_pass_every(&server.url(), Duration::from_secs(3600)).await;
    rig.store(50).await;
    rig.wait_equal(WAIT).await;
    // Redis paused with its data: writes time out and the mirror goes dirty.
    signal(&server, "-STOP");
    rig.apply(vec![stored_many(1_000_000, 1000)]).await;
    let started = std::time::Instant::now();
    while !rig.mirror.stats().dirty {
        assert!(
            started.elapsed() < WAIT,
            "the mirror never noticed the outage"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Recorded, not written: the record would let the reconcile delete these fields…
    rig.apply(vec![removed_many(0, 50)]).await;
    // …but 60,000 blocks stored and removed again make 120,000 recorded keys, past the cap
    // of 100,000, so the record is dropped with the rest.
    rig.apply(vec![removed_many(1_000_000, 1000)]).await;
    for chunk in 1..60u64 {
        let first = 1_000_000 + chunk * 1000;
        rig.apply(vec![stored_many(first, 1000)]).await;
        rig.apply(vec![removed_many(first, 1000)]).await;
    }
    signal(&server, "-CONT");
    rig.flush().await;
    // Only the full pass after the reconcile can find the 50 stale fields now.
    rig.wait_equal(WAIT).await;
    let st = rig.mirror.stats();
    assert!(st.repairs_deleted >= 50, "{st:?}");
    assert!(rig.actual().await.blocks.is_empty());
    rig.mirror.shutdown(WAIT).await;
}

//! The SCAN phase of an anti-entropy pass: the keys Redis holds under kthena's prefixes,
//! master by master, compared with the index; fields and mapping keys of owned pods that the
//! index does not hold become suspects, deleted once they outlive [`SUSPECT_GRACE`] and are
//! still absent from the index when read again.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::index::{Index, ModelId, OwnedPods, PodId};
use crate::redis_conn::Master;
use crate::redis_layout::{mapping_prefix, split_block_key};
use crate::store::redis::labels::RepairDirection;
use crate::store::redis::link::Link;
use crate::wire::{BlockHash, Engine};

/// How long a key the SCAN found to delete waits before it is checked again and deleted:
/// ingest removes a block from the index before it hands the delta over, so for that long a
/// key can be gone from the index while its delete is still on its way, not drift.
pub(super) const SUSPECT_GRACE: Duration = Duration::from_secs(1);
/// Keys asked of one SCAN call at most.
const SCAN_COUNT_MAX: usize = 1000;
/// Keys asked of one SCAN call at least (a SCAN is one command however many it returns).
const SCAN_COUNT_MIN: usize = 10;

/// Where the SCAN phase stands: every master is scanned in turn (one master for a single
/// Redis; every master of a cluster, each holding its own share of the keys).
#[derive(Debug, Clone, Default)]
pub(super) struct ScanCursor {
    /// The masters, read when the phase starts (empty until then).
    masters: Vec<Master>,
    /// The master being scanned.
    at: usize,
    /// Its SCAN cursor.
    cursor: u64,
}

/// What the SCAN phase of one pass found: suspects waiting, and repairs made.
#[derive(Default)]
pub(super) struct Findings {
    /// Keys the SCAN found that the index does not hold, waiting out [`SUSPECT_GRACE`]
    /// before they are checked again and deleted (oldest first).
    pub(super) suspects: Vec<Suspect>,
    /// Fields and keys deleted.
    pub(super) deleted: u64,
    /// Fields written.
    pub(super) written: u64,
}

/// A key the SCAN would delete: a field of an owned pod the index does not hold, or a
/// stale mapping key.
pub(super) struct Suspect {
    found: Instant,
    key: String,
    /// The field, for a block key; `None` for a mapping key.
    field: Option<(PodId, Arc<str>)>,
}

impl Suspect {
    /// A suspect found now.
    fn new(key: String, field: Option<(PodId, Arc<str>)>) -> Suspect {
        Suspect {
            found: Instant::now(),
            key,
            field,
        }
    }

    /// Asks Redis whether it still holds the field or key.
    fn ask(&self, pipe: &mut redis::Pipeline) {
        match &self.field {
            Some((_, name)) => pipe.hexists(&self.key, &**name),
            None => pipe.exists(&self.key),
        };
    }

    /// Deletes the field or key.
    fn delete(&self, pipe: &mut redis::Pipeline) {
        match &self.field {
            Some((_, name)) => pipe.hdel(&self.key, &**name).ignore(),
            None => pipe.del(&self.key).ignore(),
        };
    }
}

/// One SCAN call on one master and the repairs of what it returned.
pub(super) async fn scan_step(
    link: &mut Link,
    scan: &mut ScanCursor,
    found: &mut Findings,
    budget: usize,
) -> Result<(usize, bool), redis::RedisError> {
    let mut spent = confirm_suspects(link, found).await?;
    if scan.masters.is_empty() {
        scan.masters = link.conn.masters().await?;
        spent += 1;
    }
    let Some(master) = scan.masters.get(scan.at).cloned() else {
        // The scan is over; the pass ends once its last suspects are settled.
        return Ok((spent.max(1), found.suspects.is_empty()));
    };
    let count = budget.clamp(SCAN_COUNT_MIN, SCAN_COUNT_MAX);
    let mut cmd = redis::cmd("SCAN");
    cmd.arg(scan.cursor)
        .arg("MATCH")
        .arg("*:kv:block:*")
        .arg("COUNT")
        .arg(count);
    let (next, keys): (u64, Vec<String>) = link.conn.query_on(&master, &cmd).await?;
    let owned = link.index.owned_pods();
    let names = owned_names(link, &owned);
    let mut writes = redis::pipe();
    let mut writes_n = 0;
    let mut blocks: Vec<(&str, Option<ModelId>, u64)> = Vec::new();
    for key in &keys {
        if let Some((model, std)) = split_block_key(key) {
            if let Some((model, std)) = parse_block(&link.index, model, std) {
                blocks.push((key, model, std));
            }
        } else if stale_mapping_key(&link.index, &owned, key) {
            found.suspects.push(Suspect::new(key.clone(), None));
        }
    }
    if !blocks.is_empty() && !names.is_empty() {
        let mut reads = redis::pipe();
        for (key, _, _) in &blocks {
            let mut cmd = redis::cmd("HMGET");
            cmd.arg(*key);
            for (_, name) in &names {
                cmd.arg(&**name);
            }
            reads.add_command(cmd);
        }
        let values: Vec<Vec<Option<String>>> = link.read(&reads).await?;
        spent += values.len();
        for (block, fields) in blocks.iter().zip(values) {
            writes_n += repair_block(link, found, block, &names, fields, &mut writes);
        }
    }
    if writes_n > 0 {
        link.send(&writes).await?;
    }
    if next == 0 {
        scan.at += 1;
    }
    scan.cursor = next;
    let done = scan.at >= scan.masters.len() && found.suspects.is_empty();
    count_suspects(link, found);
    Ok((spent + writes_n, done))
}

/// Deletes the suspects past [`SUSPECT_GRACE`] that Redis still holds and the index still
/// does not (read again now); returns the commands spent.
async fn confirm_suspects(
    link: &mut Link,
    found: &mut Findings,
) -> Result<usize, redis::RedisError> {
    let ripe = (found.suspects.iter())
        .take_while(|s| s.found.elapsed() >= SUSPECT_GRACE)
        .count();
    if ripe == 0 {
        return Ok(0);
    }
    let mut reads = redis::pipe();
    for suspect in &found.suspects[..ripe] {
        suspect.ask(&mut reads);
    }
    let present: Vec<bool> = link.read(&reads).await?;
    let suspects: Vec<Suspect> = found.suspects.drain(..ripe).collect();
    let owned = link.index.owned_pods();
    let mut writes = redis::pipe();
    let mut writes_n = 0;
    for (suspect, present) in suspects.iter().zip(present) {
        let gone = present
            && match &suspect.field {
                Some((pod, _)) => field_gone(&link.index, &owned, &suspect.key, *pod),
                None => stale_mapping_key(&link.index, &owned, &suspect.key),
            };
        if !gone {
            continue;
        }
        suspect.delete(&mut writes);
        writes_n += 1;
        found.deleted += 1;
        link.shared.upkeep.repaired(RepairDirection::Deleted);
    }
    count_suspects(link, found);
    if writes_n > 0 {
        link.send(&writes).await?;
    }
    Ok(ripe + writes_n)
}

/// Publishes how many suspects wait.
fn count_suspects(link: &Link, found: &Findings) {
    let n = found.suspects.len() as u64;
    link.shared.upkeep.suspects.store(n, Ordering::Relaxed);
}

/// The model id (when the model is live in the index) and std hash of a block key's
/// parts; `None` when the hash is not a number.
fn parse_block(index: &Index, model: &str, std: &str) -> Option<(Option<ModelId>, u64)> {
    let std = std.parse::<u64>().ok()?;
    Some((index.model_id(model), std))
}

/// Whether owned `pod` holds no field of block key `key` in the index now.
fn field_gone(index: &Index, owned: &OwnedPods, key: &str, pod: PodId) -> bool {
    let parsed = split_block_key(key).and_then(|(model, std)| parse_block(index, model, std));
    let Some((model, std)) = parsed else {
        return false;
    };
    owned.contains(pod) && model.and_then(|m| index.field_value(m, std, pod)).is_none()
}

/// Whether `key` is a mapping key of an owned pod whose engine hash no source of the pod
/// holds.
fn stale_mapping_key(index: &Index, owned: &OwnedPods, key: &str) -> bool {
    let Some((pod, hash)) = split_mapping_key(key) else {
        return false;
    };
    let Some(pod) = index.pod_id(pod) else {
        return false;
    };
    owned.contains(pod) && hash_candidates(hash).all(|h| owned.engine_hash_std(pod, &h).is_none())
}

/// Repairs the owned pods' fields of one block key as read back (`fields` in the order
/// of `names`); returns the commands added to `writes`.
fn repair_block(
    link: &Link,
    found: &mut Findings,
    (key, model, std): &(&str, Option<ModelId>, u64),
    names: &[(PodId, Arc<str>)],
    fields: Vec<Option<String>>,
    writes: &mut redis::Pipeline,
) -> usize {
    let mut n = 0;
    for ((pod, name), got) in names.iter().zip(fields) {
        let Some(got) = got else { continue };
        match model.and_then(|m| link.index.field_value(m, *std, *pod)) {
            None => {
                let field = Some((*pod, name.clone()));
                found.suspects.push(Suspect::new((*key).to_owned(), field));
                continue;
            }
            Some(v) => {
                let want = link.enc.field_text(v);
                if want == got {
                    continue;
                }
                writes.hset(*key, &**name, want).ignore();
                found.written += 1;
                link.shared.upkeep.repaired(RepairDirection::Written);
            }
        }
        n += 1;
    }
    n
}

/// The owned pods with their identifiers, in a fixed order for `HMGET`.
fn owned_names(link: &mut Link, owned: &OwnedPods) -> Vec<(PodId, Arc<str>)> {
    owned.ids().map(|pod| (pod, link.pod_name(pod))).collect()
}

/// A mapping key's pod and engine-hash text, or `None` for any other key.
fn split_mapping_key(key: &str) -> Option<(&str, &str)> {
    [Engine::Vllm, Engine::Sglang]
        .iter()
        .find_map(|e| key.strip_prefix(mapping_prefix(*e)))?
        .rsplit_once('@')
}

/// Every engine hash whose text form is `text`: decimal text may be an integer or hex bytes.
fn hash_candidates(text: &str) -> impl Iterator<Item = BlockHash> {
    let int = text.parse::<u64>().ok().map(BlockHash::Int);
    let neg = text
        .parse::<i64>()
        .ok()
        .filter(|v| *v < 0)
        .map(BlockHash::Neg);
    let bytes = (!text.is_empty())
        .then(|| BlockHash::from_hex(text))
        .flatten();
    int.into_iter().chain(neg).chain(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping_keys_split_into_pod_and_every_reading_of_the_hash() {
        assert_eq!(
            split_mapping_key("vllm:kv:block:p.ns@-12"),
            Some(("p.ns", "-12"))
        );
        assert_eq!(split_mapping_key("matrix:kv:block:m@1"), None);
        let c: Vec<BlockHash> = hash_candidates("12").collect();
        assert_eq!(
            c,
            vec![BlockHash::Int(12), BlockHash::Bytes(vec![0x12].into())]
        );
        let c: Vec<BlockHash> = hash_candidates("-5").collect();
        assert_eq!(c, vec![BlockHash::Neg(-5)]);
        let c: Vec<BlockHash> = hash_candidates("ab01").collect();
        assert_eq!(c, vec![BlockHash::Bytes(vec![0xab, 0x01].into())]);
    }
}

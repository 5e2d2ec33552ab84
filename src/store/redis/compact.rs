//! The checkpoint log's compaction, a background step of the writer: each due state key
//! (`log.rs`) gets a snapshot segment of what the index holds for it now, and only then
//! are its older fields deleted. The snapshot's stamp is newer than every field deleted, so
//! whichever prefix of the step lands, a restore reads the same blocks: before the
//! snapshot lands nothing changed, after it every older field is void whether deleted yet
//! or not. A field that lands after the listing (from a pipeline in flight) is older and
//! void too; the key's next compaction deletes it.

use std::sync::atomic::Ordering;

use super::checkpoint::segment::{SegmentBody, Stamp, SNAPSHOT};
use super::link::Link;
use super::log::StateAt;

/// State keys compacted per step: each costs a read of its field names and a snapshot.
const KEYS_PER_STEP: usize = 16;
/// Field names per `HDEL`: a key written by per-block checkpoints holds one per block.
const DELETE_CHUNK: usize = 10_000;

/// Compacts up to [`KEYS_PER_STEP`] due state keys, counting what it sends as background
/// commands. On a failure the keys are due again.
pub(super) async fn step(link: &mut Link) -> Result<(), redis::RedisError> {
    let due = link.enc.log.take_due(KEYS_PER_STEP);
    if due.is_empty() {
        return Ok(());
    }
    match compact(link, &due).await {
        Ok(sent) => {
            let counted = &link.shared.upkeep.background_commands;
            counted.fetch_add(sent as u64, Ordering::Relaxed);
            Ok(())
        }
        Err(err) => {
            link.enc.log.due_again(due);
            Err(err)
        }
    }
}

async fn compact(link: &mut Link, due: &[StateAt]) -> Result<usize, redis::RedisError> {
    let keys: Vec<String> = due.iter().map(|at| link.state_key(*at)).collect();
    let mut reads = redis::pipe();
    for key in &keys {
        reads.cmd("HKEYS").arg(key);
    }
    let listed: Vec<Vec<Vec<u8>>> = link.read(&reads).await?;
    let mut pipe = redis::pipe();
    let mut commands = 0;
    for ((at, key), names) in due.iter().zip(&keys).zip(listed) {
        commands += push_snapshot(link, &mut pipe, *at, key, &names);
    }
    link.send(&pipe).await?;
    Ok(commands + keys.len())
}

/// Appends the snapshot of state key `at` and the deletion of its `names` stamped before it;
/// returns the number of commands.
fn push_snapshot(
    link: &mut Link,
    pipe: &mut redis::Pipeline,
    at: StateAt,
    key: &str,
    names: &[Vec<u8>],
) -> usize {
    let blocks = link.index.engine_states_of((at.0, at.1), at.2);
    let mut body = SegmentBody::new(SNAPSHOT);
    for (hash, state) in &blocks {
        body.push(hash, Some(state));
    }
    let stamp = link.enc.log.next_stamp();
    let field = stamp.field();
    pipe.hset(key, &field, body.bytes()).ignore();
    let mut commands = 1;
    let older: Vec<&[u8]> = (names.iter())
        .map(Vec::as_slice)
        .filter(|name| Stamp::of_field(name).is_none_or(|s| s < stamp))
        .collect();
    for chunk in older.chunks(DELETE_CHUNK) {
        pipe.cmd("HDEL").arg(key).arg(chunk).ignore();
        commands += 1;
    }
    if blocks.is_empty() {
        // Nothing held: the empty snapshot goes too, and with it the key.
        pipe.cmd("HDEL").arg(key).arg(&field).ignore();
        commands += 1;
    }
    link.enc.log.compacted(at, blocks.len());
    commands
}

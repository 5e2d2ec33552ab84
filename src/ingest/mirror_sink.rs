//! What ingest hands a mirror: one message's deltas in bounded chunks.
//!
//! A message's effects go to the mirror as [`DeltaChunk`]s of at most [`CHUNK_DELTAS`]
//! deltas, and a clear's blocks go whole ([`crate::index::ClearedBlocks`]), expanded by the
//! mirror slice by slice: no message, whatever the size of the cache it clears, makes one
//! allocation of hundreds of thousands of deltas (a clear yields a few deltas per engine block,
//! which in one `Vec` would be a second copy of a large cache's worth). Chunks are queued in order, each waiting
//! for room in the mirror's bounded queue (backpressure, nothing dropped); the checkpoint
//! rides with the last one, so the watermark is written after every chunk's data.

use crate::index::{Checkpoint, ClearedBlocks, Delta, DeltaChunk, DeltaMirror, DeltaSink};

/// Deltas one chunk holds at most (about 300 KB).
pub const CHUNK_DELTAS: usize = 4096;

/// Collects one message's deltas as chunks for a mirror.
#[derive(Debug, Default)]
pub struct MirrorSink {
    chunks: Vec<DeltaChunk>,
}

impl MirrorSink {
    /// An empty sink.
    pub fn new() -> MirrorSink {
        MirrorSink::default()
    }

    /// Whether nothing was collected.
    pub fn is_empty(&self) -> bool {
        self.chunks.iter().all(DeltaChunk::is_empty)
    }

    /// The chunks collected so far, in order.
    pub fn chunks(&self) -> &[DeltaChunk] {
        &self.chunks
    }

    /// Queues every chunk in order, `checkpoint` with the last one (or alone when nothing
    /// was collected); waits while the mirror's queue is full.
    pub async fn hand_over(self, mirror: &dyn DeltaMirror, checkpoint: Option<Checkpoint>) {
        let mut chunks: Vec<DeltaChunk> =
            self.chunks.into_iter().filter(|c| !c.is_empty()).collect();
        if chunks.is_empty() {
            if checkpoint.is_none() {
                return;
            }
            chunks.push(DeltaChunk::Deltas(Vec::new()));
        }
        let last = chunks.len() - 1;
        for (i, chunk) in chunks.into_iter().enumerate() {
            mirror.queue(chunk, checkpoint.filter(|_| i == last)).await;
        }
    }
}

impl DeltaSink for MirrorSink {
    fn push(&mut self, delta: Delta) {
        match self.chunks.last_mut() {
            Some(DeltaChunk::Deltas(deltas)) if deltas.len() < CHUNK_DELTAS => deltas.push(delta),
            _ => self.chunks.push(DeltaChunk::Deltas(vec![delta])),
        }
    }

    fn takes_cleared(&self) -> bool {
        true
    }

    fn push_cleared(&mut self, cleared: ClearedBlocks) {
        self.chunks.push(DeltaChunk::Cleared(Box::new(cleared)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::{ModelId, PodId};

    fn field(std_hash: u64) -> Delta {
        Delta::Field {
            model: ModelId(0),
            std_hash,
            pod: PodId(0),
            value: None,
        }
    }

    #[test]
    fn deltas_are_cut_into_bounded_chunks_in_order() {
        let mut sink = MirrorSink::new();
        let n = 2 * CHUNK_DELTAS as u64 + 5;
        for i in 0..n {
            sink.push(field(i));
        }
        assert_eq!(sink.chunks().len(), 3);
        let mut seen = 0;
        for chunk in sink.chunks {
            let DeltaChunk::Deltas(deltas) = chunk else {
                panic!("only deltas were pushed");
            };
            assert!(deltas.len() <= CHUNK_DELTAS);
            assert!(
                deltas.capacity() <= CHUNK_DELTAS,
                "no chunk grows past its bound"
            );
            for d in deltas {
                assert_eq!(d, field(seen));
                seen += 1;
            }
        }
        assert_eq!(seen, n);
    }
}

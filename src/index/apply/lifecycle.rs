//! A source's whole state at once: cleared (engine restart, unfillable gap), unregistered,
//! or every source of a pod forgotten.

use super::Mutation;
use crate::index::counters::CountDelta;
use crate::index::delta::{Delta, DeltaSink};
use crate::index::vocab::{PodId, SourceId};
use crate::index::{Index, IndexError};

impl Index {
    /// Drops every block of `source` (engine restart, unfillable gap), keeping it registered.
    ///
    /// # Errors
    /// [`IndexError::UnknownSource`] when `source` is not registered.
    pub fn clear_source(
        &self,
        source: SourceId,
        sink: &mut impl DeltaSink,
    ) -> Result<(), IndexError> {
        let state = self.source(source)?;
        let mut state = state.lock();
        // A clear stores nothing, so the store time is never read.
        Mutation::new(self, &mut state, sink, 0).clear();
        state.settle(true);
        drop(state);
        self.shrink_shared();
        Ok(())
    }

    /// Drops every block of `source` and unregisters it.
    ///
    /// # Errors
    /// [`IndexError::UnknownSource`] when `source` is not registered.
    pub fn remove_source(
        &self,
        source: SourceId,
        sink: &mut impl DeltaSink,
    ) -> Result<(), IndexError> {
        let state = self.source(source)?;
        let (pod, rank) = {
            let mut state = state.lock();
            Mutation::new(self, &mut state, sink, 0).clear();
            self.keep_departed_counts(state.pod, &std::mem::take(&mut state.counted));
            (state.pod, state.rank)
        };
        self.shrink_shared();
        if let Some(slot) = self.inner.sources.write().get_mut(source.0 as usize) {
            *slot = None;
        }
        self.unlink_pod_source(pod, source);
        if sink.wants_mappings() {
            sink.push(Delta::SourceGone {
                pod: PodId(pod),
                rank,
            });
        }
        Ok(())
    }

    /// Forgets a pod: every source of it is cleared and unregistered.
    pub fn forget_pod(&self, pod: &str, sink: &mut impl DeltaSink) {
        for source in self.sources_of_pod(pod) {
            // A concurrent removal of the same source is harmless: it is gone either way.
            let _ = self.remove_source(source, sink);
        }
    }

    /// Folds the counts of a source being unregistered into what departed sources left.
    fn keep_departed_counts(&self, pod: u32, counted: &CountDelta) {
        self.inner.entries.add(counted);
        self.inner.pod_entries.of(pod).add(counted);
    }
}

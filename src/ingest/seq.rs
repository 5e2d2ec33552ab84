//! Per-source sequence tracking (docs/architecture.md §3), pure so tests drive it without sockets.

/// What to do with a message of a given seq.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqDecision {
    /// Next in order (or the very first message at seq 0): apply it.
    Apply,
    /// The first message of a source with no state has seq > 0: batches `0..seq` were
    /// missed; replay from 0 when a replay endpoint exists, then apply.
    StartedMidStream {
        /// First seq missed.
        from: u64,
    },
    /// Seqs `from..to` are missing: replay them, or reset the source when that fails.
    Gap {
        /// First missing seq.
        from: u64,
        /// The seq that arrived (first seq after the hole).
        to: u64,
    },
    /// Already applied (a replay overlap): drop it.
    Duplicate,
    /// The seq went back (to 0, or at all after a reconnect): the engine restarted and its
    /// cache is gone. Clear the source, then apply.
    Restart,
}

/// Last applied seq of one source and whether its connection was re-established since.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SeqTracker {
    last: Option<u64>,
    reconnected: bool,
}

impl SeqTracker {
    /// A tracker with no state.
    pub fn new() -> SeqTracker {
        SeqTracker::default()
    }

    /// The last applied seq.
    pub fn last(&self) -> Option<u64> {
        self.last
    }

    /// Classifies an arriving seq; does not change state (see [`SeqTracker::applied`]).
    pub fn observe(&self, seq: u64) -> SeqDecision {
        match self.last {
            None if seq == 0 => SeqDecision::Apply,
            None => SeqDecision::StartedMidStream { from: 0 },
            Some(last) if seq == last.wrapping_add(1) && seq != 0 => SeqDecision::Apply,
            Some(_) if seq == 0 => SeqDecision::Restart,
            Some(last) if seq <= last && self.reconnected => SeqDecision::Restart,
            Some(last) if seq <= last => SeqDecision::Duplicate,
            Some(last) => SeqDecision::Gap {
                from: last + 1,
                to: seq,
            },
        }
    }

    /// A tracker that goes on after `last`, inherited from a checkpoint: the next seq applies,
    /// a hole is a gap from `last + 1`, and (as after any reconnect) a seq that does not
    /// move forward is an engine restart.
    pub fn resumed(last: u64) -> SeqTracker {
        SeqTracker {
            last: Some(last),
            reconnected: true,
        }
    }

    /// Records that `seq` was applied (or deliberately passed over).
    pub fn applied(&mut self, seq: u64) {
        self.last = Some(seq);
        self.reconnected = false;
    }

    /// The connection dropped and came back: a seq that does not move forward now means
    /// a restarted engine rather than a duplicate.
    pub fn reconnected(&mut self) {
        if self.last.is_some() {
            self.reconnected = true;
        }
    }

    /// Forgets all state (after the source was cleared).
    pub fn reset(&mut self) {
        *self = SeqTracker::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_messages_apply() {
        let mut t = SeqTracker::new();
        assert_eq!(t.observe(0), SeqDecision::Apply);
        t.applied(0);
        assert_eq!(t.observe(1), SeqDecision::Apply);
    }

    #[test]
    fn first_message_above_zero_started_mid_stream() {
        let t = SeqTracker::new();
        assert_eq!(t.observe(7), SeqDecision::StartedMidStream { from: 0 });
    }

    #[test]
    fn a_hole_is_a_gap() {
        let mut t = SeqTracker::new();
        t.applied(3);
        assert_eq!(t.observe(6), SeqDecision::Gap { from: 4, to: 6 });
    }

    #[test]
    fn back_to_zero_is_a_restart() {
        let mut t = SeqTracker::new();
        t.applied(3);
        assert_eq!(t.observe(0), SeqDecision::Restart);
    }

    #[test]
    fn old_seq_is_duplicate_unless_reconnected() {
        let mut t = SeqTracker::new();
        t.applied(5);
        assert_eq!(t.observe(4), SeqDecision::Duplicate);
        assert_eq!(t.observe(5), SeqDecision::Duplicate);
        t.reconnected();
        assert_eq!(t.observe(2), SeqDecision::Restart);
        assert_eq!(t.observe(6), SeqDecision::Apply);
    }

    #[test]
    fn a_resumed_tracker_goes_on_after_the_watermark() {
        let t = SeqTracker::resumed(9);
        assert_eq!(t.observe(10), SeqDecision::Apply);
        assert_eq!(t.observe(12), SeqDecision::Gap { from: 10, to: 12 });
        assert_eq!(t.observe(9), SeqDecision::Restart);
        assert_eq!(t.observe(3), SeqDecision::Restart);
        assert_eq!(t.observe(0), SeqDecision::Restart);
    }

    #[test]
    fn reset_forgets() {
        let mut t = SeqTracker::new();
        t.applied(9);
        t.reset();
        assert_eq!(t.last(), None);
        assert_eq!(t.observe(0), SeqDecision::Apply);
    }
}

//! The store's metric label values: what `crate::metrics` counts them under.

/// Which way an anti-entropy repair went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RepairDirection {
    /// A field or mapping key the index does not hold was deleted.
    Deleted,
    /// A field or mapping key the index holds was missing or different and was written.
    Written,
}

impl RepairDirection {
    /// Every direction, in declaration order.
    pub const ALL: [RepairDirection; 2] = [RepairDirection::Deleted, RepairDirection::Written];

    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            RepairDirection::Deleted => "deleted",
            RepairDirection::Written => "written",
        }
    }
}

/// What the watchdog saw Redis lose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisReset {
    /// A new `run_id`: Redis restarted.
    Restart,
    /// The sentinel key vanished under the same `run_id`: FLUSHALL or FLUSHDB.
    Flush,
}

impl RedisReset {
    /// Every kind, in declaration order.
    pub const ALL: [RedisReset; 2] = [RedisReset::Restart, RedisReset::Flush];

    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            RedisReset::Restart => "restart",
            RedisReset::Flush => "flush",
        }
    }
}

/// Registers the mirror's upkeep series at 0 under every label value.
pub(super) fn register_upkeep_series() {
    crate::metrics::mirror_upkeep_series(
        &RepairDirection::ALL.map(RepairDirection::as_str),
        &RedisReset::ALL.map(RedisReset::as_str),
    );
}

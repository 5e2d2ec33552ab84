//! Sharded replicas: which of `count` kvindex replicas owns a pod, by rendezvous
//! (highest-random-weight) hashing of its identifier `{pod}.{namespace}` (docs/architecture.md §8).
//!
//! Every replica loads the same config and computes the same answer with no coordination:
//! for each shard number `s` in `0..count` the pod gets the weight
//!
//! ```text
//! weight(pod, s) = first 8 bytes, big-endian u64, of
//!                  SHA-256(pod identifier as UTF-8 ‖ 0x00 ‖ s as 4-byte big-endian)
//! ```
//!
//! and the shard with the highest weight owns it (equal weights: the lower shard number).
//! SHA-256 is fixed by its standard, so the owner is the same on every platform and in every
//! kvindex version (the golden values in the tests pin it). Going from `n` to `n + 1`
//! replicas moves a pod only when the new shard's weight beats all others: about
//! `1/(n + 1)` of the pods move, all of them to the new shard; going down, only the pods of
//! the removed shard move.
//!
//! Ownership decides everything a replica does to a pod's keys: it subscribes only to the
//! pods it owns, restores only their checkpoint, and its anti-entropy, watchdog rewrites and
//! forgetting touch only them. See docs/deploying.md (sharded replicas) for the rule during a
//! change of `count`.

use sha2::{Digest, Sha256};

/// Replicas a deployment may be split into at most (each pod costs `count` hashes).
pub const MAX_SHARDS: u32 = 1024;

/// This replica's place among the replicas: shard `index` of `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Shard {
    /// This replica's shard number, `0..count`.
    pub index: u32,
    /// Replicas sharing the pods.
    pub count: u32,
}

impl Default for Shard {
    fn default() -> Self {
        Shard::SINGLE
    }
}

impl Shard {
    /// One replica owning every pod (no `shard:` section).
    pub const SINGLE: Shard = Shard { index: 0, count: 1 };

    /// Whether more than one replica shares the pods.
    pub fn is_sharded(&self) -> bool {
        self.count > 1
    }

    /// The shard that owns `pod_id` among this deployment's `count` replicas.
    pub fn owner_of(&self, pod_id: &str) -> u32 {
        owner(pod_id, self.count)
    }

    /// Whether this replica owns `pod_id`.
    pub fn owns(&self, pod_id: &str) -> bool {
        !self.is_sharded() || self.owner_of(pod_id) == self.index
    }
}

/// The rendezvous weight of `pod_id` for shard `shard`.
pub fn weight(pod_id: &str, shard: u32) -> u64 {
    let mut h = Sha256::new();
    h.update(pod_id.as_bytes());
    h.update([0u8]);
    h.update(shard.to_be_bytes());
    let digest = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

/// The shard in `0..count` with the highest weight for `pod_id` (0 when `count` ≤ 1).
pub fn owner(pod_id: &str, count: u32) -> u32 {
    if count <= 1 {
        return 0;
    }
    let mut best = (0u32, weight(pod_id, 0));
    for s in 1..count {
        let w = weight(pod_id, s);
        // Strictly greater: on a tie the lower shard number keeps the pod.
        if w > best.1 {
            best = (s, w);
        }
    }
    best.0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Golden values computed apart from this code, with coreutils
    /// (`printf 'vllm-0.default\0\0\0\0\1' | sha256sum | cut -c1-16` → `0efae1223d8dc939`):
    /// a change here would move pods between replicas of a running deployment.
    #[test]
    fn weights_are_sha256_of_the_pod_and_shard_number() {
        assert_eq!(weight("vllm-0.default", 0), 0xbcfb_933d_3a82_d4bf);
        assert_eq!(weight("vllm-0.default", 1), 0x0efa_e122_3d8d_c939);
        assert_eq!(weight("vllm-0.default", 2), 0x8887_bb8a_94bf_0b35);
        assert_eq!(owner("vllm-0.default", 3), 0);
    }

    /// Owners of `engine-{i}.team-a` (the sharding integration test's pods), computed with
    /// Python's hashlib from the rule in the module header.
    #[test]
    fn owners_of_the_integration_pods_are_pinned() {
        let by_3: Vec<u32> = (0..12)
            .map(|i| owner(&format!("engine-{i}.team-a"), 3))
            .collect();
        let by_4: Vec<u32> = (0..12)
            .map(|i| owner(&format!("engine-{i}.team-a"), 4))
            .collect();
        assert_eq!(by_3, [2, 1, 2, 0, 2, 1, 0, 2, 2, 2, 1, 1]);
        assert_eq!(by_4, [2, 1, 3, 0, 2, 1, 0, 2, 3, 3, 3, 1]);
    }

    fn pods(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("engine-{i}.ns-{}", i % 7)).collect()
    }

    #[test]
    fn one_replica_owns_everything() {
        for pod in pods(50) {
            assert!(Shard::SINGLE.owns(&pod));
            assert_eq!(owner(&pod, 1), 0);
            assert_eq!(owner(&pod, 0), 0);
        }
    }

    #[test]
    fn every_pod_has_exactly_one_owner_and_shards_get_a_fair_share() {
        let pods = pods(12_000);
        for count in [2u32, 3, 4, 7] {
            let mut per = vec![0usize; count as usize];
            for pod in &pods {
                let owners: Vec<u32> = (0..count)
                    .filter(|i| Shard { index: *i, count }.owns(pod))
                    .collect();
                assert_eq!(owners.len(), 1, "{pod} with {count} shards: {owners:?}");
                per[owners[0] as usize] += 1;
            }
            let fair = pods.len() / count as usize;
            for n in per {
                // Binomial spread: ±10 % of a fair share is > 5 sigma at these sizes.
                assert!(
                    n.abs_diff(fair) * 10 < fair,
                    "{count} shards: {n} vs {fair}"
                );
            }
        }
    }

    #[test]
    fn growing_from_n_to_n_plus_one_moves_about_one_in_n_plus_one_all_to_the_new_shard() {
        let pods = pods(12_000);
        for n in [1u32, 2, 3, 4, 9] {
            let moved: Vec<&String> = pods
                .iter()
                .filter(|p| owner(p, n) != owner(p, n + 1))
                .collect();
            for p in &moved {
                assert_eq!(owner(p, n + 1), n, "{p} moved between old shards");
            }
            let want = pods.len() as f64 / f64::from(n + 1);
            let got = moved.len() as f64;
            assert!(
                (got - want).abs() < want * 0.1,
                "{n}→{}: {got} moved, ~{want} expected",
                n + 1
            );
        }
    }

    #[test]
    fn shrinking_moves_only_the_removed_shards_pods() {
        for pod in pods(5_000) {
            let before = owner(&pod, 4);
            if before != 3 {
                assert_eq!(owner(&pod, 3), before, "{pod}");
            }
        }
    }
}

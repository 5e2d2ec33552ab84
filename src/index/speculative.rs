//! Speculative residents: chain blocks a router placed on a pod that the pod's engine has not
//! reported yet.
//!
//! Between a router placing a request and the engine's `BlockStored` events arriving, the
//! index cannot know the blocks being prefilled, so a burst of requests over one new context
//! would be spread over pods that each pay the prefill again. A placement recorded here
//! (`POST /v1/routed`) makes the prompt's chain blocks count as held by the chosen pod for a
//! TTL, for `prefix` scoring only. The overlay sits beside the index's own structures, which
//! it never touches:
//! - an entry is *confirmed* (dropped: the index now answers for it) when the pod stores that
//!   chain block, and *dropped* when the pod removes it, clears, restarts, is reset or leaves
//!   the targets; otherwise it *expires* at its TTL;
//! - it is never written to Redis or the checkpoint and never counted as resident;
//! - at most `max_entries` live at once: a placement beyond that evicts the oldest entries.
//!
//! Every entry has the same TTL, so entries expire in the order they were placed: a queue of
//! slots in placement order finds the expired ones without a scan. Each entry has exactly one
//! slot (the entry remembers which), so a placement that refreshes a live entry only moves
//! its expiry; when the entry's slot comes up and the entry was refreshed since, the slot goes
//! to the back with the new expiry. A slot whose entry was confirmed or dropped is discarded
//! when it comes up, so the queue holds at most the entries placed within one TTL. A slot
//! moved back may sit behind later ones and be purged up to a TTL late; reads check each
//! entry's own expiry, so an entry never counts past it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hashbrown::hash_map::Entry::{Occupied, Vacant};
use hashbrown::HashMap;
use parking_lot::RwLock;

use crate::hash::ChainHash;

/// Default of `speculative.ttl_ms` (llm-d's precise prefix scorer's default).
pub const DEFAULT_SPECULATIVE_TTL: Duration = Duration::from_millis(2000);
/// Default of `speculative.max_entries`.
pub const DEFAULT_SPECULATIVE_MAX_ENTRIES: usize = 1 << 20;

/// How long placements live and how many may.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpeculativeOptions {
    /// Lifetime of an unconfirmed placement; zero turns speculation off.
    pub ttl: Duration,
    /// Live entries at most.
    pub max_entries: usize,
}

impl Default for SpeculativeOptions {
    fn default() -> Self {
        SpeculativeOptions {
            ttl: DEFAULT_SPECULATIVE_TTL,
            max_entries: DEFAULT_SPECULATIVE_MAX_ENTRIES,
        }
    }
}

/// What happened to speculative entries since the start, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpeculativeStats {
    /// Entries live now.
    pub live: usize,
    /// Entries placed (a placement refreshing a live entry counts again).
    pub placed: u64,
    /// Entries the engine's own store confirmed.
    pub confirmed: u64,
    /// Entries that reached their TTL unconfirmed.
    pub expired: u64,
    /// Entries dropped by the pod's remove, clear, restart, reset or removal.
    pub dropped: u64,
    /// Entries evicted, oldest first, to stay within `max_entries`.
    pub evicted: u64,
}

/// The overlay: per pod, the chain blocks placed on it and when each expires.
#[derive(Debug, Default)]
pub struct Speculative {
    options: SpeculativeOptions,
    /// Entries live (or expired and not yet purged): lets every reader and every applied
    /// event skip the lock while nothing was placed.
    len: AtomicUsize,
    state: RwLock<State>,
    counts: Counts,
}

#[derive(Debug, Default)]
struct State {
    /// Pod id → chain hash → entry.
    pods: HashMap<u32, HashMap<ChainHash, Entry>>,
    /// (time, pod, chain) in placement order: the entry's one slot when its `slot` is that
    /// time, else a leftover of an entry confirmed, dropped or placed again since.
    queue: VecDeque<Slot>,
}

/// One placed (pod, chain block).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    expires: Instant,
    /// The time of the entry's slot in the queue.
    slot: Instant,
}

#[derive(Debug, Default)]
struct Counts {
    placed: AtomicU64,
    confirmed: AtomicU64,
    expired: AtomicU64,
    dropped: AtomicU64,
    evicted: AtomicU64,
}

impl Speculative {
    /// An empty overlay with `options`.
    pub fn new(options: SpeculativeOptions) -> Speculative {
        Speculative {
            options,
            ..Speculative::default()
        }
    }

    /// Whether placements are kept at all (a TTL above zero).
    pub fn enabled(&self) -> bool {
        !self.options.ttl.is_zero() && self.options.max_entries > 0
    }

    /// The options the overlay was built with.
    pub fn options(&self) -> SpeculativeOptions {
        self.options
    }

    /// Whether no entry is live: the fast check every query and applied event makes.
    pub fn is_empty(&self) -> bool {
        self.len.load(Ordering::Relaxed) == 0
    }

    /// Places `chains` on `pod` until `now + ttl`, evicting the oldest entries beyond
    /// `max_entries`. Returns how many entries were placed (none while disabled).
    pub fn place(&self, pod: u32, chains: &[ChainHash], now: Instant) -> usize {
        if !self.enabled() || chains.is_empty() {
            return 0;
        }
        let expires = now + self.options.ttl;
        let mut state = self.state.write();
        self.purge_locked(&mut state, now);
        let State { pods, queue } = &mut *state;
        let held = pods.entry(pod).or_default();
        let mut added = 0;
        for &chain in chains {
            match held.entry(chain) {
                Occupied(mut entry) => entry.get_mut().expires = expires,
                Vacant(vacant) => {
                    let slot = expires;
                    vacant.insert(Entry { expires, slot });
                    queue.push_back((slot, pod, chain));
                    added += 1;
                }
            }
        }
        let len = self.len.fetch_add(added, Ordering::Relaxed) + added;
        let placed = chains.len() as u64;
        self.counts.placed.fetch_add(placed, Ordering::Relaxed);
        if len > self.options.max_entries {
            self.evict_locked(&mut state, len - self.options.max_entries);
        }
        chains.len()
    }

    /// The engine stored `chains` on `pod`: their entries are confirmed (the index answers
    /// for them now).
    pub fn confirm(&self, pod: u32, chains: &[ChainHash]) {
        let taken = self.take(pod, chains);
        self.counts.confirmed.fetch_add(taken, Ordering::Relaxed);
    }

    /// The engine removed `chains` from `pod`: their entries go.
    pub fn drop_blocks(&self, pod: u32, chains: &[ChainHash]) {
        let taken = self.take(pod, chains);
        self.counts.dropped.fetch_add(taken, Ordering::Relaxed);
    }

    /// Every entry of `pod` goes (its engine cleared, restarted or was reset, or the pod left
    /// the targets).
    pub fn drop_pod(&self, pod: u32) {
        if self.is_empty() {
            return;
        }
        let mut state = self.state.write();
        let Some(held) = state.pods.remove(&pod) else {
            return;
        };
        self.len.fetch_sub(held.len(), Ordering::Relaxed);
        self.counts
            .dropped
            .fetch_add(held.len() as u64, Ordering::Relaxed);
    }

    /// Drops the entries that expired by `now`.
    pub fn purge(&self, now: Instant) {
        if self.is_empty() {
            return;
        }
        self.purge_locked(&mut self.state.write(), now);
    }

    /// For each of `pods` (pod ids, `None` for a name the index does not know) the positions
    /// of `chains` placed on it and live at `now`, as one flag per chain; `None` for a pod
    /// with none of them.
    pub fn held(
        &self,
        pods: &[Option<u32>],
        chains: &[ChainHash],
        now: Instant,
    ) -> Vec<Option<Vec<bool>>> {
        let mut out = vec![None; pods.len()];
        if self.is_empty() || chains.is_empty() {
            return out;
        }
        let state = self.state.read();
        let mut positions: Option<HashMap<ChainHash, Vec<usize>>> = None;
        for (slot, pod) in out.iter_mut().zip(pods) {
            let Some(held) = pod.and_then(|pod| state.pods.get(&pod)) else {
                continue;
            };
            let mut flags = vec![false; chains.len()];
            let live = |entry: &Entry| entry.expires > now;
            if held.len() < chains.len() {
                // Fewer entries than prompt blocks: look each entry up in the prompt.
                let positions = positions.get_or_insert_with(|| positions_of(chains));
                for (chain, _) in held.iter().filter(|(_, e)| live(e)) {
                    for &at in positions.get(chain).into_iter().flatten() {
                        flags[at] = true;
                    }
                }
            } else {
                for (flag, chain) in flags.iter_mut().zip(chains) {
                    *flag = held.get(chain).is_some_and(live);
                }
            }
            if flags.contains(&true) {
                *slot = Some(flags);
            }
        }
        out
    }

    /// The counts since the start, and the entries live now.
    pub fn stats(&self) -> SpeculativeStats {
        let c = &self.counts;
        SpeculativeStats {
            live: self.len.load(Ordering::Relaxed),
            placed: c.placed.load(Ordering::Relaxed),
            confirmed: c.confirmed.load(Ordering::Relaxed),
            expired: c.expired.load(Ordering::Relaxed),
            dropped: c.dropped.load(Ordering::Relaxed),
            evicted: c.evicted.load(Ordering::Relaxed),
        }
    }

    /// Takes `chains` of `pod` out; returns how many were there.
    fn take(&self, pod: u32, chains: &[ChainHash]) -> u64 {
        if self.is_empty() || chains.is_empty() {
            return 0;
        }
        let mut state = self.state.write();
        let Some(held) = state.pods.get_mut(&pod) else {
            return 0;
        };
        let before = held.len();
        for chain in chains {
            held.remove(chain);
        }
        let taken = before - held.len();
        if held.is_empty() {
            state.pods.remove(&pod);
        }
        self.len.fetch_sub(taken, Ordering::Relaxed);
        taken as u64
    }

    fn purge_locked(&self, state: &mut State, now: Instant) {
        let mut expired = 0;
        while let Some(&(slot, pod, chain)) = state.queue.front() {
            if slot > now {
                break;
            }
            state.queue.pop_front();
            expired += take_slot(state, (slot, pod, chain), Some(now));
        }
        self.len.fetch_sub(expired, Ordering::Relaxed);
        let expired = expired as u64;
        self.counts.expired.fetch_add(expired, Ordering::Relaxed);
    }

    fn evict_locked(&self, state: &mut State, mut excess: usize) {
        let mut evicted = 0;
        while excess > 0 {
            let Some(slot) = state.queue.pop_front() else {
                break;
            };
            let gone = take_slot(state, slot, None);
            evicted += gone;
            excess -= gone;
        }
        self.len.fetch_sub(evicted, Ordering::Relaxed);
        let evicted = evicted as u64;
        self.counts.evicted.fetch_add(evicted, Ordering::Relaxed);
    }
}

/// A queue slot.
type Slot = (Instant, u32, ChainHash);

/// A slot taken off the queue's front: removes its entry, and returns 1, if the slot is the
/// entry's and the entry expired by `now` (`None`: whatever its expiry, to make room); an
/// entry placed again since lives on, its slot back in the queue at its new expiry.
fn take_slot(state: &mut State, (slot, pod, chain): Slot, now: Option<Instant>) -> usize {
    let Some(held) = state.pods.get_mut(&pod) else {
        return 0;
    };
    let Some(entry) = held.get_mut(&chain).filter(|e| e.slot == slot) else {
        return 0;
    };
    if now.is_some_and(|now| entry.expires > now) {
        entry.slot = entry.expires;
        state.queue.push_back((entry.expires, pod, chain));
        return 0;
    }
    held.remove(&chain);
    if held.is_empty() {
        state.pods.remove(&pod);
    }
    1
}

/// Each chain hash's positions in `chains` (a prompt may repeat a chain only if hashes
/// collide, but the answer stays exact either way).
fn positions_of(chains: &[ChainHash]) -> HashMap<ChainHash, Vec<usize>> {
    let mut positions: HashMap<ChainHash, Vec<usize>> = HashMap::with_capacity(chains.len());
    for (at, chain) in chains.iter().enumerate() {
        positions.entry(*chain).or_default().push(at);
    }
    positions
}

#[cfg(test)]
mod tests {
    use super::*;

    fn overlay(ttl_ms: u64, max_entries: usize) -> Speculative {
        Speculative::new(SpeculativeOptions {
            ttl: Duration::from_millis(ttl_ms),
            max_entries,
        })
    }

    fn held_by(s: &Speculative, pod: u32, chains: &[u64], now: Instant) -> Vec<bool> {
        let out = s.held(&[Some(pod)], chains, now);
        out[0].clone().unwrap_or_else(|| vec![false; chains.len()])
    }

    #[test]
    fn placements_live_until_their_ttl_and_are_counted() {
        let s = overlay(100, 1000);
        let t0 = Instant::now();
        assert_eq!(s.place(1, &[10, 11, 12], t0), 3);
        assert_eq!(held_by(&s, 1, &[10, 11, 13], t0), [true, true, false]);
        assert_eq!(held_by(&s, 2, &[10], t0), [false]);
        let later = t0 + Duration::from_millis(100);
        assert_eq!(held_by(&s, 1, &[10], later), [false], "expired at the TTL");
        s.purge(later);
        let stats = s.stats();
        assert_eq!((stats.live, stats.placed, stats.expired), (0, 3, 3));
        assert!(s.is_empty());
    }

    #[test]
    fn confirm_remove_and_pod_drops_take_entries_out() {
        let s = overlay(1000, 1000);
        let now = Instant::now();
        s.place(1, &[10, 11, 12], now);
        s.place(2, &[10], now);
        s.confirm(1, &[10, 99]);
        s.drop_blocks(1, &[11]);
        assert_eq!(held_by(&s, 1, &[10, 11, 12], now), [false, false, true]);
        s.drop_pod(2);
        assert_eq!(held_by(&s, 2, &[10], now), [false]);
        let stats = s.stats();
        assert_eq!((stats.live, stats.confirmed, stats.dropped), (1, 1, 2));
    }

    #[test]
    fn a_refreshed_entry_outlives_its_first_placement() {
        let s = overlay(100, 1000);
        let t0 = Instant::now();
        s.place(1, &[10], t0);
        let t1 = t0 + Duration::from_millis(60);
        s.place(1, &[10], t1);
        let t2 = t0 + Duration::from_millis(120);
        s.purge(t2);
        assert_eq!(held_by(&s, 1, &[10], t2), [true]);
        assert_eq!(s.stats().live, 1);
        s.purge(t1 + Duration::from_millis(100));
        assert!(s.is_empty());
    }

    #[test]
    fn the_oldest_entries_make_room_beyond_the_cap() {
        let s = overlay(1000, 4);
        let now = Instant::now();
        s.place(1, &[1, 2, 3], now);
        s.place(2, &[4, 5, 6], now);
        let stats = s.stats();
        assert_eq!((stats.live, stats.evicted), (4, 2));
        assert_eq!(held_by(&s, 1, &[1, 2, 3], now), [false, false, true]);
        assert_eq!(held_by(&s, 2, &[4, 5, 6], now), [true, true, true]);
    }

    #[test]
    fn a_zero_ttl_keeps_nothing() {
        let s = overlay(0, 1000);
        assert_eq!(s.place(1, &[1], Instant::now()), 0);
        assert!(s.is_empty() && !s.enabled());
    }

    #[test]
    fn both_lookup_directions_agree() {
        let s = overlay(1000, 10_000);
        let now = Instant::now();
        let placed: Vec<u64> = (0..50).collect();
        s.place(1, &placed, now);
        // A prompt longer than the pod's entries, and one shorter.
        let long: Vec<u64> = (25..200).collect();
        let short: Vec<u64> = vec![3, 70, 4];
        let flags = held_by(&s, 1, &long, now);
        assert!(flags.iter().zip(&long).all(|(f, c)| *f == (*c < 50)));
        assert_eq!(held_by(&s, 1, &short, now), [true, false, true]);
    }
}

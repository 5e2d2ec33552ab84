//! Storage media (tiers) as the engines report them, interned to small ids.
//!
//! Engines send the medium as a free string (`"GPU"`, `"cpu"`, `"CPU_PINNED"`, …). The index
//! keeps the set of media a block is resident on as a bitset, so each distinct spelling gets a
//! slot in a process-wide registry. Comparisons are case-insensitive (`"cpu"` and `"CPU"` are
//! the same tier), but the engine's own spelling is kept for writing it back to Redis.
//!
//! | item | job |
//! | --- | --- |
//! | [`Medium`] | one interned spelling (a `Copy` id) |
//! | [`MediaSet`] | a bitset of media, as stored per (block, source) |
//! | [`TierWeights`] | the per-tier score weights, validated at start-up |

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use parking_lot::RwLock;

/// Canonical media in kthena's tie-break order (docs/architecture.md §6); their index + 1 is their id.
const KNOWN: [&str; 12] = [
    "GPU",
    "CPU_PINNED",
    "CPU_TIER1",
    "CPU",
    "CPU_TIER2",
    "DISK",
    "FS",
    "STORAGE",
    "SHARED_STORAGE",
    "OBJ",
    "OBJECT_STORE",
    "EXTERNAL",
];

/// Number of slots in a [`MediaSet`]; slot 0 is "no medium reported".
pub const MEDIA_SLOTS: usize = 24;
/// The slot used once every dynamic slot is taken, so hostile input cannot grow the registry.
const OVERFLOW_SLOT: u8 = (MEDIA_SLOTS - 1) as u8;

/// One storage medium as an engine spelled it, interned to a slot id.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Medium(u8);

struct Entry {
    spelling: &'static str,
    canonical: &'static str,
}

struct Registry {
    entries: Vec<Entry>,
}

fn registry() -> &'static RwLock<Registry> {
    static REGISTRY: OnceLock<RwLock<Registry>> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let mut entries = vec![Entry {
            spelling: "",
            canonical: "",
        }];
        entries.extend(KNOWN.iter().map(|name| Entry {
            spelling: name,
            canonical: name,
        }));
        RwLock::new(Registry { entries })
    })
}

impl Medium {
    /// No medium was reported (engines before vLLM 0.10.2 / SGLang 0.5.9).
    pub const NONE: Medium = Medium(0);
    /// `GPU`, the medium every engine's block pool reports.
    pub const GPU: Medium = Medium(1);
    /// The slot every medium lands in once the registry is full.
    pub const OVERFLOW: Medium = Medium(OVERFLOW_SLOT);

    /// Interns `spelling` (exact spelling kept; matching known names is case-sensitive here so
    /// that `"cpu"` keeps its own slot and is written back as `"cpu"`).
    pub fn intern(spelling: &str) -> Medium {
        if spelling.is_empty() {
            return Medium::NONE;
        }
        if let Some(pos) = KNOWN.iter().position(|k| *k == spelling) {
            return Medium(pos as u8 + 1);
        }
        {
            let reg = registry().read();
            if let Some(pos) = reg.entries.iter().position(|e| e.spelling == spelling) {
                return Medium(pos as u8);
            }
        }
        let mut reg = registry().write();
        if let Some(pos) = reg.entries.iter().position(|e| e.spelling == spelling) {
            return Medium(pos as u8);
        }
        if reg.entries.len() >= OVERFLOW_SLOT as usize {
            return Medium::OVERFLOW;
        }
        // Leaking is bounded: at most MEDIA_SLOTS spellings live for the whole process.
        let spelling: &'static str = Box::leak(spelling.to_owned().into_boxed_str());
        let canonical: &'static str = match KNOWN.iter().find(|k| k.eq_ignore_ascii_case(spelling))
        {
            Some(known) => known,
            None => Box::leak(spelling.to_ascii_uppercase().into_boxed_str()),
        };
        reg.entries.push(Entry {
            spelling,
            canonical,
        });
        Medium(reg.entries.len() as u8 - 1)
    }

    /// The slot id (0 = no medium).
    pub fn slot(self) -> u8 {
        self.0
    }

    /// Whether this is [`Medium::NONE`].
    pub fn is_none(self) -> bool {
        self.0 == 0
    }

    /// The engine's own spelling (`""` for [`Medium::NONE`], `"OTHER"` for the overflow slot).
    pub fn spelling(self) -> &'static str {
        if self == Medium::OVERFLOW {
            return "OTHER";
        }
        registry()
            .read()
            .entries
            .get(self.0 as usize)
            .map_or("", |e| e.spelling)
    }

    /// Upper-case canonical name used for comparisons and weights.
    pub fn canonical(self) -> &'static str {
        if self == Medium::OVERFLOW {
            return "OTHER";
        }
        registry()
            .read()
            .entries
            .get(self.0 as usize)
            .map_or("", |e| e.canonical)
    }

    /// Every slot whose canonical name equals this one's (`"cpu"` matches `"CPU"`).
    pub fn same_tier_mask(self) -> MediaSet {
        if self.is_none() {
            return MediaSet::single(self);
        }
        let canonical = self.canonical();
        let reg = registry().read();
        let mut set = MediaSet::EMPTY;
        for (slot, entry) in reg.entries.iter().enumerate() {
            if entry.canonical == canonical {
                set.insert(Medium(slot as u8));
            }
        }
        set.insert(self);
        set
    }

    /// Position in kthena's fixed tie-break order; unknown names sort after, alphabetically.
    fn tie_rank(self) -> (u8, &'static str, &'static str) {
        if self.is_none() {
            return (u8::MAX, "", "");
        }
        let canonical = self.canonical();
        match KNOWN.iter().position(|k| *k == canonical) {
            Some(pos) => (pos as u8, "", self.spelling()),
            None => (KNOWN.len() as u8, canonical, self.spelling()),
        }
    }
}

impl fmt::Debug for Medium {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_none() {
            f.write_str("Medium(none)")
        } else {
            write!(f, "Medium({})", self.spelling())
        }
    }
}

impl fmt::Display for Medium {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.spelling())
    }
}

/// A set of media, one bit per [`Medium`] slot.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MediaSet(u32);

impl MediaSet {
    /// The empty set.
    pub const EMPTY: MediaSet = MediaSet(0);
    const MASK: u32 = (1 << MEDIA_SLOTS) - 1;

    /// A set holding only `medium`.
    pub fn single(medium: Medium) -> MediaSet {
        MediaSet(1 << medium.0)
    }

    /// Builds a set from its raw bits (bits above [`MEDIA_SLOTS`] are dropped).
    pub fn from_bits(bits: u32) -> MediaSet {
        MediaSet(bits & Self::MASK)
    }

    /// The raw bits.
    pub fn bits(self) -> u32 {
        self.0
    }

    /// Whether no medium is in the set.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Adds `medium`.
    pub fn insert(&mut self, medium: Medium) {
        self.0 |= 1 << medium.0;
    }

    /// Whether `medium` is in the set.
    pub fn contains(self, medium: Medium) -> bool {
        self.0 & (1 << medium.0) != 0
    }

    /// The union of both sets.
    pub fn union(self, other: MediaSet) -> MediaSet {
        MediaSet(self.0 | other.0)
    }

    /// This set without the members of `other`.
    pub fn difference(self, other: MediaSet) -> MediaSet {
        MediaSet(self.0 & !other.0)
    }

    /// The members, in slot order.
    pub fn iter(self) -> impl Iterator<Item = Medium> {
        // Set bits only, lowest first: a set mostly has one member of 24 slots, and this
        // runs several times per edited block.
        let mut bits = self.0 & ((1 << MEDIA_SLOTS) - 1);
        std::iter::from_fn(move || {
            let slot = (bits != 0).then(|| bits.trailing_zeros() as u8)?;
            bits &= bits - 1;
            Some(Medium(slot))
        })
    }

    /// Spellings of the members, sorted, without the "no medium" slot.
    pub fn spellings(self) -> Vec<&'static str> {
        let mut names: Vec<&'static str> = self
            .iter()
            .filter(|m| !m.is_none())
            .map(Medium::spelling)
            .collect();
        names.sort_unstable();
        names
    }

    /// The member to report: highest weight, ties broken by kthena's fixed tier order.
    /// `None` when the set is empty.
    pub fn best(self, weights: &TierWeights) -> Option<Medium> {
        self.iter().min_by(|a, b| {
            let wa = weights.weight(*a);
            let wb = weights.weight(*b);
            wb.total_cmp(&wa)
                .then_with(|| a.tie_rank().cmp(&b.tie_rank()))
        })
    }
}

impl fmt::Debug for MediaSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

/// Why a tier-weight configuration was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WeightError {
    /// A weight outside [0.0, 1.0] (or not a number).
    #[error("tier weight for `{tier}` is {value}, but weights must lie in [0.0, 1.0]")]
    OutOfRange {
        /// The tier name as configured.
        tier: String,
        /// The refused value.
        value: f64,
    },
    /// An empty tier name.
    #[error("a tier weight has an empty medium name")]
    EmptyName,
}

/// Score weight per storage tier (docs/architecture.md §4): keys are case-insensitive.
pub struct TierWeights {
    by_canonical: BTreeMap<String, f64>,
    unknown: f64,
    /// Each medium slot's weight once asked (f64 bits; [`UNSET`] before): a slot's name
    /// never changes once interned, and a query asks for the media it meets, so the map
    /// and the registry's lock are read once per slot, not once per query.
    by_slot: [AtomicU64; MEDIA_SLOTS],
}

/// A slot of [`TierWeights::by_slot`] not asked yet (a NaN no weight can be).
const UNSET: u64 = u64::MAX;

impl TierWeights {
    fn from_map(by_canonical: BTreeMap<String, f64>, unknown: f64) -> TierWeights {
        TierWeights {
            by_canonical,
            unknown,
            by_slot: std::array::from_fn(|_| AtomicU64::new(UNSET)),
        }
    }
}

impl Clone for TierWeights {
    fn clone(&self) -> Self {
        TierWeights::from_map(self.by_canonical.clone(), self.unknown)
    }
}

impl fmt::Debug for TierWeights {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The weights as configured; the per-slot cache is an implementation detail.
        f.debug_struct("TierWeights")
            .field("by_canonical", &self.by_canonical)
            .field("unknown", &self.unknown)
            .finish_non_exhaustive()
    }
}

impl PartialEq for TierWeights {
    fn eq(&self, other: &Self) -> bool {
        self.by_canonical == other.by_canonical && self.unknown == other.unknown
    }
}

impl Default for TierWeights {
    fn default() -> Self {
        let mut by_canonical = BTreeMap::new();
        by_canonical.insert("GPU".to_owned(), 1.0);
        by_canonical.insert("CPU".to_owned(), 0.8);
        by_canonical.insert("CPU_PINNED".to_owned(), 0.8);
        TierWeights::from_map(by_canonical, 1.0)
    }
}

impl TierWeights {
    /// Builds weights from configured `(tier, weight)` pairs on top of the defaults.
    ///
    /// # Errors
    /// Every weight outside [0.0, 1.0] and every empty name, all reported at once.
    pub fn new<'a>(
        configured: impl IntoIterator<Item = (&'a str, f64)>,
        unknown_medium_weight: f64,
    ) -> Result<TierWeights, Vec<WeightError>> {
        let mut weights = TierWeights::default();
        let mut errors = Vec::new();
        for (tier, value) in configured {
            if tier.trim().is_empty() {
                errors.push(WeightError::EmptyName);
            } else if !(0.0..=1.0).contains(&value) {
                errors.push(WeightError::OutOfRange {
                    tier: tier.to_owned(),
                    value,
                });
            } else {
                weights
                    .by_canonical
                    .insert(tier.trim().to_ascii_uppercase(), value);
            }
        }
        if !(0.0..=1.0).contains(&unknown_medium_weight) {
            errors.push(WeightError::OutOfRange {
                tier: "unknown_medium_weight".to_owned(),
                value: unknown_medium_weight,
            });
        }
        weights.unknown = unknown_medium_weight;
        if errors.is_empty() {
            Ok(weights)
        } else {
            Err(errors)
        }
    }

    /// Weight of `medium`: 1.0 when none is reported, the configured value when one is set,
    /// `unknown_medium_weight` otherwise.
    pub fn weight(&self, medium: Medium) -> f64 {
        if medium.is_none() {
            return 1.0;
        }
        let slot = &self.by_slot[usize::from(medium.slot()) % MEDIA_SLOTS];
        match slot.load(Ordering::Relaxed) {
            UNSET => {
                let weight = self.weight_of_name(medium.canonical());
                slot.store(weight.to_bits(), Ordering::Relaxed);
                weight
            }
            bits => f64::from_bits(bits),
        }
    }

    /// Weight of a medium given by name (as read back from Redis); empty means none reported.
    pub fn weight_of_name(&self, name: &str) -> f64 {
        if name.is_empty() {
            return 1.0;
        }
        if let Some(w) = self.by_canonical.get(name) {
            return *w;
        }
        self.by_canonical
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map_or(self.unknown, |(_, w)| *w)
    }

    /// The configured weights by canonical tier name, for printing the resolved config.
    pub fn entries(&self) -> impl Iterator<Item = (&str, f64)> {
        self.by_canonical.iter().map(|(k, v)| (k.as_str(), *v))
    }

    /// The weight of media no entry names.
    pub fn unknown_medium_weight(&self) -> f64 {
        self.unknown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_media_have_fixed_slots_and_keep_spelling() {
        assert_eq!(Medium::intern("GPU"), Medium::GPU);
        assert_eq!(Medium::intern("GPU").spelling(), "GPU");
        let lower = Medium::intern("cpu");
        assert_eq!(lower.spelling(), "cpu");
        assert_eq!(lower.canonical(), "CPU");
        assert_eq!(Medium::intern("cpu"), lower);
        assert!(lower.same_tier_mask().contains(Medium::intern("CPU")));
    }

    #[test]
    fn empty_spelling_is_no_medium() {
        assert!(Medium::intern("").is_none());
    }

    #[test]
    fn best_medium_prefers_weight_then_fixed_order() {
        let w = TierWeights::default();
        let mut set = MediaSet::EMPTY;
        set.insert(Medium::intern("CPU"));
        set.insert(Medium::intern("STORAGE"));
        // STORAGE is unconfigured → weight 1.0 beats CPU's 0.8.
        assert_eq!(set.best(&w).map(Medium::spelling), Some("STORAGE"));
        set.insert(Medium::GPU);
        assert_eq!(set.best(&w).map(Medium::spelling), Some("GPU"));
    }

    #[test]
    fn weights_are_case_insensitive_and_validated() {
        let w = TierWeights::new([("disk", 0.0)], 1.0).unwrap();
        assert_eq!(w.weight(Medium::intern("DISK")), 0.0);
        assert_eq!(w.weight(Medium::intern("CPU")), 0.8);
        assert_eq!(w.weight(Medium::NONE), 1.0);
        assert_eq!(w.weight_of_name("cpu_pinned"), 0.8);
        let err = TierWeights::new([("gpu", 1.5), ("cpu", -0.1)], 2.0).unwrap_err();
        assert_eq!(err.len(), 3);
    }

    #[test]
    fn unknown_medium_weight_applies_to_unconfigured_tiers() {
        let w = TierWeights::new([], 0.0).unwrap();
        assert_eq!(w.weight(Medium::intern("OBJ")), 0.0);
        assert_eq!(w.weight(Medium::NONE), 1.0);
    }
}

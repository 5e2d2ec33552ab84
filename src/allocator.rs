//! The global allocator the `kvindex` binary installs, chosen at build time by cargo feature.
//! The benches and the examples that measure the daemon in process include this file by path,
//! so they measure with the same allocator; the library itself installs none.
//!
//! - `jemalloc` (default): `tikv-jemallocator`, with [`JEMALLOC_CONF`] built in. A
//!   background thread returns freed pages within a second, idle or busy, where glibc keeps
//!   them until `malloc_trim`, so a daemon's RSS follows its live heap through churn
//!   (docs/benchmarks.md, the soaks).
//! - `mimalloc`: measured, not chosen (a higher RSS in the same soak).
//! - neither (`--no-default-features`): the system allocator (glibc); then set
//!   `MALLOC_ARENA_MAX=2 MALLOC_MMAP_THRESHOLD_=131072 MALLOC_TRIM_THRESHOLD_=131072`.

#[cfg(all(feature = "jemalloc", feature = "mimalloc"))]
compile_error!("features `jemalloc` and `mimalloc` each choose the global allocator: enable one");

// Each choice is a unit struct, so `Chosen` names both the type and its value:
// `#[global_allocator] static A: Chosen = Chosen;`.
/// The allocator the binary installs.
#[cfg(all(feature = "mimalloc", not(feature = "jemalloc")))]
pub use mimalloc::MiMalloc as Chosen;
/// The allocator the binary installs.
#[cfg(not(any(feature = "jemalloc", feature = "mimalloc")))]
pub use std::alloc::System as Chosen;
/// The allocator the binary installs.
#[cfg(feature = "jemalloc")]
pub use tikv_jemallocator::Jemalloc as Chosen;

/// The chosen allocator's name, for logs and the benches' tables.
pub const NAME: &str = if cfg!(feature = "jemalloc") {
    "jemalloc (background_thread, dirty_decay_ms:1000, oversize_threshold:256 KiB)"
} else if cfg!(feature = "mimalloc") {
    "mimalloc"
} else {
    "system (glibc)"
};

/// jemalloc's options, built into the binary (the environment's `_RJEM_MALLOC_CONF` is read
/// after them and still wins). `background_thread:true` purges freed pages on a thread of
/// its own, so an idle daemon gives memory back too (without it only later allocations run
/// the purge); `dirty_decay_ms:1000` lets a freed page be reused for a second before it goes
/// back to the OS. At 0 every large free was an `madvise` and the next allocation faulted
/// in fresh zeroed pages: each flush's buffers, and with two threads a TLB shootdown as
/// well. `oversize_threshold:262144` keeps the old behaviour for allocations of 256 KiB and
/// more (jemalloc's oversize arena purges at once): a hash table's old half, freed as it
/// doubles, does not add to a growing index's peak RSS (`ingest_cost`, `redis_ingest`,
/// `lora_names`, docs/benchmarks.md).
pub const JEMALLOC_CONF: &std::ffi::CStr =
    c"background_thread:true,dirty_decay_ms:1000,oversize_threshold:262144";

/// jemalloc reads this symbol at its first allocation (`malloc_conf`, prefixed `_rjem_` by
/// tikv-jemalloc-sys on this platform); each program that includes this file exports it once.
#[cfg(feature = "jemalloc")]
#[allow(non_upper_case_globals)]
#[export_name = "_rjem_malloc_conf"]
pub static malloc_conf: Option<&'static std::ffi::c_char> =
    // SAFETY: a 'static, NUL-terminated C string; jemalloc only reads it.
    Some(unsafe { &*JEMALLOC_CONF.as_ptr() });

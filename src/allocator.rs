//! The global allocator the `kvindex` binary installs, chosen at build time by cargo feature
//! (issue 14, item 5). It lives in the library so that the binary, the memory benches and the
//! examples that measure the daemon in process (soaks, load and warm-start figures) install
//! the same one; the library itself installs none.
//!
//! - `jemalloc` (default): `tikv-jemallocator`, with [`JEMALLOC_CONF`] built in. In a churn
//!   soak with Redis it kept RSS at 35–57 MiB over a 21–42 MiB live heap for ten minutes,
//!   where glibc's defaults ratcheted to 70 MiB in three minutes (92 MiB in ten); it returns freed
//!   pages at once, which glibc does only after `malloc_trim` (README, Benchmarks).
//! - `mimalloc`: measured, not chosen (RSS 74–95 MiB in the same soak).
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
    "jemalloc (dirty_decay_ms:0)"
} else if cfg!(feature = "mimalloc") {
    "mimalloc"
} else {
    "system (glibc)"
};

/// jemalloc's options, built into the binary (the environment's `_RJEM_MALLOC_CONF` is read
/// after them and still wins). `dirty_decay_ms:0`: return freed pages to the OS at once instead
/// of keeping them for 10 s. With the default, pages freed by a burst of removes stayed
/// resident until later allocations ran the decay (lora_names: 51–66 MiB after removing every
/// block, against 3.6–5.4 MiB with this), and an idle daemon runs none. The cost did not show
/// in ingest time per block (lora_names, decode_index).
pub const JEMALLOC_CONF: &std::ffi::CStr = c"dirty_decay_ms:0";

/// jemalloc reads this symbol at its first allocation (`malloc_conf`, prefixed `_rjem_` by
/// tikv-jemalloc-sys on this platform). rustc links exported symbols of dependencies, so the
/// binary, benches and examples all get it from here.
#[cfg(feature = "jemalloc")]
#[allow(non_upper_case_globals)]
#[export_name = "_rjem_malloc_conf"]
pub static malloc_conf: Option<&'static std::ffi::c_char> =
    // SAFETY: a 'static, NUL-terminated C string; jemalloc only reads it.
    Some(unsafe { &*JEMALLOC_CONF.as_ptr() });

//! PD pairing, 1 prefill group × 5 decodes, top 5, with a counting scorer: ns per call and
//! heap allocations per call (counted by a global allocator), memoized vs naive.
//!
//! Run: `cargo bench --bench pd`

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

use criterion::{criterion_group, Criterion};
use kvindex::score::{schedule, schedule_unmemoized, DecodeCandidate, Scorer};

/// Counts every allocation made by the process.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Scores by the digits in the pod name; counts calls.
struct CountingScorer {
    calls: u64,
}

impl Scorer for CountingScorer {
    fn score(&mut self, pods: &[&str], out: &mut [f64]) {
        self.calls += 1;
        for (p, o) in pods.iter().zip(out.iter_mut()) {
            *o = p
                .bytes()
                .filter(u8::is_ascii_digit)
                .map(|b| f64::from(b - b'0'))
                .sum();
        }
    }
}

const DECODES: [&str; 5] = [
    "decode-1.ns",
    "decode-2.ns",
    "decode-3.ns",
    "decode-4.ns",
    "decode-5.ns",
];
const PREFILLS: [&str; 1] = ["prefill-0.ns"];

fn decodes() -> Vec<DecodeCandidate<'static>> {
    DECODES
        .iter()
        .map(|pod| DecodeCandidate {
            pod,
            group: "group-a",
            score: None,
        })
        .collect()
}

fn allocations_per_call(memoized: bool) -> (f64, f64) {
    let decodes = decodes();
    let groups: [(&str, &[&str]); 1] = [("group-a", &PREFILLS)];
    let mut scorer = CountingScorer { calls: 0 };
    let calls = 10_000u64;
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for _ in 0..calls {
        let pairs = if memoized {
            schedule(&decodes, groups.as_slice(), 5, &mut scorer)
        } else {
            schedule_unmemoized(&decodes, groups.as_slice(), 5, &mut scorer)
        };
        black_box(pairs.ok());
    }
    let allocs = ALLOCATIONS.load(Ordering::Relaxed) - before;
    (
        allocs as f64 / calls as f64,
        scorer.calls as f64 / calls as f64,
    )
}

fn bench(c: &mut Criterion) {
    let decodes = decodes();
    let groups: [(&str, &[&str]); 1] = [("group-a", &PREFILLS)];
    let mut g = c.benchmark_group("pd_1p5d_top5");
    g.bench_function("memoized", |b| {
        let mut scorer = CountingScorer { calls: 0 };
        b.iter(|| black_box(schedule(black_box(&decodes), groups.as_slice(), 5, &mut scorer).ok()));
    });
    g.bench_function("naive", |b| {
        let mut scorer = CountingScorer { calls: 0 };
        b.iter(|| {
            black_box(
                schedule_unmemoized(black_box(&decodes), groups.as_slice(), 5, &mut scorer).ok(),
            )
        });
    });
    g.finish();
}

criterion_group!(benches, bench);

fn main() {
    benches();
    criterion::Criterion::default()
        .configure_from_args()
        .final_summary();
    for memoized in [true, false] {
        let (allocs, calls) = allocations_per_call(memoized);
        println!(
            "pd_1p5d_top5/{}: {allocs:.2} allocations per call, {calls:.0} scorer calls per call",
            if memoized { "memoized" } else { "naive" }
        );
    }
}

//! Shared pieces of the property tests (`tests/prop_*.rs`): size generators biased toward the
//! boundaries where arithmetic overflows, the case count, the cap on buffers a test allocates,
//! and an allocator that aborts the test binary on any single allocation past 1 GiB, so that a
//! library call that allocates for a huge size before refusing it fails here instead of
//! succeeding lazily on an overcommitting host.

#![allow(dead_code)] // each test binary uses its own part of this module

use proptest::prelude::*;
use std::alloc::{GlobalAlloc, Layout, System};

/// The largest single allocation any property test (or the library under it) may make.
pub const MAX_ALLOC_BYTES: usize = 1 << 30;

/// [`System`] refusing any allocation past [`MAX_ALLOC_BYTES`] (a null return, which the
/// standard library turns into an abort naming the size).
pub struct CappedAlloc;

// SAFETY: every call is forwarded to `System` unchanged, or refused with null, which the
// `GlobalAlloc` contract allows.
unsafe impl GlobalAlloc for CappedAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > MAX_ALLOC_BYTES {
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() > MAX_ALLOC_BYTES {
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > MAX_ALLOC_BYTES {
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: CappedAlloc = CappedAlloc;

/// Elements per buffer up to which a validated problem is also run on the CPU backend.
pub const RUN_ELEMS: usize = 1 << 16;

/// Multiply-adds (or element visits) up to which a CPU run is made: the runs are in debug
/// builds, where this bounds the whole suite's time.
pub const RUN_WORK: usize = 1 << 12;

/// Cases per property: 10 000 unless `PROPTEST_CASES` says otherwise. (`with_cases` alone
/// would ignore the variable.) No regression files are written: a failure found here is
/// pinned by a unit test in the crate.
pub fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000);
    ProptestConfig { failure_persistence: None, ..ProptestConfig::with_cases(cases) }
}

/// Sizes where arithmetic breaks: 0, 1, powers of two and their neighbours up to 2⁶³ + 1,
/// `i32::MAX` ± 1, `u32::MAX`, `isize::MAX` ± 1 and `usize::MAX` (− 1).
pub fn boundary() -> impl Strategy<Value = usize> {
    prop_oneof![
        (0u32..64, -1isize..=1).prop_map(|(k, d)| (1usize << k).wrapping_add_signed(d)),
        prop::sample::select(vec![
            0,
            1,
            i32::MAX as usize - 1,
            i32::MAX as usize,
            i32::MAX as usize + 1,
            u32::MAX as usize,
            isize::MAX as usize,
            isize::MAX as usize + 1,
            usize::MAX - 1,
            usize::MAX,
        ]),
    ]
}

/// Any size, biased toward small and boundary values (a run is possible only when every
/// size of a problem is small, so small ones come most often).
pub fn size() -> impl Strategy<Value = usize> {
    prop_oneof![6 => 0usize..=9, 3 => boundary(), 1 => any::<usize>()]
}

/// As [`size`], with multiples of `m` (a rule of many problems) as likely as small values.
pub fn size_multiple(m: usize) -> impl Strategy<Value = usize> {
    prop_oneof![3 => (0usize..=4).prop_map(move |x| x * m), 3 => 0usize..=9, 2 => boundary(), 1 => any::<usize>()]
}

/// A float: mostly ordinary, sometimes 0, negative, tiny, huge, infinite or NaN.
pub fn scalar() -> impl Strategy<Value = f32> {
    prop_oneof![
        6 => 0.01f32..4.0,
        1 => prop::sample::select(vec![
            0.0,
            -0.0,
            -1.0,
            f32::MIN_POSITIVE,
            1e-45,
            f32::MAX,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN
        ]),
        1 => any::<f32>(),
    ]
}

/// Deterministic finite values in [-2, 2) for an input buffer of `n` elements.
pub fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        })
        .collect()
}

/// Whether every element is finite.
pub fn finite<T: gemmbridge::Element>(xs: &[T]) -> bool {
    xs.iter().all(|v| v.to_f32().is_finite())
}

/// Runs `$body` with `$t` the Rust element type of `$dtype` (f32, f16 or bf16).
#[macro_export]
macro_rules! with_elem {
    ($dtype:expr, $t:ident => $body:block) => {
        match $dtype {
            gemmbridge::DType::F32 => {
                type $t = f32;
                $body
            }
            gemmbridge::DType::F16 => {
                type $t = gemmbridge::half::f16;
                $body
            }
            gemmbridge::DType::BF16 => {
                type $t = gemmbridge::half::bf16;
                $body
            }
            other => panic!("no element type for {other}"),
        }
    };
}

/// f32, f16 or bf16.
pub fn dtype() -> impl Strategy<Value = gemmbridge::DType> {
    prop::sample::select(vec![gemmbridge::DType::F32, gemmbridge::DType::F16, gemmbridge::DType::BF16])
}

/// A buffer of `n` elements of `T` from [`values`].
pub fn buf<T: gemmbridge::Element>(n: usize, seed: u64) -> Vec<T> {
    values(n, seed).into_iter().map(T::from_f32).collect()
}

/// How many of 1000 values drawn from `strategy` (with a fixed seed) satisfy `runs`: the
/// property tests call it to show that their CPU runs happen at all (a generator that never
/// yields a runnable problem would make them pass without testing anything).
pub fn runnable<S: Strategy>(strategy: S, runs: impl Fn(&S::Value) -> bool) -> usize {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    (0..1000).filter(|_| runs(&strategy.new_tree(&mut runner).expect("a value").current())).count()
}

//! Engines created, used and dropped on many threads — half of them with work in flight —
//! beside a thread that captures and replays graphs in every capture mode
//! ([`gemmbridge_lab::churn`]). A teardown or creation race shows as a crash of this executable
//! (the crash reporter prints where) or as a failure in the report.

#[path = "../../gemmbridge/tests/common/crash.rs"]
mod crash;

use gemmbridge_lab::churn::{self, ChurnOptions};
use rand::Rng;

#[test]
#[ignore = "needs a CUDA GPU"]
fn engines_come_and_go_on_many_threads_beside_captures() {
    crash::install();
    let seed = std::env::var("GEMMBRIDGE_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::rng().random::<u64>());
    eprintln!("test seed {seed} (replay with GEMMBRIDGE_TEST_SEED={seed})");
    let opts = ChurnOptions { threads: 6, rounds: 8, seed, ..ChurnOptions::default() };
    let r = churn::run(&opts).expect("a CUDA GPU (this test is #[ignore]d; run it on a GPU machine)");
    eprintln!("{r:?}");
    assert!(r.passed(), "churn failures: {:#?}", r.failures);
    assert_eq!(r.gpus, opts.threads * opts.rounds, "every round ran");
    assert!(r.dropped_in_flight > 0 && r.gemms > 0 && r.captures > 0, "the churn did what it claims: {r:?}");
    if r.skipped.is_empty() {
        assert_eq!((r.fp8_gemms, r.convolutions, r.train_steps), (r.gpus, r.gpus, r.gpus));
    }
}

/// Out-of-range options are named errors before any GPU is touched (runs everywhere).
#[test]
fn options_out_of_range_are_refused_before_the_gpu() {
    for (threads, rounds, what) in [(0, 1, "churn threads"), (65, 1, "churn threads"), (1, 0, "churn rounds")] {
        let opts = ChurnOptions { threads, rounds, ..ChurnOptions::default() };
        match churn::run(&opts) {
            Err(gemmbridge::Error::OutOfRange { what: w, .. }) => assert_eq!(w, what),
            other => panic!("threads {threads} rounds {rounds}: {other:?}"),
        }
    }
}

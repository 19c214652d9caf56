//! Random normal inputs, generated in parallel on the host (fresh seed each run).

use gemmbridge::Element;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

/// `len` standard-normal values rounded to `T`, drawn on all host cores.
pub fn normal<T: Element>(len: usize) -> Vec<T> {
    let mut out = vec![T::default(); len];
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get()).min(32);
    let chunk = len.div_ceil(threads).max(1 << 16);
    let base: u64 = rand::rng().random();
    std::thread::scope(|s| {
        for (i, part) in out.chunks_mut(chunk).enumerate() {
            s.spawn(move || {
                let mut rng = SmallRng::seed_from_u64(base ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
                for v in part {
                    *v = T::from_f32(rng.sample(StandardNormal));
                }
            });
        }
    });
    out
}

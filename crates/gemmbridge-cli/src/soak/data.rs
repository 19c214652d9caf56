//! Host-side operands of the soak, type-erased: bytes of the element type the device buffer
//! holds, drawn once from a seed, and read back element by element as f64 for the reference.

use gemmbridge::half::{bf16, f16};
use gemmbridge::DType;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

/// Elements per independently seeded chunk (fixed, so a seed gives the same values on any
/// machine, whatever its core count).
const CHUNK: usize = 1 << 16;

/// `len` standard normals from `seed`, drawn on all host cores.
pub fn normals(len: usize, seed: u64) -> Vec<f32> {
    let mut out = vec![0.0f32; len];
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get()).min(32);
    let mut chunks: Vec<(usize, &mut [f32])> = out.chunks_mut(CHUNK).enumerate().collect();
    let per = chunks.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        while !chunks.is_empty() {
            let take = per.min(chunks.len());
            let mine: Vec<(usize, &mut [f32])> = chunks.drain(..take).collect();
            s.spawn(move || {
                for (i, part) in mine {
                    let mut rng = SmallRng::seed_from_u64(seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
                    for v in part.iter_mut() {
                        *v = rng.sample(StandardNormal);
                    }
                }
            });
        }
    });
    out
}

/// `values` rounded to `dtype`, as the little-endian bytes a device buffer of it holds.
pub fn encode(dtype: DType, values: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * dtype.size_bytes());
    for &v in values {
        match dtype {
            DType::F32 => out.extend_from_slice(&v.to_le_bytes()),
            DType::F16 => out.extend_from_slice(&f16::from_f32(v).to_bits().to_le_bytes()),
            DType::BF16 => out.extend_from_slice(&bf16::from_f32(v).to_bits().to_le_bytes()),
            // DType is non-exhaustive: a new dtype must be added here before the soak uses it
            other => unreachable!("soak has no encoding for dtype {other}"),
        }
    }
    out
}

/// A read-only view of encoded elements.
#[derive(Clone, Copy)]
pub struct View<'a> {
    dtype: DType,
    bytes: &'a [u8],
}

impl<'a> View<'a> {
    /// `bytes` holding elements of `dtype`.
    pub fn new(dtype: DType, bytes: &'a [u8]) -> View<'a> {
        View { dtype, bytes }
    }

    /// Number of elements.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.bytes.len() / self.dtype.size_bytes()
    }

    /// Element `i`, widened to f64 (exact).
    ///
    /// # Panics
    /// If `i` is out of range.
    #[inline]
    pub fn get(&self, i: usize) -> f64 {
        match self.dtype {
            DType::F32 => {
                let b = &self.bytes[4 * i..4 * i + 4];
                f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64
            }
            DType::F16 => f16::from_bits(u16::from_le_bytes([self.bytes[2 * i], self.bytes[2 * i + 1]])).to_f64(),
            DType::BF16 => bf16::from_bits(u16::from_le_bytes([self.bytes[2 * i], self.bytes[2 * i + 1]])).to_f64(),
            other => unreachable!("soak has no decoding for dtype {other}"),
        }
    }

    /// `len` elements from `start`, widened to f64.
    pub fn range(&self, start: usize, len: usize) -> Vec<f64> {
        (start..start + len).map(|i| self.get(i)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_round_trips_and_seeds_repeat() {
        let v = normals(3 * CHUNK + 5, 42);
        assert_eq!(v, normals(3 * CHUNK + 5, 42));
        assert_ne!(v[..8], normals(8, 43)[..]);
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let bytes = encode(dtype, &v[..100]);
            let view = View::new(dtype, &bytes);
            assert_eq!(view.len(), 100);
            for (i, &x) in v[..100].iter().enumerate() {
                let tol = if dtype == DType::F32 { 0.0 } else { 1e-2 * x.abs() as f64 + 1e-4 };
                assert!((view.get(i) - x as f64).abs() <= tol, "{dtype} {i}: {} vs {x}", view.get(i));
            }
        }
        // all-ones bytes (the poison the soak writes before a checked call) read as NaN
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            assert!(View::new(dtype, &[0xFF; 4]).get(0).is_nan(), "{dtype}");
        }
    }
}

//! The shapes of `bench/decode.json` (the file `bench/decode_peer.py` reads too), which the
//! decode-attention rows (`decode.rs`) and the decode-step rows (`decode_step.rs`) both run:
//! the problem, its page tables and the bytes a call must move.

use gemmbridge::paged::{PagedCache, PagedDecode};
use gemmbridge::DType;

/// One shape of `bench/decode.json`.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct Shape {
    pub name: String,
    pub b: usize,
    pub h_q: usize,
    pub h_kv: usize,
    pub d: usize,
    /// The longest sequence's keys (every sequence's without `lens`).
    pub s_kv: usize,
    pub page_size: usize,
    /// The keys each sequence holds (absent: `s_kv` each).
    #[serde(default)]
    pub lens: Option<Vec<i32>>,
}

impl Shape {
    /// The keys each sequence holds.
    pub fn lens(&self) -> Vec<i32> {
        self.lens.clone().unwrap_or_else(|| vec![self.s_kv as i32; self.b])
    }

    /// The problem in `dtype`: containers of exactly the pages the bucketed tables can name
    /// (`b·width`), the table width bucketed for `s_kv`; checked, with the shape's lengths.
    pub fn problem(&self, dtype: DType) -> anyhow::Result<PagedDecode> {
        let width = gemmbridge::paged::bucket_width(self.s_kv, self.page_size);
        let cache = PagedCache::new(self.b * width, self.page_size, (self.h_kv, self.d), dtype, (self.b, width));
        let p = PagedDecode::new(cache, self.h_q);
        p.validate()?;
        p.check_index(&self.tables(&p), &self.lens())?;
        Ok(p)
    }

    /// The page tables: page `j` of sequence `n` is page `j·b + n`.
    pub fn tables(&self, p: &PagedDecode) -> Vec<i32> {
        let (b, w) = (p.cache.batch, p.cache.table_width);
        (0..b * w).map(|i| ((i % w) * b + i / w) as i32).collect()
    }

    /// The bytes a call must move: the keys and values each sequence holds (`2·Σlens·h_kv·d`
    /// elements), q read and o written (`2·b·h_q·d`), in elements of `elem` bytes.
    pub fn bytes(&self, elem: usize) -> f64 {
        let held: f64 = self.lens().iter().map(|&l| l as f64).sum();
        let kv = 2.0 * held * (self.h_kv * self.d) as f64;
        (kv + 2.0 * (self.b * self.h_q * self.d) as f64) * elem as f64
    }
}

/// The shapes of `bench/decode.json`.
pub fn shapes() -> anyhow::Result<Vec<Shape>> {
    super::suite_shapes(include_str!("../../../../bench/decode.json"), "bench/decode.json")
}

//! [`PagedCache`]: the containers' and the tables' shapes, their rules, and the checks of host
//! page tables and lengths.

use super::{bad, bucket_width, MAX_INDEX, MAX_PAGE_SIZE, MIN_PAGE_SIZE};
use crate::attention::MAX_HEAD_DIM;
use crate::dtype::DType;
use crate::error::Result;

/// A paged KV cache as a call sees it: the two containers `[pages, h_kv, page_size, d]` (one
/// for the keys, one for the values, alike) and the shape of the batch's page table
/// `[batch, table_width]` (the [`crate::paged`] module documentation gives the layout). Made
/// with [`PagedCache::new`]; fields public to be read. Not checked when made (problems are
/// data): [`PagedCache::validate`] and every call check it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PagedCache {
    /// Pages in each container.
    pub pages: usize,
    /// Positions per page: a power of two from [`MIN_PAGE_SIZE`] to [`MAX_PAGE_SIZE`].
    pub page_size: usize,
    /// Key/value heads, `h_kv`.
    pub heads_kv: usize,
    /// Elements per head, `d`: a multiple of 8 up to [`MAX_HEAD_DIM`] (16-byte rows of
    /// half-precision elements, as cuDNN's attention engines need).
    pub head_dim: usize,
    /// The containers' element type: [`DType::F16`] or [`DType::BF16`] (what cuDNN's paged
    /// attention reads).
    pub dtype: DType,
    /// Sequences of the batch, `b`: rows of the page table.
    pub batch: usize,
    /// Entries of each sequence's table row (pages per sequence at most); a plan is built for
    /// one width ([`PagedCache::for_max_len`] buckets it).
    pub table_width: usize,
}

impl PagedCache {
    /// Containers of `pages` pages of `page_size` positions, `heads_kv` heads of `head_dim`
    /// elements, of `dtype`; a batch of `batch` sequences with tables `table_width` wide.
    pub fn new(
        pages: usize,
        page_size: usize,
        (heads_kv, head_dim): (usize, usize),
        dtype: DType,
        (batch, table_width): (usize, usize),
    ) -> PagedCache {
        PagedCache { pages, page_size, heads_kv, head_dim, dtype, batch, table_width }
    }

    /// The same with a batch of `batch` sequences and tables `table_width` wide.
    #[must_use]
    pub fn with_tables(self, batch: usize, table_width: usize) -> PagedCache {
        PagedCache { batch, table_width, ..self }
    }

    /// The same with the table width a plan should be built for when the longest sequence
    /// holds `max_len` positions: [`bucket_width`]`(max_len, page_size)`.
    #[must_use]
    pub fn for_max_len(self, max_len: usize) -> PagedCache {
        PagedCache { table_width: bucket_width(max_len, self.page_size), ..self }
    }

    /// Elements of one page: `h_kv·page_size·d` (saturating).
    pub fn page_elems(&self) -> usize {
        self.heads_kv.saturating_mul(self.page_size).saturating_mul(self.head_dim)
    }

    /// Elements each container must hold: `pages·h_kv·page_size·d` (saturating).
    pub fn container_elems(&self) -> usize {
        self.pages.saturating_mul(self.page_elems())
    }

    /// Entries of the page table: `batch·table_width` (saturating).
    pub fn table_elems(&self) -> usize {
        self.batch.saturating_mul(self.table_width)
    }

    /// The most positions a sequence can hold, the table's capacity: `table_width·page_size`
    /// (saturating). A decode plan is built for this maximum key length.
    pub fn max_len(&self) -> usize {
        self.table_width.saturating_mul(self.page_size)
    }

    /// Where element `e` of head `h` at slot `slot` of page `page` lies in a container.
    /// Arithmetic only, no bounds check: meaningful for indices within a cache that passes
    /// [`PagedCache::validate`].
    pub fn index(&self, page: usize, h: usize, slot: usize, e: usize) -> usize {
        ((page * self.heads_kv + h) * self.page_size + slot) * self.head_dim + e
    }

    /// The page and slot of sequence `n`'s position `p`: `(table[n, p / page_size],
    /// p mod page_size)`. No check: meaningful for tables and positions that passed
    /// [`PagedCache::check_tables`] and the length checks.
    pub fn locate(&self, tables: &[i32], n: usize, p: usize) -> (usize, usize) {
        let page = tables[n * self.table_width + p / self.page_size] as usize;
        (page, p % self.page_size)
    }

    /// A short description: `pages4096×16 h8 d128 bf16 tables[64×256]`.
    pub fn describe(&self) -> String {
        format!(
            "pages{}×{} h{} d{} {} tables[{}×{}]",
            self.pages, self.page_size, self.heads_kv, self.head_dim, self.dtype, self.batch, self.table_width
        )
    }

    /// Checks every rule of the cache (nothing is launched):
    /// - the element type f16 or bf16;
    /// - the page size a power of two from [`MIN_PAGE_SIZE`] to [`MAX_PAGE_SIZE`];
    /// - at least one key/value head; the head dimension a multiple of 8 from 8 to
    ///   [`MAX_HEAD_DIM`];
    /// - at least one page, one sequence and one table entry per sequence;
    /// - the pages, the heads, the table's entries `batch·table_width` and its capacity
    ///   `table_width·page_size` at most [`MAX_INDEX`] (`int32` tables and lengths);
    /// - a container's bytes addressable (at most `isize::MAX`).
    ///
    /// # Errors
    /// [`crate::Error::PagedCache`] naming the rule and the values that break it.
    pub fn validate(&self) -> Result<()> {
        let d = || self.describe();
        if !matches!(self.dtype, DType::F16 | DType::BF16) {
            return bad("the element type is not f16 or bf16", format!("{} ({})", self.dtype, d()));
        }
        let p = self.page_size;
        if !p.is_power_of_two() || !(MIN_PAGE_SIZE..=MAX_PAGE_SIZE).contains(&p) {
            return bad("the page size is not a power of two from 16 to 256", format!("page_size = {p} ({})", d()));
        }
        if self.heads_kv == 0 || self.head_dim == 0 || !self.head_dim.is_multiple_of(8) || self.head_dim > MAX_HEAD_DIM
        {
            return bad(
                "there is no head, or the head dimension is not a multiple of 8 up to 256",
                format!("h_kv = {}, d = {} ({})", self.heads_kv, self.head_dim, d()),
            );
        }
        for (name, v) in [("pages", self.pages), ("batch", self.batch), ("table_width", self.table_width)] {
            if v == 0 {
                return bad("a count is zero", format!("{name} = 0 ({})", d()));
            }
        }
        for (name, v) in [
            ("pages", self.pages),
            ("h_kv", self.heads_kv),
            ("batch·table_width", self.table_elems()),
            ("table_width·page_size", self.max_len()),
        ] {
            if v > MAX_INDEX {
                return bad("a count is above 2³¹ − 1", format!("{name} = {v} > {MAX_INDEX} ({})", d()));
            }
        }
        let bytes = self.pages.checked_mul(self.page_elems()).and_then(|e| e.checked_mul(self.dtype.size_bytes()));
        if bytes.is_none_or(|b| b > isize::MAX as usize) {
            return bad("a container's bytes overflow", d());
        }
        Ok(())
    }

    /// Checks a host page table: exactly `batch·table_width` entries, each in `0..pages`.
    ///
    /// # Errors
    /// [`crate::Error::PagedCache`] for a table of another size, or naming the first entry
    /// that is negative or past the container (its sequence, its place in the row, its value).
    pub fn check_tables(&self, tables: &[i32]) -> Result<()> {
        if tables.len() != self.table_elems() {
            return bad(
                "the page table does not have batch·table_width entries",
                format!("{} entries for {} × {} ({})", tables.len(), self.batch, self.table_width, self.describe()),
            );
        }
        let Some((i, &page)) = tables.iter().enumerate().find(|&(_, &t)| t < 0 || t as usize >= self.pages) else {
            return Ok(());
        };
        let (n, j) = (i / self.table_width, i % self.table_width);
        let detail = format!("table[{n}, {j}] = {page}, pages = {} ({})", self.pages, self.describe());
        if page < 0 {
            bad("a page-table entry is negative", detail)
        } else {
            bad("a page-table entry is past the container", detail)
        }
    }

    /// Checks host lengths: exactly `batch` of them (`name` in messages), each from `min` to
    /// [`PagedCache::max_len`].
    ///
    /// # Errors
    /// [`crate::Error::PagedCache`] for a count other than `batch`, or naming the first
    /// length outside the range.
    pub(crate) fn check_lens(&self, name: &str, lens: &[i32], min: i32) -> Result<()> {
        if lens.len() != self.batch {
            return bad(
                "there is not one length per sequence",
                format!("{name} has {} for batch = {} ({})", lens.len(), self.batch, self.describe()),
            );
        }
        if let Some((n, &l)) = lens.iter().enumerate().find(|&(_, &l)| l < min || l as usize > self.max_len()) {
            let detail = format!(
                "{name}[{n}] = {l}, table capacity {} = {} × {} ({})",
                self.max_len(),
                self.table_width,
                self.page_size,
                self.describe()
            );
            return if l < min {
                bad(if min > 0 { "a length is below 1" } else { "a length is negative" }, detail)
            } else {
                bad("a length is past its table's pages", detail)
            };
        }
        Ok(())
    }
}

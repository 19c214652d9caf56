//! [`PagedAppend`]: a step's new key and value rows written into their pages, the source's
//! layout and the checks of a call's host tables and lengths ([`HostIndex`]).

use super::{bad, PagedCache, MAX_INDEX};
use crate::error::Result;

/// One append: `seq` new rows per sequence of keys and of values, each row `h_kv` heads of `d`
/// elements, written at each sequence's current length. The sources `k_new` and `v_new` are
/// `[b, seq, h_kv, d]` with token rows `ld` elements apart (token `i` of sequence `n` at
/// `(n·seq + i)·ld`, head `h` of it `h·d` further: [`PagedAppend::source_index`]), so the key and
/// value heads of a fused QKV projection's output are read in place (`ld` = the projection's
/// row, the views starting `h_q·d` and `(h_q + h_kv)·d` elements in). Decoding appends one row
/// per sequence ([`PagedAppend::decode`]); a prefill appends up to `seq` ([`HostIndex::new_lens`]:
/// rows past a sequence's count are padding, not read).
///
/// Row `i < new_lens[n]` of sequence `n` goes to position `p = lens[n] + i`: slot
/// `p mod page_size` of page `table[n, p / page_size]`, in both containers. Nothing else of the
/// containers is written; the lengths are not changed (the caller advances them by the rows
/// appended). Fields public to be read; checked by [`PagedAppend::validate`] and every call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PagedAppend {
    /// The cache written and the batch's table shape.
    pub cache: PagedCache,
    /// Rows per sequence in the sources (1 for decoding).
    pub seq: usize,
    /// Elements from one source token row to the next, at least `h_kv·d`.
    pub ld: usize,
}

/// A call's page table and lengths on the host (`int32` each), checked by
/// [`PagedAppend::check_index`] before anything is written.
#[derive(Clone, Copy, Debug)]
pub struct HostIndex<'a> {
    /// The page table `[batch, table_width]`, row-major.
    pub tables: &'a [i32],
    /// Positions each sequence holds before the call, `[batch]`.
    pub lens: &'a [i32],
    /// Rows each sequence appends, `[batch]`, each in `0..=seq`; `None`: every sequence
    /// appends `seq`. (Decode attention reads no such count.)
    pub new_lens: Option<&'a [i32]>,
}

impl PagedAppend {
    /// One row per sequence (decoding), rows contiguous: `ld = h_kv·d`.
    pub fn decode(cache: PagedCache) -> PagedAppend {
        PagedAppend::prefill(cache, 1)
    }

    /// Up to `seq` rows per sequence, rows contiguous: `ld = h_kv·d`.
    pub fn prefill(cache: PagedCache, seq: usize) -> PagedAppend {
        PagedAppend { cache, seq, ld: cache.heads_kv.saturating_mul(cache.head_dim) }
    }

    /// The same with source token rows `ld` elements apart.
    #[must_use]
    pub fn with_ld(self, ld: usize) -> PagedAppend {
        PagedAppend { ld, ..self }
    }

    /// Elements of one token's heads, `h_kv·d` (saturating).
    pub fn row_elems(&self) -> usize {
        self.cache.heads_kv.saturating_mul(self.cache.head_dim)
    }

    /// Token rows of each source, `batch·seq` (saturating).
    pub fn tokens(&self) -> usize {
        self.cache.batch.saturating_mul(self.seq)
    }

    /// Elements each source must hold: `(batch·seq − 1)·ld + h_kv·d` (saturating).
    pub fn source_elems(&self) -> usize {
        match self.tokens() {
            0 => 0,
            t => (t - 1).saturating_mul(self.ld).saturating_add(self.row_elems()),
        }
    }

    /// Where element `e` of head `h` of token `i` of sequence `n` lies in a source. Arithmetic
    /// only, no bounds check.
    pub fn source_index(&self, n: usize, i: usize, h: usize, e: usize) -> usize {
        (n * self.seq + i) * self.ld + h * self.cache.head_dim + e
    }

    /// Rows sequence `n` appends: `new_lens[n]`, or `seq`. No check.
    pub fn new_rows(&self, index: &HostIndex, n: usize) -> usize {
        index.new_lens.map_or(self.seq, |l| l[n] as usize)
    }

    /// Bytes one call moves with every row appended: each of `batch·seq` rows of keys and of
    /// values read once and written once, `4·batch·seq·h_kv·d·elem` (the tables and lengths
    /// not counted).
    pub fn bytes_moved(&self) -> f64 {
        4.0 * self.tokens() as f64 * self.row_elems() as f64 * self.cache.dtype.size_bytes() as f64
    }

    /// A short description: `append s1 ld1024 into pages4096×16 h8 d128 bf16 tables[64×256]`.
    pub fn describe(&self) -> String {
        format!("append s{} ld{} into {}", self.seq, self.ld, self.cache.describe())
    }

    /// Checks every rule: the cache's ([`PagedCache::validate`]); `seq` from 1 to
    /// [`MAX_INDEX`]; `ld ≥ h_kv·d`; the sources' extent addressable.
    ///
    /// # Errors
    /// [`crate::Error::PagedCache`] naming the rule and the values.
    pub fn validate(&self) -> Result<()> {
        self.cache.validate()?;
        if self.seq == 0 || self.seq > MAX_INDEX {
            return bad(
                "the rows per sequence are not from 1 to 2³¹ − 1",
                format!("seq = {} ({})", self.seq, self.describe()),
            );
        }
        if self.ld < self.row_elems() {
            return bad(
                "the sources' leading dimension is less than a token's heads",
                format!("ld = {}, h_kv·d = {} ({})", self.ld, self.row_elems(), self.describe()),
            );
        }
        let extent = (self.tokens() - 1).checked_mul(self.ld).and_then(|x| x.checked_add(self.row_elems()));
        if extent.is_none_or(|x| x.checked_mul(self.cache.dtype.size_bytes()).is_none_or(|b| b > isize::MAX as usize)) {
            return bad("the sources' extent overflows", self.describe());
        }
        Ok(())
    }

    /// Checks a call's host tables and lengths against the problem (which passed
    /// [`PagedAppend::validate`]): the table ([`PagedCache::check_tables`]); one length per
    /// sequence, none negative; one count per sequence in `0..=seq`; `lens[n] + new_lens[n]`
    /// within the table's capacity; and no live position on two places — a sequence's *live
    /// entries* are those holding its positions after the call, `0..⌈(lens[n] + new_lens[n]) /
    /// page_size⌉`:
    /// - no page twice among one sequence's live entries (two of its positions would share a
    ///   slot);
    /// - no page the call writes among another sequence's live entries, written by both (the
    ///   writes would race) or held by the other (its keys would be overwritten).
    ///
    /// Pages no call writes may be held by several sequences (a common prefix, read-only: a
    /// sequence that goes on from a shared page whose last slots are free copies it to a page
    /// of its own first). Entries past a sequence's live ones are not restricted. The cost is
    /// a sort of the live entries on the host, `O(P log P)` for `P = Σ ⌈(lens[n] + new_lens[n]) /
    /// page_size⌉`.
    ///
    /// # Errors
    /// [`crate::Error::PagedCache`] naming the rule, the sequences, the entries, the page and
    /// the positions; nothing is written by any call that checks first.
    pub fn check_index(&self, index: &HostIndex) -> Result<()> {
        let c = &self.cache;
        c.check_tables(index.tables)?;
        c.check_lens("lens", index.lens, 0)?;
        if let Some(new) = index.new_lens {
            if new.len() != c.batch {
                return bad(
                    "there is not one length per sequence",
                    format!("new_lens has {} for batch = {} ({})", new.len(), c.batch, self.describe()),
                );
            }
            if let Some((n, &l)) = new.iter().enumerate().find(|&(_, &l)| l < 0 || l as usize > self.seq) {
                return bad(
                    "a sequence appends a negative count or more rows than the sources hold",
                    format!("new_lens[{n}] = {l}, seq = {} ({})", self.seq, self.describe()),
                );
            }
        }
        for n in 0..c.batch {
            let (len, new) = (index.lens[n] as usize, self.new_rows(index, n));
            if len + new > c.max_len() {
                return bad(
                    "a length is past its table's pages",
                    format!(
                        "lens[{n}] + {new} new = {}, table capacity {} = {} × {} ({})",
                        len + new,
                        c.max_len(),
                        c.table_width,
                        c.page_size,
                        self.describe()
                    ),
                );
            }
        }
        self.check_pages(index)
    }

    /// The pages each sequence holds after the call and the pages the call writes: no page twice
    /// in one row's live entries, and no page written that another row's live entries hold.
    fn check_pages(&self, index: &HostIndex) -> Result<()> {
        let c = &self.cache;
        // (page, sequence, entry, written) for every live entry: entries 0..⌈(len + new)/page_size⌉
        let mut live: Vec<(i32, usize, usize, bool)> = Vec::new();
        for n in 0..c.batch {
            let (len, new) = (index.lens[n] as usize, self.new_rows(index, n));
            for j in 0..(len + new).div_ceil(c.page_size) {
                live.push((index.tables[n * c.table_width + j], n, j, new > 0 && j >= len / c.page_size));
            }
        }
        live.sort_unstable();
        let held = |n: usize, j: usize| {
            let end = (index.lens[n] as usize + self.new_rows(index, n)).min((j + 1) * c.page_size);
            format!("positions {}..{end}", j * c.page_size)
        };
        for group in live.chunk_by(|a, b| a.0 == b.0) {
            let page = group[0].0;
            if let Some(w) = group.windows(2).find(|w| w[0].1 == w[1].1) {
                let ((_, n, j1, _), (_, _, j2, _)) = (w[0], w[1]);
                return bad(
                    "a sequence's table row holds one page twice among its live entries",
                    format!(
                        "table[{n}, {j1}] = table[{n}, {j2}] = {page}, {} and {} ({})",
                        held(n, j1),
                        held(n, j2),
                        self.describe()
                    ),
                );
            }
            let Some(&(_, n1, j1, _)) = group.iter().find(|e| e.3) else { continue };
            let Some(&(_, n2, j2, w2)) = group.iter().find(|e| e.1 != n1) else { continue };
            let detail = format!(
                "table[{n1}, {j1}] = table[{n2}, {j2}] = {page}: sequence {n1} writes it, sequence {n2} holds {} ({})",
                held(n2, j2),
                self.describe()
            );
            return if w2 {
                bad("two sequences write one page in one append", detail)
            } else {
                bad("a page written here holds live positions of another sequence", detail)
            };
        }
        Ok(())
    }
}

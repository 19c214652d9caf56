//! [`PagedKvCache`]: a paged key/value cache whose pages are candle tensors, its sequences, and
//! the steps that write and read it ([`crate::paged_ops`] holds the operations).

use candle_core::{DType, Device, Result, Tensor};
use gemmbridge::paged::{HostIndex, PagedAppend, PagedCache, MAX_PAGE_SIZE, MIN_PAGE_SIZE};

/// A paged key/value cache for a decoder of `layers` layers, in gemmbridge's paged layout
/// (`gemmbridge::paged`): per layer one candle tensor `[2, pages, h_kv, page_size, d]`, the keys'
/// container at index 0 and the values' at 1 (each `[pages, h_kv, page_size, d]`, "HND" pages,
/// the layout cuDNN's paged attention reads). A page holds `page_size` consecutive positions of
/// one sequence for every key/value head; pages are handed to sequences as they grow and
/// returned when a sequence is removed, so sequences of any lengths share one pool.
///
/// A step over a batch of sequences ([`PagedKvCache::begin`]) fixes each one's new rows, takes
/// the pages they need, and uploads the batch's page table and lengths (one host-to-device copy
/// of `int32`s); then, for each layer, [`PagedKvCache::append`] writes the step's keys and
/// values, [`PagedKvCache::attend`] runs decode attention through the page table, and
/// [`PagedKvCache::rope_qkv`] rotates a fused QKV projection at the sequences' positions;
/// [`PagedKvCache::commit`] then advances the lengths. Served on CUDA by gemmbridge's append
/// kernel, its RoPE kernel and cuDNN's paged decode attention (with the `cuda` feature), on the
/// CPU by gemmbridge's CPU backend. The page table's width is bucketed to a power of two
/// (`gemmbridge::paged::bucket_width`), so one cuDNN plan serves every step until the longest
/// sequence of the batch doubles.
///
/// Keys and values are f16 or bf16 (cuDNN's paged attention reads no other type); the head
/// dimension a multiple of 8 up to 256; `page_size` a power of two from 16 to 256. The
/// containers are plain candle tensors ([`PagedKvCache::containers`]): they can be read,
/// saved, or written by the caller's own code.
///
/// ```
/// use candle_core::{DType, Device, Tensor};
/// use gemmbridge_candle::PagedKvCache;
/// let dev = Device::Cpu;
/// // 1 layer, 2 key/value heads of 8, 16 pages of 16 positions
/// let mut cache = PagedKvCache::new(1, (2, 8), DType::BF16, (16, 16), &dev)?;
/// let seq = cache.add_sequence();
/// cache.begin(&[seq], &[3], 3)?; // a step appending 3 rows to it
/// let k = Tensor::ones((1, 3, 2, 8), DType::BF16, &dev)?; // [b, s, h_kv, d]
/// cache.append(0, &k, &k)?;
/// cache.commit()?;
/// cache.begin(&[seq], &[1], 1)?; // a decode step
/// cache.append(0, &k.narrow(1, 0, 1)?, &k.narrow(1, 0, 1)?)?;
/// let q = Tensor::ones((1, 4, 8), DType::BF16, &dev)?; // [b, h_q, d]: 4 query heads
/// let o = cache.attend(0, &q, None)?; // over the 4 positions held after the append
/// cache.commit()?;
/// assert_eq!((o.dims(), cache.len(seq)?), (&[1, 4, 8][..], 4));
/// # Ok::<(), candle_core::Error>(())
/// ```
pub struct PagedKvCache {
    /// Per layer `[2, pages, h_kv, page_size, d]`.
    layers: Vec<Tensor>,
    /// The containers' shape; `batch` and `table_width` are the current step's.
    geometry: PagedCache,
    /// Sequences by id: `None` once removed.
    seqs: Vec<Option<Seq>>,
    /// Pages no sequence holds, taken from the end.
    free: Vec<i32>,
    /// The step begun and not yet committed.
    step: Option<Step>,
}

/// One sequence's pages (in position order) and the positions it holds.
#[derive(Clone, Debug, Default)]
struct Seq {
    pages: Vec<i32>,
    len: usize,
}

/// A step's index on the host: the page table `[b, width]`, the held lengths before the step,
/// the lengths after it, the rows each appends, and every source row's position `[b, seq]` (a
/// padding row's is 0).
pub(crate) struct StepIndex {
    pub(crate) tables: Vec<i32>,
    pub(crate) held: Vec<i32>,
    pub(crate) after: Vec<i32>,
    pub(crate) rows: Vec<i32>,
    pub(crate) positions: Vec<i32>,
}

/// A step begun by [`PagedKvCache::begin`].
pub(crate) struct Step {
    /// The sequences of the batch, by id.
    pub(crate) ids: Vec<usize>,
    /// Rows each appends (`≤ seq`).
    pub(crate) rows: Vec<usize>,
    /// Rows per sequence in the step's sources.
    pub(crate) seq: usize,
    /// The containers' shape with this batch's tables.
    pub(crate) cache: PagedCache,
    /// Host copies of the index (shared with the operations).
    pub(crate) host: std::sync::Arc<StepIndex>,
    /// The same five as one `int32` tensor on the cache's device, each part from a 16-byte
    /// boundary (gemmbridge's device index buffers are 16-byte aligned), at [`Step::at`].
    pub(crate) index: Tensor,
    /// Where each of the five parts starts in [`Step::index`], in elements.
    pub(crate) at: [usize; 5],
    /// Pages each sequence took from the pool for the step (given back by a cancel).
    taken: Vec<usize>,
    /// Which layers' rows were appended.
    appended: std::sync::Mutex<Vec<bool>>,
    /// The largest position of the step's rows (RoPE's tables must reach past it).
    pub(crate) max_position: i32,
}

impl Step {
    /// Which layers' rows were appended (a poisoned lock still holds the flags).
    pub(crate) fn appended_layers(&self) -> Vec<bool> {
        self.appended.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Records that layer `l` appended the step's rows.
    pub(crate) fn mark_appended(&self, l: usize) {
        if let Some(a) = self.appended.lock().unwrap_or_else(|e| e.into_inner()).get_mut(l) {
            *a = true;
        }
    }

    /// The five parts of the index laid out from 16-byte boundaries: the buffer and where each
    /// part starts.
    fn pack(parts: [&[i32]; 5]) -> (Vec<i32>, [usize; 5]) {
        let (mut all, mut at) = (Vec::new(), [0; 5]);
        for (i, p) in parts.iter().enumerate() {
            at[i] = all.len();
            all.extend_from_slice(p);
            all.resize(all.len().next_multiple_of(4), 0);
        }
        (all, at)
    }
}

impl PagedKvCache {
    /// An empty cache of `layers` layers, `(h_kv, d)` key/value heads of `d` elements, of
    /// `dtype`, `(pages, page_size)`: `pages` pages of `page_size` positions, on `dev`. The
    /// containers are zeros (`2·layers·pages·h_kv·page_size·d` elements).
    ///
    /// # Errors
    /// candle's `Error::Msg` naming the value: no layer; a dtype other than f16 and bf16; a
    /// page size that is not a power of two from 16 to 256; no head or a head dimension that is
    /// not a multiple of 8 up to 256; no page, or more than 2³¹ − 1; containers whose bytes
    /// overflow, or (on the CPU) that the allocator refuses; candle's allocation error on CUDA.
    pub fn new(
        layers: usize,
        (heads_kv, head_dim): (usize, usize),
        dtype: DType,
        (pages, page_size): (usize, usize),
        dev: &Device,
    ) -> Result<PagedKvCache> {
        let ours = match dtype {
            DType::F16 => gemmbridge::DType::F16,
            DType::BF16 => gemmbridge::DType::BF16,
            other => candle_core::bail!("PagedKvCache: keys and values are f16 or bf16, not {other:?}"),
        };
        if layers == 0 {
            candle_core::bail!("PagedKvCache: layers = 0");
        }
        if !page_size.is_power_of_two() || !(MIN_PAGE_SIZE..=MAX_PAGE_SIZE).contains(&page_size) {
            candle_core::bail!("PagedKvCache: page_size = {page_size} is not a power of two from 16 to 256");
        }
        let geometry = PagedCache::new(pages, page_size, (heads_kv, head_dim), ours, (1, 1));
        geometry.validate().map_err(crate::cpu::wrap)?;
        let bytes = [2, pages, heads_kv, page_size, head_dim, dtype.size_in_bytes()]
            .iter()
            .try_fold(layers, |a, &b| a.checked_mul(b))
            .filter(|&b| b <= isize::MAX as usize);
        let Some(bytes) = bytes else {
            candle_core::bail!(
                "PagedKvCache: {layers} layers of 2·{pages}·{heads_kv}·{page_size}·{head_dim} elements overflow"
            );
        };
        if dev.is_cpu() {
            // candle's CPU allocation aborts the process when it fails; ask the allocator first
            let mut probe: Vec<u8> = Vec::new();
            if probe.try_reserve_exact(bytes).is_err() {
                candle_core::bail!("PagedKvCache: {bytes} bytes of containers cannot be allocated on the CPU");
            }
        }
        let layers = (0..layers)
            .map(|_| Tensor::zeros((2, pages, heads_kv, page_size, head_dim), dtype, dev))
            .collect::<Result<Vec<_>>>()?;
        let free = (0..pages as i32).rev().collect();
        Ok(PagedKvCache { layers, geometry, seqs: Vec::new(), free, step: None })
    }

    /// A new, empty sequence; its id (ids are not reused).
    pub fn add_sequence(&mut self) -> usize {
        self.seqs.push(Some(Seq::default()));
        self.seqs.len() - 1
    }

    /// Removes sequence `id`, returning its pages to the pool.
    ///
    /// # Errors
    /// An id that is not a live sequence, or a step in progress that includes it.
    pub fn remove_sequence(&mut self, id: usize) -> Result<()> {
        if self.step.as_ref().is_some_and(|s| s.ids.contains(&id)) {
            candle_core::bail!("PagedKvCache: sequence {id} is in the step in progress (commit it first)");
        }
        let seq = self.seq(id)?.clone();
        self.free.extend(seq.pages.iter().rev());
        self.seqs[id] = None;
        Ok(())
    }

    /// Positions sequence `id` holds.
    ///
    /// # Errors
    /// An id that is not a live sequence.
    pub fn len(&self, id: usize) -> Result<usize> {
        Ok(self.seq(id)?.len)
    }

    /// Pages no sequence holds.
    pub fn free_pages(&self) -> usize {
        self.free.len()
    }

    /// Layers, `(h_kv, d)`, `(pages, page_size)` and the keys' and values' dtype.
    pub fn shape(&self) -> (usize, (usize, usize), (usize, usize), DType) {
        let g = &self.geometry;
        (self.layers.len(), (g.heads_kv, g.head_dim), (g.pages, g.page_size), self.layers[0].dtype())
    }

    /// Layer `l`'s containers `[2, pages, h_kv, page_size, d]` (keys at 0, values at 1).
    ///
    /// # Errors
    /// A layer past the cache's.
    pub fn containers(&self, l: usize) -> Result<&Tensor> {
        self.layers
            .get(l)
            .ok_or_else(|| candle_core::Error::Msg(format!("PagedKvCache: layer {l} of {} layers", self.layers.len())))
    }

    /// Begins a step over the sequences `ids` (the batch's rows, in order; no id twice), each
    /// appending `rows[n] ≤ seq` new positions from sources of `seq` rows per sequence (rows
    /// past `rows[n]` are padding, never written): takes the pages the new positions need from
    /// the pool and uploads the batch's page table, lengths and positions. Until
    /// [`PagedKvCache::commit`], every layer's [`append`](PagedKvCache::append),
    /// [`attend`](PagedKvCache::attend) and [`rope_qkv`](PagedKvCache::rope_qkv) use them.
    ///
    /// # Errors
    /// candle's `Error::Msg`, before anything changes: a step already begun; no sequence, an id
    /// that is not live or named twice, `rows` not one per id, a count above `seq` or `seq` 0;
    /// `seq` or a sequence's positions after the step past the pool's `pages·page_size`; fewer
    /// free pages than the step needs (both counts named).
    pub fn begin(&mut self, ids: &[usize], rows: &[usize], seq: usize) -> Result<()> {
        self.check_begin(ids, rows, seq)?;
        let need: usize =
            ids.iter().zip(rows).map(|(&id, &r)| self.pages_needed(id, r)).try_fold(0usize, |a, n| n.map(|n| a + n))?;
        if need > self.free.len() {
            candle_core::bail!("PagedKvCache: the step needs {need} more pages, {} are free", self.free.len());
        }
        let mut taken = Vec::with_capacity(ids.len());
        for (&id, &r) in ids.iter().zip(rows) {
            let grow = self.pages_needed(id, r)?;
            let new = self.free.split_off(self.free.len() - grow);
            let s = self.seqs[id].as_mut().expect("checked live");
            s.pages.extend(new.into_iter().rev());
            taken.push(grow);
        }
        let lens: Vec<usize> = ids.iter().map(|&id| self.seqs[id].as_ref().map_or(0, |s| s.len)).collect();
        let longest = lens.iter().zip(rows).map(|(l, r)| l + r).max().unwrap_or(0);
        let cache = self.geometry.with_tables(ids.len(), 1).for_max_len(longest);
        let w = cache.table_width;
        let mut tables = vec![0i32; ids.len() * w];
        for (n, &id) in ids.iter().enumerate() {
            // a sequence holds exactly the pages its positions after the step need (≤ w)
            let pages = &self.seqs[id].as_ref().expect("checked live").pages;
            tables[n * w..n * w + pages.len()].copy_from_slice(pages);
        }
        let held: Vec<i32> = lens.iter().map(|&l| l as i32).collect();
        let after: Vec<i32> = lens.iter().zip(rows).map(|(&l, &r)| (l + r) as i32).collect();
        let positions: Vec<i32> = held
            .iter()
            .zip(rows)
            .flat_map(|(&h, &r)| (0..seq).map(move |i| if i < r { h + i as i32 } else { 0 }))
            .collect();
        let rows32: Vec<i32> = rows.iter().map(|&r| r as i32).collect();
        // the index is the step's for every layer: checked here once, not at each call (the
        // device launches read it as checked). Our own bookkeeping makes it valid; a failure
        // would be a defect here, and the step's pages go back.
        let append = PagedAppend::prefill(cache, seq);
        let checked = cache
            .validate()
            .and_then(|()| append.check_index(&HostIndex { tables: &tables, lens: &held, new_lens: Some(&rows32) }));
        if let Err(e) = checked {
            self.give_back(ids, &taken);
            return Err(crate::cpu::wrap(e));
        }
        let max_position = positions.iter().copied().max().unwrap_or(0);
        let (all, at) = Step::pack([&tables, &held, &after, &rows32, &positions]);
        let n = all.len();
        let index = Tensor::from_vec(all, n, self.layers[0].device())?;
        let (ids, rows) = (ids.to_vec(), rows.to_vec());
        let host = std::sync::Arc::new(StepIndex { tables, held, after, rows: rows32, positions });
        let appended = std::sync::Mutex::new(vec![false; self.layers.len()]);
        self.step = Some(Step { ids, rows, seq, cache, host, index, at, taken, appended, max_position });
        Ok(())
    }

    /// Ends the step begun: each sequence of the batch now holds its appended rows.
    ///
    /// # Errors
    /// No step begun; a layer whose rows were not appended (named; the step stays begun).
    pub fn commit(&mut self) -> Result<()> {
        let Some(step) = self.step.as_ref() else { candle_core::bail!("PagedKvCache: commit without a step begun") };
        let missing: Vec<usize> =
            step.appended_layers().iter().enumerate().filter(|(_, &a)| !a).map(|(l, _)| l).collect();
        if !missing.is_empty() {
            candle_core::bail!(
                "PagedKvCache: commit before layers {missing:?} appended the step's rows (append them, or cancel the step)"
            );
        }
        let step = self.step.take().expect("checked above");
        for (&id, &r) in step.ids.iter().zip(&step.rows) {
            if let Some(s) = self.seqs[id].as_mut() {
                s.len += r;
            }
        }
        Ok(())
    }

    /// Drops the step begun, if any, without advancing any length (after an operation of the
    /// step failed): the pages it took go back to the pool, and the rows it wrote lie past the
    /// lengths, where the next step overwrites them.
    pub fn cancel(&mut self) {
        let Some(step) = self.step.take() else { return };
        self.give_back(&step.ids, &step.taken);
    }

    /// Returns to the pool the last `taken[n]` pages of each sequence `ids[n]`.
    fn give_back(&mut self, ids: &[usize], taken: &[usize]) {
        for (&id, &grow) in ids.iter().zip(taken) {
            if let Some(s) = self.seqs[id].as_mut() {
                let back = s.pages.split_off(s.pages.len() - grow);
                self.free.extend(back.into_iter().rev());
            }
        }
    }

    /// The step begun, for the operations.
    pub(crate) fn step(&self, what: &str) -> Result<&Step> {
        self.step.as_ref().ok_or_else(|| candle_core::Error::Msg(format!("PagedKvCache: {what} without a step begun")))
    }

    /// A live sequence.
    fn seq(&self, id: usize) -> Result<&Seq> {
        match self.seqs.get(id) {
            Some(Some(s)) => Ok(s),
            _ => candle_core::bail!("PagedKvCache: {id} is not a live sequence ({} made)", self.seqs.len()),
        }
    }

    /// Pages sequence `id` must take to hold `rows` more positions.
    fn pages_needed(&self, id: usize, rows: usize) -> Result<usize> {
        let s = self.seq(id)?;
        let end = s.len.checked_add(rows).filter(|&e| e <= self.capacity()).ok_or_else(|| {
            candle_core::Error::Msg(format!(
                "PagedKvCache: sequence {id} holds {} positions; {rows} more pass the pool's {} positions",
                s.len,
                self.capacity()
            ))
        })?;
        Ok(end.div_ceil(self.geometry.page_size).saturating_sub(s.pages.len()))
    }

    /// Positions the whole pool holds: `pages·page_size`.
    fn capacity(&self) -> usize {
        self.geometry.pages.saturating_mul(self.geometry.page_size)
    }

    /// [`PagedKvCache::begin`]'s rules on its arguments.
    fn check_begin(&self, ids: &[usize], rows: &[usize], seq: usize) -> Result<()> {
        if self.step.is_some() {
            candle_core::bail!("PagedKvCache: a step is already begun (commit it first)");
        }
        if ids.is_empty() || ids.len() != rows.len() || seq == 0 {
            candle_core::bail!(
                "PagedKvCache: a step needs one row count per sequence and seq ≥ 1, got {} ids, {} counts, seq {seq}",
                ids.len(),
                rows.len()
            );
        }
        if seq > self.capacity() {
            candle_core::bail!(
                "PagedKvCache: sources of {seq} rows per sequence pass the pool's {} positions",
                self.capacity()
            );
        }
        for (n, (&id, &r)) in ids.iter().zip(rows).enumerate() {
            self.seq(id)?;
            if ids[..n].contains(&id) {
                candle_core::bail!("PagedKvCache: sequence {id} is named twice in one step");
            }
            if r > seq {
                candle_core::bail!("PagedKvCache: sequence {id} appends {r} rows from sources of {seq} rows");
            }
        }
        Ok(())
    }
}

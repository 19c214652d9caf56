//! The router's outputs on the device ([`MoeRouting`]) and their capacity layout
//! ([`MoeRouting::pad`]): every expert given the same number of rows, so that the expert
//! products are equal groups (a strided batch) rather than ragged ones.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};

use crate::cuda::api::checks::same_context;
use crate::cuda::api::engine::Gpu;
use crate::cuda::status;
use crate::error::{Error, Result, Which};
use crate::moe::MoeRouter;

/// What [`GpuMoe::route`](crate::cuda::GpuMoe::route) writes, on the device (see [`MoeRouter`]), read through its
/// accessors (the buffers are the engine's to write, so their lengths and values stay what the
/// kernels need): `ids` and `weights` `[S·k]` in token order, `starts` `[E]`, `index`, `ks` and
/// `slots` `[rows]` in expert order, `pos` `[S·k]` (each slot's row in expert order).
///
/// Expert order is the sorted layout after [`GpuMoe::route`](crate::cuda::GpuMoe::route) (rows = S·k, expert e's rows
/// from `starts[e]`), or the capacity layout after [`MoeRouting::pad`] (rows = E·cap, expert
/// e's rows from e·cap, pad rows marked −1 in `index`, `ks` and `slots`).
pub struct MoeRouting {
    pub(super) router: MoeRouter,
    pub(super) ids: CudaSlice<i32>,
    pub(super) weights: CudaSlice<f32>,
    pub(super) starts: CudaSlice<i32>,
    pub(super) counts: CudaSlice<i32>,
    /// index, ks, slots, pos of the sorted layout (`[S·k]` each).
    pub(super) sorted: [CudaSlice<i32>; 4],
    /// index, ks, slots (`[E·cap]`) and pos (`[S·k]`) of the capacity layout.
    padded: [CudaSlice<i32>; 4],
    /// The capacity of the layout the accessors give, `None` for the sorted one.
    pub(super) cap: Option<usize>,
}

impl MoeRouting {
    /// Buffers for `router` on `gpu`'s stream.
    ///
    /// # Errors
    /// As [`MoeRouter::validate`]; [`Error::Driver`] from the allocations.
    pub fn new(gpu: &Gpu, router: &MoeRouter) -> Result<MoeRouting> {
        router.validate()?;
        let s = gpu.stream();
        let (r, e, (_, counts)) = (router.rows(), router.experts, router.sort_blocks());
        let i32s = |n: usize| s.alloc_zeros::<i32>(n).map_err(status::driver("cuMemAllocAsync"));
        Ok(MoeRouting {
            router: *router,
            ids: i32s(r)?,
            weights: s.alloc_zeros::<f32>(r).map_err(status::driver("cuMemAllocAsync"))?,
            starts: i32s(e)?,
            counts: i32s(counts)?,
            sorted: [i32s(r)?, i32s(r)?, i32s(r)?, i32s(r)?],
            padded: [i32s(1)?, i32s(1)?, i32s(1)?, i32s(r)?],
            cap: None,
        })
    }

    /// The router these buffers are for.
    pub fn router(&self) -> &MoeRouter {
        &self.router
    }

    /// Each token's experts, largest logit first (`[S·k]`, token order).
    pub fn ids(&self) -> &CudaSlice<i32> {
        &self.ids
    }

    /// Their weights (`[S·k]` f32, token order).
    pub fn weights(&self) -> &CudaSlice<f32> {
        &self.weights
    }

    /// Where each expert's rows start in the sorted layout (`[E]`), also after
    /// [`MoeRouting::pad`]: they still give each expert's own rows (what the capacity keeps or
    /// drops), but the padded rows' products are equal groups of the capacity (a strided batch,
    /// or starts e·cap), never these starts.
    pub fn starts(&self) -> &CudaSlice<i32> {
        &self.starts
    }

    /// The token of each row in expert order (`[rows]`; −1 on a pad row).
    pub fn index(&self) -> &CudaSlice<i32> {
        self.layout(0)
    }

    /// The slot of each row in expert order among its token's k (`[rows]`; −1 on a pad row).
    pub fn ks(&self) -> &CudaSlice<i32> {
        self.layout(1)
    }

    /// `index·k + ks` of each row in expert order: its row in token order (`[rows]`; −1 on a
    /// pad row).
    pub fn slots(&self) -> &CudaSlice<i32> {
        self.layout(2)
    }

    /// The row in expert order of each slot (`[S·k]`; −1 for a slot the capacity dropped).
    pub fn pos(&self) -> &CudaSlice<i32> {
        self.layout(3)
    }

    /// The capacity of the layout the accessors give: `None` for the sorted layout.
    pub fn capacity(&self) -> Option<usize> {
        self.cap
    }

    /// Rows in expert order: S·k sorted, E·cap in the capacity layout.
    pub fn rows(&self) -> usize {
        self.cap.map_or(self.router.rows(), |c| c * self.router.experts)
    }

    fn layout(&self, i: usize) -> &CudaSlice<i32> {
        if self.cap.is_some() {
            &self.padded[i]
        } else {
            &self.sorted[i]
        }
    }

    /// Lays the last routing out with `capacity` rows per expert, on `gpu`'s stream: expert
    /// e's i-th row moves to row e·cap + i, the rows past an expert's own are pad rows (−1 in
    /// `index`, `ks`, `slots`: [`GpuMoe::gather`](crate::cuda::GpuMoe::gather) writes zeros there, and
    /// [`GpuMoe::combine_backward`](crate::cuda::GpuMoe::combine_backward) zeros them in its output gradient), and `pos` names each
    /// slot's new row. An expert with more rows than `capacity` keeps its first `capacity`;
    /// the slots of the rest are dropped (`pos` −1: they add nothing to the combine and get
    /// no gradient), as a capacity factor does. The product of each expert is then one equal
    /// group of a strided batch ([`crate::moe::capacity`] says when that pays). Reads the
    /// sorted layout, so it may be called again with another capacity; the next
    /// [`GpuMoe::route`](crate::cuda::GpuMoe::route) returns to the sorted layout. Enqueued, not waited for.
    ///
    /// # Errors
    /// Before anything is enqueued: [`Error::GroupedShape`] for a capacity of 0 or one whose
    /// E·cap rows pass 2³¹ − 1; [`Error::WrongContext`]; [`Error::Driver`] from an allocation
    /// (a capacity of another size than the last one's reallocates three `[E·cap]` buffers).
    pub fn pad(&mut self, gpu: &Gpu, capacity: usize) -> Result<()> {
        let (e, r) = (self.router.experts, self.router.rows());
        let rows = e.checked_mul(capacity).filter(|&n| capacity > 0 && n <= crate::MAX_DIM);
        let Some(rows) = rows else {
            let detail = format!("capacity {capacity}, {e} experts");
            return Err(Error::GroupedShape {
                what: "a capacity layout needs 1 ≤ E·cap ≤ 2³¹ − 1 rows", detail
            });
        };
        same_context(Which::Grouped("routing"), self.ids.stream(), gpu.context())?;
        let s = gpu.stream();
        if self.padded[0].len() != rows {
            for b in &mut self.padded[..3] {
                *b = s.alloc_zeros::<i32>(rows).map_err(status::driver("cuMemAllocAsync"))?;
            }
        }
        let (starts, _a) = self.starts.device_ptr(s);
        let (ids, _b) = self.ids.device_ptr(s);
        let [(index, _c), (ks, _d), (slots, _e), (pos, _f)] = self.sorted.each_ref().map(|b| b.device_ptr(s));
        let [p0, p1, p2, p3] = &mut self.padded;
        let [(index_p, _g), (ks_p, _h), (slots_p, _i), (pos_p, _j)] = [p0, p1, p2, p3].map(|b| b.device_ptr_mut(s));
        // SAFETY: the sorted buffers hold S·k int32 (starts E) as MoeRouting::new made them,
        // the padded ones E·cap (pos S·k) as allocated above, apart; E·cap and S·k fit an
        // int32 (checked above; MoeRouter::validate); all borrowed until the launch.
        gpu.with_moe_kernels(|k| unsafe {
            k.pad((r, e, capacity), [starts, index, ks, slots, pos, ids], [index_p, ks_p, slots_p, pos_p])
        })?;
        self.cap = Some(capacity);
        Ok(())
    }
}

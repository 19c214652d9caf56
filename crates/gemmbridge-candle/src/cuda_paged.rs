//! The CUDA path of a [`crate::PagedKvCache`] step: gemmbridge's append kernel, cuDNN's paged
//! decode attention and gemmbridge's RoPE kernel on candle's buffers, on the stream of the
//! storage given, the page table, lengths and positions read from the step's `int32` index on
//! the device (no host copy per call, no synchronisation). Each call takes its gemmbridge
//! problem and, as plain data, that index tensor and where its five parts (tables, lengths held,
//! lengths after, rows, positions) start in it.

use candle_core::cuda::cudarc::driver::{CudaSlice, CudaView, DevicePtr, DeviceRepr};
use candle_core::cuda::CudaStorageSlice;
use candle_core::{CudaStorage, Layout, Result, Shape, Tensor};
use gemmbridge::cuda::PageIndex;
use gemmbridge::half::{bf16, f16};
use gemmbridge::layer_ops::{Positions, Rope, RopeDirection, RopeTables};
use gemmbridge::paged::{PagedAppend, PagedDecode};
use gemmbridge::Element;

use crate::cpu::wrap;
use crate::cuda::{engine, output};

/// The step's `int32` index buffer on the device, viewed from its layout's start.
fn index<'a>(idx: &'a CudaStorage, l: &Layout) -> Result<CudaView<'a, i32>> {
    Ok(idx.as_cuda_slice::<i32>()?.slice(l.start_offset()..))
}

/// The append `op`: the destination's keys' and values' halves, the sources at their starts,
/// the page table and lengths read from the step's index tensor at `at`.
pub(crate) fn append(
    op: &PagedAppend,
    (step_index, at): (&Tensor, [usize; 5]),
    (dst, dl): (&mut CudaStorage, &Layout),
    [(k, kl), (v, vl)]: [(&CudaStorage, &Layout); 2],
) -> Result<()> {
    let gpu = engine(&dst.device)?;
    let (ix, il) = step_index.storage_and_layout();
    let candle_core::Storage::Cuda(ix) = &*ix else { candle_core::bail!("paged append: the index is not on CUDA") };
    let ix = index(ix, il)?;
    let c = &op.cache;
    let [t, h, _, r, _] = at;
    let (tables, held, rows) = (ix.slice(t..t + c.table_elems()), ix.slice(h..h + c.batch), ix.slice(r..r + c.batch));
    // SAFETY: the values were made by the cache's own bookkeeping and checked on the host
    // (`PagedAppend::check_index`) before this call: entries within the containers, lengths
    // within the tables, no page written that another sequence holds.
    let pi = unsafe { PageIndex::device(&tables, &held, Some(&rows)) };
    let e = c.container_elems();
    let (ds, ks, vs) = (dl.start_offset(), kl.start_offset(), vl.start_offset());
    macro_rules! run {
        ($t:ty, $d:expr, $k:expr, $v:expr) => {{
            let mut d = $d.slice_mut(ds..ds + 2 * e);
            let (mut kc, mut vc) = d.split_at_mut(e);
            let (k, v) = ($k.slice(ks..), $v.slice(vs..));
            gpu.paged().append::<$t>(op, (&k, &v), (&mut kc, &mut vc), pi).map_err(wrap)
        }};
    }
    match (&mut dst.slice, &k.slice, &v.slice) {
        (CudaStorageSlice::F16(d), CudaStorageSlice::F16(k), CudaStorageSlice::F16(v)) => run!(f16, d, k, v),
        (CudaStorageSlice::BF16(d), CudaStorageSlice::BF16(k), CudaStorageSlice::BF16(v)) => run!(bf16, d, k, v),
        _ => candle_core::bail!("paged append: f16 or bf16 containers and sources of one dtype expected"),
    }
}

/// Decode attention `op`: `o[b, h_q, d]`, dense; the page table and lengths read from the
/// step's index `ix` at `at`.
pub(crate) fn attend(
    op: &PagedDecode,
    at: [usize; 5],
    (q, ql): (&CudaStorage, &Layout),
    (c, cl): (&CudaStorage, &Layout),
    (ix, il): (&CudaStorage, &Layout),
) -> Result<(CudaStorage, Shape)> {
    let dev = &q.device;
    let ix = index(ix, il)?;
    let g = &op.cache;
    let (t, after) = (at[0], at[2]);
    let (tables, lens) = (ix.slice(t..t + g.table_elems()), ix.slice(after..after + g.batch));
    let e = g.container_elems();
    let shape = ql.shape().clone();
    fn run<T: Element + DeviceRepr>(
        op: &PagedDecode,
        dev: &candle_core::cuda::CudaDevice,
        (q, c): (CudaView<'_, T>, CudaView<'_, T>),
        (tables, lens): (&CudaView<'_, i32>, &CudaView<'_, i32>),
        e: usize,
    ) -> Result<CudaSlice<T>> {
        let gpu = engine(dev)?;
        let mut o = output::<T>(dev, op.query_elems())?;
        let (k, v) = (c.slice(0..e), c.slice(e..2 * e));
        // SAFETY: the values were made by the cache's bookkeeping and checked on the host
        // (`PagedDecode::check_index`): entries within the containers, lengths from 1 to the
        // tables' capacity.
        let pi = unsafe { PageIndex::device(tables, lens, None) };
        gpu.paged().decode::<T>(op, &q, (&k, &v), &mut o, pi).map_err(wrap)?;
        Ok(o)
    }
    let (qs, cs) = (ql.start_offset(), cl.start_offset());
    let out = match (&q.slice, &c.slice) {
        (CudaStorageSlice::F16(q), CudaStorageSlice::F16(c)) => CudaStorage::wrap_cuda_slice(
            run::<f16>(op, dev, (q.slice(qs..), c.slice(cs..)), (&tables, &lens), e)?,
            dev.clone(),
        ),
        (CudaStorageSlice::BF16(q), CudaStorageSlice::BF16(c)) => CudaStorage::wrap_cuda_slice(
            run::<bf16>(op, dev, (q.slice(qs..), c.slice(cs..)), (&tables, &lens), e)?,
            dev.clone(),
        ),
        _ => candle_core::bail!("paged decode: f16 or bf16 q and containers of one dtype expected"),
    };
    Ok((out, shape))
}

/// RoPE `op` on the fused QKV buffer in place, at the step's positions on the device (read
/// from the step's index tensor at `at`).
pub(crate) fn rope_qkv(
    op: &Rope,
    (step_index, at): (&Tensor, [usize; 5]),
    (dst, dl): (&mut CudaStorage, &Layout),
    [(c, cl), (s, sl)]: [(&CudaStorage, &Layout); 2],
) -> Result<()> {
    let gpu = engine(&dst.device)?;
    let (ix, il) = step_index.storage_and_layout();
    let candle_core::Storage::Cuda(ix) = &*ix else { candle_core::bail!("rope_qkv: the index is not on CUDA") };
    let ix = index(ix, il)?;
    let p = at[4];
    let positions = ix.slice(p..p + op.tokens());
    let (cos, sin) =
        (c.as_cuda_slice::<f32>()?.slice(cl.start_offset()..), s.as_cuda_slice::<f32>()?.slice(sl.start_offset()..));
    let tables = Some(RopeTables { cos: &cos as &dyn DevicePtr<f32>, sin: &sin as &dyn DevicePtr<f32> });
    let given: Positions<&dyn DevicePtr<i32>> = Positions::Given(&positions);
    let (dir, o) = (RopeDirection::Forward, dl.start_offset());
    let res = match &mut dst.slice {
        CudaStorageSlice::F16(x) => gpu.rope::<f16>(op, dir, &mut x.slice_mut(o..), given, tables),
        CudaStorageSlice::BF16(x) => gpu.rope::<bf16>(op, dir, &mut x.slice_mut(o..), given, tables),
        _ => candle_core::bail!("rope_qkv: f16 or bf16 qkv expected"),
    };
    res.map_err(wrap)
}

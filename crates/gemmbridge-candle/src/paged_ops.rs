//! The operations of a [`PagedKvCache`] step: the append of a layer's keys and values, decode
//! attention through the page table, and RoPE on a fused QKV projection at the step's positions.
//! Each is a candle custom operation; the CPU path is here, the CUDA path in `cuda_paged`.

use std::sync::Arc;

use candle_core::{CpuStorage, CustomOp3, InplaceOp3, Layout, Result, Shape, Tensor};
use gemmbridge::attention::{Attention, AttnMask};
use gemmbridge::layer_ops::{Positions, Rope, RopeDirection, RopeTables};
use gemmbridge::paged::{HostIndex, PagedAppend, PagedDecode};
use gemmbridge::Element;

use crate::cpu::wrap;
use crate::kv_cache::{PagedKvCache, Step, StepIndex};

impl PagedKvCache {
    /// Writes layer `l`'s keys and values of the step begun: `k_new`, `v_new`
    /// `[b, seq, h_kv, d]` (the step's batch and source rows, the cache's dtype), row `i <
    /// rows[n]` of sequence `n` at its position `held[n] + i` through its pages; padding rows are
    /// not read. Read in place where the two share one token-row stride over contiguous heads
    /// (the key and value heads of a fused QKV projection's output `[b, seq, (h_q + 2·h_kv)·d]`,
    /// reshaped and narrowed, are); otherwise copied contiguous first. A copy: the containers
    /// hold the sources' bits. Nothing else of the containers is written.
    ///
    /// # Errors
    /// candle's `Error::Msg` before anything is written: no step begun; a layer past the
    /// cache's; sources of another shape, dtype or device than the step's and the cache's;
    /// gemmbridge's errors, wrapped.
    pub fn append(&self, l: usize, k_new: &Tensor, v_new: &Tensor) -> Result<()> {
        let step = self.step("append")?;
        let (_, (hkv, d), _, dtype) = self.shape();
        let want = [step.ids.len(), step.seq, hkv, d];
        for (name, t) in [("k_new", k_new), ("v_new", v_new)] {
            if t.dims() != want || t.dtype() != dtype || !t.device().same_device(self.containers(l)?.device()) {
                candle_core::bail!(
                    "PagedKvCache::append: {name} is {:?} {:?}, the step needs {want:?} {dtype:?} on the cache's device",
                    t.dims(),
                    t.dtype()
                );
            }
        }
        let (k, v) = match (row_stride(k_new.layout(), step), row_stride(v_new.layout(), step)) {
            (Some(a), Some(b)) if a == b => (k_new.clone(), v_new.clone()),
            _ => (k_new.contiguous()?, v_new.contiguous()?),
        };
        let ld = row_stride(k.layout(), step).unwrap_or(hkv * d);
        // the step's index was checked when it began (`PagedAppend::check_index`)
        let op = PagedAppend::prefill(step.cache, step.seq).with_ld(ld);
        op.validate().map_err(wrap)?;
        let append = AppendOp { op, host: step.host.clone(), index: step.index.clone(), at: step.at };
        self.containers(l)?.inplace_op3(&k, &v, &append)?;
        step.mark_appended(l);
        Ok(())
    }

    /// Decode attention for layer `l` over the step's sequences: `q[b, h_q, d]` (one query row
    /// per sequence, `h_q` a multiple of `h_kv`, the cache's dtype; copied contiguous if it is
    /// not) attends to the `held[n] + rows[n]` positions each sequence holds after the step's
    /// append (GQA: query head `hq` reads key/value head `hq / (h_q / h_kv)`; no mask beyond
    /// the lengths); `o[b, h_q, d]`, contiguous. `scale`: `1/√d` unless given. Served by cuDNN's
    /// paged attention on CUDA (f32 softmax and accumulation), by gemmbridge's CPU attention
    /// on the keys and values gathered on the CPU (f32, one rounding). Append the layer's keys
    /// and values first: the step's own position is read.
    ///
    /// # Errors
    /// candle's `Error::Msg` before anything runs: no step begun, a layer past the cache's or
    /// one that has not appended the step's rows, a sequence holding no position, q of another
    /// shape, dtype or device, a scale not finite and positive; gemmbridge's errors,
    /// wrapped (`h_q` not a multiple of `h_kv`, no cuDNN engine).
    pub fn attend(&self, l: usize, q: &Tensor, scale: Option<f32>) -> Result<Tensor> {
        let step = self.step("attend")?;
        let (_, (_, d), _, dtype) = self.shape();
        let c = self.containers(l)?;
        let (b, hq) = (step.ids.len(), q.dims().get(1).copied().unwrap_or(0));
        if q.dims() != [b, hq, d] || q.dtype() != dtype || !q.device().same_device(c.device()) {
            candle_core::bail!(
                "PagedKvCache::attend: q is {:?} {:?}, expected [{b}, h_q, {d}] {dtype:?}",
                q.dims(),
                q.dtype()
            );
        }
        let mut op = PagedDecode::new(step.cache, hq);
        if let Some(s) = scale {
            if !(s.is_finite() && s > 0.0) {
                candle_core::bail!("PagedKvCache::attend: scale = {s:?} is not finite and positive");
            }
            op = op.with_scale(s);
        }
        if !step.appended_layers().get(l).copied().unwrap_or(false) {
            candle_core::bail!("PagedKvCache::attend: layer {l} has not appended the step's rows (append first)");
        }
        if let Some(n) = step.host.after.iter().position(|&a| a < 1) {
            candle_core::bail!("PagedKvCache::attend: sequence {} holds no position after the step", step.ids[n]);
        }
        op.validate().map_err(wrap)?;
        // the tables were checked when the step began; the lengths after it are ≥ 1 (above) and
        // within the tables' capacity (the step's width holds its longest sequence)
        let q = q.contiguous()?;
        q.apply_op3_no_bwd(c, &step.index, &AttendOp { op, host: step.host.clone(), at: step.at })
    }

    /// RoPE (rotate-half pairs) on a fused QKV projection's output, in place, at the step's
    /// positions: `qkv[b, seq, (h_q + 2·h_kv)·d]` contiguous (the step's batch and rows, the
    /// cache's dtype and heads), its `h_q` query heads and `h_kv` key heads rotated, the value
    /// heads left; row `i` of sequence `n` at position `held[n] + i` (padding rows at 0).
    /// `cos`, `sin`: `[max_pos, d/2]` f32 contiguous, row `p` position `p`'s cosines and sines.
    /// The rotation is f32, rounded once (gemmbridge's RoPE kernel on CUDA, its CPU twin on the
    /// CPU: the same bits). In place: every tensor sharing `qkv`'s storage sees the rotation;
    /// candle records no gradient through it.
    ///
    /// # Errors
    /// candle's `Error::Msg` before anything is written: no step begun; qkv not contiguous or
    /// of another shape, dtype or device; tables not `[max_pos, d/2]` f32 contiguous; a position
    /// past `max_pos`; gemmbridge's errors, wrapped.
    pub fn rope_qkv(&self, qkv: &Tensor, heads_q: usize, (cos, sin): (&Tensor, &Tensor)) -> Result<()> {
        let step = self.step("rope_qkv")?;
        let (_, (hkv, d), _, dtype) = self.shape();
        let w = (heads_q + 2 * hkv) * d;
        let want = [step.ids.len(), step.seq, w];
        if qkv.dims() != want || qkv.dtype() != dtype || !qkv.is_contiguous() {
            candle_core::bail!(
                "PagedKvCache::rope_qkv: qkv is {:?} {:?} (contiguous: {}), the step needs {want:?} {dtype:?} contiguous",
                qkv.dims(),
                qkv.dtype(),
                qkv.is_contiguous()
            );
        }
        let max_pos = cos.dims().first().copied().unwrap_or(0);
        for (name, t) in [("cos", cos), ("sin", sin)] {
            if t.dims() != [max_pos, d / 2] || t.dtype() != candle_core::DType::F32 || !t.is_contiguous() {
                candle_core::bail!(
                    "PagedKvCache::rope_qkv: {name} is {:?} {:?} (contiguous: {}); both tables must be [max_pos, {}] f32 contiguous, max_pos = {max_pos} from cos",
                    t.dims(),
                    t.dtype(),
                    t.is_contiguous(),
                    d / 2
                );
            }
        }
        let op = Rope::new(step.ids.len(), step.seq, (heads_q, hkv), d).with_tables(max_pos);
        op.check_call(true).map_err(wrap)?;
        if step.max_position as usize >= max_pos {
            candle_core::bail!(
                "PagedKvCache::rope_qkv: the step reaches position {}, past the tables' {max_pos} rows",
                step.max_position
            );
        }
        let rope = RopeQkvOp { op, host: step.host.clone(), index: step.index.clone(), at: step.at };
        qkv.inplace_op3(cos, sin, &rope)
    }
}

/// The one token-row stride `ld` of a `[b, seq, h_kv, d]` source whose heads are contiguous and
/// whose sequences' rows follow one another (`(n·seq + i)·ld`), if it has one.
fn row_stride(l: &Layout, step: &Step) -> Option<usize> {
    let (dims, st) = (l.dims(), l.stride());
    let [b, seq, h, d] = [dims[0], dims[1], dims[2], dims[3]];
    let ld = if seq > 1 {
        st[1]
    } else if b > 1 {
        st[0]
    } else {
        h * d
    };
    let ok = (d == 1 || st[3] == 1) && (h == 1 || st[2] == d) && (b == 1 || st[0] == seq * ld) && ld >= h * d;
    (ok && b == step.ids.len()).then_some(ld)
}

/// The append into one layer's containers (the destination `[2, pages, h_kv, page_size, d]`).
pub(crate) struct AppendOp {
    pub(crate) op: PagedAppend,
    pub(crate) host: Arc<StepIndex>,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) index: Tensor,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) at: [usize; 5],
}

impl InplaceOp3 for AppendOp {
    fn name(&self) -> &'static str {
        "gemmbridge-paged-append"
    }

    fn cpu_fwd(
        &self,
        dst: &mut CpuStorage,
        dl: &Layout,
        k: &CpuStorage,
        kl: &Layout,
        v: &CpuStorage,
        vl: &Layout,
    ) -> Result<()> {
        let (i, c) = (&self.host, &self.op.cache);
        let host = HostIndex { tables: &i.tables, lens: &i.held, new_lens: Some(&i.rows) };
        let e = c.container_elems();
        let (ks, vs) = (kl.start_offset(), vl.start_offset());
        macro_rules! run {
            ($d:expr, $k:expr, $v:expr) => {{
                let (kc, vc) = $d[dl.start_offset()..].split_at_mut(e);
                gemmbridge::cpu::paged_append(&self.op, (&$k[ks..], &$v[vs..]), (kc, &mut vc[..e]), &host).map_err(wrap)
            }};
        }
        match (dst, k, v) {
            (CpuStorage::F16(d), CpuStorage::F16(k), CpuStorage::F16(v)) => run!(d, k, v),
            (CpuStorage::BF16(d), CpuStorage::BF16(k), CpuStorage::BF16(v)) => run!(d, k, v),
            _ => candle_core::bail!("paged append: f16 or bf16 containers and sources of one dtype expected"),
        }
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        dst: &mut candle_core::CudaStorage,
        dl: &Layout,
        k: &candle_core::CudaStorage,
        kl: &Layout,
        v: &candle_core::CudaStorage,
        vl: &Layout,
    ) -> Result<()> {
        crate::cuda_paged::append(&self.op, (&self.index, self.at), (dst, dl), [(k, kl), (v, vl)])
    }
}

/// Decode attention: q, the layer's containers, the step's index.
pub(crate) struct AttendOp {
    pub(crate) op: PagedDecode,
    pub(crate) host: Arc<StepIndex>,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) at: [usize; 5],
}

impl CustomOp3 for AttendOp {
    fn name(&self) -> &'static str {
        "gemmbridge-paged-decode"
    }

    fn cpu_fwd(
        &self,
        q: &CpuStorage,
        ql: &Layout,
        c: &CpuStorage,
        cl: &Layout,
        _idx: &CpuStorage,
        _il: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let tables = &self.host.tables;
        let shape = ql.shape().clone();
        let out = match (q, c) {
            (CpuStorage::F16(q), CpuStorage::F16(c)) => CpuStorage::F16(self.cpu::<gemmbridge::half::f16>(
                &q[ql.start_offset()..],
                &c[cl.start_offset()..],
                tables,
            )?),
            (CpuStorage::BF16(q), CpuStorage::BF16(c)) => CpuStorage::BF16(self.cpu::<gemmbridge::half::bf16>(
                &q[ql.start_offset()..],
                &c[cl.start_offset()..],
                tables,
            )?),
            _ => candle_core::bail!("paged decode: f16 or bf16 q and containers of one dtype expected"),
        };
        Ok((out, shape))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        q: &candle_core::CudaStorage,
        ql: &Layout,
        c: &candle_core::CudaStorage,
        cl: &Layout,
        idx: &candle_core::CudaStorage,
        il: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        crate::cuda_paged::attend(&self.op, self.at, (q, ql), (c, cl), (idx, il))
    }
}

impl AttendOp {
    /// The CPU path: each sequence's keys and values gathered from its pages into contiguous
    /// `[b, h_kv, L, d]` (L the longest length), then gemmbridge's CPU attention with
    /// per-sequence lengths (one query row each, no mask).
    fn cpu<T: Element>(&self, q: &[T], c: &[T], tables: &[i32]) -> Result<Vec<T>> {
        let g = &self.op.cache;
        let (b, hkv, d) = (g.batch, g.heads_kv, g.head_dim);
        let longest = self.host.after.iter().copied().max().unwrap_or(1).max(1) as usize;
        let mut kv = [vec![T::from_f32(0.0); b * hkv * longest * d], vec![T::from_f32(0.0); b * hkv * longest * d]];
        let e = g.container_elems();
        for (which, dst) in kv.iter_mut().enumerate() {
            let src = &c[which * e..];
            for n in 0..b {
                for p in 0..self.host.after[n] as usize {
                    let (page, slot) = g.locate(tables, n, p);
                    for h in 0..hkv {
                        let at = g.index(page, h, slot, 0);
                        let to = ((n * hkv + h) * longest + p) * d;
                        dst[to..to + d].copy_from_slice(&src[at..at + d]);
                    }
                }
            }
        }
        let p = Attention::new(b, (self.op.heads_q, hkv), (1, longest), d, g.dtype)
            .bhsd()
            .with_mask(AttnMask::None)
            .with_scale(self.op.scale)
            .with_var_len(true);
        let mut o = vec![T::from_f32(f32::NAN); b * self.op.heads_q * d];
        let ones = vec![1i32; b];
        gemmbridge::cpu::attention_forward(&p, [q, &kv[0], &kv[1]], &mut o, None, Some((&ones, &self.host.after)))
            .map_err(wrap)?;
        Ok(o)
    }
}

/// RoPE on a fused QKV buffer in place (the destination), tables `cos`, `sin` the sources.
pub(crate) struct RopeQkvOp {
    pub(crate) op: Rope,
    pub(crate) host: Arc<StepIndex>,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) index: Tensor,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) at: [usize; 5],
}

impl InplaceOp3 for RopeQkvOp {
    fn name(&self) -> &'static str {
        "gemmbridge-rope-qkv"
    }

    fn cpu_fwd(
        &self,
        dst: &mut CpuStorage,
        dl: &Layout,
        c: &CpuStorage,
        cl: &Layout,
        s: &CpuStorage,
        sl: &Layout,
    ) -> Result<()> {
        let positions = Positions::Given(&self.host.positions[..]);
        let (CpuStorage::F32(c), CpuStorage::F32(s)) = (c, s) else {
            candle_core::bail!("rope_qkv: f32 tables expected")
        };
        let tables = Some(RopeTables { cos: &c[cl.start_offset()..], sin: &s[sl.start_offset()..] });
        let (op, dir, o) = (&self.op, RopeDirection::Forward, dl.start_offset());
        let r = match dst {
            CpuStorage::F16(x) => gemmbridge::cpu::rope(op, dir, &mut x[o..], positions, tables),
            CpuStorage::BF16(x) => gemmbridge::cpu::rope(op, dir, &mut x[o..], positions, tables),
            _ => candle_core::bail!("rope_qkv: f16 or bf16 qkv expected"),
        };
        r.map_err(wrap)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        dst: &mut candle_core::CudaStorage,
        dl: &Layout,
        c: &candle_core::CudaStorage,
        cl: &Layout,
        s: &candle_core::CudaStorage,
        sl: &Layout,
    ) -> Result<()> {
        crate::cuda_paged::rope_qkv(&self.op, (&self.index, self.at), (dst, dl), [(c, cl), (s, sl)])
    }
}

//! A small builder for cuDNN operation graphs of four-dimensional tensors, shared by the
//! attention graphs (`attention/`) and the RMSNorm graphs (`norm/`): tensors (by unique id,
//! virtual, or a host scalar passed by value), the pointwise, reduction, matmul, reshape and
//! paged cache load operations the attention graphs are made of, the RMS norm forward and
//! backward operations, and the finalized operation graph with every descriptor it was made of
//! (kept alive with the plan, as `graph.rs` does for convolutions).
//!
//! Virtual tensors take unique ids from [`FIRST_VIRTUAL_UID`] up; by-value scalars are named in
//! the variant pack with a host pointer to their value (cuDNN reads it when the plan is
//! executed: cuDNN's developer guide, "Backend Descriptor Types", `CUDNN_ATTR_TENSOR_IS_BY_VALUE`).

use cudarc::cudnn::sys as raw;
use raw::cudnnBackendAttributeName_t as A;
use raw::cudnnBackendAttributeType_t as T;
use raw::cudnnBackendDescriptorType_t as D;
pub(super) use raw::cudnnDataType_t as Dt;
pub(super) use raw::cudnnPointwiseMode_t as Pw;
pub(super) use raw::cudnnReduceTensorOp_t as Red;

use super::graph_desc::Desc;
use crate::error::Result;

/// The norm mode of both norm operations (cuDNN 8.9.6 and later, Ampere and later: cuDNN's
/// developer guide, `CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR`; cudnn-frontend's RMSNorm
/// samples skip before 8.9.6 and before Ampere).
const RMS_NORM: raw::cudnnBackendNormMode_t = raw::cudnnBackendNormMode_t::CUDNN_RMS_NORM;

/// Dimensions or strides of a four-dimensional tensor, in elements.
pub(super) type Dims = [i64; 4];

/// The first unique id a virtual tensor or a by-value scalar gets (the graphs' own tensors
/// have small fixed ids).
const FIRST_VIRTUAL_UID: i64 = 1000;

/// A host scalar passed by value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Scalar {
    F32(f32),
    I32(i32),
}

/// A tensor of the graph being built: where its descriptor is, and its shape and type.
#[derive(Clone, Copy, Debug)]
pub(super) struct Tensor {
    idx: usize,
    pub dims: Dims,
    pub strides: Dims,
}

/// Packed strides of `dims` (the last dimension contiguous).
pub(super) fn dense(d: Dims) -> Dims {
    [d[1] * d[2] * d[3], d[2] * d[3], d[3], 1]
}

/// An operation graph under construction.
pub(super) struct Builder {
    tensors: Vec<Desc>,
    parts: Vec<Desc>,
    ops: Vec<Desc>,
    scalars: Vec<(i64, Scalar)>,
    next_uid: i64,
    align: i64,
}

/// A finalized operation graph, what it was made of, and its by-value scalars (unique id,
/// value).
pub(super) struct Graph {
    pub graph: Desc,
    pub parts: Vec<Desc>,
    pub scalars: Vec<(i64, Scalar)>,
}

impl Builder {
    /// An empty graph whose tensors declare `align` bytes of alignment (cuDNN's
    /// `BYTE_ALIGNMENT`).
    pub fn new(align: u8) -> Builder {
        Builder {
            tensors: Vec::new(),
            parts: Vec::new(),
            ops: Vec::new(),
            scalars: Vec::new(),
            next_uid: FIRST_VIRTUAL_UID,
            align: i64::from(align),
        }
    }

    /// A tensor descriptor of any rank (`dims` and `strides` of one length), kept with the
    /// graph; its index among the graph's tensors.
    fn describe(&mut self, uid: i64, dims: &[i64], strides: &[i64], dtype: Dt, kind: Kind) -> Result<usize> {
        let (virt, by_value) = (kind == Kind::Virtual, kind == Kind::ByValue);
        // SAFETY: DATA_TYPE reads cudnnDataType_t, BOOLEAN a C bool, the rest int64_t.
        let mut d = unsafe {
            Desc::new(D::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?
                .set(A::CUDNN_ATTR_TENSOR_DATA_TYPE, T::CUDNN_TYPE_DATA_TYPE, &[dtype])?
                .i64s(A::CUDNN_ATTR_TENSOR_DIMENSIONS, dims)?
                .i64s(A::CUDNN_ATTR_TENSOR_STRIDES, strides)?
                .i64s(A::CUDNN_ATTR_TENSOR_UNIQUE_ID, &[uid])?
                .i64s(A::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, &[self.align])?
                .set(A::CUDNN_ATTR_TENSOR_IS_VIRTUAL, T::CUDNN_TYPE_BOOLEAN, &[virt])?
        };
        if by_value {
            // SAFETY: as above.
            d = unsafe { d.set(A::CUDNN_ATTR_TENSOR_IS_BY_VALUE, T::CUDNN_TYPE_BOOLEAN, &[true])? };
        }
        let d = d.finalize(|| format!("tensor {uid} dims {dims:?} strides {strides:?} {dtype:?}"))?;
        self.tensors.push(d);
        Ok(self.tensors.len() - 1)
    }

    fn make(&mut self, uid: i64, dims: Dims, strides: Dims, dtype: Dt, kind: Kind) -> Result<Tensor> {
        let idx = self.describe(uid, &dims, &strides, dtype, kind)?;
        Ok(Tensor { idx, dims, strides })
    }

    fn uid(&mut self) -> i64 {
        self.next_uid += 1;
        self.next_uid - 1
    }

    /// A tensor in device memory, named `uid` in the variant pack.
    pub fn io(&mut self, uid: i64, dims: Dims, strides: Dims, dtype: Dt) -> Result<Tensor> {
        self.make(uid, dims, strides, dtype, Kind::Memory)
    }

    /// A three-dimensional tensor in device memory, named `uid` in the variant pack (what the
    /// MoE grouped matmul takes); its `dims` and `strides` as `[d0, d1, d2, 1]`.
    pub fn io3(&mut self, uid: i64, dims: [i64; 3], strides: [i64; 3], dtype: Dt) -> Result<Tensor> {
        let idx = self.describe(uid, &dims, &strides, dtype, Kind::Memory)?;
        Ok(Tensor { idx, dims: [dims[0], dims[1], dims[2], 1], strides: [strides[0], strides[1], strides[2], 1] })
    }

    /// A virtual tensor (an intermediate the engine keeps to itself).
    pub fn virt(&mut self, dims: Dims, strides: Dims, dtype: Dt) -> Result<Tensor> {
        let uid = self.uid();
        self.make(uid, dims, strides, dtype, Kind::Virtual)
    }

    /// A host scalar passed by value, `[1, 1, 1, 1]`.
    pub fn scalar(&mut self, v: Scalar) -> Result<Tensor> {
        let uid = self.uid();
        let dtype = match v {
            Scalar::F32(_) => Dt::CUDNN_DATA_FLOAT,
            Scalar::I32(_) => Dt::CUDNN_DATA_INT32,
        };
        self.scalars.push((uid, v));
        self.make(uid, [1; 4], [1; 4], dtype, Kind::ByValue)
    }

    fn get(&self, t: Tensor) -> &Desc {
        &self.tensors[t.idx]
    }

    /// `out = mode(ins…)` (one to three inputs: x, b, and for BINARY_SELECT the condition t),
    /// computed in `math`, with `axis` for GEN_INDEX.
    pub fn pointwise(&mut self, mode: Pw, math: Dt, ins: &[Tensor], out: Tensor, axis: Option<i64>) -> Result<()> {
        // SAFETY: POINTWISE_MODE reads the enum, MATH_PREC a cudnnDataType_t, AXIS int64_t.
        let mut pw = unsafe {
            Desc::new(D::CUDNN_BACKEND_POINTWISE_DESCRIPTOR)?
                .set(A::CUDNN_ATTR_POINTWISE_MODE, T::CUDNN_TYPE_POINTWISE_MODE, &[mode])?
                .set(A::CUDNN_ATTR_POINTWISE_MATH_PREC, T::CUDNN_TYPE_DATA_TYPE, &[math])?
        };
        if let Some(axis) = axis {
            pw = pw.i64s(A::CUDNN_ATTR_POINTWISE_AXIS, &[axis])?;
        }
        let pw = pw.finalize(|| format!("pointwise {mode:?}"))?;
        let names = [
            A::CUDNN_ATTR_OPERATION_POINTWISE_XDESC,
            A::CUDNN_ATTR_OPERATION_POINTWISE_BDESC,
            A::CUDNN_ATTR_OPERATION_POINTWISE_TDESC,
        ];
        let mut op = Desc::new(D::CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR)?
            .descs(A::CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, &[&pw])?;
        for (name, t) in names.iter().zip(ins) {
            op = op.descs(*name, &[self.get(*t)])?;
        }
        let op = op
            .descs(A::CUDNN_ATTR_OPERATION_POINTWISE_YDESC, &[self.get(out)])?
            .finalize(|| format!("pointwise operation {mode:?}"))?;
        self.ops.push(op);
        self.parts.push(pw);
        Ok(())
    }

    /// [`Builder::pointwise`] into a new virtual tensor of `ins[0]`'s shape and type `dtype`.
    pub fn pw(&mut self, mode: Pw, math: Dt, ins: &[Tensor], dtype: Dt) -> Result<Tensor> {
        let out = self.virt(ins[0].dims, ins[0].strides, dtype)?;
        self.pointwise(mode, math, ins, out, None)?;
        Ok(out)
    }

    /// An f32 pointwise operation into a new f32 virtual tensor.
    pub fn f32(&mut self, mode: Pw, ins: &[Tensor]) -> Result<Tensor> {
        self.pw(mode, Dt::CUDNN_DATA_FLOAT, ins, Dt::CUDNN_DATA_FLOAT)
    }

    /// GEN_INDEX along `axis` of `of`'s shape: an int32 virtual tensor, computed in `math`.
    pub fn index(&mut self, of: Tensor, axis: i64, math: Dt) -> Result<Tensor> {
        let out = self.virt(of.dims, of.strides, Dt::CUDNN_DATA_INT32)?;
        self.pointwise(Pw::CUDNN_POINTWISE_GEN_INDEX, math, &[of], out, Some(axis))?;
        Ok(out)
    }

    /// `y = reduce(x)` over the dimensions where y has extent 1, in f32.
    pub fn reduce(&mut self, mode: Red, x: Tensor, y: Tensor) -> Result<()> {
        let f32_ = Dt::CUDNN_DATA_FLOAT;
        // SAFETY: OPERATOR reads cudnnReduceTensorOp_t, COMP_TYPE a cudnnDataType_t.
        let r = unsafe {
            Desc::new(D::CUDNN_BACKEND_REDUCTION_DESCRIPTOR)?
                .set(A::CUDNN_ATTR_REDUCTION_OPERATOR, T::CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, &[mode])?
                .set(A::CUDNN_ATTR_REDUCTION_COMP_TYPE, T::CUDNN_TYPE_DATA_TYPE, &[f32_])?
                .finalize(|| format!("reduction {mode:?}"))?
        };
        let op = Desc::new(D::CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR)?
            .descs(A::CUDNN_ATTR_OPERATION_REDUCTION_XDESC, &[self.get(x)])?
            .descs(A::CUDNN_ATTR_OPERATION_REDUCTION_YDESC, &[self.get(y)])?
            .descs(A::CUDNN_ATTR_OPERATION_REDUCTION_DESC, &[&r])?
            .finalize(|| format!("reduction operation {mode:?}"))?;
        self.ops.push(op);
        self.parts.push(r);
        Ok(())
    }

    /// `c = a · b` batched over the first two dimensions (b broadcast over a's heads), f32
    /// accumulation; `m`, `n`, `k` overridden per batch entry by device int32 tensors where
    /// given.
    pub fn matmul(&mut self, a: Tensor, b: Tensor, c: Tensor, [m, n, k]: [Option<Tensor>; 3]) -> Result<()> {
        let f32_ = Dt::CUDNN_DATA_FLOAT;
        // SAFETY: COMP_TYPE reads a cudnnDataType_t.
        let mm = unsafe {
            Desc::new(D::CUDNN_BACKEND_MATMUL_DESCRIPTOR)?
                .set(A::CUDNN_ATTR_MATMUL_COMP_TYPE, T::CUDNN_TYPE_DATA_TYPE, &[f32_])?
                .finalize(|| "matmul".into())?
        };
        let mut op = Desc::new(D::CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR)?
            .descs(A::CUDNN_ATTR_OPERATION_MATMUL_ADESC, &[self.get(a)])?
            .descs(A::CUDNN_ATTR_OPERATION_MATMUL_BDESC, &[self.get(b)])?
            .descs(A::CUDNN_ATTR_OPERATION_MATMUL_CDESC, &[self.get(c)])?
            .descs(A::CUDNN_ATTR_OPERATION_MATMUL_DESC, &[&mm])?;
        let names = [
            A::CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC,
            A::CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC,
            A::CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC,
        ];
        for (name, t) in names.iter().zip([m, n, k]) {
            if let Some(t) = t {
                op = op.descs(*name, &[self.get(t)])?;
            }
        }
        let op = op.finalize(|| format!("matmul a {:?} b {:?} c {:?}", a.dims, b.dims, c.dims))?;
        self.ops.push(op);
        self.parts.push(mm);
        Ok(())
    }

    /// `y` = `x`'s elements under y's dimensions and strides.
    pub fn reshape(&mut self, x: Tensor, y: Tensor) -> Result<()> {
        let op = Desc::new(D::CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR)?
            .descs(A::CUDNN_ATTR_OPERATION_RESHAPE_XDESC, &[self.get(x)])?
            .descs(A::CUDNN_ATTR_OPERATION_RESHAPE_YDESC, &[self.get(y)])?
            .finalize(|| format!("reshape {:?} → {:?}", x.dims, y.dims))?;
        self.ops.push(op);
        Ok(())
    }

    /// A paged cache load (cuDNN 9.5.0 and later): `y` (virtual, `[b, h, s, d]` or, strided
    /// as kᵀ, `[b, h, d, s]`) gathered from `container` (`[pages, h, page_size, d]`) through the
    /// int32 page `table` (`[b, 1, width, 1]`), positions past the int32 lengths `lens`
    /// (`[b, 1, 1, 1]`) not read (cuDNN's developer guide,
    /// `CUDNN_BACKEND_OPERATION_PAGED_CACHE_LOAD_DESCRIPTOR`).
    pub fn paged_load(&mut self, [container, lens, table]: [Tensor; 3], y: Tensor) -> Result<()> {
        let op = Desc::new(D::CUDNN_BACKEND_OPERATION_PAGED_CACHE_LOAD_DESCRIPTOR)?
            .descs(A::CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_CONTAINER_DESC, &[self.get(container)])?
            .descs(A::CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_PAGE_TABLE_DESC, &[self.get(table)])?
            .descs(A::CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_SEQUENCE_DESC, &[self.get(lens)])?
            .descs(A::CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_YDESC, &[self.get(y)])?
            .finalize(|| format!("paged cache load {:?} → {:?}", container.dims, y.dims))?;
        self.ops.push(op);
        Ok(())
    }

    /// An RMS norm forward (`CUDNN_RMS_NORM`) of `x` with the scale `w` and the by-value
    /// `eps` into `y`; in the training phase (`inv_rms` given) also the inverse RMS per row.
    pub fn rms_norm(&mut self, [x, w, eps]: [Tensor; 3], y: Tensor, inv_rms: Option<Tensor>) -> Result<()> {
        use raw::cudnnBackendNormFwdPhase_t::{CUDNN_NORM_FWD_INFERENCE, CUDNN_NORM_FWD_TRAINING};
        let phase = if inv_rms.is_some() { CUDNN_NORM_FWD_TRAINING } else { CUDNN_NORM_FWD_INFERENCE };
        // SAFETY: MODE reads cudnnBackendNormMode_t, PHASE cudnnBackendNormFwdPhase_t (both
        // 32-bit C enums).
        let mut op = unsafe {
            Desc::new(D::CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR)?
                .set(A::CUDNN_ATTR_OPERATION_NORM_FWD_MODE, T::CUDNN_TYPE_NORM_MODE, &[RMS_NORM])?
                .set(A::CUDNN_ATTR_OPERATION_NORM_FWD_PHASE, T::CUDNN_TYPE_NORM_FWD_PHASE, &[phase])?
        };
        op = op
            .descs(A::CUDNN_ATTR_OPERATION_NORM_FWD_XDESC, &[self.get(x)])?
            .descs(A::CUDNN_ATTR_OPERATION_NORM_FWD_SCALE_DESC, &[self.get(w)])?
            .descs(A::CUDNN_ATTR_OPERATION_NORM_FWD_EPSILON_DESC, &[self.get(eps)])?
            .descs(A::CUDNN_ATTR_OPERATION_NORM_FWD_YDESC, &[self.get(y)])?;
        if let Some(s) = inv_rms {
            op = op.descs(A::CUDNN_ATTR_OPERATION_NORM_FWD_INV_VARIANCE_DESC, &[self.get(s)])?;
        }
        let op = op.finalize(|| format!("rms norm forward x {:?} {phase:?}", x.dims))?;
        self.ops.push(op);
        Ok(())
    }

    /// The RMS norm backward: `dx` and the scale's gradient `dw` from `x`, `dy`, the scale `w`
    /// and the forward's inverse RMS.
    pub fn rms_norm_backward(&mut self, [x, dy, w, inv_rms]: [Tensor; 4], [dx, dw]: [Tensor; 2]) -> Result<()> {
        // SAFETY: MODE reads cudnnBackendNormMode_t.
        let op = unsafe {
            Desc::new(D::CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR)?.set(
                A::CUDNN_ATTR_OPERATION_NORM_BWD_MODE,
                T::CUDNN_TYPE_NORM_MODE,
                &[RMS_NORM],
            )?
        };
        let op = op
            .descs(A::CUDNN_ATTR_OPERATION_NORM_BWD_XDESC, &[self.get(x)])?
            .descs(A::CUDNN_ATTR_OPERATION_NORM_BWD_DYDESC, &[self.get(dy)])?
            .descs(A::CUDNN_ATTR_OPERATION_NORM_BWD_SCALE_DESC, &[self.get(w)])?
            .descs(A::CUDNN_ATTR_OPERATION_NORM_BWD_INV_VARIANCE_DESC, &[self.get(inv_rms)])?
            .descs(A::CUDNN_ATTR_OPERATION_NORM_BWD_DSCALE_DESC, &[self.get(dw)])?
            .descs(A::CUDNN_ATTR_OPERATION_NORM_BWD_DXDESC, &[self.get(dx)])?
            .finalize(|| format!("rms norm backward x {:?}", x.dims))?;
        self.ops.push(op);
        Ok(())
    }

    /// cuDNN's MoE grouped matmul (cuDNN 9.18 and later) in its plain mode (rows in expert
    /// order): `y = token · weight[e]` per expert over the rows the int32 `first` offsets give
    /// it, tensors of three dimensions, f32 accumulation (cuDNN's developer guide,
    /// `CUDNN_BACKEND_OPERATION_MOE_GROUPED_MATMUL_DESCRIPTOR`; cudnn-frontend's
    /// `MoeGroupedMatmulNode`).
    pub fn moe(&mut self, [token, weight, first]: [Tensor; 3], y: Tensor) -> Result<()> {
        let mode = raw::cudnnMoeGroupedMatmulMode_t::CUDNN_MOE_GROUPED_MATMUL_MODE_NONE;
        let f32_ = Dt::CUDNN_DATA_FLOAT;
        // SAFETY: MODE reads cudnnMoeGroupedMatmulMode_t (a 32-bit C enum), MATH_PREC a
        // cudnnDataType_t.
        let op = unsafe {
            Desc::new(D::CUDNN_BACKEND_OPERATION_MOE_GROUPED_MATMUL_DESCRIPTOR)?
                .set(A::CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_MODE, T::CUDNN_TYPE_MOE_GROUPED_MATMUL_MODE, &[mode])?
                .set(A::CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_MATH_PREC, T::CUDNN_TYPE_DATA_TYPE, &[f32_])?
        };
        let op = op
            .descs(A::CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_TOKEN_DESC, &[self.get(token)])?
            .descs(A::CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_WEIGHT_DESC, &[self.get(weight)])?
            .descs(A::CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_FIRST_TOKEN_OFFSET_DESC, &[self.get(first)])?
            .descs(A::CUDNN_ATTR_OPERATION_MOE_GROUPED_MATMUL_OUTPUT_DESC, &[self.get(y)])?
            .finalize(|| format!("moe grouped matmul token {:?} weight {:?}", token.dims, weight.dims))?;
        self.ops.push(op);
        Ok(())
    }

    /// The operation graph of every operation added, on handle `h`.
    pub fn finish(self, h: raw::cudnnHandle_t, what: impl FnOnce() -> String) -> Result<Graph> {
        let refs: Vec<&Desc> = self.ops.iter().collect();
        let graph = Desc::new(D::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?
            .handle(A::CUDNN_ATTR_OPERATIONGRAPH_HANDLE, h)?
            .descs(A::CUDNN_ATTR_OPERATIONGRAPH_OPS, &refs)?
            .finalize(what)?;
        let mut parts = self.ops;
        parts.extend(self.parts);
        parts.extend(self.tensors);
        Ok(Graph { graph, parts, scalars: self.scalars })
    }
}

/// What a tensor descriptor is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Memory,
    Virtual,
    ByValue,
}

//! The entry points of a transformer layer's elementwise operations on gemmbridge's own
//! kernels (`device/kernels/layer.cu`): RoPE in place on a fused QKV buffer, SwiGLU and its
//! backward. Each validates the problem and every buffer (context, size, overlap) before
//! anything is enqueued, then launches on [`Gpu::stream`]: no allocation, no host
//! synchronisation, capturable into a CUDA graph once the kernels are compiled.

use cudarc::driver::{DevicePtr, DevicePtrMut, SyncOnDrop};

use super::checks::{disjoint, same_context, Span};
use super::engine::Gpu;
use crate::cuda::device::{GluLaunch, KernelSet, Kernels, RopeLaunch};
use crate::dtype::Element;
use crate::error::{Result, Which};
use crate::layer_ops::{Positions, Rope, RopeDirection, RopeTables, SwiGlu};

impl Gpu {
    /// RoPE in place on [`Gpu::stream`]: every query and key head of the fused QKV buffer
    /// `qkv[b, s, (h_q + 2·h_kv)·d]` (rows `op.ld` apart, element type `T`: f32, f16 or bf16)
    /// rotated by its token's angles ([`RopeDirection::Forward`]), or the gradients `dq`, `dk`
    /// in the same places rotated back ([`RopeDirection::Backward`]); value heads, the elements
    /// past the rotary dimension and the row padding are neither read nor written. The
    /// definition, the pairs and the angles: [`crate::layer_ops`]; the arithmetic is
    /// [`crate::layer_ops::arith`]'s, so the result equals [`crate::cpu::rope`]'s bit for bit.
    ///
    /// `positions`: [`Positions::Contiguous`] (`start + t` in every sequence, checked here) or
    /// one `i32` per token on the device ([`Positions::Given`], `[b, s]` contiguous, read in
    /// stream order). Device positions cannot be checked without a synchronisation; their
    /// contract: each lies in `0..`[`Rope::position_limit`] (the tables' rows, or 2²⁴ for
    /// angles from θ). A position outside it is never used to read a table: it makes that
    /// token's rotated elements NaN. `tables`: the cosine and sine tables
    /// (`[max_pos, r/2]` f32 each, on the device), given exactly when `op`'s angles come from
    /// tables.
    ///
    /// The first call compiles gemmbridge's layer kernels (NVRTC, once per process and device);
    /// make one before capturing a graph.
    ///
    /// # Errors
    /// Before anything is enqueued: [`crate::Error::LayerOp`] (the problem's rules,
    /// [`Rope::check_call`]; contiguous positions past the limit, [`Rope::check_start`]);
    /// [`crate::Error::BufferTooSmall`] for `qkv` (below [`Rope::qkv_elems`]), the positions
    /// (below `b·s`) or a table (below [`Rope::table_elems`]);
    /// [`crate::Error::OutputOverlapsInput`] where `qkv` overlaps the positions or a table;
    /// [`crate::Error::WrongContext`]; [`crate::Error::NotCapturable`] for a first call inside a
    /// capture; [`crate::Error::LibraryNotFound`] without NVRTC; [`crate::Error::Driver`].
    pub fn rope<T: Element>(
        &self,
        op: &Rope,
        direction: RopeDirection,
        qkv: &mut dyn DevicePtrMut<T>,
        positions: Positions<&dyn DevicePtr<i32>>,
        tables: Option<RopeTables<&dyn DevicePtr<f32>>>,
    ) -> Result<()> {
        op.check_call(tables.is_some())?;
        let start = match positions {
            Positions::Contiguous { start } => {
                op.check_start(start)?;
                start
            }
            Positions::Given(_) => 0,
        };
        let (ctx, s) = (self.context(), self.stream());
        same_context(Which::LayerOp("qkv"), qkv.stream(), ctx)?;
        let mut reads: Vec<(Which, &dyn DevicePtr<i32>, usize)> = Vec::new();
        if let Positions::Given(p) = positions {
            reads.push((Which::LayerOp("positions"), p, op.tokens()));
        }
        let tabled: Vec<(Which, &dyn DevicePtr<f32>)> = match &tables {
            Some(t) => vec![(Which::LayerOp("cos table"), t.cos), (Which::LayerOp("sin table"), t.sin)],
            None => Vec::new(),
        };
        for (w, b, _) in &reads {
            same_context(*w, b.stream(), ctx)?;
        }
        for (w, b) in &tabled {
            same_context(*w, b.stream(), ctx)?;
        }
        let mut guards: Vec<SyncOnDrop<'_>> = Vec::with_capacity(4);
        let bytes = qkv.num_bytes();
        let (addr, g) = qkv.device_ptr_mut(s);
        guards.push(g);
        let written = [Span::sized(Which::LayerOp("qkv"), addr, bytes, op.qkv_elems(), T::DTYPE.size_bytes())?];
        let mut read = Vec::with_capacity(3);
        for (w, b, n) in reads {
            let (a, g) = b.device_ptr(s);
            guards.push(g);
            read.push(Span::sized(w, a, b.num_bytes(), n, 4)?);
        }
        for (w, b) in tabled {
            let (a, g) = b.device_ptr(s);
            guards.push(g);
            read.push(Span::sized(w, a, b.num_bytes(), op.table_elems(), 4)?);
        }
        disjoint(&written, &read)?;
        let mut launch = RopeLaunch { op, direction, dtype: T::DTYPE, qkv: addr, start, pos: 0, cos: 0, sin: 0 };
        let mut it = read.iter().map(|r| r.addr);
        if let Positions::Given(_) = positions {
            launch.pos = it.next().expect("pushed above");
        }
        if tables.is_some() {
            (launch.cos, launch.sin) = (it.next().expect("pushed above"), it.next().expect("pushed above"));
        }
        // SAFETY: every buffer was checked above (context, size, no overlap with qkv) and is
        // borrowed until the launch is enqueued; the stream is this Gpu's own.
        let r = self.with_layer_kernels(|k, stream| unsafe { launch.enqueue(k, stream) });
        drop(guards);
        r
    }

    /// SwiGLU on [`Gpu::stream`]: `y[rows, f] = silu(g)·u` from the gate/up projection's output
    /// `gu[rows, 2·f]` (rows `op.ld_in` apart, `g` and `u` laid out as `op.layout` says), `y`'s
    /// rows `op.ld_out` apart (its row padding is not written); element type `T` (f32, f16 or
    /// bf16), f32 arithmetic ([`crate::layer_ops::arith::swiglu`]), bit for bit
    /// [`crate::cpu::swiglu`]'s result. cuBLASLt offers no such epilogue. 16-byte accesses
    /// where `f`, both leading dimensions and both addresses allow them. The first call
    /// compiles the layer kernels, as [`Gpu::rope`].
    ///
    /// # Errors
    /// Before anything is enqueued: [`crate::Error::LayerOp`] ([`SwiGlu::validate`]);
    /// [`crate::Error::BufferTooSmall`] ([`SwiGlu::in_elems`], [`SwiGlu::out_elems`]);
    /// [`crate::Error::OutputOverlapsInput`]; [`crate::Error::WrongContext`];
    /// [`crate::Error::NotCapturable`] for a first call inside a capture;
    /// [`crate::Error::LibraryNotFound`] without NVRTC; [`crate::Error::Driver`].
    pub fn swiglu<T: Element>(&self, op: &SwiGlu, gu: &dyn DevicePtr<T>, y: &mut dyn DevicePtrMut<T>) -> Result<()> {
        self.glu(op, None, gu, (Which::LayerOp("y"), y))
    }

    /// SwiGLU's backward on [`Gpu::stream`]: from the output's gradient `dy` (`[rows, f]`, rows
    /// `op.ld_out` apart) and the forward's input `gu`, `dg = dy·u·silu′(g)` and
    /// `du = dy·silu(g)` written into `dgu` where `g` and `u` lie in `gu` (`[rows, 2·f]`, rows
    /// `op.ld_in` apart; its row padding is not written), each input read once and each
    /// gradient written once ([`crate::layer_ops::arith::swiglu_grad`], bit for bit
    /// [`crate::cpu::swiglu_backward`]'s result).
    ///
    /// # Errors
    /// As [`Gpu::swiglu`]; `dgu` may overlap neither `dy` nor `gu`.
    pub fn swiglu_backward<T: Element>(
        &self,
        op: &SwiGlu,
        dy: &dyn DevicePtr<T>,
        gu: &dyn DevicePtr<T>,
        dgu: &mut dyn DevicePtrMut<T>,
    ) -> Result<()> {
        self.glu(op, Some(dy), gu, (Which::LayerOp("gate/up gradient"), dgu))
    }

    /// Both SwiGLU directions: the checks, then the launch (backward with `dy`).
    fn glu<T: Element>(
        &self,
        op: &SwiGlu,
        dy: Option<&dyn DevicePtr<T>>,
        gu: &dyn DevicePtr<T>,
        (out_name, out): (Which, &mut dyn DevicePtrMut<T>),
    ) -> Result<()> {
        op.validate()?;
        let (ctx, s, e) = (self.context(), self.stream(), T::DTYPE.size_bytes());
        let mut ins = vec![(Which::LayerOp("gate/up"), gu, op.in_elems())];
        if let Some(d) = dy {
            ins.insert(0, (Which::LayerOp("dy"), d, op.out_elems()));
        }
        for (w, b, _) in &ins {
            same_context(*w, b.stream(), ctx)?;
        }
        same_context(out_name, out.stream(), ctx)?;
        let mut guards: Vec<SyncOnDrop<'_>> = Vec::with_capacity(3);
        let mut read = Vec::with_capacity(2);
        for (w, b, n) in ins {
            let (a, g) = b.device_ptr(s);
            guards.push(g);
            read.push(Span::sized(w, a, b.num_bytes(), n, e)?);
        }
        let need = if dy.is_some() { op.in_elems() } else { op.out_elems() };
        let bytes = out.num_bytes();
        let (addr, g) = out.device_ptr_mut(s);
        guards.push(g);
        let written = [Span::sized(out_name, addr, bytes, need, e)?];
        disjoint(&written, &read)?;
        let (dy, gu) = match read.as_slice() {
            [d, g] => (d.addr, g.addr),
            [g] => (0, g.addr),
            _ => unreachable!("one or two inputs"),
        };
        let launch = GluLaunch { op, dtype: T::DTYPE, backward: read.len() == 2, dy, gu, out: addr };
        // SAFETY: every buffer was checked above (context, size, the output apart from the
        // inputs) and is borrowed until the launch is enqueued; the stream is this Gpu's own.
        let r = self.with_layer_kernels(|k, stream| unsafe { launch.enqueue(k, stream) });
        drop(guards);
        r
    }

    /// Runs `f` with the layer kernels (compiled on first use, never inside a capture) under
    /// the lock, the context bound.
    fn with_layer_kernels(&self, f: impl FnOnce(&Kernels, cudarc::driver::sys::CUstream) -> Result<()>) -> Result<()> {
        self.device().bind()?;
        let mut st = self.lock();
        let stream = self.stream().cu_stream();
        let k = st.dev.kernels(stream, KernelSet::Layer)?;
        f(k, stream)
    }
}

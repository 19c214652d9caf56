//! The grouped GEMM entry point: validate (every buffer's context, dtype and length, the
//! output apart from the inputs, then each group's GEMM as the dense entry checks it) → the
//! way it runs ([`GroupedBackend`]: one strided batch, a pool of streams, or in order) → the
//! routing floor's dense path per GEMM (cuBLASLt's plan per shape, kept and replayed as any
//! GEMM's). Nothing is launched until every group has passed its checks.

use cudarc::driver::sys::CUstream;
use cudarc::driver::{DevicePtr, DevicePtrMut};

use super::operands::{check_all, RawBuffer, RawExtras};
use super::tune::GpuTuning;
use crate::cuda::api::checks::{disjoint, same_context, Span};
use crate::cuda::api::engine::Gpu;
use crate::cuda::api::plans::Plans;
use crate::cuda::call::Scale;
use crate::cuda::device::{check_extent, time_interleaved, Call};
use crate::cuda::route::grouped::{batched, replayed, GroupGemm};
use crate::dtype::Element;
use crate::error::{Error, Result, Which};
use crate::grouped::align::{candidates_at, grouped_call_misalignment, off_grouped_call};
use crate::grouped::streams::{GroupedBackend, GroupedSettings};
use crate::grouped::GroupedProblem;
use crate::problem::GemmProblem;
use crate::tactics::Tactic;
use crate::validate::BufferDesc;

impl GpuTuning<'_> {
    /// Measures every way of running `p` that applies to it on these buffers ([`candidates_at`])
    /// ([`Gpu::grouped_gemm`]'s arguments; `c` is overwritten many times): after
    /// warm-up calls, `reps` interleaved rounds of ~1 ms samples of back-to-back calls between
    /// CUDA events on [`Gpu::stream`], each way's median; the fastest is kept for `p`'s
    /// signature ([`GroupedProblem::signature`]: problems of that layer alike in total and
    /// skew) and used from now on where nothing is forced. Synchronises [`Gpu::stream`].
    ///
    /// Returns each way's median ms (candidate order) and the (signature, tactic) pair to
    /// store in a [`crate::tactics::TacticDb`] (kind `grouped_gemm`; its `heuristic_ms` is
    /// the time of the way the call takes with nothing measured: the rule's,
    /// [`crate::grouped::streams::rule`], off cuBLAS's grouped call on misaligned pointers).
    ///
    /// # Errors
    /// As [`Gpu::grouped_gemm`]; [`Error::OutOfRange`] for `reps` outside 1 to 1000, before
    /// anything runs. A forced backend
    /// ([`GpuOptions::grouped_backend`](crate::cuda::GpuOptions::grouped_backend)) is set aside
    /// while measuring and restored afterwards.
    #[allow(clippy::type_complexity)]
    pub fn grouped<T: Element>(
        &self,
        p: &GroupedProblem,
        (a, b): (&dyn DevicePtr<T>, &dyn DevicePtr<T>),
        c: &mut dyn DevicePtrMut<T>,
        bias: Option<&dyn DevicePtr<T>>,
        reps: usize,
    ) -> Result<(Vec<(GroupedBackend, f64)>, String, Tactic)> {
        let gpu = self.gpu;
        if !(1..=1000).contains(&reps) {
            return Err(Error::OutOfRange { what: "reps", value: reps as u64, expected: "1 to 1000".into() });
        }
        let forced = std::mem::take(&mut gpu.lock().libs.grouped.backend);
        // one checked call first: every rule, the lanes and the plans made
        let first = gpu.grouped_gemm(p, a, b, c, bias);
        let timed = first.and_then(|()| {
            let s = gpu.stream();
            let (pa, _ra) = a.device_ptr(s);
            let (pb, _rb) = b.device_ptr(s);
            let pv = bias.map(|v| (v.device_ptr(s), v.num_bytes()));
            let (lc, (pc, _wc)) = (c.num_bytes(), c.device_ptr_mut(s));
            let bufs = [(pa, a.num_bytes()), (pb, b.num_bytes()), (pc, lc)];
            let bias = pv.as_ref().map(|((ptr, _), len)| (*ptr, *len));
            let moe = gpu.lock().libs.grouped.cudnn_moe.unwrap_or(false);
            let ways = candidates_at(p, bufs.map(|b| b.0), moe);
            let calls: Vec<Call<'_>> = ways
                .iter()
                // SAFETY: the same buffers the checked call above ran on, borrowed until the
                // timing has waited for every call.
                .map(|&how| {
                    Box::new(move || unsafe { gpu.launch_grouped(p, how, bufs, bias, s.cu_stream()) }) as Call<'_>
                })
                .collect();
            // eager samples: cuBLAS's grouped call cannot be captured, and every way runs
            // eagerly when used (the pool's repeats as graph replays, which the calls include)
            let medians = time_interleaved(s, reps, &calls, false)?.medians;
            // the way the call takes with nothing measured: the rule's, off cuBLAS's grouped
            // call where the pointers miss its alignment
            let untuned =
                way_on(&GroupedSettings { cudnn_moe: Some(moe), ..Default::default() }, p, bufs.map(|b| b.0))?;
            Ok((ways.into_iter().zip(medians).collect::<Vec<_>>(), untuned))
        });
        gpu.lock().libs.grouped.backend = forced;
        let (times, untuned) = timed?;
        let (best, best_ms) = times.iter().copied().min_by(|x, y| x.1.total_cmp(&y.1)).expect("a candidate");
        let rule_ms = times.iter().find(|(b, _)| *b == untuned).map_or(best_ms, |t| t.1);
        let sig = p.signature();
        gpu.lock().libs.grouped.tuned.insert(sig.clone(), best);
        let version = crate::cuda::library::cublaslt_version().unwrap_or(0);
        Ok((times, sig, Tactic::grouped(best, version, rule_ms, best_ms)))
    }
}

impl Gpu {
    /// The grouped product `p` ([`crate::grouped`]: a mixture-of-experts layer's forward
    /// `y = x·w[e]ᵀ (+ bias[e])`, backward data `dx = dy·w[e]` or backward weight
    /// `dw[e] = dy[e]ᵀ·x[e]`, rows sorted by group) on row-major contiguous buffers in argument
    /// order ([`GroupedOp::names`](crate::grouped::GroupedOp::names)): `a`, `b` read, `c`
    /// written; `bias` (`[E, N]`, forward with [`GroupedProblem::with_bias`] only). Every
    /// buffer holds `T`, the precision's input and output type (f32 for f32 and tf32, f16, bf16);
    /// lengths in elements at least [`GroupedProblem::lens`]. Rows of `c` past the last group
    /// are not written; an empty group writes nothing in the forward and backward data, and
    /// zeros into its `dw[e]` (k = 0: β·C with β = 0).
    ///
    /// How it runs is [`crate::grouped`]'s "How it runs" ([`Plans::grouped_backend`] says which
    /// way for `p`; [`GpuOptions::grouped_backend`](crate::cuda::GpuOptions::grouped_backend)
    /// forces one): work enqueued on [`Gpu::stream`] afterwards sees every group, with no host
    /// synchronisation. The pool's streams are created with a workspace each
    /// ([`GpuOptions::workspace_bytes`](crate::cuda::GpuOptions::workspace_bytes)) on the first
    /// pooled call and kept until the engine is dropped; a pooled call repeated on the same
    /// buffers and sizes is replayed as one CUDA graph
    /// ([`GpuOptions::graph_replay`](crate::cuda::GpuOptions::graph_replay)).
    ///
    /// Capturing a call yourself: every way but cuBLAS's grouped call (its pointer arrays come
    /// from the host) is capturable into a graph of [`Gpu::stream`] once the pool exists and
    /// each group shape has been planned: run the call once outside the capture first (and
    /// force [`GroupedBackend::StreamPool`] where the rule takes cuBLAS's grouped call). A group
    /// shape not planned yet fails with [`Error::NotCapturable`] after the groups before it were
    /// recorded: end the capture and discard it. Launch such a graph on the stream it was
    /// captured from, and not while this engine runs pooled grouped calls on another stream (the
    /// engine orders its own replays and pooled calls, but cannot see your launches).
    ///
    /// # Errors
    /// Before anything is launched, with no buffer written: [`Error::WrongContext`],
    /// [`Error::DTypeMismatch`] (a buffer's `T` against the precision's), [`Error::BufferTooSmall`]
    /// (a buffer shorter than [`GroupedProblem::lens`], a bias shorter than `E·N`),
    /// [`Error::OutputOverlapsInput`] (the output's extent against an input's, the bias's
    /// included), [`Error::EpilogueOperand`] (a bias given without
    /// [`GroupedProblem::has_bias`] or missing with it), [`Error::Unsupported`] (a forced
    /// backend that does not apply to `p`, or a way through cuBLAS's grouped call forced on
    /// pointers off 16 bytes, [`crate::grouped::align`]; a precision whose output type differs from its
    /// inputs', such as `BF16_F32OUT`), and each group's GEMM checks as [`Gpu::gemm`]'s.
    /// From the launches: as [`Gpu::gemm`] (a failure part-way leaves other groups written;
    /// the pool is joined back to [`Gpu::stream`] all the same).
    pub fn grouped_gemm<T: Element>(
        &self,
        p: &GroupedProblem,
        a: &dyn DevicePtr<T>,
        b: &dyn DevicePtr<T>,
        c: &mut dyn DevicePtrMut<T>,
        bias: Option<&dyn DevicePtr<T>>,
    ) -> Result<()> {
        let ctx = self.context();
        let [wa, wb, wc] = p.op().operands();
        same_context(wa, a.stream(), ctx)?;
        same_context(wb, b.stream(), ctx)?;
        same_context(wc, c.stream(), ctx)?;
        if let Some(v) = bias {
            same_context(Which::Bias, v.stream(), ctx)?;
        }
        check_types::<T>(p, bias.is_some())?;
        let s = self.stream();
        let (pa, _ra) = a.device_ptr(s);
        let (pb, _rb) = b.device_ptr(s);
        let (pv, _rv) = match bias {
            Some(v) => {
                let (ptr, g) = v.device_ptr(s);
                (Some((ptr, v.num_bytes())), Some(g))
            }
            None => (None, None),
        };
        let (lc, pc) = (c.num_bytes(), c.device_ptr_mut(s));
        let (pc, _wc) = pc;
        let bufs = [(pa, a.num_bytes()), (pb, b.num_bytes()), (pc, lc)];
        check_extents(p, bufs, pv, T::DTYPE.size_bytes())?;
        // SAFETY: every address is a live cudarc allocation of this context borrowed for this
        // call (the guards above), its extent checked.
        unsafe { self.grouped_checked(p, bufs, pv, s.cu_stream()) }
    }

    /// [`Gpu::grouped_gemm`] on device memory given by address (`[a, b, c]` and the bias;
    /// lengths in bytes; every buffer of the precision's one element type), enqueued on
    /// `stream` (the pool forks from and joins back to it): zero-copy for other frameworks'
    /// buffers, as [`Gpu::gemm_raw`] is for one GEMM.
    ///
    /// # Safety
    /// As [`Gpu::gemm_raw`]: device memory of this context valid until the call has run on
    /// `stream`, `stream` a live stream of this context, nothing touching the buffers concurrently
    /// except in stream order. With
    /// [`GpuOptions::check_raw_addresses`](crate::cuda::GpuOptions::check_raw_addresses) on, an
    /// address this GPU cannot access is an error instead of a fault.
    ///
    /// # Errors
    /// As [`Gpu::grouped_gemm`] (but [`Error::WrongContext`] and [`Error::DTypeMismatch`],
    /// which raw addresses cannot show); [`Error::NotDeviceMemory`] with the address check on.
    pub unsafe fn grouped_gemm_raw(
        &self,
        p: &GroupedProblem,
        [a, b, c]: [RawBuffer; 3],
        bias: Option<RawBuffer>,
        stream: CUstream,
    ) -> Result<()> {
        check_precision(p, bias.is_some())?;
        let bufs = [a, b, c].map(|r| (r.address, r.len_bytes));
        let pv = bias.map(|r| (r.address, r.len_bytes));
        let spans = check_extents(p, bufs, pv, p.precision().input().size_bytes())?;
        if self.device().checks_raw_addresses() {
            let ordinal = self.context().ordinal();
            self.device().bind()?;
            for s in spans.iter().filter(|s| s.bytes > 0) {
                check_extent(s.which, s.addr, s.bytes, ordinal)?;
            }
        }
        // SAFETY: forwarded from the caller; the extents were checked above.
        unsafe { self.grouped_checked(p, bufs, pv, stream) }
    }

    /// The way chosen for the checked call, then the launches on `stream`.
    ///
    /// # Safety
    /// The buffers are live device memory of this context until the work has run on `stream`,
    /// a live stream of the context, and passed [`check_extents`].
    unsafe fn grouped_checked(
        &self,
        p: &GroupedProblem,
        bufs: [(u64, usize); 3],
        pv: Option<(u64, usize)>,
        stream: CUstream,
    ) -> Result<()> {
        let how = {
            let mut st = self.lock();
            detect_cudnn_moe(&mut st.libs.grouped);
            let how = way_on(&st.libs.grouped, p, bufs.map(|b| b.0))?;
            st.libs.grouped.note_use(p, how);
            how
        };
        // SAFETY: each buffer long enough and the output apart from the inputs (the caller's
        // check_extents); `launch_grouped` checks each GEMM before it enqueues any; the rest
        // is the caller's contract.
        unsafe { self.launch_grouped(p, how, bufs, pv, stream) }
    }

    /// Runs the checked grouped product `p` on the buffers `bufs` (address, bytes) and the
    /// bias `pv` the way `how` says, on `stream`.
    ///
    /// # Safety
    /// The buffers are live allocations of this context, as long as [`GroupedProblem::lens`]
    /// says, the output apart from the inputs, valid until the work has run; `stream` is
    /// [`Gpu::stream`] or another live stream of the context.
    unsafe fn launch_grouped(
        &self,
        p: &GroupedProblem,
        how: GroupedBackend,
        bufs: [(u64, usize); 3],
        pv: Option<(u64, usize)>,
        stream: CUstream,
    ) -> Result<()> {
        let elem = p.precision().input().size_bytes();
        match how {
            GroupedBackend::StridedBatch => {
                let (g, _) = p.group(0)?;
                let batched = g.batched(p.groups())?;
                let dtypes = [p.precision().input(), p.precision().input(), p.precision().output()];
                let descs =
                    [0, 1, 2].map(|i| BufferDesc { address: bufs[i].0, len_bytes: bufs[i].1, dtype: dtypes[i] });
                let extras = RawExtras::default();
                check_all(&batched, descs, extras)?;
                // SAFETY: checked just above on live buffers (the caller's contract).
                return unsafe { self.enqueue_checked(&batched, Scale::PRODUCT, descs, extras, stream) };
            }
            GroupedBackend::Cudnn => return self.moe_grouped(p, bufs, stream),
            _ => {}
        }
        let groups = group_gemms(&group_parts(p)?, bufs, pv, elem)?;
        self.device().bind()?;
        let mut st = self.lock();
        // the pool in order where one group has work or the pool has one stream
        let lanes =
            Some(st.libs.grouped.streams).filter(|&n| how == GroupedBackend::StreamPool && n > 1 && groups.len() > 1);
        // SAFETY: each group passed check_all in group_gemms; the replay key encodes the problem
        // (from which the groups follow), every address and the lanes; the rest is the caller's
        // contract.
        let done = unsafe {
            match how {
                GroupedBackend::GroupedBatched => batched(&mut st, &groups, stream),
                _ => replayed(&mut st, &groups, replay_key(p, bufs, pv, lanes), lanes, stream),
            }
        };
        // Even after a failure: part of the work may be enqueued.
        self.device().note_use(&mut st, stream)?;
        done
    }
}

impl Plans<'_> {
    /// How [`Gpu::grouped_gemm`] would run `p` on buffers whose starts are 16-byte aligned (as
    /// cudarc's allocations are): the forced backend, or the measured choice or the rule
    /// ([`GroupedSettings::choose`]); where a row of N or K elements misses 16 bytes, a way
    /// through cuBLAS's grouped call becomes the pool (or in order), as on buffers that start
    /// off 16 bytes ([`crate::grouped::align`]).
    ///
    /// # Errors
    /// [`Error::Unsupported`]: the forced backend does not apply to `p` (or to its rows).
    pub fn grouped_backend(&self, p: &GroupedProblem) -> Result<GroupedBackend> {
        let mut st = self.gpu.lock();
        detect_cudnn_moe(&mut st.libs.grouped);
        way_on(&st.libs.grouped, p, [0; 3])
    }
}

/// The way a call of `p` on buffers at `bases` (`[a, b, c]`) takes under `settings`: their
/// choice ([`GroupedSettings::choose`]), off cuBLAS's grouped call where a pointer would miss
/// its alignment ([`grouped_call_misalignment`], [`off_grouped_call`]).
///
/// # Errors
/// [`Error::Unsupported`]: the forced way does not apply to `p` or to these pointers.
fn way_on(settings: &GroupedSettings, p: &GroupedProblem, bases: [u64; 3]) -> Result<GroupedBackend> {
    let misaligned = grouped_call_misalignment(p, bases);
    off_grouped_call(settings.choose(p)?, misaligned, settings.backend.is_some(), || p.describe())
}

/// Settles whether the loaded cuDNN has the MoE grouped matmul (9.18 or later), once: the
/// first grouped call loads libcudnn to read its version (no handle is made).
fn detect_cudnn_moe(settings: &mut GroupedSettings) {
    if settings.cudnn_moe.is_none() {
        let version = crate::cuda::dnn::cudnn_version();
        settings.cudnn_moe = Some(version.is_some_and(|v| v >= crate::cuda::dnn::moe::MOE_VERSION));
    }
}

/// Everything a grouped call's launches depend on, for its replay graph: the product, the
/// precision, N, K, the rows, the bias, every address, the lanes (0: in order) and the group
/// sizes (from which each group's GEMM and slices follow).
fn replay_key(
    p: &GroupedProblem,
    bufs: [(u64, usize); 3],
    bias: Option<(u64, usize)>,
    lanes: Option<usize>,
) -> Vec<u64> {
    let precision = crate::Precision::ALL.iter().position(|&x| x == p.precision()).unwrap_or(usize::MAX);
    let mut key = vec![
        p.op() as u64,
        precision as u64,
        p.n() as u64,
        p.k() as u64,
        p.rows() as u64,
        bias.map_or(0, |b| b.0),
        bufs[0].0,
        bufs[1].0,
        bufs[2].0,
        lanes.unwrap_or(0) as u64,
    ];
    key.extend(p.sizes().iter().map(|&m| m as u64));
    key
}

/// The buffers' type against the precision's, and the bias against the problem.
fn check_types<T: Element>(p: &GroupedProblem, has_bias: bool) -> Result<()> {
    check_precision(p, has_bias)?;
    let pr = p.precision();
    let [a, _, c] = p.op().operands();
    for (which, want) in [(a, pr.input()), (c, pr.output())] {
        if T::DTYPE != want {
            return Err(Error::DTypeMismatch { operand: which, expected: want, got: T::DTYPE });
        }
    }
    Ok(())
}

/// One element type for every buffer (the precision's input and output types agree), and the
/// bias against the problem.
fn check_precision(p: &GroupedProblem, has_bias: bool) -> Result<()> {
    p.check_one_type()?;
    p.check_bias(has_bias)
}

/// Every buffer's length ([`GroupedProblem::lens`], the bias's `E·N`) and the output's extent
/// against every input's (a, b and the bias: an earlier group's rows of c must not be what a
/// later group reads); the spans the call touches.
fn check_extents(
    p: &GroupedProblem,
    bufs: [(u64, usize); 3],
    bias: Option<(u64, usize)>,
    elem: usize,
) -> Result<Vec<Span>> {
    let mut spans = Vec::with_capacity(4);
    let names = p.op().operands();
    for ((which, (addr, have)), elems) in names.into_iter().zip(bufs).zip(p.lens()) {
        spans.push(Span::sized(which, addr, have, elems, elem)?);
    }
    if let Some((addr, have)) = bias {
        spans.push(Span::sized(Which::Bias, addr, have, p.groups().saturating_mul(p.n()), elem)?);
    }
    let (out, ins): (Vec<Span>, Vec<Span>) = spans.iter().partition(|s| s.which == names[2]);
    disjoint(&out, &ins)?;
    Ok(spans)
}

/// One GEMM of a grouped call: its problem, where its operands start in the buffers
/// (elements, `[a, b, c]`) and where its bias starts, if it has one.
type Part = (GemmProblem, [usize; 3], Option<usize>);

/// Every group of `p` as a GEMM ([`Part`]; group e's bias starts at `e·N`).
fn group_parts(p: &GroupedProblem) -> Result<Vec<Part>> {
    (0..p.groups()).map(|e| p.group(e).map(|(g, offs)| (g, offs, p.has_bias().then(|| e * p.n())))).collect()
}

/// Each GEMM of `parts` (a problem, its operands' starts and its bias's, in elements) with
/// work, on its slices of the buffers `bufs` (address, bytes) and of the bias, every one
/// checked as the dense entry checks a call, before any is launched.
fn group_gemms(
    parts: &[Part],
    bufs: [(u64, usize); 3],
    bias: Option<(u64, usize)>,
    elem: usize,
) -> Result<Vec<GroupGemm>> {
    let mut out = Vec::with_capacity(parts.len());
    for (g, offs, bias_at) in parts {
        let dtypes = [g.precision().input(), g.precision().input(), g.precision().output()];
        let slice = |(addr, len): (u64, usize), off: usize| {
            let at = off.saturating_mul(elem).min(len);
            (addr + at as u64, len - at)
        };
        let descs = [0, 1, 2].map(|i| {
            let (address, len_bytes) = slice(bufs[i], offs[i]);
            BufferDesc { address, len_bytes, dtype: dtypes[i] }
        });
        let bias = bias.zip(*bias_at).map(|(v, at)| {
            let (address, len_bytes) = slice(v, at);
            RawBuffer { address, len_bytes }
        });
        check_all(g, descs, RawExtras { bias, ..RawExtras::default() })?;
        if !g.is_empty() {
            let abc = (descs[0].address, descs[1].address, descs[2].address);
            out.push(GroupGemm { p: *g, abc, bias: bias.map(|b| b.address) });
        }
    }
    Ok(out)
}

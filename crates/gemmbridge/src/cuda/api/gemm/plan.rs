//! [`GemmPlan`]: a dense GEMM planned once and held by the caller — the library that serves
//! it and, on cuBLASLt, its descriptors, layouts and chosen algorithm — then run on buffers,
//! each run only checking them and launching.

use std::sync::Mutex;

use cudarc::driver::sys::CUstream;
use cudarc::driver::{DevicePtr, DevicePtrMut};

use super::operands::{check_all, RawExtras};
use super::{checked_call, Extras, RawOperands};
use crate::cuda::api::engine::Gpu;
use crate::cuda::call::GemmCall;
use crate::cuda::call::Scale;
use crate::cuda::device::{Locked, Relaxed};
use crate::cuda::lt::plan::{alignment, LtOperands, Plan, PlanKey};
use crate::cuda::route::dispatch::{self, use_lt, without_lt, WithoutLt};
use crate::cuda::route::Served;
use crate::cuda::status;
use crate::dtype::Element;
use crate::epilogue::Epilogue;
use crate::error::{Error, Result, Which};
use crate::mapping::{column_major_call, ColMajorCall};
use crate::problem::GemmProblem;
use crate::validate::BufferDesc;

/// A dense GEMM ([`GemmProblem`], epilogue included) planned once on one [`Gpu`]: which
/// library serves it and, where that is cuBLASLt, its matmul descriptor, layouts and algorithm
/// (the tactic database's where one applies, else cuBLASLt's heuristic's first), chosen under
/// the engine's settings at the time (backend, SM count target, workspace size). The plan is
/// the caller's: no cache holds it, so it is never evicted or rebuilt, and a run builds and
/// allocates nothing once the stream's workspace exists — a run is capturable into a CUDA
/// graph from then on (the workspace of [`Gpu::stream`] is made with the plan). One case runs
/// the eager way instead, with the eager call's cache: a bias-gradient epilogue cuBLASLt has no
/// fused algorithm for (the plain GEMM, then the gradient as a second GEMM).
///
/// ```no_run
/// use cudarc::driver::CudaSlice;
/// use gemmbridge::cuda::{GemmPlan, Gpu, Scale};
/// use gemmbridge::{GemmProblem, Precision};
/// # fn main() -> Result<(), gemmbridge::Error> {
/// let gpu = Gpu::new(0)?;
/// let p = GemmProblem::linear(64, 64, 64, Precision::F32)?;
/// let plan = GemmPlan::new(&gpu, &p)?;
/// let s = gpu.stream();
/// let a: CudaSlice<f32> = s.alloc_zeros(64 * 64).expect("alloc");
/// let b: CudaSlice<f32> = s.alloc_zeros(64 * 64).expect("alloc");
/// let mut c: CudaSlice<f32> = s.alloc_zeros(64 * 64).expect("alloc");
/// for _ in 0..3 {
///     plan.run(&gpu, Scale::PRODUCT, &a, &b, &mut c, Default::default())?;
/// }
/// # Ok(())
/// # }
/// ```
///
/// A run gives what [`Gpu::gemm_fused`] gives for the same problem, operands and settings,
/// with these differences:
/// - operands are not copied to aligned buffers: every address of A, B and C must be aligned
///   as the plan was made for ([`GemmPlan::alignment`]; 256 bytes by [`GemmPlan::new`], as
///   CUDA's allocators return memory), a bias or aux to 16 bytes, else [`Error::Misaligned`]
///   before anything is enqueued;
/// - the algorithm is the one for the plan's alignment: where the operands are more aligned
///   than that, the eager call may choose another one (same result within rounding, not
///   always bit for bit);
/// - repeated runs are launched directly, never replayed from a cached graph (capture the
///   runs into a graph of your own instead);
/// - settings changed after the plan was made ([`Gpu::update_options`]) do not reach its
///   cuBLASLt plan (a cuBLAS run, and the eager case above, use the engine as it is then).
///
/// Without an epilogue, α = 0 runs on cuBLAS as the eager call does (A and B are not read), and
/// a problem cuBLASLt does not serve (k = 0, [`Backend::Blas`](crate::cuda::Backend::Blas), no
/// cuBLASLt algorithm under [`Backend::Auto`](crate::cuda::Backend::Auto)) is planned on cuBLAS
/// ([`GemmPlan::library`]).
///
/// `GemmPlan` is `Send + Sync`; a run takes the engine's lock for the launch, as an eager call
/// does. Dropping it releases its cuBLASLt descriptors (host objects), before or after the
/// `Gpu`.
pub struct GemmPlan {
    /// The number of the engine that made it (its device layer's `id`).
    engine: u64,
    problem: GemmProblem,
    /// `column_major_call(problem)`.
    cm: ColMajorCall,
    /// The alignment (bytes) A's, B's and C's addresses must have (a bias's or aux's: 16).
    align: u32,
    way: Way,
}

/// How a plan runs.
enum Way {
    /// cuBLASLt with this plan: its descriptors under a lock of their own (a launch sets the
    /// bias and aux pointers on the descriptor), so that the plan is `Sync`.
    Lt(Mutex<Plan>),
    /// cuBLAS (`cublasGemmEx`), as the eager call's cuBLAS way.
    Blas,
    /// The eager call: a bias gradient cuBLASLt has no fused algorithm for.
    Eager,
    /// An empty problem: nothing launches.
    Empty,
}

impl std::fmt::Debug for GemmPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GemmPlan")
            .field("problem", &self.problem.describe())
            .field("library", &self.library())
            .field("alignment", &self.align)
            .field("workspace_bytes", &self.workspace_bytes())
            .finish()
    }
}

impl GemmPlan {
    /// Plans `p` on `gpu` for operands at 256-byte-aligned addresses (what CUDA's allocators
    /// and cudarc's buffers give). [`GemmPlan::aligned_to`] takes less aligned ones.
    ///
    /// # Errors
    /// As [`GemmPlan::aligned_to`].
    pub fn new(gpu: &Gpu, p: &GemmProblem) -> Result<GemmPlan> {
        GemmPlan::aligned_to(gpu, p, 256)
    }

    /// Plans `p` on `gpu` for operands whose addresses are multiples of `align` bytes (a
    /// power of two from 1 to 256; a bias or aux must be 16-byte aligned whatever it is),
    /// under `gpu`'s settings: asks cuBLASLt's heuristic (or takes the tactic database's
    /// algorithm) for the workspace [`Gpu::stream`] has, making that workspace if it is not
    /// made yet. A lower alignment may give a slower algorithm.
    ///
    /// # Errors
    /// Nothing is kept on an error. [`Error::OutOfRange`] for an `align` that is not a power
    /// of two from 1 to 256; [`Error::Unsupported`] / [`Error::LibraryNotFound`] where no
    /// library can serve the problem under the backend (as the eager call); [`Error::Cublas`]
    /// where cuBLASLt has no algorithm and no fallback applies (an epilogue other than a bias
    /// gradient); [`Error::NotCapturable`] while [`Gpu::stream`] is being captured and has
    /// no workspace yet; [`Error::Driver`].
    pub fn aligned_to(gpu: &Gpu, p: &GemmProblem, align: usize) -> Result<GemmPlan> {
        if !(1..=256).contains(&align) || !align.is_power_of_two() {
            let expected = "a power of two from 1 to 256 (bytes)".to_string();
            return Err(Error::OutOfRange { what: "plan alignment", value: align as u64, expected });
        }
        let (engine, cm, align) = (gpu.device().id(), column_major_call(p), align as u32);
        let plan = |way| GemmPlan { engine, problem: *p, cm, align, way };
        if p.is_empty() {
            return Ok(plan(Way::Empty));
        }
        gpu.device().bind()?;
        let mut st = gpu.lock();
        let describe = || p.describe();
        // made now, so that a run on the Gpu's stream creates nothing (cuBLAS binds it too)
        let ws = st.dev.workspaces.get(gpu.stream().cu_stream(), &describe)?;
        if !use_lt(&st.libs, p)? {
            return Ok(plan(Way::Blas));
        }
        let Locked { libs, .. } = &mut *st;
        let (backend, lt) = (libs.backend, libs.lt.as_mut().expect("use_lt implies a handle"));
        let key = PlanKey { sm_count: lt.sm_count, ..PlanKey::aligned(p, cm, align, ws.matmul_bytes) };
        let _relaxed = Relaxed::enter()?; // the heuristic query, beside another thread's capture
        match lt.build_plan(&key, p) {
            Ok(built) => Ok(plan(Way::Lt(Mutex::new(built)))),
            // the eager call's fallbacks
            Err(e) => match without_lt(backend, p) {
                Some(WithoutLt::Blas) => Ok(plan(Way::Blas)),
                Some(WithoutLt::BiasGradUnfused) => Ok(plan(Way::Eager)),
                None => Err(status::with_problem(e, p)),
            },
        }
    }

    /// The problem planned.
    pub fn problem(&self) -> &GemmProblem {
        &self.problem
    }

    /// The library a run launches on (`None`: the problem is empty, nothing launches). With
    /// α = 0 and no epilogue a run takes cuBLAS whatever this says.
    pub fn library(&self) -> Option<Served> {
        match &self.way {
            Way::Lt(_) | Way::Eager => Some(Served::Lt),
            Way::Blas => Some(Served::Blas),
            Way::Empty => None,
        }
    }

    /// The alignment (bytes) the plan was made for: every operand's address must be a multiple
    /// of it (a bias's or aux's, of 16).
    pub fn alignment(&self) -> usize {
        self.align as usize
    }

    /// Bytes of the stream's workspace the chosen cuBLASLt algorithm uses (0 on cuBLAS).
    pub fn workspace_bytes(&self) -> usize {
        match &self.way {
            Way::Lt(plan) => plan.lock().unwrap_or_else(|p| p.into_inner()).algo.workspace,
            Way::Blas | Way::Eager | Way::Empty => 0,
        }
    }

    /// `C = epilogue(α·op(A)·op(B) + β·C)` on cudarc device memory, enqueued on
    /// [`Gpu::stream`]: the operands of [`Gpu::gemm_fused`], with its rules.
    ///
    /// # Errors
    /// Before anything is enqueued, with no buffer touched: [`Gpu::gemm_fused`]'s operand
    /// errors ([`Error::WrongContext`] first, for a buffer of another device's context);
    /// [`Error::ForeignPlan`] when `gpu` is not the engine the plan was made on;
    /// [`Error::Misaligned`] for an address off the plan's alignment. From the launch:
    /// [`Error::Cublas`], [`Error::OutOfRange`] where the stream's workspace is smaller than
    /// the plan's algorithm needs, [`Error::NotCapturable`] (the first call on a stream
    /// without a workspace, inside a capture), [`Error::Driver`].
    pub fn run<TI, TO, A, B, C>(
        &self,
        gpu: &Gpu,
        scale: Scale,
        a: &A,
        b: &B,
        c: &mut C,
        extras: Extras<'_, TO>,
    ) -> Result<()>
    where
        TI: Element,
        TO: Element,
        A: DevicePtr<TI>,
        B: DevicePtr<TI>,
        C: DevicePtrMut<TO>,
    {
        // SAFETY: `with_typed` hands over addresses of live cudarc allocations of gpu's
        // context, borrowed until the call returns, with their byte lengths.
        gpu.with_typed(&self.problem, a, b, c, extras, |descs, extras, s| unsafe {
            self.launch(gpu, scale, descs, extras, s)
        })
    }

    /// [`GemmPlan::run`] on device memory given by address, enqueued on `stream`: the
    /// operands of [`Gpu::gemm_raw`].
    ///
    /// # Safety
    /// [`Gpu::gemm_raw`]'s contract.
    ///
    /// # Errors
    /// As [`GemmPlan::run`], with [`Gpu::gemm_raw`]'s operand errors ([`Error::NotDeviceMemory`]
    /// with [`GpuOptions::check_raw_addresses`](crate::cuda::GpuOptions::check_raw_addresses) on).
    pub unsafe fn run_raw(&self, gpu: &Gpu, scale: Scale, ops: RawOperands, stream: CUstream) -> Result<()> {
        let (descs, extras) = (ops.descs(&self.problem), ops.extras());
        self.check_engine(gpu)?;
        check_all(&self.problem, descs, extras)?;
        if gpu.device().checks_raw_addresses() {
            gpu.check_addresses(&self.problem, descs, extras)?;
        }
        // SAFETY: checked above; the rest is forwarded from the caller.
        unsafe { self.launch_checked(gpu, scale, descs, extras, stream) }
    }

    /// [`Error::ForeignPlan`] unless `gpu` made this plan.
    fn check_engine(&self, gpu: &Gpu) -> Result<()> {
        if gpu.device().id() == self.engine {
            Ok(())
        } else {
            Err(Error::ForeignPlan { plan: "GemmPlan" })
        }
    }

    /// Checks the engine and the buffers, then [`GemmPlan::launch_checked`].
    ///
    /// # Safety
    /// [`Gpu::gemm_raw`]'s contract for `descs`, `extras` and `stream`.
    unsafe fn launch(
        &self,
        gpu: &Gpu,
        scale: Scale,
        descs: [BufferDesc; 3],
        extras: RawExtras,
        stream: CUstream,
    ) -> Result<()> {
        self.check_engine(gpu)?;
        check_all(&self.problem, descs, extras)?;
        // SAFETY: checked above; the rest is the caller's contract.
        unsafe { self.launch_checked(gpu, scale, descs, extras, stream) }
    }

    /// Launches the plan on checked buffers: cuBLASLt's plan (after the alignment check), or
    /// cuBLAS (its way, and α = 0 without an epilogue), or the eager call.
    ///
    /// # Safety
    /// As [`GemmPlan::launch`]; the engine and the buffers were checked.
    unsafe fn launch_checked(
        &self,
        gpu: &Gpu,
        scale: Scale,
        descs: [BufferDesc; 3],
        extras: RawExtras,
        stream: CUstream,
    ) -> Result<()> {
        let p = &self.problem;
        let call = checked_call(p, self.cm, scale, descs, extras, stream);
        let plan = match &self.way {
            Way::Empty => return Ok(()),
            // SAFETY (all three): checked by the caller; the rest is the caller's contract.
            Way::Eager => return unsafe { gpu.enqueue_checked(p, scale, descs, extras, stream) },
            Way::Blas => return unsafe { launch_blas(gpu, &call) },
            Way::Lt(_) if scale.alpha == 0.0 && p.epilogue() == Epilogue::None => {
                return unsafe { launch_blas(gpu, &call) };
            }
            Way::Lt(plan) => plan,
        };
        self.check_alignment(descs, extras)?;
        let ops = LtOperands::new(&call.cm, call.abc, call.bias, call.aux).with_c_in(call.c_in);
        gpu.device().bind()?;
        let mut st = gpu.lock();
        let describe = || p.describe();
        let ws = st.dev.workspaces.get(stream, &describe)?;
        let plan = plan.lock().unwrap_or_else(|p| p.into_inner());
        if plan.algo.workspace > ws.matmul_bytes {
            return Err(Error::OutOfRange {
                what: "plan workspace bytes",
                value: plan.algo.workspace as u64,
                expected: format!(
                    "at most {}, this stream's workspace (made after the workspace size was lowered): run on a \
                     stream whose workspace is as large as the plan's Gpu stream's",
                    ws.matmul_bytes
                ),
            });
        }
        let lt = st.libs.lt.as_ref().expect("a cuBLASLt plan implies the handle");
        // SAFETY: the buffers were checked for the problem and the plan's alignment; the
        // workspace is this stream's and large enough; the rest is the caller's contract.
        let launched =
            unsafe { plan.launch(&lt.handle, &plan.algo, (scale.alpha, scale.beta), &ops, &ws, stream as _) };
        drop(plan);
        // Even after a failure, as the eager call: the teardown must wait for this stream.
        gpu.device().note_use(&mut st, stream)?;
        launched.map_err(|e| status::with_problem(e, p))
    }

    /// [`Error::Misaligned`] for the first operand whose address is off its alignment: the
    /// plan's for A, B and C (and a separate C), 16 bytes for a bias or aux (what the eager
    /// call gives cuBLASLt; the heuristic is told only A's, B's and C's).
    fn check_alignment(&self, [a, b, c]: [BufferDesc; 3], extras: RawExtras) -> Result<()> {
        let operands = [
            (Which::A, Some(a.address), self.align),
            (Which::B, Some(b.address), self.align),
            (Which::C, Some(c.address), self.align),
            (Which::CIn, extras.c_in.map(|r| r.address), self.align),
            (Which::Bias, extras.bias.map(|r| r.address), 16),
            (Which::Aux, extras.aux.map(|r| r.address), 16),
        ];
        for (operand, address, align) in operands {
            if let Some(address) = address.filter(|&x| alignment(x) < align) {
                return Err(Error::Misaligned { operand, address, align: align as usize });
            }
        }
        Ok(())
    }
}

/// cuBLAS on a checked call without an epilogue, as the eager call's cuBLAS way (a separate C
/// copied into the output first; with α = 0, A and B are not read).
///
/// # Safety
/// As [`GemmPlan::launch_checked`].
unsafe fn launch_blas(gpu: &Gpu, call: &GemmCall) -> Result<()> {
    gpu.device().bind()?;
    let mut st = gpu.lock();
    // SAFETY: checked by the caller.
    let launched = unsafe { dispatch::blas(&mut st, call) };
    gpu.device().note_use(&mut st, call.stream)?;
    launched
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::precision::Precision;

    /// The alignment check alone (no device): an address is refused exactly when it is off the
    /// plan's alignment, a bias and an aux off 16 bytes too.
    #[test]
    fn addresses_off_the_plans_alignment_are_named() {
        let p = GemmProblem::linear(8, 8, 8, Precision::F32).unwrap();
        let plan = |align| GemmPlan { engine: 0, problem: p, cm: column_major_call(&p), align, way: Way::Empty };
        let desc = |address| BufferDesc { address, len_bytes: 256, dtype: crate::dtype::DType::F32 };
        let none = RawExtras { c_in: None, bias: None, aux: None };
        let at = |a, b, c| [desc(a), desc(b), desc(c)];
        assert!(plan(256).check_alignment(at(0x1000, 0x2000, 0x3000), none).is_ok());
        match plan(256).check_alignment(at(0x1000, 0x2010, 0x3000), none) {
            Err(Error::Misaligned { operand: Which::B, address: 0x2010, align: 256 }) => {}
            r => panic!("{r:?}"),
        }
        assert!(plan(16).check_alignment(at(0x1010, 0x2030, 0x3050), none).is_ok());
        match plan(4).check_alignment(at(0x1004, 0x2004, 0x3002), none) {
            Err(Error::Misaligned { operand: Which::C, address: 0x3002, align: 4 }) => {}
            r => panic!("{r:?}"),
        }
        let raw = |address| Some(crate::cuda::RawBuffer { address, len_bytes: 64 });
        let bias = RawExtras { bias: raw(0x4008), ..none };
        match plan(4).check_alignment(at(0x1004, 0x2004, 0x3004), bias) {
            Err(Error::Misaligned { operand: Which::Bias, address: 0x4008, align: 16 }) => {}
            r => panic!("{r:?}"),
        }
        // a bias at 16 bytes is taken under a plan for 256-byte operands, as the eager call takes it
        let bias16 = RawExtras { bias: raw(0x4010), aux: raw(0x5030), ..none };
        assert!(plan(256).check_alignment(at(0x1000, 0x2000, 0x3000), bias16).is_ok());
        let c_in = RawExtras { c_in: raw(0x5080), ..none };
        match plan(256).check_alignment(at(0x1000, 0x2000, 0x3000), c_in) {
            Err(Error::Misaligned { operand: Which::CIn, address: 0x5080, align: 256 }) => {}
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn a_plan_names_what_it_runs() {
        let p = GemmProblem::linear(0, 8, 8, Precision::F32).unwrap();
        let plan = GemmPlan { engine: 7, problem: p, cm: column_major_call(&p), align: 256, way: Way::Empty };
        assert_eq!((plan.library(), plan.alignment(), plan.workspace_bytes()), (None, 256, 0));
        assert!(format!("{plan:?}").contains("GemmPlan"));
    }
}

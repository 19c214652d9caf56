//! [`GemmPlan`]: a dense GEMM planned once and held by the caller — the library that serves
//! it and, on cuBLASLt, its descriptors, layouts and chosen algorithm — then run on buffers,
//! each run only checking them and launching.

use std::sync::Mutex;

use cudarc::driver::sys::CUstream;
use cudarc::driver::{DevicePtr, DevicePtrMut};

use super::operands::{check_all, RawExtras};
use super::{Extras, RawOperands};
use crate::cuda::api::engine::Gpu;
use crate::cuda::call::Scale;
use crate::cuda::device::{Locked, Relaxed};
use crate::cuda::lt::plan::{alignment, LtOperands, Plan, PlanKey};
use crate::cuda::route::dispatch::use_lt;
use crate::cuda::route::{Backend, Served};
use crate::cuda::status;
use crate::dtype::Element;
use crate::epilogue::{Epilogue, VectorUse};
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
/// graph from then on (the workspace of [`Gpu::stream`] is made with the plan).
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
/// with these differences, each stated where it applies:
/// - operands are not copied to aligned buffers: every address must be aligned as the plan
///   was made for ([`GemmPlan::alignment`]; 256 bytes by [`GemmPlan::new`], as CUDA's
///   allocators return memory), else [`Error::Misaligned`] before anything is enqueued;
/// - repeated runs are launched directly, never replayed from a cached graph (capture the
///   runs into a graph of your own instead);
/// - settings changed after a cuBLASLt plan was made ([`Gpu::update_options`]) do not reach
///   it (where the plan itself runs the eager way — cuBLAS, or cuBLASLt's unfused bias
///   gradient — each run follows the settings of its time).
///
/// α = 0 without an epilogue runs as the eager call does (cuBLAS: A and B are not read), and
/// so does a problem cuBLASLt does not serve ([`GemmPlan::library`]).
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
    /// The alignment (bytes) every operand's address must have; at least 16 for a bias or aux.
    align: u32,
    way: Way,
}

/// How a plan runs.
enum Way {
    /// cuBLASLt with this plan: its descriptors under a lock of their own (a launch sets the
    /// bias and aux pointers on the descriptor), so that the plan is `Sync`.
    Lt(Mutex<Plan>),
    /// As the eager call runs it (nothing launches for an empty problem): cuBLAS, or cuBLASLt's
    /// plain GEMM with the bias gradient as a second GEMM where cuBLASLt has no fused one.
    Eager(Option<Served>),
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
    /// power of two from 1 to 256; a bias or aux at least 16, as the eager call requires),
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
            return Ok(plan(Way::Eager(None)));
        }
        gpu.device().bind()?;
        let mut st = gpu.lock();
        if !use_lt(&st.libs, p)? {
            return Ok(plan(Way::Eager(Some(Served::Blas))));
        }
        let describe = || p.describe();
        let ws = st.dev.workspaces.get(gpu.stream().cu_stream(), &describe)?;
        let Locked { libs, .. } = &mut *st;
        let (backend, lt) = (libs.backend, libs.lt.as_mut().expect("use_lt implies a handle"));
        let key = PlanKey { sm_count: lt.sm_count, ..PlanKey::aligned(p, cm, align, ws.matmul_bytes) };
        let _relaxed = Relaxed::enter()?; // the heuristic query, beside another thread's capture
        match lt.build_plan(&key, p) {
            Ok(built) => Ok(plan(Way::Lt(Mutex::new(built)))),
            // the eager call's fallbacks (`route::dispatch::route`)
            Err(_) if backend == Backend::Auto && p.epilogue() == Epilogue::None => {
                Ok(plan(Way::Eager(Some(Served::Blas))))
            }
            Err(_) if p.epilogue().vector() == VectorUse::WritesGrad => Ok(plan(Way::Eager(Some(Served::Lt)))),
            Err(e) => Err(status::with_problem(e, p)),
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
            Way::Lt(_) => Some(Served::Lt),
            Way::Eager(served) => *served,
        }
    }

    /// The alignment (bytes) the plan was made for: every operand's address must be a multiple
    /// of it (a bias or aux of 16 at least).
    pub fn alignment(&self) -> usize {
        self.align as usize
    }

    /// Bytes of the stream's workspace the chosen cuBLASLt algorithm uses (0 on cuBLAS).
    pub fn workspace_bytes(&self) -> usize {
        match &self.way {
            Way::Lt(plan) => plan.lock().unwrap_or_else(|p| p.into_inner()).algo.workspace,
            Way::Eager(_) => 0,
        }
    }

    /// `C = epilogue(α·op(A)·op(B) + β·C)` on cudarc device memory, enqueued on
    /// [`Gpu::stream`]: the operands of [`Gpu::gemm_fused`], with its rules.
    ///
    /// # Errors
    /// Before anything is enqueued, with no buffer touched: [`Error::ForeignPlan`] when `gpu`
    /// is not the engine the plan was made on; [`Gpu::gemm_fused`]'s operand errors;
    /// [`Error::Misaligned`] for an address off the plan's alignment. From the launch:
    /// [`Error::Cublas`], [`Error::OutOfRange`] where the stream's workspace is smaller than
    /// the plan's algorithm needs (the workspace size was lowered after the plan was made),
    /// [`Error::NotCapturable`] (a first call on a stream being captured), [`Error::Driver`].
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
        if gpu.device().checks_raw_addresses() {
            self.check_engine(gpu)?;
            check_all(&self.problem, descs, extras)?;
            gpu.check_addresses(&self.problem, descs, extras)?;
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.launch(gpu, scale, descs, extras, stream) }
    }

    /// [`Error::ForeignPlan`] unless `gpu` made this plan.
    fn check_engine(&self, gpu: &Gpu) -> Result<()> {
        if gpu.device().id() == self.engine {
            Ok(())
        } else {
            Err(Error::ForeignPlan { plan: "GemmPlan" })
        }
    }

    /// Checks the buffers, then launches the plan (or runs the eager call where the plan says
    /// so, or α = 0 without an epilogue).
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
        let p = &self.problem;
        check_all(p, descs, extras)?;
        let plan = match &self.way {
            Way::Lt(plan) if scale.alpha != 0.0 || p.epilogue() != Epilogue::None => plan,
            // SAFETY: checked above; the rest is the caller's contract.
            _ => return unsafe { gpu.enqueue_checked(p, scale, descs, extras, stream) },
        };
        self.check_alignment(descs, extras)?;
        let [a, b, c] = descs.map(|d| d.address);
        let c_in = extras.c_in.map(|r| r.address).filter(|&ci| ci != c);
        let addr = |r: Option<super::RawBuffer>| r.map(|r| r.address);
        let ops = LtOperands::new(&self.cm, (a, b, c), addr(extras.bias), addr(extras.aux)).with_c_in(c_in);
        gpu.device().bind()?;
        let mut st = gpu.lock();
        let describe = || p.describe();
        let ws = st.dev.workspaces.get(stream, &describe)?;
        let plan = plan.lock().unwrap_or_else(|p| p.into_inner());
        if plan.algo.workspace > ws.matmul_bytes {
            return Err(Error::OutOfRange {
                what: "plan workspace bytes",
                value: plan.algo.workspace as u64,
                expected: format!("at most {}, this stream's workspace: make the plan again", ws.matmul_bytes),
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

    /// [`Error::Misaligned`] for the first operand whose address is off the plan's alignment
    /// (a bias or aux: off 16 bytes or the plan's alignment, whichever is more).
    fn check_alignment(&self, [a, b, c]: [BufferDesc; 3], extras: RawExtras) -> Result<()> {
        let at_least_16 = self.align.max(16);
        let operands = [
            (Which::A, Some(a.address), self.align),
            (Which::B, Some(b.address), self.align),
            (Which::C, Some(c.address), self.align),
            (Which::CIn, extras.c_in.map(|r| r.address), self.align),
            (Which::Bias, extras.bias.map(|r| r.address), at_least_16),
            (Which::Aux, extras.aux.map(|r| r.address), at_least_16),
        ];
        for (operand, address, align) in operands {
            if let Some(address) = address.filter(|&x| alignment(x) < align) {
                return Err(Error::Misaligned { operand, address, align: align as usize });
            }
        }
        Ok(())
    }
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
        let plan = |align| GemmPlan { engine: 0, problem: p, cm: column_major_call(&p), align, way: Way::Eager(None) };
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
        let c_in = RawExtras { c_in: raw(0x5080), ..none };
        match plan(256).check_alignment(at(0x1000, 0x2000, 0x3000), c_in) {
            Err(Error::Misaligned { operand: Which::CIn, address: 0x5080, align: 256 }) => {}
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn a_plan_names_what_it_runs() {
        let p = GemmProblem::linear(0, 8, 8, Precision::F32).unwrap();
        let plan = GemmPlan { engine: 7, problem: p, cm: column_major_call(&p), align: 256, way: Way::Eager(None) };
        assert_eq!((plan.library(), plan.alignment(), plan.workspace_bytes()), (None, 256, 0));
        assert!(format!("{plan:?}").contains("GemmPlan"));
    }
}

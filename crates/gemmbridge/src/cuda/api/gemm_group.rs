//! The general form of a grouped GEMM: a list of independent GEMMs, each with its own problem
//! (shapes, layouts, precision) and buffers, run together the way
//! [`crate::grouped::streams::GroupedSettings::choose_list`] picks (cuBLAS's grouped call, the pool of streams, the split pool or in order) — validate
//! (every member as the dense entry checks it, every output apart from every input and from the
//! other outputs) → the routing floor's grouped launches (`route/grouped.rs`). Nothing is
//! launched until every member has passed.

use cudarc::driver::sys::CUstream;
use cudarc::driver::{DevicePtr, DevicePtrMut};

use super::checks::same_context;
use super::engine::Gpu;
use super::operands::{check_all, RawBuffer, RawOperands};
use super::plans::Plans;
use crate::cuda::route::grouped::{batched, replayed, split, GroupGemm};
use crate::dtype::Element;
use crate::epilogue::Epilogue;
use crate::error::{Error, Result, Which};
use crate::grouped::align::{first_misaligned, misaligned_pointer, off_grouped_call};
use crate::grouped::check_one_type;
use crate::grouped::streams::GroupedBackend;
use crate::layout::{MatrixLayout, Op, Operand};
use crate::problem::GemmProblem;
use crate::validate::{spans as spans_of, BufferDesc};

/// One GEMM of a general grouped call ([`Gpu::gemm_group`]): `c = op(a)·op(b) (+ bias)` for
/// its own `problem` (any shapes, layouts and batch; [`Epilogue::None`] or [`Epilogue::Bias`]),
/// on its own buffers. Every buffer holds `T`, the problem's input and output type.
pub struct GroupMember<'a, T> {
    /// The GEMM (row-major, as [`Gpu::gemm`] takes it).
    pub problem: GemmProblem,
    /// A, read.
    pub a: &'a dyn DevicePtr<T>,
    /// B, read.
    pub b: &'a dyn DevicePtr<T>,
    /// C, written.
    pub c: &'a mut dyn DevicePtrMut<T>,
    /// The bias `[n]`, read, exactly when the problem's epilogue is [`Epilogue::Bias`].
    pub bias: Option<&'a dyn DevicePtr<T>>,
}

impl Gpu {
    /// Runs every GEMM of `members` ([`GroupMember`]: each its own problem and buffers) as one
    /// grouped call on [`Gpu::stream`]: `c = op(a)·op(b) (+ bias)` each (α = 1, β = 0), the way
    /// [`crate::grouped::streams::GroupedSettings::choose_list`] picks — cuBLAS's grouped call for
    /// small plain GEMMs of one precision (not capturable: its pointer arrays are copied from the
    /// host), else each GEMM's cuBLASLt plan on the pool of the engine's streams
    /// ([`GpuOptions::grouped_streams`](crate::cuda::GpuOptions::grouped_streams)) forked from and
    /// joined to [`Gpu::stream`], or in order where one GEMM has work;
    /// [`GpuOptions::grouped_backend`](crate::cuda::GpuOptions::grouped_backend) forces a way. A
    /// pooled call repeated with the same members (problems and addresses) is captured once into
    /// one CUDA graph and replayed. Work enqueued on [`Gpu::stream`] afterwards sees every GEMM.
    /// The members may come in any order and run in any order: no output may be another member's
    /// input.
    ///
    /// # Errors
    /// Before anything is launched, with nothing written: [`Error::GroupMember`] naming the
    /// member and its own error — [`Error::WrongContext`], [`Error::DTypeMismatch`] (`T`
    /// against its precision, whose input and output types must agree), the checks of
    /// [`Gpu::gemm`] ([`Error::BufferTooSmall`], [`Error::Misaligned`], …),
    /// [`Error::EpilogueOperand`] (a bias given without [`Epilogue::Bias`] or missing with it),
    /// [`Error::Unsupported`] for another epilogue, [`Error::OutputOverlapsInput`] within the
    /// member; [`Error::GroupedShape`] when an output overlaps another member's buffer (both
    /// named; checked in one sort of the buffers, O(n log n)); [`Error::Unsupported`] for a
    /// forced way that does not apply (a strided batch, which is for a grouped product's
    /// layout; cuBLAS's grouped call where it does not take the list:
    /// [`Plans::gemm_group_backend`] says, or where a pointer is off 16 bytes,
    /// [`crate::grouped::align`]). From the launches: as [`Gpu::gemm`] (a failure
    /// part-way leaves other members written; the pool is joined back all the same).
    ///
    /// # Example
    /// ```no_run
    /// use gemmbridge::cuda::{Gpu, GroupMember};
    /// use gemmbridge::half::bf16;
    /// use gemmbridge::{GemmProblem, Precision};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let gpu = Gpu::new(0)?;
    /// let s = gpu.stream();
    /// // two unlike GEMMs: a [64, 128]·[256, 128]ᵀ linear layer and a [7, 32]·[32, 16] matmul
    /// let (p0, p1) = (GemmProblem::linear(64, 256, 128, Precision::BF16)?, GemmProblem::matmul(7, 16, 32, Precision::BF16)?);
    /// let (x, w, mut y) = (s.alloc_zeros::<bf16>(64 * 128)?, s.alloc_zeros::<bf16>(256 * 128)?, s.alloc_zeros::<bf16>(64 * 256)?);
    /// let (a, b, mut c) = (s.alloc_zeros::<bf16>(7 * 32)?, s.alloc_zeros::<bf16>(32 * 16)?, s.alloc_zeros::<bf16>(7 * 16)?);
    /// gpu.gemm_group(&mut [
    ///     GroupMember { problem: p0, a: &x, b: &w, c: &mut y, bias: None },
    ///     GroupMember { problem: p1, a: &a, b: &b, c: &mut c, bias: None },
    /// ])?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn gemm_group<T: Element>(&self, members: &mut [GroupMember<'_, T>]) -> Result<()> {
        let (ctx, s) = (self.context(), self.stream());
        for (index, m) in members.iter().enumerate() {
            let ins = [(Which::A, m.a.stream()), (Which::B, m.b.stream()), (Which::C, m.c.stream())];
            let bias = m.bias.map(|v| (Which::Bias, v.stream()));
            for (which, stream) in ins.into_iter().chain(bias) {
                same_context(which, stream, ctx).map_err(|e| member(index, e))?;
            }
            let pr = m.problem.precision();
            for (which, want) in [(Which::A, pr.input()), (Which::C, pr.output())] {
                if T::DTYPE != want {
                    let e = Error::DTypeMismatch { operand: which, expected: want, got: T::DTYPE };
                    return Err(member(index, e));
                }
            }
        }
        let mut list = Vec::with_capacity(members.len());
        let mut guards = Vec::with_capacity(4 * members.len());
        for m in members.iter_mut() {
            let raw = |(address, g): (u64, _), len_bytes| (RawBuffer { address, len_bytes }, g);
            let (a, ga) = raw(m.a.device_ptr(s), m.a.num_bytes());
            let (b, gb) = raw(m.b.device_ptr(s), m.b.num_bytes());
            let c_len = m.c.num_bytes();
            let (c, gc) = raw(m.c.device_ptr_mut(s), c_len);
            let mut ops = RawOperands::new(a, b, c);
            if let Some(v) = m.bias {
                let (bias, gv) = raw(v.device_ptr(s), v.num_bytes());
                ops = ops.with_bias(bias);
                guards.push(gv);
            }
            guards.extend([ga, gb, gc]);
            list.push((m.problem, ops));
        }
        // SAFETY: every address is a live cudarc allocation of this context borrowed for this
        // call (the guards above); `group_checked` checks every member before any launch.
        unsafe { self.group_checked(&list, s.cu_stream()) }
    }

    /// [`Gpu::gemm_group`] on device memory given by address: each member a problem and its
    /// [`RawOperands`] (A, B, C and, with [`Epilogue::Bias`], the bias; lengths in bytes; the
    /// inputs of the precision's input type, C and the bias of its output type, which must be
    /// the same), enqueued on `stream` (the pool forks from and joins back to it).
    ///
    /// # Safety
    /// As [`Gpu::gemm_raw`], for every member: device memory of this context valid until the call
    /// has run on `stream`, `stream` a live stream of this context, and nothing touching the
    /// buffers concurrently except in stream order. With
    /// [`GpuOptions::check_raw_addresses`](crate::cuda::GpuOptions::check_raw_addresses) on, an
    /// address this GPU cannot access is an error instead of a fault.
    ///
    /// # Errors
    /// As [`Gpu::gemm_group`] ([`Error::GroupMember`] for a member, with
    /// [`Error::NullPointer`] and [`Error::NotDeviceMemory`] among its errors).
    pub unsafe fn gemm_group_raw(&self, members: &[(GemmProblem, RawOperands)], stream: CUstream) -> Result<()> {
        if self.device().checks_raw_addresses() {
            // every member as `gemm_raw` checks its addresses: the bytes its problem touches
            for (index, (p, ops)) in members.iter().enumerate() {
                let (descs, extras) = (ops.descs(p), ops.extras());
                check_all(p, descs, extras)
                    .and_then(|()| self.check_addresses(p, descs, extras))
                    .map_err(|e| member(index, e))?;
            }
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.group_checked(members, stream) }
    }

    /// Checks every member, then runs the list the chosen way on `stream`.
    ///
    /// # Safety
    /// The caller's contract of [`Gpu::gemm_group_raw`].
    unsafe fn group_checked(&self, members: &[(GemmProblem, RawOperands)], stream: CUstream) -> Result<()> {
        let groups = check_members(members)?;
        let problems: Vec<GemmProblem> = members.iter().map(|(p, _)| *p).collect();
        let how = {
            let st = self.lock();
            let chosen = st.libs.grouped.choose_list(&problems)?;
            // a way through cuBLAS's grouped call only on pointers it takes (grouped::align)
            let pointers =
                groups.iter().flat_map(|g| [Which::A, Which::B, Which::C].into_iter().zip(<[u64; 3]>::from(g.abc)));
            let misaligned = first_misaligned(pointers).map(|(which, addr)| misaligned_pointer(which, addr));
            let forced = st.libs.grouped.backend.is_some();
            off_grouped_call(chosen, misaligned, forced, groups.len(), || format!("a list of {} GEMMs", members.len()))?
        };
        if groups.is_empty() {
            return Ok(()); // no member has work: nothing to launch
        }
        self.device().bind()?;
        let mut st = self.lock();
        let lanes = st.libs.grouped.streams;
        // SAFETY: every member passed the dense entry's checks and the outputs are apart from
        // every input and from each other; the key encodes every member's problem and
        // addresses and the lanes; the rest is the caller's contract.
        let done = unsafe {
            match how {
                GroupedBackend::GroupedBatched => batched(&mut st, &groups, stream),
                GroupedBackend::SplitPool => split(&mut st, &groups, lanes, stream),
                GroupedBackend::InOrder => replayed(&mut st, &groups, list_key(&groups, None), None, stream),
                _ => replayed(&mut st, &groups, list_key(&groups, Some(lanes)), Some(lanes), stream),
            }
        };
        // Even after a failure: part of the work may be enqueued.
        self.device().note_use(&mut st, stream)?;
        done
    }
}

/// [`Error::GroupMember`] for member `index`.
fn member(index: usize, error: Error) -> Error {
    Error::GroupMember { index, error: Box::new(error) }
}

/// Every member as the dense entry checks a call (its epilogue none or a bias, its types one),
/// then every output apart from every input and from the other outputs ([`apart`]); the
/// members with work as the routing floor's groups.
fn check_members(members: &[(GemmProblem, RawOperands)]) -> Result<Vec<GroupGemm>> {
    let mut spans = Vec::with_capacity(4 * members.len());
    let mut groups = Vec::with_capacity(members.len());
    for (index, (p, ops)) in members.iter().enumerate() {
        let one = |e| member(index, e);
        let pr = p.precision();
        check_one_type(pr, &pr.to_string()).map_err(one)?;
        if !matches!(p.epilogue(), Epilogue::None | Epilogue::Bias) || ops.aux.is_some() {
            let what = format!("epilogue {} (a grouped GEMM takes none or a bias)", p.epilogue());
            return Err(one(Error::Unsupported { backend: "grouped GEMM", what }));
        }
        let (descs, extras) = (ops.descs(p), ops.extras());
        check_all(p, descs, extras).map_err(one)?;
        let bias = extras.bias.map(|v| BufferDesc { address: v.address, len_bytes: v.len_bytes, dtype: pr.output() });
        for (which, e, writes) in spans_of(p, descs, bias, None).map_err(one)? {
            if e.end > e.start {
                spans.push(Touch { index, which, start: e.start, end: e.end, writes });
            }
        }
        if !p.is_empty() {
            let abc = (ops.a.address, ops.b.address, ops.c.address);
            groups.push(GroupGemm { p: *p, abc, bias: extras.bias.map(|b| b.address) });
        }
    }
    apart(spans)?;
    Ok(groups)
}

/// The byte range a member's buffer touches.
struct Touch {
    index: usize,
    which: Which,
    start: u64,
    end: u64,
    writes: bool,
}

/// No written range overlaps another range of the list (reads may share bytes): one sweep in
/// address order, O(n log n) in the buffers. Within one member the dense entry's checks
/// (`check_all`) have already judged the pairs.
///
/// # Errors
/// [`Error::GroupedShape`] naming both members, buffers and ranges.
fn apart(mut spans: Vec<Touch>) -> Result<()> {
    spans.sort_unstable_by_key(|t| (t.start, t.end));
    // the furthest-reaching range so far, and the furthest-reaching written one
    let (mut any, mut written): (Option<usize>, Option<usize>) = (None, None);
    for i in 0..spans.len() {
        let t = &spans[i];
        let hit = match (t.writes, any, written) {
            (true, Some(j), _) if t.start < spans[j].end => Some(j),
            (false, _, Some(j)) if t.start < spans[j].end => Some(j),
            _ => None,
        };
        if let Some(j) = hit {
            let (a, b) = (&spans[j], t);
            let range = |t: &Touch| format!("GEMM {}'s {} [{:#x}, {:#x})", t.index, t.which, t.start, t.end);
            let detail = format!("{} and {}", range(a), range(b));
            return Err(Error::GroupedShape { what: "a written buffer overlaps another buffer of the list", detail });
        }
        if any.is_none_or(|j| t.end > spans[j].end) {
            any = Some(i);
        }
        if t.writes && written.is_none_or(|j| t.end > spans[j].end) {
            written = Some(i);
        }
    }
    Ok(())
}

/// Everything a list's launches depend on, for its replay graph: a tag no grouped product's
/// key starts with, the lanes (0: in order), then per member its precision, epilogue, batch,
/// the three layouts (with A's and B's op) and the addresses of A, B, C and the bias.
fn list_key(groups: &[GroupGemm], lanes: Option<usize>) -> Vec<u64> {
    let position = |found: Option<usize>| found.unwrap_or(usize::MAX) as u64;
    let layout = |l: MatrixLayout| [l.rows, l.cols, l.ld, l.batch_stride].map(|x| x as u64);
    let operand = |o: Operand| {
        let [r, c, ld, bs] = layout(o.layout);
        [u64::from(o.op == Op::T), r, c, ld, bs]
    };
    let mut key = vec![u64::MAX - 1, lanes.unwrap_or(0) as u64];
    for g in groups {
        let p = &g.p;
        key.push(position(crate::Precision::ALL.iter().position(|&x| x == p.precision())));
        key.push(position(Epilogue::ALL.iter().position(|&x| x == p.epilogue())));
        key.push(p.batch() as u64);
        key.extend(operand(p.a()));
        key.extend(operand(p.b()));
        key.extend(layout(p.c()));
        key.extend([g.abc.0, g.abc.1, g.abc.2, g.bias.unwrap_or(0)]);
    }
    key
}

impl Plans<'_> {
    /// How [`Gpu::gemm_group`] runs a list of these problems now, on buffers whose pointers every
    /// way takes: the forced way
    /// ([`GpuOptions::grouped_backend`](crate::cuda::GpuOptions::grouped_backend), which serves
    /// grouped products and lists alike) where it applies, else the rule of
    /// [`crate::grouped::list::rule`]. Where a member's pointer misses 16 bytes
    /// ([`crate::grouped::align`]) a way through cuBLAS's grouped call becomes the pool (or in
    /// order), and a forced one is refused.
    ///
    /// # Errors
    /// [`Error::Unsupported`]: the forced way does not apply to the list (naming why).
    pub fn gemm_group_backend(&self, problems: &[GemmProblem]) -> Result<GroupedBackend> {
        self.gpu.lock().libs.grouped.choose_list(problems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(index: usize, which: Which, (start, end): (u64, u64), writes: bool) -> Touch {
        Touch { index, which, start, end, writes }
    }

    #[test]
    fn written_ranges_overlap_nothing_else_and_reads_may_share() {
        // reads sharing bytes (two GEMMs of one weight), adjacent ranges: apart
        let ok = vec![
            touch(0, Which::B, (0, 100), false),
            touch(1, Which::B, (0, 100), false),
            touch(0, Which::C, (100, 200), true),
            touch(1, Which::C, (200, 300), true),
        ];
        assert!(apart(ok).is_ok());
        // a long written range reaching past shorter ones that follow it
        let long = vec![
            touch(0, Which::C, (0, 1000), true),
            touch(1, Which::A, (1000, 1100), false),
            touch(2, Which::A, (1100, 1200), false),
        ];
        assert!(apart(long).is_ok());
        let far = vec![
            touch(0, Which::C, (0, 1000), true),
            touch(1, Which::A, (10, 20), false),
            touch(2, Which::A, (900, 1100), false),
        ];
        match apart(far) {
            Err(Error::GroupedShape { detail, .. }) => {
                assert!(detail.contains("GEMM 0's C") && detail.contains("GEMM 1's A"), "{detail}")
            }
            other => panic!("{other:?}"),
        }
        // two outputs sharing a byte, in either order
        for order in [[0, 1], [1, 0]] {
            let spans = order.map(|i| touch(i, Which::C, (i as u64 * 99, i as u64 * 99 + 100), true));
            assert!(matches!(apart(spans.into()), Err(Error::GroupedShape { .. })));
        }
        // a read range starting inside an earlier written one
        let late = vec![touch(3, Which::A, (50, 60), false), touch(2, Which::C, (40, 55), true)];
        assert!(apart(late).is_err());
    }
}
